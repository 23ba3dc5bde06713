"""scripts/gpu_noise.py: the run-to-run change of each figure between two runs' results logs, and the tolerances
its rule gives (synthetic logs: the arithmetic is what is checked here; a GPU session feeds it real ones)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gptcore.gate import results
from scripts.gpu_noise import by_test, compare, measured, round_up, summary, tolerances_of
from tests.test_gate import ROOT, child_env
from tests.test_plan import gpu_session

pytestmark = pytest.mark.cpu


def entry(tokens: float, iqr: float, peak: int, loss: float, precision: str = "bf16") -> dict:
    return {
        "tokens_per_s": {"median": tokens, "iqr": iqr},
        "peak_allocated_bytes": peak,
        "loss": {"value": loss, "step": 10},
        "precision": precision,
    }


def write(path, entries: dict[str, dict | None], outcome: str = "passed", slug: str | None = None) -> None:
    log = results.ResultsLog(path)
    for name, e in entries.items():
        record = results.Record(nodeid=f"bench/x.py::{name}", name=name, outcome=outcome, seconds=1.0, entry=e)
        record.slug = slug
        log.write(record)


FIRST = {
    "a": entry(100_000, 1_000, 1 << 30, 3.0, "fp32"),
    "b": entry(200_000, 1_000, 1 << 30, 3.0),
    "c": entry(50_000, 500, 2 << 30, 3.0),
    "oom": None,
}
SECOND = {
    "a": entry(101_000, 2_000, 1 << 30, 3.0, "fp32"),
    "b": entry(198_000, 1_000, 1 << 30, 3.003),
    "c": entry(50_500, 500, (2 << 30) + 1024, 3.0),
    "new": entry(1.0, 0.0, 1, 1.0),
}


def test_round_up_keeps_two_significant_digits_and_never_rounds_down():
    assert round_up(0.01234) == 0.013 and round_up(0.0195) == 0.02 and round_up(0.04) == 0.04
    assert round_up(3.01e-6) == 3.1e-6 and round_up(0.0) == 0.0


def test_the_changes_and_the_tolerances_follow_the_rule(tmp_path):
    write(tmp_path / "one.jsonl", FIRST)
    write(tmp_path / "two.jsonl", SECOND)
    cases = compare(measured([tmp_path / "one.jsonl"]), measured([tmp_path / "two.jsonl"]))
    assert [c.name for c in cases] == ["a", "b", "c"]  # a failed case with no entry, or one run's case: not compared
    a, b, c = cases
    assert a.speed_change == pytest.approx(0.01) and b.speed_change == pytest.approx(-0.01)
    assert c.speed_change == pytest.approx(0.01) and a.iqr_rel == pytest.approx((0.01, 2_000 / 101_000))
    assert (a.memory_change, b.memory_change) == (0.0, 0.0) and c.memory_change == pytest.approx(1024 / (2 << 30))
    assert b.loss_change == pytest.approx(0.003) and a.loss_change == 0.0
    figures = summary(cases)
    # speed: every change is 1%, so sigma is 1%: max(4 x 1%, 2 x 1%) = 4%
    assert figures["speed"]["sigma"] == pytest.approx(0.01) and figures["speed"]["tolerance"] == pytest.approx(0.04)
    assert figures["speed"]["largest_iqr"] == pytest.approx(2_000 / 101_000)
    # memory: 1 KiB on 2 GiB, far under the floor of 0.5%
    assert figures["memory"]["largest"] == pytest.approx(2**-21) and figures["memory"]["tolerance"] == 0.005
    # fp32 loss identical: its floor; bf16 changes 0.003 and 0: sigma 0.003/sqrt(2), max(4 sigma, 2 x 0.003) = 0.0085
    assert figures["loss"]["tolerance"] == 1e-6
    assert figures["loss_amp"]["sigma"] == pytest.approx(0.003 / 2**0.5)
    assert figures["loss_amp"]["tolerance"] == pytest.approx(0.0085)


def test_the_script_writes_the_evidence_and_a_bad_log_is_one_line(tmp_path):
    write(tmp_path / "one.jsonl", FIRST)
    write(tmp_path / "two.jsonl", SECOND)
    out = tmp_path / "noise.json"
    run = subprocess.run(
        [
            sys.executable,
            "scripts/gpu_noise.py",
            str(tmp_path / "one.jsonl"),
            "--against",
            str(tmp_path / "two.jsonl"),
            "--json",
            str(out),
            "--device",
            "test",
        ],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert (
        "3 case(s) measured in both runs; not compared: oom (no figures in the first run, not in the second "
        "run), new (not in the first run)"
    ) in run.stdout
    evidence = json.loads(out.read_text())
    assert evidence["device"] == "test" and [c["name"] for c in evidence["cases"]] == ["a", "b", "c"]
    assert evidence["summary"]["speed"]["tolerance"] == pytest.approx(0.04)
    (tmp_path / "bad.jsonl").write_text("not json\n{}\n")
    bad = subprocess.run(
        [sys.executable, "scripts/gpu_noise.py", str(tmp_path / "bad.jsonl"), "--against", str(tmp_path / "two.jsonl")],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == (
        f"gpu_noise: {tmp_path / 'bad.jsonl'}: line 1: not a JSON line (Expecting value: line 1 column 1 (char 0))"
    )


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        (("tokens_per_s", "median"), "fast", "a: tokens_per_s.median: 'fast' is not a number >= 0"),
        (("tokens_per_s",), [1], "a: tokens_per_s: [1] is not an object"),
        (("loss", "value"), -1, "a: loss.value: -1 is not a number >= 0"),
        (("gpu_kernel_seconds",), {"matmul": "x"}, "a: gpu_kernel_seconds.matmul: 'x' is not a number >= 0"),
        (("precision",), ["bf16"], "a: precision: ['bf16'] is not a name"),
    ],
)
def test_a_figure_of_another_type_is_one_line_naming_the_log_and_a_nan_one_is_not_compared(
    tmp_path, capsys, field, value, said
):
    """Each of these was a traceback in the verify stage's last step (a TypeError, an AttributeError, a NaN turned
    into an integer). A figure that is not a number names the log, the case and the field; a NaN or infinite one
    (a diverged run) leaves the case out as one with no figures; an empty log and an unknown --void-busy name are
    one line too."""
    import copy

    from scripts import gpu_noise

    bad = copy.deepcopy(SECOND)
    target = bad["a"]
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    write(tmp_path / "one.jsonl", FIRST)
    write(tmp_path / "two.jsonl", bad)
    argv = [str(tmp_path / "one.jsonl"), "--against", str(tmp_path / "two.jsonl")]
    assert gpu_noise.main(argv) == 2
    assert capsys.readouterr().err == f"gpu_noise: {tmp_path / 'two.jsonl'}: {said}\n"
    for odd in (float("nan"), float("inf")):
        bad = copy.deepcopy(SECOND)
        bad["a"]["tokens_per_s"]["median"] = odd
        write(tmp_path / "odd.jsonl", bad)
        assert gpu_noise.main([argv[0], "--against", str(tmp_path / "odd.jsonl")]) == 0
        said = "2 case(s) measured in both runs; not compared: a (no figures in the second run), oom ("
        assert said in capsys.readouterr().out
        (tmp_path / "odd.jsonl").unlink()
    (tmp_path / "empty.jsonl").write_text("")
    assert gpu_noise.main([argv[0], "--against", str(tmp_path / "empty.jsonl")]) == 2
    assert capsys.readouterr().err == f"gpu_noise: {tmp_path / 'empty.jsonl'}: no case in the log(s)\n"
    assert gpu_noise.main([*argv[:2], str(tmp_path / "one.jsonl"), "--void-busy", "nonsense"]) == 2
    assert capsys.readouterr().err == "gpu_noise: --void-busy nonsense: no such case or study in the logs\n"


def test_runs_of_two_devices_are_refused_in_one_line(tmp_path, capsys):
    """Two hosts of one device type give the noise a tolerance must hold; a CPU run against an H200's gives none."""
    from scripts import gpu_noise

    write(tmp_path / "one.jsonl", FIRST, slug="cpu")
    write(tmp_path / "two.jsonl", SECOND, slug="nvidia-h200")
    assert gpu_noise.main([str(tmp_path / "one.jsonl"), "--against", str(tmp_path / "two.jsonl")]) == 2
    captured = capsys.readouterr()
    assert captured.err == "gpu_noise: the runs are of different devices: cpu, against nvidia-h200\n"
    assert captured.out == ""
    write(tmp_path / "three.jsonl", SECOND, slug="cpu")
    assert gpu_noise.main([str(tmp_path / "one.jsonl"), "--against", str(tmp_path / "three.jsonl")]) == 0


