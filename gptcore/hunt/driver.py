"""The driver of one ``compare`` round: run as a script (``python driver.py SPEC_JSON``) in a fresh process
whose PYTHONPATH starts with one revision's checkout, it measures one case with that revision's code and prints one
line, ``GPTCORE-COMPARE {json}``. It imports only what every revision with a benchmark tier has (the named models
and recipes, from gptcore.presets or, before they moved there, gptcore.config; Trainer, StepTimer, cpu_peak_bytes),
and the work ledger and a traced step's GPU busy time where the revision has them; it checks that the gptcore it
imported is the checkout's, never this one's."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

MARK = "GPTCORE-COMPARE "  # gptcore.hunt.compare.MARK (this file runs apart from the package: no import of it)


def main(spec: dict) -> dict:
    """Warm up, time ``steps`` optimizer steps of the case, and read its peak memory and work ledger if asked."""
    import gptcore

    root, where = Path(spec["root"]).resolve(), Path(gptcore.__file__).resolve()
    if root not in where.parents:
        sys.exit(f"gptcore was imported from {where}, not from the checkout {root}")
    import torch  # after the check: the checkout's gptcore, then torch

    try:
        from gptcore import presets
    except ImportError:  # a revision from before the presets moved out of gptcore.config
        from gptcore import config as presets
    try:  # the rooms (training/, measure/); a revision from before them has these at the top of gptcore
        from gptcore.measure.timing import StepTimer
        from gptcore.training.trainer import Trainer

        try:
            from gptcore.measure.cpu_peak import cpu_peak_bytes
        except ImportError:  # a revision from before the CPU allocator's count
            from gptcore.measure.runner import cpu_peak_bytes
    except ImportError:
        from gptcore.measure import StepTimer, cpu_peak_bytes
        from gptcore.train import Trainer

    cfg, recipe = presets.get_model(spec["model"]), presets.get_recipe(spec["recipe"])
    try:  # the case's model and recipe as flat fields, where this revision keeps them
        from gptcore.config import setup_of

        setup = setup_of(cfg, recipe)
    except ImportError:
        setup = None
    device = torch.device(spec["device"])
    try:  # a traced step's GPU busy time, where this revision has it
        from gptcore.measure.trace import start_once, step_timeline
    except ImportError:  # a revision from before the kernel time's split (or the busy time)
        start_once = step_timeline = None
    if start_once is not None:  # the profiler's first use before any CUDA graph is captured (as the runner does)
        start_once(device)
    trainer = Trainer(cfg, recipe, device)
    loss = None
    for _ in range(spec["warmup"]):
        loss = trainer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    with StepTimer(device) as timer:
        for _ in range(spec["steps"]):
            loss = trainer.step()
    out = {
        "gptcore": str(where.parent),
        "seconds": timer.seconds,
        "tokens_per_s": spec["steps"] * trainer.tokens_per_step / timer.seconds,
        "loss": float(loss.item()),
        "loss_step": spec["warmup"] + spec["steps"],
        "cpu_share": timer.cpu_share,
        "peak_memory": None,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": sys.executable,
        "work": None,
        "setup": setup,
    }
    if device.type == "cuda":
        out["peak_memory"] = torch.cuda.max_memory_allocated(device)  # before the ledger's step allocates
    if spec["memory"]:  # the first round: the work ledger of one more step, where this revision has one
        try:
            from gptcore.measure.work import count_step
        except ImportError:
            try:
                from gptcore.work import count_step
            except ImportError:
                count_step = None
        if count_step is not None:
            ledger = count_step(trainer).to_json()
            out["work"] = {
                k: ledger[k]
                for k in (
                    "flops",
                    "op_calls",
                    "syncs",
                    "allocations",
                    "allocated_bytes",
                    "ops",
                    "allocations_by_op",
                    "flops_by_op",
                )
                if k in ledger
            }
    if spec["memory"]:  # and, on a GPU, one traced step after it: its busy time and kernel time by kind
        timeline = step_timeline(trainer.step, device) if step_timeline else None  # None on CPU: nothing traced
        if timeline is not None:
            out["gpu_busy_seconds"], out["gpu_kernel_seconds"] = timeline.busy_seconds, timeline.by_kind
    if device.type != "cuda" and spec["memory"]:
        trainer = loss = None
        gc.collect()
        try:
            out["peak_memory"] = cpu_peak_bytes(cfg, recipe)
        except ValueError:  # a compiled recipe at a revision whose CPU peak was the tracker's alone
            out["peak_memory"] = None
    return out


if __name__ == "__main__":
    print(MARK + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
