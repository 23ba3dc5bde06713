"""Shards merged into one run: the results logs of ``pytest bench ... --shard K/N --results-log LOG`` on N runners
read back as the one end table, the one markdown verdict and the one set of recorded entries that a single run
would give (``python -m gptcore merge LOG...``).

Each shard's log starts with its plan (gptcore.gate.results.Plan): the merge names a shard that left no log
("shard 3 of 4: no results"), one cut short (cases of its plan with no line), and a case two shards both ran, and
fails on any of them; logs of different devices, commits or splits are refused with one line. The expected effects
are judged again over every shard's cases, in the order of the shards' plans, since a claim and its reference may
have run on different runners.

The shards' pytest-benchmark JSON (``--benchmark-json``) become one saved run of the device (``save_run``), so that
``history``, the report and the next run's ``--benchmark-compare`` read one run per commit, whichever runner ran
which case.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gptcore.gate import results
from gptcore.gate.expectations import Figures
from gptcore.gate.schema import Entry
from gptcore.gate.session import Gate
from gptcore.storage import utc_time

NOT_MET = ": expected effect not met: "


class MergeError(ValueError):
    """Logs that cannot be merged into one run (the message is one line)."""


@dataclass
class Merged:
    """The run the shards make together: its gate (rows, failures, expected effects, notes) and what they recorded."""

    gate: Gate
    plan: results.Plan
    """The first shard's plan: the device, commit and versions the recorded entries carry."""
    recorded: dict[str, Entry]
    problems: list[str]
    """A shard with no results or cut short, a case run twice: each fails the merge."""

    @property
    def failed(self) -> bool:
        return bool(self.gate.failures or self.problems)


def _plans(paths: Sequence[Path]) -> dict[int, tuple[Path, results.Plan]]:
    """Each log's plan by shard number; MergeError for a log that is not a shard's, or shards of different runs."""
    plans: dict[int, tuple[Path, results.Plan]] = {}
    for path in paths:
        try:
            plan = results.read_plan(path)
        except results.LogError as err:
            raise MergeError(str(err)) from None
        if plan is None:
            raise MergeError(f"{path}: not a shard's results log (no plan line: run the shard with --shard K/N)")
        k = plan.shard[0]
        if k in plans:
            raise MergeError(f"{plans[k][0]} and {path}: both are shard {k} of {plan.shard[1]}")
        plans[k] = (path, plan)
    for what, value in (
        ("splits", lambda p: p.shard[1]),
        ("devices", lambda p: p.slug),
        ("commits", lambda p: p.commit),
    ):
        seen = {str(value(plan)) for _, plan in plans.values()}
        if len(seen) > 1:
            raise MergeError(f"logs of different {what} ({', '.join(sorted(seen))}): merge the shards of one run")
    _one_split([plan for _, plan in plans.values()])
    return dict(sorted(plans.items()))


def _one_split(plans: list[results.Plan]) -> None:
    """MergeError where the plans are not the parts of one split: a case in two plans, plans split from different
    numbers of cases, or, with every shard there, fewer cases than were split. Shards split alike only from the
    same inputs: one that recorded into the baseline file the next one plans from moves cases between them, and a
    case that no plan holds is seen no other way."""
    again = "the shards were split from different inputs (one after another, give each its own --baselines-dir)"
    shard_of: dict[str, int] = {}
    for plan in plans:
        for case in plan.cases:
            if case in shard_of:
                raise MergeError(f"{case}: in the plans of shards {shard_of[case]} and {plan.shard[0]}: {again}")
            shard_of[case] = plan.shard[0]
    split_of = sorted({plan.split_of for plan in plans if plan.split_of is not None})
    if len(split_of) > 1:
        raise MergeError(f"plans split from {' and '.join(map(str, split_of))} cases: {again}")
    if split_of and len(plans) == plans[0].shard[1] and len(shard_of) != split_of[0]:
        raise MergeError(f"the {len(plans)} plans hold {len(shard_of)} of the {split_of[0]} cases split: {again}")


def merge(paths: Sequence[str | Path], baselines_dir: str | Path = "baselines") -> Merged:
    """The run the shards' logs at ``paths`` make together, judged against the baseline files in
    ``baselines_dir``; MergeError (one line) for logs that cannot be merged."""
    if not paths:
        raise MergeError("no results log to merge")
    plans = _plans([Path(p) for p in paths])
    n = next(iter(plans.values()))[1].shard[1]
    problems = [f"shard {k} of {n}: no results" for k in range(1, n + 1) if k not in plans]
    gate = Gate(directory=Path(baselines_dir), update=False, strict=False, overrides={}, timing_override=(None,) * 3)
    recorded: dict[str, Entry] = {}
    ran_in: dict[str, int] = {}
    for k, (path, plan) in plans.items():
        try:
            done = results.latest(results.read(path))
        except results.LogError as err:
            raise MergeError(str(err)) from None
        missing = [nodeid.rsplit("::", 1)[-1] for nodeid in plan.cases if nodeid not in done]
        if missing:
            problems.append(
                f"shard {k} of {n}: cut short: {len(missing)} of {len(plan.cases)} case(s) have no result "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
            )
        for nodeid in plan.cases + [c for c in done if c not in plan.cases]:
            r = done.get(nodeid)
            if r is None:
                continue
            if nodeid in ran_in:
                problems.append(f"{r.name}: ran in shards {ran_in[nodeid]} and {k} of {n}")
                continue
            ran_in[nodeid] = k
            _take(gate, r, f"{path}: {nodeid}", recorded)
    gate.notes.append(f"merged {len(plans)} of {n} shard(s): {len(ran_in)} case(s)")
    return Merged(gate, plans[min(plans)][1], recorded, problems)


