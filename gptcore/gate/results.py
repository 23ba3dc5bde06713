"""The results log: one JSON line per benchmark case, written the moment the case ends (flushed and fsynced), so
that a run killed in case k keeps cases 1..k-1 (``--results-log``); and read back for ``--resume`` (skip the cases
a log has finished and show them in the end table) and for ``--deadline`` (how long a case took last time).

A line holds what the end table needs (the measured entry, the verdict, the statuses), the failure lines, the
outcome pytest gave the case, and its wall time. It is JSON Lines, so ``jq``, pandas or a text editor read it.

A shard's log (``--shard K/N``) starts with one more line, ``{"plan": {...}}``: which shard, the cases it was to
run, the device and commit and what a baseline records of them, so that ``python -m gptcore merge`` can tell a
shard cut short from a finished one and refuse logs of different devices or commits.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FINISHED", "Plan", "Record", "ResultsLog", "read", "read_plan"]

FINISHED = ("passed", "failed")
"""The outcomes of a case that --resume does not run again (a skipped case, the deadline's included, runs)."""


@dataclass
class Record:
    """One case's line of the results log."""

    nodeid: str
    name: str
    outcome: str
    """pytest's outcome of the whole case: passed, failed or skipped."""
    seconds: float
    """Wall time of the case (setup, call and teardown)."""
    reason: str | None = None
    """Why it was skipped, or the first line of why it failed."""
    slug: str | None = None
    """The device's baseline-file slug."""
    verdict: str | None = None
    failures: list[str] = field(default_factory=list)
    row: dict[str, Any] | None = None
    """The end table's cells of the case (estimate, error, statuses, work, MFU)."""
    entry: dict[str, Any] | None = None
    """The measured figures as a baseline entry (gptcore.gate.schema.Entry.to_json): what --update-baselines
    records."""
    baseline: dict[str, Any] | None = None
    """The baseline entry the case was judged against ({} where it had none; None in lines written before they kept
    it), so that a merge or --resume shows the case's figures beside the entry its verdict is of."""
    recorded: bool = False
    """Whether this run wrote the entry into its baseline file."""
    effect: dict[str, Any] | None = None
    """What the expected effects judge the case by (model, recipe, device type, world, figures), so that runs merged
    from shards judge them as one run does."""
    round_clocks: list[dict[str, Any]] | None = None
    """GPU only: each timed round's seconds, clocks, power and throttle reasons, and its flag where the tokens/s
    median left it out (gptcore.measure.measurement.Measurement.round_clocks)."""
    time: str = ""

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        """The record of one line; TypeError naming the first field of the wrong type (a line written by another
        program, or edited by hand, must not reach the end table as a traceback)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for key, value in known.items():
            if not isinstance(value, _FIELD_TYPES[key]) or (key == "seconds" and isinstance(value, bool)):
                raise TypeError(f"{key}: {type(value).__name__} where the log has {_type_names(_FIELD_TYPES[key])}")
        if not all(isinstance(line, str) for line in known.get("failures", [])):
            raise TypeError("failures: must be a list of strings")
        _check_row(known.get("row") or {})
        if known.get("effect") is not None:
            _check_effect(known["effect"])
        return cls(**known)


_NONE = type(None)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "nodeid": (str,),
    "name": (str,),
    "outcome": (str,),
    "seconds": (int, float),
    "reason": (str, _NONE),
    "slug": (str, _NONE),
    "verdict": (str, _NONE),
    "failures": (list,),
    "row": (dict, _NONE),
    "entry": (dict, _NONE),
    "baseline": (dict, _NONE),
    "recorded": (bool,),
    "effect": (dict, _NONE),
    "round_clocks": (list, _NONE),
    "time": (str,),
}
EFFECT_KEYS = ("model", "recipe", "device", "world", "figures")
"""What a record's ``effect`` holds (gptcore.gate.session writes it, the merge judges the effects by it)."""
ROW_TYPES: dict[str, tuple[type, ...]] = {  # gptcore.gate.session.Row's cells
    "verdict": (str,),
    "estimate": (int, str, _NONE),
    "error": (str, _NONE),
    "status": (dict,),
    "work": (str,),
    "mfu": (str,),
}
ROW_CELLS = tuple(ROW_TYPES)
"""The end table's cells of a case that its line keeps (gptcore.gate.session.Row.cells)."""
FIGURE_TYPES: tuple[tuple[type, ...], ...] = (
    (int, _NONE),  # peak
    (int, float, _NONE),  # tokens/s
    (int, float, _NONE),  # its IQR
    (int, str, _NONE),  # the estimate ('err' where it failed)
    (int, _NONE),  # tokens per step
    (int, float, _NONE),  # loss
    (int, _NONE),  # the loss's step
)
"""gptcore.gate.expectations.Figures, field by field: what an effect's ``figures`` holds (the last three may be
missing from lines written before they were kept)."""


def _check_row(row: dict[str, Any]) -> None:
    for name, value in row.items():
        if name not in ROW_TYPES:
            raise TypeError(f"row: unknown cell {name!r}")
        if not _is(value, ROW_TYPES[name]):
            raise TypeError(f"row.{name}: {type(value).__name__} where the log has {_type_names(ROW_TYPES[name])}")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in row.get("status", {}).items()):
        raise TypeError("row.status: must be an object of metric -> status")
    if row and "verdict" not in row:  # the end table's one cell without a default
        raise TypeError("row: no 'verdict'")


