"""The walk of the analytic estimate through ``gptcore.training.model``: the tensors GPT.forward (with the loss) and
loss.backward() create and free, op by op and in order, per block and per attention kernel, on a ``Tally``.

Each forward returns what it saved for backward as a dict of handles named after the tensors they stand for
(``x``, ``qkv`` and ``y`` as in model.py); each backward frees them when its autograd node would.
"""

from __future__ import annotations

from collections.abc import Callable

from gptcore.memory.categories import ACTIVATIONS, LOGITS_AND_LOSS, RECOMPUTED
from gptcore.memory.tally import (
    Gradients,
    Handle,
    Run,
    Tally,
    dropout,
    dropout_backward,
    layernorm_backward,
    layernorm_stats,
    linear_backward,
    weight_copy,
)

Saved = dict[str, Handle]

# ---------------------------------------------------------------------------------------------------------------
# Forward


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
    views = run.B == 1  # a batch of one reshapes for bmm without copies: the scaled q and k themselves are saved
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
        x, saved = block_forward(run, tally, x, cache, keep=not run.recipe.checkpoint)
        blocks.append(saved)
    head: Saved = {"x": x, "positions": positions, "emb_mask": emb_mask}
    ln_f_out = tally.activation(param_bytes * BTC)
    head["ln_f_stats"] = layernorm_stats(run, tally)
    head["weight"] = weight_copy(run, tally, run.vocab_rows * run.C, 0, cache, keep=True)
    head["input"] = tally.new(2 * BTC, LOGITS_AND_LOSS) if autocast else ln_f_out
    logits = tally.new(run.matmul_bytes * run.B * run.T * run.vocab_rows, LOGITS_AND_LOSS)
    tally.free(ln_f_out if autocast else None)
    n = run.BT * run.V
    upcast = tally.new(4 * n, LOGITS_AND_LOSS) if autocast else None  # cross-entropy runs in fp32 under autocast
    head["logprobs"] = tally.new(run.logprob_bytes * n, LOGITS_AND_LOSS)
    # the loss and nll's total_weight
    head["nll"] = (tally.new(run.logprob_bytes, LOGITS_AND_LOSS), tally.new(run.logprob_bytes, LOGITS_AND_LOSS))
    tally.free(upcast)
    tally.free(*cache)  # leaving autocast clears its cache: bias copies die, saved weight copies live on
    return logits, blocks, head


# ---------------------------------------------------------------------------------------------------------------
# Backward


def _through_softmax(
    run: Run, tally: Tally, saved: Saved, dy: Handle, elem_bytes: int, prob_bytes: int
) -> tuple[Handle, Handle]:
    """Back from y = probs @ v through dropout and softmax, in ``elem_bytes`` (probabilities in ``prob_bytes``):
    returns the gradients of v and of the scores."""
    BTC, BHTT = run.BTC, run.BHTT
    dy_copy = None if run.B == 1 else tally.temporary(elem_bytes * BTC)  # the head-split gradient, contiguous
    tally.free(None if run.B == 1 else dy)
    d_v = tally.temporary(elem_bytes * BTC)
    d_probs = tally.temporary(elem_bytes * BHTT)
    tally.free(
        dy_copy if dy_copy is not None else dy, saved["v_copy"], saved.get("probs_cast"), saved["probs_dropped"]
    )  # bmm's saved inputs
    if prob_bytes != elem_bytes:
        d_probs = tally.replace(d_probs, prob_bytes * BHTT)
    d_probs = dropout_backward(tally, d_probs, None, saved["probs_mask"], prob_bytes * BHTT)
    d_scores = tally.temporary(prob_bytes * BHTT)
    tally.free(d_probs, saved["probs"])
    return d_v, d_scores


