"""The stages of a GPU run in a time-limited or preemptible job (a Slurm allocation with ``--time``, a spot instance,
a CI job with a timeout): what each runs, in which order, with which options. ``scripts/gpu_stage.py`` runs a stage
(with a deadline, a results log and resume, everything written under the output folder as it ends) and plans them
all on CPU; ``scripts/gpu_session.sh STAGE[,STAGE...] [OUT_DIR] [--time-limit SECONDS]`` is the way in.

A job that is killed at its limit, or preempted, loses only the case it was in: the next job resumes from the
results logs in the output folder. A first run goes in :data:`ORDER`: ``smoke`` first (one case of each kind,
stopping at the first failure), then the recording stages, then ``verify`` against what they recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TIME_LIMIT_ENV = "GPTCORE_TIME_LIMIT"
"""The job's time limit in seconds, where ``--time-limit`` is not given (e.g. the seconds of Slurm's ``--time``)."""
JOB_END_ENV = "GPTCORE_JOB_END"
"""Unix time by which the job's stages are done. ``scripts/gpu_session.sh`` sets it once per job from the time limit
(its start plus the limit, less :data:`MARGIN_SECONDS`), so that stages run one after another in one job
(``smoke,ladder``) share the job's time. Unset: no limit but each stage's own."""
MARGIN_SECONDS = 60.0
"""What a job keeps back from its time limit: the interpreter's start, the imports and the end table of the stage
that runs last."""
MIN_STAGE_SECONDS = 60.0
"""A stage with less than this left of its job is not started (its imports and end table alone take ~20 s)."""


@dataclass(frozen=True)
class Stage:
    """One stage: a study recorded, the recorded cases verified, or a script's measurement."""

    name: str
    what: str
    pytest: list[str] = field(default_factory=list)
    """pytest's arguments (node ids are run in the order given); empty for a stage that runs scripts."""
    options: list[str] = field(default_factory=list)
    """Further pytest options of the stage (--update-baselines, -x, timing overrides)."""
    deadline: float | None = None
    """The stage's own limit in seconds (None: the job's limit alone)."""
    script_seconds: float = 0.0
    """A script stage's planned time (stated: it has no cases to plan)."""
    writes: str = ""


SMOKE = [
    "bench/test_ladder.py::test_ladder[gpt2-ladder-0]",
    "bench/test_ladder.py::test_ladder[gpt2-ladder-8]",
    "bench/test_char_shape.py::test_char_shape[char-fp16]",
    "bench/test_char_shape.py::test_char_shape[char-bf16]",
    "bench/test_memory_recipes.py::test_memory_recipes[deep-1.6b-budget-0.60]",  # a compiled memory recipe
    "bench/test_distributed.py::test_distributed[gpt2-ddp-x2]",  # skips itself with fewer than 2 GPUs
    "tests/test_estimate_gpu.py::test_the_estimate_matches_the_cuda_allocator",
    "tests/test_kernels_gpu.py",  # the rungs past nanoGPT's kinds, once each: fit, liger, FP8, autotuned compile
    "tests/test_trace_gpu.py",  # GPU busy time off the device's own timeline
]
RECORD = ["--require-gpu", "--update-baselines"]
CONVERGENCE_SHORT = "not (ctx2 or layers2 or embd2) or fp16 or bf16 or small-batch"
"""The convergence cases planned at under 10 minutes each on an H100; 5,000 steps of a doubled char model in fp32
(TF32 off) are planned at 10-11 minutes each, and gpu.yml runs them."""

STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage(
            "smoke",
            "one case of each kind, in order, stopping at the first failure: does anything break on CUDA?",
            SMOKE,
            ["--require-gpu", "-x", "--bench-warmup", "2", "--bench-rounds", "2", "--bench-steps", "2"],
            deadline=300,
            writes="smoke.jsonl, smoke.log, smoke.json",
        ),
        Stage(
            "ladder",
            "GPT-2 124M up the ladder, recorded",
            ["bench/test_ladder.py"],
            RECORD,
            writes="ladder.jsonl, ladder.log, ladder.json, baselines/<gpu>.json",
        ),
        Stage(
            "memory",
            "deep-1.6b under the 11 memory recipes, recorded",
            ["bench/test_memory_recipes.py"],
            RECORD,
            writes="memory.jsonl, memory.log, memory.json, baselines/<gpu>.json",
        ),
        Stage(
            "char",
            "the char-shape study, recorded (run it again to resume where the deadline stopped it)",
            ["bench/test_char_shape.py"],
            RECORD,
            writes="char.jsonl, char.log, char.json, baselines/<gpu>.json",
        ),
        Stage(
            "convergence",
            "the GPU convergence tier's shorter runs, recorded (each job resumes the last); the doubled char "
            "models in fp32, SGD and accumulation take 10-11 minutes each (gpu.yml runs them)",
            [
                "bench/test_convergence_char_shape.py",
                "bench/test_convergence_memory_recipes.py",
                "-k",
                CONVERGENCE_SHORT,
            ],
            RECORD,
            writes="convergence.jsonl, convergence.log, convergence.json, baselines/<gpu>.json",
        ),
        Stage(
            "verify",
            "the GPU tier's recorded cases again, against their baselines: a false failure shows here, "
            "and the two runs give the GPU noise (scripts/gpu_noise.py, noise.json)",
            ["bench", "-m", "gpu"],
            ["--require-gpu", "--recorded-only"],
            writes="verify.jsonl, verify.log, verify.json, noise.json",
        ),
        Stage(
            "budget",
            "why a compile memory budget runs out of memory: the partitioner's plan for deep-1.6b on CUDA "
            "and the allocator's history of budget-0.05 and budget-0.60",
            script_seconds=420,
            writes="budget.log, partition-deep-1.6b.json, snapshots",
        ),
        Stage(
            "profile",
            "nanoGPT's top rung (ladder-8) under torch.profiler, the bf16 matmul peak, the report of the last run",
            script_seconds=150,
            writes="profile tables, matmul-bf16.json, report.txt",
        ),
    )
}
ORDER = ("smoke", "ladder", "memory", "char", "convergence", "verify", "budget", "profile")


def stage_deadline(stage: Stage, now: float, job_end: float | None) -> float | None:
    """The deadline of ``stage`` started at ``now`` (Unix time): its own, or what is left of the job if less; None
    where neither limits it."""
    limits = [x for x in (stage.deadline, None if job_end is None else job_end - now) if x is not None]
    return min(limits) if limits else None


def job_end(start: float, time_limit: float) -> float:
    """The Unix time by which a job started at ``start`` with ``time_limit`` seconds must have its stages done."""
    return start + time_limit - MARGIN_SECONDS
