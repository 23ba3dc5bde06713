"""gptcore.report and `python -m gptcore report`: tables from a real CPU --benchmark-json run
(tests/data/cpu-run.json: `pytest bench -m cpu -k "cpu-small or cpu-layers2" --bench-warmup 1 --bench-rounds 3
--bench-steps 2 --benchmark-json ...`), the derived tables' definitions, and bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gptcore import report
from gptcore.cli import main

pytestmark = pytest.mark.cpu

RUN = Path(__file__).resolve().parent / "data" / "cpu-run.json"
RECIPES = ["fp32", "small-batch", "grad-accum", "sgd-cosine", "bf16"]


def test_load_run_reads_every_gptcore_case_with_its_metrics() -> None:
    records = report.load_run(RUN)
    assert len(records) == 10
    assert {r.model for r in records} == {"cpu-small", "cpu-layers2"} and {r.recipe for r in records} == set(RECIPES)
    for r in records:
        assert r.values["memory"] > 0 and r.values["speed"] > 0 and r.values["loss"] > 0
        assert r.values["reserved"] is None  # CPU: no allocator reserve


def test_pivot_is_shape_by_recipe_in_run_order() -> None:
    shapes, recipes, table = report.pivot(report.load_run(RUN), "memory")
    assert shapes == ["cpu-small", "cpu-layers2"] and recipes == RECIPES
    assert table["cpu-layers2"]["fp32"] > table["cpu-small"]["fp32"]  # twice the layers, more memory


def test_pct_change_is_against_the_fp32_default_of_the_same_shape() -> None:
    table = {"a": {"fp32": 200.0, "bf16": 150.0}, "b": {"fp32": 400.0, "bf16": None}}
    assert report.pct_change(table, "fp32") == {"a": {"fp32": 0.0, "bf16": -25.0}, "b": {"fp32": 0.0, "bf16": None}}


def test_additivity_is_the_interaction_term_in_percent_of_the_base_default() -> None:
    table = {"base": {"fp32": 100.0, "r": 80.0},          # the recipe alone: -20
             "big": {"fp32": 200.0, "r": 170.0},          # the shape alone: +100; together: +70, not +80
             "add": {"fp32": 300.0, "r": 280.0}}          # exactly additive
    dev = report.additivity(table, "base", "fp32")
    assert dev["big"]["r"] == pytest.approx(-10.0)  # (170 - 200) - (80 - 100) = -10, in % of base/fp32 = 100
    assert dev["add"]["r"] == 0.0 and dev["base"]["r"] == 0.0 and dev["big"]["fp32"] == 0.0


def test_base_shape_is_the_one_the_others_extend() -> None:
    assert report.base_shape(["char-ctx2", "char", "char-embd2"]) == "char"
    assert report.base_shape(["x", "y"]) == "x"


def test_cli_report_prints_the_three_tables_per_metric(capsys: pytest.CaptureFixture) -> None:
    assert main(["report", str(RUN)]) == 0
    out = capsys.readouterr().out
    assert "=== seed001-cpu-matrix ===" in out
    for title in ("peak allocated memory, MiB", "tokens/s (median over rounds)", "loss at the last timed step"):
        assert f"\n{title}\n" in out
        assert f"{title}: % change vs fp32 of the same shape" in out
        assert f"{title}: deviation from additivity, % of cpu-small/fp32" in out
    assert "peak reserved" not in out  # no figure on CPU, no table


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    (json.dumps({"machine_info": {}}), "not a pytest-benchmark JSON"),
    (json.dumps({"benchmarks": [{"name": "test_other", "extra_info": {}}]}), "no gptcore benchmark cases"),
])
def test_bad_or_missing_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                    content: str | None, message: str) -> None:
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gptcore: error: ") and message in err and str(path) in err


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main(["report", str(RUN), "--plot", str(tmp_path / "plots")]) == 2
    captured = capsys.readouterr()
    assert "--plot needs matplotlib" in captured.err and "gptcore-bench[plot]" in captured.err
    assert captured.out == "" and not (tmp_path / "plots").exists()


def test_plot_writes_a_png_per_metric_and_additivity(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    written = report.plot(report.load_run(RUN), tmp_path)
    assert {p.name for p in written} == {f"seed001-cpu-matrix-{m}{s}.png" for m in ("memory", "speed", "loss")
                                         for s in ("", "-additivity")}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
