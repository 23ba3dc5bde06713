"""Change points over commits (gptcore.history): found at the noise levels benchmarks have, rare when there is
none, named by a commit range that holds the commit that made them; creeping slopes; exact metrics step at their
commit; bad input is one line; and a real history of this project's CPU tier names the commit that planted a
change and no other."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gptcore import history
from gptcore.history import Point

from .test_gate import ROOT, child_env

pytestmark = pytest.mark.cpu


def series(n: int, cv: float, *, step_at: int | None = None, step: float = 0.0, seed: int = 0) -> list[Point]:
    """n points, one per commit c000.., around 1000 with a relative noise ``cv``, and ``step`` from ``step_at``."""
    rng = random.Random(seed)
    return [Point(f"c{i:03d}", f"{i:03d}", 1000 * (1 + (step if step_at is not None and i >= step_at else 0))
                  * (1 + rng.gauss(0, cv))) for i in range(n)]


def holds(finding: history.Finding, commit: int) -> bool:
    """The finding's range (last commit before, first after] holds commit ``commit``."""
    return int(finding.before[1:]) < commit <= int(finding.after[1:])


def test_a_3pct_step_with_8_points_after_is_found_at_cv_0_6pct_in_its_commit_range():
    # CV 0.6%: a quiet GPU runner; a 3% drop is 5 noise sigmas. 16 points before, 8 after, 100 seeds
    found = 0
    for seed in range(100):
        steps = history.noisy_steps("c", "tokens/s", series(24, 0.006, step_at=16, step=-0.03, seed=seed))
        hits = [f for f in steps if holds(f, 16)]
        found += bool(hits)
        assert all(f.status == "regression" and f.relative < 0 for f in hits)
    assert found >= 95


@pytest.mark.parametrize("cv", [0.006, 0.027])  # a quiet GPU runner, a hosted runner
def test_at_most_one_false_change_point_in_100_step_free_series(cv: float):
    false = sum(len(history.noisy_steps("c", "tokens/s", series(50, cv, seed=1000 + seed))) for seed in range(100))
    assert false <= 1


def test_a_creeping_loss_of_1pct_a_commit_over_6_commits_is_reported_with_its_window():
    points = series(12, 0.006, seed=7)
    for i, p in enumerate(points[12 - 6:]):  # the last 6 commits lose 1% more each
        p.value *= 1 - 0.01 * (i + 1)
    creeps = history.creeping("c", "tokens/s", points)
    assert len(creeps) == 1 and creeps[0].status == "creeping"
    assert creeps[0].note.endswith("per commit over 6 commits") and creeps[0].note.startswith("-1.")
    assert int(creeps[0].before[1:]) >= 5 and creeps[0].after == "c011"
    assert history.creeping("c", "tokens/s", series(12, 0.006, seed=7)) == []  # flat: none


def test_an_exact_metric_steps_at_its_commit_and_hud_rule_names_it():
    values = [100, 100, 100, 120, 120, 120, 130]
    points = [Point(f"c{i}", str(i), v) for i, v in enumerate(values)]
    steps = history.exact_steps("case", "peak memory", points)
    assert [(f.before, f.after, f.change, f.status) for f in steps] == [
        ("c2", "c3", 20, "regression"),  # 3 points after: a regression
        ("c5", "c6", 10, "suspicious")]  # 1 point after: suspicious (HUD: 2 or more make a regression)
    assert steps[0].command() == "python -m gptcore bisect c2 c3 -k case --metric peak_memory"


