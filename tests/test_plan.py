"""The GPU plan: each stage's cases planned before a GPU is at hand, cut into jobs that fit a time limit; the stages
of a time-limited job share its time, from --time-limit or the environment."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from gptcore.gate import plan
from gptcore.gate.stages import CONVERGENCE_SHORT, MARGIN_SECONDS, ORDER, STAGES
from gptcore.presets import MEMORY_RECIPES, MODELS, RECIPES
from tests import test_kernels_gpu
from tests.test_gate import ROOT, child_env

pytestmark = pytest.mark.cpu


def test_the_analytic_flops_are_the_models_own_count():
    from gptcore.training.model import GPT

    for model, recipe in (("cpu-small", "ckpt-fp32"), ("gpt2", "ladder-8"), ("char", "fp32")):
        cfg = MODELS[model]
        r = dataclasses.replace(RECIPES[recipe], checkpoint=False)  # the model counts no recomputation (below)
        assert plan.flops_per_token(cfg, r) == GPT(cfg, r).flops_per_token()
    cfg = MODELS["cpu-small"]
    plain, ckpt = plan.flops_per_token(cfg, RECIPES["fp32"]), plan.flops_per_token(cfg, RECIPES["checkpoint"])
    head = 6 * RECIPES["fp32"].vocab_rows(cfg) * cfg.n_embd
    assert ckpt - head == pytest.approx((plain - head) * 4 / 3)  # the blocks' forward again


def test_jobs_cut_a_stage_at_its_limit_and_keep_an_oversized_case_alone():
    from scripts.gpu_stage import jobs

    assert jobs([100, 200, 300, 50], 540) == [[0, 1], [2, 3]]
    assert jobs([600, 10], 540) == [[0], [1]]
    assert jobs([600, 10], None) == [[0, 1]]  # no time limit: one job
    assert jobs([], 540) == []


@pytest.mark.slow  # collects every GPU stage: ~5 s
def test_the_plan_prints_every_stage_cut_into_jobs_of_the_time_limit(tmp_path):
    env = child_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the script's `python` is this one
    # ruptures that cannot be imported, as on the GPU image that has none: collecting every stage never imports it
    (tmp_path / "ruptures").mkdir()
    (tmp_path / "ruptures" / "__init__.py").write_text("raise ImportError('no ruptures here')\n")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    done = subprocess.run(
        ["bash", "scripts/gpu_session.sh", "plan", "--time-limit", "3600"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ORDER:
        assert f"== {name}: " in done.stdout
    for node in STAGES["smoke"].pytest:
        assert node in done.stdout  # every smoke case is a collected test
    assert "jobs of 3600 s (3540 s for cases)" in done.stdout
    # a plain test plans at 30 s unless it states its own time: the autotuned compile's, as a rung's is planned
    smoke = {line.split()[0].rsplit("::", 1)[-1]: line.split()[1] for line in done.stdout.splitlines() if "::" in line}
    assert smoke["test_fp8_matmuls_match_float64"] == f"{plan.OTHER_SECONDS:.0f}"
    autotuned = plan.SETUP_SECONDS["cuda"] + plan.compile_seconds(test_kernels_gpu.SHAPE, test_kernels_gpu.AUTOTUNED)
    assert autotuned > 240 and smoke["test_the_autotuned_compile_trains_like_eager"] == f"{autotuned:.0f}"
    assert "Every job fits its time limit by this estimate (3540 s for cases)" in done.stdout
    assert f"bash scripts/gpu_session.sh {','.join(ORDER)} OUT_DIR" in done.stdout


def gpu_session(args: list[str], **env: str) -> subprocess.CompletedProcess:
    """scripts/gpu_session.sh with this interpreter and no GPU in sight (the stages must then refuse to record)."""
    child = {**child_env(), "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable, **env}
    return subprocess.run(
        ["bash", "scripts/gpu_session.sh", *args], cwd=ROOT, env=child, capture_output=True, text=True, timeout=300
    )


def test_a_stage_gets_what_is_left_of_its_job_and_none_below_a_minute(monkeypatch, capsys):
    import time

    from gptcore.gate.stages import JOB_END_ENV, TIME_LIMIT_ENV, job_end, stage_deadline
    from scripts import gpu_stage

    ladder, smoke = STAGES["ladder"], STAGES["smoke"]
    assert stage_deadline(ladder, now=1000.0, job_end=None) is None and ladder.deadline is None  # no limit at all
    assert stage_deadline(ladder, now=1000.0, job_end=1300.0) == 300.0  # the job's end
    assert stage_deadline(smoke, now=1000.0, job_end=1500.0) == smoke.deadline == 300  # the stage's own comes first
    assert job_end(1000.0, 3600) == 4540.0  # the limit less the margin for the start and the end table
    monkeypatch.setenv(JOB_END_ENV, str(time.time() + 30))
    assert gpu_stage.seconds_left(ladder)[0] is False
    assert gpu_stage.run("ladder", Path("unused"), None) == 0  # nothing started: the next job runs it
    assert gpu_stage.fits("budget") == 1
    said = capsys.readouterr().out
    assert said.count("stage ladder not started: ") == 2 and "less than 60 s; run it in the next job" in said
    for value in ("soon", "nan", "inf", "1e400"):  # NaN and inf read as no limit at all before
        monkeypatch.setenv(JOB_END_ENV, value)
        with pytest.raises(SystemExit, match=f"GPTCORE_JOB_END: '{value}' is not a Unix time"):
            gpu_stage.job_end_now()
    monkeypatch.setenv(TIME_LIMIT_ENV, "1800")  # the limit from the environment where --time-limit is not given
    assert gpu_stage.time_limit(None) == 1800.0 and gpu_stage.time_limit("900") == 900.0
    with pytest.raises(SystemExit, match="time limit 'an hour' is not a number of seconds"):
        gpu_stage.time_limit("an hour")


def pytest_not_run(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """gpu_stage.py's pytest as a stage starts it, without running it, and with no job end set: the argument list
    of each start, for the test to check."""
    from scripts import gpu_stage

    started: list[list[str]] = []

    class Child:
        def __init__(self, args, **_):
            started.append(args)
            self.stdout = iter(())

        def wait(self):
            return 0

    monkeypatch.setattr(gpu_stage.subprocess, "Popen", Child)
    monkeypatch.delenv("GPTCORE_JOB_END", raising=False)
    return started


def test_a_second_job_of_a_stage_in_the_same_folder_keeps_the_first_jobs_benchmark_json(tmp_path, monkeypatch):
    """GPU session 2 ran ``ladder -k 'ladder-8 or ... 11'`` then ``ladder -k ladder-12`` into one folder: the second
    pytest opened ``ladder.json`` as it started and was killed, which left the first job's benchmarks empty. Each job
    now writes a JSON of its own (an empty one, a killed job's, is taken again)."""
    from scripts import gpu_stage

    started = pytest_not_run(monkeypatch)
    out = tmp_path / "s2"
    out.mkdir()
    (out / "ladder.json").write_text('{"benchmarks": ["the first job\'s"]}')
    assert gpu_stage.run("ladder", out, None, "ladder-12") == 0

    def given() -> list[str]:  # the JSON each start was given
        return [args[args.index("--benchmark-json") + 1] for args in started]

    assert given() == [str(out / "ladder-2.json")] and "the first job's" in (out / "ladder.json").read_text()
    (out / "ladder-2.json").touch()  # that job was killed before pytest-benchmark wrote anything: taken again
    gpu_stage.run("ladder", out, None, "ladder-12")
    (out / "ladder-2.json").write_text("{}")
    gpu_stage.run("ladder", out, None, "ladder-12")
    assert given()[1:] == [str(out / "ladder-2.json"), str(out / "ladder-3.json")]


def test_a_stages_bad_out_or_resume_is_one_line_before_pytest_starts_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    """--out that is a file, or --resume of a log pytest cannot read: one line and exit 2, before pytest starts and
    before the log is copied in (a copied bad log stayed in the folder and stopped every later job of the stage). A
    --resume log that does not exist is a stage never run before (gpu_session.sh --resume-from names every stage's
    log): it starts afresh, and says so."""
    from scripts import gpu_stage

    started = pytest_not_run(monkeypatch)
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert gpu_stage.run("ladder", a_file, None) == 2
    assert capsys.readouterr().err == f"gpu_stage.py: --out {a_file}: a file; give a folder\n"
    under = a_file / "sub"  # a NotADirectoryError traceback before
    assert gpu_stage.run("ladder", under, None) == 2
    assert capsys.readouterr().err == f"gpu_stage.py: --out {under}: {a_file} is a file, not a folder\n"
    corrupt = tmp_path / "earlier.jsonl"
    corrupt.write_bytes(b"\xff not a log\n{}\n")
    out = tmp_path / "job"
    assert gpu_stage.run("ladder", out, corrupt) == 2
    said = capsys.readouterr().err
    assert said == f"gpu_stage.py: --resume: {corrupt}: not a results log (not UTF-8 text)\n"
    assert not started and not out.exists()
    assert gpu_stage.run("ladder", out, tmp_path / "never.jsonl") == 0 and len(started) == 1
    assert f"stage ladder: no earlier log at {tmp_path / 'never.jsonl'}: it starts afresh" in capsys.readouterr().out
    assert "--resume" not in started[0]


def test_stages_named_together_share_the_job_and_a_failed_smoke_stops_the_rest(tmp_path):
    # A job's end is fixed once, as the session starts: its start + the limit - 60 s of margin, in whole seconds
    # (truncated). Started between `before` and `after`, a job of 220 s ends in [before + 159, after + 160]: bounds
    # that hold however long the start takes
    before = time.time()
    end = subprocess.run(
        [sys.executable, "scripts/gpu_stage.py", "job-end", "--time-limit", "220"],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    after = time.time()
    assert end.returncode == 0, end.stderr
    assert before + 220 - MARGIN_SECONDS - 1 <= int(end.stdout) <= after + 220 - MARGIN_SECONDS

    # ladder then budget in one job whose end is given (it wins over --time-limit, which would give 160 s): each
    # stage gets what is left of that one end when it starts. Ladder's pytest gets it as its deadline (and refuses:
    # no GPU); the budget stage, planned at 420 s, is not started, with what ladder left; the run ends with ladder's
    # exit status. Both stages start between `before` and `after`, so each figure, printed to the second (0.5 s),
    # lies within 0.5 s of [end - after, end - before], however long the stages take; and budget, started after
    # ladder, has no more left than ladder had, where a job of its own would give it about 160 s (end - before is
    # at most 150)
    before = time.time()
    job_end = int(before) + 150
    args = ["ladder,budget", str(tmp_path / "a"), "--time-limit", "220"]
    done = gpu_session(args, GPTCORE_JOB_END=str(job_end))
    after = time.time()
    assert done.returncode == 4, done.stdout + done.stderr
    deadline = float(done.stdout.split("--deadline ", 1)[1].split()[0])
    budget = done.stdout.split("stage budget not started: planned at 420 s, ", 1)[1]
    left = float(budget.split(" s left of this job", 1)[0])
    assert job_end - after - 0.5 <= left <= deadline <= job_end - before + 0.5
    assert (tmp_path / "a" / "ladder.log").exists() and not (tmp_path / "a" / "budget.log").exists()

    # packed every second while it runs, as every 15 s in a longer job: the last pack, at the end, still stands
    pack = ["--pack", str(tmp_path / "b" / "all.tar.gz")]
    no_cache = str(tmp_path / "no-cache")  # no inductor cache: nothing beside the pack
    stopped = gpu_session(
        ["smoke,ladder", str(tmp_path / "b"), *pack], GPTCORE_PACK_EVERY="1", TORCHINDUCTOR_CACHE_DIR=no_cache
    )
    assert stopped.returncode == 4, stopped.stdout + stopped.stderr
    assert "smoke failed (exit 4): the stages after it are not run" in stopped.stderr
    assert (tmp_path / "b" / "smoke.log").exists() and not (tmp_path / "b" / "ladder.log").exists()
    with tarfile.open(tmp_path / "b" / "all.tar.gz") as packed:  # packed at the end, itself left out
        names = set(packed.getnames())
    assert "./smoke.log" in names and not any("all.tar.gz" in n for n in names)
    assert sorted(p.name for p in (tmp_path / "b").glob("all.tar.gz*")) == ["all.tar.gz"]  # no .part, no .stop

    no_limit = gpu_session(["ladder", str(tmp_path / "d")])  # no time limit anywhere: no deadline is passed
    assert no_limit.returncode == 4 and "--deadline" not in no_limit.stdout, no_limit.stdout + no_limit.stderr
    bad = gpu_session(["ladder", str(tmp_path / "e"), "--time-limit", "soon"])
    assert bad.returncode == 2 and bad.stderr.strip() == "gpu_stage: time limit 'soon' is not a number of seconds"

    # the script stages without a GPU: a failed stage each, named (budget passed before, its status tee's; profile
    # ran its matmuls and its profile on the CPU)
    scripts = gpu_session(["budget,profile", str(tmp_path / "f")])
    assert scripts.returncode == 2, scripts.stdout + scripts.stderr
    assert scripts.stderr.splitlines() == [
        f"gpu_session.sh: stage {stage} needs CUDA, and {sys.executable} sees none" for stage in ("budget", "profile")
    ]
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    onto_a_file = gpu_session(["smoke", str(a_file)])  # mkdir's own line came first before
    assert (
        onto_a_file.returncode == 2
        and onto_a_file.stderr == f"gpu_session.sh: OUT_DIR {a_file}: a file; give a folder\n"
    )
    unknown = gpu_session(["ladder,ladr", str(tmp_path / "c")])
    assert unknown.returncode == 2 and not (tmp_path / "c").exists()  # nothing ran
    assert unknown.stderr.strip().splitlines() == [
        "unknown stage ladr: plan, smoke, ladder, memory, char, convergence, verify, budget or profile"
    ]


def test_the_inductor_cache_comes_back_beside_the_pack_in_parts_and_a_carried_one_is_unpacked(tmp_path):
    """A lent GPU machine starts bare and hands back files of 16 MiB at most, so the compiles of one session are lost
    to the next unless the cache travels. Parts carried in (.inductor/) are unpacked into an empty cache before the
    first stage; at the end the cache, without Triton's binaries, is written beside the pack in parts of 15 MiB; a
    cache over GPTCORE_CACHE_MAX_BYTES is said and not written; a cache already there is not overwritten."""
    import io

    made = io.BytesIO()
    with tarfile.open(fileobj=made, mode="w:gz") as tar:
        for name, data in (("./fxgraph/entry", b"graph" * 1000), ("./triton/kernel.cubin", b"binary")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    carried = tmp_path / "carried"
    carried.mkdir()
    half = len(made.getvalue()) // 2  # two parts, joined in order as split writes them
    (carried / "inductor.tar.gz.part-00").write_bytes(made.getvalue()[:half])
    (carried / "inductor.tar.gz.part-01").write_bytes(made.getvalue()[half:])
    cache, back = tmp_path / "cache", tmp_path / "back"
    env = dict(TORCHINDUCTOR_CACHE_DIR=str(cache), GPTCORE_INDUCTOR_CARRY=str(carried))
    done = gpu_session(["ladder", str(tmp_path / "out"), "--pack", str(back / "s.tar.gz")], **env)
    assert done.returncode == 4, done.stdout + done.stderr  # no GPU: the stage refuses, the cache still travels
    assert (cache / "fxgraph" / "entry").read_bytes() == b"graph" * 1000
    assert f"inductor cache: unpacked {carried}/inductor.tar.gz.part-* into {cache}" in done.stdout
    assert sorted(p.name for p in back.iterdir()) == ["inductor.tar.gz.part-00", "s.tar.gz"]
    with tarfile.open(back / "inductor.tar.gz.part-00") as packed:  # one part: a whole archive
        assert "./fxgraph/entry" in packed.getnames() and not any("triton" in n for n in packed.getnames())
    with tarfile.open(back / "s.tar.gz") as packed:
        assert not any("inductor" in n for n in packed.getnames())

    (cache / "fxgraph" / "entry").write_bytes(b"newer")  # a warm machine's own cache stays as it is
    big = gpu_session(
        ["ladder", str(tmp_path / "out2"), "--pack", str(back / "s.tar.gz")], **env, GPTCORE_CACHE_MAX_BYTES="10"
    )
    assert (cache / "fxgraph" / "entry").read_bytes() == b"newer" and "unpacked" not in big.stdout
    assert "inductor cache: " in big.stderr and "B packed, over 10: not handed back" in big.stderr
    assert sorted(p.name for p in back.iterdir()) == ["s.tar.gz"]


def test_an_interpreter_without_the_projects_dependencies_is_one_line_and_exit_2(tmp_path):
    bare = tmp_path / "bare-python"  # this Python without its site-packages: no torch, tabulate, pytest, ...
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    proc = gpu_session(["plan"], PYTHON=str(bare))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"gpu_session.sh: {bare} lacks torch numpy tabulate pytest pytest_benchmark: ")
    assert "pip install -e '.[dev,gpu]'" in line


def test_a_plan_for_a_recorded_gpu_takes_the_times_its_baselines_recorded():
    """`plan --device nvidia-h200` plans the ladder from the H200's recorded wall times (the first GPU run measured
    151 s for a ladder an H100 at the assumed 30% MFU was planned at 303 s); an unknown device is one line."""
    from types import SimpleNamespace

    from scripts import gpu_stage

    recorded = gpu_stage.recorded_seconds("nvidia-h200")
    committed = json.loads((ROOT / "baselines" / "nvidia-h200.json").read_text())["benchmarks"]
    assert (
        recorded == {name: e["seconds"] for name, e in committed.items()} and len(recorded) == 22
    )  # ladder-0 to 9, liger's case and FP8's beside them, 10 memory recipes (the top rung, ladder-10, not yet run)
    item = SimpleNamespace(nodeid="bench/test_ladder.py::test_ladder[gpt2-ladder-8]", name="test_ladder[gpt2-ladder-8]")
    planned = plan.estimate(item, {}, (None,) * 3, recorded[item.name])
    assert planned == plan.Estimate(recorded[item.name] * plan.HISTORY_MARGIN, "baseline")
    with pytest.raises(SystemExit, match=r"^gpu_stage: no baselines/nvidia-b300\.json \(recorded GPUs: nvidia-h200\)$"):
        gpu_stage.recorded_seconds("nvidia-b300")
    assert gpu_stage.recorded_seconds(None) == {}


def test_k_narrows_a_stage_to_the_cases_it_names_and_keeps_the_stages_own_selection(tmp_path):
    """`gpu_session.sh memory,verify -k budget`: the stages run (and plan) only the cases -k matches (the budgets left
    over by an earlier job's deadline), and-ed with a stage's own -k (convergence's shorter runs)."""
    from scripts.gpu_stage import selected

    memory, convergence = STAGES["memory"].pytest, STAGES["convergence"].pytest
    assert selected(memory, None) == memory and selected(memory, "budget") == [*memory, "-k", "budget"]
    narrowed = selected(convergence, "fp16")
    assert narrowed.count("-k") == 1 and narrowed[narrowed.index("-k") + 1] == f"({CONVERGENCE_SHORT}) and (fp16)"
    planned = gpu_session(["plan", "--time-limit", "540", "-k", "budget"])  # the plan narrows as the run does
    assert planned.returncode == 0, planned.stdout + planned.stderr
    stages = dict(part.split(":", 1) for part in planned.stdout.split("\n== ")[1:])
    ids = [line.split("::")[-1].split()[0] for line in stages["memory"].splitlines() if "::" in line]
    assert ids == [f"test_memory_recipes[deep-1.6b-{r}]" for r in MEMORY_RECIPES if "budget" in r], planned.stdout
    assert stages["ladder"].strip() == "no case matches -k budget"
    assert planned.stdout.rstrip().endswith("OUT_DIR [--time-limit S] -k budget")  # the run it plans
    done = gpu_session(["memory", str(tmp_path / "a"), "-k", "budget"])  # no GPU: pytest refuses, after the command
    assert done.returncode == 4 and "/test_memory_recipes.py -k budget --require-gpu" in done.stdout, done.stdout
    bad = gpu_session(["memory", str(tmp_path / "b"), "-k"])
    assert bad.returncode != 0 and "-k: a pytest -k expression" in bad.stderr
    misspelt = gpu_session(["plan", "--time-limit", "540", "-k", "budgett"])  # "Every job fits", exit 0 before
    assert misspelt.returncode == 2 and "Every job fits" not in misspelt.stdout
    assert misspelt.stderr.strip() == "NO CASE of any pytest stage matches -k budgett: a session with it would run none"


def test_a_case_needing_more_gpus_than_the_machine_has_is_planned_as_skipped(monkeypatch):
    """A 2-rank GPU case on a machine with no GPU in sight (a plan made on CPU for a lent machine of PLAN_GPUS = 1)
    plans at 0 s, naming why: it skips itself there. The same case on 1 rank, or on CPU ranks, is planned."""
    from types import SimpleNamespace

    from gptcore.config import Timing

    monkeypatch.setattr(plan, "gpus_for_plan", lambda device: 1 << 30 if device != "cuda" else plan.PLAN_GPUS)
    assert plan.PLAN_GPUS == 1
    timing = Timing(warmup=5, rounds=10, steps_per_round=5)

    def item(device: str, world: int) -> SimpleNamespace:
        params = {"model": "gpt2", "recipe": "ddp", "device": device, "world": world}
        module = SimpleNamespace(STUDY=None, TIMING=timing)
        return SimpleNamespace(nodeid=f"bench/x.py::x[{device}-{world}]", callspec=SimpleNamespace(params=params),
                               module=module, name="x")  # fmt: skip

    two = plan.estimate(item("cuda", 2), {})
    assert (two.seconds, two.source) == (0.0, "skipped: needs 2 GPUs")
    assert plan.estimate(item("cuda", 1), {}).seconds > 0
    assert plan.estimate(item("cpu", 2), {}).seconds > 0


def test_the_planned_time_is_the_closed_form_of_its_stated_assumptions():
    """gate/plan.py's assumptions, each as arithmetic: compile's 30 s plus 1 s a block (one block when regional, plus
    AUTOTUNE_SECONDS when autotuned); world ranks share the global batch; the steps run are the warm-up, the timed
    rounds' (or up to the ledger's loss step when later) and the ledger's, plus the CPU's tracked pass for an eager
    recipe; a fitted batch's step is as much longer as the batch; a results log's time x HISTORY_MARGIN comes
    before the baseline's and before any assumption; --bench-rounds is planned as it will run."""
    from types import SimpleNamespace

    from gptcore.config import Schedule, Timing
    from gptcore.memory.fit import fitted

    gpt2, top = MODELS["gpt2"], RECIPES["ladder-8"]
    assert plan.compile_seconds(gpt2, top) == 30 + 12
    assert plan.compile_seconds(gpt2, dataclasses.replace(top, compile_scope="blocks")) == 30 + 1
    tuned = dataclasses.replace(top, compile_mode="max-autotune-no-cudagraphs")
    assert plan.compile_seconds(gpt2, tuned) == 30 + 12 + plan.AUTOTUNE_SECONDS
    fp32, tf32 = (plan.step_seconds(gpt2, dataclasses.replace(top, precision=p), "cuda") for p in ("fp32", "tf32"))
    assert tf32 == pytest.approx(fp32 * 67.0 / 494.7)  # TF32 on tensor cores: the H100 SXM's 494.7 TFLOP/s, not 67
    assert plan.step_seconds(gpt2, RECIPES["ddp"], "cuda", world=2) == pytest.approx(
        plan.step_seconds(gpt2, RECIPES["ddp"], "cuda") / 2
    )
    step, setup, tracked = (
        plan.step_seconds(MODELS["cpu-small"], RECIPES["fp32"], "cpu"),
        1.0,
        2 * plan.TRACKED_PASS_COST,
    )
    assert plan.SETUP_SECONDS == {"cpu": setup, "cuda": 5.0}
    counts = dict(warmup=2, rounds=3, steps_per_round=2)
    assert plan.case_seconds("cpu-small", "fp32", "cpu", **counts) == pytest.approx(
        setup + (2 + 6 + 1 + tracked) * step
    )
    late = plan.case_seconds("cpu-small", "fp32", "cpu", **counts, loss_step=20)
    assert late == pytest.approx(setup + (20 + 1 + tracked) * step)
    compiled = plan.step_seconds(MODELS["cpu-small"], top, "cpu")
    assert plan.case_seconds("cpu-small", "ladder-8", "cpu", **counts) == pytest.approx(
        setup + plan.compile_seconds(MODELS["cpu-small"], top) + (2 + 6 + 1) * compiled  # no tracked pass
    )
    batch = fitted(gpt2, RECIPES["ladder-9"], "cuda", plan.PLAN_MEMORY_BYTES).batch_size
    steps = {
        name: plan.case_seconds("gpt2", name, "cuda", **counts) - 5.0 - (30 + 12) for name in ("ladder-8", "ladder-9")
    }
    assert steps["ladder-9"] == pytest.approx(steps["ladder-8"] * batch / gpt2.batch_size)
    # evaluations at steps 0, 50 and 100, of 6 batches each: a forward is a third of a step
    run = Schedule(steps=100, eval_every=50, eval_batches=6)
    assert len(run.eval_steps) == 3
    trained = plan.case_seconds("cpu-small", "fp32", "cpu", schedule=run)
    assert trained == pytest.approx(setup + (100 + 3 * 6 / 3) * step)
    params = {"model": "cpu-small", "recipe": "fp32", "device": "cpu"}
    item = SimpleNamespace(nodeid="bench/x.py::x[cpu-small-fp32]", name="x[cpu-small-fp32]",
                           callspec=SimpleNamespace(params=params), module=SimpleNamespace(STUDY=None,
                           TIMING=Timing(warmup=2, rounds=3, steps_per_round=2)))  # fmt: skip
    logged = plan.estimate(item, {item.nodeid: 100.0}, baseline_seconds=50.0)
    assert (logged.seconds, logged.source) == (pytest.approx(115.0), "results log")
    assert plan.estimate(item, {}, baseline_seconds=50.0).seconds == pytest.approx(57.5)
    five = plan.estimate(item, {}, (None, 5, None))
    assert (five.seconds, five.source) == (pytest.approx(setup + (2 + 10 + 1 + tracked) * step), "assumed")
