"""The GitHub workflows: valid against the vendored GitHub-workflow JSON schema (check-jsonschema, offline), the
hosted job runs .ci/run on the CPU torch wheel, the GPU job runs the gated GPU tier on a self-hosted GPU runner, the
weekly torch-upgrade job runs the CPU tier and compare under the newest torch release."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_style import python_floor

# check-jsonschema's (the dev extra); without it (a bare GPU image's `pytest tests -m gpu`) the module skips, naming it,
# rather than stopping the collection of every other test
YAML = pytest.importorskip("ruamel.yaml", reason="needs ruamel.yaml (pip install -e '.[dev]')").YAML

pytestmark = pytest.mark.cpu

WORKFLOWS = Path(__file__).resolve().parent.parent / ".github" / "workflows"


def load(name: str) -> dict:
    return YAML(typ="safe").load((WORKFLOWS / name).read_text())


def steps(workflow: dict, job: str) -> list[dict]:
    return workflow["jobs"][job]["steps"]


def runs(workflow: dict, job: str) -> str:
    return "\n".join(step.get("run", "") for step in steps(workflow, job))


@pytest.mark.parametrize("name", ["ci.yml", "gpu.yml", "torch-upgrade.yml"])
def test_workflow_is_valid_against_the_github_workflow_schema(name: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
            str(WORKFLOWS / name),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def python_versions(workflow: dict) -> list[str]:
    """The Pythons its job 'cpu' sets up: its matrix's, or the one it names."""
    job = workflow["jobs"]["cpu"]
    setup = next(s for s in steps(workflow, "cpu") if s.get("uses", "").startswith("actions/setup-python"))
    version = setup["with"]["python-version"]
    return job["strategy"]["matrix"]["python"] if version == "${{ matrix.python }}" else [version]


