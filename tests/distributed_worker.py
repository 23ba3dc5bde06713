"""The rank side of tests/test_distributed.py, run under torchrun (one launch runs every proof: each torchrun start
costs seconds on 2 cores). ``python -m torch.distributed.run --nproc-per-node=2 tests/distributed_worker.py
{proofs,nodes,hsdp,raise} OUT`` (``hsdp`` on 4 ranks): writes OUT/<name>.pt (rank 0, or per rank) for the test process
to compare. ``proofs`` ends with the memory of a planted regression (every FSDP2 module reshards after forward,
whatever the recipe says), patched in after every other figure is taken and undone after, for the test that proves
the check catches it, and then with ``gptcore train`` of a DDP recipe, whose output the test reads. Each training
records its initial parameters (to tell that it trained) and the total gradient norm clipping saw before it clipped,
each step (to compare the gradients' scale, which AdamW's update and a clip that acts on every step both hide)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gptcore.cli import main as cli
from gptcore.config import CHAR_VOCAB, DDPOptions, FSDP2Options, GPTConfig, Parallel, Recipe
from gptcore.memory.allocator import storage_bytes
from gptcore.memory.tracker import LiveBytes, track_training
from gptcore.training.trainer import Trainer

#: tests.helpers.TINY: 2 layers x 2 heads x 32 wide, T=16, global batch 8 (4 per rank on 2 ranks).
TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=CHAR_VOCAB, batch_size=8)
STEPS = 4
#: grad_clip 0.05 is below the gradient norm of every step here, so clipping acts on each step (and on DTensors).
BASE = Recipe(grad_clip=0.05, warmup_steps=1, decay_steps=4)
DDP = Parallel(ddp=DDPOptions())
FSDP2 = Parallel(fsdp2=FSDP2Options())
FSDP2_NO_RESHARD = Parallel(fsdp2=FSDP2Options(reshard_after_forward=False))
MEMORY_CASES = {
    "ddp": dict(parallel=DDP),
    "ddp-bucket-view": dict(parallel=Parallel(ddp=DDPOptions(gradient_as_bucket_view=True))),
    "fsdp2": dict(parallel=FSDP2),
    "fsdp2-no-reshard": dict(parallel=FSDP2_NO_RESHARD),
}
#: The memory cases whose peaks show whether resharding after forward saves memory.
RESHARD_CASES = ("fsdp2", "fsdp2-no-reshard")


def full_params(t: Trainer) -> list[torch.Tensor]:
    """Every parameter, unsharded (a collective under FSDP2), in a fixed order."""
    out = []
    for p in t.model.parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        out.append(p.detach().to(torch.float64).clone())
    return out


@contextlib.contextmanager
def recording_grad_norms() -> Iterator[list[float]]:
    """The total gradient norm that each of the Trainer's ``nn.utils.clip_grad_norm_`` calls returns (the norm before
    clipping), as a float on every rank, until the block ends. The Trainer looks the function up on each call. Under
    FSDP2 and HSDP the gradients are DTensor shards and the norm comes back as a DTensor whose ranks hold partial
    norms: ``full_tensor()`` combines them into the global norm, a collective that every rank reaches, since every
    rank clips on every step."""
    norms: list[float] = []
    original = torch.nn.utils.clip_grad_norm_

    def recording(*args, **kwargs):
        total = original(*args, **kwargs)
        norms.append((total.full_tensor() if hasattr(total, "full_tensor") else total).item())
        return total

    torch.nn.utils.clip_grad_norm_ = recording
    try:
        yield norms
    finally:
        torch.nn.utils.clip_grad_norm_ = original


def train(recipe: Recipe, dtype: torch.dtype = torch.float32) -> dict:
    """STEPS steps from the Trainer's own data path: the initial parameters, the global loss of each step, the
    total gradient norm before clipping of each step (none without clipping), and the final parameters."""
    t = Trainer(TINY, recipe, "cpu", dtype=dtype)
    initial = full_params(t)
    with recording_grad_norms() as norms:
        losses = [t.mean_loss(t.step()).item() for _ in range(STEPS)]
    return {
        "initial": initial,
        "losses": losses,
        "grad_norms": norms,
        "params": full_params(t),
        "micro_batch": t.micro_batch,
    }


def states(recipe: Recipe) -> dict:
    """This rank's bytes of parameters, gradients and optimizer state after a tracked step, and the tracked peak."""
    t = Trainer(TINY, recipe, "cpu")
    tracker = LiveBytes()
    report = track_training(t, steps=2, tracker=tracker)
    params = list(t.model.parameters())
    seen = {}  # the gradients of one more step, read just before the optimizer step (zero_grad frees them after)
    t.optimizers[0].register_step_pre_hook(
        lambda *_: seen.update(
            g=storage_bytes([p.grad for p in params if p.grad is not None]),
            missing=[i for i, p in enumerate(params) if p.grad is None],
        )
    )
    t.step()
    opt = storage_bytes([v for s in t.optimizers[0].state.values() for v in s.values() if v.dim() > 0])
    return {
        "parameters": storage_bytes(params),
        "gradients": seen["g"],
        "no gradient": seen["missing"],
        "optimizer state": opt,
        "peak": report.peak_bytes,
        "by_category": report.by_category,
        "foreign_frees": tracker.foreign_frees,
    }


