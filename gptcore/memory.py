"""Where the memory of a training step goes: an analytic breakdown, and a simulation on fake tensors.

``estimate`` is arithmetic only (about a millisecond for GPT-2 XL): it walks one steady-state training step
(optimizer state already allocated) through the tensors that ``gptcore.model`` and ``gptcore.train`` create and
free, op by op and in order, and keeps the peak of their sum, its phase and what was live at that moment.

``simulate`` runs two iterations of the real ``Trainer`` on fake tensors (FakeTensorMode: shapes, dtypes and
storages, no data, no allocation) under the storage tracker of ``gptcore.memtrack``. On the CPU it gives exactly
the bytes of a real tracked run; for CUDA it rounds every storage up to the caching allocator's 512-byte blocks,
as ``torch.cuda.max_memory_allocated`` counts them. Deep models are simulated at 2 and 3 layers and extrapolated,
segment by segment, which is exact for a uniform stack (see ``simulate``).

Categories (both methods): parameters, buffers, gradients (tensors that become ``.grad``, from their birth),
optimizer state, weight copies (autocast's low-precision copies of weights and biases), activations (allocated by
the forward up to the lm_head), logits and loss (the lm_head on), recomputed activations (checkpointing's, in
backward), backward temporaries, optimizer temporaries (AdamW's 0-dim step counts land here, as in memtrack),
other (the step's token ids, scalars).

Neither method sees workspaces allocated inside one kernel (cuBLAS, flash-attention's fp32 dq accumulator) or
anything inside a compiled graph: compiled recipes are estimated and simulated as their eager equivalent, and say
so in their notes.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Literal

from .config import GPTConfig, Recipe
from .memtrack import LiveBytes, PeakReport, track_training
from .model import padded_vocab

CATEGORIES: tuple[str, ...] = (
    "parameters", "buffers", "gradients", "optimizer state", "weight copies", "activations", "logits and loss",
    "recomputed activations", "backward temporaries", "optimizer temporaries", "other")
#: how the finer categories here fold into gptcore.memtrack's, which a plain tracked run reports
COARSE: dict[str, str] = {"weight copies": "activations", "logits and loss": "activations",
                          "recomputed activations": "backward temporaries"}
GiB = 2**30

_PARAMS, _BUF, _GRAD, _STATE, _COPY = CATEGORIES[:5]
_ACT, _HEAD, _RECOMP, _BWD, _OPT, _OTHER = CATEGORIES[5:]


def fold(by_category: dict[str, int]) -> dict[str, int]:
    """A breakdown in memtrack's coarser categories (weight copies and logits count as activations there)."""
    out: Counter[str] = Counter()
    for category, nbytes in by_category.items():
        out[COARSE.get(category, category)] += nbytes
    return dict(out)


# ---------------------------------------------------------------------------------------------------------------
# The question, as both methods read it


