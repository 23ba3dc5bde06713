"""A GPU call cut off at its limit keeps what it measured: each case is in the results log and (with
--update-baselines) in its baseline file the moment it ends; --deadline starts no case that would end after it and
still prints the end table; --resume runs only what a log has not finished."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from gptcore import identity
from gptcore.gate import results
from gptcore.presets import STUDIES
from tests.helpers import run_pytest
from tests.test_gate import ROOT, child_env, new_gate

pytestmark = pytest.mark.cpu

FOUR = [
    str(ROOT / "bench" / "test_cpu_shape.py"),
    "-k",
    "cpu-small and not bf16",
    "-p",
    "no:cacheprovider",
    "--bench-warmup",
    "1",
    "--bench-rounds",
    "1",
    "--bench-steps",
    "1",
]
"""Four CPU-shape cases of about a second each, in this order: ckpt-fp32, half-batch, grad-accum-2, sgd-cosine."""
NAMES = [
    f"test_cpu_shape[cpu-small-{r}]" for r in ("ckpt-fp32", "ckpt-half-batch", "ckpt-grad-accum-2", "ckpt-sgd-cosine")
]


def cases(expression: str) -> list[str]:
    """FOUR with another -k."""
    return [FOUR[0], "-k", expression, *FOUR[3:]]


COPIED = "98a3cbbe43e3d94c685f9ef26c01d04629be6c4d"
"""The commit a copied tree names in $GPTCORE_COMMIT: none of this checkout's HEAD, dirty or not."""
STAMPS = ("recorded_at", "commit", "loss")  # what recording sets beside the measured figures (loss: by_cpu kept)


def _copy_baselines(tmp_path: Path) -> Path:
    directory = tmp_path / "baselines"
    directory.mkdir()
    (directory / "cpu.json").write_text((ROOT / "baselines" / "cpu.json").read_text())
    return directory


KILL_AFTER_THIRD = """
import os
import signal

import pytest

ENDED = []


@pytest.hookimpl(trylast=True)  # after gptcore's hook has written the case's line
def pytest_runtest_logfinish(nodeid, location):
    ENDED.append(nodeid)
    if len(ENDED) == 3:  # killed as a job's time limit kills it: no end of session, no end-of-run hook
        os.kill(os.getpid(), signal.SIGKILL)
"""
"""A plugin that kills its own pytest the moment the third case has ended: the cut falls at one place whatever the
machine's load (a parent polling the log could be descheduled past the fourth case)."""


@pytest.mark.slow  # four cases in a child pytest: ~10 s on 2 busy cores
def test_a_run_killed_after_its_third_case_keeps_cases_one_to_three_in_the_log_and_the_baselines(tmp_path):
    baselines = _copy_baselines(tmp_path)
    before = json.loads((baselines / "cpu.json").read_text())
    log = tmp_path / "results.jsonl"
    (tmp_path / "kill_after_third.py").write_text(KILL_AFTER_THIRD)
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    env[identity.COMMIT_ENV] = COPIED  # a tree sent without its history names its commit
    command = [sys.executable, "-m", "pytest", *FOUR, "-p", "kill_after_third", "--update-baselines"]
    command += ["--baselines-dir", str(baselines), "--results-log", str(log)]
    child = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert child.returncode == -signal.SIGKILL, child.stdout[-2000:] + child.stderr[-2000:]
    logged = results.read(log)
    assert [r.name for r in logged] == NAMES[:3]  # the fourth case never ended
    assert all(r.outcome == "passed" and r.recorded and r.seconds > 0 for r in logged)
    after = json.loads((baselines / "cpu.json").read_text())
    # under another torch than the file's, the file takes this run's, and an entry that named none is stamped with
    # the one it was recorded under (the file's before): kept, not changed
    kept = {"torch": before["torch"]} if after["torch"] != before["torch"] else {}
    changed = {n for n, e in after["benchmarks"].items() if e != {**kept, **before["benchmarks"].get(n, {})}}
    assert changed == {r.name for r in logged}
    for r in logged:  # what the log says was recorded is what the file holds
        entry = after["benchmarks"][r.name]
        assert {k: v for k, v in entry.items() if k not in STAMPS} == {
            k: v for k, v in r.entry.items() if k not in STAMPS
        }
    assert after["tolerances"] == before["tolerances"]
    assert after["commit"] == COPIED and all(after["benchmarks"][r.name]["commit"] == COPIED for r in logged)
    # the device block keeps its slug, name and type, and counts the CPU models that recorded the entries: this
    # machine's model for the cases just recorded, whatever model recorded the file before
    models = Counter(e["cpu_model"] for e in after["benchmarks"].values() if e.get("cpu_model"))
    assert after["device"] == {**before["device"], "models": dict(sorted(models.items()))}
    assert models[identity.cpu_model()] >= len(logged)


