"""The forward half of the analytic estimate's walk through ``gptcore.training.model``: the tensors GPT.forward (with
the loss) creates and frees, op by op and in order, per block and per attention kernel, on a ``Tally``.

Each forward returns what it saved for backward as a dict of handles named after the tensors they stand for
(``x``, ``qkv`` and ``y`` as in model.py); ``gptcore.memory.tally_backward`` frees them when autograd would.
"""

from __future__ import annotations

from collections.abc import Callable

from gptcore.memory.categories import LOGITS_AND_LOSS
from gptcore.memory.tally import (
    Handle,
    Run,
    Tally,
    dropout,
    layernorm_stats,
    weight_copy,
)

Saved = dict[str, Handle]


def block_forward(
    run: Run, tally: Tally, x: Handle, cache: list, keep: bool, recompute: bool = False
) -> tuple[Handle, Saved]:
    """model.Block.forward on input ``x``: returns its output and what it saved for backward. ``keep=False`` is
    checkpoint's forward (nothing saved: tensors die at their last use); ``recompute`` is checkpoint's
    recomputation in backward, which stops once the last saved tensor is saved again."""
    autocast, matmul_bytes, param_bytes, C, BTC = run.autocast, run.matmul_bytes, run.param_bytes, run.C, run.BTC
    saved: Saved = {"x": x}
    ln1_out, ln1_cast, ln1_stats, c_attn_weight, qkv = _norm_then_linear(run, tally, cache, keep, 3 * C)
    if keep:
        saved.update(ln1_stats=ln1_stats, c_attn_input=ln1_cast if autocast else ln1_out, c_attn_weight=c_attn_weight)
    else:
        tally.free(ln1_cast)
    if run.attention == "fused":  # saves q, k, v (views of qkv), its output and the log-sum-exp
        y = tally.activation(matmul_bytes * BTC)  # laid out (B, T, nh, hs): the transpose back copies nothing
        logsumexp = tally.activation(4 * run.B * run.H * run.T)
        if keep:
            saved.update(qkv=qkv, attn_out=y, logsumexp=logsumexp)
        else:
            tally.free(logsumexp)
        qkv_saved = keep
    else:
        attention = manual_attention if run.attention == "manual" else math_attention
        y, qkv_saved = attention(run, tally, saved, keep, qkv)
    attn_proj_weight = weight_copy(run, tally, C * C, C, cache, keep)
    proj = tally.activation(matmul_bytes * BTC)
    proj, attn_resid_mask = dropout(run, tally, proj, BTC, matmul_bytes)
    if keep:
        saved.update(y=y, attn_proj_weight=attn_proj_weight, attn_resid_mask=attn_resid_mask)
    else:
        tally.free(attn_resid_mask, y)
    # the attention module returns: its argument (ln_1's output) and its q, k, v locals die unless saved
    tally.free(ln1_out if autocast or not keep else None, None if qkv_saved else qkv)
    x_mid = tally.activation(param_bytes * BTC)  # the residual stream between attention and MLP
    tally.free(proj)
    # ln_2 and the MLP
    ln2_out, ln2_cast, ln2_stats, c_fc_weight, fc_out = _norm_then_linear(run, tally, cache, keep, 4 * C)
    if not keep:
        tally.free(ln2_cast)
    gelu_out = tally.activation(matmul_bytes * 4 * BTC)
    if not keep:
        tally.free(fc_out)
    mlp_proj_weight = weight_copy(run, tally, 4 * C * C, C, cache, keep)
    if keep:
        saved.update(
            x_mid=x_mid,
            ln2_stats=ln2_stats,
            c_fc_input=ln2_cast if autocast else ln2_out,
            c_fc_weight=c_fc_weight,
            fc_out=fc_out,
            gelu_out=gelu_out,
            mlp_proj_weight=mlp_proj_weight,
        )
    if recompute:  # the last saved tensor: c_proj's inputs, or with dropout the residual dropout's mask
        if run.dropout:
            proj = tally.activation(matmul_bytes * BTC)
            saved["mlp_resid_mask"] = tally.activation(BTC * (1 if run.cuda else matmul_bytes))
            tally.free(proj)
        tally.free(ln2_out if autocast else None)
        return None, saved
    proj = tally.activation(matmul_bytes * BTC)
    if not keep:
        tally.free(gelu_out)
    proj, mlp_resid_mask = dropout(run, tally, proj, BTC, matmul_bytes)
    if keep:
        saved["mlp_resid_mask"] = mlp_resid_mask
    else:
        tally.free(mlp_resid_mask)
    tally.free(ln2_out if autocast or not keep else None)
    out = tally.activation(param_bytes * BTC)
    tally.free(proj, None if keep else x_mid)
    return out, saved


