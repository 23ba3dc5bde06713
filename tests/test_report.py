"""gptcore.report.tables and `python -m gptcore report`: tables from a real CPU --benchmark-json run
(tests/data/cpu-run.json: `pytest bench -m cpu -k "test_cpu_shape and (cpu-small or cpu-layers2)" --bench-warmup 1
--bench-rounds 3 --bench-steps 2 --benchmark-json ...`), the derived tables' definitions, bad input, the axis labels
of every plot,
and the HTML page (gptcore.report.html), opened in a real headless browser.

HTML test data: tests/data/cpu-report-run.json and the two saved runs under tests/data/history/cpu/ are real (`pytest
bench -m cpu -k "cpu-small-ckpt or cpu-layers2-ckpt-fp32 or cpu-small-fp32 or cpu-small-ladder-0 or
cpu-small-checkpoint" --bench-warmup 1 --bench-rounds 3 --bench-steps 2 --benchmark-json ... --benchmark-autosave
--benchmark-storage file://...`, twice, on a busy shared machine: every cpu_share is below 0.5). Both were saved
from uncommitted changes to 8956c46; 0001 and 0002 have their "dirty" flag cleared so that they stand for committed
runs, and 0003, a copy of 0002 with the flag kept, is the run that both readers of saved runs leave out;
tests/data/gpu-ladder-synthetic.json is synthetic (the GPU tier has never run; its "note" says so)."""

from __future__ import annotations

import dataclasses
import html.parser
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gptcore.cli import main
from gptcore.report import tables as report
from tests.helpers import needs_matplotlib
from tests.test_gate import new_gate

pytestmark = pytest.mark.cpu

DATA = Path(__file__).resolve().parent / "data"
RUN = DATA / "cpu-run.json"
CPU_RUN, LADDER_RUN = DATA / "cpu-report-run.json", DATA / "gpu-ladder-synthetic.json"
HISTORY = DATA / "history" / "cpu"
BASELINES = DATA / "baselines-frozen"  # the CPU baselines of cpu-run.json's vintage (baselines/ moves on)
PLANTED = "test_cpu_shape[cpu-small-ckpt-fp32]"  # its peak memory 10% higher from the 4th commit on ("changes")
INSTALL_BROWSER = "apt-get update && apt-get install -y --no-install-recommends chromium"
RECIPES = ["ckpt-fp32", "ckpt-half-batch", "ckpt-grad-accum-2", "ckpt-sgd-cosine", "ckpt-bf16"]


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
    assert table["cpu-layers2"]["ckpt-fp32"] > table["cpu-small"]["ckpt-fp32"]  # twice the layers, more memory


def test_pct_change_is_against_the_fp32_default_of_the_same_shape() -> None:
    table = {"a": {"fp32": 200.0, "bf16": 150.0}, "b": {"fp32": 400.0, "bf16": None}}
    assert report.pct_change(table, "fp32") == {"a": {"fp32": 0.0, "bf16": -25.0}, "b": {"fp32": 0.0, "bf16": None}}


def test_additivity_is_the_interaction_term_in_percent_of_the_base_default() -> None:
    table = {
        "base": {"fp32": 100.0, "r": 80.0},  # the recipe alone: -20
        "big": {"fp32": 200.0, "r": 170.0},  # the shape alone: +100; together: +70, not +80
        "add": {"fp32": 300.0, "r": 280.0},
    }  # exactly additive
    dev = report.additivity(table, "base", "fp32")
    assert dev["big"]["r"] == pytest.approx(-10.0)  # (170 - 200) - (80 - 100) = -10, in % of base/fp32 = 100
    assert dev["add"]["r"] == 0.0 and dev["base"]["r"] == 0.0 and dev["big"]["fp32"] == 0.0


def test_base_shape_is_the_one_the_others_extend() -> None:
    assert report.base_shape(["char-ctx2", "char", "char-embd2"]) == "char"
    assert report.base_shape(["x", "y"]) == "x"
    assert report.base_shape(["charx", "char"]) == "charx"  # 'charx' is not 'char' extended: no base, the first