def _manual_attention_backward(run: Run, tally: Tally, saved: Saved, dy: Handle) -> list[Handle]:
    """Gradients of q, k and v through model.py's masked softmax."""
    matmul_bytes, BTC, BHTT = run.matmul_bytes, run.BTC, run.BHTT
    d_v, d_scores = _through_softmax(run, tally, saved, dy, matmul_bytes, run.prob_bytes)
    d_scores = tally.replace(d_scores, matmul_bytes * BHTT)  # masked_fill's backward
    tally.free(saved["not_mask"])
    d_scores = tally.replace(d_scores, matmul_bytes * BHTT)  # the scale's
    d_k, d_q = tally.temporary(matmul_bytes * BTC), tally.temporary(matmul_bytes * BTC)
    tally.free(d_scores, saved["k_copy"], saved["q_copy"], saved["qkv"])
    return [tally.replace(d_v, matmul_bytes * BTC), tally.replace(d_q, matmul_bytes * BTC), d_k]


def _math_attention_backward(run: Run, tally: Tally, saved: Saved, dy: Handle) -> list[Handle]:
    """Gradients of q, k and v through the math kernel (in its working dtype, cast back at the end)."""
    matmul_bytes, work_bytes, BTC = run.matmul_bytes, run.work_bytes, run.BTC
    upcasting = matmul_bytes == 2
    if upcasting:
        dy = tally.replace(dy, 4 * BTC)
    d_v, d_scores = _through_softmax(run, tally, saved, dy, work_bytes, work_bytes)
    d_k, d_q = tally.temporary(work_bytes * BTC), tally.temporary(work_bytes * BTC)
    tally.free(d_scores, saved["k_copy"], saved["q_copy"])
    d_k = tally.replace(d_k, work_bytes * BTC)  # back through the scaling of k and q
    d_q = tally.replace(d_q, work_bytes * BTC)
    if upcasting:  # back through the upcasts
        d_v, d_k, d_q = (tally.replace(grad, 2 * BTC) for grad in (d_v, d_k, d_q))
    return [tally.replace(d_v, matmul_bytes * BTC), tally.replace(d_q, matmul_bytes * BTC), d_k]


def attention_backward(run: Run, tally: Tally, saved: Saved, dy: Handle) -> Handle:
    """Returns the gradient of qkv (B, T, 3C)."""
    matmul_bytes, BTC = run.matmul_bytes, run.BTC
    if run.attention == "fused":  # the fused kernel's dq, dk, dv, then cat
        parts = [tally.temporary(matmul_bytes * BTC) for _ in range(3)]
        tally.free(dy, saved["qkv"], saved["logsumexp"], saved["attn_out"])
    elif run.attention == "math":
        parts = _math_attention_backward(run, tally, saved, dy)
    else:
        parts = _manual_attention_backward(run, tally, saved, dy)
    d_qkv = tally.temporary(matmul_bytes * 3 * BTC)
    tally.free(*parts)
    return d_qkv


