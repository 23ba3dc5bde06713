"""Change points over commits: the creeping regression that no single run fails, caught in pytest-benchmark's saved
runs (``.benchmarks/<device>/<machine>/NNNN_*.json``, each with its commit), named by its commit range, and handed
to ``bisect``.

Per case and metric the saved runs make a series in commit order (by commit time; several runs of one commit are
repeated points):

- exact metrics (CPU tracked memory, the CPU loss at its step, every work-ledger count) need no statistics: any
  change between two commits is a step, at the commit where it happened;
- noisy metrics (GPU tokens/s and memory, the GPU loss, a convergence run's final validation loss) are cut by
  ruptures' PELT (a penalised least-squares search for mean shifts) on the series in units of its point-to-point
  noise; a cut counts when its step is at least :data:`MIN_STEP` and a Welch t-test between the segments gives
  p < :data:`P_MAX`. A step in the last one or two commits, too short for a segment, counts when it lies
  :data:`Z_TAIL` noise sigmas off the segment before it. tokens/s is analysed only where the gate gates it
  (``Tolerances.speed``): on CPU it is left out;
- a status by PyTorch HUD's rule: with at least 2 points after the step it is a regression (worse) or an
  improvement, with fewer it is suspicious;
- a creeping change: per-commit means that slope the worse way over :data:`WINDOW` commits or more, adding up past
  the gate's own tolerance (``Tolerances.default_for``), :data:`Z_CREEP` standard errors from flat. Where a step
  was found in the stretch, the better fit decides which it is: one step, or a line (the step is then part of the
  creep);
- a finding (step or creep) whose place is uncertain (noise over ``CV_PLACE``, or under ``Z_PLACE`` sigmas) says
  so, and its hunt covers a wider range; a series that reaches or leaves exactly 0 steps there, on every metric.

The saved runs are read by :mod:`gptcore.storage`; the detector, values in and indices out, and its thresholds
(``MIN_STEP``, ``P_MAX``, ``Z_TAIL``, ``WINDOW``, ``Z_CREEP``) are :mod:`gptcore.hunt.changepoints`; what is found, and
its markdown, :mod:`gptcore.hunt.findings`. This module matches the detector's indices to commits.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from gptcore.config import setup_differences
from gptcore.gate.rules import is_number
from gptcore.gate.rules import non_finite as spelled
from gptcore.hunt import changepoints as detect
from gptcore.hunt.changepoints import MIN_SIZE, STEP_OR_LINE
from gptcore.hunt.findings import WORSE, Finding, History, Point, markdown
from gptcore.storage import read as read_saved

# -- reading -------------------------------------------------------------------------------------------------------


def _metrics(info: dict) -> dict[str, tuple[float, bool]]:
    """A saved case's metrics: name -> (value, exact). tokens/s only on a GPU (on CPU the gate does not gate it)."""
    from gptcore.gate.schema import Tolerances

    device = str(info.get("device") or "cpu")
    cpu = device.startswith("cpu")
    out: dict[str, tuple[float, bool]] = {}
    convergence = info.get("convergence")
    if isinstance(convergence, dict) and convergence.get("val_loss"):  # a field of another shape has no value here
        losses = convergence["val_loss"]
        return {"val loss": (float(losses[-1]), False)} if isinstance(losses, list) and is_number(losses[-1]) else {}
    speed_gated = Tolerances.default_for("cpu" if cpu else "cuda").speed is not None
    if speed_gated and is_number(info.get("tokens_per_s")):
        out["tokens/s"] = (float(info["tokens_per_s"]), False)
    if is_number(info.get("peak_allocated_bytes")):
        out["peak memory"] = (float(info["peak_allocated_bytes"]), cpu)
    if is_number(info.get("loss")):
        out[f"loss@{info.get('loss_step')}"] = (float(info["loss"]), cpu)
    work = info.get("work")
    if isinstance(work, dict):
        for name, key in (("flops", "flops"), ("op calls", "op_calls")):
            if isinstance(work.get(key), dict) and all(is_number(v) for v in work[key].values()):
                out[name] = (float(sum(work[key].values())), True)
        for name in ("syncs", "allocations", "allocated_bytes"):
            if is_number(work.get(name)):
                out[name.replace("_", " ")] = (float(work[name]), True)
        compiled = work.get("compile")
        for name, value in compiled.items() if isinstance(compiled, dict) else ():
            if is_number(value):
                out[name.replace("_", " ")] = (float(value), True)
    return out


