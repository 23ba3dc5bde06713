"""constraints-cpu.txt, the CPU install's lock (scripts/lock_cpu.sh writes it): for every Python the project takes,
each package the project asks for has exactly one pin there, the pin satisfies what the project asks, and CI's
installer is pinned too. A new release of an unpinned dependency is how CI turns red on unchanged code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest brings tomli on Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parent.parent
# every Python the project takes (requires-python >= 3.10) that a release has shipped, on CI's platform and a Mac's
PYTHONS = ["3.10", "3.11", "3.12", "3.13", "3.14"]
PLATFORMS = [("linux", "x86_64"), ("darwin", "arm64")]


def environments() -> list[dict[str, str]]:
    base = default_environment()
    return [
        base
        | {
            "python_version": python,
            "python_full_version": f"{python}.0",
            "sys_platform": platform,
            "platform_system": {"linux": "Linux", "darwin": "Darwin"}[platform],
            "platform_machine": machine,
        }
        for python in PYTHONS
        for platform, machine in PLATFORMS
    ]


def pins(constraints: str, env: dict[str, str]) -> dict[str, list[Requirement]]:
    """The lines that apply under env, by package name."""
    found: dict[str, list[Requirement]] = {}
    for line in constraints.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(env):
            found.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    return found


def unpinned(pyproject: str, constraints: str) -> list[str]:
    """What the lock leaves loose: a requirement of the project, of its extras (dev for CI, gpu and plot for the GPU
    runners, which install with the lock less their torch's pins) or of its build backend without exactly one == pin
    under some environment, or with a pin outside what the project asks; a package with two pins; pip without one."""
    toml = tomllib.loads(pyproject)
    project = toml["project"]
    wanted = [Requirement(line) for line in project["dependencies"]]
    wanted += [Requirement(line) for extra in project["optional-dependencies"].values() for line in extra]
    # .ci/run upgrades the fresh venv's pip to the pinned one, and builds the project with the pinned backend
    wanted += [Requirement("pip"), *(Requirement(line) for line in toml["build-system"]["requires"])]
    problems = []
    for env in environments():
        where = f"Python {env['python_version']} on {env['sys_platform']}"
        held = pins(constraints, env)
        for name, lines in held.items():
            if len(lines) > 1 or len(lines[0].specifier) != 1 or next(iter(lines[0].specifier)).operator != "==":
                problems.append(f"{name}: not one == pin under {where}: {[str(line) for line in lines]}")
        for requirement in wanted:
            if requirement.marker is not None and not requirement.marker.evaluate(env):
                continue
            lines = held.get(canonicalize_name(requirement.name), [])
            if not lines:
                problems.append(f"{requirement.name}: no pin under {where}")
                continue
            version = next(iter(lines[0].specifier)).version
            if not requirement.specifier.contains(version, prereleases=True):
                problems.append(f"{requirement.name}: pinned {version}, the project asks {requirement.specifier}")
    return sorted(set(problems))


def test_constraints_pin_every_requirement_of_the_cpu_install_for_every_python():
    pyproject = (ROOT / "pyproject.toml").read_text()
    constraints = (ROOT / "constraints-cpu.txt").read_text()
    assert unpinned(pyproject, constraints) == []


def test_constraints_hold_no_cuda_package_the_cpu_wheel_does_not_bring():
    constraints = (ROOT / "constraints-cpu.txt").read_text()
    names = {name for env in environments() for name in pins(constraints, env)}
    # nvidia-ml-py (the gpu extra's) is NVML's Python bindings, pure Python: no CUDA library, and nothing a CPU brings
    assert not [name for name in names if name.startswith(("nvidia-", "cuda-")) and name != "nvidia-ml-py"]
    assert "nvidia-ml-py" in names


def test_ci_takes_its_installer_and_the_projects_build_backend_from_the_lock():
    """The pip that .ci/run upgrades to, and the setuptools that pip fetches into its isolated build environment
    (which -c does not reach: PIP_BUILD_CONSTRAINT does, from pip 25.3), before README's install."""
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    upgrade = ci.index("python -m pip install --quiet --upgrade -c constraints-cpu.txt pip")
    build = ci.index('export PIP_BUILD_CONSTRAINT="$PWD/constraints-cpu.txt"')
    install = next(i for i, line in enumerate(ci) if line.startswith("pip install torch=="))
    assert upgrade < build < install


def pinned(constraints: str, name: str) -> str:
    """name's pin under CI's Python (3.11 on Linux), as its line reads."""
    ci = next(env for env in environments() if env["python_version"] == "3.11" and env["sys_platform"] == "linux")
    return str(pins(constraints, ci)[name][0])


def test_the_check_catches_a_planted_loose_dependency_a_second_pin_and_a_pin_the_project_refuses():
    pyproject = (ROOT / "pyproject.toml").read_text()
    constraints = (ROOT / "constraints-cpu.txt").read_text()
    # a new dev dependency that nobody locked
    planted = pyproject.replace('"pytest-xdist",', '"pytest-xdist",\n    "hypothesis",')
    assert unpinned(planted, constraints) == [
        f"hypothesis: no pin under Python {python} on {system}" for python in PYTHONS for system in ("darwin", "linux")
    ]
    # a second pin of one package, and a range instead of a pin
    tabulate = pinned(constraints, "tabulate")
    assert f"tabulate: not one == pin under Python 3.11 on linux: ['{tabulate}', 'tabulate==0.1']" in unpinned(
        pyproject, constraints + "tabulate==0.1\n"
    )
    loose = constraints.replace(pinned(constraints, "tqdm"), "tqdm>=4")
    assert "tqdm: not one == pin under Python 3.11 on linux: ['tqdm>=4']" in unpinned(pyproject, loose)
    # a pin the project's own requirement refuses
    pytest_pin = pinned(constraints, "pytest")
    assert unpinned(pyproject.replace('"pytest>=8"', '"pytest>=999"'), constraints) == [
        f"pytest: pinned {pytest_pin.split('==')[1]}, the project asks >=999"
    ]
    # the installer and the build backend left loose
    assert "pip: no pin under Python 3.12 on linux" in unpinned(
        pyproject, constraints.replace(pinned(constraints, "pip") + "\n", "")
    )
    assert "setuptools: no pin under Python 3.10 on darwin" in unpinned(
        pyproject, constraints.replace(pinned(constraints, "setuptools") + "\n", "")
    )
