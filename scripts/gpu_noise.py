"""What a device's figures differ by between two runs of the same cases, and the tolerances that follows from it.

    python scripts/gpu_noise.py out/gpu/ladder.jsonl out/gpu/memory.jsonl --against out/gpu/verify.jsonl \
        --json tests/data/gpu_noise_nvidia-h100-80gb-hbm3.json

The first logs are the recording run's results logs, ``--against`` the second run's (a GPU session's ``verify``, or
several logs of it).
For every case measured in both it prints tokens/s (each run's median and relative IQR, the run-to-run change),
the change of the GPU busy time of a step where both runs traced it (gptcore.measure.trace), of the peak allocated
bytes and of the loss; then, per figure, the largest change, its RMS over the cases (sigma) and the tolerance by
one rule:

    tolerance = max(4 sigma, 2 x the largest change), rounded up, and at least the figure's floor

A run-to-run change is a difference of two runs, which is what the gate compares (a baseline and a new run), so
sigma is the gate's own noise: 4 sigma leaves about 3e-5 of clean cases failing per figure one-sided under a
normal spread, and 2 x the largest keeps the worst case seen far from failing. The floors (speed 1%, GPU busy
time 1%, memory 0.5%, loss 1e-6 nats, fp16/bf16 loss 1e-4 nats) keep an exact gate from failing on one run's
nondeterminism that two runs happened not to show. With ``--json`` it writes the evidence: the runs, every case's
figures, the summary and the tolerances (keep it in tests/data, as the CPU tolerances' evidence is kept). Where both
runs split a case's busy time by kind of kernel (``gpu_kernel_seconds``), each kind's change is evidence too
(``kinds``: its cases, largest change and sigma; the split is not gated).

The rule runs twice: over every case (the device file's ``tolerances``, what a study without evidence of its own is
held to) and over each study's cases alone (its ``tolerances_by_test``, keyed by the benchmark's test function).
Studies differ in noise: on an H200 the GPT-2 ladder's tokens/s moved by at most 1.69%, deep-1.6b in pure bf16 by
8.1% at the same clocks; one number for both would either cry wolf on the one or blunt the gate of the other.
A study's ``gpu_busy`` from here replaces the provisional 3% (gptcore.gate.schema.GPU_BUSY_TOLERANCE) for its cases.

``--void-busy NAME`` (a case's name, or a study's: its test function) leaves those cases' busy time out of the
comparison: a figure known to be of another step than the one the gate holds. Before commit 257ca1e a compiled
case's traced step ran eagerly (gptcore.measure.work.counted_step), so the H200's compiled ladder rungs carry the
busy time of their eager step; the evidence names what it left out (``void_busy``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gptcore.gate import results  # noqa: E402
from gptcore.gate.baselines import study_of  # noqa: E402
from gptcore.gate.schema import AMP_PRECISIONS  # noqa: E402

SIGMAS = 4.0
WORST_TIMES = 2.0
FLOORS = {"speed": 0.01, "memory": 0.005, "loss": 1e-6, "loss_amp": 1e-4, "gpu_busy": 0.01}
"""The smallest tolerance of each figure (relative for speed, memory and GPU busy time, nats for the loss)."""
RELATIVE = ("speed", "memory", "gpu_busy")


@dataclass
class Case:
    """One case's figures in both runs."""

    name: str
    precision: str
    tokens_per_s: tuple[float, float] | None
    iqr_rel: tuple[float, float] | None
    """Each run's tokens/s IQR over its median."""
    speed_change: float | None
    """Second run's tokens/s median over the first's, less 1."""
    peak_bytes: tuple[int, int] | None
    memory_change: float | None
    """Second run's peak allocated bytes over the first's, less 1."""
    loss: tuple[float, float] | None
    loss_change: float | None
    """Second run's loss less the first's (nats)."""
    busy_seconds: tuple[float, float] | None = None
    """Each run's GPU busy time of a step (None where either run has none: CPU, a baseline from before it)."""
    busy_change: float | None = None
    """Second run's GPU busy time over the first's, less 1."""
    kind_changes: dict[str, float] | None = None
    """Per kind of kernel (the entries' gpu_kernel_seconds), the second run's time over the first's, less 1: each
    kind's own noise, evidence for the busy time's split (which is not gated)."""


def records_of(paths: list[Path]) -> list[results.Record]:
    """Every line of the logs at ``paths``, in order; LogError for a log that cannot be read, or a line whose
    entry holds a figure of another type (text, a list) than an entry's."""
    records = []
    for path in paths:
        for record in results.read(path):
            wrong = _wrong(record.entry) if record.entry else None
            if wrong:
                raise results.LogError(f"{path}: {record.name}: {wrong}")
            records.append(record)
    return records