def save(folder: Path, number: int, commit: str | None, cases: dict[str, dict], slug: str = "cpu") -> None:
    """A pytest-benchmark saved run of ``cases`` (name -> extra_info) at ``commit``."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {"machine_info": {"device_slug": slug}, "datetime": f"2026-11-{number:02d}T00:00:00",
            "commit_info": {"id": commit, "time": f"2026-11-{number:02d}T00:00:00"} if commit else {},
            "benchmarks": [{"name": name, "extra_info": info} for name, info in cases.items()]}
    (folder / f"{number:04d}_{commit or 'none'}.json").write_text(json.dumps(data))


def test_bad_input_is_one_line_each_and_the_rest_goes_on(tmp_path: Path, capsys):
    from gptcore.cli import main

    assert main(["history", "--storage", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip() == (f"gptcore: error: {tmp_path / 'nowhere'}: no such directory "
                                               f"(pytest-benchmark's storage, e.g. .benchmarks/cpu)")
    (tmp_path / "empty").mkdir()
    assert main(["history", "--storage", str(tmp_path / "empty")]) == 2
    assert "no saved pytest-benchmark run" in capsys.readouterr().err
    runs = tmp_path / "runs" / "Linux-CPython-3.11-64bit"
    case = {"test_x[a-b]": {"device": "cuda", "tokens_per_s": 1000.0, "peak_allocated_bytes": 10}}
    for i in range(1, 4):
        save(runs, i, f"c{i}", case, slug="nvidia-h100")
    save(runs, 4, None, case, slug="nvidia-h100")
    save(runs, 5, "c5", case, slug="cpu")
    assert main(["history", "--storage", str(tmp_path / "runs")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "gptcore history: 0004_none.json: no commit recorded (left out)" in err
    assert "gptcore history: 0005_c5.json: device cpu, not nvidia-h100 like the rest (left out)" in err
    assert any("test_x[a-b] tokens/s: 3 point(s), fewer than the 6" in line for line in err)


def test_the_html_history_shades_each_change_point(tmp_path: Path):
    pytest.importorskip("matplotlib")
    from gptcore.report_html import build_html

    runs = tmp_path / "history" / "Linux-CPython-3.11-64bit"
    name = "test_cpu_shape[cpu-small-ckpt-fp32]"
    for i in range(1, 7):
        save(runs, i, str(i) * 40, {name: {"device": "cpu", "model": "cpu-small", "recipe": "ckpt-fp32",
                                           "tokens_per_s": 1000.0, "peak_allocated_bytes": 100 if i < 4 else 120}})
    run = {"machine_info": {"device_slug": "cpu"}, "benchmarks": [
        {"group": "cpu-shape study", "name": name, "extra_info": {"device": "cpu", "model": "cpu-small",
                                                                 "recipe": "ckpt-fp32", "tokens_per_s": 1000.0,
                                                                 "peak_allocated_bytes": 120}}]}
    (tmp_path / "run.json").write_text(json.dumps(run))
    page = build_html(tmp_path / "run.json", baselines_dir=tmp_path, history=tmp_path / "history")
    assert f"change points shaded: {name} peak memory regression 3333333..4444444" in page
    assert "1 change point(s) or creep(s)" in page


@pytest.mark.slow  # four commits, the CPU tier's one case at each: ~40 s on 2 cores
def test_a_real_history_names_the_commit_that_planted_a_change_and_no_other(tmp_path: Path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    for part in ("gptcore", "bench", "conftest.py", "pyproject.toml"):
        source = ROOT / part
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, repo / part)
    for junk in repo.rglob("__pycache__"):
        shutil.rmtree(junk)
    storage = tmp_path / "storage"
    env = child_env() | {"PYTHONPATH": str(repo)}
    commits = []
    for i, message in enumerate(["base", "harmless", "widen cpu-small", "harmless again"]):
        if message == "widen cpu-small":
            presets = repo / "gptcore" / "presets.py"
            text = presets.read_text()
            assert text.count("_CPU = GPTConfig(n_layer=4, n_head=4, n_embd=128,") == 1
            presets.write_text(text.replace("_CPU = GPTConfig(n_layer=4, n_head=4, n_embd=128,",
                                            "_CPU = GPTConfig(n_layer=4, n_head=4, n_embd=160,"))
        elif i:
            (repo / "NOTES").write_text(f"{message}\n")
        git("add", "-A")
        git("commit", "-qm", message)
        commits.append(git("rev-parse", "HEAD"))
        run = subprocess.run([sys.executable, "-m", "pytest", "bench/test_cpu_shape.py", "-k", "cpu-small-ckpt-fp32",
                              "-p", "no:cacheprovider", "--bench-warmup", "1", "--bench-rounds", "1",
                              "--bench-steps", "1", "--baselines-dir", str(tmp_path / "baselines"),
                              "--benchmark-autosave", f"--benchmark-storage=file://{storage}"],
                             cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
    found = history.analyse(storage)
    assert found.runs == 4 and found.findings
    assert {(f.before, f.after) for f in found.findings} == {(commits[1], commits[2])}  # that range, no other
    metrics = {f.metric for f in found.findings}
    assert "peak memory" in metrics and "flops" in metrics  # a wider model: more memory, more FLOPs
    assert all(f.status == "regression" for f in found.findings if f.metric in ("peak memory", "flops"))
