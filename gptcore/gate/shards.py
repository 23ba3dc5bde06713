"""The benchmarks split into N shards of about equal duration, for N runners that each run one (``--shard K/N``).

As pytest-split does, from each case's known duration; here the duration the gate already plans with
(``gptcore.gate.plan.estimate``: the case's last time in a results log, else its baseline entry's ``seconds``, else
its FLOPs at an assumed throughput), so that a case never run before still weighs what it costs. The cases of one
torchrun job (the distributed tier launches every recipe of a model, world size and device at once) are one unit.
Units go, longest first, each to the shard with the least planned time so far (ties: the lower shard; equal units:
by name): the same inputs give the same split on every runner, and no shard exceeds the even share by more than the
longest unit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

SHARD = re.compile(r"^(\d+)/(\d+)$")


def parse(text: str) -> tuple[int, int]:
    """'K/N' (1 <= K <= N) as (K, N); ValueError with one line otherwise."""
    match = SHARD.match(text.strip())
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise ValueError(f"--shard {text}: expected K/N with 1 <= K <= N, e.g. 2/4")
    return int(match.group(1)), int(match.group(2))


def split(seconds: Mapping[str, float], unit_of: Mapping[str, str], n: int) -> list[list[str]]:
    """The cases (ids, each shard's in the order given) of ``n`` shards: ``seconds`` is each case's planned time,
    ``unit_of`` the unit a case must share a shard with (a case missing from it is a unit of its own)."""
    units: dict[str, list[str]] = {}
    for case in seconds:
        units.setdefault(unit_of.get(case, case), []).append(case)
    load = [0.0] * n
    shard_of: dict[str, int] = {}
    for _, cases in sorted(units.items(), key=lambda u: (-sum(seconds[c] for c in u[1]), u[0])):
        k = min(range(n), key=lambda i: (load[i], i))
        load[k] += sum(seconds[c] for c in cases)
        shard_of.update(dict.fromkeys(cases, k))
    return [[case for case in seconds if shard_of[case] == k] for k in range(n)]