def _wrong(entry: dict) -> str | None:
    """What of an entry the comparison reads is of another type than a figure (None: nothing)."""
    for name in ("tokens_per_s", "loss"):
        if entry.get(name) is not None and not isinstance(entry[name], dict):
            return f"{name}: {entry[name]!r} is not an object"
    kinds = entry.get("gpu_kernel_seconds") or {}
    if not isinstance(kinds, dict):
        return f"gpu_kernel_seconds: {kinds!r} is not an object of kind -> seconds"
    for name, value in _figures(entry).items():  # NaN passes here: a diverged run has no figures (entries)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0):
            return f"{name}: {value!r} is not a number >= 0"
    if not isinstance(entry.get("precision", "fp32"), str):
        return f"precision: {entry['precision']!r} is not a name"
    return None


def _figures(entry: dict) -> dict[str, object]:
    """The figures of ``entry`` the comparison reads, by field (its objects already checked to be objects)."""
    speed, loss = entry.get("tokens_per_s") or {}, entry.get("loss") or {}
    figures = {"tokens_per_s.median": speed.get("median"), "tokens_per_s.iqr": speed.get("iqr")}
    figures |= {"peak_allocated_bytes": entry.get("peak_allocated_bytes"), "loss.value": loss.get("value")}
    figures |= {"gpu_busy_seconds": entry.get("gpu_busy_seconds")}
    return figures | {f"gpu_kernel_seconds.{k}": s for k, s in (entry.get("gpu_kernel_seconds") or {}).items()}


def entries(records: list[results.Record]) -> dict[str, dict | None]:
    """The measured entry of each case of ``records``, None for a case that ended with no figures (a skip, an
    out-of-memory failure) or with a NaN or infinite one (a diverged run has no noise to measure); a later line of
    a case replaces an earlier."""
    return {record.name: record.entry if record.entry and _finite(record.entry) else None for record in records}


def _finite(entry: dict) -> bool:
    """Whether every figure the comparison reads of ``entry`` is finite."""
    return all(math.isfinite(x) for x in _figures(entry).values() if x is not None)


def measured(paths: list[Path]) -> dict[str, dict | None]:
    """The measured entry of each case in the logs at ``paths`` (``entries``)."""
    return entries(records_of(paths))


def devices(records: list[results.Record]) -> set[str]:
    """The devices (baseline-file slugs) ``records`` name for their cases."""
    return {r.slug for r in records if r.slug}


def not_compared(first: dict[str, dict | None], second: dict[str, dict | None]) -> list[str]:
    """The cases left out of the comparison, each with why."""
    out = []
    for name in dict.fromkeys([*first, *second]):
        why = [
            f"not in the {run} run" if name not in log else f"no figures in the {run} run"
            for run, log in (("first", first), ("second", second))
            if log.get(name) is None
        ]
        if why:
            out.append(f"{name} ({', '.join(why)})")
    return out


def _pair(a: dict, b: dict, get) -> tuple | None:
    x, y = get(a), get(b)
    return (x, y) if x is not None and y is not None else None


def voided(name: str, void_busy: tuple[str, ...]) -> bool:
    """Whether ``name``'s busy time is left out: its own name or its study's is among ``void_busy``."""
    return name in void_busy or study_of(name) in void_busy


def compare(
    first: dict[str, dict | None], second: dict[str, dict | None], void_busy: tuple[str, ...] = ()
) -> list[Case]:
    """Every case measured in both runs with its figures and changes, in the first run's order (the busy time of
    the cases ``void_busy`` names left out)."""
    cases = []
    for name in (n for n in first if first[n] is not None and second.get(n) is not None):
        a, b = first[name], second[name]
        if voided(name, void_busy):
            a, b = ({k: v for k, v in e.items() if k not in ("gpu_busy_seconds", "gpu_kernel_seconds")} for e in (a, b))
        kinds = _pair(a, b, lambda e: e.get("gpu_kernel_seconds"))
        speed = _pair(a, b, lambda e: (e.get("tokens_per_s") or {}).get("median"))
        iqr = _pair(a, b, lambda e: (e.get("tokens_per_s") or {}).get("iqr"))
        peak = _pair(a, b, lambda e: e.get("peak_allocated_bytes"))
        loss = _pair(a, b, lambda e: (e.get("loss") or {}).get("value"))
        busy = _pair(a, b, lambda e: e.get("gpu_busy_seconds"))
        cases.append(
            Case(
                name=name,
                precision=a.get("precision", "fp32"),
                tokens_per_s=speed,
                iqr_rel=(iqr[0] / speed[0], iqr[1] / speed[1]) if speed and iqr and all(speed) else None,
                speed_change=speed[1] / speed[0] - 1 if speed and speed[0] else None,
                peak_bytes=peak,
                memory_change=peak[1] / peak[0] - 1 if peak and peak[0] else None,
                loss=loss,
                loss_change=loss[1] - loss[0] if loss else None,
                busy_seconds=busy,
                busy_change=busy[1] / busy[0] - 1 if busy and busy[0] else None,
                kind_changes={k: kinds[1][k] / t - 1 for k, t in kinds[0].items() if t and k in kinds[1]}
                if kinds
                else None,
            )
        )
    return cases