def test_a_gpu_run_is_read_in_the_units_of_its_titles_and_other_benchmarks_are_left_out(tmp_path: Path) -> None:
    """Bytes are read as MiB and the GPU busy seconds as ms, as the tables' titles say; a benchmark that is not a
    gptcore case (no recipe name) is left out, and a value that is not a number (a boolean) is none."""
    info = {
        "model": "gpt2",
        "recipe": "ladder-8",
        "device": "cuda",
        "peak_allocated_bytes": 3 * 2**20,
        "peak_reserved_bytes": 5 * 2**20,
        "gpu_busy_seconds": 0.0125,
        "tokens_per_s": 400_000.0,
        "loss": True,
    }
    other = {"model": "gpt2", "tokens_per_s": 1.0}  # another plugin's benchmark beside the gptcore cases
    run = {"benchmarks": [{"name": "a", "group": "ladder", "extra_info": info}, {"name": "b", "extra_info": other}]}
    (tmp_path / "run.json").write_text(json.dumps(run))
    [record] = report.load_run(tmp_path / "run.json")
    assert record.values == {"memory": 3.0, "reserved": 5.0, "speed": 400_000.0, "busy": 12.5, "loss": None}


def test_the_kernel_time_by_kind_lists_the_kinds_that_take_most_first() -> None:
    """Columns in the order of their total time over the cases (a tie read by name), each cell ms and its share."""
    split = {"a": {"other": 0.001, "gemm": 0.006, "attention": 0.003}, "b": {"gemm": 0.002, "attention": 0.004}}
    records = [
        report.Record("g", name, "gpt2", name, {}, {"gpu_kernel_seconds": kinds}) for name, kinds in split.items()
    ]
    header, _, first, second = report.kernel_kinds(records).splitlines()
    assert header.split() == ["case", "(ms)", "gemm", "attention", "other"]
    assert first.split() == ["a", "6.00", "(60%)", "3.00", "(30%)", "1.00", "(10%)"]
    assert second.split() == ["b", "2.00", "(33%)", "4.00", "(67%)", "—"]
    assert report.kernel_kinds(records[:0]) is None


def test_cli_report_prints_the_three_tables_per_metric(capsys: pytest.CaptureFixture) -> None:
    assert main(["report", str(RUN)]) == 0
    out = capsys.readouterr().out
    assert "=== cpu-shape study ===" in out
    for title in ("peak allocated memory, MiB", "tokens/s (median over rounds)", "loss at the last timed step, nats"):
        assert f"\n{title}\n" in out
        assert f"{title}: % change vs ckpt-fp32 of the same shape" in out
        assert f"{title}: deviation from additivity, % of cpu-small/ckpt-fp32" in out
    assert "peak reserved" not in out  # no figure on CPU, no table
    for corner in ("shape \\ recipe (MiB)", "shape \\ recipe (tok/s)", "shape \\ recipe (nats)", "shape \\ recipe (%)"):
        assert corner in out  # each table names its axes and its unit


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{not json", "not valid JSON"),
        (json.dumps({"machine_info": {}}), "not a pytest-benchmark JSON"),
        (json.dumps({"benchmarks": [{"name": "test_other", "extra_info": {}}]}), "no gptcore benchmark cases"),
        (json.dumps({"benchmarks": [{"extra_info": {"model": 5, "recipe": ["x"]}}]}), "no gptcore benchmark cases"),
    ],
)
def test_bad_or_missing_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: str | None, message: str
) -> None:
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gptcore: error: ") and message in err and str(path) in err


@pytest.mark.parametrize("flag", ["--plot", "--html"])
def test_plot_without_matplotlib_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture, flag: str
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main(["report", str(RUN), flag, str(tmp_path / "plots")]) == 2
    captured = capsys.readouterr()
    assert f"{flag} needs matplotlib" in captured.err and "gptcore-bench[plot]" in captured.err
    assert captured.out == "" and not (tmp_path / "plots").exists()


def test_plot_writes_a_png_per_metric_and_additivity(tmp_path: Path) -> None:
    needs_matplotlib()
    written = report.plot(report.load_run(RUN), tmp_path)
    assert {p.name for p in written} == {
        f"cpu-shape-study-{m}{s}.png" for m in ("memory", "speed", "loss") for s in ("", "-additivity")
    }
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)


def test_plot_labels_every_axis_and_draws_iqr_error_bars_on_tokens_per_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_matplotlib()
    figures = saved_figures(monkeypatch)
    report.plot(report.load_run(RUN), tmp_path)
    assert len(figures) == 6
    for fig in figures:
        assert_axes_labelled(fig)
    speed = [f for f in figures if "tokens/s" in f.axes[0].get_ylabel()]
    assert len(speed) == 1 and has_error_bars(speed[0].axes[0])


