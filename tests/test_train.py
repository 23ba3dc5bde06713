"""Each training optimization computes what it claims: the same gradients and parameters as the plain loop."""

from __future__ import annotations

import dataclasses
import gc
import math
import weakref

import pytest
import torch
from torch.testing import assert_close

import gptcore.training.trainer as trainer_module
from gptcore.config import Recipe
from gptcore.presets import RECIPES
from gptcore.training.trainer import Trainer, lr_at
from tests.helpers import F32_EPS, TINY, batches, capture_grads, params, trainer

pytestmark = pytest.mark.cpu

# float64 equivalences: the two computations differ only in summation order over at most a few thousand terms,
# so they agree to ~1e-13 relative; 1e-10 leaves a wide margin yet is 10^6 below any real bug.
F64 = dict(rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_grad_accumulation_equals_the_large_batch(optimizer):
    data = batches(2)
    big = trainer(Recipe(optimizer=optimizer, grad_clip=None), dtype=torch.float64)
    acc = trainer(Recipe(optimizer=optimizer, grad_clip=None, grad_accum_steps=4), dtype=torch.float64)
    assert acc.micro_batch == TINY.batch_size // 4
    g_big, g_acc = capture_grads(big), capture_grads(acc)
    for batch in data:
        assert_close(acc.step(batch), big.step(batch), **F64)
    assert len(g_big) == len(g_acc) == len(data)  # one capture per optimizer step of each
    for a, b in zip(g_acc, g_big, strict=True):
        assert_close(a, b, **F64)
    assert_close(params(acc), params(big), **F64)


def test_checkpointing_changes_no_loss_and_no_gradient():
    # dropout on: non-reentrant checkpointing restores the RNG state, so the recompute draws the same masks.
    # Dropout draws from the global RNG (seeded by each Trainer), so the two runs go one after the other.
    def run(checkpoint: bool):
        t = trainer(Recipe(grad_clip=None, checkpoint=checkpoint), dropout=0.1)
        grads, calls, mlp = capture_grads(t), [], t.model.transformer.h[0].mlp
        forward = mlp.forward
        mlp.forward = lambda x: calls.append(1) or forward(x)  # recompute skips hooks, so count forward itself
        losses = [t.step(batch) for batch in batches(2)]
        assert len(calls) == (4 if checkpoint else 2)  # checkpointing really recomputes the block in backward
        return losses, grads

    (loss_ckpt, g_ckpt), (loss_plain, g_plain) = run(True), run(False)
    assert torch.equal(torch.stack(loss_ckpt), torch.stack(loss_plain))  # same ops, same numbers: bit-identical
    for a, b in zip(g_ckpt, g_plain, strict=True):
        for ga, gb in zip(a, b, strict=True):
            assert torch.equal(ga, gb)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_optimizer_in_backward_equals_the_ordinary_loop(optimizer):
    recipe = Recipe(optimizer=optimizer, grad_clip=None, schedule="cosine", warmup_steps=2, decay_steps=6)
    plain = trainer(recipe, dtype=torch.float64)
    fused = trainer(Recipe(**{**recipe.__dict__, "optim_in_backward": True}), dtype=torch.float64)
    assert len(fused.optimizers) == len(list(fused.model.parameters())) > 1
    for batch in batches(4):
        assert_close(fused.step(batch), plain.step(batch), **F64)
    assert_close(params(fused), params(plain), **F64)
    assert all(p.grad is None for p in fused.model.parameters())  # each gradient freed once used


@pytest.mark.parametrize("recipe", ["optim-in-bwd", "optim-in-bwd-checkpoint", "bf16-pure-optim-in-bwd-checkpoint"])
def test_an_optimizer_in_backward_trainer_is_freed_without_the_garbage_collector(recipe):
    """Its parameters and optimizer state die with the Trainer by reference counting: no cycle through autograd's
    hook table, which the collector did not free on a GPU (each case's 20.6 GB stayed under the next cases)."""
    t = trainer(RECIPES[recipe])
    t.step()
    weights = list(t.model.parameters())
    states = [s for opt in t.optimizers for state in opt.state.values() for s in state.values()]
    assert len(states) == 3 * len(weights)  # step, exp_avg and exp_avg_sq of every parameter
    alive = [weakref.ref(x) for x in weights + states]
    del weights, states
    gc.collect()
    gc.disable()
    try:
        del t
        assert [r for r in alive if r() is not None] == []
    finally:
        gc.enable()


@pytest.mark.parametrize(
    "impl,kernel,per",
    [
        ("fused", "aten._fused_adamw_.default", "group"),
        ("foreach", "aten._foreach_lerp_.Scalar", "group"),
        ("for-loop", "aten.lerp_.Scalar", "parameter"),
    ],
)
def test_each_adamw_implementation_runs_its_own_kernel(impl, kernel, per):
    """The work ledger of a step names the kernel: one fused AdamW or one foreach update per parameter group, or one
    update per parameter; and none of the other two (each updates the first moment with a lerp)."""
    from gptcore.measure.work import count_step

    t = trainer(Recipe(adamw_impl=impl))
    t.step(batches(1)[0])  # warmed up: the optimizer's state exists
    calls = count_step(t, batches(2)[1]).by_op("op calls")
    groups, n_params = len(t.optimizers[0].param_groups), len(list(t.model.parameters()))
    assert calls.get(kernel) == (groups if per == "group" else n_params) and groups < n_params
    others = {"aten._fused_adamw_.default", "aten._foreach_lerp_.Scalar", "aten.lerp_.Scalar"} - {kernel}
    assert not others & calls.keys()


def test_sgd_steps_with_the_recipes_momentum_and_weight_decay():
    """Two steps of SGD equal their closed form from the gradients the optimizer saw: torch's SGD (no dampening, no
    Nesterov) takes d = g + wd * p, a buffer b_1 = d_1, b_2 = momentum * b_1 + d_2, and p -= lr * b; weight decay on
    the decayed group only. A dropped momentum moves the second step by lr * momentum * d_1."""
    lr, momentum, wd = 0.1, 0.9, 0.1
    recipe = Recipe(optimizer="sgd", schedule="constant", lr=lr, momentum=momentum, weight_decay=wd, grad_clip=None)
    t = trainer(recipe, dtype=torch.float64)
    grads, decayed = capture_grads(t), {id(p) for p in t.optimizers[0].param_groups[0]["params"]}
    snapshots = [params(t)]
    for batch in batches(2):
        t.step(batch)
        snapshots.append(params(t))
    p0, p1, p2 = snapshots
    for i, p in enumerate(t.model.parameters()):
        decay = wd if id(p) in decayed else 0.0
        d1, d2 = grads[0][i] + decay * p0[i], grads[1][i] + decay * p1[i]
        assert_close(p1[i], p0[i] - lr * d1, **F64)
        assert_close(p2[i], p1[i] - lr * (momentum * d1 + d2), **F64)


def test_fused_adamw_equals_foreach_within_float32_rounding():
    """Five AdamW steps at a constant lr of 1e-3 (no warmup, whose lr of 1e-5..5e-5 would hide the update), fused vs
    foreach. The kernels order the decay, the moments and the update differently, so each step rounds each element
    of p differently: a few roundings of u = eps / 2 relative to |p| (the update, ~lr = 1e-3, is smaller than every
    parameter's largest element, 0.035 and up, so its own roundings are smaller still), and the gradients of the next
    step follow parameters that differ by as much. Each parameter is compared within 4 * steps * eps of its own
    largest element: a shared bound from the LayerNorm weights (~1) would be 30x too loose for the matrices (~0.03).
    Measured: at most 0.46 * steps * eps * max|p|. Weight decay takes lr * wd = 1e-4 of a decayed matrix's every
    element each step, 5e-4 * |p| over the run, ~4,000 * steps * eps * max|p|: a dropped decay is far outside."""
    steps = 5
    recipe = Recipe(schedule="constant", lr=1e-3)
    foreach = trainer(dataclasses.replace(recipe, adamw_impl="foreach"))
    fused = trainer(dataclasses.replace(recipe, adamw_impl="fused"))
    for batch in batches(steps):
        foreach.step(batch), fused.step(batch)
    names = [name for name, _ in foreach.model.named_parameters()]
    for name, a, b in zip(names, params(fused), params(foreach), strict=True):
        gap, bound = (a - b).abs().max().item(), 4 * steps * F32_EPS * b.abs().max().item()
        assert gap <= bound, (name, gap, bound)
    start = params(trainer(recipe))  # it trained: every parameter moved by far more than the bound
    for name, a, b in zip(names, params(foreach), start, strict=True):
        assert (a - b).abs().max() > 100 * 4 * steps * F32_EPS * b.abs().max(), name


@pytest.mark.parametrize(
    "precision,low,unit_roundoff", [("bf16", torch.bfloat16, 2.0**-8), ("fp16", torch.float16, 2.0**-11)]
)
def test_autocast_loss_is_close_to_fp32(precision, low, unit_roundoff):
    """Same weights, same batch: autocast runs the matmuls in the low type (its logits come out in it, and its loss is
    not fp32's), and each token's loss stays within the low type's rounding of fp32's, with no bias in their mean.

    Per token: the loss's gradient in the logits, softmax - onehot, has l1 norm 2 (1 - p_target) <= 2, so a token's
    loss moves by at most 2 max|dz| over its logits z. The head rounds each logit to the low type (<= u |z|, u its
    unit roundoff: 2^-8 bf16, 2^-11 fp16); its rounded inputs and the blocks' rounded matmuls add errors of that order,
    which we allow as much again: |dz| <= 2u max|z|, so each token within 4u max|z| (max|z|: fp32's logits, ~0.6).
    Measured: |dz| <= 1.0 u max|z|, tokens within 0.58 u max|z|. The loss, their mean, is within the same bound
    (measured: 3e-5 bf16, 5e-6 fp16, against bounds of ~9e-3 and ~1e-3). A tighter bound on the mean would rest on
    the rounding errors falling either way independently, which the kernels of another CPU need not give.
    The same holds after four training steps, whose forwards ran in the low type too: the two runs' weights part by
    what four warm-up steps (lr <= 4e-5) make of rounding-sized gradient differences (measured: the same figures)."""
    data = batches(5)
    fp32, amp = trainer(Recipe()), trainer(Recipe(precision=precision))

    def close(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.no_grad():
            exact_logits, exact = fp32.model(x, y)
            with amp.autocast():
                logits, loss = amp.model(x, y)
        assert (exact_logits.dtype, logits.dtype) == (torch.float32, low)  # the matmuls ran in the low type
        assert loss.item() != exact.item()

        def per_token(z: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(z.double().flatten(0, 1), y.flatten(), reduction="none")

        bound = 4 * unit_roundoff * exact_logits.abs().max().item()
        assert (per_token(logits) - per_token(exact_logits)).abs().max().item() <= bound
        assert abs(loss.item() - exact.item()) <= bound

    close(*data[0])
    seen = []  # the dtype of the logits of every forward that a training step runs
    amp.model.lm_head.register_forward_hook(lambda _module, _input, out: seen.append(out.dtype))
    for batch in data[:4]:
        fp32.step(batch), amp.step(batch)
    assert seen == [low] * 4
    close(*data[4])  # a batch neither run has trained on


def test_grad_scaler_skips_a_step_with_inf_gradients():
    t = trainer(Recipe(precision="fp16"))
    before, scale = params(t), t.scaler.get_scale()
    victim = t.model.transformer.h[0].mlp.c_fc.weight
    handle = victim.register_hook(lambda g: torch.full_like(g, float("inf")))
    t.step(batches(1)[0])
    handle.remove()
    for a, b in zip(params(t), before):
        assert torch.equal(a, b)  # no parameter moved
    assert t.scaler.get_scale() == scale * t.scaler.get_backoff_factor()
    t.step(batches(1)[0])  # a finite step afterwards does move them
    assert any(not torch.equal(a, b) for a, b in zip(params(t), before))


def test_sgd_cosine_learning_rate_equals_the_closed_form():
    recipe = Recipe(optimizer="sgd", schedule="cosine", lr=0.1, min_lr=0.01, warmup_steps=3, decay_steps=10)
    t = trainer(recipe)
    seen = []
    t.optimizers[0].register_step_pre_hook(lambda opt, *_: seen.append(opt.param_groups[0]["lr"]))
    data = batches(13)
    for batch in data:
        t.step(batch)

    def closed_form(s: int) -> float:  # nanoGPT's get_lr, written independently of gptcore.training.trainer.lr_at
        if s < 3:
            return 0.1 * (s + 1) / (3 + 1)
        if s > 10:
            return 0.01
        return 0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi * (s - 3) / 7))

    assert seen == pytest.approx([closed_form(s) for s in range(13)], rel=1e-12, abs=0)
    assert seen[3] == pytest.approx(0.1) and seen[10] == pytest.approx(0.01) and seen[-1] == pytest.approx(0.01)
    assert lr_at(6, Recipe(lr=0.3, schedule="constant")) == 0.3


def test_hot_loop_makes_no_host_sync_unless_asked(monkeypatch):
    # On CPU there is no device to wait for, so count what would sync on a GPU, at the dispatcher as the work ledger
    # does: every host read of a tensor (.item(), float(), bool(), .tolist()) is one aten._local_scalar_dense
    # (PyTorch's own CPU-side bookkeeping, AdamW's step counters, is not counted)
    from gptcore.measure.work import count_step

    def syncs(recipe: Recipe) -> int:
        t = trainer(recipe)
        t.step(batches(1)[0])  # warmed up: the optimizer's state exists
        return count_step(t, batches(2)[1]).syncs

    assert syncs(Recipe()) == 0
    assert syncs(Recipe(sync_every_step=True)) == 1  # the naive loop reads its loss every step, as asked
    step = Trainer.step

    def reads_the_loss(self, batch=None):
        loss = step(self, batch)
        float(loss)  # planted: a host read that is no .item() and is in no gptcore frame
        return loss

    monkeypatch.setattr(Trainer, "step", reads_the_loss)
    assert syncs(Recipe()) == 1


def test_dataloader_workers_change_no_training_step(monkeypatch):
    loaders = []
    make = trainer_module.make_loader
    monkeypatch.setattr(trainer_module, "make_loader", lambda *a, **k: loaders.append(make(*a, **k)) or loaders[-1])
    a, b = trainer(Recipe(grad_clip=None)), trainer(Recipe(grad_clip=None, num_workers=2))
    for _ in range(2):
        assert torch.equal(a.step(), b.step())
    assert [loader.num_workers for loader in loaders] == [0, 2]  # b's batches really came from 2 worker processes


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_regional_compilation_compiles_each_block_and_not_the_model(monkeypatch, scope):
    """compile_scope 'blocks' hands torch.compile each transformer block's call (nn.Module.compile), 'model' the whole
    model, once. Both compute what eager does (tests/test_compile.py, slow), so only the wiring tells them apart."""
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: seen.append(fn) or fn)
    t = trainer(Recipe(compile=True, compile_scope=scope))
    if scope == "model":
        assert seen == [t.model]
    else:
        assert [getattr(fn, "__self__", None) for fn in seen] == list(t.model.transformer.h)