def test_the_deadline_skips_a_plain_test_planned_past_it_too(tmp_path):
    """A stage's plain tests (the smoke's checks on a tiny model) share its time: with 50 s left, a test planned at
    100 s by its marker is not started, and one at the default 30 s is."""
    from types import SimpleNamespace

    from gptcore.gate import plan
    from gptcore.plugin.cases import CaseHooks

    def item(name: str, *marks: pytest.Mark) -> SimpleNamespace:
        return SimpleNamespace(
            nodeid=f"tests/test_x.py::{name}", name=name, get_closest_marker={m.name: m for m in marks}.get
        )

    gate = new_gate(tmp_path)
    hooks = CaseHooks(gate, deadline=50)
    assert plan.OTHER_SECONDS < 49
    hooks.pytest_runtest_setup(item("test_quick"))  # started: no skip raised
    long = pytest.mark.planned(100, why="one long compile").mark
    with pytest.raises(pytest.skip.Exception, match=r"s left of 50 s, .* about 100 s \(assumed \(one long compile\)\)"):
        hooks.pytest_runtest_setup(item("test_long", long))
    assert gate.not_started == ["test_long"]


@pytest.mark.slow  # two pytest runs of one or two cases, in this process: ~5 s
def test_the_deadline_skips_what_would_end_after_it_and_resume_runs_only_that(tmp_path):
    baselines = _copy_baselines(tmp_path)
    data = json.loads((baselines / "cpu.json").read_text())
    # the baselines say the first case takes 1 s and the second 200 s: with 150 s, the first fits and the second not
    data["benchmarks"][NAMES[0]]["seconds"], data["benchmarks"][NAMES[1]]["seconds"] = 1.0, 200.0
    (baselines / "cpu.json").write_text(json.dumps(data))
    log = tmp_path / "results.jsonl"
    two = cases("cpu-small-ckpt-fp32 or cpu-small-ckpt-half-batch")
    # both runs record (--update-baselines) rather than gate: what is tested is which cases run, not their figures,
    # which move with the torch version (torch 2.11's checkpointing makes 8 more allocations than the file's 2.13)
    first = run_pytest(
        tmp_path, *two, "--baselines-dir", str(baselines), "--results-log", str(log), "--deadline", "150", "-rs",
        "--update-baselines",
    )  # fmt: skip
    assert first.ret == 0, first.stdout.str() + first.stderr.str()
    assert "1 passed, 1 skipped" in first.stdout.str()
    assert f"deadline: 1 case(s) not started: {NAMES[1]}" in first.stdout.str()
    assert (
        "gptcore benchmark gate" in first.stdout.str() and NAMES[0] in first.stdout.str()
    )  # the end table, printed anyway
    assert "the case would take about 230 s (baseline)" in first.stdout.str()  # 200 s + 15%
    outcomes = {r.name: r.outcome for r in results.read(log)}
    assert outcomes == {NAMES[0]: "passed", NAMES[1]: "skipped"}

    second = run_pytest(tmp_path, *two, "--baselines-dir", str(baselines), "--resume", str(log), "--update-baselines")
    assert second.ret == 0, second.stdout.str() + second.stderr.str()
    assert "1 passed, 19 deselected" in second.stdout.str()  # only the case the deadline left (18 by -k, 1 resumed)
    assert f"resumed: 1 case(s) finished in {log}" in second.stdout.str()
    table = second.stdout.str().split("gptcore benchmark gate", 1)[1]
    assert NAMES[0] in table and NAMES[1] in table  # the end table covers the union
    assert [r.name for r in results.read(log)] == [NAMES[0], NAMES[1], NAMES[1]]  # appended to the resumed log


