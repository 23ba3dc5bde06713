"""The saved runs, read once for everyone: ``history`` and the HTML report's history chart see the same runs.

pytest-benchmark saves each ``--benchmark-autosave`` run as ``<storage>/<machine id>/NNNN_<commit>_<time>.json``;
the gate splits its storage per device (``.benchmarks/<device>/<machine id>/…``). ``read`` finds the files with
pytest-benchmark's own ``FileStorage.query`` (the files in a folder and in its machine-id folders), once for the
folder given and once for each folder below it, so that a storage root (``.benchmarks``), one device's folder or a
machine-id folder all work. It reads each file itself rather than through ``FileStorage.load``, which drops a file
it cannot read with only a logged warning (here each is named) and needs every benchmark's ``stats``.

One rule for what a run is worth: a run saved from uncommitted changes ("dirty"), or outside git, is not its
commit's figure and is left out, with a line saying so; runs of a device other than the most common one are left
out too. The rest come in commit order (git's commit time, UTC; ties by the time the run was made).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

SAVED = "[0-9][0-9][0-9][0-9]_"
"""pytest-benchmark's name of a saved run (``NNNN_…json``), as its ``query`` takes it."""
NO_COMMIT = ("", "unversioned", "unknown")
"""pytest-benchmark's commit id outside git ('unversioned') or where git failed ('unknown')."""
_EPOCH = datetime.min.replace(tzinfo=timezone.utc)


@dataclass
class SavedRun:
    """One saved run: its file (relative to the folder read), its commit and when, its device and its data."""

    name: str
    commit: str
    committed: datetime
    """The commit's time (UTC); the run's own time where the commit has none."""
    ran: datetime
    device: str
    """machine_info's device_slug ('?' where absent)."""
    env: dict[str, str]
    """What else could move a figure between runs: torch's version, the CPU model."""
    data: dict = field(repr=False)

    @property
    def number(self) -> str:
        """pytest-benchmark's run number, NNNN."""
        return Path(self.name).name[:4]

    @property
    def benchmarks(self) -> list[dict]:
        return list(self.data.get("benchmarks") or [])


@dataclass
class Saved:
    """The runs read, oldest commit first, their device, and one line per file left out."""

    runs: list[SavedRun]
    device: str | None
    skipped: list[str]


def utc_time(text: str) -> datetime | None:
    """An ISO time (git's %cI, with its offset) as UTC; None when unreadable."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def files(storage: Path) -> list[Path]:
    """The saved runs' files under ``storage``: its own, its machine-id folders', and a level deeper
    (``.benchmarks/<device>/<machine id>``), each once."""
    from pytest_benchmark.storage.file import FileStorage

    quiet = logging.getLogger("gptcore.storage")
    found = set(FileStorage(storage, quiet).query(SAVED))
    for below in sorted(p for p in storage.iterdir() if p.is_dir()):
        found.update(FileStorage(below, quiet).query(SAVED))
    return sorted(found, key=lambda p: (len(p.relative_to(storage).parts), p))


def _wrong_shape(data: object) -> str | None:
    """What a decoded saved run has of another shape than pytest-benchmark writes (None: nothing)."""
    if not isinstance(data, dict):
        return "not an object"
    for key in ("commit_info", "machine_info"):
        if not isinstance(data.get(key) or {}, dict):
            return f"{key} is not an object"
    benchmarks = data.get("benchmarks") or []
    if not isinstance(benchmarks, list) or not all(isinstance(b, dict) for b in benchmarks):
        return "benchmarks is not a list of objects"
    return None


def read(storage: str | Path) -> Saved:
    """Every committed run of the most common device under ``storage`` (a ``file://`` URL or a folder), in commit
    order. ValueError for a folder that is missing or holds no saved run."""
    storage = Path(str(storage).removeprefix("file://"))
    if not storage.is_dir():
        what = "not a directory" if storage.exists() else "no such directory"
        raise ValueError(f"{storage}: {what} (pytest-benchmark's storage, e.g. .benchmarks/cpu)")
    paths = files(storage.resolve())
    if not paths:
        raise ValueError(f"{storage}: no saved pytest-benchmark run (save some with --benchmark-autosave)")
    skipped: list[str] = []
    loaded: list[SavedRun] = []
    for path in paths:
        name = str(path.relative_to(storage.resolve()))
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as err:
            skipped.append(f"{name}: not a readable run ({type(err).__name__})")
            continue
        wrong = _wrong_shape(data)
        if wrong:
            skipped.append(f"{name}: not a readable run ({wrong})")
            continue
        info = data.get("commit_info") or {}
        commit = str(info.get("id") or "")
        if commit in NO_COMMIT:
            skipped.append(f"{name}: no commit recorded ({commit or 'none'}: saved outside git; left out)")
            continue
        if info.get("dirty"):
            skipped.append(
                f"{name}: saved from uncommitted changes to {commit[:12]} (left out: not that commit's figure)"
            )
            continue
        machine = data.get("machine_info") or {}
        ran = utc_time(str(data.get("datetime") or "")) or _EPOCH
        committed = utc_time(str(info.get("time") or "")) or ran
        env = {k: str(machine[k]) for k in ("torch", "cpu_model") if machine.get(k)}
        loaded.append(SavedRun(name, commit, committed, ran, str(machine.get("device_slug") or "?"), env, data))
    devices = [run.device for run in loaded]
    device = max(sorted(set(devices)), key=devices.count) if devices else None
    # commits by commit time (ties: the commit first run earlier), each commit's runs together, oldest first
    first: dict[str, tuple[datetime, datetime]] = {}
    for run in loaded:
        if run.device == device:
            first[run.commit] = min(first.get(run.commit, (run.committed, run.ran)), (run.committed, run.ran))
    runs = []
    for run in sorted(loaded, key=lambda r: (first.get(r.commit, (r.committed, r.ran)), r.commit, r.ran, r.name)):
        if run.device != device:
            skipped.append(f"{run.name}: device {run.device}, not {device} like the rest (left out)")
        else:
            runs.append(run)
    return Saved(runs, device, skipped)
