"""One self-contained HTML page that answers "what changed" for a pytest-benchmark JSON (``report --html``).

Per study: each case now against its baseline (tokens/s with IQR error bars, peak memory, each with the gate's
tolerance band; tokens/s marked "not gated" where the device's tolerance is None, as on CPU), the analytic
estimate's memory breakdown per case, the ladder as a waterfall of tokens/s, and with ``history`` the saved runs
of pytest-benchmark (``.benchmarks/<device>/<machine-id>/NNNN_*.json``) over commits. Plots are matplotlib PNGs
embedded as base64; no network, no external file. A tiny inline script builds the case index and writes each
image's naturalWidth into the DOM (a headless browser's DOM dump proves the page loaded and ran).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gptcore import identity, storage
from gptcore.gate import baselines, expectations
from gptcore.gate.baselines import BaselineFile
from gptcore.gate.rules import Status, delta_text, percent
from gptcore.gate.schema import Entry, Tolerances
from gptcore.gate.verdicts import busy_check
from gptcore.hunt.history import analyse as analyse_history
from gptcore.measure.clocks import BUSY_SHARE
from gptcore.report.figures import (
    SavedRun,
    breakdown_figure,
    case_checks,
    convergence_figure,
    history_figure,
    ladders,
    now_vs_baseline_figure,
    waterfall_figure,
)
from gptcore.report.tables import Record, load_run, number, recorded_busy
from gptcore.units import in_unit

LADDER_RUNG = re.compile(r"^ladder-(\d+)$")
COLORS = {"now": "#1f77b4", "fail": "#d62728", "better": "#2ca02c", "base": "#9e9e9e", "band": "#2ca02c"}


def device_slug(data: dict, records: Sequence[Record]) -> str:
    """The run's device slug: machine_info's device_slug, else the GPU's name, else 'cpu'."""
    info = data.get("machine_info") if isinstance(data.get("machine_info"), dict) else {}
    if isinstance(info.get("device_slug"), str):
        return info["device_slug"]
    gpu = info.get("gpu")
    if any(str(r.info.get("device", "")).startswith("cuda") for r in records) and isinstance(gpu, dict):
        return identity.slugify(str(gpu.get("name", "cuda")))
    return "cpu"


def load_history(storage_dir: str | Path) -> tuple[list[SavedRun], list[str]]:
    """The saved runs under a pytest-benchmark storage folder as ``history`` reads them (gptcore.storage: the
    committed runs of one device, oldest commit first), each with its cases' figures, and one line per run left
    out; ValueError when the folder does not exist or holds no run."""
    saved = storage.read(storage_dir)
    runs = []
    for run in saved.runs:
        cases = {}
        for bench in run.benchmarks:
            info = bench.get("extra_info") or {}
            cases[bench.get("name", "")] = (
                number(info.get("tokens_per_s")),
                number(info.get("tokens_per_s_iqr")),
                number(info.get("peak_allocated_bytes")),
                recorded_busy(info),
            )
        runs.append(SavedRun(run.number, run.commit, run.committed.isoformat(), cases))
    return runs, saved.skipped


# -- the page ------------------------------------------------------------------------------------------------------

STYLE = """body{font:14px system-ui,sans-serif;margin:1.5em;max-width:1400px}
table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child{text-align:left}
.FAIL{background:#f8d0d0}.better{background:#d4f0d4}.busy{color:#b00;font-weight:bold}.not-gated{color:#777}
img{max-width:100%;border:1px solid #eee}figcaption{font-size:12px;color:#555}#case-index ul{columns:3}"""

SCRIPT = """window.addEventListener('load', function () {
  var nav = document.getElementById('case-index'), list = document.createElement('ul');
  document.querySelectorAll('tr[data-case]').forEach(function (row) {
    var item = document.createElement('li'), link = document.createElement('a');
    link.href = '#' + row.id; link.textContent = row.dataset.case;
    item.dataset.indexCase = row.dataset.case; item.appendChild(link); list.appendChild(item);
  });
  nav.appendChild(list); nav.dataset.cases = String(list.children.length);
  document.querySelectorAll('img[data-plot]').forEach(function (img) {
    img.dataset.naturalWidth = String(img.naturalWidth);
  });
  document.body.dataset.ready = 'yes';
});"""


def _figure(png: str, plot: str, caption: str) -> str:
    return (
        f'<figure><img data-plot="{html.escape(plot)}" alt="{html.escape(caption)}" '
        f'src="data:image/png;base64,{png}"><figcaption>{html.escape(caption)}</figcaption></figure>'
    )