def _check_effect(effect: dict[str, Any]) -> None:
    missing = [k for k in EFFECT_KEYS if k not in effect]
    if missing:
        raise TypeError(f"effect: no {missing[0]!r}")
    for name in ("model", "recipe", "device"):
        if not isinstance(effect[name], str):
            raise TypeError(f"effect.{name}: {type(effect[name]).__name__} where the log has str")
    if not _is(effect["world"], (int,)) or effect["world"] < 1:
        raise TypeError(f"effect.world: {effect['world']!r} is not a number of ranks")
    figures = effect["figures"]
    if not isinstance(figures, list) or not 4 <= len(figures) <= len(FIGURE_TYPES):
        raise TypeError(f"effect.figures: expected a list of 4 to {len(FIGURE_TYPES)} figures, got {figures!r}")
    for i, (value, types) in enumerate(zip(figures, FIGURE_TYPES)):
        if not _is(value, types) or (isinstance(value, (int, float)) and not 0 <= value < math.inf):
            raise TypeError(f"effect.figures[{i}]: {value!r} where the log has {_type_names(types)}, finite, >= 0")


def _is(value: Any, types: tuple[type, ...]) -> bool:
    """``isinstance``, with a bool never taken for a number."""
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is _NONE else t.__name__ for t in types)


@dataclass
class Plan:
    """The first line of a shard's log: the shard, its cases, and the run's device, commit and versions."""

    shard: tuple[int, int]
    cases: list[str]
    slug: str
    commit: str
    recording: dict[str, Any] = field(default_factory=dict)
    """What baselines.update records with an entry: device_name, device_type, torch_version, cuda, driver."""
    split_of: int | None = None
    """How many cases the N shards were split from (None in logs written before plans kept it)."""

    def to_json(self) -> dict[str, Any]:
        data = {**self.__dict__, "shard": list(self.shard)}
        if self.split_of is None:
            del data["split_of"]
        return {"plan": data}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        """The plan of a log's first line; ValueError (or KeyError, TypeError) for one that is not a shard's plan:
        a shard outside 1..N, cases that are not a list of ids, a slug that is not a file name (it names the baseline
        file the merge records into), a recording of other fields."""
        plan = data["plan"]
        shard = plan["shard"]
        if not isinstance(shard, list) or len(shard) != 2 or not all(_is(x, (int,)) for x in shard):
            raise ValueError(f"shard: {str(shard)[:40]}: expected [K, N], two whole numbers")
        k, n = shard
        if not 1 <= k <= n:
            raise ValueError(f"shard {k} of {n}: expected 1 <= K <= N")
        if not isinstance(plan["cases"], list) or not all(isinstance(c, str) for c in plan["cases"]):
            raise ValueError("cases: must be a list of case ids")
        if not isinstance(plan["slug"], str) or not SLUG.fullmatch(plan["slug"]):
            raise ValueError(f"slug {plan['slug']!r}: not a device slug (lowercase letters, digits and '-')")
        recording = dict(plan.get("recording") or {})
        unknown = sorted(set(recording) - set(RECORDING))
        if unknown:
            raise ValueError(f"recording: unknown field {unknown[0]!r}")
        split_of = plan.get("split_of")
        if split_of is not None and (isinstance(split_of, bool) or not isinstance(split_of, int) or split_of < 0):
            raise ValueError(f"split_of: {split_of!r} is not a count of cases")
        return cls((k, n), list(plan["cases"]), plan["slug"], str(plan["commit"]), recording, split_of)


SLUG = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
"""A device's slug as gptcore.identity.slugify makes it: the name of its baseline file."""
RECORDING = ("device_name", "device_type", "torch_version", "cuda", "driver")
"""The fields of a plan's ``recording``: what gptcore.gate.baselines.update records with an entry."""