def read(
    storage_dir: str | Path, select: str | None = None
) -> tuple[dict[tuple[str, str], list[Point]], dict, History]:
    """The series of every (case, metric) in the saved runs under ``storage_dir`` (gptcore.storage: the committed
    runs of one device, in commit order); which metrics are exact; and a History holding one line per run or value
    left out. ValueError for a folder that is missing or holds no saved run."""
    saved = read_saved(storage_dir)
    history = History(skipped=list(saved.skipped), device=saved.device)
    series: dict[tuple[str, str], list[Point]] = {}
    exact: dict[tuple[str, str], bool] = {}
    runs_of: dict[str, int] = {}
    for run in saved.runs:
        history.runs += 1
        if run.commit not in history.commits:
            history.commits.append(run.commit)
        for bench in run.benchmarks:
            case = str(bench.get("name", ""))
            if select and select not in case:
                continue
            runs_of[case] = runs_of.get(case, 0) + 1
            info = bench.get("extra_info") if isinstance(bench.get("extra_info"), dict) else {}
            env = run.env | ({"setup": info["setup"]} if isinstance(info.get("setup"), dict) else {})
            for metric, (value, is_exact) in _metrics(info).items():
                point = Point(run.commit, run.committed.isoformat(), value, env)
                series.setdefault((case, metric), []).append(point)
                exact[(case, metric)] = is_exact
    for (case, metric), points in sorted(series.items()):  # null or absent in some runs: skipped, as asv does
        if len(points) < runs_of[case]:
            history.skipped.append(
                f"{case} {metric}: {runs_of[case] - len(points)} of {runs_of[case]} run(s) have no value (skipped)"
            )
    return series, exact, history


# -- finding -------------------------------------------------------------------------------------------------------


def _status(metric: str, change: float, points_after: int) -> str:
    """PyTorch HUD's rule: fewer than 2 points after the step, suspicious; else by the metric's worse direction."""
    if points_after < 2:
        return "suspicious"
    if metric.startswith("loss@"):
        return "changed"
    worse = WORSE.get(metric, "higher")
    return "regression" if (change > 0) == (worse == "higher") else "improvement"


def _moved(a: Point, b: Point) -> str:
    """'; torch 2.11.0 -> 2.13.0 between these runs' where the environment changed too, and '; the case's setup
    changed: recipe.lr 0.001 -> 0.002' where the case's own model or recipe did (empty where neither)."""
    moved = [
        f"{k} {a.env[k]} -> {b.env[k]}"
        for k in ("torch", "cpu_model")
        if a.env.get(k) and b.env.get(k) and a.env[k] != b.env[k]
    ]
    both = isinstance(a.env.get("setup"), dict) and isinstance(b.env.get("setup"), dict)
    setup = setup_differences(a.env["setup"], b.env["setup"]) if both else []
    return (f"; {', '.join(moved)} between these runs" if moved else "") + (
        f"; the case's setup changed: {'; '.join(setup)}" if setup else ""
    )


def exact_steps(case: str, metric: str, points: list[Point], notes: list[str] | None = None) -> list[Finding]:
    """Every commit at which an exact metric changed. A commit's repeated runs count once; where they differ (an
    exact metric that is not, here) ``notes`` gets one line and the commit's most frequent value stands."""
    commits: dict[str, list[Point]] = {}
    for p in points:
        commits.setdefault(p.commit, []).append(p)
    order, values = list(commits), []
    for commit, runs in commits.items():
        seen = [p.value for p in runs]
        if len(set(seen)) > 1 and notes is not None:
            notes.append(
                f"{case} {metric}: the runs of {commit[:12]} differ ({', '.join(f'{v:g}' for v in seen)}): "
                f"not exact here; its most frequent value is used"
            )
        values.append(max(seen, key=seen.count))
    found = []
    for i in range(1, len(order)):
        if values[i] == values[i - 1]:
            continue
        j = i
        while j < len(order) and values[j] == values[i]:
            j += 1
        change = values[i] - values[i - 1]
        a, b = commits[order[i - 1]][-1], commits[order[i]][0]
        found.append(
            Finding(
                case,
                metric,
                "step",
                order[i - 1],
                order[i],
                change,
                change / values[i - 1] if values[i - 1] else None,
                None,
                j - i,
                _status(metric, change, j - i),
                f"{j - i} commit(s) at the new value{_moved(a, b)}",
            )
        )
    return found


