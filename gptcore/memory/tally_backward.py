"""The backward half of the analytic estimate's walk: the tensors loss.backward() creates and frees, op by op and in
order, freeing what each forward of ``gptcore.memory.tally_forward`` saved when its autograd node would.
"""

from __future__ import annotations

from gptcore.memory.categories import ACTIVATIONS, RECOMPUTED
from gptcore.memory.tally import (
    Gradients,
    Handle,
    Run,
    Tally,
    dropout_backward,
    layernorm_backward,
    linear_backward,
)
from gptcore.memory.tally_forward import Saved, block_forward


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
    rng_state = saved.get("rng_state")
    if run.recipe.checkpoint:  # recompute the block from its saved input: activations again, for one block
        cache: list = []
        tally.forward_category = RECOMPUTED
        fork = tally.activation(run.rng_state_bytes)  # fork_rng keeps the generator's state around the recomputation
        _, saved = block_forward(run, tally, saved["x"], cache, keep=True, recompute=True)
        tally.forward_category = ACTIVATIONS
        tally.free(*cache, fork)
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
    tally.free(d_mid, d_ln, rng_state)
    return dx


def gpt_backward(run: Run, tally: Tally, grads: Gradients, blocks: list[Saved], head: Saved) -> None:
    """loss.backward(): cross-entropy, lm_head, ln_f, the blocks top-down, the embeddings."""
    BTC = run.BTC
    if "fused" in head:
        dx = fused_head_backward(run, tally, grads, head)
        return _below_the_head(run, tally, grads, blocks, head, dx, [])
    n = run.BT * run.vocab_rows  # the padding columns' gradient is 0, and it is there: no copy to pad it
    scalars = [tally.temporary(run.loss_bytes)]
    d_nll = tally.temporary(run.loss_bytes * n)
    if head["nll_input"] is not None:  # CUDA autocast: back through nll_loss's fp32 cast, then log_softmax
        tally.free(head["nll_input"], *head["nll"])
        d_logprobs = tally.replace(d_nll, run.logprob_bytes * n)
        d_logits = tally.temporary(run.logprob_bytes * n)
        tally.free(d_logprobs, head["logprobs"])
    else:
        tally.free(*head["nll"])  # nll_loss's node is done: its total_weight (and the loss) are gone
        d_logits = tally.temporary(run.logprob_bytes * n)
        tally.free(d_nll, head["logprobs"])
        if run.autocast:  # back through the fp32 upcast
            d_logits = tally.replace(d_logits, 2 * n)
    dx = linear_backward(
        run, tally, grads, "lm_head", BTC, False, (d_logits, head["input"], head["weight"]), cast_input=run.autocast
    )
    _below_the_head(run, tally, grads, blocks, head, dx, scalars)


def fused_head_backward(run: Run, tally: Tally, grads: Gradients, head: Saved) -> Handle:
    """Back through liger's fused linear cross-entropy: its gradients, made in the forward, come out as they are
    (the loss's gradient is 1), then back through autocast's casts: the input's and the weight's to fp32."""
    grad_input, grad_weight, grad_bias = head["fused"]
    tally.free(*head["nll"])
    dx = tally.replace(grad_input, 4 * run.BTC) if run.autocast else grad_input
    incoming = grads.incoming("lm_head.weight")
    tally.free(grad_weight, grad_bias)
    grads.accumulate("lm_head.weight", incoming)
    return dx


def _below_the_head(
    run: Run, tally: Tally, grads: Gradients, blocks: list[Saved], head: Saved, dx: Handle, scalars: list
) -> None:
    """ln_f, the blocks top-down and the embeddings, from the gradient ``dx`` of ln_f's output."""
    param_bytes, BTC = run.param_bytes, run.BTC
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
