"""One case on every rank of a torchrun job, launched and read back: ``launch`` starts ``python -m
torch.distributed.run --standalone --nproc-per-node=N -m gptcore.measure.worker`` for one model and several recipes
(torchrun's start and the ranks' imports paid once), ``Launches`` keeps a session's jobs so that the first case of a
(model, world size, device) launches every case that shares them, and ``combine`` makes one Measurement of a job's
ranks."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gptcore.measure.runner import Measurement

ROOT = Path(__file__).resolve().parents[2]
"""The checkout (or site-packages) that holds this gptcore: the ranks run with it first on PYTHONPATH."""
LAUNCH_TIMEOUT_S = 300


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
    return {name: [json.loads((out / name / f"rank-{r}.json").read_text()) for r in range(world)] for name in recipes}


class Launches:
    """A session's torchrun jobs, by (model, world size, device, counts): each recipe's ranks, or why the job failed."""

    def __init__(self) -> None:
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
                self._held[key] = launch(model, recipes, world, device, out, counts)
            except LaunchFailed as err:
                self._held[key] = err
        held = self._held[key]
        if isinstance(held, LaunchFailed):
            raise held
        return held[recipe]


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
