"""The baselines gate proves itself: a real CPU benchmark case (cpu-small ckpt-fp32, 1 warm-up, 2 rounds of 2
steps) run through pytest inside the test process (tests.helpers.run_pytest) against a temporary baselines dir:
recorded, rerun unchanged, then with the baseline moved so that the run must fail; unusable baseline files give a
clear error; a --benchmark-compare-fail regression fails the run with the end table and no traceback. Plus unit tests
of gptcore.gate.baselines (verdicts, validation, atomic update) and of the end table."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gptcore import identity
from gptcore.gate import baselines, schema, verdicts
from gptcore.gate.schema import BaselineError, Entry, Tolerances
from gptcore.gate.verdicts import verdict_of
from gptcore.plugin.options import THREADS_ENV
from tests.helpers import XDIST_VARIABLES, fake_share, run_pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parent.parent
CASE = "test_cpu_shape[cpu-small-ckpt-fp32]"
CASE_GLOB = CASE.replace("[", "[[]")  # fnmatch: '[' opens a character class
QUICK = [
    str(ROOT / "bench" / "test_cpu_shape.py"),
    "-k",
    "cpu-small-ckpt-fp32",
    "-p",
    "no:cacheprovider",
    "--bench-warmup",
    "1",
    "--bench-rounds",
    "2",
    "--bench-steps",
    "2",
]
# the child must not think it is an xdist worker (pytest-benchmark would disable itself); one thread each, its CPU
# cases' too (--bench-threads' default), keeps two test workers from oversubscribing two cores
ENV_DROP = XDIST_VARIABLES
ENV_SET = {"OMP_NUM_THREADS": "1", THREADS_ENV: "1"}


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    return {**env, **ENV_SET}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """baselines/cpu.json as a first run with --update-baselines writes it (recorded once per module)."""
    where = tmp_path_factory.mktemp("recorded")
    with pytest.MonkeyPatch.context() as patch:  # recorded as on a quiet machine, however busy this one is
        fake_share(patch, 1.0)
        result = run_pytest(where, *QUICK, "--baselines-dir", str(where / "baselines"), "--update-baselines")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert "recorded" in result.stdout.str()
    return json.loads((where / "baselines" / "cpu.json").read_text())


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """run(baseline_json_or_text, *args) -> the RunResult of the quick case against that cpu.json."""
    monkeypatch.chdir(tmp_path)
    for key in ENV_DROP:
        monkeypatch.delenv(key, raising=False)

    def _run(content: dict | str | None, *args: str) -> pytest.RunResult:
        directory = tmp_path / "baselines"
        directory.mkdir(exist_ok=True)
        if content is not None:
            text = content if isinstance(content, str) else json.dumps(content)
            (directory / "cpu.json").write_text(text)
        return run_pytest(tmp_path, *QUICK, "--baselines-dir", str(directory), *args)

    return _run


def entry(data: dict) -> dict:
    return data["benchmarks"][CASE]


# -- the gate on a real case --------------------------------------------------------------------------------------


def test_first_run_with_update_baselines_records_the_case(recorded: dict) -> None:
    assert recorded["schema_version"] == schema.SCHEMA_VERSION
    assert recorded["device"]["slug"] == "cpu"
    e = entry(recorded)
    assert e["peak_allocated_bytes"] > 0 and e["peak_reserved_bytes"] is None
    speed = e["tokens_per_s"]  # recorded: the fixture's rounds had the whole CPU (a busy one: tests/test_cpu_speed.py)
    assert speed["median"] > 0 and speed["iqr"] >= 0 and "not_recorded" not in speed
    assert e["loss"]["step"] == 8 and e["loss"]["value"] > 0  # the study's loss step (bench/test_cpu_shape.py)
    assert recorded["tolerances"] == {**recorded["tolerances"], "memory": 0.02, "speed": None, "loss": 1e-6}


def test_unchanged_rerun_passes(run, recorded: dict) -> None:
    # --speed-tol 1.0: tokens/s is never gated here (no wall-clock assertions in tests/); memory and the loss
    # are exact on CPU, so an unchanged rerun must match them
    result = run(recorded, "--speed-tol", "1.0")
    result.assert_outcomes(passed=1)
    assert "gptcore benchmark gate" in result.stdout.str() and "FAIL" not in result.stdout.str()


def test_memory_baseline_lowered_3pct_fails_naming_case_and_metric(run, recorded: dict) -> None:
    lowered = copy.deepcopy(recorded)
    entry(lowered)["peak_allocated_bytes"] = int(entry(recorded)["peak_allocated_bytes"] * 0.97)
    result = run(lowered, "--speed-tol", "1.0")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{CASE_GLOB}: peak memory +3.*%*tolerance +2%*"])


def test_tokens_per_s_baseline_raised_fails_naming_case_and_metric(run, recorded: dict, monkeypatch) -> None:
    fake_share(monkeypatch, 1.0)  # a quiet machine: a busy round records no speed, and nothing would be judged
    raised = copy.deepcopy(recorded)
    speed = entry(raised)["tokens_per_s"]
    speed.pop("not_recorded", None)
    speed["median"] = 1e12  # no CPU trains cpu-small at a trillion tokens/s: a slowdown whatever the load
    entry(raised)["cpu_share"] = 1.0  # as if recorded on a quiet machine (a busy recording has no delta to gate)
    result = run(raised, "--speed-tol", "0.05")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{CASE_GLOB}: tokens/s -*%*tolerance -5%*"])


def test_loss_moved_beyond_tolerance_fails(run, recorded: dict) -> None:
    moved = copy.deepcopy(recorded)
    entry(moved)["loss"]["value"] += 0.01
    result = run(moved, "--speed-tol", "1.0")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{CASE_GLOB}: loss -1.00e-02 nats*"])


def test_missing_entry_passes_as_no_baseline_and_fails_under_strict(run, recorded: dict) -> None:
    empty = {**copy.deepcopy(recorded), "benchmarks": {}}
    result = run(empty)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*no baseline*", "*1 case(s) have no baseline; record them with: *--update-baselines"])
    strict = run(empty, "--baseline-strict")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines([f"*{CASE_GLOB}: no baseline for cpu*--baseline-strict*"])


def test_benchmark_compare_without_history_says_so_and_still_gates(run, recorded: dict) -> None:
    lowered = copy.deepcopy(recorded)
    entry(lowered)["peak_allocated_bytes"] = int(entry(recorded)["peak_allocated_bytes"] * 0.97)
    result = run(lowered, "--speed-tol", "1.0", "--benchmark-compare", "--benchmark-compare-fail=median:5%")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{CASE_GLOB}: peak memory +3.*", "*--benchmark-compare: no saved benchmark run in*"])
    assert "requires valid --benchmark-compare" not in result.stdout.str() + result.stderr.str()


TRIVIAL_BENCH = """
from gptcore.measure.measurement import Measurement


