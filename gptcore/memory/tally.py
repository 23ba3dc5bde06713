"""The bookkeeping of the analytic estimate: the tally of live bytes by category through a symbolic training step,
what the step is (shapes, element sizes, switches), the parameters' gradients as autograd accumulates them, the
optimizer step's temporaries, and the small ops the walk of ``tally_forward`` and ``tally_backward`` is made of
(autocast's weight copies, LayerNorm's statistics, dropout, and the backward of Linear, LayerNorm and dropout).
Arithmetic only.

A tensor is a handle from ``Tally.new``; ``None`` stands for a tensor that is not there (no bias, no dropout) or
one that is another's view, and ``Tally.free`` ignores it.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gptcore.memory.categories import ACTIVATIONS, BACKWARD_TEMPORARIES, GRADIENTS, OPTIMIZER_TEMPORARIES, WEIGHT_COPIES

if TYPE_CHECKING:
    from gptcore.config import Recipe

Handle = int | None

CPU_RNG_STATE_BYTES = 5056
"""``torch.get_rng_state()``: the CPU generator's state, which non-reentrant checkpointing keeps for each block (host
memory on CUDA, where the allocator does not count it)."""


class Tally:
    """Live bytes by category through a symbolic run; keeps the peak, its phase and the breakdown at it."""

    def __init__(self, round_to: int) -> None:
        self.round_to = round_to
        self.phase = "forward"
        self.forward_category = ACTIVATIONS
        """What the forward's tensors are: activations, or recomputed activations during checkpoint's recompute."""
        self.live: Counter[str] = Counter()
        self.total = self.peak = 0
        self.peak_phase = "forward"
        self.at_peak: dict[str, int] = {}
        self._items: dict[int, tuple[int, str]] = {}
        self._ids = itertools.count()

    def new(self, nbytes: int, category: str) -> Handle:
        """Allocate ``nbytes``; returns a handle for ``free`` (None for an empty tensor)."""
        if nbytes <= 0:
            return None
        nbytes = -(-nbytes // self.round_to) * self.round_to
        handle = next(self._ids)
        self._items[handle] = (nbytes, category)
        self.live[category] += nbytes
        self.total += nbytes
        if self.total > self.peak:
            self.peak, self.peak_phase, self.at_peak = self.total, self.phase, +self.live
        return handle

    def activation(self, nbytes: int) -> Handle:
        """Allocate a tensor of the forward (an activation, or a recomputed one)."""
        return self.new(nbytes, self.forward_category)

    def temporary(self, nbytes: int) -> Handle:
        """Allocate a backward temporary."""
        return self.new(nbytes, BACKWARD_TEMPORARIES)

    def free(self, *handles: Handle) -> None:
        for handle in handles:
            if handle is not None:
                nbytes, category = self._items.pop(handle)
                self.live[category] -= nbytes
                self.total -= nbytes

    def replace(self, old: int, nbytes: int) -> Handle:
        """A new tensor of ``old``'s category made from it (a cast, a copy); ``old`` dies right after."""
        new = self.new(nbytes, self._items[old][1])
        self.free(old)
        return new


@dataclass(frozen=True)
class Run:
    """Shapes (elements), element sizes (bytes) and switches of one training step."""

    B: int  # micro batch
    T: int
    C: int
    H: int
    L: int
    V: int
    vocab_rows: int  # rows of wte and lm_head (the vocabulary, padded)
    accum_steps: int
    autocast: bool
    param_bytes: int  # parameters, gradients, optimizer state and the residual stream
    matmul_bytes: int  # matmul outputs: 2 under autocast
    cuda: bool
    attention: str  # "fused" (O(T) saved), "manual" (model.py's masked softmax) or "math" (SDPA's math kernel; also
    # what the CPU's sdpa falls back to with dropout)
    dropout: float
    bias: bool
    recipe: Recipe

    @property
    def BT(self) -> int:
        return self.B * self.T

    @property
    def BTC(self) -> int:
        return self.B * self.T * self.C

    @property
    def BHTT(self) -> int:
        return self.B * self.H * self.T * self.T

    @property
    def stat_bytes(self) -> int:
        """LayerNorm's saved mean and rstd: fp32 on CUDA, the input's dtype on the CPU."""
        return 4 if self.cuda else self.param_bytes

    @property
    def rng_state_bytes(self) -> int:
        """What one ``torch.get_rng_state()`` adds to the device's memory: the CPU's, nothing on CUDA."""
        return 0 if self.cuda else CPU_RNG_STATE_BYTES

    @property
    def loss_bytes(self) -> int:
        """nll_loss and its gradient: fp32 under autocast (on both devices' fp32 lists)."""
        return 4 if self.autocast else self.param_bytes

    @property
    def logprob_bytes(self) -> int:
        """Log-probabilities. Under autocast the CPU casts the logits to fp32 for cross-entropy (on its fp32 list);
        CUDA's autocast has no entry for cross-entropy, and its log_softmax keeps the logits' dtype (the one
        cross-entropy passes it), so nll_loss casts the log-probabilities to fp32 and saves that copy too."""
        return self.matmul_bytes if self.cuda else self.loss_bytes

    @property
    def prob_bytes(self) -> int:
        """Manual attention's probabilities: CUDA's autocast runs softmax in fp32, the CPU's keeps the matmul dtype."""
        return 4 if self.cuda and self.autocast else self.matmul_bytes

    @property
    def work_bytes(self) -> int:
        """SDPA's math kernel works in fp32 on fp16/bf16 inputs, else in the inputs' dtype."""
        return 4 if self.matmul_bytes == 2 else self.matmul_bytes


