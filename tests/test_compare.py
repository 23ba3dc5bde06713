"""compare and bisect: the statistics decide slower/faster/same as documented; compare runs end to end on a
throwaway repository and writes valid JSON; bad input is one line and exit code 2; bisect names a planted commit."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gptcore.cli import main
from gptcore.gate.checks import Check, loss_check, memory_check
from gptcore.gate.schema import Tolerances
from gptcore.hunt.compare import (
    CompareError,
    Options,
    compare,
    keyword_match,
    run_driver,
    select_cases,
    write_driver,
)
from gptcore.hunt.significance import (
    FASTER,
    SAME,
    SLOWER,
    hodges_lehmann_ratio,
    mann_whitney,
    speed_verdict,
    u_distribution,
)

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
CASE = "cpu-small-ckpt-fp32"
QUICK = ["--warmup", "1", "--steps", "1"]


def noisy(center: float, spread: float, n: int = 10, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + spread * rng.uniform(-1, 1)) for _ in range(n)]


# -- statistics ----------------------------------------------------------------------------------------------------


def test_u_distribution_counts_every_ordering():
    counts = u_distribution(3, 4)
    assert sum(counts) == 35 and counts == counts[::-1]  # C(7, 3) orderings, symmetric
    assert counts[0] == counts[-1] == 1


def brute_force_mann_whitney(a: list[float], b: list[float]) -> tuple[int, list[int], float]:
    """U of b against a, the U of every split of the pooled values into len(a) and len(b), and the two-sided exact
    p from them: the definition, enumerated (no ties)."""
    pooled, m = a + b, len(a)

    def u(xs: list[float], ys: list[float]) -> int:
        return sum(y > x for x in xs for y in ys)

    splits = [
        u([pooled[i] for i in chosen], [v for i, v in enumerate(pooled) if i not in chosen])
        for chosen in itertools.combinations(range(len(pooled)), m)
    ]
    observed = u(a, b)
    low = sum(s <= observed for s in splits) / len(splits)
    high = sum(s >= observed for s in splits) / len(splits)
    return observed, splits, min(1.0, 2 * min(low, high))


@pytest.mark.parametrize("m,n", [(1, 1), (1, 4), (2, 3), (3, 3), (3, 5), (4, 4), (5, 3), (4, 6)])
def test_mann_whitney_exact_matches_a_brute_force_enumeration(m, n):
    rng = random.Random(m * 10 + n)
    for _ in range(6):
        values = [float(v) for v in rng.sample(range(1000), m + n)]
        a, b = values[:m], values[m:]
        u, splits, p = brute_force_mann_whitney(a, b)
        assert u_distribution(m, n) == [splits.count(k) for k in range(m * n + 1)]
        assert mann_whitney(a, b) == (u, pytest.approx(p, rel=1e-12))


def test_mann_whitney_refuses_an_empty_sample():
    for a, b in (([], [1.0]), ([1.0], [])):
        with pytest.raises(ValueError, match="both samples need at least one value"):
            mann_whitney(a, b)


def test_mann_whitney_exact_p_of_a_complete_separation():
    _, p = mann_whitney(list(range(10)), list(range(10, 20)))
    assert p == pytest.approx(2 / 184756)  # the two extreme orderings of C(20, 10)


def test_identical_samples_are_the_same():
    s = speed_verdict([1000.0] * 10, [1000.0] * 10)
    assert (s.verdict, s.ratio, s.p) == (SAME, 1.0, 1.0)
    a = noisy(1000, 0.02)
    s = speed_verdict(a, list(a))
    assert s.verdict == SAME and s.low <= 1 <= s.high


def test_a_ten_percent_shift_with_low_noise_is_slower_and_the_interval_excludes_1():
    s = speed_verdict(noisy(1000, 0.01, seed=1), noisy(900, 0.01, seed=2))
    assert s.verdict == SLOWER
    assert s.high < 1 and s.low < 0.9 < s.high and s.p < 0.05
    assert speed_verdict(noisy(900, 0.01, seed=2), noisy(1000, 0.01, seed=1)).verdict == FASTER


def test_a_ten_percent_shift_in_huge_noise_is_not_significant():
    s = speed_verdict(noisy(1000, 0.6, seed=3), noisy(900, 0.6, seed=4))
    assert s.verdict == SAME and s.low < 1 < s.high and s.p > 0.05
    s = speed_verdict(noisy(900, 0.6, seed=4), noisy(1000, 0.6, seed=3))  # the other way: B/A 1.109, past 5%
    assert s.ratio > 1.05 and s.low < 1 < s.high and s.verdict == SAME


def test_the_interval_is_the_third_smallest_and_third_largest_ratio_at_5_against_5():
    """Hodges-Lehmann's distribution-free interval at 95%: with 5 rounds a side, P(U <= 2) = 4/252 = 0.016 <= 0.025
    and P(U <= 3) = 7/252 = 0.028 > 0.025, so it runs from the 3rd smallest of the 25 ratios B/A to the 3rd largest
    (96.8% coverage); the estimate is the median ratio, which an outlier does not move."""
    a, b = [10, 11, 12, 13, 14], [20, 22, 25, 27, 30]
    ratios = sorted(y / x for x in a for y in b)
    estimate, low, high = hodges_lehmann_ratio(a, b)
    assert (estimate, low, high) == pytest.approx((ratios[12], ratios[2], ratios[-3]), rel=1e-12)
    assert hodges_lehmann_ratio([1, 1, 1], [1, 1, 100])[0] == pytest.approx(1.0)  # 6 of 9 ratios are 1
    for bad in ([0.0, 1.0], [-1.0, 1.0]):
        with pytest.raises(ValueError, match="samples must be positive"):
            hodges_lehmann_ratio(bad, [1.0, 2.0])


def test_the_threshold_is_respected_even_when_significant():
    a, b = noisy(1000, 0.001, seed=5), noisy(970, 0.001, seed=6)  # 3% slower, clearly significant
    s = speed_verdict(a, b, threshold=0.05)
    assert s.high < 1 and s.verdict == SAME
    assert speed_verdict(a, b, threshold=0.02).verdict == SLOWER
    faster = speed_verdict(b, a, threshold=0.05)  # the same 3%, the other way
    assert faster.low > 1 and faster.verdict == SAME
    assert speed_verdict(b, a, threshold=0.02).verdict == FASTER


def test_mann_whitney_with_ties_is_scipys_normal_approximation_with_its_continuity_correction():
    """With ties the exact distribution does not apply: p is the normal approximation, the variance corrected for
    ties and |U - mn/2| less 0.5, as scipy.stats.mannwhitneyu(method="asymptotic", use_continuity=True) computes it."""
    from scipy.stats import mannwhitneyu

    rng = random.Random(7)
    for m, n in ((10, 10), (7, 12), (60, 60)):
        a = [float(rng.randint(0, 6)) for _ in range(m)]
        b = [float(rng.randint(1, 7)) for _ in range(n)]
        u, p = mann_whitney(a, b)
        reference = mannwhitneyu(b, a, use_continuity=True, alternative="two-sided", method="asymptotic")
        assert u == reference.statistic and p == pytest.approx(reference.pvalue, rel=1e-12)


def test_too_few_rounds_give_no_interval_and_no_verdict():
    estimate, low, high = hodges_lehmann_ratio([100, 101, 102], [80, 81, 82])
    # the median of the 9 ratios b/a is 81/101 exactly (their mean, 0.802033, is not: 6.5e-5 away)
    assert estimate == pytest.approx(81 / 101, rel=1e-12) and low is high is None
    assert speed_verdict([100, 101, 102], [80, 81, 82]).verdict == SAME


def test_memory_and_loss_are_judged_as_the_gate_judges_them():
    """compare's ``decide`` judges B's peak and loss against A's with the gate's CPU tolerances, plus one thing the
    gate does not do: a peak that moved within tolerance is reported as 'changed'. Each probe sits where two
    readings of the rules part ways. A peak 1% above A's is inside the 2% memory tolerance, so it reads 'ok'
    unless moves are reported; it must read 'changed'. 3% above fails; 10% below is 'better'. The loss is absolute
    (nats) and compare runs both sides on this CPU: fp32 allows 1e-6, not the 1e-4 allowed against another CPU
    model, so 5e-7 passes and 5e-5 must fail (it would pass at 1e-4). bf16 allows 5e-4, not the 2e-2 allowed
    against another CPU, so 4e-4 passes and 1e-3 must fail (it would pass at 2e-2). Every loss probe is at least
    5e-7 nats from the bound it tests, nine orders beyond float64's rounding of 4.0 + d (about 4e-16); every peak
    probe at least 1,000 bytes from its bound, and integer bytes are exact."""
    from gptcore.hunt.compare import CaseResult, decide

    tol = Tolerances.default_for("cpu")

    def judged(precision: str, b: list[dict]) -> CaseResult:
        return decide(CaseResult("c", "m", "r", precision, driver_rounds(), b), 0.05, tol)

    def peak(bytes_b: int) -> str:
        return judged("fp32", driver_rounds(peak=bytes_b)).memory.status

    assert peak(100_000) == "ok"
    assert peak(101_000) == "changed"  # within +2%, reported
    assert memory_check(101_000, 100_000, tol).status == "ok"  # where the gate, which does not report it, says ok
    assert peak(103_000) == "FAIL" and judged("fp32", driver_rounds(peak=103_000)).failed
    assert peak(90_000) == "better"

    def loss(precision: str, value: float) -> str:
        return judged(precision, driver_rounds(loss=value)).loss.status

    assert loss("fp32", 4.0 + 5e-7) == "ok"
    assert loss("fp32", 4.0 + 5e-5) == "FAIL" and loss("fp32", 4.0 - 5e-5) == "FAIL"  # two-sided

    def other_cpu(value: float, precision: str) -> Check:  # the gate's loss check against another CPU's baseline
        return loss_check(value, 4.0, tol.loss_tolerance(precision, other_cpu=True))

    assert other_cpu(4.0 + 5e-5, "fp32").status == "ok"  # the probe tells the two tolerances apart
    assert loss("bf16", 4.0 + 4e-4) == "ok"
    assert loss("bf16", 4.0 + 1e-3) == "FAIL"
    assert other_cpu(4.0 + 1e-3, "bf16").status == "ok"


def test_k_selects_cases_like_pytest():
    """-k is pytest's expression on the case ids. A malformed expression is an error with pytest's own message (its
    parser's SyntaxError), not an expression that matches nothing: both raise CompareError, so each is told apart
    by its text."""
    from _pytest.mark.expression import Expression

    assert keyword_match("cpu-small and not (bf16 or sgd)", "cpu-small-ckpt-fp32")
    assert not keyword_match("cpu-small and not (bf16 or sgd)", "cpu-small-ckpt-bf16")
    assert [f"{m}-{r}" for m, r in select_cases("cpu-small-ckpt", "cpu")] == [
        "cpu-small-ckpt-fp32",
        "cpu-small-ckpt-half-batch",
        "cpu-small-ckpt-grad-accum-2",
        "cpu-small-ckpt-sgd-cosine",
        "cpu-small-ckpt-bf16",
    ]
    assert all(m.startswith("char") for m, _ in select_cases("char", "cuda"))
    with pytest.raises(CompareError, match=r"^-k 'char': no CPU case matches \(ids are like cpu-small-ckpt-fp32\)$"):
        select_cases("char", "cpu")  # well formed, matching only GPU ids
    for bad in ("cpu-small and", "(cpu-small"):
        with pytest.raises(SyntaxError) as parsed:
            Expression.compile(bad)
        with pytest.raises(CompareError, match=f"^{re.escape(f'-k {bad!r}: {parsed.value.msg}')}$"):
            select_cases(bad, "cpu")


def test_rounds_alternate_which_revision_runs_first(monkeypatch, tmp_path):
    import gptcore.hunt.compare as compare

    calls = []

    def fake_worker(tree, model, recipe, options, script, memory, python):
        assert python == {"a": "python-a", "b": "python-b"}[tree.name]  # each side keeps its interpreter
        calls.append((tree.name, memory))
        return {
            "tokens_per_s": 1000.0 if tree.name == "a" else 800.0,
            "loss": 4.0,
            "loss_step": 2,
            "peak_memory": 100 if memory else None,
            "cpu_share": 1.0,
        }

    monkeypatch.setattr(compare, "run_driver", fake_worker)
    [result] = compare.compare_trees(
        tmp_path / "a",
        tmp_path / "b",
        [("cpu-small", "ckpt-fp32")],
        rounds=4,
        threshold=0.05,
        options=Options(),
        workdir=tmp_path,
        python_a="python-a",
        python_b="python-b",
    )
    assert [name for name, _ in calls] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [memory for _, memory in calls] == [True, True] + [False] * 6  # CPU: the exact peak once
    assert result.speed.verdict == SLOWER and result.speed.ratio == 0.8 and result.failed
    assert (result.memory.status, result.loss.status) == ("ok", "ok")


def test_compare_names_an_operator_swapped_at_an_equal_count_and_a_rename_between_torch_releases(monkeypatch, tmp_path):
    """B's attention is efficient where A's was flash, 12 calls either way: no count of the ledger moves, and
    compare named nothing. Now it names both; between two torch releases the same swap reads as a rename."""
    import gptcore.hunt.compare as compare

    ops = {"forward": {"aten.mm.default": 48, "aten._scaled_dot_product_flash_attention.default": 12}}
    swapped = {"forward": {"aten.mm.default": 48, "aten._scaled_dot_product_efficient_attention.default": 12}}
    torches = {"a": "2.13.0+cpu", "b": "2.13.0+cpu"}

    def fake_worker(tree, model, recipe, options, script, memory, python):
        work = {"op_calls": {"forward": 60}, "syncs": 0, "ops": ops if tree.name == "a" else swapped}
        return {
            "tokens_per_s": 1000.0,
            "loss": 4.0,
            "loss_step": 2,
            "peak_memory": 100 if memory else None,
            "torch": torches[tree.name],
            "work": work if memory else None,
        }

    monkeypatch.setattr(compare, "run_driver", fake_worker)

    def work() -> list[str]:
        [result] = compare.compare_trees(
            tmp_path / "a", tmp_path / "b", [("cpu-small", "ckpt-fp32")], rounds=2, threshold=0.05,
            options=Options(), workdir=tmp_path,
        )  # fmt: skip
        return result.work

    swap = "aten._scaled_dot_product_flash_attention (12) -> aten._scaled_dot_product_efficient_attention (12)"
    assert work() == [f"operators: forward: {swap}"]
    torches["b"] = "2.15.0+cpu"
    assert work() == [f"operators renamed between torch 2.13.0+cpu and 2.15.0+cpu: forward: {swap}"]


def test_compare_names_the_fields_in_which_bs_setup_differs_from_as(monkeypatch, tmp_path, capsys):
    """B's preset changed under its own name (the planted change: recipe.lr doubled in B's setup): compare says so
    under the case's line, so that what moved reads as the setup's change; a side that keeps no setup (a revision
    from before setups were kept) says nothing of it."""
    import gptcore.hunt.compare as compare
    from gptcore.config import setup_of
    from gptcore.presets import MODELS, RECIPES

    setup_a = setup_of(MODELS["cpu-small"], RECIPES["ckpt-fp32"])
    setups = {"a": setup_a, "b": setup_a | {"recipe.lr": 2 * setup_a["recipe.lr"]}}

    def fake_worker(tree, model, recipe, options, script, memory, python):
        return {"tokens_per_s": 1000.0, "loss": 4.0, "loss_step": 2, "peak_memory": 100, "setup": setups[tree.name]}

    monkeypatch.setattr(compare, "run_driver", fake_worker)

    def setup() -> list[str] | None:
        [result] = compare.compare_trees(
            tmp_path / "a", tmp_path / "b", [("cpu-small", "ckpt-fp32")], rounds=2, threshold=0.05,
            options=Options(), workdir=tmp_path,
        )  # fmt: skip
        return result.setup

    lr = setup_a["recipe.lr"]
    assert setup() == [f"recipe.lr {lr!r} -> {2 * lr!r}"]
    setups["b"] = setup_a
    assert setup() == []
    setups["a"] = None
    assert setup() is None


def test_compare_on_a_gpu_judges_the_busy_time_and_names_the_kind_of_kernel_that_moved(monkeypatch, tmp_path):
    """On a GPU each side's driver traces one step after its timed steps (its busy time and kernel time by kind;
    the first round's is read): B's attention kernels planted 0.9 ms slower fail B's busy time as the gate would
    (+9% over 3%), naming attention alone; the same kernels pass; drivers that trace nothing (a CPU's, revisions from
    before it) say nothing of it."""
    import gptcore.hunt.compare as compare

    kinds = {"a": {"matmul": 0.0060, "attention": 0.0030, "inductor": 0.0010}}
    kinds["b"] = kinds["a"] | {"attention": 0.0039}
    traced = {"on": True}

    def fake_worker(tree, model, recipe, options, script, memory, python):
        out = {"tokens_per_s": 1000.0, "loss": 4.0, "loss_step": 2, "peak_memory": 100}
        if memory and traced["on"]:  # the driver traces where it reads the ledger: every round on a GPU
            split = kinds[tree.name]
            out |= {"gpu_busy_seconds": sum(split.values()), "gpu_kernel_seconds": split}
        return out

    monkeypatch.setattr(compare, "run_driver", fake_worker)

    def result():
        [r] = compare.compare_trees(
            tmp_path / "a", tmp_path / "b", [("cpu-small", "ckpt-fp32")], rounds=2, threshold=0.05,
            options=Options(device="cuda"), workdir=tmp_path,
        )  # fmt: skip
        return r

    slower = result()
    assert slower.busy.status == "FAIL" and slower.failed
    assert slower.busy.note == (
        "10.900 vs 10.000 ms of kernels per step, tolerance +3%; by kind: attention +0.900 ms (+30.0%)"
    )
    kinds["b"] = kinds["a"]
    same = result()
    assert same.busy.status == "ok" and not same.failed and same.busy.note.endswith("no kind of kernel moved")
    traced["on"] = False
    assert result().busy is None


# -- throwaway repositories ----------------------------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository holding gptcore as committed in this checkout (not others' edits in progress)."""
    if (
        shutil.which("git") is None
        or subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode
    ):
        pytest.skip("needs git and a git checkout of gptcore-bench")
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD", "gptcore"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x"], input=archive, cwd=path, check=True)
    commit(path, "initial")
    return path


