"""Tables (tabulate) and optional PNG charts from a pytest-benchmark JSON (``--benchmark-json``).

For each benchmark group (one study) and metric (peak memory, tokens/s, loss): the shape x recipe table of the
char-shape study, the % change against the same shape's default recipe (the study's first: fp32, ckpt-fp32), and
the deviation from additivity. With m[s, r] the metric for shape s and recipe r, b the base shape (char, cpu-small)
and d the default recipe, the additive prediction is m[s, d] + (m[b, r] - m[b, d]) (the shape's change plus the recipe's
change, each measured alone); the deviation is what the combination adds beyond that, as a percentage of the
base default:

    dev[s, r] = ((m[s, r] - m[s, d]) - (m[b, r] - m[b, d])) / m[b, d] x 100

0 means the shape change and the optimization combine additively; by construction dev is 0 on the base row and
in the default column.

``--html`` (gptcore.report.html) builds one self-contained page from the same records: each case against its
baseline, the estimate's memory breakdown, the ladder as a waterfall, and the history of saved runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

from gptcore.gate.rules import is_number, non_finite
from gptcore.measure.clocks import BUSY_SHARE
from gptcore.units import in_unit

#: metric key -> (title, how to read it from a benchmark's extra_info)
METRICS: dict[str, tuple[str, str]] = {
    "memory": ("peak allocated memory, MiB", "peak_allocated_bytes"),
    "reserved": ("peak reserved memory, MiB", "peak_reserved_bytes"),
    "speed": ("tokens/s (median over rounds)", "tokens_per_s"),
    "busy": ("GPU busy time per step (kernels on the device timeline), ms", "gpu_busy_seconds"),
    "loss": ("loss at the last timed step, nats", "loss"),
}
"""A metric no case has (GPU busy time on CPU) gets no table and no chart."""
#: metric key -> its axis label (with the unit) in plots
AXIS_LABELS: dict[str, str] = {
    "memory": "peak allocated memory (MiB)",
    "reserved": "peak reserved memory (MiB)",
    "speed": "tokens/s (median over rounds)",
    "busy": "GPU busy time per step (ms)",
    "loss": "loss (nats)",
}


@dataclass(frozen=True)
class Record:
    """One benchmark case of a run."""

    group: str
    name: str
    model: str
    recipe: str
    values: dict[str, float | None]
    info: dict = field(default_factory=dict, compare=False)
    """The benchmark's whole extra_info (tokens_per_s_iqr, cpu_share, device, work, ...)."""

    @property
    def speed_iqr(self) -> float | None:
        """The IQR of tokens/s over the timed rounds."""
        return number(self.info.get("tokens_per_s_iqr"))

    @property
    def not_finite(self) -> list[str]:
        """'loss is NaN (the run diverged)', 'tokens/s is +inf (the timing broke)': what is not a number here."""
        said = []
        for metric, label, why in (("loss", "loss", "the run diverged"), ("speed", "tokens/s", "the timing broke")):
            if bad := non_finite(self.values.get(metric)):
                said.append(f"{label} is {bad} ({why})")
        return said

    @property
    def busy(self) -> bool:
        """tokens/s recorded on a CPU while other processes took it (see ``recorded_busy``)."""
        return recorded_busy(self.info)


def recorded_busy(info: dict) -> bool:
    """Whether a case's extra_info says its tokens/s was recorded on a CPU while other processes took it
    (cpu_share below BUSY_SHARE)."""
    share = number(info.get("cpu_share"))
    return str(info.get("device", "cpu")).startswith("cpu") and share is not None and share < BUSY_SHARE