def test_evaluation_batches_are_the_same_under_every_training_seed():
    a, b = trainer(Recipe(seed=1)), trainer(Recipe(seed=2))
    assert torch.equal(a.eval_batches()[0][0], b.eval_batches()[0][0])  # every recipe is evaluated on the same tokens
    assert not torch.equal(a.batches()[0][0], b.batches()[0][0])  # while the training batches follow the seed


def test_evaluate_runs_in_eval_mode_and_returns_to_training():
    t = trainer(Recipe(), dropout=0.5)
    first, second = t.evaluate(n_batches=2), t.evaluate(n_batches=2)
    assert first == second  # dropout off: the same batches give the same loss
    assert t.model.training  # back in training mode for the next step
    x, y = t.eval_batches("val")[0]
    t.model.eval()
    with torch.no_grad():
        one = t.model(x, y)[1].item()
    t.model.train()
    assert t.evaluate(n_batches=1) == one  # the mean of one batch's loss is that loss, bit for bit
    with torch.no_grad():
        assert t.model(x, y)[1].item() != one  # in training mode dropout does change the loss


def test_under_fp16_clipping_sees_the_gradients_unscaled(monkeypatch):
    """GradScaler's loss scale (2^16) is taken off the gradients before they are clipped: the norm that clipping
    sees is the norm of the gradients of an unscaled fp16 backward. Clipping scaled gradients would see a norm 65,536
    times too large, and clip nearly everything away.

    The tolerance. The scaled backward and the unscaled one are the same fp16 arithmetic 2^16 apart, a power of two
    that scales every product exactly, except where a value of the unscaled backward falls below fp16's normal range
    (2^-14) and keeps fewer bits; what those roundings change spreads through the rest of the backward, so each
    gradient element g_i may differ by up to about 2u |g_i| (u = 2^-11, fp16's unit roundoff; measured: the
    difference is 0.46 u of the gradient's norm, as a vector). The norm then moves by at most 2u relative, every
    element off by 2u in the same direction: 2^-10. Measured: 5.8e-6. (A bound from errors of either sign cancelling
    would be tighter, but would rest on how another CPU's kernels round.)"""
    norms = []
    clip = torch.nn.utils.clip_grad_norm_

    def spy(parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        norms.append(global_norm(p.grad for p in parameters if p.grad is not None))
        return clip(parameters, max_norm, *args, **kwargs)

    x, y = batches(1)[0]
    reference = trainer(Recipe(precision="fp16"))
    with reference.autocast():
        loss = reference.forward(x, y)[1]
    loss.backward()
    grads = [p.grad for p in reference.model.parameters() if p.grad is not None]
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    t = trainer(Recipe(precision="fp16", grad_clip=1.0))
    t.step((x, y))
    assert t.scaler.get_scale() == 2.0**16  # the scale was in force
    assert norms == [pytest.approx(global_norm(grads), rel=2.0**-10, abs=0)]


def global_norm(tensors) -> float:
    """The norm of ``tensors`` taken as one vector, as clip_grad_norm_ takes the gradients' norm."""
    return torch.linalg.vector_norm(torch.stack([t.norm() for t in tensors])).item()


def test_tf32_is_the_high_matmul_precision_inside_a_step_and_fp32_the_highest():
    """The switch reaches torch inside the step only, whatever the process had set, and is restored after it. A CPU
    refuses to build a tf32 Trainer (it would run as fp32); the numerics of a step are the same on every device."""
    t, previous = trainer(Recipe()), torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        with t.numerics():
            assert torch.get_float32_matmul_precision() == "highest"  # fp32 means IEEE float32 matmuls
        assert torch.get_float32_matmul_precision() == "high"
        t.recipe = dataclasses.replace(t.recipe, precision="tf32")
        torch.set_float32_matmul_precision("highest")
        with t.numerics():
            assert torch.get_float32_matmul_precision() == "high"  # TF32 tensor cores for float32 matmuls
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(previous)


def test_clipping_bounds_the_global_gradient_norm():
    def grad_norm(recipe: Recipe) -> float:
        t = trainer(recipe)
        seen = capture_grads(t)  # gradients as the optimizer sees them, after clipping
        t.step(batches(1)[0])
        return global_norm(seen[0])

    raw = grad_norm(Recipe(grad_clip=None))
    assert raw > 0.01  # the bound below really bites
    # clip_grad_norm_ scales by clip / (norm + 1e-6), so the norm after it is clip * raw / (raw + 1e-6) (1.1e-6 under
    # the clip at raw 0.92); what is left is the float32 rounding of two norms of a few thousand entries (5e-8 seen)
    assert grad_norm(Recipe(grad_clip=0.01)) == pytest.approx(0.01 * raw / (raw + 1e-6), rel=1e-6)
    assert grad_norm(Recipe(grad_clip=100.0)) == pytest.approx(raw, rel=1e-6)  # a loose clip changes nothing


def test_weight_decay_applies_to_matrices_and_embeddings_only():
    t = trainer(Recipe(weight_decay=0.1))
    decayed, exempt = t.optimizers[0].param_groups
    assert decayed["weight_decay"] == 0.1 and exempt["weight_decay"] == 0.0
    names = {id(p): n for n, p in t.model.named_parameters()}
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() == 1 for p in exempt["params"])
    assert any(names[id(p)].endswith("wte.weight") for p in decayed["params"])
    assert any(".ln_" in names[id(p)] for p in exempt["params"])


@pytest.mark.parametrize("dtype,loss_dtype", [(torch.float64, torch.float64), (torch.float32, torch.float32)])
def test_the_loss_is_kept_in_the_master_dtype(dtype, loss_dtype):
    assert trainer(Recipe(), dtype=dtype).step(batches(1)[0]).dtype == loss_dtype
    assert trainer(Recipe(precision="bf16-pure")).step(batches(1)[0]).dtype == torch.float32  # never below fp32


def test_run_reads_the_loss_at_step_1_every_log_every_and_at_the_end():
    t = trainer(Recipe())
    steps: list[int] = []
    losses = t.run(7, log_every=3, on_log=lambda step, loss: steps.append(step))
    assert steps == [1, 3, 6, 7] and len(losses) == 4 and t.step_count == 7
