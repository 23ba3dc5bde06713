"""The model's switches: attention kernels agree and are causal, padding and tying change no result, FLOPs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close
from torch.utils.flop_counter import FlopCounterMode

from gptcore.config import Recipe
from gptcore.presets import MODELS
from gptcore.training.model import GPT, attention_unsupported
from tests.helpers import TINY, batches

pytestmark = pytest.mark.cpu


def model(recipe: Recipe, cfg=TINY, dtype=torch.float64) -> GPT:
    torch.manual_seed(0)
    return GPT(cfg, recipe).to(dtype).eval()


@pytest.mark.parametrize("attention", ["sdpa", "math"])
def test_attention_kernels_equal_manual_in_float64(attention):
    x, y = batches(1)[0]
    manual, other = model(Recipe(attention="manual")), model(Recipe(attention=attention))
    other.load_state_dict(manual.state_dict())
    (l1, loss1), (l2, loss2) = manual(x, y), other(x, y)
    # same math, different reduction order: float64 agrees to ~1e-15 (measured 8e-16)
    assert_close(l2, l1, rtol=1e-12, atol=1e-12)
    assert_close(loss2, loss1, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attention", ["manual", "sdpa", "math"])
def test_changing_a_future_token_changes_no_earlier_logit(attention):
    m = model(Recipe(attention=attention))
    x = batches(1)[0][0][:2]
    t = TINY.block_size // 2
    changed = x.clone()
    changed[:, t] = (changed[:, t] + 1) % TINY.vocab_size
    before, after = m(x)[0], m(changed)[0]
    assert torch.equal(before[:, :t], after[:, :t])  # positions before t cannot see token t
    assert not torch.allclose(before[:, t:], after[:, t:])  # and the change is visible from t on


def test_vocab_padding_changes_no_logit_no_loss_and_trains_no_padding_row():
    x, y = batches(1)[0]
    plain = model(Recipe(vocab_multiple=1, tie_weights=False))
    padded = model(Recipe(vocab_multiple=64, tie_weights=False))
    assert padded.vocab_rows % 64 == 0 and padded.vocab_rows > TINY.vocab_size
    state = plain.state_dict()
    for name in ("transformer.wte.weight", "lm_head.weight"):  # same weights, extra rows left random
        padded_weight = padded.state_dict()[name].clone()
        padded_weight[: TINY.vocab_size] = state[name]
        state = {**state, name: padded_weight}
    padded.load_state_dict(state)
    (l1, loss1), (l2, loss2) = plain(x, y), padded(x, y)
    assert l2.shape == l1.shape  # the logits returned are a view of the real vocabulary
    assert_close(l2, l1, rtol=1e-12, atol=1e-12)
    assert_close(loss2, loss1, rtol=1e-12, atol=1e-12)
    loss2.backward()
    assert torch.count_nonzero(padded.lm_head.weight.grad[TINY.vocab_size :]) == 0
    assert torch.count_nonzero(padded.transformer.wte.weight.grad[TINY.vocab_size :]) == 0


def sliced_forward(self: GPT, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT.forward as it was before the padding mask: the lm_head without it, the logits sliced to the real
    vocabulary (``logits[..., :vocab_size]``) before the loss, which scatters their gradient into a zero-padded
    B x T x vocab_rows copy in backward. Tests plant it to compare with, and to show the ledger sees the copy."""
    x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.size(1))))
    for block in self.transformer.h:
        x = block(x)
    logits = F.linear(self.transformer.ln_f(x), self.lm_head.weight)[..., : self.cfg.vocab_size]
    return logits, F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_padding_mask_gives_the_sliced_loss_and_gradients(tied):
    """The -inf padding columns add exp(-inf) = 0 to the softmax's sum, so the loss and every gradient are the
    sliced loss's, up to the order the sums are taken in: float64 over 128 columns, ~1e-16 relative (measured
    below 1e-15), so 1e-12 has room and no formula change could hide in it. The padding rows' gradient is 0
    exactly: softmax gives their columns 0 and the loss's gradient there is 0."""
    x, y = batches(1)[0]
    padded = model(Recipe(vocab_multiple=64, tie_weights=tied)).train()
    assert padded.vocab_rows == 128 and torch.isneginf(padded.lm_head.padding_mask[TINY.vocab_size :]).all()
    masked_logits, masked = padded(x, y)
    masked.backward()
    masked_grads = {n: p.grad.clone() for n, p in padded.named_parameters()}
    head_grad = padded.lm_head.weight.grad.clone()  # wte's, when tied
    padded.zero_grad(set_to_none=True)
    sliced_logits, sliced = sliced_forward(padded, x, y)
    sliced.backward()
    assert_close(masked_logits, sliced_logits, rtol=1e-12, atol=1e-12)
    assert_close(masked, sliced, rtol=1e-12, atol=1e-12)
    for name, p in padded.named_parameters():
        assert_close(masked_grads[name], p.grad, rtol=1e-12, atol=1e-12, msg=name)
    assert torch.count_nonzero(head_grad[TINY.vocab_size :]) == 0


