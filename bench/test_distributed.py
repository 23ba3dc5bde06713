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

from pathlib import Path

import pytest

from bench.harness import conclude, needs_of, replay_rounds, run_if
from gptcore.config import Timing
from gptcore.measure.launch import Launcher, Launches, LaunchFailed, combine
from gptcore.memory import resolve
from gptcore.memory.parallel import estimate_per_rank
from gptcore.presets import MODELS, RECIPES

TIMING = {"cpu": Timing(warmup=2, rounds=5, steps_per_round=2), "cuda": Timing(warmup=5, rounds=10, steps_per_round=5)}
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
    # HSDP: 2 replicas x 2 shards (2 x N GPUs; N = 2 here), skipped with the reason below 4 GPUs
    pytest.param(
        "gpt2",
        "hsdp",
        2 * WORLD,
        "cuda",
        id=f"gpt2-hsdp-x{2 * WORLD}",
        marks=[pytest.mark.gpu, *run_if(min_gpus=2 * WORLD), *needs_of(RECIPES["hsdp"], "cuda")],
    ),
]


#: The torchrun jobs of this session.
LAUNCHES = Launches()


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
    """This case's ranks from the session's job that holds it (gptcore.measure.launch); a failed launch fails the
    case with its message."""
    LAUNCHES.launcher = Launcher.parse(request.config.getoption("launcher"))  # checked when pytest started
    try:
        return LAUNCHES.ranks(model, recipe, world, device, out, counts, sharing(request, model, world, device))
    except LaunchFailed as err:
        pytest.fail(str(err), pytrace=False)


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
    ranks = ranks_of(request, tmp_path, model, recipe, world, device, counts)
    m = combine(ranks)
    # pytest-benchmark's rounds are the job's own (each the slowest rank's, synced), not the launch or a file read
    replay_rounds(benchmark, m.round_seconds, "the ranks, the slowest each round")
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
