"""Run one stage of a GPU session so that a 10-minute call cannot waste it, or plan every stage on CPU.

    python scripts/gpu_stage.py plan                       # every stage, its cases, an estimated H100 time
    python scripts/gpu_stage.py run STAGE --out DIR        # one stage, everything written under DIR as it ends
    python scripts/gpu_stage.py fits STAGE                 # exit 0 if a script stage fits what is left of the call
    python scripts/gpu_stage.py call-end                   # the Unix time a call started now must be done by

``run`` passes pytest the stage's cases and options (gptcore/gate/stages.py) with ``--deadline`` (no case starts that
would end after it, nor after $GPTCORE_CALL_END: several stages can share one call), a results log
``DIR/STAGE.jsonl`` (a line per case as it ends) and baselines recorded into ``DIR/baselines`` case by case, so
that a call killed at its limit still returns what ran. It resumes from ``--resume LOG`` (default:
``out/gpu/STAGE.jsonl`` when a previous call's log was brought back there), and ends with one line per failed
case: what broke and the command that reruns just that case.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gptcore.gate import plan, results  # noqa: E402
from gptcore.gate.stages import (  # noqa: E402
    CALL_END_ENV,
    CALL_SECONDS,
    FIRST_SESSION,
    MIN_STAGE_SECONDS,
    ORDER,
    STAGES,
    Stage,
    stage_deadline,
)

PLAN_DROPS = {"--require-gpu", "--update-baselines", "-x"}  # options a CPU collection cannot or need not take


def _overrides(options: list[str]) -> tuple[int | None, int | None, int | None]:
    values = dict(zip(options, options[1:]))
    return tuple(int(values[o]) if o in values else None for o in ("--bench-warmup", "--bench-rounds", "--bench-steps"))


def collect(stage: Stage) -> list:
    """The items pytest would run for ``stage`` (collected here, on CPU; GPU cases are collected and skipped)."""
    import pytest

    class Items:
        items: list = []

        def pytest_collection_finish(self, session: pytest.Session) -> None:
            Items.items = list(session.items)

    options = [o for o in stage.options if o not in PLAN_DROPS]
    with contextlib.redirect_stdout(io.StringIO()):  # pytest's own listing: the plan prints its table instead
        code = pytest.main(
            ["--collect-only", "-q", "-p", "no:cacheprovider", *stage.pytest, *options], plugins=[Items()]
        )
    if code not in (0, 5):
        sys.exit(f"gpu_stage: collecting stage {stage.name} failed (pytest exit {code})")
    return Items.items


def calls(estimates: list[float], deadline: float) -> list[list[int]]:
    """The cases (indices, in order) that each call of a stage runs under its deadline."""
    out: list[list[int]] = [[]]
    used = 0.0
    for i, seconds in enumerate(estimates):
        if out[-1] and used + seconds > deadline:
            out.append([])
            used = 0.0
        out[-1].append(i)
        used += seconds
    return out if out[0] else []


def plan_all() -> int:
    """Print each stage's cases with the planned time on an H100 and the calls they need; 1 when a case cannot
    fit one call."""
    from tabulate import tabulate

    print(
        f"Plan of a GPU session on an {plan.PLAN_GPU} at an assumed MFU of {plan.ASSUMED_MFU:.0%} "
        f"(gptcore/gate/plan.py states every assumption); a stage is cut into calls of at most its deadline,"
        f" each resuming the last.\n"
    )
    unfit, summary, totals = [], [], {}
    for name in ORDER:
        stage = STAGES[name]
        if not stage.pytest:
            print(
                f"== {name}: {stage.what}\n   a script stage, planned at {stage.script_seconds:.0f} s "
                f"(stated); writes {stage.writes}\n"
            )
            summary.append([name, "—", f"{stage.script_seconds:.0f}", 1, f"{stage.script_seconds:.0f}"])
            totals[name] = stage.script_seconds
            unfit += [name] if stage.script_seconds > stage.deadline else []
            continue
        items = collect(stage)
        planned = [plan.estimate(item, {}, _overrides(stage.options)) for item in items]
        cut = calls([p.seconds for p in planned], stage.deadline)
        call_of = {i: k + 1 for k, call in enumerate(cut) for i in call}
        rows = [
            [item.nodeid, f"{p.seconds:,.0f}", p.source, call_of[i]] for i, (item, p) in enumerate(zip(items, planned))
        ]
        longest = max((sum(planned[i].seconds for i in call) for call in cut), default=0.0)
        print(f"== {name}: {stage.what}\n   deadline {stage.deadline:.0f} s a call; writes {stage.writes}")
        print(tabulate(rows, headers=["case", "planned s", "from", "call"], disable_numparse=True))
        print()
        totals[name] = sum(p.seconds for p in planned)
        summary.append([name, len(items), f"{totals[name]:,.0f}", len(cut), f"{longest:,.0f}"])
        unfit += [f"{name}: {items[i].nodeid}" for i, p in enumerate(planned) if p.seconds > stage.deadline]
    print(tabulate(summary, headers=["stage", "cases", "planned s", "calls", "longest call s"], disable_numparse=True))
    if unfit:
        print("\nDOES NOT FIT one call: " + "; ".join(unfit))
        return 1
    longest = max(s.deadline for s in STAGES.values())
    print(f"\nEvery call fits its deadline by this estimate (at most {longest:.0f} s).")
    print(first_session(totals))
    return 0


def first_session(totals: dict[str, float]) -> str:
    """The calls of a first GPU session with their planned seconds; its verify runs what the session recorded."""
    lines = [
        f"\nA first session, {len(FIRST_SESSION)} calls; the stages of a call share its {CALL_SECONDS} s "
        f"(${CALL_END_ENV}), and what a deadline leaves resumes in a later call:"
    ]
    recorded: list[str] = []
    for k, call in enumerate(FIRST_SESSION, 1):
        names = call.split(",")
        seconds = sum(sum(totals[n] for n in recorded) if n == "verify" else totals[n] for n in names)
        recorded += [n for n in names if "--update-baselines" in STAGES[n].options]
        what = " (what this session recorded, run again)" if "verify" in names else ""
        lines.append(f"  call {k}: bash scripts/gpu_session.sh {call:<14} planned {seconds:,.0f} s{what}")
    return "\n".join(lines)


def call_end() -> float | None:
    """$GPTCORE_CALL_END as a number (None when unset); SystemExit with one line when it is not one."""
    value = os.environ.get(CALL_END_ENV)
    try:
        return float(value) if value else None
    except ValueError:
        sys.exit(f"gpu_stage: ${CALL_END_ENV}: {value!r} is not a Unix time")


def seconds_left(stage: Stage) -> float | None:
    """The stage's deadline now, or None (printed, with the reason) when too little of the call is left."""
    deadline = stage_deadline(stage, time.time(), call_end())
    if deadline < MIN_STAGE_SECONDS:
        print(
            f"stage {stage.name} not started: {max(deadline, 0):.0f} s left of this call (${CALL_END_ENV}), less "
            f"than {MIN_STAGE_SECONDS:.0f} s; run it in the next call",
            flush=True,
        )
        return None
    return deadline


