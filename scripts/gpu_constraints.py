"""The GPU runners' constraints: constraints-cpu.txt less the pins of the torch installed here and of everything it
requires (its Triton, its CUDA libraries, sympy, jinja2, ...). A runner keeps its own CUDA torch, as installed, and
every other package of the project takes CI's pin, so that a new release of a dependency cannot turn the GPU tier red
on unchanged code. The pins of the CPU wheel's own dependencies are left out because a newer torch may ask newer
ones: held to them, the runner's torch upgrade, the very change this suite is run to judge, would stop at the install.

    python scripts/gpu_constraints.py > "$RUNNER_TEMP/constraints-gpu.txt"
    pip install -c "$RUNNER_TEMP/constraints-gpu.txt" -e '.[dev,plot,gpu]'

Standard library only: it runs before the project's packages are installed.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALWAYS = {"torch", "triton"}
"""Left out whatever torch says: the CPU wheel names no Triton, and a CUDA torch pins its own."""
NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
EXTRA = re.compile(r"""\bextra\s*==\s*["']([^"']+)["']""")


def canonical(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_closure(name: str) -> set[str]:
    """``name`` and every installed distribution it requires, transitively, by canonical name. A requirement under an
    extra counts only where that extra was asked for (torch's optional ``optree`` does not; the ``cublas`` extra that
    torch asks of cuda-toolkit does); other markers are not evaluated, so a requirement of another platform counts
    too (leaving one more pin out is harmless: it is a requirement of torch's, and stays as torch has it)."""
    seen: set[str] = set()
    todo: list[tuple[str, set[str]]] = [(name, set())]
    while todo:
        dist, extras = todo.pop()
        if canonical(dist) in seen:
            continue
        seen.add(canonical(dist))
        try:
            requires = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            spec, _, marker = line.partition(";")
            needs = set(EXTRA.findall(marker))
            if needs and not needs & extras:
                continue
            match = NAME.match(spec)
            if match:
                todo.append((match.group(1), {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}))
    return seen


def gpu_constraints(lock: str, drop: set[str]) -> str:
    """The lock's text less the lines pinning a package in ``drop`` (canonical names); comments kept."""
    kept = []
    for line in lock.splitlines():
        spec = line.split("#", 1)[0]
        match = NAME.match(spec) if spec.strip() else None
        if match and canonical(match.group(1)) in drop:
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)  # --help; no option: one line
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        print(f"gpu_constraints.py: no torch for {sys.executable}: install the runner's torch first", file=sys.stderr)
        return 2
    drop = requirement_closure("torch") | ALWAYS
    lock = (ROOT / "constraints-cpu.txt").read_text(encoding="utf-8")
    sys.stdout.write(f"# constraints-cpu.txt less torch {torch}'s own pins ({', '.join(sorted(drop))})\n")
    sys.stdout.write(gpu_constraints(lock, drop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
