"""Baseline files: one per device (``baselines/<device-slug>.json``), their schema (an ``Entry`` per case, the
device's ``Tolerances`` and, where a study's own noise was measured, that study's), validation with errors that name
the file and the field, and atomic updates that rewrite only the cases that ran. How a measurement is judged against
its entry is ``gptcore.gate.verdicts``."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as _dt
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptcore.gate.schema import SCHEMA_VERSION, BaselineError, Entry, Tolerances


@dataclass
class BaselineFile:
    """A device's baselines: header fields and one Entry per benchmark name (e.g.
    'test_cpu_shape[cpu-small-ckpt-fp32]')."""

    path: Path
    slug: str
    device_name: str
    device_type: str
    tolerances: Tolerances
    entries: dict[str, Entry] = field(default_factory=dict)
    tolerances_by_test: dict[str, dict[str, float]] = field(default_factory=dict)
    """A study's own tolerances, by its benchmark's test function (``test_memory_recipes``): the figures that study's
    two runs on this device measured (scripts/gpu_noise.py), over ``tolerances`` for its cases. Studies differ in
    noise: on the H200 the ladder's tokens/s moved by at most 1.69% between two runs, deep-1.6b in pure bf16 (a
    75 ms step) by 8.1%. ``tolerances`` is then the rule over every study's evidence: what a study with none of
    its own is held to."""
    torch: str | None = None
    cuda: str | None = None
    driver: str | None = None
    recorded_at: str | None = None
    commit: str | None = None

    def tolerances_for(self, case: str) -> Tolerances:
        """The tolerances of ``case`` (a benchmark's name, ``test_ladder[gpt2-ladder-0]``): its study's own where
        the file has them, else the file's."""
        own = self.tolerances_by_test.get(study_of(case))
        return dataclasses.replace(self.tolerances, **own) if own else self.tolerances

    def entry(self, name: str) -> Entry | None:
        """The entry of ``name`` (None without one), with the torch it was recorded under: its own, else (an entry
        recorded before entries kept it) the file's, the best guess."""
        entry = self.entries.get(name)
        if entry is not None and entry.torch is None and self.torch:
            return dataclasses.replace(entry, torch=self.torch)
        return entry

    def cpu_models(self) -> dict[str, int]:
        """How many entries each CPU model recorded (a CPU file gathers several; empty on a GPU)."""
        return dict(sorted(collections.Counter(e.cpu_model for e in self.entries.values() if e.cpu_model).items()))

    def to_json(self) -> dict:
        device = {"slug": self.slug, "name": self.device_name, "type": self.device_type}
        if self.device_type == "cpu":
            device["models"] = self.cpu_models()  # derived from the entries: the truth however many recorded it
        return {
            "schema_version": SCHEMA_VERSION,
            "device": device,
            "torch": self.torch,
            "cuda": self.cuda,
            "driver": self.driver,
            "recorded_at": self.recorded_at,
            "commit": self.commit,
            "tolerances": {  # no GPU busy time on CPU: its file says nothing of it
                k: v for k, v in dataclasses.asdict(self.tolerances).items() if v is not None or k != "gpu_busy"
            },
            **({"tolerances_by_test": self.tolerances_by_test} if self.tolerances_by_test else {}),
            "benchmarks": {name: self.entries[name].to_json() for name in sorted(self.entries)},
        }


def study_of(case: str) -> str:
    """The key of a case's study in ``tolerances_by_test``: its benchmark's test function
    (``test_ladder[gpt2-ladder-0]`` -> ``test_ladder``)."""
    return case.split("[", 1)[0]


def parse(data: Any, path: Path, expect_slug: str | None = None) -> BaselineFile:
    """Validate decoded JSON; BaselineError naming ``path`` and the field otherwise."""
    where = str(path)
    if not isinstance(data, dict):
        raise BaselineError(f"{where}: top level must be a JSON object")
    if "schema_version" not in data:
        raise BaselineError(f"{where}: schema_version: missing")
    if data["schema_version"] != SCHEMA_VERSION:
        raise BaselineError(
            f"{where}: schema_version: unknown {data['schema_version']!r} (this gptcore reads "
            f"{SCHEMA_VERSION}); re-record with --update-baselines or upgrade gptcore"
        )
    for key in ("device", "tolerances", "benchmarks"):
        if not isinstance(data.get(key), dict):
            raise BaselineError(f"{where}: {key}: {'missing' if key not in data else 'must be an object'}")
    device = data["device"]
    for key in ("slug", "name", "type"):
        if not isinstance(device.get(key), str):
            raise BaselineError(f"{where}: device.{key}: {'missing' if key not in device else 'must be a string'}")
    if expect_slug is not None and device["slug"] != expect_slug:
        raise BaselineError(
            f"{where}: device.slug: this file holds baselines of {device['name']!r} "
            f"({device['slug']}), this run is on {expect_slug!r}"
        )
    tol = _tolerances(data["tolerances"], Tolerances.default_for(device["type"]), f"{where}: tolerances")
    by_test = data.get("tolerances_by_test", {})
    if not isinstance(by_test, dict) or not all(isinstance(v, dict) for v in by_test.values()):
        raise BaselineError(f"{where}: tolerances_by_test: must be an object of objects (a test's own tolerances)")
    for test, own in by_test.items():
        _tolerances(own, tol, f"{where}: tolerances_by_test.{test}")
    entries = {
        name: Entry.from_json(value, f"{where}: benchmarks[{name!r}]") for name, value in data["benchmarks"].items()
    }
    return BaselineFile(
        path=path,
        slug=device["slug"],
        device_name=device["name"],
        device_type=device["type"],
        tolerances=tol,
        entries=entries,
        tolerances_by_test=by_test,
        torch=data.get("torch"),
        cuda=data.get("cuda"),
        driver=data.get("driver"),
        recorded_at=data.get("recorded_at"),
        commit=data.get("commit"),
    )


def load(path: str | Path, expect_slug: str | None = None) -> BaselineFile | None:
    """The baseline file at ``path`` (None when it does not exist); BaselineError when it cannot be used."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise BaselineError(f"{path}: cannot read: {err.strerror}") from None
    except UnicodeDecodeError:
        raise BaselineError(f"{path}: not a baseline file (not UTF-8 text)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise BaselineError(f"{path}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    return parse(data, path, expect_slug)


def _tolerances(fields: dict, base: Tolerances, where: str) -> Tolerances:
    """``base`` with ``fields`` over it, validated; BaselineError naming ``where`` and the field otherwise."""
    known = {f.name for f in dataclasses.fields(Tolerances)}
    unknown = set(fields) - known
    if unknown:
        raise BaselineError(f"{where}.{sorted(unknown)[0]}: unknown field; known: {', '.join(sorted(known))}")
    tol = dataclasses.replace(base, **fields)
    tol.validate(where)
    return tol


@contextlib.contextmanager
def one_writer(path: str | Path) -> Iterator[None]:
    """Hold the folder of ``path`` for one read-modify-write of a file in it: runs recording into one file at once
    (shards on the GPUs of one machine, a merge beside a run) each read the other's entries before they write, where
    an atomic write alone keeps the file whole but loses the entries the other one wrote meanwhile. An advisory
    lock (flock) on the folder itself, which leaves no file behind; where there is no flock on a folder (not POSIX;
    NFS grants it only on files open for writing), nothing is held, as before there was a lock."""
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    fd = None
    try:
        import fcntl

        fd = os.open(folder, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except (ImportError, OSError):
        pass
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the lock


def write_atomic(path: str | Path, data: dict) -> None:
    """Write JSON to a temp file in the same directory, then os.replace: readers see the old or the new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~umask)  # mkstemp makes it 0600
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def update(
    path: str | Path,
    slug: str,
    entries: dict[str, Entry],
    *,
    device_name: str,
    device_type: str,
    torch_version: str | None = None,
    cuda: str | None = None,
    driver: str | None = None,
    commit: str | None = None,
) -> BaselineFile:
    """Merge ``entries`` (the cases that ran) into the file at ``path``, keeping every other entry and the file's
    tolerances (defaults for a new file), and rewrite it atomically."""
    with one_writer(path):
        current = load(path, expect_slug=slug)
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        if current is None:
            current = BaselineFile(
                path=Path(path),
                slug=slug,
                device_name=device_name,
                device_type=device_type,
                tolerances=Tolerances.default_for(device_type),
            )
        if current.torch and torch_version and torch_version != current.torch:
            # the file's torch moves: the entries that went by it (recorded before entries kept their own) keep it
            for name in list(current.entries):
                current.entries[name] = current.entry(name)
        for name, entry in entries.items():
            old = current.entries.get(name)
            kept: dict[str, float] = {}
            if old is not None and entry.cpu_model and old.loss_step == entry.loss_step:
                same, model = old.loss_reference(entry.cpu_model)
                if model == entry.cpu_model and same == entry.loss:
                    # bit-identical on this CPU model: the arithmetic did not change, the other models' references hold
                    kept = {m: v for m, v in old.loss_by_cpu.items() if m != entry.cpu_model}
                    if old.cpu_model and old.cpu_model != entry.cpu_model and old.loss is not None:
                        kept[old.cpu_model] = old.loss
            current.entries[name] = dataclasses.replace(
                recorded_form(entry),
                recorded_at=now,
                commit=commit,
                loss_by_cpu=kept,
                torch=entry.torch or torch_version,
            )
        current.device_name, current.torch, current.cuda, current.driver = device_name, torch_version, cuda, driver
        current.recorded_at, current.commit = now, commit
        write_atomic(path, current.to_json())
        return current


