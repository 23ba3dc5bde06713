"""What tracing one step costs on CPU, as a hint of what the GPU busy time's traced step costs (docs/gate.md).

    python scripts/trace_cost.py --model cpu-small --recipe fp32 --pairs 10

A GPU case traces two steps more under ``torch.profiler`` (gptcore.measure.trace: a warm-up step, thrown away, then
the step read), after its timed rounds. On CPU there is no device timeline, so this traces the CPU's own activity
instead, the nearest stand-in: the same profiler session around the same step. It prints the first traced step (the
profiler's start-up in the process), then the median of ``--pairs`` plain steps and traced measurements, alternating,
and the cost of a traced step over a plain one. On a GPU the cost is CUPTI's, unmeasured here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

from gptcore.measure import trace
from gptcore.presets import get_model, get_recipe
from gptcore.training.trainer import Trainer

CPU = trace.DeviceTrace(ProfilerActivity.CPU, DeviceType.CPU, lambda: None, frozenset({"cpu_op"}))


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cpu-small")
    parser.add_argument("--recipe", default="fp32")
    parser.add_argument("--pairs", type=int, default=10)
    args = parser.parse_args(argv)
    if args.pairs < 1:
        print("trace_cost: --pairs must be at least 1", file=sys.stderr)
        return 2
    try:
        trainer = Trainer(get_model(args.model), get_recipe(args.recipe), "cpu")
    except (KeyError, ValueError) as err:
        print(f"trace_cost: {err}", file=sys.stderr)
        return 2
    for _ in range(3):  # warm-up
        trainer.step()
    first = timed(lambda: trace.traced_step(trainer.step, CPU))
    plain, traced = [], []
    for _ in range(args.pairs):
        plain.append(timed(trainer.step))
        traced.append(timed(lambda: trace.traced_step(trainer.step, CPU)))
    p, t = statistics.median(plain), statistics.median(traced)
    print(f"{args.model} {args.recipe}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    n = trace.WARMUP_STEPS + 1  # the steps of one traced measurement
    print(f"first traced measurement ({n} steps): {first * 1e3:,.1f} ms (the profiler starting in the process)")
    print(
        f"median of {args.pairs}: plain step {p * 1e3:,.1f} ms, traced measurement {t * 1e3:,.1f} ms "
        f"({n} steps: {t / n / p:.2f}x a plain step each)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