def test_trivial(benchmark, gate, request):
    benchmark.pedantic(sum, args=(range(100),), rounds=20, iterations=100)
    gate.judge(request.node, Measurement(device="cpu", tokens_per_step=1, steps_per_round=1, tokens_per_s=1e3,
                                         peak_allocated_bytes=3 * 2**20, loss=1.0), model="trivial",
               recipe="trivial", precision="fp32", estimate=None)
"""
TIME_STATS = ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3", "ld15iqr", "hd15iqr", "total")


def test_benchmark_compare_fail_prints_the_end_table_and_a_line_per_regression(tmp_path: Path) -> None:
    # a tiny project with the repo's conftest: save a run, make the saved run 1000x faster, compare against it (the
    # two runs are timed apart on a shared machine: a factor of 10 needed the first run's median under 9.5x the
    # second's; no load stretches 20 rounds of ~70 µs 950-fold)
    # (importlib: its conftest and test module load under names of their own, beside this checkout's)
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text())
    (tmp_path / "test_trivial.py").write_text(TRIVIAL_BENCH)
    tiny = ["-p", "no:cacheprovider", "--import-mode=importlib", str(tmp_path)]
    run_pytest(tmp_path, *tiny, "--benchmark-autosave").assert_outcomes(passed=1)
    [saved] = tmp_path.glob(".benchmarks/*/*/0001_*.json")  # .benchmarks/<device>/<machine>/: per device
    data = json.loads(saved.read_text())
    for bench in data["benchmarks"]:
        bench["stats"].update({k: bench["stats"][k] / 1000 for k in TIME_STATS})
        bench["stats"]["ops"] *= 1000
    saved.write_text(json.dumps(data))

    result = run_pytest(tmp_path, *tiny, "--benchmark-compare", "--benchmark-compare-fail=median:5%")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "Traceback" not in output and "PerformanceRegression" not in output
    result.stdout.fnmatch_lines(
        [
            "*= gptcore benchmark gate =*",
            "*case*tok/s*peak*verdict*",
            "*test_trivial*3.00 MiB*no baseline*",
            "FAIL: test_trivial (0001_*): Field 'median' has failed PercentageRegressionCheck: * > 5.000000000",
            "*1 passed*",
        ]
    )


def _assert_usage_error(result: pytest.RunResult, *fragments: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


def test_corrupt_json_is_a_clear_error(run) -> None:
    _assert_usage_error(run('{"schema_version": 1, '), "cpu.json: not valid JSON")


def test_unknown_schema_version_is_a_clear_error(run, recorded: dict) -> None:
    _assert_usage_error(run({**recorded, "schema_version": 99}), "cpu.json: schema_version: unknown 99")


def test_another_devices_file_is_a_clear_error(run, recorded: dict) -> None:
    other = {**recorded, "device": {"slug": "nvidia-h100-80gb-hbm3", "name": "NVIDIA H100 80GB HBM3", "type": "cuda"}}
    _assert_usage_error(run(other), "cpu.json: device.slug:", "'NVIDIA H100 80GB HBM3'", "this run is on 'cpu'")


def test_missing_field_is_a_clear_error_naming_it(run, recorded: dict) -> None:
    broken = copy.deepcopy(recorded)
    del entry(broken)["loss"]
    _assert_usage_error(run(broken), f"benchmarks['{CASE}']: loss: missing")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_require_gpu_without_cuda_fails_at_once(run) -> None:
    _assert_usage_error(run(None, "--require-gpu"), "--require-gpu: CUDA is not available")


def test_a_baselines_dir_that_does_not_exist_stops_the_run_before_the_first_case(run, tmp_path: Path) -> None:
    # a misspelt folder would read "no baseline" for every case and pass: it is one line and pytest's usage exit
    missing = tmp_path / "no-such-baselines"
    result = run(None, "--baselines-dir", str(missing))
    _assert_usage_error(
        result, f"--baselines-dir {missing}: no such folder (record into a new one with --update-baselines)"
    )
    assert "passed" not in result.stdout.str() and not missing.exists()


def test_a_results_log_that_cannot_be_written_stops_the_run_before_the_first_case(run) -> None:
    result = run(None, "--results-log", "/proc/nope/x.jsonl")
    _assert_usage_error(result, "--results-log /proc/nope/x.jsonl: cannot create its folder")
    assert "passed" not in result.stdout.str()


def test_a_verdict_file_that_cannot_be_written_stops_the_run_before_the_first_case(run, tmp_path: Path) -> None:
    # written at the end: a run must not pass and then lose its verdict
    result = run(None, "--gate-markdown", str(tmp_path))
    _assert_usage_error(result, f"--gate-markdown {tmp_path}: is a folder; give a file this run can write")
    assert "passed" not in result.stdout.str()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--mem-tol", "nan"), "--mem-tol: nan is out of range"),  # NaN passes every figure: the gate off
        (("--speed-tol", "nan"), "--speed-tol: nan is out of range"),
        (("--busy-tol", "1.5"), "--busy-tol: 1.5 is out of range"),  # above 1: a kernel time that doubled passes
        (("--loss-tol", "inf"), "--loss-tol: inf is out of range"),
        (("--bench-rounds", "0"), "--bench-rounds: 0 is out of range (at least 1)"),
        (("--bench-steps", "0"), "--bench-steps: 0 is out of range (at least 1)"),
        (("--bench-warmup", "-1"), "--bench-warmup: -1 is out of range (at least 0)"),
        (("--deadline", "nan"), "--deadline: nan is not a positive number of seconds"),
        (("--bench-threads", "0"), "--bench-threads: 0 is out of range (at least 1)"),
        # recording the losses alone and recording whole entries are two runs: together one would undo the other
        (("--update-baselines", "--update-loss-references"), "--update-baselines and --update-loss-references: choose"),
    ],
)
def test_an_option_out_of_range_stops_the_run_before_the_first_case(run, args, message) -> None:
    result = run(None, *args)
    _assert_usage_error(result, message)
    assert "passed" not in result.stdout.str()


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [(THREADS_ENV, "two", "is not a whole number"), ("GPTCORE_DEADLINE", "soon", "is not a number of seconds")],
)
def test_an_options_variable_that_is_not_its_kind_stops_the_run_in_one_line(variable, value, line) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *QUICK, "--collect-only"],
        cwd=ROOT,
        env=child_env() | {variable: value},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout[-2000:]
    assert f"${variable}: {value!r} {line}" in done.stderr and "Traceback" not in done.stderr


def test_bench_threads_runs_the_cpu_cases_on_its_threads_and_says_it_under_the_table(run, tmp_path) -> None:
    out = tmp_path / "run.json"
    result = run(None, "--bench-threads", "2", f"--benchmark-json={out}")
    assert result.ret == 0, result.stdout.str()
    (case,) = json.loads(out.read_text())["benchmarks"]
    assert case["extra_info"]["threads"] == 2
    assert "--bench-threads 2: the single-process CPU cases ran on" not in result.stdout.str()  # the studies' own
    result = run(None, "--bench-threads", "1", f"--benchmark-json={out}")
    (case,) = json.loads(out.read_text())["benchmarks"]
    assert case["extra_info"]["threads"] == 1
    said = "--bench-threads 1: the single-process CPU cases ran on 1 thread(s), their baselines on 2"
    assert said in result.stdout.str()


def test_each_tolerance_option_sets_the_tolerances_it_names(tmp_path: Path) -> None:
    """--loss-tol is every loss tolerance: fp32 and autocast, this CPU model's and another's (a run on another CPU
    model is held to its own bound); each option sets fields that Tolerances has, so none is dropped unread."""
    from gptcore.gate.schema import Tolerances
    from gptcore.plugin.start import gate_from_config

    given = {"mem_tol": 0.1, "speed_tol": 0.2, "busy_tol": 0.3, "loss_tol": 0.4, "baselines_dir": str(tmp_path)}
    config = SimpleNamespace(
        getoption=lambda name: given.get(name), invocation_params=SimpleNamespace(args=()), rootpath=tmp_path
    )
    overrides = gate_from_config(config, []).overrides
    assert overrides == {
        "memory": 0.1,
        "speed": 0.2,
        "gpu_busy": 0.3,
        "loss": 0.4,
        "loss_amp": 0.4,
        "loss_other_cpu": 0.4,
        "loss_amp_other_cpu": 0.4,
    }
    assert set(overrides) <= {f.name for f in dataclasses.fields(Tolerances)}


def test_a_baseline_file_that_is_not_text_is_a_clear_error(run, tmp_path: Path) -> None:
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "cpu.json").write_bytes(b"\xff\xfe{}")
    _assert_usage_error(run(None), "cpu.json: not a baseline file (not UTF-8 text)")


PLANTED_MLP = """
import torch
import gptcore.training.model as model