def _case_rows(recs: Sequence[Record], base: BaselineFile | None, tol: Tolerances) -> str:
    rows = []
    shown = any(r.values["busy"] is not None for r in recs)  # GPU busy columns only where a case has the figure
    for r in recs:
        e = base.entries.get(r.name) if base else None
        speed, memory = case_checks(r, e, tol)
        s_status, m_status = speed.status, memory.status
        s_delta, m_delta = delta_text(speed.delta, s_status), delta_text(memory.delta, m_status)
        m_now = memory.measured
        busy = f'<span class="busy">busy (cpu_share {r.info["cpu_share"]:.2f})</span>' if r.busy else ""
        cells = [
            html.escape(r.name),
            f"{r.values['speed']:,.0f}" if r.values["speed"] is not None else "—",
            f"{r.speed_iqr:,.0f}" if r.speed_iqr is not None else "—",
            f"{e.tokens_per_s:,.0f}" if e and e.tokens_per_s is not None else "—",
            s_delta,
            s_status + (" (CPU: reported only)" if s_status == Status.NOT_GATED else ""),
            *(_busy_cells(r, e, tol) if shown else []),
            f"{in_unit(m_now, 'MiB'):,.2f}" if m_now is not None else "—",
            f"{in_unit(e.peak_allocated_bytes, 'MiB'):,.2f}" if e and e.peak_allocated_bytes else "—",
            m_delta,
            m_status,
            busy,
            html.escape("; ".join([*r.not_finite, str(r.info.get("verdict") or "—")])),
        ]
        classes = ["", "", "", "", "", s_status.replace(" ", "-")] + (
            ["", "", "", str(cells[9]).replace(" ", "-")] if shown else []
        )
        classes += ["", "", "", m_status, "", ""]
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", r.name)
        rows.append(
            f'<tr id="case-{slug}" data-case="{html.escape(r.name)}">'
            + "".join(f'<td class="{c}">{v}</td>' for c, v in zip(classes, cells))
            + "</tr>"
        )
    head = [
        "case",
        "tok/s",
        "IQR",
        "base tok/s",
        "Δ",
        "tok/s gate",
        *(["GPU busy ms", "base ms", "Δ", "busy gate"] if shown else []),
        "peak MiB",
        "base MiB",
        "Δ",
        "memory gate",
        "CPU",
        "verdict at run time",
    ]
    return "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>"


def _busy_cells(r: Record, e: Entry | None, tol: Tolerances) -> list[str]:
    """A case's GPU busy time per step (ms), its baseline's, the delta and the gate's status (checks.busy_check)."""
    now = r.values["busy"] / 1e3 if r.values["busy"] is not None else None
    before = e.gpu_busy_seconds if e else None
    check = busy_check(now, before, tol)
    status = check.status if check and e else Status.NO_BASELINE
    ms = [("—" if v is None else f"{v * 1e3:,.2f}") for v in (now, before)]
    return [*ms, delta_text(check.delta if check else None, status), status]


def _expectation_rows(records: Sequence[Record]) -> str:
    """'Does each optimization still pay': every expected effect judged on this run's cases, by the gate's rule
    (gptcore.gate.expectations), with the estimate's prediction beside the measurement."""
    session = expectations.Session()
    for r in records:
        session.record_info(r.info)
    if not session.outcomes:
        return "<p>No case of this run has its reference case beside it: no expected effect to judge.</p>"
    head = ["model", "expected effect", "why", "measured", "bound", "status"]
    rows = "".join(
        f'<tr data-expectation="{html.escape(o.model)} {html.escape(o.claim)}">'
        + "".join(f"<td>{html.escape(v)}</td>" for v in (o.model, o.claim, o.expectation.why, o.measured, o.expected))
        + f'<td class="{o.status.replace(" ", "-")}">{html.escape(o.status)}</td></tr>'
        for o in session.outcomes
    )
    return "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + rows + "</table>"