def _norm_then_linear(
    run: Run, tally: Tally, cache: list, keep: bool, out_features: int
) -> tuple[Handle, Handle, tuple[Handle, Handle], Handle, Handle]:
    """A LayerNorm (it saves its input, mean and rstd) feeding a Linear of C -> ``out_features``: under autocast
    the LayerNorm's fp32 output is cast for the matmul (the cast is what the Linear saves). Returns the
    LayerNorm's output, its cast (None without autocast), its mean and rstd (freed unless ``keep``), the weight's
    copy and the Linear's output."""
    ln_out = tally.activation(run.param_bytes * run.BTC)
    stats = layernorm_stats(run, tally)
    if not keep:
        tally.free(*stats)
    weight = weight_copy(run, tally, out_features * run.C, out_features, cache, keep)
    cast = tally.activation(2 * run.BTC) if run.autocast else None
    out = tally.activation(run.matmul_bytes * run.B * run.T * out_features)
    return ln_out, cast, stats, weight, out


def _freed_unless_kept(tally: Tally, keep: bool) -> Callable[..., None]:
    """Frees what is not saved at its last use when nothing is kept (checkpoint's forward); else does nothing."""
    return (lambda *handles: None) if keep else tally.free


def _probabilities_dropout(run: Run, tally: Tally, probs: Handle, elem_bytes: int, keep: bool) -> tuple[Handle, Handle]:
    """attn_dropout on the T x T probabilities: (the dropped probabilities or None, the mask or None)."""
    dropped, mask = dropout(run, tally, None, run.BHTT, elem_bytes)
    _freed_unless_kept(tally, keep)(mask, probs if dropped is not None else None)
    return dropped, mask


def _heads_joined(run: Run, tally: Tally, heads: Handle) -> Handle:
    """``y.transpose(1, 2).contiguous()``: the heads side by side for c_proj; the (B, nh, T, hs) tensor dies."""
    y = tally.activation(run.matmul_bytes * run.BTC)
    tally.free(heads)
    return y


def manual_attention(run: Run, tally: Tally, saved: Saved, keep: bool, qkv: Handle) -> tuple[Handle, bool]:
    """model.py's masked-softmax attention: contiguous copies of q, k and v for the batched matmuls, the T x T
    probabilities (and dropout's mask and output), the ~mask, and y copied contiguous for c_proj. Returns y and
    whether qkv itself is saved."""
    matmul_bytes, prob_bytes, BTC, BHTT = run.matmul_bytes, run.prob_bytes, run.BTC, run.BHTT
    dies = _freed_unless_kept(tally, keep)
    views = run.B == 1  # a batch of one reshapes the head-split q, k, v for bmm without copies (they stay qkv's)
    q_copy, k_copy = (
        (None, None) if views else (tally.activation(matmul_bytes * BTC), tally.activation(matmul_bytes * BTC))
    )
    scores = tally.activation(matmul_bytes * BHTT)
    dies(q_copy, k_copy)
    scaled = tally.replace(scores, matmul_bytes * BHTT)
    not_mask = tally.activation(run.T * run.T)  # ~mask, saved by masked_fill
    masked = tally.replace(scaled, matmul_bytes * BHTT)
    dies(not_mask)
    upcast = tally.activation(4 * BHTT) if prob_bytes != matmul_bytes else None  # CUDA autocast: fp32 softmax
    probs = tally.activation(prob_bytes * BHTT)
    tally.free(masked, upcast)
    dropped, probs_mask = _probabilities_dropout(run, tally, probs, prob_bytes, keep)
    # the matmul's bf16 cast of the fp32 probabilities
    probs_cast = tally.activation(2 * BHTT) if prob_bytes != matmul_bytes else None
    v_copy = None if views else tally.activation(matmul_bytes * BTC)
    heads = tally.activation(matmul_bytes * BTC)
    dies(v_copy, probs_cast, dropped if dropped is not None else probs)
    if keep:
        saved.update(
            q_copy=q_copy,
            k_copy=k_copy,
            not_mask=not_mask,
            probs=probs,
            probs_mask=probs_mask,
            probs_dropped=dropped,
            probs_cast=probs_cast,
            v_copy=v_copy,
            qkv=qkv if views else None,
        )
    return _heads_joined(run, tally, heads), keep and views