def resolve(cfg: GPTConfig, recipe: Recipe, *, batch: int | None = None, seq: int | None = None,
            device: str = "cuda") -> tuple[GPTConfig, Recipe, tuple[str, ...]]:
    """The model and recipe a memory question is about, and notes on what had to be changed to answer it.

    ``batch`` replaces the preset's batch (sequences per optimizer step; the recipe's divisor and gradient
    accumulation still apply), ``seq`` its context length (block_size: the position table grows with it).
    Compile and its memory budget are dropped (the eager equivalent, noted). Switches that change no tensor's
    size are mapped for a CUDA question (tf32 -> fp32, flash -> sdpa); on the CPU they are refused, as the
    Trainer refuses them. ValueError on bad input."""
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device: choose cuda or cpu, got {device!r}")
    for name, value in (("batch", batch), ("seq", seq)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    cfg = dataclasses.replace(cfg, batch_size=batch or cfg.batch_size, block_size=seq or cfg.block_size)
    recipe.micro_batch(cfg)  # ValueError when the divisor or the accumulation does not divide the batch
    notes = []
    if recipe.compile:
        budget = f" and activation memory budget {recipe.memory_budget}" if recipe.memory_budget is not None else ""
        notes.append(f"compile: the eager equivalent; inductor's fusion{budget} usually lower the real peak "
                     "(the tracker cannot see inside compiled kernels)")
        recipe = dataclasses.replace(recipe, compile=False, memory_budget=None)
    if device == "cpu" and (recipe.precision == "tf32" or recipe.attention == "flash"):
        from .train import unsupported_reason

        raise ValueError(unsupported_reason(recipe, "cpu"))
    if recipe.precision == "tf32":
        notes.append("tf32: the tensors of fp32 (TF32 changes matmul precision, not sizes)")
        recipe = dataclasses.replace(recipe, precision="fp32")
    if recipe.attention == "flash":
        notes.append("flash: memory as sdpa's fused kernels (O(T) saved: the output and its log-sum-exp)")
        recipe = dataclasses.replace(recipe, attention="sdpa")
    if cfg.dropout > 0 and recipe.attention == "sdpa" and device == "cpu":
        notes.append("dropout > 0 on the CPU: sdpa falls back to its math kernel, which saves T x T probabilities")
    return cfg, recipe, tuple(notes)


def param_shapes(cfg: GPTConfig, recipe: Recipe) -> list[tuple[str, int, bool]]:
    """(name, numel, weight-decayed) of every distinct parameter, in ``GPT.parameters()`` order."""
    C, rows, b = cfg.n_embd, padded_vocab(cfg, recipe), int(cfg.bias)
    block = [("ln_1.weight", C, False), ("ln_1.bias", C * b, False),
             ("attn.c_attn.weight", 3 * C * C, True), ("attn.c_attn.bias", 3 * C * b, False),
             ("attn.c_proj.weight", C * C, True), ("attn.c_proj.bias", C * b, False),
             ("ln_2.weight", C, False), ("ln_2.bias", C * b, False),
             ("mlp.c_fc.weight", 4 * C * C, True), ("mlp.c_fc.bias", 4 * C * b, False),
             ("mlp.c_proj.weight", 4 * C * C, True), ("mlp.c_proj.bias", C * b, False)]
    shapes = [("transformer.wte.weight", rows * C, True), ("transformer.wpe.weight", cfg.block_size * C, True)]
    shapes += [(f"transformer.h.{i}.{name}", n, d) for i in range(cfg.n_layer) for name, n, d in block]
    shapes += [("transformer.ln_f.weight", C, False), ("transformer.ln_f.bias", C * b, False)]
    if not recipe.tie_weights:
        shapes.append(("lm_head.weight", rows * C, True))
    return [s for s in shapes if s[1]]


# ---------------------------------------------------------------------------------------------------------------
# The analytic estimate


@dataclass(frozen=True)
class Estimate:
    """The analytic peak of one training step, what was live at it, and the model's states."""

    total_bytes: int
    """The peak: the sum of ``by_category``."""
    phase: str
    """forward, backward or optimizer: where the peak happens."""
    by_category: dict[str, int]
    """Live bytes per category at the peak."""
    at_forward_end: dict[str, int]
    """Live bytes per category when the (last micro-batch's) forward returns: all saved activations."""
    at_backward_end: dict[str, int]
    """Live bytes per category when the last backward returns (before the optimizer step)."""
    states: dict[str, int]
    """Full size of parameters, gradients, optimizer state (the moments or momentum) and autocast's weight copies,
    whenever in the step they live."""
    num_params: int
    device: str
    notes: tuple[str, ...] = ()

    @property
    def peak_bytes(self) -> int:
        return self.total_bytes

    @property
    def bytes_per_param(self) -> float:
        """(parameters + gradients + optimizer state) / parameters: 16 for AdamW with fp32 master weights."""
        return sum(self.states[k] for k in (_PARAMS, _GRAD, _STATE)) / self.num_params

    def rows(self, simulated: PeakReport | None = None) -> list[tuple]:
        """Rows for tabulate: category, GiB at the analytic peak [, GiB at the simulated peak]."""
        sim = simulated.by_category if simulated else {}
        rows = [(c, self.by_category.get(c, 0) / GiB) + ((sim.get(c, 0) / GiB,) if simulated else ())
                for c in CATEGORIES if self.by_category.get(c) or sim.get(c)]
        rows.append(("peak", self.total_bytes / GiB) + ((simulated.peak_bytes / GiB,) if simulated else ()))
        rows.append(("phase of the peak", self.phase) + ((f"{simulated.phase}, step {simulated.step}",)
                                                         if simulated else ()))
        return rows

    def table(self, simulated: PeakReport | None = None) -> str:
        """The breakdown in GiB as a text table (with a simulated column when given)."""
        from tabulate import tabulate

        headers = ["GiB", "analytic"] + (["simulated"] if simulated else [])
        rows = [[f"{v:,.2f}" if isinstance(v, float) else v for v in row] for row in self.rows(simulated)]
        return tabulate(rows, headers=headers, colalign=("left",) + ("right",) * (len(headers) - 1),
                        disable_numparse=True)


class _Ledger:
    """Live bytes by category through a symbolic run; keeps the peak, its phase and the breakdown at it."""

    def __init__(self, round_to: int) -> None:
        self.round_to = round_to
        self.phase = "forward"
        self.act = _ACT  # what the forward's tensors are: activations, or recomputed ones in backward
        self.live: Counter[str] = Counter()
        self.total = self.peak = 0
        self.peak_phase = "forward"
        self.at_peak: dict[str, int] = {}
        self._items: dict[int, tuple[int, str]] = {}
        self._ids = itertools.count()

    def new(self, nbytes: int, category: str) -> int | None:
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

    def free(self, *handles: int | None) -> None:
        for handle in handles:
            if handle is not None:
                nbytes, category = self._items.pop(handle)
                self.live[category] -= nbytes
                self.total -= nbytes


@dataclass(frozen=True)
class _Run:
    """Shapes (elements), element sizes (bytes) and switches of one step."""

    B: int  # micro batch
    T: int
    C: int
    H: int
    L: int
    V: int
    rows: int  # vocabulary rows of wte/lm_head (padded)
    accum: int
    autocast: bool
    pw: int  # parameters, gradients, optimizer state and the residual stream
    ac: int  # matmul outputs: 2 under autocast
    cuda: bool
    attn: str  # "fused" (O(T) saved), "manual" (model.py's masked softmax) or "math" (SDPA's math kernel; also
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
    def stat(self) -> int:
        """LayerNorm's saved mean and rstd: fp32 on CUDA, the input's dtype on the CPU."""
        return 4 if self.cuda else self.pw

    @property
    def lp(self) -> int:
        """Log-probabilities: cross-entropy runs in fp32 under autocast."""
        return 4 if self.autocast else self.pw

    @property
    def pb(self) -> int:
        """Attention probabilities: CUDA's autocast runs softmax in fp32, the CPU's keeps the matmul dtype."""
        return 4 if self.cuda and self.autocast else self.ac


class _Grads:
    """AccumulateGrad: the first incoming tensor becomes ``.grad``, later micro-batches add into it in place; with
    the optimizer in backward each parameter is stepped and its gradient freed at once. A tied lm_head's gradient
    waits in AccumulateGrad's input buffer until the embedding's arrives."""

    def __init__(self, run: _Run, lg: _Ledger, shapes: list[tuple[str, int, bool]]) -> None:
        self.run, self.lg = run, lg
        self.numel = {name: n for name, n, _ in shapes}
        self.decayed = {name: d for name, _, d in shapes}
        self.numel.setdefault("lm_head.weight", self.numel["transformer.wte.weight"])
        self.held: dict[str, int | None] = {}
        self.pending: int | None = None

    def incoming(self, name: str) -> int | None:
        """Allocate the gradient arriving for ``name``: .grad to be (the first micro-batch's), else a temporary."""
        becomes_grad = name not in self.held and not (name == "lm_head.weight" and self.run.recipe.tie_weights)
        return self.lg.new(self.numel[name] * self.run.pw, _GRAD if becomes_grad else _BWD)

    def accumulate(self, name: str, handle: int | None) -> None:
        """AccumulateGrad, after the node that made ``handle`` has released its saved tensors."""
        lg, run = self.lg, self.run
        if name == "lm_head.weight" and run.recipe.tie_weights:
            self.pending = handle
        elif name in self.held:
            lg.free(handle)
        elif not run.recipe.optim_in_backward:
            self.held[name] = handle
        else:
            phase, lg.phase = lg.phase, "optimizer"
            lg.free(*[lg.new(n, _OPT) for n in _step_temporaries(run, [(self.numel[name], self.decayed[name])])])
            lg.free(handle)
            lg.phase = phase


def _step_temporaries(run: _Run, params: list[tuple[int, bool]]) -> list[int]:
    """The temporaries an optimizer step over ``params`` (numel, decayed) holds at once at its worst, in bytes.

    AdamW foreach: sqrt(exp_avg_sq) of every parameter of a group (the groups are stepped one after the other);
    for-loop: the sqrt and its quotient for one parameter while the previous one's quotient lives; fused: none.
    SGD: grad + weight_decay * param for the decayed parameters, all at once with foreach (the default on CUDA),
    one at a time otherwise (the CPU)."""
    recipe, pw = run.recipe, run.pw
    if recipe.optimizer == "adamw":
        if recipe.adamw_impl == "fused":
            return []
        groups = ([n for n, d in params if d], [n for n, d in params if not d])
        if recipe.adamw_impl == "for-loop":  # sqrt and quotient; the previous parameter's quotient still lives
            pairs = [(prev, n) for g in groups for prev, n in zip([0] + g, g)]
            prev, n = max(pairs, key=lambda pair: pair[0] + 2 * pair[1])
            return [prev * pw, n * pw, n * pw]
        return [n * pw for n in max(groups, key=sum)]
    decayed = [n * pw for n, d in params if d and recipe.weight_decay]
    return decayed if run.cuda else decayed and [max(decayed)]


def _weight_copy(run: _Run, lg: _Ledger, weight: int, bias: int, cache: list, keep: bool) -> int | None:
    """Autocast's bf16 copies of a Linear's weight and bias. Both sit in autocast's cache until the forward ends;
    the weight's is also saved for backward (returned when ``keep``)."""
    if not run.autocast:
        return None
    cache.append(lg.new(2 * bias * run.bias, _COPY))
    w = lg.new(2 * weight, _COPY)
    if keep:
        return w
    cache.append(w)
    return None


def _stats(run: _Run, lg: _Ledger) -> tuple[int | None, int | None]:
    """LayerNorm's mean and rstd, saved for backward."""
    return lg.new(run.stat * run.BT, lg.act), lg.new(run.stat * run.BT, lg.act)


def _dropout(run: _Run, lg: _Ledger, x: int | None, numel: int, elem: int) -> tuple[int | None, int | None]:
    """nn.Dropout in training on ``numel`` elements of ``elem`` bytes: a mask (saved: bool on CUDA, the input's
    dtype on the CPU) and a new output; the input dies. Identity when p == 0."""
    if not run.dropout:
        return x, None
    mask = lg.new(numel * (1 if run.cuda else elem), lg.act)
    out = lg.new(numel * elem, lg.act)
    lg.free(x)
    return out, mask


def _block_forward(run: _Run, lg: _Ledger, x: int, cache: list, keep: bool, recompute: bool = False
                   ) -> tuple[int | None, dict[str, int | None]]:
    """model.Block.forward on input ``x``: returns its output and what it saved for backward. ``keep=False`` is
    checkpoint's forward (nothing saved: tensors die at their last use); ``recompute`` is checkpoint's
    recomputation in backward, which stops once the last saved tensor is saved again."""
    A, ac, pw, C, BTC = run.autocast, run.ac, run.pw, run.C, run.BTC
    sv: dict[str, int | None] = {"x": x}
    # ln_1 saves its input, mean and rstd; autocast casts its fp32 output for c_attn and saves the cast
    h1 = lg.new(pw * BTC, lg.act)
    st1 = _stats(run, lg)
    if not keep:
        lg.free(*st1)
    w_attn = _weight_copy(run, lg, 3 * C * C, 3 * C, cache, keep)
    h1c = lg.new(2 * BTC, lg.act) if A else None
    qkv = lg.new(ac * 3 * BTC, lg.act)
    if keep:
        sv.update(st1=st1, h1=h1c if A else h1, w_attn=w_attn)
    else:
        lg.free(h1c)
    if run.attn == "fused":  # saves q, k, v (views of qkv), its output and the log-sum-exp
        y = lg.new(ac * BTC, lg.act)  # laid out (B, T, nh, hs): y.transpose(1, 2).contiguous() copies nothing
        lse = lg.new(4 * run.B * run.H * run.T, lg.act)
        if keep:
            sv.update(qkv=qkv, out=y, lse=lse)
        else:
            lg.free(lse)
        qkv_saved = keep
    else:
        attention = _manual_attention if run.attn == "manual" else _math_attention
        y, qkv_saved = attention(run, lg, sv, keep, qkv)
    w_proj = _weight_copy(run, lg, C * C, C, cache, keep)
    o = lg.new(ac * BTC, lg.act)
    o, rm1 = _dropout(run, lg, o, BTC, ac)
    if keep:
        sv.update(y=y, w_proj=w_proj, rm1=rm1)
    else:
        lg.free(rm1, y)
    # the attention module returns: its argument (ln_1's output) and its q, k, v locals die unless saved
    lg.free(h1 if A or not keep else None, None if qkv_saved else qkv)
    x2 = lg.new(pw * BTC, lg.act)
    lg.free(o)
    # ln_2 and the MLP
    h2 = lg.new(pw * BTC, lg.act)
    st2 = _stats(run, lg)
    if not keep:
        lg.free(*st2)
    w_fc = _weight_copy(run, lg, 4 * C * C, 4 * C, cache, keep)
    h2c = lg.new(2 * BTC, lg.act) if A else None
    f = lg.new(ac * 4 * BTC, lg.act)
    if not keep:
        lg.free(h2c)
    g = lg.new(ac * 4 * BTC, lg.act)
    if not keep:
        lg.free(f)
    w_proj2 = _weight_copy(run, lg, 4 * C * C, C, cache, keep)
    if keep:
        sv.update(x2=x2, st2=st2, h2=h2c if A else h2, w_fc=w_fc, f=f, g=g, w_proj2=w_proj2)
    if recompute:  # the last saved tensor: c_proj's inputs, or with dropout the residual dropout's mask
        if run.dropout:
            o = lg.new(ac * BTC, lg.act)
            sv["rm2"] = lg.new(BTC * (1 if run.cuda else ac), lg.act)
            lg.free(o)
        lg.free(h2 if A else None)
        return None, sv
    o = lg.new(ac * BTC, lg.act)
    if not keep:
        lg.free(g)
    o, rm2 = _dropout(run, lg, o, BTC, ac)
    if keep:
        sv["rm2"] = rm2
    else:
        lg.free(rm2)
    lg.free(h2 if A or not keep else None)
    out = lg.new(pw * BTC, lg.act)
    lg.free(o, None if keep else x2)
    return out, sv


def _manual_attention(run: _Run, lg: _Ledger, sv: dict, keep: bool, qkv: int | None) -> tuple[int, bool]:
    """model.py's masked-softmax attention: contiguous copies of q, k and v for the batched matmuls, the T x T
    probabilities (and dropout's mask and output), the ~mask, and y copied contiguous for c_proj. Returns y and
    whether qkv itself is saved."""
    ac, BTC, BHTT = run.ac, run.BTC, run.BHTT
    dead = (lambda *h: lg.free(*h)) if not keep else (lambda *h: None)  # not saved: dies at its last use
    views = run.B == 1  # a batch of one reshapes the head-split q, k, v for bmm without copies (they stay qkv's)
    qc, kc = (None, None) if views else (lg.new(ac * BTC, lg.act), lg.new(ac * BTC, lg.act))
    scores = lg.new(ac * BHTT, lg.act)
    dead(qc, kc)
    scaled = lg.new(ac * BHTT, lg.act)
    lg.free(scores)
    nm = lg.new(run.T * run.T, lg.act)  # ~mask, saved by masked_fill
    masked = lg.new(ac * BHTT, lg.act)
    lg.free(scaled)
    dead(nm)
    upcast = lg.new(4 * BHTT, lg.act) if run.pb != ac else None  # CUDA autocast: softmax in fp32
    p = lg.new(run.pb * BHTT, lg.act)
    lg.free(masked, upcast)
    att, pm = _dropout(run, lg, None, BHTT, run.pb)
    dead(pm, p if att is not None else None)
    pc = lg.new(2 * BHTT, lg.act) if run.pb != ac else None  # the matmul's bf16 cast of the fp32 probabilities
    vc = None if views else lg.new(ac * BTC, lg.act)
    yb = lg.new(ac * BTC, lg.act)
    dead(vc, pc, att if att is not None else p)
    if keep:
        sv.update(qc=qc, kc=kc, nm=nm, p=p, pm=pm, pd=att, pc=pc, vc=vc, qkv=qkv if views else None)
    y = lg.new(ac * BTC, lg.act)
    lg.free(yb)
    return y, keep and views


def _math_attention(run: _Run, lg: _Ledger, sv: dict, keep: bool, qkv: int | None) -> tuple[int, bool]:
    """SDPA's math kernel: like the manual path, but fp16/bf16 inputs are upcast and it works in fp32, scales q and
    k rather than the scores, and adds a T x T float causal bias instead of masked_fill. Returns y and whether qkv
    itself is saved."""
    ac, BTC, BHTT, T = run.ac, run.BTC, run.BHTT, run.T
    dead = (lambda *h: lg.free(*h)) if not keep else (lambda *h: None)  # not saved: dies at its last use
    wd = 4 if ac == 2 else ac  # the kernel's working dtype
    views = run.B == 1  # a batch of one reshapes for bmm without copies: the scaled q and k themselves are saved
    ups = [lg.new(4 * BTC, lg.act) for _ in range(3)] if ac == 2 else [None] * 3  # q, k, v upcast
    qs = lg.new(wd * BTC, lg.act)  # q * sqrt(scale)
    ones = lg.new(T * T, lg.act)
    tril = lg.new(T * T, lg.act)
    lg.free(ones)
    bias = lg.new(4 * T * T, lg.act)  # the causal bias (-inf above the diagonal)
    lg.free(tril)
    ks = lg.new(wd * BTC, lg.act)
    qc, kc = (qs, ks) if views else (lg.new(wd * BTC, lg.act), lg.new(wd * BTC, lg.act))
    scores = lg.new(wd * BHTT, lg.act)
    lg.free(None if views else ks)
    dead(None if views else qc, kc)
    biased = lg.new(wd * BHTT, lg.act)
    lg.free(scores)
    p = lg.new(wd * BHTT, lg.act)
    lg.free(biased)
    att, pm = _dropout(run, lg, None, BHTT, wd)
    dead(pm, p if att is not None else None)
    unused = lg.new(2 * BHTT, lg.act) if ac == 2 else None  # the probabilities cast back, unused
    vc = (ups[2] if ac == 2 else qkv) if views else lg.new(wd * BTC, lg.act)
    o = lg.new(wd * BTC, lg.act)
    dead(None if vc in (qkv, ups[2]) else vc, att if att is not None else p)
    if ac == 2:
        o16 = lg.new(2 * BTC, lg.act)
        lg.free(o)
        o = o16
    lg.free(qs if not views or not keep else None, bias, ups[0], ups[1], unused,
            ups[2] if not views or not keep else None)
    if keep:
        sv.update(qc=qc, kc=kc, p=p, pm=pm, pd=att, vc=vc)
    y = lg.new(ac * BTC, lg.act)
    lg.free(o)
    return y, keep and views and ac != 2


def _forward(run: _Run, lg: _Ledger) -> tuple[int, list[dict], dict]:
    """GPT.forward with the loss: returns the logits, each block's saved tensors, and the embeddings' and head's."""
    A, ac, pw, C, BTC = run.autocast, run.ac, run.pw, run.C, run.BTC
    cache: list = []
    pos = lg.new(8 * run.T, _ACT)
    tok, pe = lg.new(pw * BTC, _ACT), lg.new(pw * run.T * C, _ACT)
    x = lg.new(pw * BTC, _ACT)
    lg.free(tok, pe)
    x, emb_mask = _dropout(run, lg, x, BTC, pw)
    blocks = []
    for _ in range(run.L):
        out, saved = _block_forward(run, lg, x, cache, keep=not run.recipe.checkpoint)
        blocks.append(saved)
        x = out
    head: dict[str, int | None] = {"x": x, "pos": pos, "emb_mask": emb_mask}
    hf = lg.new(pw * BTC, _ACT)
    head["st"] = _stats(run, lg)
    head["w"] = _weight_copy(run, lg, run.rows * C, 0, cache, keep=True)
    head["h"] = lg.new(2 * BTC, _HEAD) if A else hf
    logits = lg.new(ac * run.B * run.T * run.rows, _HEAD)
    lg.free(hf if A else None)
    n = run.BT * run.V
    upcast = lg.new(4 * n, _HEAD) if A else None  # cross-entropy runs in fp32 under autocast
    head["logp"] = lg.new(run.lp * n, _HEAD)
    head["nll"] = (lg.new(run.lp, _HEAD), lg.new(run.lp, _HEAD))  # the loss and nll's total_weight
    lg.free(upcast)
    lg.free(*cache)  # leaving autocast clears its cache: bias copies die, saved weight copies live on
    return logits, blocks, head


def _linear_backward(run: _Run, lg: _Ledger, grads: _Grads, name: str, d_in: int, bias: bool, free: tuple,
                     cast_input: bool) -> int:
    """A Linear's backward: the input's gradient (``d_in`` elements) and the weight's and bias's; the tensors in
    ``free`` die. Under autocast the weight gradients arrive in bf16 and are cast to fp32, and so is the input's
    gradient when the input was an fp32 tensor cast for the matmul (``cast_input``). Returns the input gradient."""
    dx = lg.new(run.ac * d_in, _BWD)
    names = [f"{name}.weight"] + ([f"{name}.bias"] if bias and run.bias else [])
    if not run.autocast:
        incoming = [grads.incoming(pname) for pname in names]
        lg.free(*free)
        for pname, handle in zip(names, incoming):
            grads.accumulate(pname, handle)
        return dx
    low = [lg.new(2 * grads.numel[pname], _BWD) for pname in names]
    lg.free(*free)
    if cast_input:
        dx32 = lg.new(4 * d_in, _BWD)
        lg.free(dx)
        dx = dx32
    for pname, handle in zip(names, low):
        grad = grads.incoming(pname)
        lg.free(handle)
        grads.accumulate(pname, grad)
    return dx


def _layernorm_backward(run: _Run, lg: _Ledger, grads: _Grads, name: str, free: tuple) -> int:
    dx = lg.new(run.pw * run.BTC, _BWD)
    names = [f"{name}.weight"] + ([f"{name}.bias"] if run.bias else [])
    incoming = [grads.incoming(pname) for pname in names]
    lg.free(*free)
    for pname, handle in zip(names, incoming):
        grads.accumulate(pname, handle)
    return dx


def _dropout_backward(run: _Run, lg: _Ledger, d: int, upstream: int, mask: int | None, nbytes: int) -> int:
    if mask is None:
        return d
    out = lg.new(nbytes, _BWD)
    lg.free(mask, d if d != upstream else None)
    return out


def _attention_backward(run: _Run, lg: _Ledger, sv: dict, dy: int) -> int:
    """Returns the gradient of qkv (B, T, 3C)."""
    ac, BTC, BHTT = run.ac, run.BTC, run.BHTT
    if run.attn == "fused":  # the fused kernel's dq, dk, dv, then cat
        parts = [lg.new(ac * BTC, _BWD) for _ in range(3)]
        lg.free(dy, sv["qkv"], sv["lse"], sv["out"])
    elif run.attn == "math":
        parts = _math_attention_backward(run, lg, sv, dy)
    else:
        dyc = None if run.B == 1 else lg.new(ac * BTC, _BWD)  # the head-split gradient made contiguous for bmm
        lg.free(None if run.B == 1 else dy)
        dv = lg.new(ac * BTC, _BWD)
        datt = lg.new(ac * BHTT, _BWD)
        lg.free(dyc if dyc is not None else dy, sv["vc"], sv["pc"], sv["pd"])  # bmm's saved inputs
        if run.pb != ac:
            up = lg.new(run.pb * BHTT, _BWD)
            lg.free(datt)
            datt = up
        if sv["pm"] is not None:
            dd = lg.new(run.pb * BHTT, _BWD)
            lg.free(datt, sv["pm"])
            datt = dd
        dsm = lg.new(run.pb * BHTT, _BWD)
        lg.free(datt, sv["p"])
        dmf = lg.new(ac * BHTT, _BWD)
        lg.free(dsm, sv["nm"])
        dsc = lg.new(ac * BHTT, _BWD)
        lg.free(dmf)
        dk, dq = lg.new(ac * BTC, _BWD), lg.new(ac * BTC, _BWD)
        lg.free(dsc, sv["kc"], sv["qc"], sv["qkv"])
        c1 = lg.new(ac * BTC, _BWD)
        lg.free(dv)
        c2 = lg.new(ac * BTC, _BWD)
        lg.free(dq)
        parts = [c1, c2, dk]
    dqkv = lg.new(ac * 3 * BTC, _BWD)
    lg.free(*parts)
    return dqkv


def _math_attention_backward(run: _Run, lg: _Ledger, sv: dict, dy: int) -> list[int | None]:
    """Gradients of q, k and v through the math kernel (in its working dtype, cast back at the end)."""
    ac, BTC, BHTT = run.ac, run.BTC, run.BHTT
    wd = 4 if ac == 2 else ac
    if ac == 2:
        up = lg.new(4 * BTC, _BWD)
        lg.free(dy)
        dy = up
    dyc = None if run.B == 1 else lg.new(wd * BTC, _BWD)  # the head-split gradient made contiguous for bmm
    lg.free(None if run.B == 1 else dy)
    dv = lg.new(wd * BTC, _BWD)
    datt = lg.new(wd * BHTT, _BWD)
    lg.free(dyc if dyc is not None else dy, sv["vc"], sv["pd"])  # bmm's saved inputs
    if sv["pm"] is not None:
        dd = lg.new(wd * BHTT, _BWD)
        lg.free(datt, sv["pm"])
        datt = dd
    dsm = lg.new(wd * BHTT, _BWD)
    lg.free(datt, sv["p"])
    dk, dq = lg.new(wd * BTC, _BWD), lg.new(wd * BTC, _BWD)
    lg.free(dsm, sv["kc"], sv["qc"])
    dks = lg.new(wd * BTC, _BWD)
    lg.free(dk)
    dqs = lg.new(wd * BTC, _BWD)
    lg.free(dq)
    if ac == 2:  # back through the upcasts
        parts = []
        for grad in (dv, dks, dqs):
            parts.append(lg.new(2 * BTC, _BWD))
            lg.free(grad)
        dv, dks, dqs = parts
    c1 = lg.new(ac * BTC, _BWD)
    lg.free(dv)
    c2 = lg.new(ac * BTC, _BWD)
    lg.free(dqs)
    return [c1, c2, dks]


def _block_backward(run: _Run, lg: _Ledger, grads: _Grads, i: int, sv: dict, dy: int) -> int:
    """Backward of block ``i`` given the gradient ``dy`` of its output; returns the gradient of its input."""
    A, ac, pw, BTC = run.autocast, run.ac, run.pw, run.BTC
    p = f"transformer.h.{i}"
    d = lg.new(2 * BTC, _BWD) if A else dy  # AddBackward casts the fp32 gradient for the bf16 branch
    if run.recipe.checkpoint:  # recompute the block from its saved input: activations again, for one block
        cache: list = []
        lg.act = _RECOMP
        _, sv = _block_forward(run, lg, sv["x"], cache, keep=True, recompute=True)
        lg.act = _ACT
        lg.free(*cache)
    # MLP: out = x2 + dropout(c_proj(gelu(c_fc(ln_2(x2)))))
    d = _dropout_backward(run, lg, d, dy, sv.get("rm2"), ac * BTC)
    dg = _linear_backward(run, lg, grads, f"{p}.mlp.c_proj", 4 * BTC, True,
                          (d if d != dy else None, sv["g"], sv["w_proj2"]), cast_input=False)
    dfc = lg.new(ac * 4 * BTC, _BWD)
    lg.free(dg, sv["f"])
    dh2 = _linear_backward(run, lg, grads, f"{p}.mlp.c_fc", BTC, True, (dfc, sv["h2"], sv["w_fc"]), cast_input=A)
    dxl = _layernorm_backward(run, lg, grads, f"{p}.ln_2", (dh2, sv["x2"], *sv["st2"]))
    dx2 = lg.new(pw * BTC, _BWD)
    lg.free(dy, dxl)
    # attention: x2 = x + dropout(c_proj(attention(c_attn(ln_1(x)))))
    d = lg.new(2 * BTC, _BWD) if A else dx2
    d = _dropout_backward(run, lg, d, dx2, sv.get("rm1"), ac * BTC)
    dya = _linear_backward(run, lg, grads, f"{p}.attn.c_proj", BTC, True,
                           (d if d != dx2 else None, sv["y"] if run.attn != "fused" else None, sv["w_proj"]),
                           cast_input=False)
    dqkv = _attention_backward(run, lg, sv, dya)
    dh1 = _linear_backward(run, lg, grads, f"{p}.attn.c_attn", BTC, True, (dqkv, sv["h1"], sv["w_attn"]),
                           cast_input=A)
    dxl = _layernorm_backward(run, lg, grads, f"{p}.ln_1", (dh1, sv["x"], *sv["st1"]))
    dx = lg.new(pw * BTC, _BWD)
    lg.free(dx2, dxl)
    return dx


def _backward(run: _Run, lg: _Ledger, grads: _Grads, blocks: list[dict], head: dict) -> None:
    """loss.backward(): cross-entropy, lm_head, ln_f, the blocks top-down, the embeddings."""
    A, ac, pw, C, BTC = run.autocast, run.ac, run.pw, run.C, run.BTC
    n = run.BT * run.V
    scalars = [lg.new(run.lp, _BWD) for _ in range(2)]
    dnll = lg.new(run.lp * n, _BWD)
    dlogits = lg.new(run.lp * n, _BWD)
    lg.free(dnll, head["logp"], *head["nll"])
    if A:  # back through the fp32 upcast
        low = lg.new(2 * n, _BWD)
        lg.free(dlogits)
        dlogits = low
    if run.rows != run.V:  # back through logits[..., :vocab_size]: a zero-padded full-width gradient
        full = lg.new(ac * run.B * run.T * run.rows, _BWD)
        lg.free(dlogits)
        dlogits = full
    dx = _linear_backward(run, lg, grads, "lm_head", BTC, False, (dlogits, head["h"], head["w"]), cast_input=A)
    dx = _layernorm_backward(run, lg, grads, "transformer.ln_f", (dx, head["x"], *head["st"]))
    for i in reversed(range(run.L)):
        dx = _block_backward(run, lg, grads, i, blocks[i], dx)
    # embeddings: x0 = dropout(wte(idx) + wpe(pos))
    if head["emb_mask"] is not None:
        d = lg.new(pw * BTC, _BWD)
        lg.free(dx, head["emb_mask"])
        dx = d
    summed = lg.new(pw * run.T * C, _BWD)  # wpe's gradient summed over the batch, then scattered into the table
    dwpe = grads.incoming("transformer.wpe.weight")
    lg.free(summed, head["pos"])
    grads.accumulate("transformer.wpe.weight", dwpe)
    if run.recipe.tie_weights:  # the embedding's gradient + the waiting lm_head's: their sum becomes .grad
        dwte = lg.new(pw * run.rows * C, _BWD)
        lg.free(dx)
        total = grads.incoming("transformer.wte.weight")
        lg.free(dwte, grads.pending)
    else:
        total = grads.incoming("transformer.wte.weight")
        lg.free(dx)
    grads.accumulate("transformer.wte.weight", total)
    lg.free(*scalars)


def estimate(cfg: GPTConfig, recipe: Recipe, *, batch: int | None = None, seq: int | None = None,
             device: str = "cuda") -> Estimate:
    """The analytic peak of a steady-state training step (optimizer state allocated) of ``cfg`` with ``recipe``
    on ``device``, its phase and its breakdown; ``batch`` and ``seq`` as in ``resolve``."""
    cfg, recipe, notes = resolve(cfg, recipe, batch=batch, seq=seq, device=device)
    cuda = device == "cuda"
    autocast = recipe.precision in ("fp16", "bf16")
    pw = 2 if recipe.precision == "bf16-pure" else 4
    if recipe.attention in ("manual", "math"):
        attn = recipe.attention
    else:  # sdpa: a fused kernel, except on the CPU with dropout, where it falls back to the math kernel
        attn = "math" if not cuda and cfg.dropout > 0 else "fused"
    run = _Run(B=recipe.micro_batch(cfg), T=cfg.block_size, C=cfg.n_embd, H=cfg.n_head, L=cfg.n_layer,
               V=cfg.vocab_size, rows=padded_vocab(cfg, recipe), accum=recipe.grad_accum_steps, autocast=autocast,
               pw=pw, ac=2 if autocast else pw, cuda=cuda, attn=attn, dropout=cfg.dropout, bias=cfg.bias,
               recipe=recipe)
    lg = _Ledger(512 if cuda else 1)
    shapes = param_shapes(cfg, recipe)
    n_state = 2 if recipe.optimizer == "adamw" else 1
    for _, n, _ in shapes:
        lg.new(n * pw, _PARAMS)
        for _ in range(n_state):
            lg.new(n * pw, _STATE)
        if recipe.optimizer == "adamw":
            lg.new(4, _OPT)  # the 0-dim step count (memtrack tags only tensors with dims as state)
    for _ in range(cfg.n_layer if run.attn == "manual" else 0):
        lg.new(cfg.block_size ** 2, _BUF)  # the causal mask of each attention module
    lg.new(2 * 8 * run.B * run.accum * run.T, _OTHER)  # the step's input and target token ids
    lg.new(4, _OTHER)  # the running loss
    grads = _Grads(run, lg, shapes)
    at_forward_end = {}
    for _ in range(run.accum):
        lg.phase = "forward"
        logits, blocks, head = _forward(run, lg)
        at_forward_end = +lg.live
        lg.free(logits)  # `loss = self.forward(x, y)[1]`: the logits die with the forward's output tuple
        lg.phase = "backward"
        _backward(run, lg, grads, blocks, head)
    at_backward_end = +lg.live
    if not recipe.optim_in_backward:
        lg.phase = "optimizer"
        lg.free(*[lg.new(n, _OPT) for n in _step_temporaries(run, [(n, d) for _, n, d in shapes])])
    n_params = sum(n for _, n, _ in shapes)
    linear = sum(n for name, n, _ in shapes if ".c_" in name or name == "lm_head.weight")
    if recipe.tie_weights:
        linear += shapes[0][1]  # lm_head's weight is wte's
    states = {_PARAMS: n_params * pw, _GRAD: n_params * pw, _STATE: n_state * n_params * pw,
              _COPY: 2 * linear if autocast else 0}
    return Estimate(total_bytes=lg.peak, phase=lg.peak_phase, by_category=_ordered(lg.at_peak),
                    at_forward_end=_ordered(at_forward_end), at_backward_end=_ordered(at_backward_end),
                    states=states, num_params=n_params, device=device, notes=notes)


def _ordered(by: dict[str, int]) -> dict[str, int]:
    return {c: by[c] for c in CATEGORIES if by.get(c)}


# ---------------------------------------------------------------------------------------------------------------
# The simulation


@dataclass
class Simulation(PeakReport):
    """memtrack's PeakReport of a fake-tensor run (categories as in this module), how it was obtained, and notes."""

    method: str = "direct"
    """'direct', or 'extrapolated from 2 and 3 layers'."""
    notes: tuple[str, ...] = ()
    """What the simulation had to change or cannot see (compiled kernels, CPU kernels standing in for CUDA's)."""

    @property
    def note(self) -> str:
        return "; ".join(self.notes)


class _Tracker(LiveBytes):
    """memtrack.LiveBytes with this module's finer categories, and the peak of every segment of the step.

    A segment is (step, micro-batch, phase, part), part being the embeddings, a block (by index) or the head, in
    forward and backward alike (backward enters a block when the gradient of its output is complete). Within one
    block the live bytes move in parallel for every block index, so a segment's peak is affine in the block index
    and in the number of layers: what makes extrapolation exact."""

    def __init__(self, round_to: int) -> None:
        super().__init__(round_to=round_to)
        self.part: object = "setup"
        self.micro = 0
        self.head = False
        self.seg_peaks: dict[tuple, tuple[int, int]] = {}  # segment -> (live bytes, event) at its peak
        self._copy = False
        self._micro_step = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import torch

        self._copy = (func is torch.ops.aten._to_copy.default and self.phase in ("forward", "backward")
                      and isinstance(args[0], torch.nn.Parameter))
        return super().__torch_dispatch__(func, types, args, kwargs)

    def track(self, t, category: str | None = None) -> None:
        import torch

        event = self._event
        if category is None and self._storages.get(t.untyped_storage()) is None:
            if self._copy:
                category = _COPY
            elif self.phase == "forward" and self.head:
                category = _HEAD
            elif self.phase == "backward" and torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1:
                category = _RECOMP  # inside the autograd engine, only checkpoint's recomputation enables grad
        super().track(t, category)
        if self._event != event:  # a new storage
            key = (self.step, self.micro, self.phase, self.part)
            best = self.seg_peaks.get(key)
            if best is None or self.live > best[0]:
                self.seg_peaks[key] = (self.live, self._event)

    def breakdown(self, event: int) -> dict[str, int]:
        """Live bytes per category just after ``event``."""
        by: Counter[str] = Counter()
        for r in self._records:
            if r.born <= event and (r.died is None or r.died > event):
                by[r.category] += r.nbytes
        return _ordered(by)

    @contextmanager
    def segments(self, model) -> Iterator[None]:
        """Hooks that follow the parts of ``model`` (a gptcore GPT) through forward and backward."""
        blocks = list(model.transformer.h)

        def enter(part: object) -> None:
            self.part = part

        def model_pre(*_) -> None:
            if self._micro_step != self.step:
                self._micro_step, self.micro = self.step, 0
            self.micro += 1
            enter("embed")

        def model_post(*_) -> None:
            self.head = False
            enter("head")

        def block_pre(i: int):
            def hook(_, args) -> None:
                if self.phase == "forward":  # not checkpoint's recomputation
                    enter(i)
                    if i == 0 and args[0].requires_grad:
                        args[0].register_hook(lambda _: enter("embed"))
            return hook

        def block_post(i: int):
            def hook(_, __, out) -> None:
                if self.phase == "forward" and out.requires_grad:
                    out.register_hook(lambda _: enter(i))
            return hook

        def head_pre(*_) -> None:
            self.head = True

        with ExitStack() as stack:
            handles = [model.register_forward_pre_hook(model_pre), model.register_forward_hook(model_post),
                       model.transformer.ln_f.register_forward_pre_hook(lambda *_: enter("head")),
                       model.lm_head.register_forward_pre_hook(head_pre)]
            for i, block in enumerate(blocks):
                handles += [block.register_forward_pre_hook(block_pre(i)), block.register_forward_hook(block_post(i))]
            for h in handles:
                stack.callback(h.remove)
            yield


@contextmanager
def _swappable_fakes(mode) -> Iterator[None]:
    """Let ``Module.to()`` work under FakeTensorMode while the Trainer builds its model.

    Module._apply swaps a fake parameter with torch.utils.swap_tensors, which refuses tensors that carry weak
    references, and the fake-tensor converter's memo holds one to every fake it makes (pytorch/pytorch#184976,
    torch 2.13). While the model is built the memo is a plain dict (no weakrefs); the weak one is put back after."""
    converter = getattr(getattr(mode, "fake_tensor_converter", None), "meta_converter", None)
    memo = getattr(converter, "tensor_memo", None)
    if memo is None:
        yield
        return
    converter.tensor_memo = {}
    try:
        yield
    finally:
        converter.tensor_memo = memo


def _fake_run(cfg: GPTConfig, recipe: Recipe, cuda: bool) -> _Tracker:
    """Two training iterations of a Trainer built and fed on fake tensors, tracked (memtrack.track_training)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .data import load_corpus
    from .train import Trainer

    with torch.random.fork_rng(devices=[]), FakeTensorMode() as mode:  # the Trainer seeds the global RNG
        with _swappable_fakes(mode):
            trainer = Trainer(cfg, recipe, "cpu", corpus=load_corpus("random", vocab_size=cfg.vocab_size))
        if cuda and recipe.optimizer == "sgd":
            for opt in trainer.optimizers:  # SGD's default on CUDA tensors (the CPU's is its for-loop)
                for group in opt.param_groups:
                    group["foreach"] = True
        shape = (recipe.batch_size(cfg), cfg.block_size)
        batches = [(torch.randint(cfg.vocab_size, shape), torch.randint(cfg.vocab_size, shape)) for _ in range(2)]
        tracker = _Tracker(round_to=512 if cuda else 1)
        with tracker.segments(trainer.model):
            track_training(trainer, batches=batches, tracker=tracker)
    return tracker


def _direct(cfg: GPTConfig, recipe: Recipe, cuda: bool) -> Simulation:
    tracker = _fake_run(cfg, recipe, cuda)
    phase, step = tracker.peak_where
    return Simulation(tracker.peak, phase, step, tracker.breakdown(tracker.peak_event))


def _extrapolated(cfg: GPTConfig, recipe: Recipe, cuda: bool) -> Simulation | None:
    """The simulation of ``cfg.n_layer`` layers from runs with 2 and 3: every segment's peak (and its breakdown)
    extended linearly in the number of layers, the largest one wins. Blocks are named first, middle or last; the
    3-layer run checks that its middle block's segments lie on the line through its first and last (the peak
    within a block is affine in the block's index), else None (simulate directly)."""
    n = cfg.n_layer
    tables = []
    for layers in (2, 3):
        tracker = _fake_run(dataclasses.replace(cfg, n_layer=layers), recipe, cuda)
        table = {}
        for (step, micro, phase, part), (live, event) in tracker.seg_peaks.items():
            if isinstance(part, int):
                part = "first" if part == 0 else "last" if part == layers - 1 else "middle"
            table[(step, micro, phase, part)] = (live, event, tracker)
        tables.append(table)
    two, three = tables
    middle = {k: v for k, v in three.items() if k[3] == "middle"}
    three = {k: v for k, v in three.items() if k[3] != "middle"}
    if two.keys() != three.keys():
        return None
    for key, (live, _, _) in middle.items():
        first, last = three.get(key[:3] + ("first",)), three.get(key[:3] + ("last",))
        if first is None or last is None or 2 * live != first[0] + last[0]:
            return None

    def at_n(key: tuple) -> int:
        return two[key][0] + (n - 2) * (three[key][0] - two[key][0])

    best = max(two, key=at_n)
    (_, e2, t2), (_, e3, t3) = two[best], three[best]
    b2, b3 = t2.breakdown(e2), t3.breakdown(e3)
    by = {c: b2.get(c, 0) + (n - 2) * (b3.get(c, 0) - b2.get(c, 0)) for c in CATEGORIES}
    return Simulation(at_n(best), best[2], best[0], _ordered(by), method="extrapolated from 2 and 3 layers")


def _cpu_stands_in_for_cuda(cfg: GPTConfig, recipe: Recipe) -> tuple[str, ...]:
    """Where the CPU kernels a CUDA simulation runs save other tensors than CUDA's would (the estimate has both)."""
    notes = []
    if recipe.attention == "manual" and recipe.precision in ("fp16", "bf16"):
        notes.append("manual attention: CPU autocast keeps softmax in bf16, CUDA's runs it in fp32")
    if cfg.dropout > 0:
        notes.append("dropout: masks in the input's dtype on the CPU, bool on CUDA"
                     + ("; the CPU's sdpa falls back to its math kernel (T x T saved), CUDA's stays O(T)"
                        if recipe.attention == "sdpa" else ""))
    if recipe.precision == "bf16-pure":
        notes.append("LayerNorm saves mean and rstd in bf16 on the CPU, in fp32 on CUDA")
    return tuple(notes)


def simulate(cfg: GPTConfig, recipe: Recipe, *, batch: int | None = None, seq: int | None = None,
             device: str = "cuda", method: Literal["auto", "direct", "extrapolate"] = "auto") -> Simulation:
    """Two training iterations of the real Trainer on fake tensors, tracked: the peak, its phase and step, and
    the breakdown at it. On the CPU this equals a real tracked run (memtrack.track_training) byte for byte.

    ``device="cuda"`` runs the CPU's kernels on fake tensors with CUDA's 512-byte rounding (a CPU-only machine
    cannot fake CUDA's kernel choices); the differences that remain are in ``note``. ``method``: ``direct``
    simulates every layer; ``extrapolate`` simulates 2 and 3 layers and extends each segment's peak linearly
    (exact for a uniform stack, see ``_extrapolated``); ``auto`` extrapolates beyond 4 layers and falls back to a
    direct run if the extrapolation's own check fails. ``batch`` and ``seq`` as in ``resolve``."""
    if method not in ("auto", "direct", "extrapolate"):
        raise ValueError(f"method: choose auto, direct or extrapolate, got {method!r}")
    cfg, recipe, notes = resolve(cfg, recipe, batch=batch, seq=seq, device=device)
    cuda = device == "cuda"
    recipe = dataclasses.replace(recipe, sync_every_step=False, num_workers=0, pin_memory=False)  # host side only
    if recipe.precision == "fp16":
        notes += ("fp16: simulated as bf16 autocast (same sizes): GradScaler reads its inf flag on the host, which "
                  "fake tensors cannot answer, and adds only scalars",)
        recipe = dataclasses.replace(recipe, precision="bf16")
    if cuda:
        notes += _cpu_stands_in_for_cuda(cfg, recipe)
    result = None
    if method == "extrapolate" or (method == "auto" and cfg.n_layer > 4):
        result = _extrapolated(cfg, recipe, cuda)
        if result is None and method == "extrapolate":
            raise ValueError("extrapolate: the 3-layer run's middle block is off the line through its first and "
                             "last; simulate directly")
    result = result or _direct(cfg, recipe, cuda)
    result.notes = notes
    return result


# ---------------------------------------------------------------------------------------------------------------
# Command line (python -m gptcore estimate)


def add_estimate_arguments(sub) -> None:
    """The ``estimate`` subcommand of ``python -m gptcore``."""
    p = sub.add_parser("estimate", help="memory breakdown of a training step: analytic, optionally simulated")
    p.add_argument("--model", required=True, help="model preset (see `list`)")
    p.add_argument("--recipe", default="fp32", help="recipe (see `list`); default fp32")
    p.add_argument("--batch", type=int, default=None, help="sequences per optimizer step (default: the preset's)")
    p.add_argument("--seq", type=int, default=None, help="context length (default: the preset's block_size)")
    p.add_argument("--checkpoint", action="store_true", help="add activation checkpointing to the recipe")
    p.add_argument("--simulate", action="store_true", help="also simulate two iterations on fake tensors")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="device to estimate for (default cuda)")