def test_the_verify_stage_ends_with_the_noise_of_the_recording_run_and_itself(tmp_path):
    import time

    out = tmp_path / "out"
    out.mkdir()
    write(out / "ladder.jsonl", FIRST)  # the recording run's log, from an earlier job
    write(out / "verify.jsonl", SECOND)  # verify's own, from an earlier job: this one has no time left to run it
    run = gpu_session(["verify", str(out)], GPTCORE_JOB_END=str(int(time.time()) + 30))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "stage verify not started" in run.stdout and "3 case(s) measured in both runs" in run.stdout
    evidence = json.loads((out / "noise.json").read_text())
    assert evidence["first"] == [str(out / "ladder.jsonl")] and evidence["second"] == [str(out / "verify.jsonl")]
    assert evidence["summary"]["speed"]["tolerance"] == pytest.approx(0.04)


def test_each_study_gets_the_rule_over_its_own_cases_and_the_file_the_rule_over_all():
    """Two studies of unlike noise: the steady one keeps a tight tolerance of its own, the noisy one a wide one; the
    file's (for a study with no evidence) is the rule over every case."""
    steady = {f"test_steady[{i}]": entry(100_000, 100, 1 << 30, 3.0, "fp32") for i in range(4)}
    noisy = {"test_noisy[a]": entry(100_000, 100, 1 << 30, 3.0, "fp32"), "test_noisy[b]": entry(50_000, 50, 1, 3.0)}
    again = {
        name: dict(e, tokens_per_s={"median": e["tokens_per_s"]["median"] * 1.005, "iqr": 100})
        for name, e in steady.items()
    }
    again |= {"test_noisy[a]": entry(92_000, 100, 1 << 30, 3.0, "fp32"), "test_noisy[b]": entry(50_000, 50, 1, 3.0)}
    cases = compare({**steady, **noisy}, again)
    studies = by_test(cases)
    assert list(studies) == ["test_steady", "test_noisy"]
    assert tolerances_of(studies["test_steady"])["speed"] == pytest.approx(0.02)  # 4 x 0.5%
    # -8% and 0: sigma 8% / sqrt(2) = 5.66%, x 4 = 22.6%, over 2 x 8%; rounded up to two digits
    assert tolerances_of(studies["test_noisy"])["speed"] == pytest.approx(0.23)
    # every case: sigma sqrt((4 x 0.5%^2 + 8%^2) / 6) = 3.30%, x 4 = 13.2%, under 2 x 8%
    assert tolerances_of(summary(cases))["speed"] == pytest.approx(0.16)
    assert "loss_amp" in tolerances_of(studies["test_noisy"]) and "loss_amp" not in tolerances_of(
        studies["test_steady"]
    )


def test_gpu_busy_time_gets_the_rule_where_both_runs_traced_it_and_no_figure_where_they_did_not(capsys):
    """Busy time's per-case change and the tolerance the rule gives, over every case and each study its own (its
    ``gpu_busy``, which replaces the provisional 3%); logs from before busy time was traced (the H200's committed
    runs) have no such figure, column or line at all."""
    from scripts.gpu_noise import table

    changes = {"a": 1.004, "b": 0.996, "c": 1.012}
    first = {name: dict(FIRST[name], gpu_busy_seconds=0.1) for name in changes}
    second = {name: dict(SECOND[name], gpu_busy_seconds=0.1 * change) for name, change in changes.items()}
    cases = compare(first, second)
    assert [c.busy_change for c in cases] == pytest.approx([0.004, -0.004, 0.012])
    figures = summary(cases)
    # sigma = sqrt((0.4%^2 + 0.4%^2 + 1.2%^2) / 3) = 0.766%; 4 sigma = 3.06% over 2 x 1.2%: rounded up, 3.1%
    assert figures["gpu_busy"]["sigma"] == pytest.approx(0.0076594, rel=1e-4)
    assert tolerances_of(figures)["gpu_busy"] == pytest.approx(0.031)
    # each study alone: "a" moved 0.4% (4 sigma 1.6%), "c" 1.2% (4.8%)
    studies = by_test(cases)
    assert studies["a"]["gpu_busy"]["tolerance"] == pytest.approx(0.016)
    assert studies["c"]["gpu_busy"]["tolerance"] == pytest.approx(0.048)
    header = table(cases).splitlines()[0]
    assert "GPU busy ms" in header and "Δ busy" in header and "100.00 → 101.20" in table(cases)
    plain = compare(FIRST, SECOND)
    assert "gpu_busy" not in summary(plain) and "busy" not in table(plain)


