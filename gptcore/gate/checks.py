"""The per-metric checks of a verdict: peak memory, tokens/s, the loss at its step, every count of the work ledger
and a convergence run's figures, each a ``Check`` judged by the one rule of ``gptcore.gate.rules``, with the text
that names what moved (the operators, the memory categories, the clocks). ``gptcore.gate.verdicts`` strings them
together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gptcore.config import HALF_PRECISIONS
from gptcore.gate.rules import Status, delta, judge, non_finite, percent
from gptcore.gate.schema import Entry, Tolerances
from gptcore.measure.clocks import BUSY_SHARE
from gptcore.memory.categories import UNTRACKED
from gptcore.units import format_bytes

if TYPE_CHECKING:
    from gptcore.measure.work import WorkLedger


OK, FAIL, BETTER, NOT_GATED, NO_BASELINE = Status.OK, Status.FAIL, Status.BETTER, Status.NOT_GATED, Status.NO_BASELINE
CHANGED = Status.CHANGED
#: the work ledger's gated counts (gptcore.measure.work.WorkLedger.gated); their Check.delta is absolute
WORK_METRICS = (
    "flops",
    "op calls",
    "syncs",
    "allocations",
    "allocated bytes",
    "graphs",
    "graph breaks",
    "recompiles",
    "kernels",
)
_PER_PHASE = {"flops": "flops", "op calls": "op_calls"}
LEANER = "leaner than the baseline"
"""--baseline-strict: an exact figure that went down fails with this, since its baseline is stale."""
REFRESH = "refresh with --update-baselines if the change meant it"
"""A leaner figure is often a fix but can be a bug (a dropped divide, a lost upcast): its author must say which."""
COVERAGE = "flop coverage"
"""The check that names operators torch's FlopCounterMode counts and ``gptcore.measure.flops`` does not, when they
change."""
BY_OP = ("op calls", "allocations", "flops")
"""The counts the ledger keeps by operator, named in a verdict when they move (:func:`moved_ops`)."""


@dataclass
class Check:
    """One metric of one case against its reference. ``delta`` is relative for memory and speed, in nats for the
    losses, absolute for the work ledger's counts and time-to-loss (steps)."""

    metric: str
    measured: float | None
    baseline: float | None
    delta: float | None
    status: Status
    note: str = ""
    moved: str | None = None
    """The work ledger: the operators whose counts moved ('aten.detach +4, aten.alias +4')."""

    @property
    def failed(self) -> bool:
        return self.status == FAIL


def short_name(op: str) -> str:
    """'aten.detach.default' -> 'aten.detach' (an overload named only where it is not the default)."""
    return op.removesuffix(".default")


def moved_ops(now: dict[str, int] | None, before: dict[str, int] | None, top: int = 3) -> str | None:
    """The operators whose counts changed, largest change first: 'aten.detach +4, aten.alias +4' (the top
    ``top``, then '+N more'); 'operators not recorded' when either side has no per-operator counts; None when
    none changed."""
    if now is None or before is None:
        return "operators not recorded"
    deltas = {op: now.get(op, 0) - before.get(op, 0) for op in {*now, *before}}
    moved = sorted(((op, d) for op, d in deltas.items() if d), key=lambda od: (-abs(od[1]), od[0]))
    if not moved:
        return None
    text = ", ".join(f"{short_name(op)} {d:+,}" for op, d in moved[:top])
    return text + (f", +{len(moved) - top} more" if len(moved) > top else "")


def moved_by_key(now: dict[str, Any], before: dict[str, Any]) -> list[tuple[str, Any]]:
    """Each key whose value moved from ``before`` to ``now`` with its change (a key one side lacks is 0 there), the
    largest change first."""
    deltas = {k: now.get(k, 0) - before.get(k, 0) for k in dict.fromkeys([*before, *now])}
    return sorted(((k, d) for k, d in deltas.items() if d), key=lambda kd: -abs(kd[1]))