def block_backward(run: Run, tally: Tally, grads: Gradients, i: int, saved: Saved, dy: Handle) -> Handle:
    """Backward of block ``i`` given the gradient ``dy`` of its output; returns the gradient of its input."""
    autocast, matmul_bytes, param_bytes, BTC = run.autocast, run.matmul_bytes, run.param_bytes, run.BTC
    prefix = f"transformer.h.{i}"
    d = tally.temporary(2 * BTC) if autocast else dy  # AddBackward casts the fp32 gradient for the bf16 branch
    if run.recipe.checkpoint:  # recompute the block from its saved input: activations again, for one block
        cache: list = []
        tally.forward_category = RECOMPUTED
        _, saved = block_forward(run, tally, saved["x"], cache, keep=True, recompute=True)
        tally.forward_category = ACTIVATIONS
        tally.free(*cache)
    # MLP: out = x_mid + dropout(c_proj(gelu(c_fc(ln_2(x_mid)))))
    d = dropout_backward(tally, d, dy, saved.get("mlp_resid_mask"), matmul_bytes * BTC)
    d_gelu = linear_backward(
        run,
        tally,
        grads,
        f"{prefix}.mlp.c_proj",
        4 * BTC,
        True,
        (d if d != dy else None, saved["gelu_out"], saved["mlp_proj_weight"]),
        cast_input=False,
    )
    d_fc = tally.temporary(matmul_bytes * 4 * BTC)
    tally.free(d_gelu, saved["fc_out"])
    d_ln = linear_backward(
        run,
        tally,
        grads,
        f"{prefix}.mlp.c_fc",
        BTC,
        True,
        (d_fc, saved["c_fc_input"], saved["c_fc_weight"]),
        cast_input=autocast,
    )
    d_ln = layernorm_backward(run, tally, grads, f"{prefix}.ln_2", (d_ln, saved["x_mid"], *saved["ln2_stats"]))
    d_mid = tally.temporary(param_bytes * BTC)
    tally.free(dy, d_ln)
    # attention: x_mid = x + dropout(c_proj(attention(c_attn(ln_1(x)))))
    d = tally.temporary(2 * BTC) if autocast else d_mid
    d = dropout_backward(tally, d, d_mid, saved.get("attn_resid_mask"), matmul_bytes * BTC)
    d_y = linear_backward(
        run,
        tally,
        grads,
        f"{prefix}.attn.c_proj",
        BTC,
        True,
        (d if d != d_mid else None, saved["y"] if run.attention != "fused" else None, saved["attn_proj_weight"]),
        cast_input=False,
    )
    d_qkv = attention_backward(run, tally, saved, d_y)
    d_ln = linear_backward(
        run,
        tally,
        grads,
        f"{prefix}.attn.c_attn",
        BTC,
        True,
        (d_qkv, saved["c_attn_input"], saved["c_attn_weight"]),
        cast_input=autocast,
    )
    d_ln = layernorm_backward(run, tally, grads, f"{prefix}.ln_1", (d_ln, saved["x"], *saved["ln1_stats"]))
    dx = tally.temporary(param_bytes * BTC)
    tally.free(d_mid, d_ln)
    return dx


def gpt_backward(run: Run, tally: Tally, grads: Gradients, blocks: list[Saved], head: Saved) -> None:
    """loss.backward(): cross-entropy, lm_head, ln_f, the blocks top-down, the embeddings."""
    param_bytes, BTC = run.param_bytes, run.BTC
    n = run.BT * run.V
    scalars = [tally.temporary(run.logprob_bytes) for _ in range(2)]
    d_nll = tally.temporary(run.logprob_bytes * n)
    d_logits = tally.temporary(run.logprob_bytes * n)
    tally.free(d_nll, head["logprobs"], *head["nll"])
    if run.autocast:  # back through the fp32 upcast
        d_logits = tally.replace(d_logits, 2 * n)
    if run.vocab_rows != run.V:  # back through logits[..., :vocab_size]: a zero-padded full-width gradient
        d_logits = tally.replace(d_logits, run.matmul_bytes * run.B * run.T * run.vocab_rows)
    dx = linear_backward(
        run, tally, grads, "lm_head", BTC, False, (d_logits, head["input"], head["weight"]), cast_input=run.autocast
    )
    dx = layernorm_backward(run, tally, grads, "transformer.ln_f", (dx, head["x"], *head["ln_f_stats"]))
    for i in reversed(range(run.L)):
        dx = block_backward(run, tally, grads, i, blocks[i], dx)
    # embeddings: x0 = dropout(wte(idx) + wpe(pos))
    dx = dropout_backward(tally, dx, None, head["emb_mask"], param_bytes * BTC)
    summed = tally.temporary(param_bytes * run.T * run.C)  # wpe's gradient summed over the batch, then scattered
    d_wpe = grads.incoming("transformer.wpe.weight")
    tally.free(summed, head["positions"])
    grads.accumulate("transformer.wpe.weight", d_wpe)
    if run.recipe.tie_weights:  # the embedding's gradient + the waiting lm_head's: their sum becomes .grad
        d_wte = tally.temporary(param_bytes * run.vocab_rows * run.C)
        tally.free(dx)
        total = grads.incoming("transformer.wte.weight")
        tally.free(d_wte, grads.tied_head)
    else:
        total = grads.incoming("transformer.wte.weight")
        tally.free(dx)
    grads.accumulate("transformer.wte.weight", total)
    tally.free(*scalars)