def test_each_kind_of_kernels_change_is_evidence_where_both_runs_split_the_busy_time(tmp_path, capsys):
    """Two runs of cases whose entries split their busy time by kind: each kind's change per case, and over the
    cases its largest change and sigma, in the evidence (``kinds``) and one printed line; no tolerance of a kind
    (the split is not gated). A case voided for busy time is voided for its split too; logs without splits have none."""
    from scripts.gpu_noise import kinds_noise, main

    split = {"matmul": 0.010, "attention": 0.004}
    moved = {"a": {"matmul": 1.002, "attention": 1.010}, "b": {"matmul": 0.998, "attention": 0.990}, "c": {}}
    first = {name: dict(FIRST[name], gpu_busy_seconds=0.014, gpu_kernel_seconds=split) for name in moved}
    second = {
        name: dict(
            SECOND[name], gpu_busy_seconds=0.014, gpu_kernel_seconds={k: t * m.get(k, 1.0) for k, t in split.items()}
        )
        for name, m in moved.items()
    }
    cases = compare(first, second)
    assert cases[0].kind_changes == pytest.approx({"matmul": 0.002, "attention": 0.010})
    kinds = kinds_noise(cases)
    assert [kinds[k]["cases"] for k in kinds] == [3, 3] and kinds["attention"]["largest"] == pytest.approx(0.010)
    # sigma over a, b, c: sqrt((1.0%^2 + 1.0%^2 + 0) / 3) = 0.816%
    assert kinds["attention"]["sigma"] == pytest.approx(0.0081650, rel=1e-4)
    write(tmp_path / "one.jsonl", first)
    write(tmp_path / "two.jsonl", second)
    out = tmp_path / "noise.json"
    argv = [str(tmp_path / "one.jsonl"), "--against", str(tmp_path / "two.jsonl"), "--json", str(out)]
    assert main(argv) == 0
    evidence = json.loads(out.read_text())
    assert evidence["kinds"]["matmul"]["largest"] == pytest.approx(0.002) and "kinds" not in evidence["tolerances"]
    assert (
        "GPU busy time by kind of kernel (evidence, not gated): matmul 3 case(s), largest 0.20%"
        in capsys.readouterr().out
    )
    assert main([*argv, "--void-busy", "a", "--void-busy", "b", "--void-busy", "c"]) == 0
    assert "kinds" not in json.loads(out.read_text())
    assert kinds_noise(compare(FIRST, SECOND)) == {}


def test_busy_times_named_void_are_left_out_and_the_evidence_says_which(tmp_path, capsys):
    """``--void-busy NAME``: a figure known to be of another step than the one gated (the H200 ladder's, traced on
    the eager step) is left out of the rule, by case or by study, and the evidence names what was left out; every
    other figure of those cases is compared as before."""
    from scripts.gpu_noise import main

    changes = {"a": 1.004, "b": 1.30, "c": 1.012}  # b's busy time "moved" 30%: a figure of another step
    write(tmp_path / "one.jsonl", {name: dict(FIRST[name], gpu_busy_seconds=0.1) for name in changes})
    write(tmp_path / "two.jsonl", {name: dict(SECOND[name], gpu_busy_seconds=0.1 * c) for name, c in changes.items()})
    out = tmp_path / "noise.json"
    argv = [str(tmp_path / "one.jsonl"), "--against", str(tmp_path / "two.jsonl"), "--json", str(out)]
    assert main([*argv, "--void-busy", "b"]) == 0
    evidence = json.loads(out.read_text())
    assert evidence["void_busy"] == ["b"]
    assert [c["busy_change"] is None for c in evidence["cases"]] == [False, True, False]
    assert evidence["cases"][1]["speed_change"] == pytest.approx(-0.01)  # the rest of b is compared
    assert evidence["summary"]["gpu_busy"]["largest"] == pytest.approx(0.012)
    assert "b" not in {k for k, v in evidence["by_test"].items() if "gpu_busy" in v}
    assert main(argv) == 0 and "void_busy" not in json.loads(out.read_text())  # none named: all compared
    assert json.loads(out.read_text())["summary"]["gpu_busy"]["largest"] == pytest.approx(0.30)


H200 = ROOT / "tests" / "data" / "gpu-h200"
#: baselines/nvidia-h200.json as these runs were judged against it (commit f7ddfe5): the ladder's rungs 5-8 have
#: been recorded again since, after their code changed (tests/data/gpu-h200-past-nanogpt)
H200_BASELINES = H200 / "baselines-then.json"
H200_FIRST = [H200 / "ladder.jsonl", H200 / "memory-record.jsonl"]  # the recording runs (two sessions)
H200_SECOND = [H200 / "verify.jsonl", H200 / "memory-verify.jsonl"]  # each run again, against what it recorded
H200_UNVERIFIED = {  # recorded last in the second session's 10-minute job, whose second run had no time left for them
    "test_memory_recipes[deep-1.6b-budget-0.05]",
    "test_memory_recipes[deep-1.6b-budget-0.60]",
    "test_memory_recipes[deep-1.6b-bf16-pure-budget-0.60]",
}


def test_the_committed_h200_tolerances_are_what_the_rule_gives_on_its_recorded_runs():
    """baselines/nvidia-h200.json's tolerances come from the evidence beside them (tests/data/gpu-h200): the ladder
    and deep-1.6b's memory recipes, each recorded and run again on an H200 (torch 2.11.0+cu130), run through the
    rule again: the file's over every case, each study's over its own."""
    cases = compare(measured(H200_FIRST), measured(H200_SECOND))
    assert len(cases) == 16  # the nine rungs and seven memory recipes, each measured in both runs
    committed = json.loads((ROOT / "baselines" / "nvidia-h200.json").read_text())
    rule, studies = summary(cases), by_test(cases)
    assert {k: committed["tolerances"][k] for k in tolerances_of(rule)} == tolerances_of(rule)
    # these runs predate busy time: each study's gpu_busy comes from the later runs (the test below)
    own = {test: {k: v for k, v in t.items() if k != "gpu_busy"} for test, t in committed["tolerances_by_test"].items()}
    assert own == {test: tolerances_of(figures) for test, figures in studies.items()}
    evidence = json.loads((H200 / "noise.json").read_text())  # the script's own evidence agrees
    assert evidence["summary"] == rule and evidence["by_test"] == studies
    # the rungs past nanoGPT recorded at B=16 (tests/data/gpu-h200-past-nanogpt: liger's loss and FP8, as ladder-9
    # and 10 were then) left the file when the ladder put the fitted batch first; the rungs past nanoGPT in their
    # new order came later, with their own evidence (tests/data/gpu-h200-fitted, the tests below), and the top rung
    # last (tests/data/gpu-h200-whole-ladder); it left the file when liger's loss moved beside the ladder, and the
    # top rung now autotuned over ladder-9 has not run yet
    assert set(committed["benchmarks"]) == {c.name for c in cases} | H200_UNVERIFIED | FITTED_RUNGS
    assert not H200_UNVERIFIED & {c.name for c in cases} and not FITTED_RUNGS & {c.name for c in cases}


PAST_NANOGPT = ROOT / "tests" / "data" / "gpu-h200-past-nanogpt"
FITTED = ROOT / "tests" / "data" / "gpu-h200-fitted"
LIGER, LIGER_FP8 = "test_ladder[gpt2-ladder-9-liger]", "test_ladder[gpt2-ladder-9-liger-fp8]"
#: recorded after the busy-time fix (tests/data/gpu-h200-fitted): the fitted batch, liger and FP8 (ladder-8 again too)
FITTED_RUNGS = {"test_ladder[gpt2-ladder-9]", LIGER, LIGER_FP8}
#: liger's loss was ladder-10, and FP8 over it ladder-11, when those runs logged them; both moved beside the ladder
#: after them, their entries with them
AS_LOGGED = {"test_ladder[gpt2-ladder-10]": LIGER, "test_ladder[gpt2-ladder-11]": LIGER_FP8}
#: as the later runs logged them: FP8 beside liger's rung was ladder-10-fp8, and ladder-11 the autotuned matmuls
#: over liger's loss, a case that left with the rung (the top rung autotunes over ladder-9 now)
AS_LOGGED_LATER = {"test_ladder[gpt2-ladder-10]": LIGER, "test_ladder[gpt2-ladder-10-fp8]": LIGER_FP8}
LIGER_AUTOTUNED = "test_ladder[gpt2-ladder-11]"
WHOLE = ROOT / "tests" / "data" / "gpu-h200-whole-ladder"


