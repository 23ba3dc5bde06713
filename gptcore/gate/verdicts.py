"""Verdicts: a measurement's baseline entry against the recorded one, metric by metric, each check judged by the one
rule of ``gptcore.gate.rules``.

Gate rules (defaults per device type, stored in each file's ``tolerances`` and overridable per run):

* peak memory (allocated bytes) fails above +``memory`` (2%); on CPU the counted bytes are exact and
  deterministic, so any change there is real; a half-precision case measured on another CPU model than its
  entry's is judged without its matmul kernels' scratch, which moves with the CPU (``checks.kernel_memory_check``);
* tokens/s fails below -``speed`` (5%) on a GPU; on CPU it is reported, not gated, unless a run asks for it
  with --speed-tol;
* a step's GPU busy time (its kernels' time on the device timeline, gptcore.measure.trace) fails above
  +``gpu_busy`` (3%, provisional); a CPU has no such figure and no such check;
* the loss of the last timed step must stay within ``loss`` nats (fp32/tf32) or ``loss_amp`` nats (fp16/bf16),
  either way, and only when it was read at the same optimizer step. A CPU entry keeps a loss reference per CPU
  model (``loss.by_cpu``; the model that recorded the entry is always one): on a CPU model that has a reference
  the loss is held to that reference with the same-CPU tolerances; on any other model, to the recorded loss
  within ``loss_other_cpu`` / ``loss_amp_other_cpu`` (see ``Tolerances.default_for``). ``--update-loss-references``
  adds this CPU model's references and changes nothing else;
* every count of the work ledger (gptcore.measure.work) fails above its baseline: they are exact; so does an
  operator that appeared in a phase, or ran in place of another at the same count (``gptcore.gate.operators``),
  unless the run's torch is another release than the baseline's and the swap is at an equal count: a rename, said;
* a convergence case (a whole training run, gptcore.measure.convergence) is judged on what it learned instead: its final
  validation loss fails when worse than the baseline's by more than ``val_loss`` nats (what changing the seed
  moves it by), and its time-to-loss in steps fails when later than the baseline's (exactly on the CPU model that
  recorded it; by more than one evaluation interval on another);
* a step that keeps what it allocated (the second measured step leaves more allocated than the first) fails,
  baseline or not: a leak, which the peak of the first steps and the ledger of one step would miss;
* leaner or faster than the baseline beyond tolerance passes with a "refresh the baseline" note;
* an entry recorded from another setup (the case's model or recipe fields, gptcore.config.fields: a preset changed
  under the same name) is no baseline for the case: nothing is compared, and the verdict names the fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gptcore.gate.operators import OPERATORS, operator_checks
from gptcore.gate.rules import Status, judge, non_finite, percent
from gptcore.gate.schema import Entry, Tolerances

if TYPE_CHECKING:
    pass

from gptcore.gate.checks import (
    BETTER,
    CHANGED,
    FAIL,
    NO_BASELINE,
    NOT_GATED,
    OK,
    WORK_METRICS,
    Check,
    clocks_moved,
    convergence_checks,
    kernel_memory_check,
    leaner,
    loss_check,
    memory_check,
    moved_by_key,
    moved_categories,
    other_kernels,
    speed_check,
    speed_incomparable,
    work_checks,
)


@dataclass
class Verdict:
    case: str
    checks: list[Check]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def refresh(self) -> list[Check]:
        return [c for c in self.checks if c.status == BETTER]

    @property
    def missing(self) -> bool:
        return any(c.status == NO_BASELINE for c in self.checks)

    @property
    def missing_why(self) -> str:
        """' (its entry measured another setup: ...)' where the entry is no baseline for that reason; else ''."""
        why = next((c.note for c in self.checks if c.status == NO_BASELINE and c.note), "")
        return f" ({why})" if why else ""

    def summary(self) -> str:
        """'FAIL: peak memory +3.1%' / 'ok (refresh the baseline: tokens/s +12%)' / 'no baseline' / 'ok'."""
        if self.failed:
            return "FAIL: " + "; ".join(_describe(c) for c in self.failed)
        if self.missing:
            return NO_BASELINE + self.missing_why
        said = [c.note for c in self.checks if c.status == CHANGED]  # news, never a failure: torch's instruments
        if self.refresh:
            said.insert(0, "refresh the baseline: " + "; ".join(_describe(c) for c in self.refresh))
        return f"ok ({'; '.join(said)})" if said else OK

    def failure_message(self) -> str:
        return f"{self.case}: " + "; ".join(f"{_describe(c)} ({c.note})" for c in self.failed)


def _describe(c: Check) -> str:
    if c.metric == OPERATORS:
        return f"{c.metric}: {c.moved}"
    if c.delta is None:
        return c.metric
    if c.metric == "loss":
        return f"{c.metric} {c.delta:+.2e} nats"
    if c.metric == "val loss":
        return f"{c.metric} {c.delta:+.4f} nats"
    if c.metric == "time-to-loss":
        return f"{c.metric} {int(c.delta):+,} steps" if c.delta else c.metric
    if c.metric == KEPT:
        return f"{c.metric} {int(c.delta):+,} B"
    if c.metric in WORK_METRICS:
        return f"{c.metric} {int(c.delta):+,}" + (f" ({c.moved})" if c.moved else "")
    return f"{c.metric} {c.delta:+.1%}"


def verdict_of(
    case: str,
    measured: Entry,
    baseline: Entry | None,
    tol: Tolerances,
    unfit: str | None = None,
    *,
    strict: bool = False,
) -> Verdict:
    """Verdicts of ``measured`` against ``baseline`` (None: no baseline recorded) under ``tol``; ``unfit``: why
    the machine could not time this case (its speed is then not gated); ``strict`` (--baseline-strict): an exact
    figure that went down (the work ledger's counts, the CPU peak) fails as leaner than the baseline, on any device
    and any CPU model: both measured the same on every CPU model, but for the scratch of half-precision matmul
    kernels, which a bf16 case's peak is judged without on another model (``checks.kernel_memory_check``;
    docs/gate.md, "Strict on every CPU")."""
    if measured.convergence is not None:
        return Verdict(case, convergence_checks(measured, baseline, tol))
    changed = measured.setup_changes(baseline)
    if baseline is None or changed:
        why = f"its entry measured another setup: {'; '.join(changed)}" if changed else ""
        return Verdict(
            case,
            [Check(metric, None, None, None, NO_BASELINE, why) for metric in ("peak memory", "tokens/s", "loss")]
            + ([Check(GPU_BUSY, None, None, None, NO_BASELINE, why)] if measured.gpu_busy_seconds is not None else [])
            + kept_check(measured),
        )
    if other_kernels(measured, baseline):  # the kernels' scratch in the peak moves with the CPU model
        memory = kernel_memory_check(measured, baseline, tol, strict=strict)
    else:
        memory = memory_check(measured.peak_allocated_bytes, baseline.peak_allocated_bytes, tol)
        if memory.status in (FAIL, BETTER):  # say where the change is
            where = moved_categories(measured.peak_by_category, baseline.peak_by_category)
            estimated = moved_categories(measured.estimate_by_category, baseline.estimate_by_category)
            where = where or (f"estimate: {estimated}" if estimated else None)
            memory = memory_check(measured.peak_allocated_bytes, baseline.peak_allocated_bytes, tol, where=where)
        # --baseline-strict judges exact figures both ways: the CPU peak here (a GPU's allocator peak is not exact),
        # the work ledger's counts below
        if strict and measured.cpu_model is not None and memory.delta is not None and memory.delta < 0:
            memory = leaner(memory, moved_categories(measured.peak_by_category, baseline.peak_by_category))
    checks = [
        memory,
        speed_check(
            measured.tokens_per_s,
            baseline.tokens_per_s,
            tol,
            unfit or clocks_moved(measured.clocks, baseline.clocks),  # the timed rounds' clocks
            speed_incomparable(measured.cpu_model, baseline),
        ),
    ]
    off = unfit or clocks_moved(measured.clocks, baseline.clocks, traced=True)  # the clock its kernels ran at
    busy = busy_check(measured.gpu_busy_seconds, baseline.gpu_busy_seconds, tol, off)  # None on CPU
    if busy and busy.status in (FAIL, BETTER):  # say which kinds of kernel moved it
        where = moved_kinds(measured.gpu_kernel_seconds, baseline.gpu_kernel_seconds)
        busy = busy_check(measured.gpu_busy_seconds, baseline.gpu_busy_seconds, tol, off, where=where)
    checks += [busy] if busy else []
    checks += work_checks(measured.work, baseline.work, tol.work, strict)
    checks += operator_checks(measured.work, baseline.work, strict=strict, torches=(baseline.torch, measured.torch))

    # the loss: held to this CPU model's reference where there is one, else to the recorded loss, wider when that
    # was recorded on another CPU model
    reference, ref_cpu = baseline.loss_reference(measured.cpu_model)
    other_cpu = bool(measured.cpu_model and ref_cpu and measured.cpu_model != ref_cpu)
    where = (
        f", no reference for this CPU model: held to {ref_cpu}'s"
        if other_cpu
        else f", reference of {ref_cpu}"
        if ref_cpu
        else ""
    )
    checks.append(
        loss_check(
            measured.loss,
            reference,
            tol.loss_tolerance(measured.precision, other_cpu),
            step=measured.loss_step,
            before_step=baseline.loss_step,
            where=where,
        )
    )
    return Verdict(case, checks + kept_check(measured))


KEPT = "kept per step"


def kept_check(measured: Entry) -> list[Check]:
    """A steady training step keeps nothing: what the second measured step left allocated beyond the first's fails
    whatever the baseline says (the CPU allocator's exact count; not measured on a GPU yet)."""
    kept = measured.kept_bytes
    if kept is None or kept <= 0:
        return []
    said = f"the second step left {kept:,} B more allocated than the first: every step keeps something (a leak)"
    return [Check(KEPT, kept, 0, kept, FAIL, note=said)]


GPU_BUSY = "GPU busy"
"""The check of a step's GPU busy time (gptcore.measure.trace)."""


def busy_check(
    now: float | None, before: float | None, tol: Tolerances, off: str | None = None, *, where: str | None = None
) -> Check | None:
    """The GPU busy time of a step: FAIL above +tol.gpu_busy, better (faster kernels) below -tol.gpu_busy; not gated
    where ``off`` says why (a machine unfit to time, other clocks: the kernels ran at other clocks too); no delta
    where one side has no figure (a baseline recorded before it was measured); None where neither has (CPU).
    ``where``: the kinds of kernel that moved (:func:`moved_kinds`), for the note."""
    if now is None and before is None:
        return None
    if bad := non_finite(now):
        return Check(GPU_BUSY, now, before, None, FAIL, f"GPU busy time is {bad} (the trace broke)")
    status, d = judge(now, before, tol.gpu_busy, worse="higher", relative=True)
    if d is None:
        why = "the baseline has no GPU busy time: record it" if before is None else "not measured in this run"
        return Check(GPU_BUSY, now, before, None, Status.NO_FIGURE, why)
    if off or tol.gpu_busy is None:
        return Check(GPU_BUSY, now, before, d, NOT_GATED, off or "no tolerance for it here")
    note = f"{now * 1e3:,.3f} vs {before * 1e3:,.3f} ms of kernels per step, tolerance +{percent(tol.gpu_busy)}"
    return Check(GPU_BUSY, now, before, d, status, note + (f"; {where}" if where else ""))


def moved_kinds(now: dict[str, float] | None, before: dict[str, float] | None, most: int = 3) -> str | None:
    """Which kinds of kernel a busy time moved by, the most first: 'attention +0.980 ms (+31.1%), matmul +0.070 ms
    (+0.4%)', at most ``most`` of them (None without both splits: a baseline recorded before they were kept)."""
    if not now or not before:
        return None
    moved = moved_by_key(now, before)
    if not moved:
        return "no kind of kernel moved"

    def said(kind: str, d: float) -> str:
        was = before.get(kind, 0.0)
        change = f"{d / was:+.1%}" if was and kind in now else "gone" if was else "new"
        return f"{kind} {d * 1e3:+,.3f} ms ({change})"

    rest = f", {len(moved) - most} more kind(s) moved less" if len(moved) > most else ""
    return "by kind: " + ", ".join(said(k, d) for k, d in moved[:most]) + rest