def round_up(value: float) -> float:
    """``value`` rounded up to two significant digits (0.01234 -> 0.013, 3.01e-6 -> 3.1e-6); 0 stays 0."""
    if value <= 0:
        return 0.0
    scale = 10.0 ** (math.floor(math.log10(value)) - 1)
    return round(math.ceil(round(value / scale, 9)) * scale, 12)


def tolerance(changes: list[float], floor: float) -> dict:
    """The largest change, sigma (RMS of the changes: their expected value is 0) and the tolerance by the rule."""
    if not changes:
        return {"cases": 0, "largest": None, "sigma": None, "tolerance": None}
    largest = max(abs(c) for c in changes)
    # fsum, exactly rounded: the built-in sum() compensates its rounding from Python 3.12 on, and the committed
    # evidence must come out the same to the last bit on every Python
    sigma = math.sqrt(math.fsum(c * c for c in changes) / len(changes))
    return {
        "cases": len(changes),
        "largest": largest,
        "sigma": sigma,
        "tolerance": max(round_up(max(SIGMAS * sigma, WORST_TIMES * largest)), floor),
    }


def summary(cases: list[Case]) -> dict[str, dict]:
    """Per figure (speed, memory, loss, loss_amp, and gpu_busy where a case has it in both runs: logs
    from before it was traced have no such figure): the largest change, sigma and the tolerance by the rule."""
    amp = [c.loss_change for c in cases if c.loss_change is not None and c.precision in AMP_PRECISIONS]
    full = [c.loss_change for c in cases if c.loss_change is not None and c.precision not in AMP_PRECISIONS]
    out = {
        "speed": tolerance([c.speed_change for c in cases if c.speed_change is not None], FLOORS["speed"]),
        "memory": tolerance([c.memory_change for c in cases if c.memory_change is not None], FLOORS["memory"]),
        "loss": tolerance(full, FLOORS["loss"]),
        "loss_amp": tolerance(amp, FLOORS["loss_amp"]),
    }
    busy = [c.busy_change for c in cases if c.busy_change is not None]
    if busy:
        out["gpu_busy"] = tolerance(busy, FLOORS["gpu_busy"])
    iqrs = [max(c.iqr_rel) for c in cases if c.iqr_rel]
    out["speed"]["largest_iqr"] = max(iqrs) if iqrs else None
    return out


def kinds_noise(cases: list[Case]) -> dict[str, dict]:
    """Per kind of kernel, over the cases that split their busy time in both runs: the largest change and sigma
    (what a tolerance of the kind would be by the rule, were it gated; it is not)."""
    changes: dict[str, list[float]] = {}
    for c in cases:
        for kind, change in (c.kind_changes or {}).items():
            changes.setdefault(kind, []).append(change)
    return {kind: tolerance(values, FLOORS["gpu_busy"]) for kind, values in changes.items()}


def by_test(cases: list[Case]) -> dict[str, dict[str, dict]]:
    """The rule over each study's cases alone, by the study's test function, in the cases' order."""
    groups: dict[str, list[Case]] = {}
    for c in cases:
        groups.setdefault(study_of(c.name), []).append(c)
    return {test: summary(group) for test, group in groups.items()}


def tolerances_of(figures: dict[str, dict]) -> dict[str, float]:
    """The tolerances a summary gives, as a baseline file holds them (figures with no case left out)."""
    return {k: v["tolerance"] for k, v in figures.items() if v["tolerance"] is not None}


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:+.2%}"


def _ms(pair: tuple[float, float] | None) -> str:
    return "—" if pair is None else f"{pair[0] * 1e3:,.2f} → {pair[1] * 1e3:,.2f}"