_init = model.GPT.__init__


def _planted(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    mlp = self.transformer.h[0].mlp

    def forward(x):
        h = mlp.gelu(mlp.c_fc(x))
        {line}  # planted in block 0's MLP; exact, the numbers do not change
        return mlp.dropout(mlp.c_proj(h))
    mlp.forward = forward




def pytest_configure(config):
    model.GPT.__init__ = _planted


def pytest_unconfigure(config):  # a run inside the test process leaves the model as it found it
    model.GPT.__init__ = _init
"""


def test_an_extra_matmul_planted_in_a_copy_fails_the_cpu_tier_on_flops(run, recorded: dict, plant) -> None:
    # the plant is a plugin of that run only (-p), patching the model while it runs: gptcore is untouched
    result = run(recorded, *plant("matmul", "h = h @ torch.eye(h.size(-1), dtype=h.dtype)"))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{CASE_GLOB}: *flops +*(forward +*, backward +*)*"])
    assert "loss" not in result.stdout.str().split("FAIL:", 1)[1].splitlines()[0]  # the numbers did not move


@pytest.fixture
def plant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """plant(name, line) -> the -p option that runs the benchmark with ``line`` added to block 0's MLP forward."""
    monkeypatch.syspath_prepend(tmp_path)
    names = []

    def _plant(name: str, line: str) -> list[str]:
        names.append(f"plant_{name}")
        (tmp_path / f"{names[-1]}.py").write_text(PLANTED_MLP.replace("{line}", line))
        return ["-p", names[-1]]

    yield _plant
    for name in names:  # a later plant of the same name is read afresh
        sys.modules.pop(name, None)


def test_a_step_that_keeps_a_tensor_each_time_fails_as_a_leak_with_or_without_a_baseline(run, recorded, plant) -> None:
    # planted: block 0's MLP keeps the 4-byte sum of its output at every forward (logging gone wrong); the peak of
    # the first steps moves by bytes, well inside its 2%, and one step's ledger cannot see what outlives it
    leak = plant("leak", 'mlp.__dict__.setdefault("kept", []).append(h.detach().sum())')
    line = f"*{CASE_GLOB}: *kept per step +8 B (the second step left 8 B more allocated than the first*"
    for baseline in (recorded, None):  # checkpointing runs block 0's forward twice a step: 8 B
        result = run(baseline, *leak)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([line])


def test_an_extra_clone_is_named_in_the_failure_line_with_its_count(run, recorded: dict, plant) -> None:
    result = run(recorded, *plant("clone", "h = torch.ops.aten.clone(h)"))
    result.assert_outcomes(failed=1)
    # one clone a forward, and checkpointing runs block 0's forward again in backward: 2 calls, 2 new storages
    result.stdout.fnmatch_lines(
        [f"*{CASE_GLOB}: op calls +2 (aten.clone +2) (*forward +1, backward +1*", "*allocations +2 (aten.clone +2)*"]
    )


def test_a_removed_operator_fails_as_leaner_under_strict_and_passes_with_a_note_without(run, plant, tmp_path) -> None:
    # the baseline is recorded with one more operator (aten.alias, a view: no storage, no arithmetic), and the
    # run is the unchanged model: an operator removed since the baseline
    where = tmp_path / "baselines"
    recorded = run(None, "--update-baselines", *plant("alias", "h = torch.ops.aten.alias(h)"))
    recorded.assert_outcomes(passed=1)
    base = json.loads((where / "cpu.json").read_text())
    assert base["benchmarks"][CASE]["work"]["ops"]["forward"]["aten.alias.default"] >= 1
    strict = run(base, "--baseline-strict")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(
        [
            f"*{CASE_GLOB}: op calls -2 (aten.alias -2) (leaner than the baseline: *; "
            "refresh with --update-baselines if the change meant it)*",
            "*1 case(s) leaner than the baseline; refresh exactly those with: python -m pytest*",
        ]
    )
    lenient = run(base)
    lenient.assert_outcomes(passed=1)
    # the operator is gone from both phases that ran it (checkpointing runs block 0's forward again in backward)
    lenient.stdout.fnmatch_lines(
        [
            "*ok (refresh the baseline: op calls -2 (aten.alias -2); "
            "operators: forward: aten.alias (1) gone; backward: aten.alias (1) gone)*"
        ]
    )


# -- unit tests of gptcore.gate.baselines ------------------------------------------------------------------------------

BASE = Entry(
    tokens_per_s=1000.0,
    tokens_per_s_iqr=10.0,
    peak_allocated_bytes=1_000_000,
    peak_reserved_bytes=None,
    loss=2.5,
    loss_step=10,
    precision="fp32",
    cpu_model="CPU A",
)
GPU, CPU = Tolerances.default_for("cuda"), Tolerances.default_for("cpu")


def measured(**fields) -> Entry:
    return Entry(**{**BASE.__dict__, **fields})


def status(verdict: verdicts.Verdict, metric: str) -> str:
    return next(c.status for c in verdict.checks if c.metric == metric)


def test_a_memory_failure_names_the_categories_that_moved() -> None:
    mib = 2**20
    before = {"parameters": 4 * mib, "activations": 16 * mib, "gradients": 4 * mib}
    base = dataclasses.replace(BASE, peak_allocated_bytes=24 * mib, peak_by_category=before)
    # CPU: the tracker's breakdown
    now = measured(peak_allocated_bytes=40 * mib, peak_by_category=before | {"activations": 32 * mib})
    verdict = verdict_of("c", now, base, CPU)
    assert "activations +16.00 MiB, everything else =" in verdict.failure_message()
    # GPU: no tracker categories; the estimate's breakdown says where
    base_gpu = dataclasses.replace(base, peak_by_category=None, estimate_by_category=before)
    now_gpu = measured(
        peak_allocated_bytes=40 * mib, estimate_by_category=before | {"gradients": 0, "activations": 36 * mib}
    )
    message = verdict_of("c", now_gpu, base_gpu, GPU).failure_message()
    assert "estimate: activations +20.00 MiB, gradients -4.00 MiB, everything else =" in message
    # nothing to say without both breakdowns, and nothing said when memory passes
    assert ";" not in verdict_of("c", measured(peak_allocated_bytes=40 * mib), base_gpu, GPU).failure_message()
    assert "everything else" not in str(verdict_of("c", measured(peak_allocated_bytes=24 * mib), base, CPU).checks)


def test_a_breakdown_round_trips_through_the_baseline_file(tmp_path: Path) -> None:
    entry = measured(peak_by_category={"activations": 3}, estimate_by_category={"activations": 4})
    baselines.update(tmp_path / "cpu.json", "cpu", {"c": entry}, device_name="CPU A", device_type="cpu")
    loaded = baselines.load(tmp_path / "cpu.json", "cpu").entries["c"]
    assert (loaded.peak_by_category, loaded.estimate_by_category) == ({"activations": 3}, {"activations": 4})


@pytest.mark.parametrize(("bytes_", "expected"), [(1_019_000, "ok"), (1_021_000, "FAIL"), (979_000, "better")])
def test_memory_fails_above_2pct_and_leaner_asks_for_a_refresh(bytes_: int, expected: str) -> None:
    verdict = verdict_of("c", measured(peak_allocated_bytes=bytes_), BASE, GPU)
    assert status(verdict, "peak memory") == expected
    if expected == "better":
        assert verdict.summary().startswith("ok (refresh the baseline: peak memory -2.1%")


@pytest.mark.parametrize(("speed", "expected"), [(960.0, "ok"), (940.0, "FAIL"), (1060.0, "better")])
def test_gpu_speed_fails_below_5pct_and_faster_asks_for_a_refresh(speed: float, expected: str) -> None:
    assert status(verdict_of("c", measured(tokens_per_s=speed), BASE, GPU), "tokens/s") == expected


def test_cpu_speed_is_reported_not_gated_unless_asked_for() -> None:
    slow = verdict_of("c", measured(tokens_per_s=100.0), BASE, CPU)  # 10x slower: a busy neighbour, not a verdict
    assert status(slow, "tokens/s") == "not gated" and not slow.failed
    assert "gate it with --speed-tol" in slow.checks[1].note
    forced = dataclasses.replace(CPU, speed=0.05)  # --speed-tol 0.05
    assert status(verdict_of("c", measured(tokens_per_s=900.0), BASE, forced), "tokens/s") == "FAIL"


def test_loss_is_gated_both_ways_by_precision_and_only_at_the_same_step() -> None:
    # one CPU model: fp32 within 1e-6 (repeated runs are bit-identical), bf16 within 5e-4
    assert status(verdict_of("c", measured(loss=2.5 + 5e-7), BASE, CPU), "loss") == "ok"
    assert status(verdict_of("c", measured(loss=2.5 - 3e-6), BASE, CPU), "loss") == "FAIL"  # a small math change
    bf16 = dataclasses.replace(BASE, precision="bf16")
    assert status(verdict_of("c", measured(loss=2.5003, precision="bf16"), bf16, CPU), "loss") == "ok"
    assert status(verdict_of("c", measured(loss=2.501, precision="bf16"), bf16, CPU), "loss") == "FAIL"
    assert status(verdict_of("c", measured(loss=9.0, loss_step=12), BASE, CPU), "loss") == "not gated"


def test_a_baseline_from_another_cpu_model_gets_the_wider_loss_tolerance() -> None:
    other = measured(cpu_model="CPU B", loss=2.5 + 5e-5)  # fp32 moved 2.9e-5 between two CPU models
    verdict = verdict_of("c", other, BASE, CPU)
    loss = next(c for c in verdict.checks if c.metric == "loss")
    assert loss.status == "ok" and "no reference for this CPU model: held to CPU A's" in loss.note
    assert status(verdict_of("c", measured(cpu_model="CPU B", loss=2.5 + 2e-4), BASE, CPU), "loss") == "FAIL"
    bf16 = dataclasses.replace(BASE, precision="bf16")
    assert status(verdict_of("c", measured(cpu_model="CPU B", loss=2.51, precision="bf16"), bf16, CPU), "loss") == "ok"


def test_no_baseline_is_reported_not_failed() -> None:
    verdict = verdict_of("c", BASE, None, GPU)
    assert verdict.missing and not verdict.failed and verdict.summary() == "no baseline"


def test_failure_message_names_case_metric_and_numbers() -> None:
    verdict = verdict_of("test_x[a-b]", measured(peak_allocated_bytes=1_100_000, tokens_per_s=500.0), BASE, GPU)
    message = verdict.failure_message()
    assert message.startswith("test_x[a-b]: peak memory +10.0%")
    assert "tokens/s -50.0%" in message and "1,100,000 B vs 1,000,000 B" in message


def test_end_table_puts_both_peak_columns_in_one_unit() -> None:
    from gptcore.gate.session import Row
    from gptcore.gate.summary import gate_table

    big = measured(peak_allocated_bytes=40 * 2**30)
    rows = [
        Row(
            "a",
            big,
            dataclasses.replace(big, peak_allocated_bytes=39 * 2**30),
            "ok",
            estimate=44 * 2**30,
            status={"peak memory": "ok"},
        ),
        Row("b", measured(peak_allocated_bytes=512 * 2**20), None, "no baseline"),
    ]
    lines = gate_table(rows).splitlines()
    assert "40.00 GiB" in lines[2] and "39.00 GiB" in lines[2] and "+2.6%" in lines[2] and "1.10" in lines[2]
    assert "0.50 GiB" in lines[3] and "—" in lines[3]


def test_end_table_says_where_mfu_flops_come_from_and_what_work_moved() -> None:
    from gptcore.gate.session import Row
    from gptcore.gate.summary import gate_table

    row = Row("a", BASE, BASE, "FAIL: syncs +1", mfu="41.3% (counted)", work="syncs +1")
    line = gate_table([row]).splitlines()[2]
    assert "41.3% (counted)" in line and "syncs +1" in line


def new_gate(directory: Path, **fields):
    """A Gate as a run without options makes it (nothing recorded, no override), ``fields`` over that."""
    from gptcore.gate.session import Gate

    defaults = dict(directory=directory, update=False, strict=False, overrides={}, timing_override=(None,) * 3)
    return Gate(**(defaults | fields))


def disk_full(*args, **kwargs):
    """A write that fails as a full disk does (stands in for any writer: a baseline update, a log's append)."""
    raise OSError(28, "No space left on device")


def judge_case(gate, name: str, *, model: str = "cpu-small", recipe: str | None = None, **measured):
    """Hand the gate the fp32 CPU case ``test_x[name]`` (its recipe ``name`` unless given), one token a step at
    1,000 tokens/s and loss 1.0, with the Measurement's ``measured`` fields over that; its Outcome."""
    from gptcore.measure.measurement import Measurement

    node = SimpleNamespace(name=f"test_x[{name}]", nodeid=f"bench/x.py::test_x[{name}]")
    m = Measurement(**(dict(device="cpu", tokens_per_step=1, steps_per_round=1, tokens_per_s=1e3, loss=1.0) | measured))
    return gate.judge(node, m, model=model, recipe=recipe or name, precision="fp32", estimate=None)


def test_a_recording_run_shows_mfu_too(tmp_path: Path) -> None:
    """The first run on a new GPU records its baselines: its end table is the first place MFU is read (on the
    H200 the recording run's column was empty, and only the second run showed 36.9%)."""
    from types import SimpleNamespace

    gate = new_gate(tmp_path, update=True)
    node = SimpleNamespace(name="test_ladder[gpt2-ladder-8]", nodeid="bench/test_ladder.py::test_ladder[gpt2-ladder-8]")
    gate.judge_entry(node, BASE, "cpu", mfu="36.9% (analytic)")  # the device only names the file: no GPU here
    assert gate.rows[-1].verdict == "recorded" and gate.rows[-1].mfu == "36.9% (analytic)"


@pytest.mark.parametrize(
    ("given", "expected"),
    [((None, None, None), (2, 5, 3)), ((1, None, None), (1, 5, 3)), ((None, 7, None), (2, 7, 3)),
     ((None, None, 4), (2, 5, 4)), ((0, 1, 1), (0, 1, 1))],
)  # fmt: skip
def test_each_timing_option_overrides_its_own_count_and_no_other(tmp_path: Path, given, expected) -> None:
    """--bench-warmup, --bench-rounds and --bench-steps each replace one of a case's (warm-up, rounds, steps per
    round), 0 included; a count not given stays the case's own (2, 5, 3 here)."""
    gate = new_gate(tmp_path, timing_override=given)
    assert gate.timing(2, 5, 3) == expected


def test_the_mfu_cell_says_where_its_flops_come_from_and_is_a_dash_without_an_mfu(tmp_path: Path) -> None:
    gate = new_gate(tmp_path, update=True)
    judge_case(gate, "a", mfu=0.4127, flops_source="counted")
    judge_case(gate, "b")
    assert [row.mfu for row in gate.rows] == ["41.3% (counted)", "—"]


def test_what_an_earlier_case_left_allocated_is_named_under_the_end_table(tmp_path: Path) -> None:
    """The H200's optim-in-bwd-checkpoint after optim-in-bwd: 43,045,451,776 B measured, 20,585,324,544 of them
    left by the case before. Named above 1% of the peak; a few MiB of the CUDA libraries' workspaces are not (the
    gate's rule is the same on every device: "cpu" here only spares the test a GPU)."""
    gate = new_gate(tmp_path, update=True)
    for name, before in (("a", 20_585_324_544), ("b", 33_554_432)):
        judge_case(gate, name, allocated_before=before, peak_allocated_bytes=43_045_451_776)
    assert gate.notes == [
        "test_x[a]: 20,585,324,544 B were still allocated when it began, left by a case before it: its peak "
        "includes them"
    ]


def test_a_case_that_failed_to_run_judges_no_expected_effect(tmp_path: Path) -> None:
    """checkpoint out of memory after fp32 ran: its one failure is its error; no effect is judged on figures it
    never finished measuring, and it is not counted as run."""
    gate = new_gate(tmp_path, update=True)
    assert judge_case(gate, "fp32", peak_allocated_bytes=35_000_000).failures == []
    outcome = judge_case(gate, "checkpoint", peak_allocated_bytes=36_000_000, error="out of memory after 0 steps")
    assert outcome.failures == ["test_x[checkpoint]: out of memory after 0 steps"]
    assert gate.expected.outcomes == [] and list(gate.expected.ran) == [("cpu-small", "fp32", 1, "cpu")]


def test_a_recording_run_counts_under_the_table_the_cases_it_wrote(tmp_path: Path) -> None:
    gate = new_gate(tmp_path, update=True)
    for recipe in ("x", "y"):
        judge_case(gate, recipe, peak_allocated_bytes=35_000_000)
    assert gate.summary_notes() == [f"baselines: recorded 2 case(s) into {tmp_path / 'cpu.json'}, each as it ended"]
    assert sorted(baselines.load(tmp_path / "cpu.json").entries) == ["test_x[x]", "test_x[y]"]


def test_a_baseline_file_that_cannot_be_written_fails_the_case_that_recorded_into_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--update-baselines writes each case as it ends; a write that fails (a full disk, faked) fails that case,
    naming the error, and the run goes on."""

    monkeypatch.setattr(baselines, "update", disk_full)
    gate = new_gate(tmp_path, update=True)
    line = "test_x[fp32]: baselines: NOT written: [Errno 28] No space left on device"
    assert judge_case(gate, "fp32", peak_allocated_bytes=35_000_000).failures == [line] and gate.failures == [line]


def test_a_case_that_failed_is_not_also_told_how_to_record_its_missing_baseline(tmp_path: Path) -> None:
    """No baseline and an unmet expected effect (checkpoint no leaner than fp32): the case fails once, for the
    effect; 'record it with' (and, under --baseline-strict, a failure for the missing baseline) is for cases that
    passed, so that a failing case is not recorded as the baseline."""
    gate = new_gate(tmp_path, strict=True)
    judge_case(gate, "fp32", peak_allocated_bytes=35_000_000)
    outcome = judge_case(gate, "checkpoint", peak_allocated_bytes=35_000_000)
    (line,) = outcome.failures
    assert "expected effect not met" in line and outcome.missing is None


def test_a_figure_not_gated_is_counted_under_the_table_only_where_its_delta_is_shown(tmp_path: Path) -> None:
    """CPU tokens/s is shown in parentheses, not gated: two cases make one line with their count. A check with no
    figure to show (no work ledger on either side) adds no line, and its work cell is '—', not '=' (equal)."""
    baselines.update(tmp_path / "cpu.json", "cpu", {"t[a]": BASE, "t[b]": BASE}, device_name="CPU A", device_type="cpu")
    gate = new_gate(tmp_path, cpu_model="CPU A")
    for name, speed in (("t[a]", 1100.0), ("t[b]", 950.0)):
        verdict = gate.judge_entry(SimpleNamespace(name=name, nodeid=f"x::{name}"), measured(tokens_per_s=speed), "cpu")
        assert status(verdict, "work") == "not gated"  # BASE has no work ledger
        assert gate.rows[-1].work == "—"  # its work cell: nothing compared, so not '='
    assert gate.not_gated == {"tokens/s not gated: reported only on CPU; gate it with --speed-tol": 2}
    assert gate.summary_notes()[0] == (
        "tokens/s not gated: reported only on CPU; gate it with --speed-tol (2 cases; shown in parentheses)"
    )


def test_a_case_read_back_from_a_results_log_keeps_its_logged_cells(tmp_path: Path) -> None:
    """--resume and a merge of shards show a logged case as it was judged: its end-table cells as logged; one that
    failed outside the gate (no cells) by its outcome and the reason it failed."""
    from gptcore.gate.results import Record

    gate = new_gate(tmp_path)
    cells = {"verdict": "FAIL: peak memory", "estimate": 123, "error": None, "status": {"peak memory": "FAIL"}}
    cells |= {"work": "syncs +1", "mfu": "—"}
    logged = Record("x::t[a]", "t[a]", "failed", 1.0, slug="cpu", verdict="FAIL", row=cells, entry=BASE.to_json())
    assert gate.take_record(logged, "log") == BASE
    gate.take_record(Record("x::t[b]", "t[b]", "failed", 1.0, reason="RuntimeError: boom", verdict=None), "log")
    a, b = gate.rows
    assert a.cells() == cells and a.measured == BASE
    assert (b.verdict, b.error, b.measured, b.status) == ("failed", "RuntimeError: boom", None, {})


def test_benchmarks_under_xdist_are_skipped_with_the_reason_and_plain_tests_are_not(monkeypatch) -> None:
    """pytest-benchmark switches itself off under xdist (-n): a benchmark there would measure nothing, so each is
    skipped saying why; a plain test beside it runs."""
    from gptcore.plugin import cases

    marks: dict[str, pytest.MarkDecorator] = {}

    def item(nodeid: str, *fixtures: str) -> SimpleNamespace:
        return SimpleNamespace(
            nodeid=nodeid, fixturenames=fixtures, add_marker=lambda mark: marks.update({nodeid: mark})
        )

    monkeypatch.setattr(cases, "under_xdist", lambda: True)
    cases.preload(None, [item("bench/x.py::test_x[a]", "benchmark", "gate"), item("tests/t.py::test_t", "tmp_path")])
    assert list(marks) == ["bench/x.py::test_x[a]"]
    assert (marks["bench/x.py::test_x[a]"].name, marks["bench/x.py::test_x[a]"].kwargs) == (
        "skip",
        {"reason": "pytest-benchmark is disabled under xdist: run bench/ without -n"},
    )


def test_slug_of_a_cuda_device_name() -> None:
    """Lowercase, each run of other characters one '-', none at either end (no 'nvidia-gh200-480gb-.json')."""
    assert identity.slugify("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert identity.slugify(" NVIDIA GH200 (480GB) ") == "nvidia-gh200-480gb"
    assert identity.slugify("NVIDIA A100-SXM4-40GB") == "nvidia-a100-sxm4-40gb"
    assert identity.device_slug("cpu") == "cpu"


def test_a_gpu_is_named_by_its_own_index_and_its_driver_read_from_nvidia_smi(tmp_path: Path, monkeypatch) -> None:
    """GPU paths with torch's CUDA calls and nvidia-smi faked: cuda:1 is named after GPU 1, not GPU 0; the driver is
    the first GPU's line of nvidia-smi (one line per GPU), None without nvidia-smi or when it fails (no driver
    loaded); a CPU recording names no driver and does not ask for one."""
    import torch

    names = {0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA H200"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: names[torch.device(device).index or 0])
    assert (identity.device_slug("cuda:1"), identity.device_name("cuda:1")) == ("nvidia-h200", "NVIDIA H200")
    assert (identity.device_slug("cuda"), identity.device_name("cuda")) == ("nvidia-h100-80gb-hbm3", names[0])
    assert (identity.device_slug("cpu"), identity.device_name("cpu")) == ("cpu", "CPU")

    smi = tmp_path / "nvidia-smi"
    monkeypatch.setenv("PATH", str(tmp_path))
    assert identity.driver_version() is None  # no nvidia-smi
    smi.write_text("#!/bin/sh\nprintf '570.86.15\\n570.86.16\\n'\n")
    smi.chmod(0o755)
    assert identity.driver_version() == "570.86.15"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver'\nexit 9\n")
    assert identity.driver_version() is None
    monkeypatch.setattr(identity, "driver_version", lambda: "570.86.15")
    assert identity.recording("cuda")["driver"] == "570.86.15" and identity.recording("cuda")["device_name"] == names[0]
    monkeypatch.setattr(identity, "driver_version", lambda: pytest.fail("a CPU recording asked for a driver"))
    assert identity.recording("cpu") == {
        "device_name": "CPU",
        "device_type": "cpu",
        "torch_version": torch.__version__,
        "cuda": torch.version.cuda,  # None in a CPU build; the build's CUDA in a CUDA one, GPU or not
        "driver": None,
    }


def _write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data))


def test_update_rewrites_only_the_cases_that_ran_and_keeps_tolerances(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    baselines.update(path, "cpu", {"a": BASE, "b": BASE}, device_name="CPU A", device_type="cpu")
    data = json.loads(path.read_text())
    data["tolerances"]["memory"] = 0.01
    _write(path, data)
    baselines.update(path, "cpu", {"b": measured(loss=3.0), "c": BASE}, device_name="CPU A", device_type="cpu")
    file = baselines.load(path, expect_slug="cpu")
    assert sorted(file.entries) == ["a", "b", "c"]
    assert file.entries["a"].loss == 2.5 and file.entries["b"].loss == 3.0
    assert file.tolerances.memory == 0.01
    assert [p.name for p in tmp_path.iterdir()] == ["cpu.json"]  # no temp file left behind


def test_a_study_is_judged_by_its_own_tolerances_and_recording_keeps_them(tmp_path: Path) -> None:
    """tolerances_by_test: the cases of a study with its own noise evidence (by its test function) are held to its
    tolerances, every other case to the file's; --update-baselines rewrites entries and keeps both."""
    path = tmp_path / "cpu.json"
    names = ("test_noisy[a]", "test_steady[a]", "test_other[a]")
    baselines.update(path, "cpu", dict.fromkeys(names, BASE), device_name="CPU A", device_type="cpu")
    data = json.loads(path.read_text())
    data["tolerances"].update(memory=0.02)
    data["tolerances_by_test"] = {"test_noisy": {"memory": 0.2}, "test_steady": {"memory": 0.001, "loss": 0.5}}
    _write(path, data)
    file = baselines.load(path, expect_slug="cpu")
    fatter = measured(peak_allocated_bytes=int(BASE.peak_allocated_bytes * 1.1))  # +10%
    verdicts = {name: verdict_of(name, fatter, file.entries[name], file.tolerances_for(name)) for name in names}
    assert not verdicts["test_noisy[a]"].failed  # within its own 20%
    assert verdicts["test_steady[a]"].failed and verdicts["test_other[a]"].failed  # its own 0.1%; the file's 2%
    assert file.tolerances_for("test_steady[a]").loss == 0.5 and file.tolerances_for("test_other[a]").loss == 1e-6
    assert file.tolerances_for("test_steady[a]").speed is None  # the fields it does not name are the file's
    gate = new_gate(tmp_path)
    for name in names:  # the gate judges each case by the tolerances its file holds for it
        node = SimpleNamespace(name=name, nodeid=f"bench/x.py::{name}")
        assert gate.judge_entry(node, fatter, "cpu").failed == verdicts[name].failed
    assert gate.tolerances(file, "cpu", "test_noisy[a]").memory == 0.2
    assert gate.tolerances(None, "cpu", "test_noisy[a]") == CPU  # no file: the device type's defaults
    gate.overrides = {"memory": 0.5}  # --memory-tol: over the study's own
    assert gate.tolerances(file, "cpu", "test_steady[a]").memory == 0.5
    baselines.update(path, "cpu", {"test_noisy[a]": measured(loss=3.0)}, device_name="CPU A", device_type="cpu")
    assert json.loads(path.read_text())["tolerances_by_test"] == data["tolerances_by_test"]


