"""The GitHub workflows: valid against the vendored GitHub-workflow JSON schema (check-jsonschema, offline), the
hosted job runs .ci/run on the CPU torch wheel, the GPU job runs the gated GPU tier on a self-hosted GPU runner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

pytestmark = pytest.mark.cpu

WORKFLOWS = Path(__file__).resolve().parent.parent / ".github" / "workflows"


def load(name: str) -> dict:
    return YAML(typ="safe").load((WORKFLOWS / name).read_text())


def steps(workflow: dict, job: str) -> list[dict]:
    return workflow["jobs"][job]["steps"]


def runs(workflow: dict, job: str) -> str:
    return "\n".join(step.get("run", "") for step in steps(workflow, job))


@pytest.mark.parametrize("name", ["ci.yml", "gpu.yml"])
def test_workflow_is_valid_against_the_github_workflow_schema(name: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(WORKFLOWS / name)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ci_takes_the_cpu_torch_wheel_and_runs_ci_run_on_python_311() -> None:
    ci = load("ci.yml")
    job = ci["jobs"]["cpu"]
    assert job["runs-on"] == "ubuntu-latest"
    setup = next(s for s in steps(ci, "cpu") if s.get("uses", "").startswith("actions/setup-python"))
    assert setup["with"]["python-version"] == "3.11"
    # .ci/run installs torch==2.13.0 in a fresh venv: the CPU index makes that the +cpu wheel, not CUDA's
    assert job["env"]["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert "bash .ci/run" in [s.get("run") for s in steps(ci, "cpu")]


def test_ci_keeps_inductors_compile_cache_where_ci_run_compiles_into_it() -> None:
    ci = load("ci.yml")
    cache = next(s for s in steps(ci, "cpu") if s.get("uses", "").startswith("actions/cache"))
    run = next(s for s in steps(ci, "cpu") if s.get("run") == "bash .ci/run")
    assert run["env"]["TORCHINDUCTOR_CACHE_DIR"] == cache["with"]["path"]
    assert steps(ci, "cpu").index(cache) < steps(ci, "cpu").index(run)  # restored before, saved after the job
    # a new torch pin starts a new cache; a gptcore change restores the newest one of the same pin
    assert "hashFiles('.ci/run', 'constraints-cpu.txt')" in cache["with"]["key"]
    assert cache["with"]["key"].startswith(cache["with"]["restore-keys"])


def test_ci_posts_the_gates_markdown_on_the_pull_request_and_the_gpu_job_writes_it() -> None:
    ci = load("ci.yml")
    assert ci["jobs"]["cpu"]["env"]["GPTCORE_GATE_MARKDOWN"] == "${{ github.workspace }}/gate.md"
    post = steps(ci, "cpu")[-1]
    assert "gh pr comment" in post["run"] and "--body-file gate.md" in post["run"]
    assert post["if"].startswith("always()") and ci["permissions"]["pull-requests"] == "write"
    assert "--gate-markdown=out/gate.md" in " ".join(runs(load("gpu.yml"), "gpu").split())


def test_gpu_job_runs_on_a_self_hosted_gpu_runner() -> None:
    runs_on = load("gpu.yml")["jobs"]["gpu"]["runs-on"]
    assert "self-hosted" in runs_on and "gpu" in runs_on


def test_gpu_job_runs_the_gated_gpu_tier_and_uploads_json_and_report_always() -> None:
    gpu = load("gpu.yml")
    command = " ".join(runs(gpu, "gpu").split())
    for flag in ("pytest bench -m gpu --require-gpu", "--benchmark-compare", "--benchmark-compare-fail=median:5%",
                 "--benchmark-json=out/gpu-bench.json"):
        assert flag in command
    assert "python -m gptcore report out/gpu-bench.json" in command
    upload = next(s for s in steps(gpu, "gpu") if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and "out/" in upload["with"]["path"]