def fits(name: str) -> int:
    """Exit status 0 when script stage ``name`` fits what is left of the call (printed otherwise), else 1."""
    stage = STAGES[name]
    deadline = seconds_left(stage)
    if deadline is None:
        return 1
    if stage.script_seconds > deadline:
        print(
            f"stage {name} not started: planned at {stage.script_seconds:.0f} s, {deadline:.0f} s left of this "
            f"call; run it in the next call",
            flush=True,
        )
        return 1
    return 0


def run(name: str, out: Path, resume: Path | None) -> int:
    """Run a pytest stage with its deadline, results log and baselines under ``out``; 1-line diagnoses at the end."""
    stage = STAGES[name]
    deadline = seconds_left(stage)
    if deadline is None:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"{name}.jsonl"
    baselines = out / "baselines"
    baselines.mkdir(exist_ok=True)
    # the GPU files recorded so far, each case merges into its own (not cpu.json: a call brings back 8 files at most)
    for path in (ROOT / "baselines").glob("*.json"):
        if path.stem != "cpu" and not (baselines / path.name).exists():
            shutil.copy2(path, baselines / path.name)
    resume = resume or (ROOT / "out" / "gpu" / f"{name}.jsonl")
    if resume.exists() and resume.resolve() != log.resolve():
        shutil.copy2(resume, log)
    args = [
        sys.executable,
        "-m",
        "pytest",
        *stage.pytest,
        *stage.options,
        "-p",
        "no:cacheprovider",
        "-rs",
        "--deadline",
        f"{deadline:.0f}",
        "--results-log",
        str(log),
        "--baselines-dir",
        str(baselines),
        "--benchmark-json",
        str(out / f"{name}.json"),
    ] + (["--resume", str(log)] if log.exists() else [])
    print("$ " + shlex.join(args), flush=True)
    with open(out / f"{name}.log", "a", encoding="utf-8") as tee:
        child = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in child.stdout:
            sys.stdout.write(line)
            tee.write(line)
            tee.flush()
        code = child.wait()
    failed = [r for r in results.latest(results.read(log)).values() if r.outcome == "failed"] if log.exists() else []
    for r in failed:
        print(
            f"FAILED {r.name}: {r.reason or '; '.join(r.failures)}; rerun just that: "
            f"python -m pytest {shlex.quote(r.nodeid)} {' '.join(o for o in stage.options if o != '-x')}"
        )
    print(f"stage {name}: pytest exit {code}; results log {log}; baselines {baselines}")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plan", help="every stage with its cases and planned time (no GPU needed)")
    run_p = sub.add_parser("run", help="run one stage")
    run_p.add_argument("stage", choices=[n for n in ORDER if STAGES[n].pytest])
    run_p.add_argument("--out", type=Path, required=True, help="where everything is written as it ends")
    run_p.add_argument("--resume", type=Path, default=None, help="a results log of an earlier call of this stage")
    fits_p = sub.add_parser("fits", help="exit 0 if a script stage fits what is left of the call")
    fits_p.add_argument("stage", choices=[n for n in ORDER if not STAGES[n].pytest])
    sub.add_parser("call-end", help=f"the Unix time a call started now must be done by (now + {CALL_SECONDS} s)")
    args = parser.parse_args(argv)
    if args.command == "plan":
        return plan_all()
    if args.command == "fits":
        return fits(args.stage)
    if args.command == "call-end":
        print(int(time.time() + CALL_SECONDS))
        return 0
    return run(args.stage, args.out, args.resume)


if __name__ == "__main__":
    sys.exit(main())