def _take(gate: Gate, r: results.Record, where: str, recorded: dict[str, Entry]) -> None:
    """One case of a shard into the merged run: its row, its own failures, its expected effects judged again."""
    measured = gate.take_record(r, where)
    own = [line for line in r.failures if NOT_MET not in line]  # what the shard could judge of the effects: again
    gate.failures += own or ([f"{r.name}: {r.reason}"] if r.outcome == "failed" and not r.failures else [])
    if r.recorded and measured is not None:  # a baseline's own check (a run's figure may be NaN, a baseline's not):
        Entry.from_json(r.entry, f"{where}: its recorded entry")  # BaselineError before any file is written
        recorded[r.name] = measured
    if r.effect:
        e = r.effect
        judged = gate.expected.record(e["model"], e["recipe"], e["device"], Figures(*e["figures"]), e["world"])
        gate.failures += [f"{r.name}{NOT_MET}{o.line}" for o in judged if o.status == "FAIL"]


def save_run(paths: Sequence[str | Path], storage: str | Path, plan: results.Plan) -> Path:
    """The shards' pytest-benchmark JSON at ``paths`` as one saved run of the plan's device: the next
    ``NNNN_<commit>_<time>.json`` under ``storage``/<device>/<machine id>, written by pytest-benchmark's own
    FileStorage as ``--benchmark-autosave`` names it. One JSON per shard of the plan, of its commit and device, no
    case in two of them; MergeError (one line) otherwise, and nothing is written."""
    from pytest_benchmark.storage.file import FileStorage
    from pytest_benchmark.utils import get_machine_id

    runs = []
    for path in map(Path, paths):
        try:
            runs.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as err:
            raise MergeError(f"{path}: not a pytest-benchmark JSON ({err})") from None
        wrong = _wrong_shape(runs[-1])
        if wrong:
            raise MergeError(f"{path}: not a pytest-benchmark JSON ({wrong})")
    if len(runs) != plan.shard[1]:
        raise MergeError(f"{len(runs)} pytest-benchmark JSON for {plan.shard[1]} shards: a run is saved whole or not")
    commit = plan.commit.removesuffix("+dirty")  # pytest-benchmark keeps the flag apart, as commit_info.dirty
    for path, run in zip(paths, runs):
        theirs, slug = run.get("commit_info", {}).get("id"), run.get("machine_info", {}).get("device_slug")
        if (theirs, slug) != (commit, plan.slug):
            raise MergeError(f"{path}: {slug} at {theirs}, not the shards' {plan.slug} at {commit}")
    seen: dict[str, Path] = {}
    for path, run in zip(paths, runs):
        for bench in run.get("benchmarks") or []:
            if bench["fullname"] in seen:
                raise MergeError(f"{bench['fullname']}: in {seen[bench['fullname']]} and {path}")
            seen[bench["fullname"]] = Path(path)
    first = runs[0]
    merged = {
        **first,
        "machine_info": {**first["machine_info"], "shards": [r["machine_info"].get("node") for r in runs]},
        "benchmarks": sorted((b for r in runs for b in r["benchmarks"]), key=lambda b: b["fullname"]),
    }
    when = min(utc_time(r["datetime"]) for r in runs)  # the run's start, its first shard's (a time without an offset
    # is UTC, as pytest-benchmark writes it)
    name = "_".join(
        [commit, when.strftime("%Y%m%d_%H%M%S")]
        + (["uncommitted-changes"] if first["commit_info"].get("dirty") else [])
    )
    try:
        files = FileStorage(Path(storage) / plan.slug, logging.getLogger(__name__), default_machine_id=get_machine_id())
        target = files.get(f"{files._next_num}_{name}.json")
        files.save(merged, name)
    except OSError as err:
        raise MergeError(f"--benchmark-storage {storage}: {err.strerror or err}") from None
    return target


def _wrong_shape(run: object) -> str | None:
    """What a decoded pytest-benchmark JSON lacks of what the merge reads (None: nothing)."""
    if not isinstance(run, dict):
        return "not an object"
    for key in ("commit_info", "machine_info"):
        if not isinstance(run.get(key), dict):
            return f"{key}: not an object"
    benchmarks = run.get("benchmarks")
    if not isinstance(benchmarks, list) or not all(
        isinstance(b, dict) and isinstance(b.get("fullname"), str) for b in benchmarks
    ):
        return "benchmarks: not a list of benchmarks with their fullname"
    if not isinstance(run.get("datetime"), str) or utc_time(run["datetime"]) is None:
        return f"datetime: {run.get('datetime')!r} is not an ISO date"
    return None