def build_html(run: str | Path, *, baselines_dir: str | Path = "baselines", history: str | Path | None = None) -> str:
    """The page for a --benchmark-json file; ValueError (one line) for an unusable run, baseline file or history."""
    records = load_run(run)
    data = json.loads(Path(run).read_text())
    slug = device_slug(data, records)
    base_path = Path(baselines_dir) / f"{slug}.json"
    base = baselines.load(base_path, expect_slug=slug)
    device_type = "cpu" if slug == "cpu" else "cuda"
    tol = base.tolerances if base else Tolerances.default_for(device_type)
    runs, left_out = load_history(history) if history is not None else ([], [])
    changes = analyse_history(history).findings if runs else []
    commit = data.get("commit_info") or {}
    body = [
        f"<h1>gptcore benchmark report: {html.escape(Path(run).name)}</h1>",
        f"<p>device <b>{html.escape(slug)}</b>, commit {html.escape(str(commit.get('id', '?'))[:12])}"
        f"{' (dirty)' if commit.get('dirty') else ''}, run at {html.escape(str(data.get('datetime', '?')))}; "
        f"baselines: {html.escape(str(base_path))}"
        + ("" if base else " (<b>no such file</b>: no baseline)")
        + f"; tolerances: memory +{percent(tol.memory)}, tokens/s "
        + ("<b>not gated</b> (reported only, as on CPU)" if tol.speed is None else f"−{percent(tol.speed)}")
        + "".join(
            f"; {html.escape(test)}'s own: " + ", ".join(f"{k} {v:g}" for k, v in own.items())
            for test, own in (base.tolerances_by_test.items() if base else ())
        )
        + "</p>",
        f"<p>A CPU tokens/s figure is flagged <span class=busy>busy</span> when the process had less than "
        f"{BUSY_SHARE:.0%} of the CPU while timed (a shared machine): compare it with care.</p>",
        '<nav id="case-index"><h2>cases</h2></nav>',
    ]
    if history is not None:
        body.append(
            f"<p>history: {len(runs)} saved run(s) in {html.escape(str(history))}; "
            f"{len(changes)} change point(s) or creep(s) (<code>python -m gptcore history</code>)"
            + (f"; left out, as <code>history</code> leaves them out: {len(left_out)}" if left_out else "")
            + "</p>"
        )
        if left_out:
            body.append("<ul class=left-out>" + "".join(f"<li>{html.escape(line)}</li>" for line in left_out) + "</ul>")
    body += [
        '<section id="expectations"><h2>does each optimization still pay</h2>',
        _expectation_rows(records),
        "</section>",
    ]
    for group in dict.fromkeys(r.group for r in records):
        recs = [r for r in records if r.group == group]
        body += [f"<section><h2>{html.escape(group or 'benchmarks')}</h2>", _case_rows(recs, base, tol)]
        png = convergence_figure(group, recs, base)
        if png:  # whole training runs: what they learned is the figure (no memory is measured there)
            body += [
                _figure(png, "convergence", f"{group}: validation loss over training, now vs baseline"),
                "</section>",
            ]
            continue
        caption = f"{group}: each case now (blue; red: FAIL) vs its baseline (grey), with the tolerance band"
        body.append(_figure(now_vs_baseline_figure(group, recs, base, tol), "compare", caption))
        png = breakdown_figure(group, recs)
        if png:
            body.append(_figure(png, "breakdown", f"{group}: the analytic estimate's memory at the peak, by category"))
        for model, rungs in ladders(recs).items():
            body.append(_figure(waterfall_figure(model, rungs, base), "ladder", f"{group}: ladder waterfall, {model}"))
        png = history_figure(group, recs, runs, changes) if runs else None
        if png:
            ours = [c for c in changes if c.case in {r.name for r in recs}]
            marked = [
                f"{c.case} {c.metric} {c.status} {c.before[:7]}..{c.after[:7]}"
                for c in ours
                if c.metric in ("tokens/s", "peak memory")
            ]
            other = [
                f"{c.case} {c.metric} {c.status} {c.before[:7]}..{c.after[:7]}"
                for c in ours
                if c.metric not in ("tokens/s", "peak memory")
            ]
            caption = (
                f"{group}: tokens/s and peak memory over the saved runs"
                + (f"; change points shaded: {'; '.join(marked)}" if marked else "")
                + (f"; not plotted: {'; '.join(other)}" if other else "")
            )
            body.append(_figure(png, "history", caption))
        body.append("</section>")
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>gptcore report</title>"
        f"<style>{STYLE}</style></head><body>{''.join(body)}<script>{SCRIPT}</script></body></html>"
    )


def write_html(run: str | Path, out: str | Path, **options: Any) -> Path:
    """Write ``build_html``'s page to ``out``; the path written."""
    out = Path(out)
    page = build_html(run, **options)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