def moved_categories(now: dict[str, int] | None, before: dict[str, int] | None) -> str | None:
    """Where a peak moved, e.g. 'activations +16.00 MiB, everything else =' (None without both breakdowns)."""
    if not now or not before:
        return None
    moved = moved_by_key(now, before)
    if not moved:
        return "no category moved"
    text = ", ".join(f"{c} {'+' if d > 0 else '-'}{format_bytes(abs(d))}" for c, d in moved)
    return text + (", everything else =" if len(moved) < len({*before, *now}) else "")


def memory_check(
    now: int | None, before: int | None, tol: Tolerances, *, report_change: bool = False, where: str | None = None
) -> Check:
    """Peak allocated bytes: FAIL above +tol.memory, better below -tol.memory. ``report_change``: a move within
    tolerance is 'changed' (compare reports any change); ``where``: the categories that moved, for the note."""
    status, d = judge(now, before, tol.memory, worse="higher", relative=True, report_change=report_change)
    if d is None:
        return Check("peak memory", now, before, None, status, "no figure to compare")
    note = f"{now:,} B vs {before:,} B ({now - before:+,} B), tolerance +{percent(tol.memory)}"
    return Check("peak memory", now, before, d, status, note + (f"; {where}" if where else ""))


def other_kernels(measured: Entry, baseline: Entry) -> bool:
    """A half-precision CPU case measured on another CPU model than its entry's: their matmul kernels' scratch
    differs (gptcore.memory.scratch), so only the peak without it compares."""
    return (
        measured.precision in HALF_PRECISIONS
        and measured.cpu_model is not None
        and baseline.cpu_model is not None
        and measured.cpu_model != baseline.cpu_model
    )


def tracked_only(measured: Entry, baseline: Entry) -> bool:
    """The gate compares the two peaks' tracked bytes only: an eager half-precision case whose entry another CPU
    model recorded (:func:`other_kernels`), both with the tracker's breakdown."""
    return other_kernels(measured, baseline) and measured.eager_breakdown and baseline.eager_breakdown


def compared_peaks(measured: Entry, baseline: Entry) -> tuple[int | None, int | None]:
    """The two peaks the gate compares (the end table's Δ): the tracked bytes where :func:`tracked_only`, else the
    whole peaks."""
    if tracked_only(measured, baseline):
        return measured.kernel_free_peak(), baseline.kernel_free_peak()
    return measured.peak_allocated_bytes, baseline.peak_allocated_bytes


def kernel_note(model: str, cases: int) -> str:
    """The line under the end table for ``cases`` half-precision cases whose entries ``model`` recorded."""
    return (
        f"peak memory of {cases} half-precision case(s) recorded on {model}, another CPU model: judged without the "
        "matmul kernels' scratch, which moves with the CPU (eager: tracked bytes, exactly; compiled: within this "
        "CPU's kernel scratch); the table's Δ is the tracked bytes' for an eager case, the whole peak's for a "
        "compiled one"
    )


def leaner(memory: Check, where: str | None) -> Check:
    """--baseline-strict: ``memory`` failed as leaner than its baseline (its figure is exact)."""
    memory.status = FAIL
    memory.note = f"{LEANER}: {memory.note.split(', tolerance')[0]}; {where or 'no breakdown'}; {REFRESH}"
    return memory