def renamed(entries: dict, names: dict[str, str] = AS_LOGGED_LATER) -> dict:
    """A results log's entries under the names their cases have now."""
    return {names.get(name, name): e for name, e in entries.items()}


#: recorded again with their compiled (or eager) step's busy time, each run twice (tests/data/gpu-h200-whole-ladder)
BELOW_THE_FIT = {f"test_ladder[gpt2-ladder-{n}]" for n in range(8)}
DETACHED = ROOT / "tests" / "data" / "gpu-h200-detached-logits"
#: recorded again once the compiled model returned its logits detached (tests/data/gpu-h200-detached-logits): the
#: file's entries of these rungs are those runs', no longer the whole ladder's
DETACHED_RUNGS = {f"test_ladder[gpt2-ladder-{n}]" for n in range(4, 10)}
LADDER_RUNS = {  # each recording run, the same cases run again against what it recorded, and the noise over both
    "ladder-0 to 7": (WHOLE, "ladder-0-7.jsonl", "verify-0-7.jsonl", "noise-0-7.json"),
    "ladder-10 and 11": (WHOLE, "ladder-10-11.jsonl", "verify-10-11.jsonl", "noise-10-11.json"),
    "ladder-4 to 9, logits detached": (DETACHED, "ladder-4-9.jsonl", "verify-4-9.jsonl", "noise-4-9.json"),
}
#: each run's cases, and the largest change of busy time and tokens/s between its two runs
LADDER_RUN_CASES = {
    "ladder-0 to 7": (BELOW_THE_FIT, {"busy": 0.0067, "speed": 0.0059}),
    "ladder-10 and 11": ({LIGER, LIGER_AUTOTUNED}, {"busy": 0.0056, "speed": 0.0016}),
    "ladder-4 to 9, logits detached": (DETACHED_RUNGS, {"busy": 0.0168, "speed": 0.0111}),
}


def test_the_compiled_rungs_logged_busy_times_are_not_of_their_compiled_step():
    """The ladder's busy times in tests/data/gpu-h200-past-nanogpt were traced after the work ledger's step, which
    left Dynamo running the case eagerly (fixed in gptcore.measure.work.counted_step; tests/test_trace.py): five of
    the six compiled rungs show more busy time than their whole timed step takes at their own tokens/s, which no
    step of theirs can (ladder-5: 69.2 ms of kernels in a step of 38.0 ms). Their busy times are left out of the
    rule (``void_busy``), and the ladder's entries carry none."""
    tokens_per_step = 16 * 1024  # GPT-2 124M's ladder: B=16, T=1024
    logged = measured([PAST_NANOGPT / name for name in ("ladder.jsonl", "ladder-9-10.jsonl", "verify.jsonl")])
    over = {
        name: e["gpu_busy_seconds"] > tokens_per_step / e["tokens_per_s"]["median"]
        for name, e in logged.items()
        if e and e.get("gpu_busy_seconds")
    }
    assert len(over) == 6 and sorted(name for name, above in over.items() if not above) == [
        "test_ladder[gpt2-ladder-9]"  # host-bound: 58 ms of wall time a step, more than even its eager kernels
    ]
    file = json.loads((ROOT / "baselines" / "nvidia-h200.json").read_text())
    ladder = {name: e for name, e in file["benchmarks"].items() if name.startswith("test_ladder")}
    busy = {name for name, e in ladder.items() if "gpu_busy_seconds" in e}
    assert busy == set(ladder)  # every rung was recorded again after the fix (tests/data/gpu-h200-whole-ladder)
    again = measured([WHOLE / "ladder-0-7.jsonl"]) | measured([DETACHED / "ladder-4-9.jsonl"])  # the later wins
    assert {name: ladder[name]["gpu_busy_seconds"] for name in BELOW_THE_FIT} == {
        name: again[name]["gpu_busy_seconds"] for name in BELOW_THE_FIT
    }


def test_the_rungs_recorded_after_the_fix_are_busy_for_less_than_their_step():
    """The rungs recorded in tests/data/gpu-h200-fitted (after the fix, whose GPU check passed first in the same
    call: smoke.log) have busy times of their compiled steps. Against the step that its tokens/s gives at its own
    batch (the setup's fitted batch), each is within the 10% that the case's own check allows (the eager-traced
    rungs were 19-82% above theirs); FP8's second run is 0.6% above (one traced step against the timed steps'
    median). The fitted rungs' are at least 96% of it: those steps are GPU-bound; ladder-8's at B=16, 92%."""
    file = json.loads((ROOT / "baselines" / "nvidia-h200.json").read_text())["benchmarks"]
    logged = [measured([FITTED / name]) for name in ("ladder.jsonl", "verify.jsonl")]
    shares = {}
    for run, entries in enumerate(logged):
        for logged_as, e in entries.items():
            name = AS_LOGGED.get(logged_as, logged_as)
            tokens = file[name]["setup"]["model.batch_size"] * 1024
            shares[run, name] = e["gpu_busy_seconds"] / (tokens / e["tokens_per_s"]["median"])
    assert len(shares) == 8 and all(share < 1.10 for share in shares.values()), shares
    assert max(shares.values()) == pytest.approx(1.0058, abs=5e-5)  # FP8, verify.jsonl
    assert min(share for (_, name), share in shares.items() if name != "test_ladder[gpt2-ladder-8]") > 0.96, shares
    assert {name: file[name]["setup"]["model.batch_size"] for name in FITTED_RUNGS} == {
        "test_ladder[gpt2-ladder-9]": 146,
        LIGER: 356,
        LIGER_FP8: 356,
    }