def one_error_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gptcore: error:") and "Traceback" not in err, err
    return err


def test_bad_input_is_one_line_and_exit_code_2(repo, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(repo)
    assert main(["compare", "no-such-rev", "-k", CASE]) == 2
    assert "unknown revision 'no-such-rev'" in one_error_line(capsys)
    assert main(["compare", "HEAD", "-k", "no-such-case"]) == 2
    assert "no CPU case matches" in one_error_line(capsys)
    assert main(["bisect", "HEAD", "HEAD", "-k", CASE, "--metric", "loss"]) == 2
    assert "GOOD 'HEAD' and BAD 'HEAD' are the same commit" in one_error_line(capsys)
    assert main(["compare", "HEAD", "-k", CASE, "--threshold", "2"]) == 2
    assert "--threshold" in one_error_line(capsys)
    with pytest.raises(CompareError, match=r"^need rounds >= 1 and 0 <= threshold < 1, got 10, 2$"):
        compare("HEAD", None, CASE, threshold=2)  # the API refuses it too, before any checkout
    elsewhere = tmp_path / "not-a-repo"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["compare", "HEAD", "-k", CASE]) == 2
    assert "not a git repository" in one_error_line(capsys)
    assert git(repo, "worktree", "list").count("\n") == 0  # nothing left behind