def kernel_memory_check(measured: Entry, baseline: Entry, tol: Tolerances, *, strict: bool) -> Check:
    """The peak of a half-precision CPU case against an entry another CPU model recorded (:func:`other_kernels`),
    without what the matmul kernels held. Eager: the tracked peaks, exact, judged as any CPU peak (both ways under
    ``strict``). Compiled: each peak less the most one op held on its CPU is a lower bound, the peak itself an upper
    one; only a change beyond both bounds is one the code made (above: beyond the tolerance; below: leaner, under
    ``strict``), the rest passes, said."""
    now, before = measured.peak_allocated_bytes, baseline.peak_allocated_bytes
    why = f"{baseline.cpu_model}'s matmul kernels held other scratch than this CPU's"
    if tracked_only(measured, baseline):
        untracked = {UNTRACKED: 0}
        where = moved_categories(measured.peak_by_category | untracked, baseline.peak_by_category | untracked)
        tracked = memory_check(*compared_peaks(measured, baseline), tol, where=where)
        tracked.note += f"; tracked bytes only: {why}"
        if strict and tracked.delta is not None and tracked.delta < 0:
            return leaner(tracked, where)
        return tracked
    if now is None or before is None or measured.kernel_scratch_bytes is None:
        return Check("peak memory", now, before, None, Status.NO_FIGURE, f"not compared: {why}, not measured")
    least = measured.kernel_free_peak()
    d = delta(now, before, relative=True)
    said = f"{now:,} B vs {before:,} B; {why}: this CPU's up to {measured.kernel_scratch_bytes:,} B"

    def check(status: Status, more: str) -> Check:
        return Check("peak memory", now, before, d, status, said + more)

    if least > before * (1 + tol.memory):
        return check(FAIL, f", and without them at least {least:,} B, tolerance +{percent(tol.memory)}")
    scratch = baseline.kernel_scratch_bytes
    if strict and scratch is not None and now < before - scratch:
        return leaner(
            check(OK, f", the baseline's without its kernels' {scratch:,} B at least {before - scratch:,} B"), None
        )
    return check(OK, ": within what the kernels hold")


CLOCK_TOL = 0.05
"""A GPU run whose median SM clock is below its baseline's by more than this ran at other clocks: its speed is not
compared (a slower clock is not a code change). Only below: a GPU at its power cap sets its clock by the work's power
draw (on an H200, bf16 eager rounds at 1980 MHz, compiled ones at 1830-1875), so code that lost its compilation runs
at a higher clock, and slower; that is compared."""


def speed_incomparable(cpu_model: str | None, baseline: Entry) -> str | None:
    """Why a CPU run's tokens/s has no delta against ``baseline`` at all: its speed was not recorded (a busy
    machine), was recorded on a busy machine before that rule, or on another CPU model. None on a GPU."""
    if baseline.speed_note:
        return baseline.speed_note
    if cpu_model is None or baseline.cpu_model is None:
        return None
    if baseline.cpu_share is not None and baseline.cpu_share < BUSY_SHARE:
        return f"speed recorded on a busy machine (share {baseline.cpu_share:.2f})"
    if cpu_model != baseline.cpu_model:
        return f"speed recorded on another CPU model ({baseline.cpu_model})"
    return None


def speed_check(
    now: float | None, before: float | None, tol: Tolerances, off: str | None = None, incomparable: str | None = None
) -> Check:
    """tokens/s: FAIL below -tol.speed, better above +tol.speed; not gated where tol.speed is None (CPU) or
    where ``off`` says why not (a machine unfit to time, other clocks); no delta at all where ``incomparable``
    says why (:func:`speed_incomparable`); a speed that is NaN or inf fails, naming itself."""
    if bad := non_finite(now):
        return Check("tokens/s", now, before, None, FAIL, f"tokens/s is {bad} (the timing broke)")
    if incomparable:
        return Check("tokens/s", now, before, None, Status.NO_FIGURE, incomparable)
    status, d = judge(now, before, tol.speed, worse="lower", relative=True)
    if d is None:
        return Check("tokens/s", now, before, None, status, "no figure to compare")
    if off:
        return Check("tokens/s", now, before, d, NOT_GATED, off)
    if tol.speed is None:
        return Check("tokens/s", now, before, d, status, "reported only on CPU; gate it with --speed-tol")
    note = f"{now:,.0f} vs {before:,.0f} tok/s, tolerance -{percent(tol.speed)}"
    return Check("tokens/s", now, before, d, status, note)