def test_a_failed_cases_report_keeps_warnings_and_drops_torchs_debug_trace(tmp_path: Path) -> None:
    """pyproject's log_level: torch.compile's structured trace (the torch.__trace logger) writes empty DEBUG
    records by the hundred; a failed case's report keeps WARNING and up, so the failure stays readable."""
    (tmp_path / "test_logs.py").write_text(
        "import logging\n"
        "def test_fails():\n"
        "    trace = logging.getLogger('torch.__trace')\n"
        "    trace.setLevel(logging.DEBUG)\n"  # as torch sets its trace logger
        "    trace.debug('%s-%s', 'trace', 'record')\n"  # the text only in the log, not in the source shown
        "    logging.getLogger('gptcore').warning('%s-%s', 'kept', 'warning')\n"
        "    assert False\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            str(tmp_path / "test_logs.py"),
        ],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "kept-warning" in done.stdout and "trace-record" not in done.stdout


def test_a_tolerance_under_ten_percent_reads_as_measured_not_rounded_away() -> None:
    """The H200's tolerances (3.4% tokens/s, 0.5% memory) are written as such in the failure notes, not as the
    '3%' and '0%' that a whole-percent format makes of them."""
    from gptcore.gate.checks import memory_check, speed_check

    tol = dataclasses.replace(GPU, speed=0.034, memory=0.005)
    assert speed_check(900.0, 1000.0, tol).note.endswith("tolerance -3.4%")
    assert memory_check(1_010_000, 1_000_000, tol).note.endswith("tolerance +0.5%")
    assert speed_check(900.0, 1000.0, dataclasses.replace(tol, speed=0.17)).note.endswith("tolerance -17%")