def assert_hosted_cpu_job(workflow: dict) -> None:
    """Its job 'cpu' runs on GitHub's standard runner with Python 3.11 and takes torch's CPU wheel."""
    job = workflow["jobs"]["cpu"]
    assert job["runs-on"] == "ubuntu-latest"
    assert "3.11" in python_versions(workflow)
    # torch==<pin> in a fresh venv: the CPU index makes that the +cpu wheel, not CUDA's
    assert job["env"]["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def test_ci_takes_the_cpu_torch_wheel_and_runs_ci_run_on_python_311() -> None:
    ci = load("ci.yml")
    assert_hosted_cpu_job(ci)
    assert "bash .ci/run" in [s.get("run") for s in steps(ci, "cpu")]


def test_ci_runs_on_the_oldest_python_that_requires_python_admits_and_comments_once() -> None:
    ci = load("ci.yml")
    versions = python_versions(ci)
    assert versions[0] == "3.11" and python_floor() in versions and len(versions) == len(set(versions)) == 3
    assert ci["jobs"]["cpu"]["strategy"]["fail-fast"] is False  # one Python's failure does not hide the other's
    cache = next(s for s in steps(ci, "cpu") if s.get("uses", "").startswith("actions/cache"))
    assert "${{ matrix.python }}" in cache["with"]["restore-keys"]  # a compiled graph is not another Python's
    comment = next(s for s in steps(ci, "cpu") if s.get("name") == "The gate's verdict on the pull request")
    assert "matrix.python == '3.11'" in comment["if"]


def test_readme_names_the_pythons_ci_runs_on() -> None:
    versions = sorted(python_versions(load("ci.yml")), key=lambda v: tuple(int(part) for part in v.split(".")))
    readme = (WORKFLOWS.parents[1] / "README.md").read_text()
    assert f"Python {versions[0]} to {versions[-1]})" in readme and versions[0] == python_floor()


def test_ci_checks_out_the_whole_history_that_compare_across_the_rooms_needs() -> None:
    # tests/test_compare.py compares this tree with a commit from before the rooms: a shallow clone lacks it
    checkout = next(s for s in steps(load("ci.yml"), "cpu") if s.get("uses", "").startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0


def test_ci_keeps_inductors_compile_cache_where_ci_run_compiles_into_it() -> None:
    ci = load("ci.yml")
    cache = next(s for s in steps(ci, "cpu") if s.get("uses", "").startswith("actions/cache"))
    run = next(s for s in steps(ci, "cpu") if s.get("run") == "bash .ci/run")
    assert run["env"]["TORCHINDUCTOR_CACHE_DIR"] == cache["with"]["path"]
    assert steps(ci, "cpu").index(cache) < steps(ci, "cpu").index(run)  # restored before, saved after the job
    # a new torch pin starts a new cache; a gptcore change restores the newest one of the same pin
    assert "hashFiles('.ci/run', 'constraints-cpu.txt')" in cache["with"]["key"]
    assert cache["with"]["key"].startswith(cache["with"]["restore-keys"])


def _cpu_key(step: dict, cpuinfo: Path, tmp_path: Path) -> str:
    """What the workflow's CPU step writes to $GITHUB_OUTPUT, reading ``cpuinfo`` for /proc/cpuinfo."""
    out = tmp_path / "github_output"
    out.write_text("")
    command = step["run"].replace("/proc/cpuinfo", str(cpuinfo))
    subprocess.run(["bash", "-c", command], check=True, env={"GITHUB_OUTPUT": str(out), "PATH": "/usr/bin:/bin"})
    [line] = out.read_text().splitlines()
    return line


def test_ci_restores_inductors_cache_only_from_a_runner_of_the_same_cpu(tmp_path: Path) -> None:
    # inductor keys a compiled graph on torch but not on the CPU: one whose kernels were written for AVX-512,
    # restored where they compile for AVX2, computes NaN (docs/gate.md), and the hosted runners are not all one CPU
    ci = load("ci.yml")
    cache = next(s for s in steps(ci, "cpu") if s.get("uses", "").startswith("actions/cache"))
    cpu = next(s for s in steps(ci, "cpu") if s.get("id") == "cpu")
    assert steps(ci, "cpu").index(cpu) < steps(ci, "cpu").index(cache)
    assert "${{ steps.cpu.outputs.key }}" in cache["with"]["restore-keys"]  # so in the key too (its prefix)
    first = "processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC 7763 64-Core Processor\n"
    flags = "flags\t\t: fpu avx avx2 fma\n"
    cpuinfo = tmp_path / "cpuinfo"

    def key_of(text: str) -> str:
        cpuinfo.write_text(text)
        return _cpu_key(cpu, cpuinfo, tmp_path)

    key = key_of(first + flags + "\nprocessor\t: 1\n" + flags)
    assert re.fullmatch(r"key=[0-9a-f]{16}", key)
    assert key_of(first + flags + "\nprocessor\t: 1\nflags\t\t: other\n") == key  # the first CPU's block only
    assert key_of(first + flags.replace("fma", "fma avx512f avx512bw")) != key  # another instruction set
    assert key_of(first.replace("model\t\t: 1", "model\t\t: 17") + flags) != key  # another model


def test_ci_posts_the_gates_markdown_on_the_pull_request_and_the_gpu_job_writes_it() -> None:
    ci = load("ci.yml")
    assert ci["jobs"]["cpu"]["env"]["GPTCORE_GATE_MARKDOWN"] == "${{ github.workspace }}/gate.md"
    post = steps(ci, "cpu")[-1]
    assert "gh pr comment" in post["run"] and "--body-file gate.md" in post["run"]
    assert post["if"].startswith("always()") and ci["permissions"]["pull-requests"] == "write"
    merge = " ".join(runs(load("gpu.yml"), "merge").split())
    assert "--gate-markdown out/gate.md" in merge and 'cat out/gate.md >> "$GITHUB_STEP_SUMMARY"' in merge


def test_gpu_shards_and_their_merge_run_on_self_hosted_gpu_runners() -> None:
    jobs = load("gpu.yml")["jobs"]
    for job in ("shard", "merge"):
        assert "self-hosted" in jobs[job]["runs-on"] and "gpu" in jobs[job]["runs-on"]


def test_gpu_tier_runs_as_a_shard_matrix_each_gated_and_its_log_uploaded_always() -> None:
    gpu = load("gpu.yml")
    shard = gpu["jobs"]["shard"]
    shards = shard["strategy"]["matrix"]["shard"]
    assert shards == list(range(1, len(shards) + 1)) and shard["env"]["SHARDS"] == len(shards) > 1
    assert shard["strategy"]["fail-fast"] is False  # every shard runs whatever another does
    command = " ".join(runs(gpu, "shard").split())
    for flag in (
        "pytest bench -m gpu --require-gpu",
        "--shard ${{ matrix.shard }}/$SHARDS",
        "--results-log=out/shard-${{ matrix.shard }}.jsonl",
        "--benchmark-compare",
        "--benchmark-compare-fail=median:5%",
        "--benchmark-json=out/gpu-bench-${{ matrix.shard }}.json",
    ):
        assert flag in command
    upload = next(s for s in steps(gpu, "shard") if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and "out/" in upload["with"]["path"]
    assert "${{ matrix.shard }}" in upload["with"]["name"]


def test_the_gpu_shards_install_the_gpu_extra_and_one_runs_the_gpu_proofs_in_tests() -> None:
    """Without the gpu extra the rungs past nanoGPT skip and no round samples its clocks; the proofs that need CUDA
    (tests/ marked gpu) run once, on shard 1, whatever the benchmarks did."""
    gpu = load("gpu.yml")
    [install] = [s["run"] for s in steps(gpu, "shard") if "pip install" in s.get("run", "")]
    assert install.rstrip().endswith(
        "python -m pip install -c \"$RUNNER_TEMP/constraints-gpu.txt\" -e '.[dev,plot,gpu]'"
    )
    proofs = [s for s in steps(gpu, "shard") if "pytest tests" in s.get("run", "")]
    assert [" ".join(s["run"].split()) for s in proofs] == [
        "python -m pytest tests -m gpu --require-gpu -p no:cacheprovider"
    ]
    assert proofs[0]["if"] == "always() && matrix.shard == 1"


def test_the_merge_job_waits_for_every_shard_and_merges_all_their_logs_into_one_verdict() -> None:
    gpu = load("gpu.yml")
    merge = gpu["jobs"]["merge"]
    assert merge["needs"] == "shard" and merge["if"] == "always()"  # a failed shard still gets its verdict merged
    download = next(s for s in steps(gpu, "merge") if s.get("uses", "").startswith("actions/download-artifact"))
    shard_upload = next(s for s in steps(gpu, "shard") if s.get("uses", "").startswith("actions/upload-artifact"))
    prefix = shard_upload["with"]["name"].split("${{")[0]
    assert download["with"]["pattern"].startswith(prefix) and download["with"]["merge-multiple"] is True
    command = " ".join(runs(gpu, "merge").split())
    assert "python -m gptcore merge out/shard-*.jsonl --baselines-dir baselines" in command
    upload = next(s for s in steps(gpu, "merge") if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and "baselines/" in upload["with"]["path"]


def test_torch_upgrade_runs_weekly_and_can_be_dispatched() -> None:
    on = load("torch-upgrade.yml")["on"]
    assert "workflow_dispatch" in on
    (cron,) = [entry["cron"] for entry in on["schedule"]]
    minute, hour, day_of_month, month, day_of_week = cron.split()
    assert (day_of_month, month) == ("*", "*") and day_of_week.isdigit()  # one day a week
    assert minute.isdigit() and hour.isdigit()


def test_torch_upgrade_installs_the_pinned_torch_in_one_venv_and_the_newest_cpu_wheel_in_the_other() -> None:
    upgrade = load("torch-upgrade.yml")
    assert_hosted_cpu_job(upgrade)
    pinned, newest = (
        next(s["run"] for s in steps(upgrade, "cpu") if f'"$RUNNER_TEMP/{venv}/bin/pip" install' in s.get("run", ""))
        for venv in ("pinned", "newest")
    )
    # the pin read from constraints-cpu.txt, then the project under the constraints, as .ci/run installs
    assert "install \"$(grep '^torch==' constraints-cpu.txt)\"" in pinned
    assert "install -c constraints-cpu.txt -e '.[dev]'" in pinned
    assert "install --upgrade torch --index-url https://download.pytorch.org/whl/cpu" in newest
    assert "install -e '.[dev]'" in newest and "constraints-cpu.txt" not in newest


def test_torch_upgrade_gates_the_cpu_tier_under_the_newest_torch_and_compares_the_two_venvs() -> None:
    upgrade = load("torch-upgrade.yml")
    command = " ".join(runs(upgrade, "cpu").split())
    assert (
        '"$RUNNER_TEMP/newest/bin/python" -m pytest bench -m cpu --baseline-strict --gate-markdown gate.md' in command
    )
    tier = next(s for s in steps(upgrade, "cpu") if "pytest bench -m cpu" in s.get("run", ""))
    assert "continue-on-error" not in tier and "if" not in tier  # the tier failing fails the job
    compare = next(s for s in steps(upgrade, "cpu") if "gptcore compare" in s.get("run", ""))
    flat = " ".join(compare["run"].replace("\\\n", " ").split())
    assert "-m gptcore compare HEAD" in flat and "--rounds 3" in flat and ' -k "' in flat
    assert '--python-a "$RUNNER_TEMP/pinned/bin/python" --python-b "$RUNNER_TEMP/newest/bin/python"' in flat
    assert compare["if"] == "${{ !cancelled() }}"  # what moved is wanted most when the tier failed
    assert steps(upgrade, "cpu").index(tier) < steps(upgrade, "cpu").index(compare)


def test_torch_upgrade_writes_what_moved_to_the_job_summary() -> None:
    upgrade = load("torch-upgrade.yml")
    compare = next(s for s in steps(upgrade, "cpu") if "gptcore compare" in s.get("run", ""))
    assert '>> "$GITHUB_STEP_SUMMARY"' in compare["run"] and "cat compare.txt" in compare["run"]
    # the tier's verdict: --gate-markdown writes it, and the plugin appends it to $GITHUB_STEP_SUMMARY
    plugin = (WORKFLOWS.parent.parent / "gptcore" / "plugin" / "end.py").read_text()
    assert 'os.environ.get("GITHUB_STEP_SUMMARY"), "a"' in plugin


def test_the_merged_run_is_the_devices_one_saved_run_and_every_job_reads_the_same_history() -> None:
    gpu = load("gpu.yml")
    assert "--benchmark-autosave" not in runs(gpu, "shard")  # a shard's cases alone are not a run of the device
    merge = " ".join(runs(gpu, "merge").split())
    assert "--benchmark-json out/gpu-bench-*.json --benchmark-storage .benchmarks" in merge
    for job in ("shard", "merge"):  # the history the shards compare against is the one the merge appends to
        restore = next(s for s in steps(gpu, job) if s.get("uses", "").startswith("actions/cache/restore"))
        assert restore["with"]["path"] == ".benchmarks" and restore["with"]["restore-keys"] == "gpu-bench-history-"
    merge_steps = steps(gpu, "merge")
    names = [s.get("uses", s.get("run", "")) for s in merge_steps]
    save = next(s for s in merge_steps if s.get("uses", "").startswith("actions/cache/save"))
    assert names.index(save["uses"]) > next(i for i, n in enumerate(names) if "gptcore merge" in n)
    assert save["if"].startswith("always()") and save["with"]["path"] == ".benchmarks"
    assert save["with"]["key"].startswith("gpu-bench-history-") and "github.run_attempt" in save["with"]["key"]


def test_the_gpu_jobs_install_every_package_but_the_runners_torch_at_the_locks_pin(tmp_path: Path) -> None:
    """Each GPU job's install step runs with the lock less the pins of the torch installed and of what it requires
    (a runner keeps its CUDA torch as installed: held to the CPU wheel's sympy, a torch upgrade would stop at the
    install), and every other requirement of the project has its pin there: a new release of a dependency cannot turn
    the GPU tier red on unchanged code either. The derived file is made by the step's own command, under this
    environment's torch (the lock's 2.13.0): exactly its requirements and theirs are left out."""
    from tests.test_install import PYTHONS, unpinned

    root = WORKFLOWS.parent.parent
    pyproject = (root / "pyproject.toml").read_text()
    lock = (root / "constraints-cpu.txt").read_text().splitlines()
    # torch 2.13.0's requirements (filelock, typing-extensions, setuptools, sympy, networkx, jinja2, fsspec), theirs
    # (mpmath, markupsafe), and Triton, which a CUDA torch pins and the CPU wheel does not name
    torchs = {"torch", "triton", "filelock", "typing-extensions", "setuptools", "sympy", "mpmath", "networkx", "jinja2"}
    torchs |= {"markupsafe", "fsspec"}
    gpu = load("gpu.yml")
    for job in ("shard", "merge"):
        [install] = [step["run"] for step in steps(gpu, job) if "pip install" in step.get("run", "")]
        derive, pip = install.strip().splitlines()
        assert '-c "$RUNNER_TEMP/constraints-gpu.txt"' in pip, (job, pip)
        assert 'PIP_BUILD_CONSTRAINT="$PWD/constraints-cpu.txt"' in pip, (job, pip)  # the build backend: the lock's
        assert derive.startswith("python scripts/gpu_constraints.py"), (job, derive)
        command = derive.replace("python", sys.executable, 1)
        env = {"RUNNER_TEMP": str(tmp_path), "PATH": "/usr/bin:/bin"}
        subprocess.run(["bash", "-c", command], cwd=root, env=env, check=True)
        derived = (tmp_path / "constraints-gpu.txt").read_text().splitlines()
        left_out = [line for line in lock if line not in derived]
        assert {re.split(r"[=\s;]", line, maxsplit=1)[0].lower() for line in left_out} == torchs, job
        assert all(line in lock for line in derived[1:]), job  # nothing else changed: one header line added
        # of the project's own requirements, only torch and the build backend (a torch requirement) go unpinned
        names, systems = ("setuptools", "torch"), ("darwin", "linux")
        loose = [f"{name}: no pin under Python {py} on {os}" for name in names for py in PYTHONS for os in systems]
        assert unpinned(pyproject, "\n".join(derived)) == sorted(loose), job


def test_a_torch_requirement_counts_under_an_extra_only_where_the_extra_was_asked_for(monkeypatch, tmp_path: Path):
    """scripts/gpu_constraints.py on a planted tree of requirements: an extra torch offers (optree) is not followed,
    an extra torch asks of a dependency (cuda-toolkit[cublas]) is, another platform's requirement counts (its pin is
    torch's to keep), and a lock line of a package outside the closure stays, comments too. Without torch: one line,
    exit 2."""
    from scripts import gpu_constraints as module

    script = WORKFLOWS.parent.parent / "scripts" / "gpu_constraints.py"
    tree = {
        "torch": [
            "Sympy>=1.13",
            'optree>=0.13; extra == "optree"',
            'cuda-toolkit[cublas]==13; platform_system == "Linux"',
        ],
        "sympy": ["mpmath<1.4"],
        "cuda-toolkit": ['nvidia-cublas; extra == "cublas"', 'nvidia-cufft; extra == "cufft"'],
        "mpmath": ['pytest; extra == "develop"'],
    }

    def requires(name: str) -> list[str] | None:
        if name.lower() not in tree and name != "nvidia-cublas":
            raise module.metadata.PackageNotFoundError(name)
        return tree.get(name.lower())

    monkeypatch.setattr(module.metadata, "requires", requires)
    assert module.requirement_closure("torch") == {"torch", "sympy", "mpmath", "cuda-toolkit", "nvidia-cublas"}
    lock = "# a comment\nsympy==1.14.0\nmpmath==1.3.0 ; python_version >= '3.10'\npytest==9.2.0\nOptree==0.17\n"
    kept = module.gpu_constraints(lock, module.requirement_closure("torch"))
    assert kept == "# a comment\npytest==9.2.0\nOptree==0.17\n"

    bare = subprocess.run([sys.executable, "-S", str(script)], capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and bare.stdout == "" and "Traceback" not in bare.stderr
    assert bare.stderr.startswith("gpu_constraints.py: no torch for ") and bare.stderr.count("\n") == 1