def loss_check(
    now: float | None,
    before: float | None,
    tolerance: float,
    *,
    step: int | None = None,
    before_step: int | None = None,
    where: str = "",
) -> Check:
    """The loss: two-sided, absolute (nats), only when both were read at the same optimizer step."""
    status, d = judge(now, before, tolerance, worse="either", relative=False)
    if bad := non_finite(now):
        return Check("loss", now, before, None, status, f"the loss is {bad} (the run diverged)")
    if d is None:
        return Check("loss", now, before, None, status, "no figure to compare")
    if step != before_step:
        return Check("loss", now, before, d, NOT_GATED, f"read at step {step}, baseline at step {before_step}")
    at = f" at step {step}" if step is not None else ""
    return Check("loss", now, before, d, status, f"{now:.7f} vs {before:.7f}{at}, tolerance ±{tolerance:g} nats{where}")


def clocks_moved(now: dict | None, before: dict | None, *, traced: bool = False) -> str | None:
    """Why two GPU runs' speeds are not comparable: the run's SM clock is below the baseline's by more than CLOCK_TOL
    (None: comparable). The timed rounds' clocks; with ``traced`` (the busy time's check), those of the step traced
    for it (``traced_sm_mhz``, gptcore.measure.runner) where both runs sampled it: its kernels ran at that clock."""
    key = "traced_sm_mhz" if traced and all(c and c.get("traced_sm_mhz") for c in (now, before)) else "sm_mhz"
    if not now or not before or not before.get(key):
        return None
    if now[key] >= (1 - CLOCK_TOL) * before[key]:
        return None
    run = "traced" if key == "traced_sm_mhz" else "run"
    return f"{run} at other clocks (SM {now[key]:,.0f} vs {before[key]:,.0f} MHz)"


def work_checks(now: WorkLedger | None, before: WorkLedger | None, tol: float, strict: bool = False) -> list[Check]:
    """The work ledger, count by count: more than the baseline (beyond ``tol``, relative) fails with the per-phase
    delta and the operators that moved; less passes with a refresh note, or under ``strict`` fails as leaner than
    the baseline; one "work" check when every count is the same."""
    if now is None or before is None:
        return [Check("work", None, None, None, NOT_GATED, "no work ledger to compare")]
    figures_now, figures_before = now.gated(), before.gated()
    checks = []
    for metric in WORK_METRICS:
        a, b = figures_now.get(metric), figures_before.get(metric)
        if a is None or b is None or a == b:
            continue
        status, _ = judge(a, b, b * tol, worse="higher", relative=False)  # relative tol, yet a zero count compares
        note = f"{a:,} vs {b:,}"
        if metric in _PER_PHASE:
            field = _PER_PHASE[metric]
            phases = [
                f"{p} {getattr(now, field)[p] - getattr(before, field)[p]:+,}"
                for p in getattr(now, field)
                if getattr(now, field)[p] != getattr(before, field).get(p)
            ]
            note += f" ({', '.join(phases)})"
        moved = moved_ops(now.by_op(metric), before.by_op(metric)) if metric in BY_OP else None
        if strict and status == BETTER:
            status, note = FAIL, f"{LEANER}: {note}; {REFRESH}"
        else:
            note += ", gated exactly"
        checks.append(Check(metric, a, b, a - b, status, note, moved))
    checks = checks or [Check("work", None, None, 0, OK, "every count the same")]
    coverage = coverage_check(now.uncounted_flops_by_op or {}, before.uncounted_flops_by_op or {})
    return checks + ([coverage] if coverage else [])