def test_each_studys_busy_tolerance_is_what_the_rule_gives_on_two_runs_of_its_cases():
    """Busy time's noise, over two runs on an H200 (torch 2.11.0+cu130; tests/data/gpu-h200-past-nanogpt): deep-1.6b
    in pure bf16 (eager) twice on one machine moved 0.42%, so the memory recipes' gpu_busy is the rule's 1.7%,
    under the 3% target. The ladder's busy times were of the eager step (the test above): they are left out here;
    the ladder's own comes from its compiled steps traced twice (the next test)."""
    first = [PAST_NANOGPT / name for name in ("ladder.jsonl", "ladder-9-10.jsonl", "memory.jsonl")]
    second = [PAST_NANOGPT / name for name in ("verify.jsonl", "memory-verify.jsonl")]
    cases = compare(measured(first), measured(second), void_busy=("test_ladder",))
    assert len(cases) == 7
    assert [c.name for c in cases if c.busy_change is not None] == ["test_memory_recipes[deep-1.6b-bf16-pure]"]
    assert max(abs(c.busy_change) for c in cases if c.busy_change is not None) == pytest.approx(0.0042, abs=5e-5)
    assert min(c.speed_change for c in cases) == pytest.approx(-0.0714, abs=5e-5)  # ladder-9, host-bound
    studies = by_test(cases)
    committed = json.loads((ROOT / "baselines" / "nvidia-h200.json").read_text())
    busy = {test: tolerances_of(figures).get("gpu_busy") for test, figures in studies.items()}
    assert busy == {"test_ladder": None, "test_memory_recipes": 0.017}
    assert committed["tolerances_by_test"]["test_memory_recipes"]["gpu_busy"] == busy["test_memory_recipes"]
    assert committed["tolerances"]["gpu_busy"] == 0.03  # a study with no runs of its own (char)
    evidence = json.loads((PAST_NANOGPT / "noise.json").read_text())  # the script's own evidence agrees
    assert evidence["by_test"] == studies and evidence["void_busy"] == ["test_ladder"]


def test_the_ladders_busy_tolerance_is_what_the_rule_gives_on_two_runs_of_its_compiled_steps():
    """ladder-8 to 10 and FP8 recorded and run again on one H200 (torch 2.11.0+cu130; tests/data/gpu-h200-fitted), their
    compiled steps traced: busy time moved at most 1.40% (FP8's rung; its tokens/s moved 0.00%), so the rule gives
    the ladder's gpu_busy 3.3% (4 sigma of 0.81%), over the provisional 3%; tokens/s moved at most 0.19%."""
    cases = compare(measured([FITTED / "ladder.jsonl"]), measured([FITTED / "verify.jsonl"]))
    assert sorted(AS_LOGGED.get(c.name, c.name) for c in cases) == sorted(FITTED_RUNGS | {"test_ladder[gpt2-ladder-8]"})
    assert max(abs(c.busy_change) for c in cases) == pytest.approx(0.0140, abs=5e-5)
    assert max(abs(c.speed_change) for c in cases) == pytest.approx(0.0019, abs=5e-5)
    ladder = tolerances_of(by_test(cases)["test_ladder"])
    committed = json.loads((ROOT / "baselines" / "nvidia-h200.json").read_text())["tolerances_by_test"]
    assert ladder["gpu_busy"] == 0.033  # the file's is the largest of every pair of the ladder's runs (below): 3.4%
    # one machine's runs: the ladder's speed keeps the 3.4% of two hosts (the rule here would give 1%)
    assert ladder["speed"] == 0.01 and committed["test_ladder"]["speed"] == 0.034
    evidence = json.loads((FITTED / "noise.json").read_text())  # the script's own evidence agrees
    assert evidence["by_test"] == by_test(cases)


@pytest.mark.parametrize("run", LADDER_RUNS)
def test_the_ladders_last_runs_are_what_the_file_holds_and_pass_again(run):
    """The ladder's runs on one H200 (torch 2.11.0+cu130; tests/data/gpu-h200-whole-ladder, then
    tests/data/gpu-h200-detached-logits): what each recorded is the file's entry, figure for figure, where the file
    still holds that run's entry; the same cases run again pass against it under the ladder's committed tolerances,
    as the gate judges them; and the noise rule over the two runs stays inside them (busy time moved at most 0.67%,
    0.56% and 1.68%, against the committed 3.4%; tokens/s 0.59%, 0.16% and 1.11%, against 3.4%). ladder-4 to 7 of
    the whole ladder's run were recorded again after the logits were detached: the file holds the later run's. The
    whole ladder's ladder-10 is liger's case beside the ladder now, and its ladder-11 (autotuned over liger's loss)
    left the file with that rung."""
    from gptcore.gate import baselines
    from gptcore.gate.schema import Entry
    from gptcore.gate.verdicts import verdict_of

    folder, first_log, second_log, evidence = LADDER_RUNS[run]
    names, expected_largest = LADDER_RUN_CASES[run]
    file = baselines.load(ROOT / "baselines" / "nvidia-h200.json", expect_slug="nvidia-h200")
    committed = json.loads((ROOT / "baselines" / "nvidia-h200.json").read_text())
    raw, ladder = committed["benchmarks"], committed["tolerances_by_test"]["test_ladder"]
    first, second = renamed(measured([folder / first_log])), renamed(measured([folder / second_log]))
    assert set(first) == set(second) == names
    held = names - DETACHED_RUNGS - {LIGER_AUTOTUNED} if folder == WHOLE else names
    figures = ("tokens_per_s", "peak_allocated_bytes", "gpu_busy_seconds", "loss", "work")
    for name in names - {LIGER_AUTOTUNED}:  # liger's autotuned rung left the file with liger's rung
        recorded = {k: first[name][k] for k in figures} == {k: raw[name][k] for k in figures}
        assert recorded == (name in held), name
    assert LIGER_AUTOTUNED not in raw
    for name in held:
        verdict = verdict_of(name, Entry.from_json(second[name], name), file.entries[name], file.tolerances_for(name))
        assert verdict.failed == [], (name, verdict.failed)
    cases = compare(first, second)
    largest = {"busy": max(abs(c.busy_change) for c in cases), "speed": max(abs(c.speed_change) for c in cases)}
    assert largest == pytest.approx(expected_largest, abs=5e-5)
    ours = by_test(cases)["test_ladder"]
    rule = tolerances_of(ours)
    assert rule["gpu_busy"] <= ladder["gpu_busy"] == 0.034 and rule["speed"] <= ladder["speed"] == 0.034
    # the script's own evidence agrees, to the last bit but sigma's sums (the GPU machine's Python 3.12)
    logged = json.loads((folder / evidence).read_text())["by_test"]["test_ladder"]
    assert logged.keys() == ours.keys()
    for metric, figures in ours.items():
        assert logged[metric] == {k: v if v is None else pytest.approx(v, rel=1e-12) for k, v in figures.items()}


def test_the_ladders_busy_tolerance_is_the_largest_the_rule_gives_over_every_pair_of_its_runs():
    """Every pair of the ladder's runs with compiled steps traced (the fitted rungs', the whole ladder's two, the
    detached logits' one) gives its own busy-time tolerance by the rule: 3.3%, 1.7%, 2.3% and 3.4%. The file holds
    the largest, so that each run's noise passes: ladder-9's busy time moved 1.68% over the last pair (271.15 to 275.69
    ms), twice that rounded up is 3.4%."""
    pairs = [(FITTED, "ladder.jsonl", "verify.jsonl")] + [run[:3] for run in LADDER_RUNS.values()]
    rules = [tolerances_of(by_test(compare(measured([d / a]), measured([d / b])))["test_ladder"]) for d, a, b in pairs]
    assert [rule["gpu_busy"] for rule in rules] == [0.033, 0.017, 0.023, 0.034]
    committed = json.loads((ROOT / "baselines" / "nvidia-h200.json").read_text())["tolerances_by_test"]["test_ladder"]
    assert committed["gpu_busy"] == max(rule["gpu_busy"] for rule in rules)