def test_padding_mask_makes_no_copy_of_the_logits(monkeypatch):
    """The padded step's work ledger (one optimizer step, every operator and allocation counted) has no copy of
    the logits: no slice's zero-padded gradient, and no allocation beyond the unpadded step's but the wider
    tensors themselves. The sliced loss, planted, is seen: its slice_backward allocates one B x T x vocab_rows
    tensor."""
    from gptcore.measure.work import count_step
    from gptcore.training.trainer import Trainer

    recipe = Recipe(vocab_multiple=64, tie_weights=False)
    batch = batches(1)[0]
    masked = count_step(Trainer(TINY, recipe, "cpu"), batch)
    plain = count_step(Trainer(TINY, dataclasses.replace(recipe, vocab_multiple=1), "cpu"), batch)
    assert "aten.slice_backward.default" not in masked.allocations_by_op
    # the same storages as the unpadded step; the lm_head's matmul takes the mask as its bias (addmm, whose 2-D
    # output is viewed 3-D, where mm's is _unsafe_view'd) and the logits returned are a slice of the real vocabulary
    assert masked.allocations == plain.allocations
    ops, plain_ops = masked.by_op("op calls"), plain.by_op("op calls")
    moved = {op: ops.get(op, 0) - plain_ops.get(op, 0) for op in {*ops, *plain_ops}}
    assert {op: n for op, n in moved.items() if n} == {
        "aten.addmm.default": 1,
        "aten.mm.default": -1,
        "aten.view.default": 1,
        "aten._unsafe_view.default": -1,
        "aten.slice.Tensor": 1,
    }
    monkeypatch.setattr(GPT, "forward", sliced_forward)
    sliced = count_step(Trainer(TINY, recipe, "cpu"), batch)
    assert sliced.allocations_by_op["aten.slice_backward.default"] == 1
    assert sliced.allocations == masked.allocations + 1


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_dropout_is_applied_where_nanogpt_applies_it(attention, monkeypatch):
    """In training: after the embeddings, on the attention's weights (manual: a Dropout module; sdpa: its dropout_p),
    after each residual projection (attention's, the MLP's). In evaluation: nowhere. A dropped one only trains with
    less regularization, which no loss bound over a few steps can see."""
    seen_p = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda *a, **k: seen_p.append(k["dropout_p"]) or sdpa(*a, **k)
    )
    m = model(Recipe(attention=attention), cfg=dataclasses.replace(TINY, dropout=0.25)).train()
    calls = []
    for module in m.modules():
        if isinstance(module, torch.nn.Dropout):
            module.register_forward_hook(lambda mod, *_: calls.append(mod.p))
    x, y = batches(1)[0]
    m(x, y)
    per_block = 3 if attention == "manual" else 2
    assert calls == [0.25] * (1 + per_block * TINY.n_layer)
    assert seen_p == ([] if attention == "manual" else [0.25] * TINY.n_layer)
    seen_p.clear()
    m.eval()
    assert torch.equal(m(x, y)[1], m(x, y)[1])  # no mask drawn: the same loss twice
    assert seen_p == ([] if attention == "manual" else [0.0] * 2 * TINY.n_layer)


