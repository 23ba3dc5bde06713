"""gptcore.storage, the one reader of saved runs: `history` and the HTML report's history chart read the same runs
(the committed runs of one device, in commit order) and leave out the same ones, at any folder depth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptcore import storage
from gptcore.hunt import history
from gptcore.report.html import load_history
from tests.test_history import save

pytestmark = pytest.mark.cpu

CASE = "test_cpu_shape[cpu-small-fp32]"


def planted(root: Path) -> Path:
    """.benchmarks-like storage: one device folder, one machine folder, runs of every kind the readers tell apart."""
    machine = root / "cpu" / "Linux-CPython-3.11-64bit"
    figures = {CASE: {"device": "cpu", "peak_allocated_bytes": 1000, "tokens_per_s": 5.0}}
    save(machine, 1, "b" * 40, figures, time="2026-11-02T00:00:00+00:00")  # saved first, committed later
    save(machine, 2, "a" * 40, figures, time="2026-11-01T00:00:00+00:00")
    save(machine, 3, "c" * 40, figures, dirty=True)
    save(machine, 4, None, figures)  # outside git
    save(machine, 5, "d" * 40, figures, slug="nvidia-h100")  # another device
    (machine / "0006_broken.json").write_text("{")
    for number, shape in (("0007", '{"commit_info": "abc"}'), ("0008", '{"benchmarks": ["x"]}')):
        (machine / f"{number}_{'e' * 40}_20261101_000000.json").write_text(shape)  # JSON, not of a saved run's shape
    return root


def test_history_and_the_html_chart_read_the_same_runs_and_leave_out_the_same(tmp_path: Path):
    root = planted(tmp_path / ".benchmarks")
    _, _, found = history.read(root)
    runs, left_out = load_history(root)
    assert found.commits == ["a" * 40, "b" * 40] == [r.commit for r in runs]  # commit time, not run order
    assert [r.number for r in runs] == ["0002", "0001"]
    assert found.skipped == left_out
    reasons = {line.split(":")[0].rsplit("/", 1)[-1][:4]: line for line in left_out}
    assert set(reasons) == {"0003", "0004", "0005", "0006", "0007", "0008"}
    assert "uncommitted changes" in reasons["0003"] and "outside git" in reasons["0004"]
    assert "device nvidia-h100" in reasons["0005"] and "not a readable run" in reasons["0006"]
    assert reasons["0007"].endswith("not a readable run (commit_info is not an object)")
    assert reasons["0008"].endswith("not a readable run (benchmarks is not a list of objects)")


@pytest.mark.parametrize("depth", [".benchmarks", ".benchmarks/cpu", ".benchmarks/cpu/Linux-CPython-3.11-64bit"])
def test_the_storage_root_a_device_folder_or_a_machine_folder_all_hold_the_same_runs(tmp_path: Path, depth: str):
    planted(tmp_path / ".benchmarks")
    saved = storage.read(tmp_path / depth)
    assert [r.number for r in saved.runs] == ["0002", "0001"] and saved.device == "cpu"
    assert [r.number for r in load_history(tmp_path / depth)[0]] == ["0002", "0001"]


def test_a_missing_or_empty_folder_is_one_line(tmp_path: Path):
    with pytest.raises(ValueError, match="no such directory"):
        storage.read(tmp_path / "nowhere")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match="a-file: not a directory"):
        storage.read(tmp_path / "a-file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no saved pytest-benchmark run"):
        load_history(tmp_path / "empty")


def test_commits_with_one_commit_time_come_in_the_order_each_first_ran(tmp_path: Path):
    """Two commits made in the same second (a rebase, a merge) are placed by the first run of each: x ran first
    and again last, y in between, so x's two runs come first, together."""
    machine, same = tmp_path / "cpu" / "m", "2026-11-10T00:00:00+00:00"
    figures = {CASE: {"device": "cpu", "peak_allocated_bytes": 1000}}
    for number, commit in ((1, "x"), (2, "y"), (3, "x")):
        save(machine, number, commit * 40, figures, time=same)
    runs = storage.read(tmp_path).runs
    assert [(r.commit[0], r.number) for r in runs] == [("x", "0001"), ("x", "0003"), ("y", "0002")]


def test_a_run_whose_commit_has_no_time_is_placed_by_when_it_ran(tmp_path: Path):
    """A saved run whose commit_info has no time (a shallow clone's) goes where it ran, not first: b ran on the 5th,
    between a (committed on the 1st) and c (committed on the 7th)."""
    machine = tmp_path / "cpu" / "m"
    figures = {CASE: {"device": "cpu", "peak_allocated_bytes": 1000}}
    save(machine, 1, "a" * 40, figures)
    save(machine, 5, "b" * 40, figures)
    save(machine, 7, "c" * 40, figures)
    [b] = machine.glob("0005_*.json")
    data = json.loads(b.read_text())
    del data["commit_info"]["time"]
    b.write_text(json.dumps(data))
    assert [r.commit[0] for r in storage.read(tmp_path).runs] == ["a", "b", "c"]


def test_a_change_of_cpu_model_at_a_step_is_named_with_it(tmp_path: Path):
    """What else could move a figure between two runs, as machine_info records it: torch's version and the CPU model.
    A step where the CPU model changed (the runner moved from Zen 3 to Zen 4) says so."""
    machine = tmp_path / "cpu" / "m"
    zen3, zen4 = "AMD EPYC (family 25, model 1)", "AMD EPYC (family 25, model 17)"
    for number in range(1, 7):
        peak, cpu = (1000, zen3) if number < 4 else (1100, zen4)
        save(machine, number, str(number) * 40, {CASE: {"device": "cpu", "peak_allocated_bytes": peak}}, cpu_model=cpu)
    saved = storage.read(tmp_path)
    assert saved.runs[0].env == {"torch": "2.13.0+cpu", "cpu_model": zen3}
    [step] = history.analyse(tmp_path).findings
    assert step.note.endswith(f"; cpu_model {zen3} -> {zen4} between these runs"), step.note


def test_what_a_run_saves_of_its_machine_is_what_the_reader_compares(tmp_path: Path):
    """pytest-benchmark's machine_info, as the plugin completes it, holds torch's version, the CPU model (family and
    model numbers included) and the device: the figures a history names when they move between runs."""
    from gptcore import identity
    from gptcore.plugin.end import update_machine_info

    info: dict = {}
    update_machine_info(info)
    assert (info["torch"], info["cpu_model"], info["device_slug"]) == (
        identity.torch_version(),
        identity.cpu_model(),
        identity.session_slug(),
    )
    machine = tmp_path / "cpu" / "m"
    save(machine, 1, "a" * 40, {CASE: {"device": "cpu", "peak_allocated_bytes": 1000}})
    [path] = machine.glob("*.json")
    path.write_text(json.dumps(json.loads(path.read_text()) | {"machine_info": info}))
    [run] = storage.read(tmp_path).runs
    assert run.env == {"torch": info["torch"], "cpu_model": info["cpu_model"]} and run.device == info["device_slug"]