def test_a_resumed_failure_fails_the_run_and_a_bad_log_is_one_line(tmp_path):
    log = tmp_path / "results.jsonl"
    failed = results.Record(
        nodeid=f"bench/test_cpu_shape.py::{NAMES[0]}",
        name=NAMES[0],
        outcome="failed",
        seconds=1.0,
        reason="planted",
        slug="cpu",
        failures=[f"{NAMES[0]}: planted failure"],
    )
    results.ResultsLog(log).write(failed)
    run = run_pytest(tmp_path, *cases("cpu-small-ckpt-fp32"), "--resume", str(log))
    assert run.ret == 1, run.stdout.str() + run.stderr.str()  # nothing ran, but the union has a failure
    assert "planted" in run.stdout.str()
    log.write_text("not json\n{}\n")
    bad = run_pytest(tmp_path, *FOUR, "--resume", str(log))
    assert bad.ret == 4 and "Traceback" not in bad.stdout.str() + bad.stderr.str()
    assert f"--resume: {log}: line 1:" in bad.stderr.str()


def test_a_log_of_another_device_or_another_shard_is_not_resumed_and_says_which(tmp_path):
    """Resumed, another device's finished case would stand in this run's end table as this device's, unrun (a CPU
    case's line edited to an H200's slug: once shown 'ok' from it); another shard's log would keep its own plan over
    this shard's cases. Each is refused before anything runs, in one line naming the mismatch."""
    log = tmp_path / "results.jsonl"
    elsewhere = results.Record(
        nodeid=f"bench/test_cpu_shape.py::{NAMES[0]}", name=NAMES[0], outcome="passed", seconds=1.0, slug="nvidia-h200"
    )
    results.ResultsLog(log).write(elsewhere)
    run = run_pytest(tmp_path, *cases("cpu-small-ckpt-fp32"), "--resume", str(log))
    assert run.ret == 4 and "Traceback" not in run.stdout.str() + run.stderr.str()
    said = run.stderr.str()
    assert f"--resume: {log}: its cases ran on nvidia-h200, and this run is on cpu: resume a log of cpu" in said
    log.unlink()
    results.ResultsLog(log).write_plan(results.Plan((2, 2), [], "cpu", "0" * 40))
    run = run_pytest(tmp_path, *cases("cpu-small-ckpt-fp32"), "--shard", "1/2", "--resume", str(log))
    assert run.ret == 4 and "Traceback" not in run.stdout.str() + run.stderr.str()
    assert f"--resume: {log}: the log of --shard 2/2, and this run is --shard 1/2: resume it with 2/2" in (
        run.stderr.str()
    )


def test_a_log_that_cannot_be_read_is_one_line_naming_the_file_and_its_line_and_blank_lines_are_no_records(tmp_path):
    """Missing, not UTF-8, a line that is not JSON (except a last line cut short by a kill), a JSON line that is no
    record: each one LogError line naming the file, and the line where there is one. Blank lines and a shard's plan
    are not records."""
    log = tmp_path / "run.jsonl"
    where = re.escape(str(log))
    for read in (results.read, results.read_plan):
        with pytest.raises(results.LogError, match=f"^{where}: no such results log$"):
            read(log)
    plan = json.dumps(results.Plan((1, 2), ["a"], "cpu", "c0").to_json())
    record = json.dumps(results.Record(nodeid="x::a", name="a", outcome="passed", seconds=1.0).to_json())
    log.write_text(f"{plan}\n\n{record}\n\n{record}\n{record[:20]}")
    assert [r.nodeid for r in results.read(log)] == ["x::a", "x::a"]
    log.write_text(f"{record[:20]}\n{record}\n")
    with pytest.raises(results.LogError, match=f"^{where}: line 1: not a JSON line "):
        results.read(log)
    log.write_text(f"{record}\n[1, 2]\n{record}\n")
    with pytest.raises(results.LogError, match=f"^{where}: line 2: not a results-log record$"):
        results.read(log)
    log.write_bytes(b"\xff\xfe{}\n")
    for read in (results.read, results.read_plan):
        with pytest.raises(results.LogError, match=rf"^{where}: not a results log \(not UTF-8 text\)$"):
            read(log)