class Gradients:
    """AccumulateGrad: the first incoming tensor becomes ``.grad``, later micro-batches add into it in place; with
    the optimizer in backward each parameter is stepped and its gradient freed at once. A tied lm_head's gradient
    waits in AccumulateGrad's input buffer until the embedding's arrives."""

    def __init__(self, run: Run, tally: Tally, shapes: list[tuple[str, int, bool]]) -> None:
        self.run, self.tally = run, tally
        self.numel = {name: n for name, n, _ in shapes}
        self.decayed = {name: decayed for name, _, decayed in shapes}
        self.numel.setdefault("lm_head.weight", self.numel["transformer.wte.weight"])
        self.held: dict[str, Handle] = {}
        self.tied_head: Handle = None

    def incoming(self, name: str) -> Handle:
        """Allocate the gradient arriving for ``name``: .grad to be (the first micro-batch's), else a temporary."""
        becomes_grad = name not in self.held and not (name == "lm_head.weight" and self.run.recipe.tie_weights)
        return self.tally.new(
            self.numel[name] * self.run.param_bytes, GRADIENTS if becomes_grad else BACKWARD_TEMPORARIES
        )

    def accumulate(self, name: str, handle: Handle) -> None:
        """AccumulateGrad, after the node that made ``handle`` has released its saved tensors."""
        tally, run = self.tally, self.run
        if name == "lm_head.weight" and run.recipe.tie_weights:
            self.tied_head = handle
        elif name in self.held:
            tally.free(handle)
        elif not run.recipe.optim_in_backward:
            self.held[name] = handle
        else:
            phase, tally.phase = tally.phase, "optimizer"
            temporaries = step_temporaries(run, [(self.numel[name], self.decayed[name])])
            tally.free(*[tally.new(nbytes, OPTIMIZER_TEMPORARIES) for nbytes in temporaries])
            tally.free(handle)
            tally.phase = phase


def step_temporaries(run: Run, params: list[tuple[int, bool]]) -> list[int]:
    """The temporaries an optimizer step over ``params`` (numel, decayed) holds at once at its worst, in bytes.

    AdamW foreach: sqrt(exp_avg_sq) of every parameter of a group (the groups are stepped one after the other);
    for-loop: the sqrt and its quotient for one parameter while the previous one's quotient lives; fused: none.
    SGD: grad + weight_decay * param for the decayed parameters, all at once with foreach (the default on CUDA),
    one at a time otherwise (the CPU)."""
    recipe, param_bytes = run.recipe, run.param_bytes
    if recipe.optimizer == "adamw":
        if recipe.adamw_impl == "fused":
            return []
        groups = ([n for n, decayed in params if decayed], [n for n, decayed in params if not decayed])
        if recipe.adamw_impl == "for-loop":  # sqrt and quotient; the previous parameter's quotient still lives
            pairs = [(previous, n) for group in groups for previous, n in zip([0] + group, group)]
            previous, n = max(pairs, key=lambda pair: pair[0] + 2 * pair[1])
            return [previous * param_bytes, n * param_bytes, n * param_bytes]
        return [n * param_bytes for n in max(groups, key=sum)]
    decayed = [n * param_bytes for n, is_decayed in params if is_decayed and recipe.weight_decay]
    return decayed if run.cuda else decayed and [max(decayed)]