def recorded_form(entry: Entry) -> Entry:
    """What recording keeps of a measured entry: a speed measured on a busy CPU, or on a GPU below its clocks
    ("machine unfit"), is no reference, so its tokens/s is dropped (its ``speed_note`` says why), and with it the GPU's
    busy time, whose kernels ran at the same clocks."""
    if entry.speed_note:
        return dataclasses.replace(entry, tokens_per_s=None, tokens_per_s_iqr=None, gpu_busy_seconds=None)
    return entry


def add_loss_references(path: str | Path, slug: str, entries: dict[str, Entry]) -> tuple[int, list[str]]:
    """Add each measured entry's loss as its CPU model's reference to the recorded entry of the same name, and
    rewrite the file atomically; nothing else changes. Returns the number added and the names skipped (no
    recorded entry, no CPU model, a loss read at another step, or an entry of another setup)."""
    with one_writer(path):
        current = load(path, expect_slug=slug)
        if current is None:
            return 0, list(entries)
        added, skipped = 0, []
        for name, entry in entries.items():
            old = current.entries.get(name)
            if (
                old is None
                or entry.cpu_model is None
                or entry.loss is None
                or old.loss_step != entry.loss_step
                or entry.setup_changes(old)
            ):
                skipped.append(name)
                continue
            if entry.cpu_model != old.cpu_model:
                old.loss_by_cpu[entry.cpu_model] = entry.loss
                added += 1
        if added:
            write_atomic(path, current.to_json())
        return added, skipped
