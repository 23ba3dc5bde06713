"""One case on every rank of a torchrun job, launched and read back: ``launch`` starts ``python -m
torch.distributed.run --standalone --nproc-per-node=N -m gptcore.measure.worker`` for one model and several recipes
(torchrun's start and the ranks' imports paid once), ``Launches`` keeps a session's jobs so that the first case of a
(model, world size, device) launches every case that shares them, and ``combine`` makes one Measurement of a job's
ranks."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gptcore.measure.measurement import Measurement

ROOT = Path(__file__).resolve().parents[2]
"""The checkout (or site-packages) that holds this gptcore: the ranks run with it first on PYTHONPATH."""
LAUNCH_TIMEOUT_S = 300
LOG_DIR = "torchrun-logs"
"""torchrun's log folder, under the job's ``out``: left to itself, torchrun makes a ``torchelastic_*`` folder in the
system's temporary directory for every job and never removes it."""


class _Words(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # one line, no usage text
        raise ValueError(message)


@dataclass(frozen=True)
class Launcher:
    """How torchrun starts a job: on one node (``--standalone``, the default), or as this node of ``nnodes`` that
    meet at a rendezvous (``--nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT``), as a job
    across nodes runs under Slurm (``srun`` around torchrun) or Kubernetes (one pod per node)."""

    nnodes: int = 1
    node_rank: int | None = None
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str | None = None
    rdzv_id: str = "gptcore"

    @property
    def standalone(self) -> bool:
        return self.rdzv_endpoint is None

    def args(self, world: int) -> list[str]:
        """torchrun's arguments for a job of ``world`` ranks in all: ``world / nnodes`` on this node."""
        if world % self.nnodes:
            raise ValueError(f"a world of {world} ranks does not divide over {self.nnodes} nodes")
        per_node = f"--nproc-per-node={world // self.nnodes}"
        if self.standalone:
            return ["--standalone", per_node]
        rank = [f"--node-rank={self.node_rank}"] if self.node_rank is not None else []
        return [
            f"--nnodes={self.nnodes}",
            *rank,
            f"--rdzv-backend={self.rdzv_backend}",
            f"--rdzv-endpoint={self.rdzv_endpoint}",
            f"--rdzv-id={self.rdzv_id}",
            per_node,
        ]

    @classmethod
    def parse(cls, text: str | None) -> Launcher:
        """A launcher from torchrun's own words ('--nnodes 2 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint
        host:29400'); None or '' is the standalone one. ValueError with one line for anything else."""
        if not text or text.strip() == "--standalone":
            return cls()
        words = "expected --nnodes N [--node-rank R] [--rdzv-backend B] --rdzv-endpoint HOST:PORT [--rdzv-id ID]"
        parser = _Words(prog="--launcher", add_help=False)
        parser.add_argument("--nnodes", type=int, required=True)
        parser.add_argument("--node-rank", "--node_rank", type=int, default=None)
        parser.add_argument("--rdzv-backend", "--rdzv_backend", default="c10d")
        parser.add_argument("--rdzv-endpoint", "--rdzv_endpoint", required=True)
        parser.add_argument("--rdzv-id", "--rdzv_id", default="gptcore")
        try:
            args = parser.parse_args(shlex.split(text))
        except ValueError as err:
            raise ValueError(f"--launcher {text!r}: {err}; {words}") from None
        if args.nnodes < 1:
            raise ValueError(f"--launcher {text!r}: --nnodes must be >= 1; {words}")
        if args.node_rank is not None and not 0 <= args.node_rank < args.nnodes:  # torchrun would wait for it
            raise ValueError(
                f"--launcher {text!r}: --node-rank must be in 0..{args.nnodes - 1} (--nnodes {args.nnodes})"
            )
        return cls(args.nnodes, args.node_rank, args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id)


class LaunchFailed(Exception):
    """torchrun exited non-zero or ran past its timeout (the message says which, with the end of its output)."""


def launch(
    model: str,
    recipes: list[str],
    world: int,
    device: str,
    out: Path,
    counts: tuple[int, int, int],
    launcher: Launcher = Launcher(),
) -> dict[str, list[dict]]:
    """Run the cases on ``world`` ranks in one torchrun job; for each recipe, each rank's Measurement as a dict
    (with rank, world_size): every rank's on one node, this node's ranks on several (each node gates its own, unless
    ``out`` is a folder the nodes share)."""
    warmup, rounds, steps = counts
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launcher.args(world),
        f"--log-dir={out / LOG_DIR}",
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
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the ranks import this checkout's gptcore
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
    ranks = {
        name: sorted((out / name).glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1])) for name in recipes
    }
    return {name: [json.loads(path.read_text()) for path in paths] for name, paths in ranks.items()}


class Launches:
    """A session's torchrun jobs, by (model, world size, device, counts): each recipe's ranks, or why the job failed."""

    def __init__(self, launcher: Launcher = Launcher()) -> None:
        self.launcher = launcher
        self._held: dict[tuple, dict[str, list[dict]] | LaunchFailed] = {}

    def ranks(
        self,
        model: str,
        recipe: str,
        world: int,
        device: str,
        out: Path,
        counts: tuple[int, int, int],
        sharing: Sequence[str] = (),
    ) -> list[dict]:
        """This case's ranks: from the job that holds it, launching it (with the recipes of ``sharing``, the other
        selected cases of its model, world size and device) the first time. LaunchFailed for a failed job, every
        time one of its cases asks."""
        key = (model, world, device, counts)
        if key not in self._held:
            recipes = list(dict.fromkeys([recipe, *sharing]))
            try:
                self._held[key] = launch(model, recipes, world, device, out, counts, self.launcher)
            except LaunchFailed as err:
                self._held[key] = err
        held = self._held[key]
        if isinstance(held, LaunchFailed):
            raise held
        return held[recipe]


def combine(ranks: list[dict]) -> Measurement:
    """One Measurement for the job: rank 0's (the round times are already the slowest rank's and the loss the
    mean over ranks), with the peak memory the max over ranks (and that rank's breakdown), and the GPU busy time the
    busiest rank's (and that rank's kernel time by kind)."""
    names = {f.name for f in dataclasses.fields(Measurement)}
    m = Measurement(**{k: v for k, v in ranks[0].items() if k in names})
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "gpu_busy_seconds"):
        values = [r[key] for r in ranks if r.get(key) is not None]
        setattr(m, key, max(values) if values else None)
    if m.peak_allocated_bytes is not None:  # the breakdown of the rank whose peak is the job's
        m.peak_by_category = next(
            r.get("peak_by_category") for r in ranks if r["peak_allocated_bytes"] == m.peak_allocated_bytes
        )
    if m.gpu_busy_seconds is not None:
        m.gpu_kernel_seconds = next(
            r.get("gpu_kernel_seconds") for r in ranks if r.get("gpu_busy_seconds") == m.gpu_busy_seconds
        )
    errors = [f"rank {r['rank']}: {r['error']}" for r in ranks if r["error"]]
    m.error = "; ".join(errors) or None
    return m