def test_liger_passes_a_third_time_but_no_longer_pays_over_the_fitted_batch_with_its_logits_detached():
    """liger's case (ladder-10 then) and the autotuned matmuls over it (ladder-11 then) ran again on the code whose
    compiled model returns its logits detached (one H200, torch 2.11.0+cu130;
    tests/data/gpu-h200-detached-logits/ladder-10-11.jsonl): liger's loss makes no logits, so the change does not
    reach them. liger's case passes against the entry the whole ladder's run recorded, with the same work ledger:
    505,597 tokens/s against 496,612 (+1.8%, within the ladder's 3.4%). But ladder-9, nanoGPT's step at the fitted
    batch, gained more from the change: 524,930 on the same machine within the same ten minutes. Judged as the rung
    it was ("not slower than the rung before"), liger's loss fails by 3.7%, beyond the noise bound (the 2% floor):
    it saves memory and costs time, so it moved beside the ladder, with its claim on memory per token alone, and
    the top rung autotunes over ladder-9."""
    from gptcore.gate import baselines
    from gptcore.gate.expectations import EXPECTATIONS, Expectation, Figures, judge_effect
    from gptcore.gate.schema import Entry
    from gptcore.gate.verdicts import verdict_of

    file = baselines.load(ROOT / "baselines" / "nvidia-h200.json", expect_slug="nvidia-h200")
    raw = json.loads((ROOT / "baselines" / "nvidia-h200.json").read_text())["benchmarks"]
    logged = renamed(measured([DETACHED / "ladder-10-11.jsonl"]))
    third = {name: e for name, e in logged.items() if e}
    assert set(logged) - set(third) == {LIGER_FP8}  # left to the deadline
    assert set(third) == {LIGER, LIGER_AUTOTUNED}
    verdict = verdict_of(LIGER, Entry.from_json(third[LIGER], LIGER), file.entries[LIGER], file.tolerances_for(LIGER))
    assert verdict.failed == [] and third[LIGER]["work"] == raw[LIGER]["work"], verdict.failed
    assert {name: round(e["tokens_per_s"]["median"]) for name, e in third.items()} == {
        LIGER: 505_597,
        LIGER_AUTOTUNED: 506_671,
    }
    fitted = measured([DETACHED / "ladder-4-9.jsonl"])["test_ladder[gpt2-ladder-9]"]
    figures = [
        Figures(None, e["tokens_per_s"]["median"], e["tokens_per_s"]["iqr"], None) for e in (third[LIGER], fitted)
    ]
    as_a_rung = Expectation("ladder-9-liger", "ladder-9", "tokens/s", "not lower", "a rung of the ladder")
    judged = judge_effect(as_a_rung, "gpt2", *figures)
    assert judged.status == "FAIL" and judged.measured == "505,597 vs 524,930 tok/s (0.963x)", judged
    claims = [(e.reference, e.metric) for e in EXPECTATIONS if e.recipe == "ladder-9-liger"]
    assert claims == [("ladder-9", "peak memory per token")]  # beside the ladder: no claim on tokens/s


def test_the_autotuned_matmuls_were_not_slower_over_ligers_loss():
    """ladder-11 as the whole ladder's run recorded it (tests/data/gpu-h200-whole-ladder): max-autotune-gemm over
    liger's loss at its fitted batch of 356, 498,006 tokens/s against 496,612 in the same run (1.003x). The switch is
    the top rung's now (ladder-10), over ladder-9, where it has not run yet: the claims that rung makes, judged by
    the gate's own judge_effect on these two logged entries (their figures as the gate takes them,
    Figures.of), hold of the pair: not slower, and the same loss at step 40 (the matmuls' kernels differ, not their
    arithmetic). The rest reads the committed evidence, not code: the two setups differ in the compile mode alone,
    the same peak within 0.01%, and both GPU-bound, their busy times within 1% of the step their tokens/s give."""
    from gptcore.gate.expectations import EXPECTATIONS, Figures, judge_effect
    from gptcore.gate.schema import Entry
    from gptcore.presets import RECIPES

    logged = renamed(measured([WHOLE / "ladder-10-11.jsonl"]))
    top, below = logged[LIGER_AUTOTUNED], logged[LIGER]
    assert top["setup"]["recipe.compile_mode"] == RECIPES["ladder-10"].compile_mode == "max-autotune-gemm"
    assert below["setup"]["recipe.compile_mode"] == "default"
    assert {k: v for k, v in top["setup"].items() if k != "recipe.compile_mode"} == {
        k: v for k, v in below["setup"].items() if k != "recipe.compile_mode"
    }
    assert top["setup"]["model.batch_size"] == 356
    now, ref = (
        Figures.of(Entry.from_json(e, name), None, e["setup"]["model.batch_size"] * 1024)
        for name, e in ((LIGER_AUTOTUNED, top), (LIGER, below))
    )
    claims = {e.metric: e for e in EXPECTATIONS if e.recipe == "ladder-10"}
    assert {(e.reference, e.direction) for e in claims.values()} == {("ladder-9", "not lower"), ("ladder-9", "same")}
    judged = {metric: judge_effect(e, "gpt2", now, ref) for metric, e in claims.items()}
    assert [(metric, j.status) for metric, j in judged.items()] == [("tokens/s", "ok"), ("loss", "ok")], judged
    assert judged["tokens/s"].measured == "498,006 vs 496,612 tok/s (1.003x)"
    assert judged["loss"].measured == "10.838368 vs 10.838367 at step 40 (+9.5e-07)"
    assert abs(top["peak_allocated_bytes"] / below["peak_allocated_bytes"] - 1) < 1e-4
    for e in (top, below):
        step = e["setup"]["model.batch_size"] * 1024 / e["tokens_per_s"]["median"]
        assert abs(e["gpu_busy_seconds"] / step - 1) < 0.01


