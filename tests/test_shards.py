"""--shard K/N: the selected benchmarks split into N shards of about equal planned time, the same on every runner,
the cases of one torchrun job together, and every case in exactly one shard."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gptcore.gate import shards
from tests.test_gate import ROOT, child_env

pytestmark = pytest.mark.cpu


def test_the_longest_unit_goes_first_to_the_least_loaded_shard():
    seconds = {"a": 5, "b": 4, "c": 3, "d": 3, "e": 2, "f": 2, "g": 1}
    # a, b, c open the three shards; d joins c (3), e joins b (4), f joins a (5), g joins b (6): 7, 7, 6
    assert shards.split(seconds, {}, 3) == [["a", "f"], ["b", "e", "g"], ["c", "d"]]
    loads = [sum(seconds[c] for c in shard) for shard in shards.split(seconds, {}, 3)]
    assert max(loads) <= sum(seconds.values()) / 3 + max(seconds.values())  # the greedy rule's bound


def test_the_split_does_not_depend_on_the_order_the_cases_come_in():
    seconds = {f"case-{i}": float(i % 7 + 1) for i in range(30)}
    backwards = dict(reversed(list(seconds.items())))
    assert [set(s) for s in shards.split(seconds, {}, 4)] == [set(s) for s in shards.split(backwards, {}, 4)]


def test_the_cases_of_one_unit_stay_in_one_shard():
    seconds = {"ddp": 1.0, "fsdp2": 1.0, "alone": 1.5}
    unit_of = {"ddp": "torchrun job", "fsdp2": "torchrun job"}
    assert shards.split(seconds, unit_of, 2) == [["ddp", "fsdp2"], ["alone"]]
    assert shards.split(seconds, unit_of, 3) == [["ddp", "fsdp2"], ["alone"], []]  # more shards than units


@pytest.mark.parametrize("text", ["0/3", "4/3", "3", "a/b", "1/0"])
def test_a_shard_that_is_not_k_of_n_is_one_line(text: str):
    with pytest.raises(ValueError, match=r"^--shard .*: expected K/N with 1 <= K <= N, e\.g\. 2/4$"):
        shards.parse(text)


def collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "bench", "-m", "cpu", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def nodeids(out: str) -> set[str]:
    return {line for line in out.splitlines() if line.startswith("bench/")}


@pytest.mark.slow  # four collections of the benchmarks: ~15 s
def test_three_shards_of_the_cpu_tier_hold_every_case_once_and_its_torchrun_job_whole():
    whole = nodeids(collect().stdout)
    parts = [collect("--shard", f"{k}/3") for k in (1, 2, 3)]
    assert all(p.returncode == 0 for p in parts), [p.stdout[-500:] + p.stderr for p in parts]
    ids = [nodeids(p.stdout) for p in parts]
    assert set().union(*ids) == whole and sum(len(i) for i in ids) == len(whole) == 37  # each case once
    distributed = [i for i in ids if any("test_distributed" in n for n in i)]
    assert len(distributed) == 1 and sum("test_distributed" in n for n in distributed[0]) == 3  # one torchrun job
    for k, p in enumerate(parts, 1):
        assert f"--shard {k}/3: {len(ids[k - 1])} of 37 case(s), planned " in p.stdout


def test_a_bad_shard_stops_the_run_before_anything_runs():
    bad = collect("--shard", "4/3")
    assert bad.returncode == 4 and "Traceback" not in bad.stderr
    assert "--shard 4/3: expected K/N with 1 <= K <= N, e.g. 2/4" in bad.stderr