def test_a_results_log_that_cannot_be_written_mid_run_is_one_note_the_run_goes_on_and_fails_at_its_end(
    tmp_path, monkeypatch
):
    """A full disk while a case's line is written: the note under the table names the log and the error, the log is
    let go (no second note for the next case, no error), the cases go on, and the run whose tests all passed fails
    at its end (the lines not written would be lost to --resume)."""
    from types import SimpleNamespace

    from gptcore.plugin.cases import CaseHooks
    from tests.test_gate import disk_full, ended, new_gate

    log = results.ResultsLog(tmp_path / "results.jsonl")
    gate = new_gate(tmp_path, log=log)
    hooks = CaseHooks(gate, deadline=None)
    hooks.bench = {f"bench/x.py::{name}" for name in NAMES[:2]}

    monkeypatch.setattr(log, "_append", disk_full)
    for nodeid in sorted(hooks.bench):
        hooks.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, failed=False, skipped=False, duration=1.0))
        hooks.pytest_runtest_logfinish(nodeid)
    assert gate.notes == [f"results log: NOT written to {log.path}: [Errno 28] No space left on device"]
    assert gate.log is None
    assert ended(gate, pytest.ExitCode.OK) == pytest.ExitCode.TESTS_FAILED
    assert ended(new_gate(tmp_path, log=log), pytest.ExitCode.OK) == pytest.ExitCode.OK  # a log that was written


def test_each_line_of_the_log_is_one_write_so_a_kill_or_a_reader_never_splits_it(tmp_path, monkeypatch):
    writes = []
    real_write = os.write

    def counted(fd, data):
        writes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(results.os, "write", counted)
    big = results.Record(nodeid="x::big", name="big", outcome="failed", seconds=1.0, reason="r" * 20_000)
    results.ResultsLog(tmp_path / "results.jsonl").write(big)  # five times a 4 KiB buffer
    assert writes == [(tmp_path / "results.jsonl").stat().st_size] and writes[0] > 20_000


def test_a_log_cut_off_in_its_last_line_reads_up_to_it(tmp_path):
    log = tmp_path / "results.jsonl"
    sink = results.ResultsLog(log)
    for name in NAMES[:2]:
        sink.write(results.Record(nodeid=f"x::{name}", name=name, outcome="passed", seconds=1.0))
    with open(log, "a") as out:
        out.write('{"nodeid": "x::cut", "na')  # the kill came in the middle of a write
    assert [r.name for r in results.read(log)] == NAMES[:2]


def test_a_log_written_again_after_a_line_cut_short_keeps_every_record_written_after_it(tmp_path):
    """A kill cut the log's last line short, and a resumed run writes to the same log: the cut line is cut off
    before the next record. Glued onto it, that record would be one unreadable last line, dropped as the cut line
    is, and every later resume would run its case again. A whole record that only lacks its newline keeps its line."""
    log = tmp_path / "results.jsonl"
    sink = results.ResultsLog(log)

    def record(name: str) -> results.Record:
        return results.Record(nodeid=f"x::{name}", name=name, outcome="passed", seconds=1.0)

    sink.write(record(NAMES[0]))
    with open(log, "a") as out:
        out.write('{"nodeid": "x::cut", "na')  # the kill came in the middle of a write
    sink.write(record(NAMES[1]))
    assert [r.name for r in results.read(log)] == NAMES[:2]
    assert "x::cut" not in log.read_text() and log.read_text().endswith("\n")
    with open(log, "a") as out:
        out.write(json.dumps(record(NAMES[2]).to_json()))  # whole, but for its newline
    sink.write(record(NAMES[3]))
    assert [r.name for r in results.read(log)] == NAMES[:4]


def test_a_case_run_again_is_read_as_its_last_line(tmp_path):
    """A stage resumed, or verify after record, writes the case again: its later line is the case's result."""
    sink = results.ResultsLog(tmp_path / "results.jsonl")
    for outcome in ("failed", "passed"):
        sink.write(results.Record(nodeid="x::again", name="again", outcome=outcome, seconds=1.0))
    sink.write(results.Record(nodeid="x::once", name="once", outcome="failed", seconds=1.0))
    latest = results.latest(results.read(tmp_path / "results.jsonl"))
    assert {nodeid: r.outcome for nodeid, r in latest.items()} == {"x::again": "passed", "x::once": "failed"}