def test_a_failed_write_leaves_the_old_file_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cpu.json"
    baselines.update(path, "cpu", {"a": BASE}, device_name="CPU A", device_type="cpu")
    before = path.read_text()

    def fail(*_):
        raise OSError("disk full")

    monkeypatch.setattr(baselines.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        baselines.update(path, "cpu", {"a": measured(loss=9.0)}, device_name="CPU A", device_type="cpu")
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["cpu.json"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("benchmarks"), "benchmarks: missing"),
        (lambda d: d["device"].pop("slug"), "device.slug: missing"),
        (lambda d: d["benchmarks"]["a"]["tokens_per_s"].update(median="fast"), "benchmarks['a']: tokens_per_s.median"),
        (lambda d: d["benchmarks"]["a"].update(peak_allocated_bytes=1.5), "peak_allocated_bytes: expected int"),
        (lambda d: d["tolerances"].update(memroy=0.1), "tolerances.memroy: unknown field"),
        (lambda d: d["tolerances"].update(speed=2), "tolerances.speed: must be in [0, 1]"),
        # NaN compares false with every bound: it would pass every figure, the gate off without a word
        (lambda d: d["tolerances"].update(memory=float("nan")), "tolerances.memory: must be a finite number >= 0"),
        # and infinity passes every figure too (json reads "Infinity")
        (lambda d: d["tolerances"].update(work=float("inf")), "tolerances.work: must be a finite number >= 0"),
        (lambda d: d.update(tolerances_by_test={"test_x": {"sped": 0.1}}), "tolerances_by_test.test_x.sped: unknown"),
        (lambda d: d.update(tolerances_by_test={"test_x": {"loss": -1}}), "tolerances_by_test.test_x.loss: must be"),
        (lambda d: d.update(tolerances_by_test={"test_x": 0.1}), "tolerances_by_test: must be an object of objects"),
    ],
)
def test_validation_errors_name_the_file_and_the_field(tmp_path: Path, mutate, message: str) -> None:
    path = tmp_path / "cpu.json"
    baselines.update(path, "cpu", {"a": BASE}, device_name="CPU A", device_type="cpu")
    data = json.loads(path.read_text())
    mutate(data)
    _write(path, data)
    with pytest.raises(BaselineError) as err:
        baselines.load(path, expect_slug="cpu")
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def test_a_missing_file_loads_as_none(tmp_path: Path) -> None:
    assert baselines.load(tmp_path / "cpu.json", expect_slug="cpu") is None