def saved_figures(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every matplotlib figure saved from now on (savefig is wrapped; the figure is kept)."""
    from matplotlib.figure import Figure

    figures, original = [], Figure.savefig

    def keep(fig: Figure, *args: object, **kwargs: object) -> None:
        figures.append(fig)
        original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def assert_axes_labelled(fig: object) -> None:
    """Both axes of every plot are labelled (a colorbar, its one axis)."""
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            assert ax.get_ylabel() or ax.get_xlabel()
        else:
            assert ax.get_xlabel() and ax.get_ylabel(), (ax.get_title(), ax.get_xlabel(), ax.get_ylabel())


def has_error_bars(ax: object) -> bool:
    from matplotlib.container import BarContainer, ErrorbarContainer

    return any(
        isinstance(c, ErrorbarContainer) or (isinstance(c, BarContainer) and c.errorbar is not None)
        for c in ax.containers
    )


# -- the HTML page -------------------------------------------------------------------------------------------------


def case_names(run: Path) -> list[str]:
    return [b["name"] for b in json.loads(run.read_text())["benchmarks"]]


class Elements(html.parser.HTMLParser):
    """Every element's tag and attributes, and the text of table cells by row, from an HTML document."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.rows: dict[str, list[str]] = {}
        self._row: str | None = None
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        if tag == "tr" and dict(attrs).get("data-case"):
            self._row = dict(attrs)["data-case"]
            self.rows[self._row] = []
        elif tag == "td" and self._row:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._row and self._cell is not None:
            self.rows[self._row].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [
            a for t, a in self.elements if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The pages of the real CPU run (with its history), of the synthetic ladder run, and of the real CPU run over
    a history with a planted change point (tests/test_history.py), built once."""
    needs_matplotlib()
    from gptcore.report.html import write_html
    from tests.test_history import planted_history

    out = tmp_path_factory.mktemp("html")
    planted_history(
        out / "planted" / "Linux-CPython-3.11-64bit", json.loads(CPU_RUN.read_text())["benchmarks"], PLANTED
    )
    return {
        "cpu": write_html(CPU_RUN, out / "cpu.html", baselines_dir=BASELINES, history=HISTORY),
        "ladder": write_html(LADDER_RUN, out / "ladder.html", baselines_dir=BASELINES),
        "changes": write_html(CPU_RUN, out / "changes.html", baselines_dir=BASELINES, history=out / "planted"),
    }


def test_html_is_self_contained(pages: dict[str, Path]) -> None:
    for page in pages.values():
        text = page.read_text()
        assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", text)  # nothing fetched
        assert "<link" not in text and "<script src" not in text
        doc = Elements(text)
        assert doc.find("img") and all(img["src"].startswith("data:image/png;base64,") for img in doc.find("img"))


def test_html_shows_each_case_against_its_baseline(pages: dict[str, Path]) -> None:
    from gptcore.gate import baselines

    base = baselines.load(BASELINES / "cpu.json")
    doc = Elements(pages["cpu"].read_text())
    assert list(doc.rows) == case_names(CPU_RUN)
    runs = {b["name"]: b["extra_info"] for b in json.loads(CPU_RUN.read_text())["benchmarks"]}
    for name, cells in doc.rows.items():
        entry = base.entries[name]  # every case of the run has a baseline in baselines/cpu.json
        assert cells[1] == f"{runs[name]['tokens_per_s']:,.0f}" and cells[3] == f"{entry.tokens_per_s:,.0f}"
        assert cells[5] == "not gated (CPU: reported only)"  # tokens/s is not gated on CPU
        assert cells[9] == "ok" and cells[8] == "+0.0%"  # memory is exact on CPU
        assert cells[10].startswith("busy (cpu_share")  # recorded on a busy machine: all below 0.5
    plots = [img["data-plot"] for img in doc.find("img")]
    assert plots == ["compare", "breakdown", "history"] * 2  # two studies; one ladder rung only: no waterfall
    assert "tokens/s <b>not gated</b> (reported only, as on CPU)" in pages["cpu"].read_text()


def test_busy_flag_only_below_the_cpu_share_threshold(tmp_path: Path) -> None:
    data = json.loads(CPU_RUN.read_text())
    for bench, share in zip(data["benchmarks"], (0.95, 0.89)):
        bench["extra_info"]["cpu_share"] = share
    (tmp_path / "run.json").write_text(json.dumps(data))
    records = report.load_run(tmp_path / "run.json")
    assert [r.busy for r in records[:2]] == [False, True]
    assert f"busy: tokens/s of {records[1].name}," in report.render(records)  # the text report flags it too
    # the flag is for tokens/s measured on the CPU: a GPU case is not flagged by its host process.s CPU share
    assert not report.recorded_busy({"device": "cuda", "cpu_share": 0.2})
    assert report.recorded_busy({"device": "cpu", "cpu_share": 0.2}) and not report.recorded_busy({"device": "cpu"})


def test_memory_breakdown_is_the_estimate_the_gate_recorded() -> None:
    from gptcore.report.figures import estimate_at_peak

    for r in report.load_run(CPU_RUN) + report.load_run(LADDER_RUN):
        cats, phase = estimate_at_peak(r)
        assert sum(cats.values()) == r.info["estimate_bytes"] and phase in ("forward", "backward", "optimizer")


def test_ladder_waterfall_in_rung_order(pages: dict[str, Path]) -> None:
    from gptcore.report.figures import ladders

    rungs = ladders(report.load_run(LADDER_RUN))
    assert list(rungs) == ["gpt2"] and [n for n, _ in rungs["gpt2"]] == list(range(9))
    assert ladders(report.load_run(CPU_RUN)) == {}  # ladder-0 alone is no ladder
    doc = Elements(pages["ladder"].read_text())
    assert [img["data-plot"] for img in doc.find("img")] == ["compare", "breakdown", "ladder"]
    assert "no such file" in pages["ladder"].read_text()  # no baseline for the GPU yet, and the page says so


def test_the_ladders_rungs_are_in_rung_order_whatever_order_the_run_kept_and_a_failed_rung_is_left_out() -> None:
    from gptcore.report.figures import ladders

    records = report.load_run(LADDER_RUN)
    shuffled = [*records[5:], *records[:5][::-1]]  # the run's cases out of order
    assert [n for n, _ in ladders(shuffled)["gpt2"]] == [n for n, _ in ladders(records)["gpt2"]] == list(range(9))
    failed = [
        dataclasses.replace(r, values={**r.values, "speed": None}) if r.recipe == "ladder-4" else r for r in records
    ]
    assert [n for n, _ in ladders(failed)["gpt2"]] == [0, 1, 2, 3, 5, 6, 7, 8]  # a rung without a speed is no bar


def test_the_page_names_its_device_from_the_cases_and_a_busy_time_without_a_baseline_has_none() -> None:
    """A CPU run on a host with a GPU is the CPU's page, whatever machine_info says of the GPU; a GPU run without
    a device slug is named after its GPU. A case's busy time with no baseline entry says so, not 'no figure'."""
    from gptcore.gate.schema import Tolerances
    from gptcore.report.html import _busy_cells, device_slug

    gpu = {"machine_info": {"gpu": {"name": "NVIDIA H200"}}}
    assert device_slug(gpu, report.load_run(CPU_RUN)) == "cpu"
    records = report.load_run(LADDER_RUN)
    assert device_slug(gpu, records) == "nvidia-h200"
    busy = dataclasses.replace(records[0], values={**records[0].values, "busy": 30_000.0})
    assert _busy_cells(busy, None, Tolerances.default_for("cuda"))[-1] == "no baseline"


def test_the_pages_speed_check_is_the_gates_and_has_no_delta_against_another_cpu_or_a_busy_recording() -> None:
    """The page judges a case by the gate's own rules (checks.speed_incomparable): against a speed recorded on a
    busy machine or on another CPU model there is no delta, only why; a quiet recording on the same CPU model has
    one."""
    from gptcore.gate import baselines
    from gptcore.report.figures import case_checks

    base = baselines.load(BASELINES / "cpu.json")
    record = report.load_run(CPU_RUN)[0]
    busy = base.entries[record.name]  # recorded with a CPU share of 0.50
    here = dataclasses.replace(record, info={**record.info, "cpu_model": busy.cpu_model})
    xeon = dataclasses.replace(busy, cpu_model="Intel(R) Xeon(R) Processor (family 6, model 207)", cpu_share=0.99)
    quiet = dataclasses.replace(busy, cpu_share=0.99)
    speeds = [case_checks(here, e, base.tolerances)[0] for e in (busy, xeon, quiet)]
    assert [(c.status, c.note) for c in speeds[:2]] == [
        ("no figure", "speed recorded on a busy machine (share 0.50)"),
        ("no figure", f"speed recorded on another CPU model ({xeon.cpu_model})"),
    ]
    assert speeds[0].delta is None and speeds[1].delta is None
    assert speeds[2].delta == pytest.approx(record.values["speed"] / busy.tokens_per_s - 1)


def test_history_reads_pytest_benchmark_saved_runs_oldest_first() -> None:
    from gptcore.report.html import load_history

    runs, left_out = load_history(HISTORY)
    assert [r.number for r in runs] == ["0001", "0002"]
    assert len(left_out) == 1 and "0003_" in left_out[0] and "uncommitted changes" in left_out[0]
    assert all(set(case_names(CPU_RUN)) <= set(r.cases) for r in runs)
    assert all(r.commit.startswith("8956c46") for r in runs)
    tokens, iqr, peak, busy = runs[1].cases["test_cpu_shape[cpu-small-ckpt-fp32]"]
    assert tokens > 0 and iqr > 0 and peak == 20627064 and busy  # the baseline's exact peak


def test_html_plots_label_every_axis_with_error_bars_on_tokens_per_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_matplotlib()
    from gptcore.report.html import build_html

    figures = saved_figures(monkeypatch)
    build_html(CPU_RUN, baselines_dir=BASELINES, history=HISTORY)
    build_html(LADDER_RUN, baselines_dir=BASELINES)
    assert len(figures) == 9
    for fig in figures:
        assert_axes_labelled(fig)
        speed = [ax for ax in fig.axes if "tokens/s" in ax.get_xlabel() + ax.get_ylabel()]
        assert all(has_error_bars(ax) for ax in speed)
    assert sum(1 for fig in figures for ax in fig.axes if "tokens/s" in ax.get_xlabel() + ax.get_ylabel()) == 6


def test_cli_html_and_its_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    needs_matplotlib()
    out = tmp_path / "sub" / "report.html"
    assert main(["report", str(LADDER_RUN), "--html", str(out), "--baselines", str(BASELINES)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out and out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(CPU_RUN), "--html", str(out), "--history", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nowhere: no such directory" in err
    # a baselines folder named and not there: refused, where the page would have shown no baseline without a word
    assert main(["report", str(CPU_RUN), "--html", str(out), "--baselines", str(tmp_path / "nobase")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--baselines {tmp_path / 'nobase'}: no such directory" in err


def browser() -> str:
    """Debian's chromium; a clear failure naming the install command when it is missing (never a skip)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not found:
        pytest.fail(
            f"chromium not found: the report's browser test needs it; install it (as root) with: "
            f"{INSTALL_BROWSER} (.ci/run does)",
            pytrace=False,
        )
    return found


@pytest.mark.parametrize(("page", "run"), [("cpu", CPU_RUN), ("ladder", LADDER_RUN), ("changes", CPU_RUN)])
def test_a_real_browser_loads_the_page_runs_its_script_and_finds_every_case(
    pages: dict[str, Path], tmp_path: Path, page: str, run: Path
) -> None:
    command = [
        browser(),
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        pages[page].as_uri(),
    ]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = Elements(done.stdout)
    assert doc.find("body", data_ready="yes"), f"the page's script did not run ({time.perf_counter() - start:.1f} s)"
    index = [a["data-index-case"] for a in doc.find("li") if a.get("data-index-case")]
    assert index == case_names(run)  # built by the page's script from the case rows
    images = doc.find("img")
    assert images and all(int(img.get("data-natural-width") or 0) > 0 for img in images)  # every plot decoded
    marked = [img for img in doc.find("img", data_plot="history") if "change points shaded" in img.get("alt", "")]
    if page == "changes":  # the planted change point, marked on the history plot the browser decoded
        assert [img["alt"].split("; ", 1)[1] for img in marked] == [
            f"change points shaded: {PLANTED} peak memory regression 3333333..4444444"
        ]
    else:
        assert marked == []


# -- the gate's note on pytest-benchmark's storage -----------------------------------------------------------------


def test_gate_says_where_pytest_benchmark_history_is_when_it_split_the_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    from gptcore import identity
    from gptcore.gate import session as gate
    from gptcore.plugin import start as plugin

    monkeypatch.setattr(identity, "session_slug", lambda: "cpu")
    config = SimpleNamespace(
        invocation_params=SimpleNamespace(args=()),
        option=SimpleNamespace(benchmark_storage=plugin.PLUGIN_DEFAULT_STORAGE),
    )
    note = plugin._split_storage_per_device(config)
    assert config.option.benchmark_storage == "file://./.benchmarks/cpu"
    assert note == (
        "pytest-benchmark history for this device: .benchmarks/cpu (pytest-benchmark list/compare need "
        "--storage .benchmarks/cpu)"
    )
    given = SimpleNamespace(
        invocation_params=SimpleNamespace(args=("--benchmark-storage=x",)),
        option=SimpleNamespace(benchmark_storage="file://x"),
    )
    assert plugin._split_storage_per_device(given) is None  # the user's storage: left alone, no note
    default = SimpleNamespace(
        invocation_params=SimpleNamespace(args=("--benchmark-storage", plugin.PLUGIN_DEFAULT_STORAGE)),
        option=SimpleNamespace(benchmark_storage=plugin.PLUGIN_DEFAULT_STORAGE),
    )
    assert plugin._split_storage_per_device(default) is None  # given, even as the default's value: the user's
    assert default.option.benchmark_storage == plugin.PLUGIN_DEFAULT_STORAGE
    g = new_gate(Path("baselines"), history_note=note, cpu_model="test")
    assert note not in g.summary_notes()  # no case ran (pytest tests): no section for it
    g.rows.append(gate.Row("test_x[a-b]", None, None, "ok"))
    assert g.summary_notes()[-1] == note


def test_html_judges_each_expected_effect_as_the_gate_does(pages: dict[str, Path]) -> None:
    """The report's 'does each optimization still pay' comes from the gate's own rule: the same outcomes as
    Gate.expect on the same figures."""
    from gptcore.gate.expectations import Figures
    from gptcore.gate.schema import Entry
    from gptcore.measure.measurement import Measurement

    text = pages["cpu"].read_text()
    shown = dict(re.findall(r'<tr data-expectation="([^"]+)">.*?<td class="[^"]*">([^<]+)</td></tr>', text))
    gate = new_gate(Path("."))
    names = {f.name for f in dataclasses.fields(Measurement)}
    for bench in json.loads(CPU_RUN.read_text())["benchmarks"]:
        info = bench["extra_info"]
        m = Measurement(**{k: v for k, v in info.items() if k in names})
        measured = Entry.from_measurement(m, precision=info["precision"], cpu_model=info.get("cpu_model"))
        gate._expect(
            info["model"], info["recipe"], m.device, Figures.of(measured, info["estimate_bytes"], m.tokens_per_step), 1
        )
    judged = {f"{o.model} {o.claim}": o.status for o in gate.expected.outcomes}
    claims = (
        "checkpoint vs fp32",
        "ckpt-half-batch vs ckpt-fp32",
        "ckpt-grad-accum-2 vs ckpt-fp32",
        "ckpt-bf16 vs ckpt-fp32",
    )
    assert shown == judged and set(judged) == {f"cpu-small {claim}: peak memory lower" for claim in claims}
    assert set(judged.values()) == {"ok"}


def test_html_status_of_each_case_is_the_gates(tmp_path: Path) -> None:
    """The page judges tokens/s and memory with the gate's own checks: on a run moved both ways around the
    tolerances (speed gated at 5% here), every case's status and Δ cell on the page equal the gate's verdict and
    its end-table cell."""
    import dataclasses
    import itertools
    from types import SimpleNamespace

    from gptcore.gate import baselines, schema, verdicts
    from gptcore.gate.summary import _pct
    from gptcore.measure.measurement import Measurement
    from gptcore.report.html import build_html

    base = baselines.load(BASELINES / "cpu.json")
    tol = dataclasses.replace(base.tolerances, speed=0.05)
    data = base.to_json() | {"tolerances": dataclasses.asdict(tol)}
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "cpu.json").write_text(json.dumps(data))
    run = json.loads(CPU_RUN.read_text())
    moves = itertools.cycle([(1.0, 1.0), (1.03, 0.90), (0.97, 1.10), (1.01, 0.97), (1.02, 1.05)])
    for bench, (memory, speed) in zip(run["benchmarks"], moves):
        info = bench["extra_info"]
        info["peak_allocated_bytes"] = round(info["peak_allocated_bytes"] * memory)
        info["tokens_per_s"] *= speed
    (tmp_path / "run.json").write_text(json.dumps(run))
    doc = Elements(build_html(tmp_path / "run.json", baselines_dir=tmp_path / "base"))
    seen = set()
    blank = {f.name: None for f in dataclasses.fields(Measurement)}
    for bench in run["benchmarks"]:
        info, name = bench["extra_info"], bench["name"]
        measured = schema.Entry.from_measurement(
            SimpleNamespace(**(blank | info)), precision=info["precision"], cpu_model=None
        )
        baseline = base.entries[name]
        gate = {c.metric: c.status for c in verdicts.verdict_of(name, measured, baseline, tol).checks}
        cells = doc.rows[name]
        assert (cells[5], cells[9]) == (gate["tokens/s"], gate["peak memory"]), name
        assert cells[4] == _pct(measured.tokens_per_s, baseline.tokens_per_s, gate["tokens/s"])
        assert cells[8] == _pct(measured.peak_allocated_bytes, baseline.peak_allocated_bytes, gate["peak memory"])
        seen |= {gate["tokens/s"], gate["peak memory"]}
    assert seen == {"ok", "FAIL", "better"}  # every outcome was met, both metrics


def test_html_plots_the_validation_curves_of_a_convergence_run_against_the_baseline(tmp_path: Path) -> None:
    """A convergence case (extra_info as bench/harness.converge_case writes it) gets its group's validation-curve
    figure, and no memory figures (none is measured in a whole training run)."""
    needs_matplotlib()
    from gptcore.gate import baselines
    from gptcore.measure.convergence import Convergence
    from gptcore.report.html import build_html

    name = "test_convergence_cpu_shape_short[cpu-small-ckpt-fp32]"
    before = baselines.load(BASELINES / "cpu.json").entries[name].convergence
    now = Convergence(
        before.steps,
        [v + 0.01 for v in before.val_loss],
        before.train_loss,
        before.seconds,
        before.tokens_per_step,
        before.target_loss,
    )
    info = {
        "model": "cpu-small",
        "recipe": "ckpt-fp32",
        "precision": "fp32",
        "device": "cpu",
        "tokens_per_s": now.tokens_per_s,
        "convergence": now.to_json(),
        "verdict": "ok",
    }
    run = {
        "machine_info": {"device_slug": "cpu"},
        "benchmarks": [{"group": "cpu-shape convergence (400 steps, CI)", "name": name, "extra_info": info}],
    }
    (tmp_path / "run.json").write_text(json.dumps(run))
    doc = Elements(build_html(tmp_path / "run.json", baselines_dir=BASELINES))
    assert [img["data-plot"] for img in doc.find("img")] == ["convergence"]
    assert doc.rows[name][9] == "no figure"  # memory: a convergence run measures none


def test_a_nan_loss_and_an_inf_speed_are_named_in_the_report_and_its_page(tmp_path: Path, capsys) -> None:
    needs_matplotlib()
    from gptcore.report.html import build_html

    run = json.loads(CPU_RUN.read_text())
    first, second = run["benchmarks"][0], run["benchmarks"][1]
    first["extra_info"]["loss"] = float("nan")  # a diverged run
    second["extra_info"]["tokens_per_s"] = float("inf")  # a broken timer
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))  # Python's json writes NaN and Infinity, and reads them back
    assert main(["report", str(path)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = captured.out.splitlines()
    assert f"not finite: {first['name']}: loss is NaN (the run diverged)" in lines
    assert f"not finite: {second['name']}: tokens/s is +inf (the timing broke)" in lines
    page = build_html(path, baselines_dir=BASELINES)
    assert "loss is NaN (the run diverged)" in page and "tokens/s is +inf (the timing broke)" in page


def test_a_run_file_with_a_field_of_another_shape_still_makes_its_page(tmp_path: Path) -> None:
    """A machine_info that is not an object, and a peak that is text: each was a traceback in --html (the plain
    tables showed '—'). The page is made, the odd figure shown as none, and the device read from the cases."""
    import json

    needs_matplotlib()
    for odd in ({"machine_info": "x"}, {"machine_info": 3}, "peak"):
        data = json.loads(CPU_RUN.read_text())
        if odd == "peak":
            data["benchmarks"][0]["extra_info"]["peak_allocated_bytes"] = "12 MiB"
        else:
            data |= odd
        run = tmp_path / "run.json"
        run.write_text(json.dumps(data))
        out = tmp_path / "page.html"
        assert main(["report", str(run), "--html", str(out), "--baselines", str(BASELINES)]) == 0, odd
        assert out.read_text().startswith("<!DOCTYPE html>"), odd