def test_recorded_only_runs_the_cases_with_a_baseline_entry_and_keeps_the_absent_devices_cases(tmp_path):
    baselines = _copy_baselines(tmp_path)
    data = json.loads((baselines / "cpu.json").read_text())
    kept = (NAMES[0], NAMES[3])  # two of FOUR's cases recorded, as after a stage cut short by its deadline
    data["benchmarks"] = {name: entry for name, entry in data["benchmarks"].items() if name in kept}
    (baselines / "cpu.json").write_text(json.dumps(data))
    run = run_pytest(tmp_path, *FOUR, "--baselines-dir", str(baselines), "--recorded-only", "--collect-only", "-q")
    assert run.ret == 0, run.stdout.str() + run.stderr.str()
    listed = [line.rsplit("::", 1)[-1] for line in run.stdout.str().splitlines() if "::" in line]
    assert listed == list(kept)
    assert "--recorded-only: 18 case(s) with no baseline entry deselected" in run.stdout.str()  # 20 cpu-small cases
    # without a GPU (hidden, should this run on one), a GPU case has no device file to be looked up in: it stays,
    # and skips itself with its reason
    ladder = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(ROOT / "bench" / "test_ladder.py"),
            "-p",
            "no:cacheprovider",
            "--baselines-dir",
            str(baselines),
            "--recorded-only",
            "-rs",
        ],
        cwd=tmp_path,
        env={**child_env(), "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ladder.returncode == 0, ladder.stdout + ladder.stderr
    assert (
        f"{len(STUDIES['ladder'].recipes)} skipped" in ladder.stdout  # the rungs and FP8 beside them
        and "deselected" not in ladder.stdout.split("gptcore benchmark gate")[0]
    )


def test_a_commit_with_changes_to_tracked_files_is_marked_dirty_and_untracked_files_are_not_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a baseline records as its commit: HEAD's sha; '+dirty' once a tracked file differs from it, since its
    figures are then not that commit's. A file git does not track (a results log, a build folder) changes nothing
    that was measured, and does not mark it."""
    from tests.test_compare import git

    monkeypatch.delenv(identity.COMMIT_ENV, raising=False)
    assert identity.git_commit(tmp_path) is None  # not a git checkout
    git(tmp_path, "init", "-q")
    (tmp_path / "model.py").write_text("a = 1\n")
    git(tmp_path, "add", "model.py")
    git(tmp_path, "commit", "-q", "-m", "one")
    sha = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "results.jsonl").write_text("{}\n")
    assert identity.git_commit(tmp_path) == sha
    (tmp_path / "model.py").write_text("a = 2\n")
    assert identity.git_commit(tmp_path) == f"{sha}+dirty"


def test_two_runs_recording_into_one_file_at_once_keep_each_others_entries(tmp_path, monkeypatch):
    """Shards on the GPUs of one machine record into one baseline file, each a read, its cases merged in, a write.
    Planted: run A pauses between its read and its write until run B has written (or for 2 s, while B waits on the
    lock). Held, B reads A's entry before it writes; without the lock, A's write from its stale read drops B's."""
    import threading

    from gptcore.gate import baselines
    from tests.test_gate import BASE

    real_load = baselines.load
    a_read, b_wrote = threading.Event(), threading.Event()

    def load(path, expect_slug=None):
        current = real_load(path, expect_slug)
        if threading.current_thread().name == "A":
            a_read.set()
            b_wrote.wait(timeout=2)  # without the lock B writes now; held by it, B waits and A goes on after 2 s
        return current

    def record(name: str) -> None:
        baselines.update(tmp_path / "cpu.json", "cpu", {name: BASE}, device_name="cpu", device_type="cpu")

    def second() -> None:
        a_read.wait(timeout=30)
        record("test_x[b]")
        b_wrote.set()

    monkeypatch.setattr(baselines, "load", load)
    runs = [threading.Thread(target=record, args=("test_x[a]",), name="A"), threading.Thread(target=second, name="B")]
    for run in runs:
        run.start()
    for run in runs:
        run.join(timeout=60)
    assert set(real_load(tmp_path / "cpu.json", "cpu").entries) == {"test_x[a]", "test_x[b]"}


def test_a_folder_that_cannot_be_locked_is_recorded_into_as_before(tmp_path, monkeypatch):
    """NFS grants flock only on files open for writing: there the lock is skipped, and the update is the atomic
    write it was before there was one (never 'baselines: NOT written')."""
    import fcntl

    from gptcore.gate import baselines
    from tests.test_gate import BASE

    def refused(fd, operation):
        raise OSError(9, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", refused)
    baselines.update(tmp_path / "cpu.json", "cpu", {"test_x[a]": BASE}, device_name="cpu", device_type="cpu")
    assert set(baselines.load(tmp_path / "cpu.json", "cpu").entries) == {"test_x[a]"}