def test_weight_tying_shares_storage_and_saves_vocab_times_width_parameters():
    tied, untied = model(Recipe(tie_weights=True)), model(Recipe(tie_weights=False))
    assert tied.lm_head.weight.data_ptr() == tied.transformer.wte.weight.data_ptr()
    assert untied.lm_head.weight.data_ptr() != untied.transformer.wte.weight.data_ptr()
    assert untied.num_params() - tied.num_params() == TINY.vocab_size * TINY.n_embd


def test_weights_start_with_gpt2s_init_and_the_residual_projections_scaled_down():
    """Every matmul weight and embedding is drawn from N(0, 0.02), the residual projections (attn.c_proj, mlp.c_proj)
    from N(0, 0.02 / sqrt(2 n_layer)), so that the residual stream's variance does not grow with depth; biases start
    at 0. A sample of n normal draws has its standard deviation within 1/sqrt(2n) relative (one sigma): 0.35% for the
    40,960 draws of the residual projections here, 0.29% for the 60,320 others; 5% is more than 10 sigmas, and n_layer 8
    makes the scaled ones 4x smaller."""
    m = GPT(dataclasses.replace(TINY, n_layer=8, bias=True), Recipe())
    residual = [p for n, p in m.named_parameters() if n.endswith("c_proj.weight")]
    others = [p for n, p in m.named_parameters() if p.dim() == 2 and not n.endswith("c_proj.weight")]
    assert len(residual) == 2 * 8 and others

    def std(ps: list[torch.Tensor]) -> float:
        return torch.cat([p.detach().flatten() for p in ps]).std().item()

    assert std(residual) == pytest.approx(0.02 / 4, rel=0.05)
    assert std(others) == pytest.approx(0.02, rel=0.05)
    biases = [p for n, p in m.named_parameters() if n.endswith(".bias")]
    assert biases and not any(p.any() for p in biases)


def test_gpt2_has_124m_parameters():
    with torch.device("meta"):
        gpt2 = GPT(MODELS["gpt2"], Recipe())
    assert gpt2.num_params() == 124_439_808  # GPT-2 small, tied, with biases (as nanoGPT reports it + wpe)


# CPU sdpa runs a fused kernel FlopCounterMode has no formula for; math decomposes into counted matmuls
@pytest.mark.parametrize("attention", ["manual", "math"])
def test_flops_per_token_matches_flop_counter(attention):
    cfg = dataclasses.replace(TINY, block_size=16)
    m = model(Recipe(attention=attention), cfg=cfg, dtype=torch.float32).train()
    x, y = batches(1, cfg)[0]
    with FlopCounterMode(display=False) as counter:
        m(x, y)[1].backward()
    # FlopCounterMode counts every matmul (and SDPA's full T x T) forward and backward: exactly our formula
    assert counter.get_total_flops() == m.flops_per_token() * x.numel()


@pytest.mark.parametrize("attention", ["flash", "efficient", "cudnn"])
def test_pinned_cuda_attention_is_refused_on_cpu_with_the_reason(attention):
    reason = attention_unsupported(attention, "cpu")
    assert reason and reason.startswith(f"{attention} attention needs a CUDA GPU")
    assert attention_unsupported("sdpa", "cpu") is None and attention_unsupported("math", "cpu") is None


def test_sequence_longer_than_the_context_is_refused():
    m = model(Recipe())
    with pytest.raises(ValueError, match="block_size"):
        m(torch.zeros(1, TINY.block_size + 1, dtype=torch.long))
