"""The command line: ``python -m gptcore {list, train, estimate, report, compare, bisect, history}``.

Every command's arguments are parsed here, with no torch imported until a command runs (``--help`` and ``list``
stay fast). Bad input is one line on stderr and exit code 2; an out-of-memory run is one line and exit code 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import statistics
import sys
import time
import types
import typing
import warnings
from collections.abc import Sequence

from gptcore.config import GPTConfig, Recipe, Schedule
from gptcore.presets import MODEL_NOTES, MODELS, RECIPE_NOTES, RECIPES, get_model, get_recipe
from gptcore.units import format_bytes


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # argparse prints usage + message; we want one line
        raise UsageError(message)


def _positive(text: str) -> int:
    """An integer >= 1 (argparse names the flag in its message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _add_case_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --recipe and --set: the one definition of what names a case."""
    parser.add_argument("--model", required=True, help="model preset (see `list`)")
    parser.add_argument("--recipe", default="fp32", help="recipe (see `list`); default fp32")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        dest="assignments",
        help="change one Recipe field on top of the recipe, e.g. --set checkpoint=true "
        "--set grad_accum_steps=4; a nested field by its dotted name, e.g. "
        "--set parallel.fsdp2.reshard_after_forward=false (repeatable; "
        "None/true/false/numbers/names)",
    )


def _interpreter(value: str) -> str:
    """An interpreter given as a path (relative to the cwd) or a name on PATH, made absolute: compare runs it in a
    temporary worktree. Not resolved through links: a venv's python is a link, and its venv is the point. Whether
    it exists and runs is compare's to say (one line)."""
    import os
    import shutil

    return os.path.abspath(value if os.sep in value else shutil.which(value) or value)


def _parser() -> argparse.ArgumentParser:
    from gptcore.hunt import bisection  # no torch: the choices of bisect --metric

    parser = _Parser(
        prog="python -m gptcore", description="gptcore: train, estimate and report GPT training recipes (see README.md)"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("list", help="every model and recipe, one line each")

    train = sub.add_parser("train", help="train a named model with a named recipe")
    _add_case_arguments(train)
    train.add_argument("--steps", type=_positive, default=100, help="optimizer steps (default 100)")
    train.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if present, else cpu")
    train.add_argument("--batch", type=_positive, default=None, help="override the model's batch size")
    train.add_argument(
        "--log-every",
        type=_positive,
        default=10,
        help="read the loss every N steps (a host-device sync each; default 10)",
    )
    train.add_argument(
        "--eval-every",
        type=_positive,
        default=None,
        metavar="N",
        help="read the validation loss every N steps, at step 0 and at the end (eval mode, fixed "
        "batches); the summary gives the final one",
    )
    train.add_argument(
        "--eval-batches",
        type=_positive,
        default=20,
        metavar="K",
        help="validation batches per evaluation (the model's batch size each; default 20)",
    )

    estimate = sub.add_parser("estimate", help="memory breakdown of a training step: analytic, optionally simulated")
    _add_case_arguments(estimate)
    estimate.add_argument(
        "--batch", type=_positive, default=None, help="sequences per optimizer step (default: the preset's)"
    )
    estimate.add_argument(
        "--seq", type=_positive, default=None, help="context length (default: the preset's block_size)"
    )
    estimate.add_argument("--checkpoint", action="store_true", help="add activation checkpointing to the recipe")
    estimate.add_argument("--simulate", action="store_true", help="also simulate two iterations on fake tensors")
    estimate.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="device to estimate for (default cuda)"
    )

    report = sub.add_parser("report", help="tables (and --plot charts) from a pytest --benchmark-json file")
    report.add_argument("run", metavar="RUN.json", help="a file written by pytest bench --benchmark-json=RUN.json")
    report.add_argument(
        "--plot",
        metavar="DIR",
        default=None,
        help="also write PNG charts into DIR (needs matplotlib: pip install 'gptcore-bench[plot]')",
    )
    report.add_argument(
        "--html",
        metavar="OUT.html",
        default=None,
        help="also write one self-contained HTML page: each case vs its baseline, the memory "
        "breakdown, the ladder, the history (needs matplotlib)",
    )
    report.add_argument(
        "--baselines", metavar="DIR", default="baselines", help="baseline files for --html (default baselines)"
    )
    report.add_argument(
        "--history", metavar="DIR", default=None, help="pytest-benchmark saved runs for --html, e.g. .benchmarks/cpu"
    )

    compare = sub.add_parser(
        "compare",
        help="is HEAD slower than BASE on this machine (or B's Python environment "
        "than A's)? interleaved fresh-process rounds of both, per case",
    )
    compare.add_argument(
        "base",
        metavar="BASE",
        nargs="?",
        default=None,
        help="git revision A (resolved in the repository of the cwd); leave it out with "
        "--python-a/--python-b to run the working tree under both interpreters",
    )
    compare.add_argument(
        "head",
        metavar="HEAD",
        nargs="?",
        default=None,
        help="git revision B (default: the working tree as it is, uncommitted changes included)",
    )
    _add_hunt_arguments(compare)
    compare.add_argument("--json", metavar="FILE", default=None, help="write every figure to FILE")
    compare.add_argument(
        "--python-a",
        metavar="PATH",
        default=None,
        type=_interpreter,
        help="the interpreter that runs A, e.g. venv-old/bin/python (default: this one)",
    )
    compare.add_argument(
        "--python-b",
        metavar="PATH",
        default=None,
        type=_interpreter,
        help="the interpreter that runs B, e.g. venv-new/bin/python with another torch",
    )

    bisect = sub.add_parser("bisect", help="git bisect run for the first commit worse than GOOD on one metric")
    bisect.add_argument("good", metavar="GOOD", help="a revision with the good figure")
    bisect.add_argument("bad", metavar="BAD", help="a later revision with the bad figure")
    _add_hunt_arguments(bisect)
    bisect.add_argument(
        "--metric",
        choices=bisection.METRICS,
        default="tokens_per_s",
        help="tokens_per_s: compare's verdict slower is bad; peak_memory, loss: beyond the gate's "
        "tolerance of GOOD's figure is bad (exact, deterministic)",
    )

    history = sub.add_parser(
        "history",
        help="change points over commits in pytest-benchmark's saved runs: the "
        "creeping regression no single run fails, named by its commit range",
    )
    history.add_argument(
        "-k",
        dest="expr",
        default=None,
        metavar="TEXT",
        help="only the cases whose name holds TEXT, e.g. cpu-small-ckpt-fp32",
    )
    history.add_argument(
        "--storage", metavar="DIR", default=None, help="pytest-benchmark's storage (default: .benchmarks/<this device>)"
    )
    history.add_argument("--json", metavar="FILE", default=None, help="write every finding to FILE")
    history.add_argument(
        "--markdown",
        metavar="FILE",
        default=None,
        help="write the 'change points in history' section of the verdict to FILE",
    )
    return parser


def _fraction(text: str) -> float:
    """A number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def _add_hunt_arguments(parser: argparse.ArgumentParser) -> None:
    """-k, --rounds, --threshold, --warmup and --steps: what compare and bisect share."""
    parser.add_argument(
        "-k",
        dest="expr",
        required=True,
        metavar="EXPR",
        help="cases by id, as pytest -k: cpu-small-ckpt, 'cpu-small and not bf16'",
    )
    parser.add_argument("--rounds", type=_positive, default=10, help="fresh-process rounds per revision (default 10)")
    parser.add_argument(
        "--threshold",
        type=_fraction,
        default=0.05,
        help="smallest tokens/s change called slower/faster (default 0.05; it must also be significant)",
    )
    parser.add_argument("--warmup", type=_positive, default=3, help="warm-up steps per round (default 3)")
    parser.add_argument("--steps", type=_positive, default=10, help="timed steps per round (default 10)")


# -- --set FIELD=VALUE ---------------------------------------------------------------------------------------------

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _types_of(hint: object) -> tuple:
    """The types an annotation allows: ``X | None`` -> (X, NoneType); any other -> (hint,)."""
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def _group(hint: object) -> type | None:
    """The nested config (a dataclass) a field holds, None-able or not (Recipe.parallel, Parallel.ddp); None for a
    plain value."""
    return next((o for o in _types_of(hint) if dataclasses.is_dataclass(o)), None)


def _names(cls: type, prefix: str = "") -> list[str]:
    """Every FIELD --set takes under ``cls``: its fields, and the nested configs' fields by their dotted names."""
    names = []
    for name, hint in typing.get_type_hints(cls).items():
        names.append(prefix + name)
        if (group := _group(hint)) is not None:
            names += _names(group, f"{prefix}{name}.")
    return names


def _convert(field: str, text: str, hint: object) -> object:
    """``text`` as a value of the annotated type ``hint`` (bool, int, float, a Literal of names, or None-able; a
    None-able nested config is switched on with its defaults by true, off by false or None)."""
    options = _types_of(hint)
    group = _group(hint)
    if group is not None and type(None) not in options:
        names = ", ".join(f"{field}.{f.name}" for f in dataclasses.fields(group))
        raise UsageError(f"--set {field}={text}: {field} is a group of fields; set {names}")
    if type(None) in options and text.lower() in ("none", "null"):
        return None
    for option in options:
        if option is bool or option is group:
            if text.lower() in _TRUE + _FALSE:
                on = text.lower() in _TRUE
                return on if option is bool else option() if on else None
        elif option in (int, float):
            try:
                return option(text)
            except ValueError:
                pass
        elif typing.get_origin(option) is typing.Literal or option is str:
            return text  # the Recipe checks the name
    kinds = " or ".join(
        "true/false" if o is bool or o is group else "None" if o is type(None) else getattr(o, "__name__", "a name")
        for o in options
    )
    raise UsageError(f"--set {field}={text}: expected {kinds}")


def _replaced(config: object, cls: type, changes: dict[str, object]) -> object:
    """``config`` (None: ``cls`` with its defaults) with ``changes`` applied: a value per field, or for a nested
    config a dict of its own changes."""
    base = config if config is not None else cls()
    hints = typing.get_type_hints(cls)
    return dataclasses.replace(
        base,
        **{
            name: _replaced(getattr(base, name), _group(hints[name]), change) if isinstance(change, dict) else change
            for name, change in changes.items()
        },
    )


def _not_a_field(field: str) -> UsageError:
    close = difflib.get_close_matches(field, _names(Recipe), n=1)
    return UsageError(f"--set {field}: not a Recipe field" + (f"; did you mean {close[0]!r}?" if close else ""))


def apply_assignments(recipe: Recipe, assignments: Sequence[str]) -> Recipe:
    """``recipe`` with each FIELD=VALUE applied, a nested config's field by its dotted name
    (``parallel.fsdp2.reshard_after_forward=false``); the Recipe validates the result (ValueError naming the
    field)."""
    changes: dict[str, object] = {}  # field -> value; nested config -> {its field -> value, ...}
    for item in assignments:
        field, sep, text = item.partition("=")
        field = field.strip()
        if not sep:
            raise UsageError(f"--set {item}: expected FIELD=VALUE")
        *path, last = field.split(".")
        cls, node = Recipe, changes
        for name in path:  # down to the nested config that holds ``last``
            group = _group(typing.get_type_hints(cls).get(name))
            if group is None:
                raise _not_a_field(field)
            if not isinstance(node.get(name, {}), dict):  # switched on or off earlier: go on from its fields
                value = node[name] if node[name] is not None else group()
                node[name] = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            cls, node = group, node.setdefault(name, {})
        hints = typing.get_type_hints(cls)
        if last not in hints:
            raise _not_a_field(field)
        node[last] = _convert(field, text.strip(), hints[last])
    return _replaced(recipe, Recipe, changes) if changes else recipe


def _case(args: argparse.Namespace) -> tuple[GPTConfig, Recipe, str]:
    """The model, the recipe with --set applied, and a label saying what ran."""
    cfg, recipe = get_model(args.model), get_recipe(args.recipe)
    recipe = apply_assignments(recipe, args.assignments)
    label = f"{args.model} / {args.recipe}" + "".join(f" --set {a}" for a in args.assignments)
    return cfg, recipe, label


# -- commands ------------------------------------------------------------------------------------------------------


def cmd_list(_: argparse.Namespace) -> int:
    from tabulate import tabulate

    print(tabulate([(name, MODEL_NOTES[name]) for name in MODELS], headers=["model", "what"]))
    print()
    print(tabulate([(name, RECIPE_NOTES[name]) for name in RECIPES], headers=["recipe", "what"]))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from gptcore.measure.convergence import train_and_evaluate
    from gptcore.measure.runner import out_of_memory_in
    from gptcore.measure.timing import process_peak_memory
    from gptcore.training.trainer import Trainer, resolve_device

    cfg, recipe, label = _case(args)
    if args.batch is not None:
        cfg = dataclasses.replace(cfg, batch_size=args.batch)
    device = resolve_device(args.device)
    trainer = Trainer(cfg, recipe, device)
    device, world, main = trainer.device, trainer.rank.world_size, trainer.rank.is_main  # under torchrun: rank 0 prints
    start, first = time.perf_counter(), None
    bar = tqdm(total=args.steps, unit="step", file=sys.stderr, dynamic_ncols=True, disable=not main)

    def on_log(step: int, loss: float) -> None:
        nonlocal first
        first = loss if first is None else first
        tok_s = step * trainer.tokens_per_step / (time.perf_counter() - start)
        peak, kind = process_peak_memory(device)
        bar.set_postfix_str(f"loss {loss:.4f} | {tok_s:,.0f} tok/s | peak {kind} {format_bytes(peak)}")
        bar.update(step - bar.n)

    def on_eval(step: int, val: float, train: float | None) -> None:
        nonlocal first
        first = train if first is None else first
        bar.write(
            f"step {step:>6,}: val loss {val:.4f}"
            + (f" | train loss {train:.4f} (mean since the last evaluation)" if train is not None else "")
        )
        if train is not None:
            on_log(step, train)

    val = None
    try:
        if args.eval_every:  # training is timed apart from the evaluations
            schedule = Schedule(steps=args.steps, eval_every=args.eval_every, eval_batches=args.eval_batches)
            run = train_and_evaluate(trainer, schedule, on_eval)
            losses, val, seconds = [x for x in run.train_loss if x is not None], run.final_val_loss, run.seconds[-1]
        else:
            losses = trainer.run(args.steps, log_every=args.log_every, on_log=on_log)
    except Exception as err:  # only an OOM (also one raised while compiling) is handled
        if out_of_memory_in(err) is None:
            raise
        bar.close()
        peak, kind = process_peak_memory(device)
        print(
            f"gptcore: error: out of memory on {device} after step {trainer.step_count} (peak {kind} "
            f"{format_bytes(peak)})",
            file=sys.stderr,
        )
        return 1
    bar.close()
    if val is None:
        seconds = time.perf_counter() - start
    peak, kind = process_peak_memory(device)
    timing = f"{1000 * seconds / args.steps:.1f} ms/step, {args.steps * trainer.tokens_per_step / seconds:,.0f} tok/s"
    if recipe.compile:
        timing += ", compile included"
    if not main:
        return 0
    if recipe.parallel.mode != "none":
        device = f"{world} ranks x {device} ({recipe.parallel.mode}, world size {world}; peak of rank 0)"
    if val is None:
        what = f"loss {first:.4f} at step 1 -> {losses[-1]:.4f} at step {args.steps}"
    else:
        what = (
            f"train loss {first:.4f} over the first {args.eval_every} steps -> {losses[-1]:.4f} over the last, "
            f"validation loss {val:.4f} at step {args.steps} (evaluations not timed)"
        )
    print(
        f"{label} on {device}: {args.steps} steps in {seconds:.1f} s ({timing}), {what}, peak {kind} "
        f"{format_bytes(peak)}"
    )
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    """Print the breakdown, the phase of the peak and the states per parameter."""
    from gptcore.memory import estimate, resolve, simulate
    from gptcore.units import common_unit, in_unit

    cfg, recipe, label = _case(args)
    if args.checkpoint:
        recipe = dataclasses.replace(recipe, checkpoint=True)
        label += " + checkpoint"
    question = resolve(cfg, recipe, batch=args.batch, seq=args.seq, device=args.device)
    est = estimate(question)
    sim = simulate(question) if args.simulate else None
    cfg, recipe = question.cfg, question.recipe
    batch, micro = recipe.batch_size(cfg), recipe.micro_batch(cfg)
    batch_text = f"batch {batch}" + (f" ({recipe.grad_accum_steps} x {micro})" if micro != batch else "")
    print(f"{label} on {args.device}: {est.num_params / 1e6:,.1f}M parameters, {batch_text}, seq {cfg.block_size}")
    print(est.table(sim))
    states, n = est.states, est.num_params
    copies = states.get("weight copies", 0)
    copies_text = f" (+ {copies / n:.1f} in autocast's weight copies)" if copies else ""
    saved = est.at_forward_end
    unit = common_unit([saved.get("activations", 0), saved.get("logits and loss", 0)])
    print(
        f"states: {est.bytes_per_param:.1f} bytes/parameter = parameters {states['parameters'] / n:.0f} + "
        f"gradients {states['gradients'] / n:.0f} + optimizer state {states['optimizer state'] / n:.0f}"
        f"{copies_text}; saved by the forward: activations {in_unit(saved.get('activations', 0), unit):,.2f} "
        f"{unit}, logits and loss {in_unit(saved.get('logits and loss', 0), unit):,.2f} {unit}"
    )
    for note in est.notes:
        print(f"note: {note}")
    if sim:
        print(f"note: simulation: {sim.method}" + "".join(f"; {n}" for n in sim.notes if n not in est.notes))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from gptcore.report.tables import load_run, plot, render

    for flag, value in (("--plot", args.plot), ("--html", args.html)):
        if value is not None:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise UsageError(
                    f"{flag} needs matplotlib, which is not installed: pip install 'gptcore-bench[plot]'"
                ) from None
    records = load_run(args.run)
    print(render(records))
    if args.plot is not None:
        for path in plot(records, args.plot):
            print(f"wrote {path}")
    if args.html is not None:
        from gptcore.report.html import write_html

        print(f"wrote {write_html(args.run, args.html, baselines_dir=args.baselines, history=args.history)}")
    return 0


def _options(args: argparse.Namespace):  # (gptcore.hunt.compare.Options, imported here)
    from gptcore.hunt.compare import Options, local_device

    return Options(warmup=args.warmup, steps=args.steps, device=local_device())


def _interval(speed) -> str:  # (gptcore.hunt.compare.Speed)
    if speed.low is None:
        return "95% CI n/a: too few rounds"
    return f"95% CI {speed.low:.3f}-{speed.high:.3f}"


def _exact_text(check) -> str:  # (gptcore.gate.verdicts.Check: B measured against A)
    a, b = check.baseline, check.measured
    if a is None or b is None:
        return f"{check.metric} n/a"
    if check.metric == "loss":
        return f"loss {a:.7f} -> {b:.7f} {check.status}"
    change = f" ({check.delta:+.2%}, {b - a:+,} B)" if check.delta else ""
    return f"peak memory {format_bytes(a)} -> {format_bytes(b)}{change} {check.status}"


def cmd_compare(args: argparse.Namespace) -> int:
    """Interleaved rounds of BASE and HEAD per case; exit 1 when a case is slower or its memory/loss fails."""
    import json

    from gptcore.gate.rules import BUSY_SHARE
    from gptcore.hunt.compare import compare, to_json

    def progress(result, done: int, total: int) -> None:  # (gptcore.hunt.compare.CaseResult)
        a, b = result.tokens("a"), result.tokens("b")
        ratio = sorted(b)[len(b) // 2] / sorted(a)[len(a) // 2]
        print(
            f"{result.case}: round {done}/{total}: A {a[-1]:,.0f} B {b[-1]:,.0f} tok/s, running B/A {ratio:.3f}",
            file=sys.stderr,
            flush=True,
        )

    start = time.perf_counter()
    try:
        a, b, results = compare(
            args.base,
            args.head,
            args.expr,
            rounds=args.rounds,
            threshold=args.threshold,
            options=_options(args),
            progress=progress,
            python_a=args.python_a,
            python_b=args.python_b,
        )
    except KeyboardInterrupt:
        print("gptcore: interrupted (temporary worktrees removed)", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - start

    def side(rev) -> str:  # (gptcore.hunt.compare.Revision)
        where = f"{rev.label}" + (f" ({rev.sha[:10]})" if rev.sha else "")
        return where + (f", torch {rev.torch} ({rev.python})" if args.python_a or args.python_b else "")

    print(
        f"A = {side(a)}, B = {side(b)}; {args.rounds} rounds of {args.steps} steps after {args.warmup} warm-up, "
        f"{seconds:.0f} s"
    )
    for r in results:
        if r.error:
            print(f"{r.case}: error: {r.error}")
            continue
        s = r.speed
        work = "work n/a" if r.work is None else "work =" if not r.work else "work: " + ", ".join(r.work)
        print(
            f"{r.case}: A {s.median_a:,.0f} tok/s, B {s.median_b:,.0f} tok/s, B/A {s.ratio:.3f} ({_interval(s)}, "
            f"p {s.p:.2g}) {s.verdict}; {_exact_text(r.memory)}; {_exact_text(r.loss)}; {work}"
        )
        shares = [[x["cpu_share"] for x in rounds if x.get("cpu_share")] for rounds in (r.rounds_a, r.rounds_b)]
        if all(shares):
            share_a, share_b = (statistics.median_high(x) for x in shares)
            if min(share_a, share_b) < BUSY_SHARE:
                print(
                    f"  note: busy machine: median CPU share A {share_a:.2f}, B {share_b:.2f} (below "
                    f"~{BUSY_SHARE} other processes took the cores; tokens/s says little)"
                )
    if args.json:
        data = to_json(
            a,
            b,
            results,
            rounds=args.rounds,
            threshold=args.threshold,
            warmup=args.warmup,
            steps=args.steps,
            seconds=seconds,
        )
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    return 1 if any(r.failed for r in results) else 0


def cmd_bisect(args: argparse.Namespace) -> int:
    """The first commit between GOOD and BAD that is worse than GOOD on --metric."""
    from gptcore.hunt.bisection import bisect

    try:
        result = bisect(
            args.good,
            args.bad,
            args.expr,
            metric=args.metric,
            rounds=args.rounds,
            threshold=args.threshold,
            options=_options(args),
            progress=lambda line: print(f"gptcore bisect: {line}", file=sys.stderr, flush=True),
        )
    except KeyboardInterrupt:
        print("gptcore: interrupted (temporary worktrees removed)", file=sys.stderr)
        return 130
    if result.first_bad is None:
        print(result.subject)
        return 1
    print(f"first bad commit: {result.first_bad} {result.subject}")
    for case, figures in result.figures.items():
        if args.metric == "tokens_per_s":
            print(
                f"  {case}: {figures['median_b']:,.0f} tok/s vs GOOD's {figures['median_a']:,.0f} "
                f"(B/A {figures['ratio']:.3f}, {figures['verdict']})"
            )
        else:
            from gptcore.gate.verdicts import Check

            print(f"  {case}: {_exact_text(Check(**figures))} (GOOD -> first bad)")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """Change points and creeping stretches in the saved runs; exit 1 when one is a regression or a creep, 2 when
    nothing can be analysed."""
    import json
    from pathlib import Path

    from gptcore.hunt import history

    if args.storage is None:
        from gptcore.identity import session_slug

        args.storage = f".benchmarks/{session_slug()}"
    found = history.analyse(args.storage, args.expr)
    for line in found.skipped:
        print(f"gptcore history: {line}", file=sys.stderr)
    if found.analysed == 0:
        if found.runs == 0:
            why = "every saved run was left out (see above)"
        elif found.series == 0:
            why = f"no case matching {args.expr!r}" if args.expr else "no case with a figure in the saved runs"
        else:
            why = "every series has too few points (see above)"
        raise UsageError(f"{args.storage}: nothing to analyse: {why}")
    print(
        f"{found.runs} saved run(s) of {len(found.commits)} commit(s), {found.analysed} series, "
        f"{len(found.findings)} change point(s) or creep(s) in {args.storage}"
    )
    for finding in found.findings:
        print(finding.line())
        if finding.command():
            print(f"  hunt it: {finding.command()}")
    for flag, path, text in (
        ("--json", args.json, lambda: json.dumps(found.to_json(), indent=1) + "\n"),
        ("--markdown", args.markdown, lambda: history.markdown(found)),
    ):
        if path:
            try:
                Path(path).write_text(text())
            except OSError as err:
                raise UsageError(f"{flag} {path}: {err.strerror or err}") from None
    return 1 if any(f.status in ("regression", "creeping") for f in found.findings) else 0


COMMANDS = {
    "list": cmd_list,
    "train": cmd_train,
    "estimate": cmd_estimate,
    "report": cmd_report,
    "compare": cmd_compare,
    "bisect": cmd_bisect,
    "history": cmd_history,
}


def _one_line_warning(message, category, filename, lineno, line=None) -> str:  # (warnings' API)
    return f"gptcore: warning: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code."""
    warnings.formatwarning = _one_line_warning  # a deprecated recipe name: one line, not a source excerpt
    try:
        args = _parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except (UsageError, ValueError) as err:  # UnsupportedRecipe is a ValueError
        print(f"gptcore: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m gptcore list | head`
        sys.stderr.close()
        return 0
