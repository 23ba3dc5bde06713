"""scripts/gpu_noise.py: the run-to-run change of each figure between two runs' results logs, and the tolerances
its rule gives (synthetic logs: the arithmetic is what is checked here; a GPU session feeds it real ones)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gptcore.gate import results
from scripts.gpu_noise import compare, measured, round_up, summary
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


def write(path, entries: dict[str, dict | None], outcome: str = "passed") -> None:
    log = results.ResultsLog(path)
    for name, e in entries.items():
        log.write(results.Record(nodeid=f"bench/x.py::{name}", name=name, outcome=outcome, seconds=1.0, entry=e))


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
    assert (
        bad.stderr.strip() == f"gpu_noise: {tmp_path / 'bad.jsonl'}: line 1: Expecting value: line 1 column 1 (char 0)"
    )


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
    assert evidence["first"] == [str(out / "ladder.jsonl")] and evidence["second"] == str(out / "verify.jsonl")
    assert evidence["summary"]["speed"]["tolerance"] == pytest.approx(0.04)


def test_the_committed_h200_tolerances_are_what_the_rule_gives_on_its_two_recorded_runs():
    """baselines/nvidia-h200.json's tolerances come from the evidence beside them: the ladder recorded and verified
    on an H200 (torch 2.11.0+cu130), tests/data/gpu-h200/{ladder,verify}.jsonl, run through the rule again."""
    evidence = ROOT / "tests" / "data" / "gpu-h200"
    cases = compare(measured([evidence / "ladder.jsonl"]), measured([evidence / "verify.jsonl"]))
    assert len(cases) == 9  # the nine rungs, each measured in both runs
    rule = summary(cases)
    committed = json.loads((ROOT / "baselines" / "nvidia-h200.json").read_text())
    assert {k: committed["tolerances"][k] for k in rule} == {k: v["tolerance"] for k, v in rule.items()}
    assert rule == json.loads((evidence / "noise.json").read_text())["summary"]  # the stage's own evidence agrees
    assert set(committed["benchmarks"]) == {c.name for c in cases}  # every recorded case was verified
