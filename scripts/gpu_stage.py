"""Run one stage of a GPU run in a time-limited or preemptible job, or plan every stage on CPU.

    python scripts/gpu_stage.py plan [--time-limit S] [--device SLUG] [-k EXPR]  # every stage, cases, planned time
    python scripts/gpu_stage.py run STAGE --out DIR [-k EXPR]  # one stage (its cases EXPR matches), written as it ends
    python scripts/gpu_stage.py fits STAGE                 # exit 0 if a script stage fits what is left of the job
    python scripts/gpu_stage.py job-end [--time-limit S]   # the Unix time a job started now must be done by

``run`` passes pytest the stage's cases and options (gptcore/gate/stages.py) with ``--deadline`` where the stage or
the job has a limit (no case starts that would end after it, nor after $GPTCORE_JOB_END: several stages can share
one job), a results log ``DIR/STAGE.jsonl`` (a line per case as it ends) and baselines recorded into
``DIR/baselines`` case by case, so that a job killed at its limit, or preempted, keeps what ran. It resumes from
``DIR/STAGE.jsonl`` when an earlier job left it there, or from ``--resume LOG`` (an earlier job's log brought in
from elsewhere), and ends with one line per failed case: what broke and the command that reruns just that case.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
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
    JOB_END_ENV,
    MARGIN_SECONDS,
    MIN_STAGE_SECONDS,
    ORDER,
    STAGES,
    TIME_LIMIT_ENV,
    Stage,
    job_end,
    stage_deadline,
)

PLAN_DROPS = {"--require-gpu", "--update-baselines", "-x"}  # options a CPU collection cannot or need not take


def _overrides(options: list[str]) -> tuple[int | None, int | None, int | None]:
    values = dict(zip(options, options[1:]))
    return tuple(int(values[o]) if o in values else None for o in ("--bench-warmup", "--bench-rounds", "--bench-steps"))


def collect(stage: Stage, select: str | None = None) -> list:
    """The items pytest would run for ``stage`` (collected here, on CPU; GPU cases are collected and skipped), only
    those ``select`` (pytest's ``-k`` expression) matches where it is given, as ``run`` narrows them."""
    import pytest

    class Items:
        items: list = []

        def pytest_collection_finish(self, session: pytest.Session) -> None:
            Items.items = list(session.items)

    options = [o for o in stage.options if o not in PLAN_DROPS]
    with contextlib.redirect_stdout(io.StringIO()):  # pytest's own listing: the plan prints its table instead
        code = pytest.main(
            ["--collect-only", "-q", "-p", "no:cacheprovider", *selected(stage.pytest, select), *options],
            plugins=[Items()],
        )
    if code not in (0, 5):
        sys.exit(f"gpu_stage: collecting stage {stage.name} failed (pytest exit {code})")
    return Items.items


def jobs(estimates: list[float], limit: float | None) -> list[list[int]]:
    """The cases (indices, in order) that each job of a stage runs under ``limit`` seconds (None: one job)."""
    out: list[list[int]] = [[]]
    used = 0.0
    for i, seconds in enumerate(estimates):
        if out[-1] and limit is not None and used + seconds > limit:
            out.append([])
            used = 0.0
        out[-1].append(i)
        used += seconds
    return out if out[0] else []


def recorded_seconds(device: str | None) -> dict[str, float]:
    """Case name -> the wall time its entry in ``baselines/DEVICE.json`` recorded (empty without a device)."""
    if device is None:
        return {}
    from gptcore.gate import baselines
    from gptcore.gate.schema import BaselineError

    try:
        file = baselines.load(ROOT / "baselines" / f"{device}.json")
    except BaselineError as err:
        raise SystemExit(f"gpu_stage: {err}") from None
    if file is None:
        known = ", ".join(sorted(p.stem for p in (ROOT / "baselines").glob("*.json") if p.stem != "cpu"))
        raise SystemExit(f"gpu_stage: no baselines/{device}.json (recorded GPUs: {known or 'none'})")
    return {name: e.seconds for name, e in file.entries.items() if e.seconds}


def plan_all(time_limit: float | None, device: str | None = None, select: str | None = None) -> int:
    """Print each stage's cases with the planned time (the wall time ``device``'s baselines recorded where there is
    one, else on an H100) and, under ``time_limit``, the jobs they need; 1 when a case cannot fit one job. With
    ``select`` (a pytest ``-k`` expression), each pytest stage plans only the cases it matches, as a job given the
    same ``-k`` runs them."""
    from tabulate import tabulate

    usable = None if time_limit is None else time_limit - MARGIN_SECONDS
    recorded = recorded_seconds(device)
    print(
        (f"Plan of a GPU run on {device}: the times its baselines recorded, else " if device else "Plan of a GPU run: ")
        + f"on an {plan.PLAN_GPU} at an assumed MFU of {plan.ASSUMED_MFU:.0%} "
        f"(gptcore/gate/plan.py states every assumption)"
        + (
            f"; jobs of {time_limit:.0f} s ({usable:.0f} s for cases), each resuming the last.\n"
            if usable is not None
            else "; no time limit given (--time-limit or $" + TIME_LIMIT_ENV + "): each stage in one job.\n"
        )
    )
    unfit, summary = [], []
    for name in ORDER:
        stage = STAGES[name]
        limit = min(x for x in (stage.deadline, usable, float("inf")) if x is not None)
        limit = None if limit == float("inf") else limit
        if not stage.pytest:
            print(
                f"== {name}: {stage.what}\n   a script stage, planned at {stage.script_seconds:.0f} s "
                f"(stated); writes {stage.writes}\n"
            )
            summary.append([name, "—", f"{stage.script_seconds:.0f}", 1, f"{stage.script_seconds:.0f}"])
            unfit += [name] if limit is not None and stage.script_seconds > limit else []
            continue
        items = collect(stage, select)
        if select and not items:
            print(f"== {name}: no case matches -k {select}\n")
            summary.append([name, 0, "0", 0, "0"])
            continue
        overrides = _overrides(stage.options)  # recorded times hold the full timing: not for smoke's shorter one
        planned = [
            plan.estimate(item, {}, overrides, None if any(overrides) else recorded.get(item.name)) for item in items
        ]
        cut = jobs([p.seconds for p in planned], limit)
        job_of = {i: k + 1 for k, job in enumerate(cut) for i in job}
        rows = [
            [item.nodeid, f"{p.seconds:,.0f}", p.source, job_of[i]] for i, (item, p) in enumerate(zip(items, planned))
        ]
        longest = max((sum(planned[i].seconds for i in job) for job in cut), default=0.0)
        own = f"its own limit {stage.deadline:.0f} s; " if stage.deadline is not None else ""
        print(f"== {name}: {stage.what}\n   {own}writes {stage.writes}")
        print(tabulate(rows, headers=["case", "planned s", "from", "job"], disable_numparse=True))
        print()
        total = sum(p.seconds for p in planned)
        summary.append([name, len(items), f"{total:,.0f}", len(cut), f"{longest:,.0f}"])
        unfit += [
            f"{name}: {items[i].nodeid}" for i, p in enumerate(planned) if limit is not None and p.seconds > limit
        ]
    print(tabulate(summary, headers=["stage", "cases", "planned s", "jobs", "longest job s"], disable_numparse=True))
    if select and not any(isinstance(row[1], int) and row[1] for row in summary):  # a misspelt -k plans nothing
        print(f"\nNO CASE of any pytest stage matches -k {select}: a session with it would run none", file=sys.stderr)
        return 2
    if unfit:
        print("\nDOES NOT FIT one job: " + "; ".join(unfit))
        return 1
    if usable is not None:
        print(f"\nEvery job fits its time limit by this estimate ({usable:.0f} s for cases).")
    narrowed = f" -k {shlex.quote(select)}" if select else ""
    print(f"\nA first run, in order: bash scripts/gpu_session.sh {','.join(ORDER)} OUT_DIR [--time-limit S]{narrowed}")
    return 0


def job_end_now() -> float | None:
    """$GPTCORE_JOB_END as a number (None when unset or empty); SystemExit with one line when it is not one."""
    value = os.environ.get(JOB_END_ENV)
    try:
        end = float(value) if value else None
    except ValueError:
        end = math.nan
    if end is not None and not math.isfinite(end):  # NaN compares false with every deadline: no limit at all
        sys.exit(f"gpu_stage: ${JOB_END_ENV}: {value!r} is not a Unix time")
    return end


def time_limit(given: str | None) -> float | None:
    """The job's time limit in seconds: ``given`` (--time-limit), else $GPTCORE_TIME_LIMIT, else None; SystemExit
    with one line when it is not a number of seconds above the margin."""
    text = given if given is not None else os.environ.get(TIME_LIMIT_ENV) or None
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        sys.exit(f"gpu_stage: time limit {text!r} is not a number of seconds")
    if seconds <= MARGIN_SECONDS + MIN_STAGE_SECONDS:
        sys.exit(f"gpu_stage: time limit {seconds:.0f} s leaves no stage {MIN_STAGE_SECONDS:.0f} s")
    return seconds


def seconds_left(stage: Stage) -> tuple[bool, float | None]:
    """Whether to start the stage now, and its deadline (None: no limit); too little left of the job is said in one
    line, and the stage is not started."""
    deadline = stage_deadline(stage, time.time(), job_end_now())
    if deadline is not None and deadline < MIN_STAGE_SECONDS:
        print(
            f"stage {stage.name} not started: {max(deadline, 0):.0f} s left of this job (${JOB_END_ENV}), less "
            f"than {MIN_STAGE_SECONDS:.0f} s; run it in the next job",
            flush=True,
        )
        return False, deadline
    return True, deadline


def fits(name: str) -> int:
    """Exit status 0 when script stage ``name`` fits what is left of the job (printed otherwise), else 1."""
    stage = STAGES[name]
    start, deadline = seconds_left(stage)
    if not start:
        return 1
    if deadline is not None and stage.script_seconds > deadline:
        print(
            f"stage {name} not started: planned at {stage.script_seconds:.0f} s, {deadline:.0f} s left of this "
            f"job; run it in the next job",
            flush=True,
        )
        return 1
    return 0


def selected(pytest_args: list[str], select: str | None) -> list[str]:
    """A stage's pytest arguments narrowed to the cases ``select`` (pytest's ``-k`` expression) matches too: and-ed
    with the stage's own ``-k`` where it has one (pytest keeps only the last ``-k`` given)."""
    if not select:
        return list(pytest_args)
    if "-k" not in pytest_args:
        return [*pytest_args, "-k", select]
    i = pytest_args.index("-k") + 1
    return [*pytest_args[:i], f"({pytest_args[i]}) and ({select})", *pytest_args[i + 1 :]]


def benchmark_json(out: Path, name: str) -> Path:
    """Where this job's pytest-benchmark JSON goes: ``STAGE.json``, or ``STAGE-2.json``, ``-3``... when an earlier
    job in the same folder left one. pytest-benchmark opens the path as it starts, so a second job of the stage (a
    resumed one, or one narrowed by -k) would empty the first's, and a job killed before its end leaves it empty:
    an empty one is taken again."""
    path, n = out / f"{name}.json", 1
    while path.exists() and path.stat().st_size > 0:
        n += 1
        path = out / f"{name}-{n}.json"
    return path


def run(name: str, out: Path, resume: Path | None, select: str | None = None) -> int:
    """Run a pytest stage with its deadline, results log and baselines under ``out``, on the cases ``select``
    matches (all where None); 1-line diagnoses at the end."""
    stage = STAGES[name]
    if out.exists() and not out.is_dir():
        print(f"gpu_stage.py: --out {out}: a file; give a folder", file=sys.stderr)
        return 2
    if resume is not None and resume.exists():
        try:  # before it is copied in: a log pytest refuses would stay behind and stop every later job
            results.read(resume)
        except results.LogError as err:
            print(f"gpu_stage.py: --resume: {err}", file=sys.stderr)
            return 2
    elif resume is not None:  # gpu_session.sh --resume-from names every stage's log, run or not
        print(f"stage {name}: no earlier log at {resume}: it starts afresh", flush=True)
    start, deadline = seconds_left(stage)
    if not start:
        return 0
    why = results.unwritable(out / f"{name}.jsonl")  # makes the folder, as the stage would
    if why:
        print(f"gpu_stage.py: --out {out}: {why}", file=sys.stderr)
        return 2
    log = out / f"{name}.jsonl"
    baselines = out / "baselines"
    baselines.mkdir(exist_ok=True)
    # the GPU files recorded so far, each case merges into its own (not cpu.json: a GPU job records GPU files)
    for path in (ROOT / "baselines").glob("*.json"):
        if path.stem != "cpu" and not (baselines / path.name).exists():
            shutil.copy2(path, baselines / path.name)
    if resume is not None and resume.exists() and resume.resolve() != log.resolve() and not log.exists():
        shutil.copy2(resume, log)  # an earlier job's log brought in from elsewhere
    args = [
        sys.executable,
        "-m",
        "pytest",
        *selected(stage.pytest, select),
        *stage.options,
        "-p",
        "no:cacheprovider",
        "-rs",
        *(["--deadline", f"{deadline:.0f}"] if deadline is not None else []),
        "--results-log",
        str(log),
        "--baselines-dir",
        str(baselines),
        "--benchmark-json",
        str(benchmark_json(out, name)),
    ] + (["--resume", str(log)] if log.exists() else [])
    print("$ " + shlex.join(args), flush=True)
    with open(out / f"{name}.log", "a", encoding="utf-8") as tee:
        child = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in child.stdout:
            sys.stdout.write(line)
            tee.write(line)
            tee.flush()
        code = child.wait()
    failed = []
    try:
        finished = results.latest(results.read(log)).values() if log.exists() else []
        failed = [r for r in finished if r.outcome == "failed"]
    except results.LogError as err:  # pytest has said why in its own line
        print(f"gpu_stage.py: {err}", file=sys.stderr)
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
    plan_p = sub.add_parser("plan", help="every stage with its cases and planned time (no GPU needed)")
    plan_p.add_argument("--time-limit", default=None, help=f"the job's seconds (default ${TIME_LIMIT_ENV})")
    plan_p.add_argument("--device", default=None, help="plan from baselines/DEVICE.json's recorded times (nvidia-h200)")
    plan_p.add_argument("-k", dest="select", default=None, help="plan only the cases this pytest -k EXPR matches")
    run_p = sub.add_parser("run", help="run one stage")
    run_p.add_argument("stage", choices=[n for n in ORDER if STAGES[n].pytest])
    run_p.add_argument("--out", type=Path, required=True, help="where everything is written as it ends")
    run_p.add_argument("--resume", type=Path, default=None, help="a results log of an earlier job of this stage")
    run_p.add_argument("-k", dest="select", default=None, help="only the cases this pytest -k EXPR matches")
    fits_p = sub.add_parser("fits", help="exit 0 if a script stage fits what is left of the job")
    fits_p.add_argument("stage", choices=[n for n in ORDER if not STAGES[n].pytest])
    end_p = sub.add_parser(
        "job-end", help=f"the Unix time a job started now must be done by (now + limit - {MARGIN_SECONDS:.0f} s)"
    )
    end_p.add_argument("--time-limit", default=None, help=f"the job's seconds (default ${TIME_LIMIT_ENV})")
    args = parser.parse_args(argv)
    if args.command == "plan":
        return plan_all(time_limit(args.time_limit), args.device, args.select)
    if args.command == "fits":
        return fits(args.stage)
    if args.command == "job-end":
        limit = time_limit(args.time_limit)
        print("" if limit is None else int(job_end(time.time(), limit)))  # empty: no limit
        return 0
    return run(args.stage, args.out, args.resume, args.select)


if __name__ == "__main__":
    sys.exit(main())