class ResultsLog:
    """Appends one Record per line to ``path``; each line is on disk (fsynced) when ``write`` returns."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def write(self, record: Record) -> None:
        record.time = record.time or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self._append(json.dumps(record.to_json(), sort_keys=False))

    def write_plan(self, plan: Plan) -> None:
        """Start the log with the shard's plan (a log that already has one, being resumed, keeps it)."""
        if self.path.exists() and read_plan(self.path) is not None:
            return
        self._append(json.dumps(plan.to_json()))

    def continue_from(self, earlier: Path) -> None:
        """Start this log as a copy of the log at ``earlier``, which this run resumes (``--resume A --results-log
        B``): its plan and its records, line for line, a last line cut short by a kill left out. This log then holds
        the whole run, or the whole shard, by itself, as a log resumed in place does: a merge takes one log a
        shard."""
        lines = [line for line in _text(earlier).splitlines() if line.strip()]
        if lines:
            try:
                json.loads(lines[-1])
            except ValueError:
                lines.pop()
        if lines:
            self._append("\n".join(lines))

    def _append(self, line: str) -> None:
        """The line and its newline in one write to the end of the file, then fsynced: a reader of a run in
        progress sees whole lines (a buffered file writes a record of a few KiB in two, and a run killed between
        them left half a line). A line cut short at the end of the file (a kill, a full disk), which no record can be
        read from, is cut off first."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = (line + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a last line without its newline: appended after it, a
                # record would be glued onto it, and read() drops a last line it cannot read
                text = os.pread(fd, size, 0)
                whole = text.rfind(b"\n") + 1
                try:  # a whole record that only lacks its newline keeps its line; a line cut short is cut off
                    json.loads(text[whole:])
                    data = b"\n" + data
                except ValueError:
                    os.ftruncate(fd, whole)
            while data:  # a regular file takes it in one write; the loop is for a short write
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)


def unwritable(path: Path) -> str | None:
    """Why a file could not be written at ``path`` (its folder is made here, as the log's own writes make it), or
    None: the one check, before any work, of where a run or a command writes (a results log, a verdict, a JSON)."""
    blocked = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:  # mkdir would say only "File exists"
        return f"{blocked} is a file, not a folder"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"cannot create its folder: {err.strerror or err}"
    if path.is_dir() or not os.access(path if path.exists() else path.parent, os.W_OK):
        return f"{'is a folder' if path.is_dir() else 'not writable'}; give a file this run can write"
    existed = path.exists()
    try:  # os.access says yes to root everywhere (/proc included): opened for appending, nothing written
        with open(path, "a"):
            pass
    except OSError as err:
        return f"not writable ({err.strerror or err}); give a file this run can write"
    if not existed:
        path.unlink(missing_ok=True)
    return None


class LogError(ValueError):
    """A results log that cannot be read (the message names the file and the line)."""


def _text(path: Path, *, first_line: bool = False) -> str:
    """The log's text, or its first line alone; LogError where it cannot be read."""
    try:
        with open(path, encoding="utf-8") as lines:
            return lines.readline() if first_line else lines.read()
    except FileNotFoundError:
        raise LogError(f"{path}: no such results log") from None
    except OSError as err:
        raise LogError(f"{path}: cannot read: {err.strerror}") from None
    except UnicodeDecodeError:
        raise LogError(f"{path}: not a results log (not UTF-8 text)") from None


def read(path: str | Path) -> list[Record]:
    """Every record of the log at ``path``, in order. A last line cut short by a kill is ignored; any other bad
    line is a LogError naming the file and the line."""
    path = Path(path)
    lines = _text(path).splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if isinstance(data, dict) and "plan" in data:  # a shard's plan (read_plan reads it)
                continue
            if not isinstance(data, dict) or not isinstance(data.get("nodeid"), str):
                raise ValueError("not a results-log record")
            records.append(Record.from_json(data))
        except json.JSONDecodeError as err:
            if number == len(lines):  # the write a kill interrupted (only a line cut short is excused)
                break
            raise LogError(f"{path}: line {number}: not a JSON line ({err})") from None
        except (ValueError, TypeError) as err:
            raise LogError(f"{path}: line {number}: {err}") from None
    return records


def latest(records: list[Record]) -> dict[str, Record]:
    """The last record of each case (a case run again in a later stage replaces its earlier line)."""
    return {r.nodeid: r for r in records}


def read_plan(path: str | Path) -> Plan | None:
    """The shard's plan at the start of the log at ``path`` (None: not a shard's log); LogError for a log that
    cannot be read or a plan line that is not one."""
    path = Path(path)
    first = _text(path, first_line=True)
    try:
        data = json.loads(first) if first.strip() else None
    except ValueError:
        return None
    if not isinstance(data, dict) or "plan" not in data:
        return None
    try:
        return Plan.from_json(data)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise LogError(f"{path}: line 1: not a shard's plan ({type(err).__name__}: {err})") from None