def table(cases: list[Case]) -> str:
    from tabulate import tabulate

    busy = any(c.busy_seconds for c in cases)  # its columns only where a case has the figure
    rows = [
        [
            c.name,
            c.precision,
            "—" if c.tokens_per_s is None else f"{c.tokens_per_s[0]:,.0f} → {c.tokens_per_s[1]:,.0f}",
            "—" if c.iqr_rel is None else f"{c.iqr_rel[0]:.2%} / {c.iqr_rel[1]:.2%}",
            _pct(c.speed_change),
            *([_ms(c.busy_seconds), _pct(c.busy_change)] if busy else []),
            "—" if c.peak_bytes is None else f"{c.peak_bytes[1] - c.peak_bytes[0]:+,d} B",
            _pct(c.memory_change),
            "—" if c.loss_change is None else f"{c.loss_change:+.2e}",
        ]
        for c in cases
    ]
    return tabulate(
        rows,
        headers=["case", "precision", "tok/s", "IQR/median", "Δ tok/s"]
        + (["GPU busy ms", "Δ busy"] if busy else [])
        + ["Δ peak", "Δ peak %", "Δ loss"],
        disable_numparse=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", nargs="+", type=Path, help="the recording run's results logs")
    parser.add_argument("--against", type=Path, nargs="+", required=True, help="the second run's results logs")
    parser.add_argument("--json", type=Path, help="write the evidence (runs, cases, summary, tolerances) here")
    parser.add_argument("--device", default=None, help="the device and torch version, as the evidence names them")
    parser.add_argument(
        "--void-busy",
        action="append",
        default=[],
        metavar="NAME",
        help="leave out the busy time of this case, or of every case of this study (its test function); repeatable",
    )
    args = parser.parse_args(argv)
    void_busy = tuple(args.void_busy)
    try:
        logs = [records_of(args.first), records_of(args.against)]  # each log read once
    except results.LogError as err:
        print(f"gpu_noise: {err}", file=sys.stderr)
        return 2
    for paths, log in zip((args.first, args.against), logs):
        if not log:
            print(f"gpu_noise: {', '.join(map(str, paths))}: no case in the log(s)", file=sys.stderr)
            return 2
    first, second = entries(logs[0]), entries(logs[1])
    named = {name for log in (first, second) for name in log} | {study_of(n) for log in (first, second) for n in log}
    unknown = [name for name in void_busy if name not in named]
    if unknown:  # a misspelt name would leave a busy time in without a word
        print(f"gpu_noise: --void-busy {unknown[0]}: no such case or study in the logs", file=sys.stderr)
        return 2
    ran_on = [devices(log) for log in logs]
    if ran_on[0] != ran_on[1]:  # two hosts of one device type are noise; two devices are not
        on = [", ".join(sorted(slugs)) or "no device named" for slugs in ran_on]
        print(f"gpu_noise: the runs are of different devices: {on[0]}, against {on[1]}", file=sys.stderr)
        return 2
    cases = compare(first, second, void_busy)
    if not cases:
        print("gpu_noise: no case was measured in both runs", file=sys.stderr)
        return 1
    left_out = not_compared(first, second)
    print(table(cases))
    figures = summary(cases)
    print(
        f"\n{len(cases)} case(s) measured in both runs" + (f"; not compared: {', '.join(left_out)}" if left_out else "")
    )
    print(f"tolerance = max({SIGMAS:g} sigma, {WORST_TIMES:g} x the largest change), rounded up, at least the floor")
    studies = by_test(cases)
    for heading, summaries in [("every case (the file's tolerances)", figures)] + [
        (f"{test} alone (its tolerances_by_test)", own) for test, own in studies.items()
    ]:
        print(heading)
        for figure, s in summaries.items():
            if s["cases"]:
                unit = (lambda x: f"{x:.2%}") if figure in RELATIVE else (lambda x: f"{x:.2e} nats")
                print(
                    f"  {figure:<9} {s['cases']:>3} case(s): largest {unit(s['largest'])}, sigma {unit(s['sigma'])}"
                    f" -> {unit(s['tolerance'])}"
                    + ("" if s.get("largest_iqr") is None else f" (largest IQR/median in a run {s['largest_iqr']:.2%})")
                )
    kinds = kinds_noise(cases)
    if kinds:
        print(
            "GPU busy time by kind of kernel (evidence, not gated): "
            + ", ".join(f"{kind} {k['cases']} case(s), largest {k['largest']:.2%}" for kind, k in kinds.items())
        )
    if args.json:
        evidence = {
            "device": args.device,
            "first": [str(p) for p in args.first],
            "second": [str(p) for p in args.against],
            "rule": {"sigmas": SIGMAS, "worst_times": WORST_TIMES, "floors": FLOORS},
            **({"void_busy": list(void_busy)} if void_busy else {}),
            "summary": figures,
            "by_test": studies,
            **({"kinds": kinds} if kinds else {}),
            "tolerances": tolerances_of(figures),
            "tolerances_by_test": {test: tolerances_of(own) for test, own in studies.items()},
            "not_compared": left_out,
            "cases": [asdict(c) for c in cases],
        }
        try:
            args.json.write_text(json.dumps(evidence, indent=2) + "\n")
        except OSError as err:
            print(f"gpu_noise: --json {args.json}: {err.strerror or err}", file=sys.stderr)
            return 2
        print(f"evidence: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
