"""``merge``: the results logs of a run's shards (``--shard K/N``) as one run: the end table and the markdown verdict
a single run would give, the recorded entries merged into the baseline files, and the shards' pytest-benchmark JSON
saved as one run of the device (history); exit 1 when a shard failed a case, left no results or was cut short, or
the run could not be saved whole."""

from __future__ import annotations

import argparse
from pathlib import Path

from gptcore.cli.arguments import UsageError, check_output

NAME = "merge"
HELP = "the results logs of a run's shards (--shard K/N) as one run: one end table, one verdict, one baseline update"


def setup_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", metavar="LOG", nargs="+", help="each shard's results log (--results-log)")
    parser.add_argument(
        "--baselines-dir",
        metavar="DIR",
        default="baselines",
        help="the baseline files to judge against and to record the shards' recorded entries into (default baselines)",
    )
    parser.add_argument("--gate-markdown", metavar="FILE", default=None, help="write the verdict as markdown to FILE")
    parser.add_argument(
        "--benchmark-json",
        metavar="FILE",
        nargs="+",
        default=None,
        help="each shard's pytest-benchmark JSON (--benchmark-json): saved together as one run of the device",
    )
    parser.add_argument(
        "--benchmark-storage",
        metavar="DIR",
        default=".benchmarks",
        help="where the merged run is saved, under DIR/<device>/<machine id>, as --benchmark-autosave saves a run "
        "(default .benchmarks, the storage the gate reads)",
    )


def run(args: argparse.Namespace) -> int:
    from gptcore.gate import baselines
    from gptcore.gate.merge import MergeError, merge, save_run
    from gptcore.gate.schema import BaselineError
    from gptcore.gate.summary import end_lines, gate_markdown

    directory = Path(args.baselines_dir)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"--baselines-dir {directory}: not a folder")
    check_output("--gate-markdown", args.gate_markdown)  # before anything is recorded
    if args.benchmark_json:
        check_output("--benchmark-storage", args.benchmark_storage, folder=True)
        for path in map(Path, args.benchmark_json):  # read after the baselines are recorded: checked before
            if not path.is_file():
                raise UsageError(f"--benchmark-json {path}: {'not a file' if path.exists() else 'no such file'}")
    try:
        merged = merge(args.logs, args.baselines_dir)
    except (MergeError, BaselineError) as err:
        raise UsageError(str(err)) from None
    if not directory.is_dir() and not merged.recorded:  # a misspelt folder would turn the gate off without a word
        raise UsageError(f"--baselines-dir {directory}: no such folder (the shards recorded nothing to create it with)")
    gate = merged.gate
    notes = [f"FAIL: {line}" for line in merged.problems] + gate.summary_notes()
    if merged.recorded:
        path = Path(args.baselines_dir) / f"{merged.plan.slug}.json"
        recording = merged.plan.recording
        baselines.update(path, merged.plan.slug, merged.recorded, **recording, commit=merged.plan.commit)
        notes.append(f"baselines: recorded {len(merged.recorded)} case(s) from the shards into {path}")
    if args.benchmark_json:
        try:
            saved = save_run(args.benchmark_json, args.benchmark_storage, merged.plan)
        except MergeError as err:
            notes.append(f"FAIL: history: the merged run was not saved: {err}")
            merged.problems.append(str(err))
        else:
            notes.append(f"history: the {len(args.benchmark_json)} shards saved as one run, {saved}")
    print("\n".join(end_lines(gate, notes)))
    if args.gate_markdown:
        try:
            Path(args.gate_markdown).write_text(gate_markdown(gate, notes))
        except OSError as err:
            raise UsageError(f"--gate-markdown {args.gate_markdown}: {err.strerror or err}") from None
    return 1 if merged.failed else 0
