"""Run one stage of a GPU session so that a 10-minute call cannot waste it, or plan every stage on CPU.

    python scripts/gpu_stage.py plan                       # every stage, its cases, an estimated H100 time
    python scripts/gpu_stage.py run STAGE --out DIR        # one stage, everything written under DIR as it ends

``run`` passes pytest the stage's cases and options (gptcore/stages.py) with ``--deadline`` (no case starts that
would end after it), a results log ``DIR/STAGE.jsonl`` (a line per case as it ends) and baselines recorded into
``DIR/baselines`` case by case, so that a call killed at its limit still returns what ran. It resumes from
``--resume LOG`` (default: ``out/gpu/STAGE.jsonl`` when a previous call's log was brought back there), and ends
with one line per failed case: what broke and the command that reruns just that case.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gptcore import plan, results  # noqa: E402
from gptcore.stages import ORDER, STAGES, Stage  # noqa: E402

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
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *stage.pytest, *options],
                           plugins=[Items()])
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

    print(f"Plan of a GPU session on an {plan.PLAN_GPU} at an assumed MFU of {plan.ASSUMED_MFU:.0%} (gptcore/plan.py "
          f"states every assumption); a stage is cut into calls of at most its deadline, each resuming the last.\n")
    unfit, summary = [], []
    for name in ORDER:
        stage = STAGES[name]
        if not stage.pytest:
            print(f"== {name}: {stage.what}\n   a script stage, planned at {stage.script_seconds:.0f} s "
                  f"(stated); writes {stage.writes}\n")
            summary.append([name, "—", f"{stage.script_seconds:.0f}", 1, f"{stage.script_seconds:.0f}"])
            unfit += [name] if stage.script_seconds > stage.deadline else []
            continue
        items = collect(stage)
        planned = [plan.estimate(item, {}, _overrides(stage.options)) for item in items]
        cut = calls([p.seconds for p in planned], stage.deadline)
        call_of = {i: k + 1 for k, call in enumerate(cut) for i in call}
        rows = [[item.nodeid, f"{p.seconds:,.0f}", p.source, call_of[i]] for i, (item, p) in
                enumerate(zip(items, planned))]
        longest = max((sum(planned[i].seconds for i in call) for call in cut), default=0.0)
        print(f"== {name}: {stage.what}\n   deadline {stage.deadline:.0f} s a call; writes {stage.writes}")
        print(tabulate(rows, headers=["case", "planned s", "from", "call"], disable_numparse=True))
        print()
        summary.append([name, len(items), f"{sum(p.seconds for p in planned):,.0f}", len(cut), f"{longest:,.0f}"])
        unfit += [f"{name}: {items[i].nodeid}" for i, p in enumerate(planned) if p.seconds > stage.deadline]
    print(tabulate(summary, headers=["stage", "cases", "planned s", "calls", "longest call s"],
                   disable_numparse=True))
    if unfit:
        print("\nDOES NOT FIT one call: " + "; ".join(unfit))
        return 1
    longest = max(s.deadline for s in STAGES.values())
    print(f"\nEvery call fits its deadline by this estimate (at most {longest:.0f} s).")
    return 0


def run(name: str, out: Path, resume: Path | None) -> int:
    """Run a pytest stage with its deadline, results log and baselines under ``out``; 1-line diagnoses at the end."""
    stage = STAGES[name]
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"{name}.jsonl"
    baselines = out / "baselines"
    baselines.mkdir(exist_ok=True)
    for path in (ROOT / "baselines").glob("*.json"):  # the recorded ones so far; each case merges into these
        if not (baselines / path.name).exists():
            shutil.copy2(path, baselines / path.name)
    resume = resume or (ROOT / "out" / "gpu" / f"{name}.jsonl")
    if resume.exists() and resume.resolve() != log.resolve():
        shutil.copy2(resume, log)
    args = [sys.executable, "-m", "pytest", *stage.pytest, *stage.options, "-p", "no:cacheprovider", "-rs",
            "--deadline", str(stage.deadline), "--results-log", str(log), "--baselines-dir", str(baselines),
            "--benchmark-json", str(out / f"{name}.json")] + (["--resume", str(log)] if log.exists() else [])
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
        print(f"FAILED {r.name}: {r.reason or '; '.join(r.failures)}; rerun just that: "
              f"python -m pytest {shlex.quote(r.nodeid)} {' '.join(o for o in stage.options if o != '-x')}")
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
    args = parser.parse_args(argv)
    if args.command == "plan":
        return plan_all()
    return run(args.stage, args.out, args.resume)


if __name__ == "__main__":
    sys.exit(main())
