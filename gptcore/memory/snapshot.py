"""The peak of a CUDA allocator trace (``torch.cuda.memory._snapshot()["device_traces"]``, recorded with
``torch.cuda.memory._record_memory_history``) and what was live at it, by the line of code that allocated it.

Bytes follow the allocator's own events: an ``alloc`` adds its size and a ``free_completed`` takes it away, as
``torch.cuda.memory._memory_viz`` counts them; blocks allocated before the trace's window are not seen, so the
recording starts before the run it explains. An ``oom`` event is kept with what was live when it happened.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Site:
    """Where blocks live at the peak were allocated (a ``file:line function`` frame), how many and their bytes."""

    where: str
    blocks: int
    bytes: int


@dataclass
class TracePeak:
    """The highest allocated bytes of a trace, the event at which it was reached, and the sites live there."""

    peak_bytes: int = 0
    at_event: int = 0
    events: int = 0
    oom: str | None = None
    """'requested N B with M B free, L B allocated' for the first out-of-memory event, None when there was none."""
    sites: list[Site] = field(default_factory=list)
    """Largest first."""


def site_of(frames: list[dict], prefer: str = "gptcore") -> str:
    """The innermost frame whose file path contains ``prefer`` (the innermost frame if none does), as
    'file.py:line function'."""
    if not frames:
        return "(no stack recorded)"
    frame = next((f for f in frames if prefer in f.get("filename", "")), frames[0])
    filename = frame.get("filename", "?")
    # from the package down where the file is one of ours (gptcore/training/model.py), else its folder and name
    short = (
        "gptcore/" + filename.rsplit("gptcore/", 1)[1] if "gptcore/" in filename else "/".join(filename.split("/")[-2:])
    )
    return f"{short}:{frame.get('line', '?')} {frame.get('name', '?')}"


def peak_of_trace(trace: list[dict], top: int = 15, prefer: str = "gptcore") -> TracePeak:
    """The peak of allocated bytes over ``trace`` and the ``top`` allocation sites live at it."""
    allocated = peak = at = 0
    oom = None
    for i, event in enumerate(trace):
        action = event.get("action")
        if action == "alloc":
            allocated += event["size"]
            if allocated > peak:
                peak, at = allocated, i
        elif action == "free_completed":
            allocated -= event["size"]
        elif action == "oom" and oom is None:
            oom = (
                f"requested {event.get('size', 0):,} B with {event.get('device_free', 0):,} B free, "
                f"{allocated:,} B allocated"
            )
    live: dict[int, dict] = {}
    for event in trace[: at + 1]:
        if event.get("action") == "alloc":
            live[event["addr"]] = event
        elif event.get("action") == "free_completed":
            live.pop(event["addr"], None)
    by_site: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for event in live.values():
        entry = by_site[site_of(event.get("frames", []), prefer)]
        entry[0] += 1
        entry[1] += event["size"]
    sites = sorted((Site(w, n, b) for w, (n, b) in by_site.items()), key=lambda s: -s.bytes)[:top]
    return TracePeak(peak_bytes=peak, at_event=at, events=len(trace), oom=oom, sites=sites)