@pytest.mark.parametrize(
    ("field", "value", "metric", "note"),
    [
        ("loss", float("nan"), "loss", "the loss is NaN (the run diverged)"),
        ("loss", float("inf"), "loss", "the loss is +inf (the run diverged)"),
        ("tokens_per_s", float("nan"), "tokens/s", "tokens/s is NaN (the timing broke)"),
    ],
)
def test_a_figure_that_is_not_finite_fails_naming_itself_and_the_end_table_still_renders(field, value, metric, note):
    from gptcore.gate.session import Row
    from gptcore.gate.summary import gate_table

    now = measured(**{field: value})
    verdict = verdict_of("c", now, BASE, CPU)  # a NaN compares false with any bound: it must not read as ok
    check = next(c for c in verdict.checks if c.metric == metric)
    assert verdict.failed and check.status == "FAIL" and check.note == note
    assert verdict.summary() == f"FAIL: {metric}" and note in verdict.failure_message()
    table = gate_table(
        [Row("test_x[c]", now, BASE, verdict.summary(), status={c.metric: c.status for c in verdict.checks})]
    )
    assert f"FAIL: {metric}" in table.splitlines()[-1]
    assert not verdict_of("c", BASE, now, CPU).failed  # a baseline that is not finite compares with nothing


@pytest.mark.parametrize(
    ("loss", "speed", "said"),
    [
        (float("nan"), 1e3, "the loss is NaN"),
        (2.5, float("inf"), "tokens/s is +inf"),
        (float("-inf"), float("nan"), "the loss is -inf and tokens/s is NaN"),
    ],
)
def test_a_loss_or_speed_not_finite_is_never_recorded_and_fails_the_case_naming_each(
    tmp_path: Path, loss, speed, said
) -> None:
    """A loss or a tokens/s that is not finite (a diverged run, a broken timing) fails the case, naming each."""
    gate = new_gate(tmp_path, update=True)
    case = dict(model="tiny", recipe="fp32", tokens_per_s=speed, peak_allocated_bytes=3, loss=loss)
    outcome = judge_case(gate, "tiny-fp32", **case)
    assert outcome.failures == [
        f"test_x[tiny-fp32]: {said} (the run diverged or its timing broke): nothing recorded or compared"
    ]
    assert gate.rows[-1].verdict == "FAIL: not finite" and not (tmp_path / "cpu.json").exists()