def test_ledger_changes_lists_every_count_that_moved():
    from gptcore.hunt.compare import ledger_changes

    a = {"flops": {"forward": 10, "backward": 20}, "op_calls": {"backward": 250}, "syncs": 0}
    b = {"flops": {"forward": 10, "backward": 20}, "op_calls": {"backward": 262}, "syncs": 1}
    # a ledger without per-operator counts (recorded before they were kept) says so where they would be named
    assert ledger_changes(a, b) == [
        "op_calls.backward 250 -> 262 (+12)",
        "syncs 0 -> 1 (+1)",
        "op calls by operator: operators not recorded",
    ]
    assert ledger_changes(a, a) == [] and ledger_changes(a, None) is None
    ops_a = {"backward": {"aten.mm.default": 40, "aten.detach.default": 200, "aten.alias.default": 10}}
    ops_b = {
        "backward": {
            "aten.mm.default": 41,
            "aten.detach.default": 204,
            "aten.alias.default": 14,
            "aten.clone.default": 3,
        }
    }
    named = ledger_changes(a | {"ops": ops_a}, b | {"ops": ops_b})
    assert named[-2] == "op calls by operator: aten.alias +4, aten.detach +4, aten.clone +3, +1 more"
    assert named[-1] == "operators: backward: aten.clone (3) new"  # one that B's phase ran and A's did not


