"""A model's initial weights (gptcore.training.initial): a kept draw hands the next model of the same draw the weights
and the generator state that drawing again would give, to the bit, with nothing drawn; any other draw is drawn; the
recipes that the key puts together draw the same weights; the CPU keeps none by default; and on a GPU (skipped
elsewhere), two Trainers of one draw start from a fresh draw's bits."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import torch
import torch.nn as nn

from gptcore.presets import MODELS, RECIPES
from gptcore.training import initial
from gptcore.training.initial import initial_model
from gptcore.training.model import GPT

pytestmark = pytest.mark.cpu

CFG = MODELS["cpu-small"]


@pytest.fixture(autouse=True)
def nothing_kept():
    initial.forget()
    yield
    initial.forget()


@pytest.fixture
def draws(monkeypatch) -> list[str]:
    """The names of nn.init's functions called on a real (not meta) tensor: what the CPU generator drew for."""
    drawn: list[str] = []
    for name in ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_"):
        real = getattr(nn.init, name)

        def counted(tensor, *args, _real=real, _name=name, **kwargs):
            if not tensor.is_meta:
                drawn.append(_name)
            return _real(tensor, *args, **kwargs)

        monkeypatch.setattr(nn.init, name, counted)
    return drawn


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in [*model.named_parameters(), *model.named_buffers()]}


def assert_same_bits(a: nn.Module, b: nn.Module) -> None:
    sa, sb = state(a), state(b)
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype and torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize(("recipe", "dtype"), [("fp32", torch.float64), ("ladder-8", torch.bfloat16)])
def test_a_kept_draw_gives_the_next_model_the_drawn_weights_and_generator_state_and_draws_nothing(recipe, dtype, draws):
    """Both tie their weights; ladder-8 also pads the vocabulary (77 -> 128 rows, a buffer). The model drawn afresh
    after a seed is the reference; the kept draw's model equals it to the bit, ties and all, and the CPU generator is
    left where the fresh draw left it."""
    r = RECIPES[recipe]
    first = initial_model(CFG, r, "cpu", dtype, keep=True)
    assert draws, "the first model draws its weights"
    after_draw = torch.get_rng_state()
    torch.manual_seed(12345)  # the generator elsewhere: the kept draw must put it back
    del draws[:]
    again = initial_model(CFG, r, "cpu", dtype, keep=True)
    assert draws == []  # nothing drawn: the structure was built on the meta device
    assert torch.equal(torch.get_rng_state(), after_draw)
    torch.manual_seed(r.seed)
    fresh = GPT(CFG, r).to(dtype=dtype)
    assert torch.equal(torch.get_rng_state(), after_draw)
    assert_same_bits(again, fresh)
    assert_same_bits(first, fresh)
    if r.tie_weights:
        assert again.lm_head.weight is again.transformer.wte.weight
    assert len(list(again.parameters())) == len(list(fresh.parameters()))  # a tied weight is one parameter
    assert not any(t.is_meta for t in [*again.parameters(), *again.buffers()])
    # the kept tensors are copied, never shared: training the model leaves the next one's weights as drawn
    with torch.no_grad():
        for p in again.parameters():
            p.add_(1)
    assert_same_bits(initial_model(CFG, r, "cpu", dtype, keep=True), fresh)


def test_another_draw_is_drawn_and_then_kept_in_place_of_the_last(draws):
    fp32 = RECIPES["fp32"]
    initial_model(CFG, fp32, "cpu", torch.float64, keep=True)
    for other in (RECIPES["ladder-8"], dataclasses.replace(fp32, seed=fp32.seed + 1)):  # another structure, seed
        del draws[:]
        got = initial_model(CFG, other, "cpu", torch.float64, keep=True)
        assert draws and initial._kept is not None and initial._kept.key[1] == other.seed
        torch.manual_seed(other.seed)
        assert_same_bits(got, GPT(CFG, other).to(torch.float64))


def test_the_recipes_that_share_a_key_draw_the_same_weights():
    """The key is the model's configuration, the seed and the signature (names, shapes, dtypes, ties): every
    registered recipe, drawn afresh on cpu-small, draws the same weights as every other recipe of its key. This is
    what makes handing one recipe's draw to another the same as drawing it."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    drawn: dict[tuple, dict[str, torch.Tensor]] = {}
    for name, r in RECIPES.items():
        with torch.device("meta"):
            key = (CFG, r.seed, initial.signature(GPT(CFG, r)))
        torch.manual_seed(r.seed)
        weights = state(GPT(CFG, r))
        groups[key].append(name)
        if key in drawn:
            assert weights.keys() == drawn[key].keys()
            assert all(torch.equal(weights[n], drawn[key][n]) for n in weights), (name, groups[key][0])
        else:
            drawn[key] = weights
    assert max(len(g) for g in groups.values()) >= 10  # the memory recipes share one draw, and more
    assert len(groups) >= 3  # padding and tying make draws of their own


def test_keep_refuses_a_float32_model_on_the_cpu_and_the_cpu_keeps_nothing_by_default():
    with pytest.raises(ValueError, match="a float32 model on the CPU is the drawn tensors themselves"):
        initial_model(CFG, RECIPES["fp32"], "cpu", torch.float32, keep=True)
    initial_model(CFG, RECIPES["fp32"], "cpu", torch.float64)
    assert initial._kept is None


def test_a_trainer_on_the_cpu_keeps_nothing_and_starts_from_the_seeded_draw():
    from gptcore.training.trainer import Trainer

    r = RECIPES["fp32"]
    trainer = Trainer(CFG, r, "cpu")
    assert initial._kept is None
    torch.manual_seed(r.seed)
    assert_same_bits(trainer.model, GPT(CFG, r))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a model built for a GPU keeps its draw)")
def test_two_trainers_on_a_gpu_start_from_the_bits_of_a_fresh_draw():
    """The path the GPU tier takes: a Trainer on CUDA draws and keeps; a second one, of another recipe of the same
    draw, is handed the kept weights; both equal a fresh draw on the CPU, and the generator is where it left it."""
    from gptcore.training.trainer import Trainer

    fp32, other = RECIPES["fp32"], RECIPES["checkpoint"]
    first = Trainer(CFG, fp32, "cuda")
    kept = initial._kept
    assert kept is not None
    second = Trainer(CFG, other, "cuda")
    assert initial._kept is kept  # handed over, not drawn again
    after = torch.get_rng_state()
    torch.manual_seed(fp32.seed)
    fresh = GPT(CFG, fp32)
    assert torch.equal(torch.get_rng_state(), after)
    for trainer in (first, second):
        assert_same_bits(trainer.model.cpu(), fresh)