def cmd_estimate(args) -> int:
    """Print the breakdown in GiB, the phase of the peak and the states per parameter."""
    from .config import get_model, get_recipe

    cfg, recipe = get_model(args.model), get_recipe(args.recipe)
    if args.checkpoint:
        recipe = dataclasses.replace(recipe, checkpoint=True)
    est = estimate(cfg, recipe, batch=args.batch, seq=args.seq, device=args.device)
    sim = simulate(cfg, recipe, batch=args.batch, seq=args.seq, device=args.device) if args.simulate else None
    cfg, recipe, _ = resolve(cfg, recipe, batch=args.batch, seq=args.seq, device=args.device)
    micro = recipe.micro_batch(cfg)
    batch = f"batch {recipe.batch_size(cfg)}" + (f" ({recipe.grad_accum_steps} x {micro})" if micro !=
                                                   recipe.batch_size(cfg) else "")
    print(f"{args.model} / {args.recipe}{' + checkpoint' if args.checkpoint else ''} on {args.device}: "
          f"{est.num_params / 1e6:,.1f}M parameters, {batch}, seq {cfg.block_size}")
    print(est.table(sim))
    st = est.states
    copies = f" (+ {st[_COPY] / est.num_params:.1f} in autocast's weight copies)" if st[_COPY] else ""
    print(f"states: {est.bytes_per_param:.1f} bytes/parameter = parameters {st[_PARAMS] / est.num_params:.0f} + "
          f"gradients {st[_GRAD] / est.num_params:.0f} + optimizer state {st[_STATE] / est.num_params:.0f}{copies}; "
          f"saved by the forward: activations {est.at_forward_end.get(_ACT, 0) / GiB:.2f} GiB, logits and loss "
          f"{est.at_forward_end.get(_HEAD, 0) / GiB:.2f} GiB")
    for note in est.notes:
        print(f"note: {note}")
    if sim:
        print(f"note: simulation: {sim.method}" + "".join(f"; {n}" for n in sim.notes if n not in est.notes))
    return 0
