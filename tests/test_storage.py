"""gptcore.storage, the one reader of saved runs: `history` and the HTML report's history chart read the same runs
(the committed runs of one device, in commit order) and leave out the same ones, at any folder depth."""

from __future__ import annotations

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