def math_attention(run: Run, tally: Tally, saved: Saved, keep: bool, qkv: Handle) -> tuple[Handle, bool]:
    """SDPA's math kernel: like the manual path, but fp16/bf16 inputs are upcast and it works in fp32, scales q and
    k rather than the scores, and adds a T x T float causal bias instead of masked_fill. Returns y and whether qkv
    itself is saved."""
    matmul_bytes, work_bytes, BTC, BHTT, T = run.matmul_bytes, run.work_bytes, run.BTC, run.BHTT, run.T
    upcasting = matmul_bytes == 2
    dies = _freed_unless_kept(tally, keep)
    # a batch of one, or one head, reshapes the scaled q and k (laid out as qkv is) for bmm without copies: they
    # themselves are saved
    views = run.B == 1 or run.H == 1
    q_up, k_up, v_up = [tally.activation(4 * BTC) for _ in range(3)] if upcasting else [None] * 3
    q_scaled = tally.activation(work_bytes * BTC)  # q * sqrt(scale)
    ones = tally.activation(T * T)
    tril = tally.replace(ones, T * T)
    causal_bias = tally.replace(tril, 4 * T * T)  # -inf above the diagonal
    k_scaled = tally.activation(work_bytes * BTC)
    q_copy, k_copy = (
        (q_scaled, k_scaled) if views else (tally.activation(work_bytes * BTC), tally.activation(work_bytes * BTC))
    )
    scores = tally.activation(work_bytes * BHTT)
    tally.free(None if views else k_scaled)
    dies(None if views else q_copy, k_copy)
    biased = tally.replace(scores, work_bytes * BHTT)
    probs = tally.replace(biased, work_bytes * BHTT)
    dropped, probs_mask = _probabilities_dropout(run, tally, probs, work_bytes, keep)
    unused = tally.activation(2 * BHTT) if upcasting else None  # the probabilities cast back, unused
    v_copy = (v_up if upcasting else qkv) if views else tally.activation(work_bytes * BTC)
    heads = tally.activation(work_bytes * BTC)
    dies(None if views else v_copy, dropped if dropped is not None else probs)
    if upcasting:
        heads = tally.replace(heads, 2 * BTC)
    tally.free(
        q_scaled if not views or not keep else None,
        causal_bias,
        q_up,
        k_up,
        unused,
        v_up if not views or not keep else None,
    )
    if keep:
        saved.update(
            q_copy=q_copy, k_copy=k_copy, probs=probs, probs_mask=probs_mask, probs_dropped=dropped, v_copy=v_copy
        )
    return _heads_joined(run, tally, heads), keep and views and not upcasting


