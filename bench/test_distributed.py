"""Data parallelism per rank: DDP and FSDP2 recipes launched by torchrun, one case per (model, recipe, world size).

The first case of a (model, world size, device) starts ``python -m torch.distributed.run --standalone
--nproc-per-node=N -m gptcore.measure.worker --recipe R1 R2 ...`` as a subprocess for every selected case that shares
them: one launch, so torchrun's start and the ranks' imports are paid once. For each recipe every rank warms up on a
fresh Trainer, times rounds and writes its Measurement (gptcore/measure/worker.py); the later cases read theirs. A
launch that fails fails every case it held, with its output. The case's figures:
tokens/s of the whole job (global tokens per step / median step time of the slowest rank), the loss averaged over
ranks, the peak memory as the max over ranks (each rank's in extra_info), gated like any other case.
CPU tier: cpu-small x {ddp, fsdp2, fsdp2-no-reshard} on 2 gloo ranks, one launch of about 10 s on 2 cores (6 s of it
torchrun's start and two imports of torch). GPU tier: gpt2 on 2 GPUs, skipped with the reason below 2.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness import Timing, conclude, needs_of, run_if
from gptcore.measure.runner import Measurement
from gptcore.memory import resolve
from gptcore.memory.parallel import estimate_per_rank
from gptcore.presets import MODELS, RECIPES

ROOT = Path(__file__).resolve().parents[1]
TIMING = {"cpu": Timing(warmup=2, rounds=5, steps_per_round=2), "cuda": Timing(warmup=5, rounds=10, steps_per_round=5)}
LAUNCH_TIMEOUT_S = 300
WORLD = 2

CASES = [
    *(
        pytest.param("cpu-small", name, WORLD, "cpu", id=f"cpu-small-{name}-x{WORLD}", marks=pytest.mark.cpu)
        for name in ("ddp", "fsdp2", "fsdp2-no-reshard")
    ),
    *(
        pytest.param(
            "gpt2",
            name,
            WORLD,
            "cuda",
            id=f"gpt2-{name}-x{WORLD}",
            marks=[pytest.mark.gpu, *run_if(min_gpus=WORLD), *needs_of(RECIPES[name], "cuda")],
        )
        for name in ("ddp", "ddp-bucket-view", "fsdp2", "fsdp2-no-reshard", "fsdp2-bf16")
    ),
]


class LaunchFailed(Exception):
    """torchrun exited non-zero or ran past its timeout (the message says which, with the end of its output)."""


def launch(
    model: str, recipes: list[str], world: int, device: str, out: Path, counts: tuple[int, int, int]
) -> dict[str, list[dict]]:
    """Run the cases on ``world`` ranks in one torchrun job; for each recipe, each rank's Measurement as a dict
    (with rank, world_size)."""
    warmup, rounds, steps = counts
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world}",
        "-m",
        "gptcore.measure.worker",
        "--model",
        model,
        "--recipe",
        *recipes,
        "--out",
        str(out),
        "--device",
        device,
        "--warmup",
        str(warmup),
        "--rounds",
        str(rounds),
        "--steps",
        str(steps),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers
            proc.communicate()
            raise LaunchFailed(f"torchrun did not finish within {LAUNCH_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        raise LaunchFailed(f"torchrun exited {proc.returncode} (cases {', '.join(recipes)}):\n{output[-3000:]}")
    return {name: [json.loads((out / name / f"rank-{r}.json").read_text()) for r in range(world)] for name in recipes}


#: The launches of this session: (model, world, device, counts) -> each recipe's ranks, or why the launch failed.
_LAUNCHED: dict[tuple, dict[str, list[dict]] | str] = {}


def sharing(request: pytest.FixtureRequest, model: str, world: int, device: str) -> list[str]:
    """The recipes of the session's selected cases that run on (model, world, device), in collection order; not
    those a skipif mark (a missing GPU, bf16 or flash) will skip."""
    names = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        skipped = any(mark.args and mark.args[0] is True for mark in item.iter_markers("skipif"))
        if (
            getattr(item, "originalname", None) == "test_distributed"
            and not skipped
            and (params.get("model"), params.get("world"), params.get("device")) == (model, world, device)
        ):
            names.append(params["recipe"])
    return names


def ranks_of(
    request: pytest.FixtureRequest,
    out: Path,
    model: str,
    recipe: str,
    world: int,
    device: str,
    counts: tuple[int, int, int],
) -> list[dict]:
    """This case's ranks: from the session's launch that holds it, launching it (with every selected case that
    shares its model, world size and device) the first time; a failed launch fails the case with its message."""
    key = (model, world, device, counts)
    if key not in _LAUNCHED:
        recipes = list(dict.fromkeys([recipe, *sharing(request, model, world, device)]))
        try:
            _LAUNCHED[key] = launch(model, recipes, world, device, out, counts)
        except LaunchFailed as err:
            _LAUNCHED[key] = str(err)
    held = _LAUNCHED[key]
    if isinstance(held, str):
        pytest.fail(held, pytrace=False)
    return held[recipe]  # every selected case was in the launch: sharing() lists them all


def combine(ranks: list[dict]) -> Measurement:
    """One Measurement for the job: rank 0's (the round times are already the slowest rank's and the loss the
    mean over ranks), with the peak memory the max over ranks (and that rank's breakdown)."""
    names = {f.name for f in dataclasses.fields(Measurement)}
    m = Measurement(**{k: v for k, v in ranks[0].items() if k in names})
    for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
        values = [r[key] for r in ranks if r[key] is not None]
        setattr(m, key, max(values) if values else None)
    if m.peak_allocated_bytes is not None:  # the breakdown of the rank whose peak is the job's
        m.peak_by_category = next(
            r.get("peak_by_category") for r in ranks if r["peak_allocated_bytes"] == m.peak_allocated_bytes
        )
    errors = [f"rank {r['rank']}: {r['error']}" for r in ranks if r["error"]]
    m.error = "; ".join(errors) or None
    return m


@pytest.mark.benchmark(group="distributed")
@pytest.mark.parametrize(("model", "recipe", "world", "device"), CASES)
def test_distributed(benchmark, gate, request, tmp_path, model: str, recipe: str, world: int, device: str) -> None:
    cfg, r = MODELS[model], RECIPES[recipe]
    timing = TIMING[device]
    counts = gate.timing(timing.warmup, timing.rounds, timing.steps_per_round)
    try:
        estimate: int | str = estimate_per_rank(resolve(cfg, r, device=device), world).total_bytes
    except Exception:  # (an estimate column never fails a case)
        estimate = "err"
    # pytest-benchmark times the launch in the case that makes it (torchrun's start and every case it holds) and
    # the reading of the results in the others; the gate reads the ranks' own timings
    ranks = benchmark.pedantic(
        ranks_of,
        args=(request, tmp_path, model, recipe, world, device, counts),
        rounds=1,
        iterations=1,
        warmup_rounds=0,
    )
    m = combine(ranks)
    outcome = gate.judge(
        request.node, m, model=model, recipe=recipe, precision=r.precision, estimate=estimate, world=world
    )
    benchmark.extra_info.update(
        model=model,
        recipe=recipe,
        world_size=world,
        precision=r.precision,
        batch=r.batch_size(cfg),
        block_size=cfg.block_size,
        estimate_bytes=estimate,
        peak_bytes_per_rank=[x["peak_allocated_bytes"] for x in ranks],
        tokens_per_s_per_rank=[x["tokens_per_s"] for x in ranks],
        verdict=outcome.verdict.summary() if outcome.verdict else None,
        **m.to_dict(),
    )
    conclude(outcome)
