"""A ladder rung side by side with nanoGPT's train.py step, in one process on one GPU, on the same batches.

nanoGPT's code is never part of this repository: pass the folder of a nanoGPT checkout (its model.py is imported
from there; docs/gpu.md downloads it beforehand, on a machine with a network, into a git-ignored folder that travels
to a GPU machine that reaches none).
Both steps are GPT-2 124M at B=16, T=1024, bf16 autocast, torch.compile, vocab 50,304, tied, fused AdamW (lr 6e-4,
betas 0.9/0.95, weight decay 0.1), clip 1.0, on the same random batches already on the GPU. After a warm-up of each
(compilation), ROUNDS rounds of STEPS steps alternate between the two (which goes first alternates too), each round
timed by CUDA events; the median tokens/s of each and their ratio are printed, and written to --json.

A rung that fills the device (``fit_memory``, ladder-9 and up) runs at its fitted batch, and nanoGPT at the batch
that the same share gives nanoGPT's own step (ladder-8's recipe fitted): at ladder-9 the same batch, above it each
at its largest (a fused loss fits more sequences than nanoGPT's step can hold). nanoGPT's batches are then the first
rows of gptcore's, and the cache of freed memory is emptied before each round, so that neither step finds the
device's memory held by the other's.

With --profile FILE, 3 more steps of each run under torch.profiler after the timed rounds, and FILE gets each
step's kernels by CUDA time, side by side: where the two steps differ, by name. Above them, and printed, each step's
kernel time per step by kind of kernel (gptcore.measure.trace.KINDS: matmul, attention, inductor, ...), side by side
with the difference: where the two steps differ, by kind (also in --json, as ``kinds``).

Usage: python scripts/versus_nanogpt.py NANOGPT_DIR [--recipe ladder-8] [--rounds 10] [--steps 10] [--json FILE]
       [--profile FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's gptcore, installed or not

from gptcore.gate.results import unwritable  # noqa: E402
from gptcore.measure import trace  # noqa: E402
from gptcore.memory.fit import fitted  # noqa: E402
from gptcore.presets import MODELS, get_recipe  # noqa: E402
from gptcore.training.trainer import Trainer  # noqa: E402

B, T, VOCAB, PADDED = 16, 1024, 50257, 50304


def nanogpt_step(folder: Path):
    """nanoGPT's model at GPT-2 124M with its configure_optimizers, compiled, and its train.py step."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", folder / "model.py")
    if spec is None or not (folder / "model.py").is_file():
        sys.exit(f"versus_nanogpt.py: no model.py in {folder}: pass a nanoGPT checkout's folder")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = module.GPTConfig(block_size=T, vocab_size=PADDED, n_layer=12, n_head=12, n_embd=768, dropout=0.0, bias=True)
    model = module.GPT(cfg).cuda()
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda")
    compiled = torch.compile(model)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = compiled(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def timed(step, batches: list, steps: int) -> float:
    """Tokens/s of ``steps`` steps over ``batches``, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(steps):
        step(*batches[i % len(batches)])
    end.record()
    end.synchronize()
    return steps * batches[0][0].numel() / (start.elapsed_time(end) / 1e3)


def batch_sizes(recipe_name: str) -> tuple[int, int]:
    """gptcore's batch and nanoGPT's: B for both, or for a recipe that fills the device (``fit_memory``) its fitted
    batch and the one the same share gives ladder-8's recipe, nanoGPT's step."""
    recipe = get_recipe(recipe_name)
    if recipe.fit_memory is None:
        return B, B
    nanogpt = dataclasses.replace(get_recipe("ladder-8"), fit_memory=recipe.fit_memory)
    ours, theirs = (fitted(MODELS["gpt2"], r, "cuda").batch_size for r in (recipe, nanogpt))
    return ours, theirs


def profiled(steps: dict, batches: dict, out: Path, n: int = 3) -> dict[str, dict[str, float]]:
    """``n`` steps of each under torch.profiler, after the timed rounds; ``out`` gets each one's kernel time per step
    by kind, side by side, then its operators and kernels by self CUDA time, summed over the ``n`` steps (the top
    100: a shorter table cut one step's kernel that the other's kept, and read as a difference). Returns the kinds."""
    from torch.profiler import ProfilerActivity, profile

    parts, kinds = [], {}
    for name, step in steps.items():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            timed(step, batches[name], n)
        timeline = trace.device_time(prof.events(), trace.trace_for(torch.device("cuda")))
        kinds[name] = {kind: seconds / n for kind, seconds in timeline.by_kind.items()}
        table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=100, max_name_column_width=90)
        parts.append(f"== {name}: {n} steps\n{table}")
    side_by_side = kinds_side_by_side(kinds)
    print(side_by_side)
    out.write_text("\n".join([side_by_side, *parts]))
    print(f"profile of {n} steps of each: {out}")
    return kinds


def kinds_side_by_side(kinds: dict[str, dict[str, float]]) -> str:
    """Each step's kernel time per step by kind (ms), gptcore's and nanoGPT's, and the difference, the kinds that
    take the most first, and their totals."""
    from tabulate import tabulate

    ours, theirs = kinds["gptcore"], kinds["nanoGPT"]
    names = sorted({*ours, *theirs}, key=lambda k: (-round((ours.get(k, 0) + theirs.get(k, 0)) * 1e9), k))
    rows = [(k, ours.get(k, 0.0), theirs.get(k, 0.0)) for k in names]
    rows.append(("all kernels", sum(ours.values()), sum(theirs.values())))
    cells = [[k, f"{a * 1e3:,.3f}", f"{b * 1e3:,.3f}", f"{(a - b) * 1e3:+,.3f}"] for k, a, b in rows]
    title = "kernel time per step by kind of kernel, ms"
    return f"{title}\n" + tabulate(
        cells, headers=["kind", "gptcore", "nanoGPT", "gptcore - nanoGPT"], disable_numparse=True, stralign="right"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nanogpt", type=Path, help="a nanoGPT checkout's folder (outside this repository)")
    parser.add_argument("--recipe", default="ladder-8", help="the gptcore recipe (default ladder-8, B=16)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", type=Path, default=None, help="a file for both steps' kernels, side by side")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        sys.exit("versus_nanogpt.py: --rounds and --steps must be at least 1")
    # what would otherwise stop it after the batch fitting, the warm-up or the rounds: checked first
    try:
        get_recipe(args.recipe)
    except ValueError as err:
        sys.exit(f"versus_nanogpt.py: {err}")
    if not (args.nanogpt / "model.py").is_file():
        sys.exit(f"versus_nanogpt.py: no model.py in {args.nanogpt}: pass a nanoGPT checkout's folder")
    for option, path in (("--json", args.json), ("--profile", args.profile)):
        why = unwritable(path) if path else None
        if why:
            sys.exit(f"versus_nanogpt.py: {option} {path}: {why}")
    if not torch.cuda.is_available():
        sys.exit("versus_nanogpt.py: needs a CUDA GPU")
    torch.manual_seed(0)
    ours, theirs = batch_sizes(args.recipe)
    rows = max(ours, theirs)
    drawn = [
        (torch.randint(0, VOCAB, (rows, T), device="cuda"), torch.randint(0, VOCAB, (rows, T), device="cuda"))
        for _ in range(4)
    ]
    batches = {
        "gptcore": [(x[:ours], y[:ours]) for x, y in drawn],
        "nanoGPT": [(x[:theirs], y[:theirs]) for x, y in drawn],
    }
    trainer = Trainer(dataclasses.replace(MODELS["gpt2"], batch_size=ours), get_recipe(args.recipe), "cuda")
    if trainer.micro_batch * trainer.accum != ours:
        sys.exit(
            f"versus_nanogpt.py: {args.recipe} trains a batch of {trainer.micro_batch * trainer.accum}, not {ours}"
        )
    steps = {"gptcore": lambda x, y: trainer.step((x, y)), "nanoGPT": nanogpt_step(args.nanogpt)}
    fills = ours != B or theirs != B  # a fitted batch: neither step may find the other's freed memory still cached
    print(f"batches: gptcore {ours}, nanoGPT {theirs} (T={T})", flush=True)
    for name, step in steps.items():  # warm-up: compilation and the optimizer's state
        timed(step, batches[name], 5)
    device = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(args.rounds):  # each round printed and written as it ends: a job cut short keeps the rounds so far
        for name in list(steps) if r % 2 == 0 else list(steps)[::-1]:
            if fills:
                torch.cuda.empty_cache()
            rates[name].append(timed(steps[name], batches[name], args.steps))
        median = {name: statistics.median(values) for name, values in rates.items()}
        ratio = median["gptcore"] / median["nanoGPT"]
        print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:,.0f} tok/s" for n, v in rates.items()), flush=True)
        if args.json:
            record = dict(
                device=device, recipe=args.recipe, batches=[ours, theirs], rounds=r + 1, rates=rates, ratio=ratio
            )
            args.json.write_text(json.dumps(record, indent=1))
    print(f"{device}: gptcore {args.recipe} {median['gptcore']:,.0f} tok/s, nanoGPT {median['nanoGPT']:,.0f} tok/s")
    print(f"ratio {ratio:.3f} (median of {args.rounds} alternating rounds of {args.steps} steps)")
    if args.profile:
        kinds = profiled(steps, batches, args.profile)
        if args.json:
            args.json.write_text(json.dumps(json.loads(args.json.read_text()) | {"kinds": kinds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