def proofs(out: Path) -> None:
    results = {}
    # DDP vs one process in float64. A clip far above every gradient norm here: clip_grad_norm_ runs and returns the
    # norm, which is recorded, but scales the gradients by min(1, 1e9 / norm) = 1 exactly (clipping that acts: see
    # the fp32 proofs)
    f64 = dataclasses.replace(BASE, grad_clip=1e9)
    results["ddp-f64"] = train(dataclasses.replace(f64, parallel=DDP), torch.float64)
    rank = dist.get_rank()
    if rank == 0:  # one process with the whole batch: no collective, so only rank 0 runs it
        results["single-f64"] = train(f64, torch.float64)
        results["single-f64"]["world"] = 1
    for name, change in {"": {}, "-ckpt": dict(checkpoint=True), "-accum": dict(grad_accum_steps=2)}.items():
        results[f"ddp{name}"] = train(dataclasses.replace(BASE, parallel=DDP, **change))
        results[f"fsdp2{name}"] = train(dataclasses.replace(BASE, parallel=FSDP2, **change))
        results[f"fsdp2-no-reshard{name}"] = train(dataclasses.replace(BASE, parallel=FSDP2_NO_RESHARD, **change))
    if rank == 0:
        torch.save(results, out / "results.pt")
    measure_memory(out)
    # the one-node reference of the two-node job (`nodes`): the same two trainings, already run above
    torch.save({name: results[name] for name in ("ddp", "fsdp2")}, out / f"nodes-{rank}.pt")
    with always_reshard():
        planted = {name: states(dataclasses.replace(BASE, **MEMORY_CASES[name])) for name in RESHARD_CASES}
    torch.save(planted, out / f"planted-{rank}.pt")
    # the command line on every rank, as `torchrun --nproc-per-node=2 -m gptcore train` runs it: its summary is
    # printed once, by rank 0, into the launch's output
    if cli(["train", "--model", "cpu-small", "--recipe", "ddp", "--steps", "3"]) != 0:
        raise SystemExit("gptcore train failed")


def measure_memory(out: Path) -> None:
    """Each memory case's per-rank figures, and the tracked peak of a second, identical pass (``again``)."""
    memory = {name: states(dataclasses.replace(BASE, **MEMORY_CASES[name])) for name in MEMORY_CASES}
    memory["none"] = states(BASE) if dist.get_rank() == 0 else None
    memory["again"] = {name: states(dataclasses.replace(BASE, **MEMORY_CASES[name]))["peak"] for name in MEMORY_CASES}
    torch.save(memory, out / f"memory-{dist.get_rank()}.pt")


@contextlib.contextmanager
def always_reshard() -> Iterator[None]:
    """The planted regression: fully_shard ignores reshard_after_forward=False (the Trainer looks it up on each
    call), until the block ends."""
    import torch.distributed.fsdp as fsdp

    original = fsdp.fully_shard

    def planted(module, **kwargs):
        return original(module, **(kwargs | {"reshard_after_forward": True}))

    fsdp.fully_shard = planted
    try:
        yield
    finally:
        fsdp.fully_shard = original


def planted_failure() -> None:
    """Rank 1 raises after joining; rank 0 goes on into a step and waits in the gradient all-reduce."""
    t = Trainer(TINY, Recipe(parallel=DDP), "cpu")
    if dist.get_rank() == 1:
        raise RuntimeError("planted failure on rank 1")
    for _ in range(100):
        t.step()


def nodes(out: Path) -> None:
    """DDP and FSDP2 in float32, each rank's losses and full parameters: the same on one node and across nodes."""
    results = {
        name: train(dataclasses.replace(BASE, parallel=parallel)) for name, parallel in (("ddp", DDP), ("fsdp2", FSDP2))
    }
    torch.save(results, out / f"nodes-{dist.get_rank()}.pt")


HSDP = Parallel(fsdp2=FSDP2Options(replicate=2))


def hsdp(out: Path) -> None:
    """On 4 ranks: DDP, FSDP2 and HSDP (2 replicas x 2 shards) trained in float32, and each one's per-rank memory."""
    results = {
        name: train(dataclasses.replace(BASE, parallel=parallel))
        for name, parallel in (("ddp", DDP), ("fsdp2", FSDP2), ("hsdp", HSDP))
    }
    results["memory"] = {
        name: states(dataclasses.replace(BASE, parallel=parallel))
        for name, parallel in (("fsdp2", FSDP2), ("hsdp", HSDP))
    }
    results["again"] = states(dataclasses.replace(BASE, parallel=HSDP))["peak"]
    torch.save(results, out / f"hsdp-{dist.get_rank()}.pt")


if __name__ == "__main__":
    mode, target = sys.argv[1], Path(sys.argv[2])
    if mode == "proofs":
        proofs(target)
    elif mode == "nodes":
        nodes(target)
    elif mode == "hsdp":
        hsdp(target)
    else:
        planted_failure()