def coverage_check(now: dict[str, int], before: dict[str, int]) -> Check | None:
    """The operators torch's FlopCounterMode counts and ``gptcore.measure.flops`` does not, when they appear or vanish:
    torch's counter changed (a release added or dropped a formula), not the work; named, never failed."""
    gained, lost = sorted(set(now) - set(before)), sorted(set(before) - set(now))
    if not gained and not lost:
        return None
    said = [f"torch's FlopCounterMode now counts {short_name(op)} ({now[op]:+,} FLOPs)" for op in gained]
    said += [f"torch's FlopCounterMode no longer counts {short_name(op)} ({-before[op]:+,} FLOPs)" for op in lost]
    return Check(
        COVERAGE,
        None,
        None,
        None,
        CHANGED,
        f"the FLOP counter changed, not the work: {'; '.join(said)}; gptcore.measure.flops has no formula for "
        "it, so the ledger's FLOPs did not move (add one to count it)",
    )


def convergence_checks(measured: Entry, baseline: Entry | None, tol: Tolerances) -> list[Check]:
    """A convergence case: tokens/s reported, the final validation loss (one-sided, ``tol.val_loss`` nats) and the
    time-to-loss in steps (one-sided; exact on the CPU model that recorded the baseline or on a GPU, one
    evaluation interval of slack on another CPU model, whose rounding moves every loss a little)."""
    now = measured.convergence
    if baseline is None or baseline.convergence is None:
        return [Check(metric, None, None, None, NO_BASELINE) for metric in ("tokens/s", "val loss", "time-to-loss")]
    before = baseline.convergence
    checks = [
        Check(
            "tokens/s",
            measured.tokens_per_s,
            baseline.tokens_per_s,
            delta(measured.tokens_per_s, baseline.tokens_per_s, relative=True),
            NOT_GATED,
            "reported only for a convergence run (its benchmark tier gates the speed)",
        )
    ]
    if now.steps != before.steps:
        return checks + [
            Check(
                metric,
                None,
                None,
                None,
                NOT_GATED,
                f"evaluated at other steps ({now.steps[-1]} steps, every {now.eval_every}) than the "
                f"baseline ({before.steps[-1]}, every {before.eval_every}): re-record it",
            )
            for metric in ("val loss", "time-to-loss")
        ]
    status, d = judge(now.final_val_loss, before.final_val_loss, tol.val_loss, worse="higher", relative=False)
    checks.append(
        Check(
            "val loss",
            now.final_val_loss,
            before.final_val_loss,
            d,
            status,
            f"{now.final_val_loss:.4f} vs {before.final_val_loss:.4f} at step {now.steps[-1]}, "
            f"tolerance +{tol.val_loss:g} nats (seed-to-seed spread)",
        )
    )
    target = before.target_loss
    if target is None:
        return checks + [Check("time-to-loss", None, None, None, NOT_GATED, "the baseline has no target loss")]
    reached, was = now.time_to_loss(target), before.time_to_loss(target)
    other_cpu = bool(measured.cpu_model and baseline.cpu_model and measured.cpu_model != baseline.cpu_model)
    slack = now.eval_every if other_cpu else 0
    why = (
        f"one evaluation interval ({slack} steps) of slack: recorded on {baseline.cpu_model}" if other_cpu else "exact"
    )
    if reached is None and was is None:
        checks.append(Check("time-to-loss", None, None, None, OK, f"neither run reached {target:g}"))
    elif reached is None or was is None:
        checks.append(
            Check(
                "time-to-loss",
                reached and reached[0],
                was and was[0],
                None,
                FAIL if reached is None else BETTER,
                f"{'never reached' if reached is None else f'reached at step {reached[0]}'} "
                f"{target:g} (baseline: {'never' if was is None else f'step {was[0]}'})",
            )
        )
    else:
        status, d = judge(reached[0], was[0], slack, worse="higher", relative=False)
        checks.append(
            Check(
                "time-to-loss",
                reached[0],
                was[0],
                d,
                status,
                f"val loss {target:g} at step {reached[0]} vs {was[0]}, {why}",
            )
        )
    return checks