def replay_versus_nanogpt(got: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """scripts/versus_nanogpt.py's own main() run again here, on CPU, over a committed record ``got``: the GPU, both
    steps and the batch sizes stubbed, and each timed round answered with the rate the record holds for that step
    and round, in the order main asks for them (the warm-ups' answers are not kept). What main writes to --json."""
    import torch

    from scripts import versus_nanogpt as script

    left = {name: iter(rates) for name, rates in got["rates"].items()}
    randint = torch.randint

    def theirs(x, y):  # nanoGPT's step, as nanogpt_step returns it
        raise AssertionError("a step runs only inside timed")

    class Trainer:  # gptcore's, as much of it as main uses
        def __init__(self, cfg, recipe, device):
            self.micro_batch, self.accum = cfg.batch_size, 1

    def timed(step, batches, steps):
        warmup = steps == 5  # main warms each step up with 5 steps; the rounds here take 10
        return 0.0 if warmup else next(left["nanoGPT" if step is theirs else "gptcore"])

    monkeypatch.setattr(script, "Trainer", Trainer)
    monkeypatch.setattr(script, "nanogpt_step", lambda folder: theirs)
    monkeypatch.setattr(script, "timed", timed)
    monkeypatch.setattr(script, "batch_sizes", lambda recipe: tuple(got["batches"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch, "randint", lambda *args, device=None: randint(*args))  # the batches on CPU
    out = tmp_path / "versus.json"
    (tmp_path / "model.py").write_text("")  # the folder main checks first (nanogpt_step, which imports it, is stubbed)
    args = [str(tmp_path), "--recipe", got["recipe"], "--rounds", str(got["rounds"]), "--steps", "10"]
    monkeypatch.setattr(sys, "argv", ["versus_nanogpt.py", *args, "--json", str(out)])
    assert script.main() == 0
    assert all(next(rates, None) is None for rates in left.values())  # every round replayed, none twice
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "session, recipe, rounds, ratio, behind",
    [
        ("whole ladder", "ladder-8", 30, 0.9873, 29),
        ("whole ladder", "ladder-9", 10, 0.9842, 10),
        ("logits detached", "ladder-8", 30, 1.0099, 3),
        ("logits detached", "ladder-9", 6, 1.0237, 0),
    ],
)
def test_nanogpts_step_side_by_side_is_what_its_rounds_give(
    session, recipe, rounds, ratio, behind, tmp_path, monkeypatch
):
    """scripts/versus_nanogpt.py on one H200 (torch 2.11.0+cu130): the ratio it wrote is what its own code makes of
    the rounds it wrote. Its main() is replayed here over the committed rounds (replay_versus_nanogpt) and must
    write the same rates and, to the bit, the same ratio: the same floats in the same order give the same medians
    and the same quotient. The rest reads the committed evidence, not code: the rounds say who led. In
    tests/data/gpu-h200-whole-ladder gptcore trailed in nearly every round: at B=16 (ladder-8) 0.987x, behind in 29
    of 30; at the fitted batch of 146 (ladder-9) 0.984x, in all 10. Once the compiled model returned its logits
    detached (tests/data/gpu-h200-detached-logits), it led: 1.010x at B=16, behind in 3 of 30; 1.024x at 146, in
    none of the 6 rounds the call's time left (the JSON is written round by round)."""
    folder = WHOLE if session == "whole ladder" else DETACHED
    got = json.loads((folder / f"versus-{recipe}.json").read_text())
    ours, theirs = got["rates"]["gptcore"], got["rates"]["nanoGPT"]
    assert got["recipe"] == recipe and got["rounds"] == len(ours) == len(theirs) == rounds
    again = replay_versus_nanogpt(got, tmp_path, monkeypatch)
    assert (again["rates"], again["batches"], again["rounds"]) == (got["rates"], got["batches"], got["rounds"])
    assert again["ratio"] == got["ratio"]
    assert got["ratio"] == pytest.approx(ratio, abs=5e-5)
    assert sum(a < b for a, b in zip(ours, theirs)) == behind


def test_the_side_by_side_profile_splits_both_steps_kernel_time_by_kind():
    """scripts/versus_nanogpt.py --profile: each step's kernel time per step by kind, the difference beside it, the
    kinds that take the most first and the totals last (a tie read by name). Here gptcore's loss kernels 0.25 ms a
    step faster than nanoGPT's, the rest alike: the table names inductor's kernels, and only them, as the
    difference."""
    from scripts.versus_nanogpt import kinds_side_by_side

    theirs = {"matmul": 0.0170, "inductor": 0.0093, "attention": 0.0044, "foreach": 0.0011, "other": 0.0009}
    ours = theirs | {"inductor": 0.0093 - 0.00025}
    lines = kinds_side_by_side({"gptcore": ours, "nanoGPT": theirs}).splitlines()
    assert lines[0] == "kernel time per step by kind of kernel, ms"
    assert [line.split() for line in lines[3:]] == [
        ["matmul", "17.000", "17.000", "+0.000"],
        ["inductor", "9.050", "9.300", "-0.250"],
        ["attention", "4.400", "4.400", "+0.000"],
        ["foreach", "1.100", "1.100", "+0.000"],
        ["other", "0.900", "0.900", "+0.000"],
        ["all", "kernels", "32.450", "32.700", "-0.250"],
    ]


def test_the_host_bound_case_is_gated_by_its_busy_time_where_its_speed_cannot_be():
    """deep-1.6b in pure bf16, as recorded (baselines/nvidia-h200.json): its second run passes; a run whose kernels
    take 2% longer fails on busy time alone, with tokens/s 5% lower, well inside its study's 17%."""
    from gptcore.gate import baselines
    from gptcore.gate.schema import Entry
    from gptcore.gate.verdicts import verdict_of

    name = "test_memory_recipes[deep-1.6b-bf16-pure]"
    file = baselines.load(ROOT / "baselines" / "nvidia-h200.json", expect_slug="nvidia-h200")
    recorded, tol = file.entries[name], file.tolerances_for(name)
    (again,) = [r for r in results.read(PAST_NANOGPT / "memory-verify.jsonl") if r.name == name]
    assert verdict_of(name, Entry.from_json(again.entry, name), recorded, tol).failed == []
    slower = dataclasses.replace(
        recorded, gpu_busy_seconds=recorded.gpu_busy_seconds * 1.02, tokens_per_s=recorded.tokens_per_s * 0.95
    )
    assert [c.metric for c in verdict_of(name, slower, recorded, tol).failed] == ["GPU busy"]


def test_the_h200s_second_runs_pass_against_the_baselines_they_were_run_against():
    """The second run of every verified H200 case, judged again against baselines/nvidia-h200.json as it was then
    (H200_BASELINES), as the gate judges it: no check fails. On the device two failed under the one tolerance of the
    ladder's noise (deep-1.6b in pure bf16 at -8.1% tokens/s, fp32 compiled at +1.91e-6 nats, 2 ulps of fp32 at
    11.3), which its own study now gives."""
    from gptcore.gate import baselines
    from gptcore.gate.schema import Entry
    from gptcore.gate.verdicts import verdict_of

    file = baselines.load(H200_BASELINES, expect_slug="nvidia-h200")
    pairs = {
        record.name: (Entry.from_json(record.entry, f"{path}: {record.name}"), file.entries[record.name])
        for path in H200_SECOND
        for record in results.latest(results.read(path)).values()
        if record.entry
    }
    judged = {name: verdict_of(name, *pair, file.tolerances_for(name)).failed for name, pair in pairs.items()}
    assert len(judged) == 16 and all(failed == [] for failed in judged.values()), judged
    # under the ladder's tolerances alone the two false failures come back: the study's own evidence is what passes
    ladder = file.tolerances_for("test_ladder[x]")
    memory = {name: pair for name, pair in pairs.items() if name.startswith("test_memory_recipes[")}
    assert sorted(name for name, pair in memory.items() if verdict_of(name, *pair, ladder).failed) == [
        "test_memory_recipes[deep-1.6b-bf16-pure]",
        "test_memory_recipes[deep-1.6b-compile]",
    ]


H200_HOSTS = {  # each host's runs against what the recording host recorded
    "the recording host's second runs": H200_SECOND,
    # another H200 machine, torch 2.11.0+cu130, commit d3fb328, cold cache: the ladder and two memory recipes
    "a second host": [H200 / "second-host.jsonl"],
}


def judged_against_the_baselines_then(paths: list) -> dict:
    """Each case's run in the logs at ``paths`` against baselines/nvidia-h200.json as it was then (H200_BASELINES),
    as the gate judges it (its study's tolerances): name -> (measured entry, baseline entry, verdict)."""
    from gptcore.gate import baselines
    from gptcore.gate.schema import Entry
    from gptcore.gate.verdicts import verdict_of

    file = baselines.load(H200_BASELINES, expect_slug="nvidia-h200")
    out = {}
    for path in paths:
        for record in results.latest(results.read(path)).values():
            if record.entry:
                measured, baseline = Entry.from_json(record.entry, f"{path}: {record.name}"), file.entries[record.name]
                out[record.name] = (
                    measured,
                    baseline,
                    verdict_of(record.name, measured, baseline, file.tolerances_for(record.name)),
                )
    return out


@pytest.mark.parametrize("host", H200_HOSTS)
def test_each_studys_tolerances_hold_for_both_hosts_runs(host):
    """Every case that either host ran again passes against the baselines it ran against (H200_BASELINES) under its
    study's tolerances, committed then and now (the ladder's 3.4%, the memory recipes' 17%, ...), every work count
    the same."""
    cases = judged_against_the_baselines_then(H200_HOSTS[host])
    assert len(cases) == {"the recording host's second runs": 16, "a second host": 11}[host]
    assert {name: verdict.failed for name, (_, _, verdict) in cases.items()} == {name: [] for name in cases}
    for name, (_, _, verdict) in cases.items():
        work = [c for c in verdict.checks if c.metric == "work"]
        assert [c.status for c in work] == ["ok"], name  # every work count the same


def test_the_second_host_moved_as_its_readme_says_and_the_host_bound_case_cannot_be_gated_by_speed():
    """tests/data/gpu-h200/README.md's figures of the second host, and what they mean: deep-1.6b in pure bf16 came
    out 8.1% slower on both the recording host's second run and the second host, a case that times the host (18.5 µs
    a dispatched op, docs/gpu.md); its study's 17% then passes a 15% slower run too. Busy time is what will gate it."""
    second = judged_against_the_baselines_then(H200_HOSTS["a second host"])
    speed = {name: v.checks[1] for name, (_, _, v) in second.items()}
    assert all(c.metric == "tokens/s" for c in speed.values())
    ladder = [c.delta for name, c in speed.items() if name.startswith("test_ladder[")]
    assert (round(min(ladder), 4), round(max(ladder), 4)) == (-0.0071, 0.0302)
    peaks = {name: m.peak_allocated_bytes - b.peak_allocated_bytes for name, (m, b, _) in second.items()}
    assert {d for name, d in peaks.items() if name.startswith("test_ladder[")} == {0}
    assert {d for name, d in peaks.items() if name.startswith("test_memory_recipes[")} == {799_744}  # +0.005%
    pure = "test_memory_recipes[deep-1.6b-bf16-pure]"
    again = judged_against_the_baselines_then(H200_HOSTS["the recording host's second runs"])
    assert round(speed[pure].delta, 3) == round(again[pure][2].checks[1].delta, 3) == -0.081
    assert round(speed["test_memory_recipes[deep-1.6b-fp32]"].delta, 4) == -0.0008
    # the host-bound case: under the ladder's 3.4% it fails on both hosts with nothing changed; under its study's
    # 17% a kernel slowdown that the host's pace hides, or one that shows as 15% fewer tokens/s, passes too
    from gptcore.gate import baselines
    from gptcore.gate.verdicts import verdict_of

    file = baselines.load(H200_BASELINES, expect_slug="nvidia-h200")
    measured, baseline, _ = second[pure]
    assert [c.metric for c in verdict_of(pure, measured, baseline, file.tolerances_for("test_ladder[x]")).failed] == [
        "tokens/s"
    ]
    slower = dataclasses.replace(baseline, tokens_per_s=baseline.tokens_per_s * 0.85)
    assert verdict_of(pure, slower, baseline, file.tolerances_for(pure)).failed == []
    # busy time: none of these runs traced it, so neither side has the figure and no check is made
    assert measured.gpu_busy_seconds is None and baseline.gpu_busy_seconds is None


def test_between_hosts_the_rule_would_give_wider_tolerances_than_one_hosts_runs():
    """The noise rule over the recording runs against the second host (the same 11 cases): the committed tolerances
    hold, yet the rule between hosts gives the ladder 6.3% (its compiled rungs ran 1.2-3.0% faster there, a host's
    offset, not a run's noise) and the memory recipes 23% (two cases, one of them -8.1%), over one host's 3.4% and
    17%. Faster passes a one-sided gate; a host as much slower would come near the ladder's 3.4%."""
    cases = compare(measured(H200_FIRST), measured(H200_HOSTS["a second host"]))
    assert len(cases) == 11
    studies = by_test(cases)
    assert tolerances_of(studies["test_ladder"])["speed"] == pytest.approx(0.063)
    assert tolerances_of(studies["test_memory_recipes"])["speed"] == pytest.approx(0.23)
    committed = json.loads((ROOT / "baselines" / "nvidia-h200.json").read_text())["tolerances_by_test"]
    assert (committed["test_ladder"]["speed"], committed["test_memory_recipes"]["speed"]) == (0.034, 0.17)
    assert max(-c.speed_change for c in cases if c.name.startswith("test_ladder[")) == pytest.approx(0.0071, abs=5e-5)


def test_the_autotuned_matmuls_kept_the_loss_of_the_case_under_them_in_every_h200_run():
    """The loss expectation of a kernels-only switch (ladder-10 against ladder-9, coordinate descent against ladder-10:
    LOSS_SLACK) on the H200's evidence: in the three runs of the autotuned matmuls over liger's loss beside liger's
    case, on the same batches, the losses at step 40 differed by at most 2.9e-6 nats, inside 1e-3 by a factor of
    over 300. Judged with the expectation's own code."""
    from gptcore.gate.expectations import EXPECTATIONS, Figures, judge_effect

    rung = next(e for e in EXPECTATIONS if e.metric == "loss" and e.recipe == "ladder-10")
    runs = [WHOLE / "ladder-10-11.jsonl", WHOLE / "verify-10-11.jsonl", DETACHED / "ladder-10-11.jsonl"]
    apart = []
    for path in runs:
        logged = measured([path])
        under, tuned = logged["test_ladder[gpt2-ladder-10]"], logged[LIGER_AUTOTUNED]
        assert under["setup"]["recipe.compile_mode"] == "default"
        assert tuned["setup"]["recipe.compile_mode"] == "max-autotune-gemm"
        figures = [Figures(None, None, None, None, None, e["loss"]["value"], e["loss"]["step"]) for e in (tuned, under)]
        judged = judge_effect(rung, "gpt2", *figures)
        assert judged.status == "ok", judged.line
        apart.append(abs(figures[0].loss - figures[1].loss))
    assert max(apart) == pytest.approx(2.86e-6, abs=1e-8)