def load_run(path: str | Path) -> list[Record]:
    """gptcore cases of a --benchmark-json file; ValueError (one line, naming the file) when it is unusable."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read: {err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON: {err.msg} at line {err.lineno}") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise ValueError(
            f"{path}: not a pytest-benchmark JSON (no 'benchmarks' list); write one with "
            f"pytest bench --benchmark-json=FILE"
        )
    records = []
    for bench in data["benchmarks"]:
        info = bench.get("extra_info") if isinstance(bench, dict) else None
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("model"), str)
            or not isinstance(info.get("recipe"), str)
        ):
            continue  # not a gptcore case (its model and recipe are names)
        values = {key: number(info.get(field)) for key, (_, field) in METRICS.items()}
        for key in ("memory", "reserved"):  # bytes -> the MiB of METRICS' titles
            if values[key] is not None:
                values[key] = in_unit(values[key], "MiB")
        if values["busy"] is not None:  # seconds -> the ms of its title
            values["busy"] *= 1e3
        records.append(
            Record(
                str(bench.get("group") or ""), str(bench.get("name", "")), info["model"], info["recipe"], values, info
            )
        )
    if not records:
        raise ValueError(f"{path}: no gptcore benchmark cases (benchmarks with extra_info model/recipe)")
    return records


def number(value: object) -> float | None:
    """A JSON value as a float, None unless it is a number (booleans are not)."""
    return float(value) if is_number(value) else None


def _ordered(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))


def base_shape(shapes: Sequence[str]) -> str:
    """The shape the others vary: one whose name prefixes all others ('char' for 'char-ctx2'), else the first."""
    for s in shapes:
        if all(o == s or o.startswith(s + "-") for o in shapes):
            return s
    return shapes[0]


Pivot = dict[str, dict[str, float | None]]


def pivot(records: Sequence[Record], metric: str) -> tuple[list[str], list[str], Pivot]:
    """(shapes, recipes, table[shape][recipe]) in the run's order."""
    shapes, recipes = _ordered([r.model for r in records]), _ordered([r.recipe for r in records])
    table: Pivot = {s: dict.fromkeys(recipes) for s in shapes}
    for r in records:
        table[r.model][r.recipe] = r.values[metric]
    return shapes, recipes, table


def pct_change(table: Pivot, default: str) -> Pivot:
    """100 x (m[s, r] / m[s, default] - 1) per shape; None where either is missing."""
    out: Pivot = {}
    for s, row in table.items():
        d = row.get(default)
        out[s] = {r: (100.0 * (v / d - 1.0) if v is not None and d else None) for r, v in row.items()}
    return out


def additivity(table: Pivot, base: str, default: str) -> Pivot:
    """Deviation from additivity in % of m[base, default] (module docstring); None where a term is missing."""
    b = table.get(base, {})
    bd = b.get(default)
    out: Pivot = {}
    for s, row in table.items():
        sd = row.get(default)
        out[s] = {}
        for r, v in row.items():
            terms = (v, sd, b.get(r), bd)
            out[s][r] = 100.0 * ((v - sd) - (b[r] - bd)) / bd if all(t is not None for t in terms) and bd else None
    return out


def _fmt(table: Pivot, shapes: list[str], recipes: list[str], fmt: str, unit: str) -> str:
    rows = [[s] + [("—" if table[s][r] is None else format(table[s][r], fmt)) for r in recipes] for s in shapes]
    return tabulate(rows, headers=[f"shape \\ recipe ({unit})"] + recipes, disable_numparse=True, stralign="right")


_VALUE_FMT = {"memory": ",.2f", "reserved": ",.2f", "speed": ",.0f", "busy": ",.2f", "loss": ".4f"}
_UNIT = {"memory": "MiB", "reserved": "MiB", "speed": "tok/s", "busy": "ms", "loss": "nats"}


def render(records: Sequence[Record]) -> str:
    """Every group's tables as text."""
    out = []
    for group in _ordered([r.group for r in records]):
        recs = [r for r in records if r.group == group]
        out.append(f"=== {group or 'benchmarks'} ===")
        for metric, (title, _) in METRICS.items():
            shapes, recipes, table = pivot(recs, metric)
            if all(v is None for row in table.values() for v in row.values()):
                continue
            out += [f"\n{title}", _fmt(table, shapes, recipes, _VALUE_FMT[metric], _UNIT[metric])]
            default = recipes[0]  # a study lists its default recipe first
            if len(recipes) > 1:
                out += [
                    f"\n{title}: % change vs {default} of the same shape",
                    _fmt(pct_change(table, default), shapes, recipes, "+.1f", "%"),
                ]
                if len(shapes) > 1:
                    base = base_shape(shapes)
                    out += [
                        f"\n{title}: deviation from additivity, % of {base}/{default}",
                        _fmt(additivity(table, base, default), shapes, recipes, "+.1f", "%"),
                    ]
        if kinds := kernel_kinds(recs):
            out += ["\nGPU kernel time per step by kind of kernel, ms (its share of the step's kernel time)", kinds]
        out += [f"\nnot finite: {r.name}: {'; '.join(r.not_finite)}" for r in recs if r.not_finite]
        busy = [r.name for r in recs if r.busy]
        if busy:
            out.append(
                f"\nbusy: tokens/s of {', '.join(busy)} recorded with cpu_share < {BUSY_SHARE} (the machine "
                "was shared); compare them with care"
            )
        out.append("")
    return "\n".join(out)