def non_finite(case: str, metric: str, points: list[Point]) -> Finding:
    """The first commit at which a metric became NaN or inf (a diverged run): a regression, named by the commit
    range from the last finite value before it, however little else of the series can be analysed."""
    first = next(i for i, p in enumerate(points) if not math.isfinite(p.value))
    before = next(
        (p.commit for p in reversed(points[:first]) if p.commit != points[first].commit), points[first].commit
    )
    value = points[first].value
    what = (spelled(value) or "").lstrip("+")  # NaN, inf, -inf
    after = sum(1 for p in points[first:] if not math.isfinite(p.value))
    name = "loss" if metric.startswith("loss@") else metric
    return Finding(
        case,
        metric,
        "non-finite",
        before,
        points[first].commit,
        value,
        None,
        None,
        after,
        "regression",
        f"{name} became {what} at {points[first].commit[:12]}; {after} run(s) not finite",
    )


def noisy_steps(case: str, metric: str, points: list[Point]) -> list[Finding]:
    """The mean shifts of a noisy series (gptcore.hunt.changepoints.steps), then a step in the last one or two
    commits (its ``tail``), each with its commit range."""
    values, commits = [p.value for p in points], [p.commit for p in points]
    steps, last, sigma = detect.steps(values, commits)
    found = [_finding(case, metric, points, s, s.end - s.cut, f"{s.end - s.cut} point(s) after") for s in steps]
    tail = detect.tail(values, commits, last, sigma)  # against what follows the last step that counted
    if tail is not None:
        where = "at the end of the history" + (", in one of the last 2 commits" if tail.hi > tail.cut else "")
        after = tail.end - tail.hi
        found.append(_finding(case, metric, points, tail, after, f"{after} point(s) after, {where}"))
    return found


def _finding(case: str, metric: str, points: list[Point], step: detect.Step, after: int, note: str) -> Finding:
    """A noisy step as a finding: its commit range from the detector's indices, its place marked uncertain where
    the detector says so: its hunt then covers the segments around the cut (measured, docs/history.md: at CV 2.7%
    those hunts held the commit in 46 of 47 3% drops and 960 of 964 10% drops)."""
    a, b = points[step.lo - 1], points[step.hi]
    zero = "" if step.p is not None else "; from exactly 0" if step.relative is None else "; to exactly 0"
    finding = Finding(
        case,
        metric,
        "step",
        a.commit,
        b.commit,
        step.change,
        step.relative,
        step.p,
        after,
        _status(metric, step.change, after),
        note + zero + _moved(a, b),
    )
    first, last = points[step.start], points[step.end - 1]
    why = detect.uncertain_place(step.size, step.cv)
    if why and first.commit != last.commit:
        _uncertain(finding, why, first.commit, last.commit)
    return finding


def _uncertain(finding: Finding, why: str, first: str, last: str) -> None:
    """Mark a finding's place uncertain: its hunt covers first..last, and its note says so and why."""
    finding.hunt = (first, last)
    finding.note += f"; place uncertain: {why}, its range may miss the commit: hunt over {first[:12]}..{last[:12]}"