# ---------------------------------------------------------------------------------------------------------------
# Small ops, forward


def weight_copy(run: Run, tally: Tally, weight_numel: int, bias_numel: int, cache: list, keep: bool) -> Handle:
    """Autocast's bf16 copies of a Linear's weight and bias. Both sit in autocast's cache until the forward ends;
    the weight's is also saved for backward (returned when ``keep``)."""
    if not run.autocast:
        return None
    cache.append(tally.new(2 * bias_numel * run.bias, WEIGHT_COPIES))
    weight = tally.new(2 * weight_numel, WEIGHT_COPIES)
    if keep:
        return weight
    cache.append(weight)
    return None


def layernorm_stats(run: Run, tally: Tally) -> tuple[Handle, Handle]:
    """LayerNorm's mean and rstd, saved for backward."""
    return tally.activation(run.stat_bytes * run.BT), tally.activation(run.stat_bytes * run.BT)


def dropout(run: Run, tally: Tally, x: Handle, numel: int, elem_bytes: int) -> tuple[Handle, Handle]:
    """nn.Dropout in training on ``numel`` elements of ``elem_bytes``: a mask (saved: bool on CUDA, the input's
    dtype on the CPU) and a new output; the input dies. Returns (output, mask); identity when p == 0."""
    if not run.dropout:
        return x, None
    mask = tally.activation(numel * (1 if run.cuda else elem_bytes))
    out = tally.activation(numel * elem_bytes)
    tally.free(x)
    return out, mask


# ---------------------------------------------------------------------------------------------------------------
# Small ops, backward


def linear_backward(
    run: Run, tally: Tally, grads: Gradients, name: str, d_in: int, bias: bool, free: tuple, cast_input: bool
) -> Handle:
    """A Linear's backward: the input's gradient (``d_in`` elements) and the weight's and bias's; the tensors in
    ``free`` (the gradient, the input, the weight) die. Under autocast the weight gradients arrive in bf16 and are
    cast to fp32, and so is the input's gradient when the input was an fp32 tensor cast for the matmul
    (``cast_input``). An input that checkpoint recomputed is held by the node alone, and dies once the weight's
    gradient is made, before the bias's. Returns the input gradient."""
    d_input = tally.temporary(run.matmul_bytes * d_in)
    names = [f"{name}.weight"] + ([f"{name}.bias"] if bias and run.bias else [])
    recomputed = run.recipe.checkpoint and name.startswith("transformer.h.")  # a block's Linear, checkpointed
    early, late = ((free[1],), (free[0], *free[2:])) if recomputed else ((), free)

    def gradient(pname: str) -> Handle:  # as the matmul makes it: the parameter's own, or bf16 under autocast
        return grads.incoming(pname) if not run.autocast else tally.temporary(2 * grads.numel[pname])

    weight = gradient(names[0])
    tally.free(*early)
    made = [weight, *(gradient(pname) for pname in names[1:])]
    tally.free(*late)
    if not run.autocast:
        # autograd takes the bias's gradient (and, with the optimizer in backward, steps it) before the weight's
        for pname, handle in reversed(list(zip(names, made))):
            grads.accumulate(pname, handle)
        return d_input
    if cast_input:
        d_input = tally.replace(d_input, 4 * d_in)
    for pname, handle in zip(names, made):
        grad = grads.incoming(pname)
        tally.free(handle)
        grads.accumulate(pname, grad)
    return d_input


def layernorm_backward(run: Run, tally: Tally, grads: Gradients, name: str, free: tuple) -> Handle:
    """A LayerNorm's backward: the input's gradient and the weight's and bias's; the tensors in ``free`` die."""
    d_input = tally.temporary(run.param_bytes * run.BTC)
    names = [f"{name}.weight"] + ([f"{name}.bias"] if run.bias else [])
    incoming = [grads.incoming(pname) for pname in names]
    tally.free(*free)
    for pname, handle in zip(names, incoming):
        grads.accumulate(pname, handle)
    return d_input


def dropout_backward(tally: Tally, d: Handle, upstream: Handle, mask: Handle, nbytes: int) -> Handle:
    """Dropout's backward of ``d`` (``nbytes``): a new gradient; the mask dies, and ``d`` unless it is
    ``upstream`` (still needed). ``d`` itself when there was no dropout."""
    if mask is None:
        return d
    out = tally.temporary(nbytes)
    tally.free(mask, d if d != upstream else None)
    return out