def gpt_forward(run: Run, tally: Tally) -> tuple[Handle, list[Saved], Saved]:
    """GPT.forward with the loss: returns the logits, each block's saved tensors, and the embeddings' and head's."""
    autocast, param_bytes, BTC = run.autocast, run.param_bytes, run.BTC
    cache: list = []
    positions = tally.activation(8 * run.T)
    tokens, pos_emb = tally.activation(param_bytes * BTC), tally.activation(param_bytes * run.T * run.C)
    x = tally.activation(param_bytes * BTC)
    tally.free(tokens, pos_emb)
    x, emb_mask = dropout(run, tally, x, BTC, param_bytes)
    blocks = []
    for _ in range(run.L):
        # checkpoint keeps the CPU generator's state for the block's recomputation
        rng_state = tally.activation(run.rng_state_bytes) if run.recipe.checkpoint else None
        x, saved = block_forward(run, tally, x, cache, keep=not run.recipe.checkpoint)
        blocks.append({**saved, "rng_state": rng_state})
    head: Saved = {"x": x, "positions": positions, "emb_mask": emb_mask}
    ln_f_out = tally.activation(param_bytes * BTC)
    head["ln_f_stats"] = layernorm_stats(run, tally)
    if run.recipe.kernels.loss == "liger":
        head.update(fused_head_forward(run, tally, ln_f_out))
        tally.free(*cache)
        return None, blocks, head
    head["weight"] = weight_copy(run, tally, run.vocab_rows * run.C, 0, cache, keep=True)
    head["input"] = tally.new(2 * BTC, LOGITS_AND_LOSS) if autocast else ln_f_out
    # autocast's copy of the padding mask (model.LMHead's bias: a buffer, so not cached), dead after the matmul
    padded = run.vocab_rows != run.V
    mask_cast = tally.new(2 * run.vocab_rows, LOGITS_AND_LOSS) if autocast and padded else None
    logits = tally.new(run.matmul_bytes * run.B * run.T * run.vocab_rows, LOGITS_AND_LOSS)
    tally.free(ln_f_out if autocast else None, mask_cast)
    n = run.BT * run.vocab_rows  # the loss reads every column: the padding ones are -inf
    # cross-entropy = log_softmax, then nll_loss; under autocast one of them casts to fp32 first (Run.logprob_bytes):
    # the CPU's the logits (a temporary), CUDA's nll_loss the log-probabilities (a copy it saves for backward)
    nll_casts = run.logprob_bytes != run.loss_bytes
    upcast = tally.new(4 * n, LOGITS_AND_LOSS) if autocast and not nll_casts else None
    head["logprobs"] = tally.new(run.logprob_bytes * n, LOGITS_AND_LOSS)
    head["nll_input"] = tally.new(run.loss_bytes * n, LOGITS_AND_LOSS) if nll_casts else None
    # the loss and nll's total_weight
    head["nll"] = (tally.new(run.loss_bytes, LOGITS_AND_LOSS), tally.new(run.loss_bytes, LOGITS_AND_LOSS))
    tally.free(upcast)
    tally.free(*cache)  # leaving autocast clears its cache: bias copies die, saved weight copies live on
    return logits, blocks, head


#: liger-kernel 0.8.5's fused linear cross-entropy bounds one chunk's logits to this many times the input's size.
LIGER_CHUNK_MEM_CONST = 1


def fused_head_forward(run: Run, tally: Tally, ln_f_out: Handle) -> Saved:
    """The lm_head and the loss by liger's fused linear cross-entropy (gptcore.training.kernels): its operands cast
    to the autocast dtype, the gradients made in the forward (the input's in its dtype, the weight's and the padding
    mask's in fp32 accumulators, then cast back), one chunk of rows' logits at a time. Saves the three gradients;
    the logits never exist whole. Liger's per-chunk temporaries (a chunk's input gradient) are not counted."""
    mb, rows, BT = run.matmul_bytes, run.vocab_rows, run.BT
    padded = rows != run.V
    casts = [tally.new(mb * run.BTC, LOGITS_AND_LOSS), tally.new(mb * rows * run.C, LOGITS_AND_LOSS)]
    casts.append(tally.new(mb * rows, LOGITS_AND_LOSS) if padded else None)
    if not run.autocast:  # no casts: liger reads the LayerNorm's output and the weight themselves
        tally.free(*casts)
        casts = []
    grad_input = tally.new(mb * run.BTC, LOGITS_AND_LOSS)
    grad_weight = tally.new(4 * rows * run.C, LOGITS_AND_LOSS)
    grad_bias = tally.new(4 * rows, LOGITS_AND_LOSS) if padded else None
    loss_1d, target_mask = tally.new(4 * BT, LOGITS_AND_LOSS), tally.new(BT, LOGITS_AND_LOSS)
    inc_factor = -(-rows // (LIGER_CHUNK_MEM_CONST * run.C))
    chunk = min(1 << (-(-BT // inc_factor) - 1).bit_length(), BT)  # the next power of two, at most BT
    tally.free(tally.new(mb * chunk * rows, LOGITS_AND_LOSS), target_mask)
    loss = tally.new(4, LOGITS_AND_LOSS)
    tally.free(loss_1d)
    grad_weight = tally.replace(grad_weight, mb * rows * run.C)
    grad_bias = tally.replace(grad_bias, mb * rows) if padded else None
    tally.free(*casts, ln_f_out)  # the LayerNorm's output: its backward saves its input, not its output
    return {"fused": (grad_input, grad_weight, grad_bias), "nll": (loss, None)}