def creeping(
    case: str, metric: str, points: list[Point], tolerance: float | None, steps: Sequence[Finding] = ()
) -> list[Finding]:
    """Stretches of commits whose per-commit means creep the worse way (gptcore.hunt.changepoints.stretches),
    adding up to ``tolerance`` or more (relative; the validation loss: nats): '-1.0% per commit over 6 commits'.
    Where one of ``steps`` (this series' step changes) lies in a stretch and one step fits the stretch as well as a
    line, it is that step and no creep."""
    if tolerance is None:
        return []
    commits: dict[str, list[float]] = {}
    for p in points:
        commits.setdefault(p.commit, []).append(p.value)
    names = list(commits)
    means, counts = [statistics.mean(v) for v in commits.values()], [len(v) for v in commits.values()]
    values = [p.value for p in points]
    sigma = detect.floor(values, detect.trend_noise(values))
    relative = metric != "val loss"
    found = []
    for s in detect.stretches(
        means, counts, sigma, tolerance, relative=relative, worse_lower=WORSE.get(metric) == "lower"
    ):
        a, b = s.a, s.b
        if s.line_minus_step > -STEP_OR_LINE * sigma**2 and any(_within(f, names[a : b + 1]) for f in steps):
            continue
        # the change: what the stretch's last commit reads against its first (a line through a short creep with
        # flat commits beside it is steeper than the creep; its slope is the note)
        change = means[b] - means[a]
        unit = f"{s.per:+.1%}" if relative else f"{s.per:+.4f} nats"
        creep = Finding(
            case,
            metric,
            "creep",
            names[a],
            names[b],
            change,
            change / abs(means[a]) if relative and means[a] else None,
            0.5 * math.erfc(abs(s.z) / math.sqrt(2)),
            b - a,
            "creeping",
            f"{unit} per commit over {b - a} commits",
        )
        # its place, judged as a step's is: the change in noise sigmas, the noise against the level
        first = next(i for i, p in enumerate(points) if p.commit == names[a])
        end = max(i for i, p in enumerate(points) if p.commit == names[b]) + 1
        spread = detect.spread_around(values, first, end, max(sigma, detect.noise(values)))
        level = statistics.mean(values[first:end])
        why = detect.uncertain_place(abs(change) / spread, spread / abs(level) if level else 0.0)
        if why:  # the stretch widened by a window on each side
            _uncertain(creep, why, names[max(0, a - detect.WINDOW)], names[min(len(names) - 1, b + detect.WINDOW)])
        found.append(creep)
    return found


def _within(step: Finding, stretch: Sequence[str]) -> bool:
    """The step's commit range lies in the stretch of commits."""
    return step.kind == "step" and step.before in stretch and step.after in stretch[1:]


def changes(case: str, metric: str, points: list[Point], tolerance: float | None) -> list[Finding]:
    """A noisy series' steps and creeps, each change once: a step that lies in a creep (a line fits that stretch
    better than a step) is part of the creep."""
    steps = noisy_steps(case, metric, points)
    creeps = creeping(case, metric, points, tolerance, steps)
    commits = list(dict.fromkeys(p.commit for p in points))
    spans = [commits[commits.index(c.before) : commits.index(c.after) + 1] for c in creeps]
    return [s for s in steps if not any(_within(s, span) for span in spans)] + creeps


def analyse(storage: str | Path, select: str | None = None) -> History:
    """Every change point and creeping stretch in the saved runs under ``storage`` (``select``: a substring of the
    case names)."""
    from gptcore.gate.schema import Tolerances

    series, exact, history = read(storage, select)
    tol = Tolerances.default_for("cpu" if history.device == "cpu" else "cuda")
    creep_tolerance = {"tokens/s": tol.speed, "peak memory": tol.memory, "val loss": tol.val_loss}
    short: dict[str, list[str]] = {}
    for (case, metric), points in sorted(series.items()):
        history.series += 1
        if any(not math.isfinite(p.value) for p in points):  # a finding of its own, then the finite rest
            history.findings.append(non_finite(case, metric, points))
            points = [p for p in points if math.isfinite(p.value)]
            if not points:
                continue
        if exact[(case, metric)]:
            history.analysed += 1
            history.findings += exact_steps(case, metric, points, history.skipped)
            continue
        if len(points) < 2 * MIN_SIZE:
            short.setdefault(case, []).append(f"{metric} ({len(points)})")
            continue
        history.analysed += 1
        history.findings += changes(case, metric, points, creep_tolerance.get(metric))
    for case, metrics in short.items():
        history.skipped.append(
            f"{case}: fewer points than the {2 * MIN_SIZE} the change-point search needs: "
            f"{', '.join(metrics)} (left out)"
        )
    return history


def section(storage: str | Path) -> str:
    """The markdown section for the saved runs under ``storage`` (the gate's --gate-history); a line saying why
    not where they cannot be read."""
    try:
        return markdown(analyse(storage))
    except ValueError as err:
        return f"### Change points in history\n\nNot analysed: {err}\n"
