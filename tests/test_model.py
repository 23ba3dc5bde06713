"""The model's switches: attention kernels agree and are causal, padding and tying change no result, FLOPs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
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
    assert l2.shape == l1.shape  # logits are sliced back to the real vocabulary
    assert_close(l2, l1, rtol=1e-12, atol=1e-12)
    assert_close(loss2, loss1, rtol=1e-12, atol=1e-12)
    loss2.backward()
    assert torch.count_nonzero(padded.lm_head.weight.grad[TINY.vocab_size :]) == 0
    assert torch.count_nonzero(padded.transformer.wte.weight.grad[TINY.vocab_size :]) == 0


def test_weight_tying_shares_storage_and_saves_vocab_times_width_parameters():
    tied, untied = model(Recipe(tie_weights=True)), model(Recipe(tie_weights=False))
    assert tied.lm_head.weight.data_ptr() == tied.transformer.wte.weight.data_ptr()
    assert untied.lm_head.weight.data_ptr() != untied.transformer.wte.weight.data_ptr()
    assert untied.num_params() - tied.num_params() == TINY.vocab_size * TINY.n_embd


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


def test_flash_attention_is_refused_on_cpu_with_the_reason():
    reason = attention_unsupported("flash", "cpu")
    assert reason and "CUDA" in reason
    assert attention_unsupported("sdpa", "cpu") is None


def test_sequence_longer_than_the_context_is_refused():
    m = model(Recipe())
    with pytest.raises(ValueError, match="block_size"):
        m(torch.zeros(1, TINY.block_size + 1, dtype=torch.long))