def kernel_kinds(records: Sequence[Record]) -> str | None:
    """The traced step's kernel time by kind of kernel (gptcore.measure.trace.KINDS), a row a case; None where no
    case has it (a CPU run, a run from before it was kept)."""
    split = {r.name: r.info.get("gpu_kernel_seconds") for r in records}
    split = {name: kinds for name, kinds in split.items() if isinstance(kinds, dict) and kinds}
    if not split:
        return None
    totals: dict[str, float] = {}
    for kinds in split.values():
        for kind, seconds in kinds.items():
            totals[kind] = totals.get(kind, 0.0) + seconds
    # the kinds that take the most time first (to the nanosecond: a tie is one, read by name)
    columns = sorted(totals, key=lambda kind: (-round(totals[kind] * 1e9), kind))
    rows = []
    for name, kinds in split.items():
        total = sum(kinds.values())
        rows.append(
            [name]
            + [f"{kinds[k] * 1e3:,.2f} ({kinds[k] / total:.0%})" if k in kinds and total else "—" for k in columns]
        )
    return tabulate(rows, headers=["case (ms)", *columns], disable_numparse=True, stralign="right")


def plot(records: Sequence[Record], outdir: str | Path) -> list[Path]:
    """Grouped bar charts (shape x recipe) per group and metric, and an additivity heatmap; PNG files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for group in _ordered([r.group for r in records]):
        recs = [r for r in records if r.group == group]
        stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in (group or "benchmarks"))
        for metric, (title, _) in METRICS.items():
            shapes, recipes, table = pivot(recs, metric)
            if all(v is None for row in table.values() for v in row.values()):
                continue
            fig, ax = plt.subplots(figsize=(max(6.0, 2.0 + 0.5 * len(recipes) * len(shapes)), 4.5))
            width = 0.8 / len(shapes)
            iqr = {(r.model, r.recipe): r.speed_iqr for r in recs} if metric == "speed" else {}
            for i, s in enumerate(shapes):
                xs = [j + i * width for j in range(len(recipes))]
                err = [iqr.get((s, r)) or 0.0 for r in recipes] if iqr else None
                ax.bar(
                    xs,
                    [table[s][r] if table[s][r] is not None else math.nan for r in recipes],
                    width,
                    label=s,
                    yerr=[[e / 2 for e in err]] * 2 if err else None,
                    capsize=2,
                )
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(recipes))], recipes, rotation=30, ha="right")
            ax.set_xlabel("recipe")
            ax.set_ylabel(AXIS_LABELS[metric])
            ax.set_title(f"{group}: {title}" + ("\nerror bars: IQR over rounds" if iqr else ""), fontsize=10)
            ax.legend(fontsize="small", title="shape")
            fig.tight_layout()
            written.append(outdir / f"{stem}-{metric}.png")
            fig.savefig(written[-1], dpi=120)
            plt.close(fig)
            default = recipes[0]
            if len(recipes) > 1 and len(shapes) > 1:
                dev = additivity(table, base_shape(shapes), default)
                grid = [[dev[s][r] if dev[s][r] is not None else math.nan for r in recipes] for s in shapes]
                fig, ax = plt.subplots(figsize=(max(6.0, 3.0 + 1.1 * len(recipes)), 2.2 + 0.5 * len(shapes)))
                image = ax.imshow(grid, cmap="coolwarm", vmin=-max(1.0, _absmax(grid)), vmax=max(1.0, _absmax(grid)))
                for i, row in enumerate(grid):
                    for j, v in enumerate(row):
                        if not math.isnan(v):
                            ax.text(j, i, f"{v:+.1f}", ha="center", va="center", fontsize=8)
                ax.set_xticks(range(len(recipes)), recipes, rotation=30, ha="right")
                ax.set_yticks(range(len(shapes)), shapes)
                ax.set_xlabel("recipe")
                ax.set_ylabel("shape")
                ax.set_title(
                    f"{group}: {title}\ndeviation from additivity, % of {base_shape(shapes)}/{default}", fontsize=10
                )
                fig.colorbar(image, ax=ax, label=f"deviation, % of {base_shape(shapes)}/{default}")
                fig.tight_layout()
                written.append(outdir / f"{stem}-{metric}-additivity.png")
                fig.savefig(written[-1], dpi=120)
                plt.close(fig)
    return written


def _absmax(grid: list[list[float]]) -> float:
    values = [abs(v) for row in grid for v in row if not math.isnan(v)]
    return max(values, default=1.0)