def test_ledger_changes_read_a_count_one_side_lacks_and_sum_an_operator_over_its_phases():
    """A revision's ledger may lack a count or a group the other keeps (one it did not keep yet): listed against
    None on either side, not a crash. ops is kept per phase and an operator that moved in two phases is named by its
    sum (aten.mm: +1 in forward, +2 in backward); allocations_by_op and flops_by_op are flat (operator -> count)."""
    from gptcore.hunt.compare import ledger_changes

    mm = "aten.mm.default"
    a = {
        "allocations": 10,
        "allocations_by_op": {"aten.empty.memory_format": 10},
        "flops": {"forward": 10},
        "op_calls": {"forward": 5, "backward": 7},
        "ops": {"forward": {mm: 5}, "backward": {mm: 7}},
    }
    b = {
        "allocations": 12,
        "allocations_by_op": {"aten.empty.memory_format": 12},
        "op_calls": {"forward": 6, "backward": 9},
        "ops": {"forward": {mm: 6}, "backward": {mm: 9}},
        "syncs": 2,
    }
    assert ledger_changes(a, b) == [
        "allocations 10 -> 12 (+2)",
        "flops.forward 10 -> None",
        "op_calls.forward 5 -> 6 (+1)",
        "op_calls.backward 7 -> 9 (+2)",
        "syncs None -> 2",
        "op calls by operator: aten.mm +3",
        "allocations by operator: aten.empty.memory_format +2",
        "flops by operator: operators not recorded",
    ]