# -- the end of a session (gptcore.plugin.end), its pytest objects faked ---------------------------------------------


def ended(gate, exitstatus: pytest.ExitCode, regressions: list[tuple[str, str]] | None = None):
    """A session whose gate and pytest-benchmark session are ``gate`` and ``regressions``, finished with
    ``exitstatus``: its exit status after the gate's finish."""
    from gptcore.plugin import end
    from gptcore.plugin.options import GATE

    config = SimpleNamespace(
        stash=pytest.Stash(), _benchmarksession=SimpleNamespace(performance_regressions=regressions)
    )
    config.stash[GATE] = gate
    session = SimpleNamespace(config=config, exitstatus=exitstatus)
    end.finish(session)
    return session.exitstatus


def test_the_end_fails_a_run_whose_baselines_were_not_written_or_that_a_compare_fail_or_a_resumed_case_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each fails a run whose tests passed, and a run that ended otherwise keeps its own status; a resumed run with
    nothing left to run (pytest: no tests collected) is the result of the cases it resumed."""
    OK, FAILED, EMPTY = pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED
    assert ended(new_gate(tmp_path), OK) == OK and ended(new_gate(tmp_path), EMPTY) == EMPTY

    monkeypatch.setattr(baselines, "update", disk_full)
    unwritten = new_gate(tmp_path, pending={"cpu": {"test_x[a]": BASE}})
    assert ended(unwritten, OK) == FAILED
    assert unwritten.notes == ["baselines: NOT written: [Errno 28] No space left on device"]
    slower = [("test_x[a] (0001_abc)", "Field 'median' has failed PercentageRegressionCheck: 12.3% > 5%")]
    compared = new_gate(tmp_path)
    assert ended(compared, OK, slower) == FAILED and ended(new_gate(tmp_path), OK, []) == OK
    assert compared.regressions == [f"FAIL: {slower[0][0]}: {slower[0][1]}"]
    assert ended(new_gate(tmp_path), pytest.ExitCode.INTERRUPTED, slower) == pytest.ExitCode.INTERRUPTED
    assert ended(new_gate(tmp_path, resumed=["test_x[a]"]), EMPTY) == OK
    assert ended(new_gate(tmp_path, resumed=["test_x[a]"], resumed_failed=True), EMPTY) == FAILED
    assert ended(new_gate(tmp_path, resumed_failed=True), OK) == FAILED


def test_the_end_section_shows_notes_alone_marks_failures_red_and_says_where_its_markdown_could_not_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Notes without a case (a deadline that started none) still make the section, without a markdown verdict; a
    failing line is red; the verdict goes to --gate-markdown and is appended to $GITHUB_STEP_SUMMARY, and --gate-history
    adds the history's section to it; a path that cannot be written is one red line, and the run goes on."""
    from gptcore.plugin import end
    from gptcore.plugin.options import GATE

    written: list[tuple[str, bool]] = []
    reporter = SimpleNamespace(
        section=lambda title: written.append((f"== {title}", False)),
        write_line=lambda line, red=False: written.append((line, red)),
    )

    def summary(gate, history: bool = False) -> None:
        options = SimpleNamespace(benchmark_storage=str(tmp_path / "no-runs"))
        config = SimpleNamespace(stash=pytest.Stash(), option=options, getoption=lambda name: history)
        config.stash[GATE] = gate
        written.clear()
        end.write_summary(reporter, config)

    waiting = new_gate(tmp_path, markdown=tmp_path / "alone.md", not_started=["test_x[b]"])
    summary(waiting)
    assert written == [("== gptcore benchmark gate", False), ("deadline: 1 case(s) not started: test_x[b]", False)]
    assert not (tmp_path / "alone.md").exists()

    step_summary = tmp_path / "step-summary.md"
    step_summary.write_text("an earlier step's summary\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    gate = new_gate(tmp_path, markdown=tmp_path / "gate.md", regressions=["FAIL: test_x[a] (0001): slower"])
    judge_case(gate, "a", peak_allocated_bytes=35_000_000)
    summary(gate, history=True)
    assert written[-1] == ("FAIL: test_x[a] (0001): slower", True) and not any(red for _, red in written[:-1])
    verdict = (tmp_path / "gate.md").read_text()
    assert verdict.startswith("## gptcore benchmark gate: FAIL: 1 failure(s) (1 case)")
    assert f"Not analysed: {tmp_path / 'no-runs'}: no such directory" in verdict
    assert step_summary.read_text() == "an earlier step's summary\n" + verdict

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    gate.markdown = blocked / "gate.md"
    summary(gate)
    (line, red), *_ = [(line, red) for line, red in written if line.startswith("gate markdown")]
    assert line.startswith(f"gate markdown: NOT written to {blocked / 'gate.md'}: [Errno 20] Not a directory") and red
    again = step_summary.read_text().split(verdict, 1)[1]  # still appended there, without --gate-history's section
    assert again.startswith("## gptcore benchmark gate: FAIL") and "Change points in history" not in again
