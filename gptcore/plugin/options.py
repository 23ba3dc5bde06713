"""The gate's command-line options and the session-wide names the rest of the plugin shares."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gptcore.gate.session import Gate

GATE = pytest.StashKey[Gate]()
MARKDOWN_ENV = "GPTCORE_GATE_MARKDOWN"
"""The default of --gate-markdown (a workflow sets it where the test command must stay the README's)."""
PLUGIN_DEFAULT_STORAGE = "file://./.benchmarks"
DEADLINE_ENV = "GPTCORE_DEADLINE"
"""The default of --deadline, for scripts whose pytest command stays the same."""
THREADS_ENV = "GPTCORE_CPU_THREADS"
"""The default of --bench-threads."""


def add_options(parser: pytest.Parser, root: Path) -> None:
    """The gate's command-line options; ``root`` is the repository (its baselines/ is the default)."""
    group = parser.getgroup("gptcore", "gptcore benchmark gate")
    group.addoption(
        "--require-gpu", action="store_true", help="fail at once when CUDA is not available (the self-hosted GPU job)"
    )
    group.addoption(
        "--baselines-dir",
        default=str(root / "baselines"),
        metavar="DIR",
        help="where <device-slug>.json baselines live (default: baselines/ of the repo)",
    )
    group.addoption(
        "--update-baselines",
        action="store_true",
        help="record the cases that ran into the baseline files (atomically; other entries kept)",
    )
    group.addoption(
        "--update-loss-references",
        action="store_true",
        help="add this CPU model's loss of each case that ran to its recorded entry, and change nothing "
        "else (for a CI machine with another CPU model: the same-CPU loss tolerances then apply)",
    )
    group.addoption(
        "--gate-markdown",
        metavar="FILE",
        default=os.environ.get(MARKDOWN_ENV),
        help="write the gate's verdict as GitHub-flavoured markdown to FILE (failures first, the table, "
        f"the expected effects), e.g. for a PR comment; default: ${MARKDOWN_ENV}. With "
        "$GITHUB_STEP_SUMMARY set (GitHub Actions) it is also appended there",
    )
    group.addoption(
        "--baseline-strict",
        action="store_true",
        help="a case with no baseline entry fails (default: it passes, says 'no baseline' and warns)",
    )
    group.addoption("--mem-tol", type=float, metavar="FRAC", help="override the peak-memory tolerance (0.02 = +2%%)")
    group.addoption(
        "--speed-tol",
        type=float,
        metavar="FRAC",
        help="override the tokens/s tolerance (0.05 = -5%%); on CPU, where tokens/s is reported but not "
        "gated by default, this turns the gate on",
    )
    group.addoption(
        "--busy-tol", type=float, metavar="FRAC", help="override the GPU busy time's tolerance (0.03 = +3%%)"
    )
    group.addoption("--loss-tol", type=float, metavar="NATS", help="override every loss tolerance (absolute nats)")
    group.addoption("--bench-warmup", type=int, metavar="N", help="override every case's warm-up steps")
    group.addoption("--bench-rounds", type=int, metavar="N", help="override every case's timed rounds")
    group.addoption("--bench-steps", type=int, metavar="N", help="override every case's steps per round")
    group.addoption(
        "--bench-threads",
        type=int,
        metavar="N",
        default=_env(THREADS_ENV, int, "a whole number"),
        help=f"run every single-process CPU case on N intra-op threads, not its study's 2 (default: "
        f"${THREADS_ENV}); a peak inside a kernel's per-thread scratch then moves with N",
    )
    group.addoption(
        "--gate-history",
        action="store_true",
        help="add the change points in this device's saved runs (pytest-benchmark's storage; "
        "python -m gptcore history) to the markdown verdict",
    )
    group.addoption(
        "--cpu-speed",
        action="store_true",
        help="on CPU, time each study's full rounds (a tokens/s median worth reading); by default a CPU "
        "case times only the few rounds its exact checks need (memory, loss, work ledger)",
    )
    group.addoption(
        "--results-log",
        metavar="FILE",
        help="append one JSON line per case to FILE the moment the case ends (flushed and fsynced); "
        "default: beside pytest-benchmark's saved runs, .benchmarks/<device>/results-<time>.jsonl "
        "(with --resume: the log resumed; a FILE other than it starts as its copy)",
    )
    group.addoption(
        "--resume",
        metavar="LOG",
        help="run only the cases that the results log LOG has not finished (passed or failed); the end "
        "table shows the union, the finished cases as LOG has them",
    )
    group.addoption(
        "--deadline",
        type=float,
        metavar="SECONDS",
        default=_env(DEADLINE_ENV, float, "a number of seconds"),
        help="start no case that would likely end more than SECONDS after pytest started (judged from "
        "the case's last time in the results log or its baseline, else from its FLOPs at an "
        "assumed throughput; a plain test from its @pytest.mark.planned time, else 30 s: "
        f"gptcore/gate/plan.py); skip those with the reason 'deadline'. "
        f"Default: ${DEADLINE_ENV}",
    )
    group.addoption(
        "--launcher",
        metavar="ARGS",
        default=None,
        help="how torchrun starts the distributed tier's jobs: '--standalone' (default), or this node of several "
        "in torchrun's own words: '--nnodes 2 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:PORT' "
        "(every node runs the same pytest command with its own --node-rank)",
    )
    group.addoption(
        "--shard",
        metavar="K/N",
        help="run shard K of N of the selected benchmarks (1 <= K <= N), balanced by each case's known duration "
        "(its results-log or baseline seconds, else its planned FLOPs time); the same split on every runner, the "
        "cases of one torchrun job together",
    )
    group.addoption(
        "--recorded-only",
        action="store_true",
        help="run only the cases that have an entry in their device's baseline file, and deselect the "
        "rest (say, after recording part of a study: check what was recorded and nothing else)",
    )


def _env(name: str, kind: type[int] | type[float], what: str) -> int | float | None:
    """An option's default from the environment variable ``name`` (None where unset); one line where it is not
    ``what``."""
    value = os.environ.get(name)
    try:
        return kind(value) if value else None
    except ValueError:
        raise pytest.UsageError(f"${name}: {value!r} is not {what}") from None


def under_xdist() -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))