def wrapper(path: Path, body: str) -> str:
    """An executable shell script standing in for another virtual environment's python."""
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_bad_interpreters_are_one_line_and_exit_code_2(repo, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(repo)
    assert main(["compare", "-k", CASE]) == 2
    assert "--python-a/--python-b" in one_error_line(capsys)
    assert main(["compare", "-k", CASE, "--python-b", str(tmp_path / "no-python")]) == 2
    assert "no such interpreter" in one_error_line(capsys)
    no_torch = wrapper(tmp_path / "python-without-torch", "echo 'ModuleNotFoundError: torch' >&2; exit 1")
    assert main(["compare", "-k", CASE, "--python-b", no_torch]) == 2
    assert "cannot import torch: ModuleNotFoundError: torch" in one_error_line(capsys)
    not_python = wrapper(tmp_path / "not-python", "exit 0")  # /usr/bin/true passed for an interpreter before
    assert main(["compare", "-k", CASE, "--python-b", not_python]) == 2
    assert "not a Python that imports torch (torch.__version__ printed '')" in one_error_line(capsys)


def test_the_worker_refuses_a_checkout_whose_gptcore_it_did_not_import(tmp_path):
    with pytest.raises(RuntimeError, match="not from the checkout"):
        run_driver(tmp_path, "cpu-small", "ckpt-fp32", Options(warmup=1, steps=1), write_driver(tmp_path), False)


PRE_ROOMS = "7205ef1f67ff3f758e22508bcbc789fe87037648"
"""The last commit of gptcore as one flat package (gptcore/train.py, gptcore/measure.py), before the rooms."""


@pytest.fixture
def across_the_move(tmp_path: Path) -> tuple[Path, str]:
    """A git repository whose first commit holds gptcore as it was before the rooms (PRE_ROOMS) and whose second
    holds it as committed in this checkout; returns it and the first commit."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("needs a git checkout of gptcore-bench")
    if sys.version_info < (3, 11):
        # the project takes 3.10 since; under 3.10 `compare` ends that side in one line ("AttributeError: module
        # 'enum' has no attribute 'StrEnum'"), as it does for any revision the interpreter cannot run
        pytest.skip(f"{PRE_ROOMS[:7]} needs Python 3.11 (its gptcore/rules.py subclasses enum.StrEnum)")
    shallow = git(ROOT, "rev-parse", "--is-shallow-repository") == "true"
    if (
        shallow
        and subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", PRE_ROOMS], capture_output=True).returncode
    ):
        pytest.skip(f"a shallow clone: {PRE_ROOMS[:7]} is not in it (clone without --depth to run this)")
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q")
    for rev in (PRE_ROOMS, "HEAD"):
        shutil.rmtree(path / "gptcore", ignore_errors=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "gptcore"], capture_output=True, check=True)
        subprocess.run(["tar", "-x"], input=archive.stdout, cwd=path, check=True)
        if rev == PRE_ROOMS:
            assert (path / "gptcore" / "train.py").is_file() and not (path / "gptcore" / "training").exists()
            old = commit(path, "gptcore before the rooms")
    commit(path, "gptcore in rooms")
    return path, old


@pytest.mark.slow  # 2 driver processes and one interpreter's torch version: ~15 s on 2 idle cores
def test_compare_runs_a_revision_from_before_the_rooms_against_the_working_tree_under_another_interpreter(
    across_the_move, tmp_path, monkeypatch, capsys
):
    """A = the last revision before the rooms under this interpreter, B = the working tree (a comment added, not
    committed) under another one (a wrapper around this one, as another virtual environment's python would be):
    each side runs its own checkout's gptcore under its own interpreter, and the same model and step on both sides
    of the move give the same exact figures and the same ledger. One round: the exact figures need no more (the
    order of the rounds is tested apart)."""
    repo, old = across_the_move
    (repo / "gptcore" / "units.py").write_text((repo / "gptcore" / "units.py").read_text() + "\n# uncommitted\n")
    other = wrapper(tmp_path / "python-b", f'exec "{sys.executable}" "$@"')
    monkeypatch.chdir(repo)
    out_json = tmp_path / "run.json"
    # an uncheckpointed case: the tracker follows checkpoint's saved RNG states since, so a checkpointed case's
    # ledger counts 5,056-byte allocations the old revision did not see
    case = "cpu-small-fp32"
    args = ["compare", old, "-k", case, "--rounds", "1", *QUICK, "--python-b", other, "--json", str(out_json)]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert (
        f"A = {old} ({old[:10]}), torch {torch.__version__} ({sys.executable}), B = working tree, torch "
        f"{torch.__version__} ({other})" in captured.out
    ), captured.out
    line = next(line for line in captured.out.splitlines() if line.startswith(f"{case}: "))
    assert "tok/s" in line and "B/A" in line and "peak memory" in line
    assert " ok; loss " in line and line.endswith(" ok; work =")  # every count of the ledger agrees
    assert "round 1/1" in captured.err and "running B/A" in captured.err
    data = json.loads(out_json.read_text())
    result = data["cases"][0]
    assert data["a"]["sha"] == old and data["b"]["sha"] is None and data["failed"] is False
    assert (data["a"]["python"], data["b"]["python"]) == (sys.executable, other)
    assert len(result["tokens_per_s_a"]) == len(result["tokens_per_s_b"]) == 1
    assert result["memory"]["status"] == result["loss"]["status"] == "ok" and result["work"] == []
    assert result["rounds_a"][0]["work"]["op_calls"]["backward"] > 0  # the old revision's own ledger was read
    # the working tree's driver hands over its per-operator counts too: compare names the operators from them
    assert {"ops", "allocations_by_op", "flops_by_op"} <= set(result["rounds_b"][0]["work"])
    assert result["rounds_b"][0]["work"]["ops"]["backward"]
    for record in result["rounds_a"] + result["rounds_b"]:  # each revision ran its own checkout's gptcore
        assert not record["gptcore"].startswith(str(ROOT)) and "gptcore-compare-" in record["gptcore"]
    assert result["rounds_a"][0]["gptcore"] != result["rounds_b"][0]["gptcore"]  # the old worktree, the tree's copy
    assert git(repo, "worktree", "list").count("\n") == 0  # the temporary worktree is gone


@pytest.mark.slow  # 3 driver processes and git bisect: ~15 s on 2 idle cores
def test_bisect_names_the_commit_that_planted_a_regression(repo, monkeypatch, capsys):
    """GOOD, the planted commit, a harmless one (BAD): GOOD and BAD are measured first, then git bisect runs a step
    on the one commit between them in a worktree of its own and names it."""
    good = git(repo, "rev-parse", "HEAD")
    config = repo / "gptcore" / "presets.py"
    text = config.read_text()
    planted = "_CPU = GPTConfig(n_layer=4, n_head=4, n_embd=160,"
    assert text.count("_CPU = GPTConfig(n_layer=4, n_head=4, n_embd=128,") == 1
    config.write_text(text.replace("_CPU = GPTConfig(n_layer=4, n_head=4, n_embd=128,", planted))
    bad_commit = commit(repo, "widen cpu-small")
    (repo / "NOTES").write_text("harmless\n")
    commit(repo, "harmless")
    monkeypatch.chdir(repo)
    assert main(["bisect", "HEAD", good, "-k", CASE, "--metric", "peak_memory"]) == 2  # the two swapped
    assert f"GOOD 'HEAD' must be an ancestor of BAD '{good}'" in one_error_line(capsys)
    assert main(["bisect", good, "HEAD", "-k", CASE, "--metric", "peak_memory", *QUICK]) == 0
    out = capsys.readouterr().out
    assert f"first bad commit: {bad_commit} widen cpu-small" in out
    assert f"{CASE}: peak memory" in out and "FAIL" in out
    assert git(repo, "worktree", "list").count("\n") == 0
    assert git(repo, "rev-parse", "HEAD") != bad_commit  # the user's checkout was not moved


def driver_rounds(tokens: float = 1000.0, loss: float = 4.0, peak: int = 100_000) -> list[dict]:
    """Three driver records of one side of a compared case, as ``decide`` reads them."""
    return [{"tokens_per_s": tokens, "loss": loss, "loss_step": 2, "peak_memory": peak} for _ in range(3)]


def test_compare_judges_b_against_a_with_the_tolerances_of_the_cases_precision():
    """B is the change, A its reference: B hungrier fails, B leaner does not; an infinite speed is as broken as a NaN
    one. The loss tolerance is absolute (nats) and the same CPU's, both sides run here: a loss 5e-5 away is within a
    bf16 case's 5e-4 and beyond an fp32 case's 1e-6, and it would pass the fp32 tolerance against another CPU model
    (1e-4), so an fp32 failure shows that compare did not pick that one. 4.0 + 5e-5 is exact to about 4e-16."""
    from gptcore.gate.schema import Tolerances
    from gptcore.hunt.compare import CaseResult, decide

    def judged(precision: str, b: list[dict]) -> CaseResult:
        return decide(CaseResult("c", "m", "r", precision, driver_rounds(), b), 0.05, Tolerances.default_for("cpu"))

    hungrier, leaner = judged("fp32", driver_rounds(peak=120_000)), judged("fp32", driver_rounds(peak=80_000))
    assert hungrier.failed and hungrier.memory.delta == pytest.approx(0.2)
    assert not leaner.failed and leaner.memory.delta == pytest.approx(-0.2)
    assert judged("fp32", driver_rounds(loss=4.0 + 5e-5)).loss.failed
    assert not judged("bf16", driver_rounds(loss=4.0 + 5e-5)).failed
    assert (
        judged("fp32", driver_rounds(tokens=float("inf"))).error
        == "tokens/s not finite in B's rounds (the timing broke)"
    )


def test_bisect_judges_a_commits_loss_against_goods_only_at_the_same_step():
    """A loss read at another step than GOOD's (the commit changed how many steps a case takes) measures another
    point of training: it is not judged, and the check says why, where the same step's loss is judged exactly."""
    from gptcore.hunt.bisection import _bad_by_exact

    tol, good = Tolerances.default_for("cpu"), {"loss": 4.0, "loss_step": 15}
    elsewhere = _bad_by_exact("loss", good, {"loss": 4.5, "loss_step": 16}, "fp32", tol)
    assert not elsewhere.failed and elsewhere.note == "read at step 16, baseline at step 15"
    assert _bad_by_exact("loss", good, {"loss": 4.5, "loss_step": 15}, "fp32", tol).failed


def test_a_commit_that_cannot_run_the_case_is_skipped_by_bisect_not_called_good(tmp_path, monkeypatch):
    """git bisect run reads exit code 125 as 'cannot test this commit': it skips it, where 0 would call a broken
    commit good and move the search past the regression."""
    from gptcore.hunt import bisection

    log = tmp_path / "steps.jsonl"
    spec = dict(good_tree=str(tmp_path), cases=[["cpu-small", "ckpt-fp32"]], metric="loss", rounds=1, threshold=0.05)
    (tmp_path / "spec.json").write_text(json.dumps(spec | dict(options={}, good={}, log=str(log))))
    monkeypatch.setattr(bisection, "git", lambda tree, *args: "f" * 40)

    def cannot_run(*args):
        raise bisection.DriverError("ModuleNotFoundError: No module named 'gptcore.memory'")

    monkeypatch.setattr(bisection, "judge_commit", cannot_run)
    assert bisection.bisect_step(str(tmp_path / "spec.json")) == 125
    step = json.loads(log.read_text())
    assert step == {
        "sha": "f" * 40,
        "bad": None,
        "figures": {"error": "ModuleNotFoundError: No module named 'gptcore.memory'"},
    }


def test_a_nan_loss_or_a_nan_speed_in_a_round_is_a_failed_case_that_names_itself():
    from gptcore.gate.schema import Tolerances
    from gptcore.hunt.compare import CaseResult, decide

    tol = Tolerances.default_for("cpu")
    diverged = decide(
        CaseResult("c", "m", "r", "fp32", driver_rounds(1000.0, 4.0), driver_rounds(1000.0, float("nan"))), 0.05, tol
    )
    assert diverged.failed and diverged.loss.note == "the loss is NaN (the run diverged)"
    broken = decide(
        CaseResult("c", "m", "r", "fp32", driver_rounds(1000.0, 4.0), driver_rounds(float("nan"), 4.0)), 0.05, tol
    )
    assert broken.failed and broken.speed is None
    assert broken.error == "tokens/s not finite in B's rounds (the timing broke)"


# -- the commands' own output (the measuring faked) -------------------------------------------------------------------


def interrupted(*args, **kwargs):
    """The measuring, stopped by Ctrl-C."""
    raise KeyboardInterrupt


def test_compare_prints_a_line_per_case_and_its_notes_and_exits_1_when_a_case_failed(monkeypatch, tmp_path, capsys):
    """B 20% slower with its learning rate doubled, A's rounds on a busy machine, a GPU busy time 9% up, and a case
    whose driver failed: a line per case, the notes under it, every figure in --json, exit 1; interrupted, 130."""
    import gptcore.hunt.compare as hunt
    from gptcore.gate.verdicts import busy_check

    def rounds(speed: float, share: float, lr: float) -> list[dict]:
        return [{"tokens_per_s": speed + i, "loss": 4.0, "loss_step": 2, "peak_memory": 100, "cpu_share": share,
                 "setup": {"recipe.lr": lr}} for i in range(5)]  # fmt: skip

    slow = hunt.CaseResult(
        "cpu-small-ckpt-fp32", "cpu-small", "ckpt-fp32", "fp32", rounds(1000, 0.5, 1e-3), rounds(800, 0.95, 2e-3)
    )
    hunt.decide(slow, 0.05, Tolerances.default_for("cpu"))
    slow.busy = busy_check(1.09e-3, 1e-3, Tolerances.default_for("cuda"))
    broken = hunt.CaseResult(
        "cpu-small-ckpt-bf16", "cpu-small", "ckpt-bf16", "bf16", error="B: the driver failed: boom"
    )
    a, b = hunt.Revision("main", "a" * 40, torch="2.13.0+cpu"), hunt.Revision("HEAD", None, torch="2.15.0+cpu")
    monkeypatch.setattr(hunt, "compare", lambda *args, **kwargs: (a, b, [slow, broken]))
    assert main(["compare", "main", "-k", "cpu-small", "--json", str(tmp_path / "ab.json")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"A = main ({'a' * 10}), B = HEAD; 10 rounds of 10 steps after 3 warm-up, ")
    assert lines[1].startswith("cpu-small-ckpt-fp32: A 1,002 tok/s, B 802 tok/s, B/A 0.800 (95% CI ")
    assert lines[1].endswith(") slower; peak memory 100 B -> 100 B ok; loss 4.0000000 -> 4.0000000 ok; work n/a")
    assert lines[2:] == [
        f"  GPU busy: {slow.busy.status}: {slow.busy.note}",
        "  note: B's setup differs from A's: recipe.lr 0.001 -> 0.002 (B measures another experiment)",
        "  note: busy machine: median CPU share A 0.50, B 0.95 (below ~0.9 other processes took the cores; "
        "tokens/s says little)",
        "cpu-small-ckpt-bf16: error: B: the driver failed: boom",
    ]
    saved = json.loads((tmp_path / "ab.json").read_text())
    assert [(c["case"], c["failed"]) for c in saved["cases"]] == [(slow.case, True), (broken.case, True)]
    assert main(["compare", "main", "-k", "cpu-small", "--python-b", sys.executable]) == 1  # each side's torch
    assert capsys.readouterr().out.startswith(
        f"A = main ({'a' * 10}), torch 2.13.0+cpu ({a.python}), B = HEAD, torch 2.15.0+cpu ({b.python}); "
    )

    monkeypatch.setattr(hunt, "compare", interrupted)
    assert main(["compare", "main", "-k", "cpu-small"]) == 130
    assert capsys.readouterr().err.strip() == "gptcore: interrupted (temporary worktrees removed)"


def test_bisect_prints_the_first_bad_commit_and_its_figures_or_why_there_is_none(monkeypatch, capsys):
    """The first bad commit and each case's figure against GOOD's (tokens/s, or the exact peak), exit 0; no bad
    commit: why, exit 1; interrupted, 130."""
    import dataclasses

    from gptcore.hunt import bisection

    speed = {"median_a": 1000.0, "median_b": 800.0, "ratio": 0.8, "verdict": "slower"}
    memory = dataclasses.asdict(memory_check(120, 100, Tolerances.default_for("cpu")))
    found = {"tokens_per_s": speed, "peak_memory": memory}

    def bisect(good, bad, expr, *, metric, **kwargs):
        return bisection.BisectResult(good, bad, "c" * 40, "planted: slower", {"cpu-small-x": found[metric]}, [])

    monkeypatch.setattr(bisection, "bisect", bisect)
    assert main(["bisect", "v1", "v2", "-k", "cpu-small"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"first bad commit: {'c' * 40} planted: slower",
        "  cpu-small-x: 800 tok/s vs GOOD's 1,000 (B/A 0.800, slower)",
    ]
    assert main(["bisect", "v1", "v2", "-k", "cpu-small", "--metric", "peak_memory"]) == 0
    assert (
        capsys.readouterr().out.splitlines()[1]
        == "  cpu-small-x: peak memory 100 B -> 120 B (+20.00%, +20 B) FAIL (GOOD -> first bad)"
    )
    none = bisection.BisectResult("v1", "v2", None, "no commit between v1 and v2 is worse than v1", {}, [])
    monkeypatch.setattr(bisection, "bisect", lambda *args, **kwargs: none)
    assert main(["bisect", "v1", "v2", "-k", "cpu-small"]) == 1
    assert capsys.readouterr().out == "no commit between v1 and v2 is worse than v1\n"

    monkeypatch.setattr(bisection, "bisect", interrupted)
    assert main(["bisect", "v1", "v2", "-k", "cpu-small"]) == 130


CHILD = """
import sys, time
from pathlib import Path
from gptcore.cli import main
from gptcore.hunt import bisection
from gptcore.hunt.revisions import worktree

def holding(*args, **kwargs):  # the measuring, inside a worktree as bisect's is, until it is stopped
    with worktree(Path(sys.argv[1]), "HEAD", Path.cwd()) as tree:
        print(tree, flush=True)
        time.sleep(120)

bisection.bisect = holding
sys.exit(main(["bisect", "v1", "v2", "-k", "cpu-small"]))
"""


def test_sigterm_stops_a_bisect_as_ctrl_c_does_and_its_worktree_is_removed(repo, tmp_path):
    """A CI job's time-out sends SIGTERM: Python's default would end the process with no ``finally`` run, leaving
    the worktree checked out and registered in the user's repository."""
    import os
    import signal

    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's gptcore, not the repository's copy
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(repo)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        tree = Path(child.stdout.readline().decode().strip())
        assert tree.is_dir() and len(git(repo, "worktree", "list").splitlines()) == 2
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130, err.decode()
    assert err.decode().strip() == "gptcore: interrupted (temporary worktrees removed)"
    assert not tree.exists() and len(git(repo, "worktree", "list").splitlines()) == 1


# -- bisect's judgement and its search (the measuring faked) ----------------------------------------------------------

TWO_CASES = [["cpu-small", "fp32"], ["cpu-small", "ckpt-fp32"]]


def test_a_commit_is_bad_when_any_of_its_cases_is_worse_first_or_last(tmp_path, monkeypatch):
    """judge_commit over two cases: one worse case makes the commit bad wherever it comes; a case that cannot run is
    an error (bisect_step then skips the commit), never good. Peak memory is measured only when it is the metric, and
    a loss is held to the device's tolerance: on CPU fp32 within 1e-6, so a 1e-4 move is bad there and passes a GPU's
    1e-3."""
    from gptcore.hunt import bisection
    from gptcore.hunt.compare import CaseResult, DriverError

    def spec(metric: str, good: dict | None = None) -> bisection.BisectSpec:
        return bisection.BisectSpec(str(tmp_path), TWO_CASES, metric, 5, 0.05, {}, good or {}, str(tmp_path / "log"))

    same = speed_verdict(noisy(1000, 0.01, 5), noisy(1000, 0.01, 5, seed=1))
    slow = speed_verdict(noisy(1000, 0.01, 5), noisy(800, 0.01, 5, seed=1))
    assert (same.verdict, slow.verdict) == (SAME, SLOWER)

    def judged(*speeds, error: str | None = None) -> bool:
        results = [CaseResult(f"cpu-small-{r}", m, r, "fp32", speed=s) for (m, r), s in zip(TWO_CASES, speeds)]
        results[-1].error = error
        monkeypatch.setattr(bisection, "compare_trees", lambda *args, **kwargs: results)
        bad, figures = bisection.judge_commit(tmp_path, spec("tokens_per_s"), tmp_path)
        assert list(figures) == ["cpu-small-fp32", "cpu-small-ckpt-fp32"]
        return bad

    assert judged(slow, same) and judged(same, slow) and not judged(same, same)
    with pytest.raises(DriverError, match="^B: the driver failed: boom$"):
        judged(same, same, error="B: the driver failed: boom")

    good = {f"{m}-{r}": {"peak_memory": 1000, "loss": 4.0, "loss_step": 2} for m, r in TWO_CASES}
    measured: list[bool] = []

    def exact(metric: str, moved: dict, device: str = "cpu") -> bool:
        def run_driver(tree, model, recipe, options, script, memory):
            measured.append(memory)
            return good[f"{model}-{recipe}"] | moved.get(f"{model}-{recipe}", {})

        monkeypatch.setattr(bisection, "run_driver", run_driver)
        the_spec = dataclasses.replace(spec(metric, good), options={"device": device})
        bad, figures = bisection.judge_commit(tmp_path, the_spec, tmp_path)
        assert list(figures) == list(good)
        return bad

    hungrier = {"peak_memory": 1300}
    assert exact("peak_memory", {"cpu-small-fp32": hungrier}) and exact(
        "peak_memory", {"cpu-small-ckpt-fp32": hungrier}
    )
    assert not exact("peak_memory", {}) and measured == [True] * 6
    measured.clear()
    moved = {"cpu-small-ckpt-fp32": {"loss": 4.0001}}
    assert exact("loss", moved) and not exact("loss", moved, device="cuda") and measured == [False] * 4


@pytest.fixture
def two_commits(tmp_path: Path) -> tuple[Path, str, str]:
    """A throwaway repository of two commits (GOOD, BAD); bisect's measuring is faked, so they hold no gptcore."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    path = tmp_path / "two"
    path.mkdir()
    git(path, "init", "-q")
    (path / "NOTES").write_text("good\n")
    good = commit(path, "good")
    (path / "NOTES").write_text("bad\n")
    return path, good, commit(path, "bad")


def test_bisect_refuses_what_it_cannot_search_and_reports_bad_itself_or_why_no_commit_was_found(
    two_commits, monkeypatch
):
    """An unknown metric, GOOD or BAD that cannot run, and a BAD no worse than GOOD are each one CompareError before
    any search. When git bisect names BAD itself (a commit the search never visits), its figures are those of the
    check that found BAD worse; when it names none, the reason carries git's last line."""
    from gptcore.hunt import bisection
    from gptcore.hunt.compare import DriverError

    repo, good, bad = two_commits
    peaks = {good[:8]: 1000, bad[:8]: 1300}
    broken: set[str] = set()

    def run_driver(tree, model, recipe, options, script, memory):
        sha = tree.name.split("-")[0]  # a worktree's folder starts with its commit
        if sha in broken:
            raise DriverError(f"{model}/{recipe}: ImportError: planted")
        return {"peak_memory": peaks[sha], "loss": 4.0, "loss_step": 2}

    said = {"stdout": f"{bad} is the first bad commit\ncommit {bad}\n", "stderr": ""}

    def run(command, **kwargs):
        if command[3:5] == ["bisect", "run"]:
            return subprocess.CompletedProcess(command, 0, said["stdout"], said["stderr"])
        return subprocess.run(command, **kwargs)

    monkeypatch.setattr(bisection, "run_driver", run_driver)
    monkeypatch.setattr(bisection, "subprocess", SimpleNamespace(run=run))

    def hunt(metric: str = "peak_memory") -> bisection.BisectResult:
        return bisection.bisect(good, bad, CASE, metric=metric, options=Options(device="cpu"), cwd=repo)

    with pytest.raises(CompareError, match=r"^--metric: unknown 'flops'; choose from tokens_per_s, peak_memory, loss$"):
        hunt("flops")
    broken.add(good[:8])
    with pytest.raises(CompareError, match=rf"^GOOD '{good}' cannot run cpu-small/ckpt-fp32: ImportError: planted$"):
        hunt()
    broken.clear(), broken.add(bad[:8])
    with pytest.raises(CompareError, match=rf"^BAD '{bad}' cannot run cpu-small/ckpt-fp32: ImportError: planted$"):
        hunt()
    broken.clear()
    with pytest.raises(CompareError, match=rf"^BAD '{bad}' is not worse than GOOD '{good}' on loss: nothing to bisect"):
        hunt("loss")

    found = hunt()
    assert (found.first_bad, found.subject, found.steps) == (bad, "bad", [])
    check = found.figures[CASE]
    assert (check["status"], check["baseline"], check["measured"]) == ("FAIL", 1000, 1300)
    said.update(
        stdout="", stderr="running ...\nbisect run failed: exit code 128 from 'python step.py' is < 0 or >= 128\n"
    )
    lost = hunt()
    assert lost.first_bad is None and lost.figures == {}
    assert lost.subject == (
        "git bisect found no single commit: bisect run failed: exit code 128 from 'python step.py' is < 0 or >= 128"
    )
    assert git(repo, "worktree", "list").count("\n") == 0 and git(repo, "for-each-ref", "refs/bisect") == ""
