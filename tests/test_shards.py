"""--shard K/N: the selected benchmarks split into N shards of about equal planned time, the same on every runner,
the cases of one torchrun job together, and every case in exactly one shard."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from gptcore.gate import shards
from tests.helpers import run_cli, run_pytest
from tests.test_gate import ROOT

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


def collect(workdir: Path, *args: str) -> pytest.RunResult:
    return run_pytest(
        workdir, str(ROOT / "bench"), "-m", "cpu", "--collect-only", "-q", "-p", "no:cacheprovider", *args
    )


def nodeids(out: str) -> set[str]:
    return {line for line in out.splitlines() if line.startswith("bench/")}


@pytest.mark.slow  # four collections of the benchmarks: ~15 s
def test_three_shards_of_the_cpu_tier_hold_every_case_once_and_its_torchrun_job_whole(tmp_path):
    whole = nodeids(collect(tmp_path).stdout.str())
    parts = [collect(tmp_path, "--shard", f"{k}/3") for k in (1, 2, 3)]
    assert all(p.ret == 0 for p in parts), [p.stdout.str()[-500:] + p.stderr.str() for p in parts]
    ids = [nodeids(p.stdout.str()) for p in parts]
    assert set().union(*ids) == whole and sum(len(i) for i in ids) == len(whole) == 37  # each case once
    distributed = [i for i in ids if any("test_distributed" in n for n in i)]
    assert len(distributed) == 1 and sum("test_distributed" in n for n in distributed[0]) == 3  # one torchrun job
    for k, p in enumerate(parts, 1):
        assert f"--shard {k}/3: {len(ids[k - 1])} of 37 case(s), planned " in p.stdout.str()


def test_a_bad_shard_stops_the_run_before_anything_runs(tmp_path):
    bad = collect(tmp_path, "--shard", "4/3")
    assert bad.ret == 4 and "Traceback" not in bad.stderr.str()
    assert "--shard 4/3: expected K/N with 1 <= K <= N, e.g. 2/4" in bad.stderr.str()


def test_a_resumed_shard_runs_what_its_plan_left_not_a_new_split_of_what_every_shard_left(tmp_path):
    """A shard's job killed at its limit and resumed: the cases it finished leave the selection, so a new split of
    what is left would take other shards' cases and drop some of its own, and the merge, which reads the plan, would
    not see a case that no shard ran. Its log: shard 1/2's plan, the first four cases finished."""
    import json

    quick = ("-m", "cpu and not convergence")  # (the one convergence case alone would fill shard 1 of 2)
    mine = sorted(nodeids(collect(tmp_path, *quick, "--shard", "1/2").stdout.str()))
    log = tmp_path / "shard-1.jsonl"
    lines = [{"plan": {"shard": [1, 2], "cases": mine, "slug": "cpu", "commit": "c0"}}]
    lines += [{"nodeid": c, "name": c.rsplit("::", 1)[1], "outcome": "passed", "seconds": 1.0} for c in mine[:4]]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))

    for shard in (["--shard", "1/2"], []):  # without --shard too: the log's hint under the end table names none
        resumed = collect(tmp_path, *quick, *shard, "--resume", str(log))
        assert resumed.ret == 0, resumed.stdout.str()[-2000:] + resumed.stderr.str()
        assert nodeids(resumed.stdout.str()) == set(mine[4:]) and len(mine) > 8


# -- merge ---------------------------------------------------------------------------------------------------------

FOUR = "cpu-small-fp32 or cpu-small-checkpoint or cpu-small-ckpt-fp32 or cpu-small-ckpt-half-batch"
TIMING = ["--bench-warmup", "2", "--bench-rounds", "1", "--bench-steps", "1"]


def bench(where: Path, *args: str) -> pytest.RunResult:
    """The four cases, recorded into ``where``/baselines, their results log ``where``/run.jsonl."""
    return run_pytest(
        where, str(ROOT / "bench"), "-m", "cpu", "-k", FOUR, "-p", "no:cacheprovider", *TIMING, "--update-baselines",
        "--baselines-dir", str(where / "baselines"), "--results-log", str(where / "run.jsonl"),
        "--benchmark-json", str(where / "bench.json"), *args,
    )  # fmt: skip


def merge_cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli("merge", *args)


@pytest.fixture(scope="module")
def one_and_three(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """Four CPU cases run once, and as three shards (each recording into its own folder, as on its own runner)."""
    root = tmp_path_factory.mktemp("shards")
    runs = [root / "one", *(root / f"shard-{k}" for k in (1, 2, 3))]
    for k, where in enumerate(runs):
        where.mkdir()
        done = bench(where, *(["--shard", f"{k}/3"] if k else []))
        assert done.ret == 0, done.stdout.str()[-3000:] + done.stderr.str()
        (where / "stdout.txt").write_text(done.stdout.str())
    return runs[0], runs[1:]


@pytest.mark.slow  # four runs of four CPU cases: ~40 s
def test_three_shards_merged_give_the_verdicts_and_the_exact_figures_of_one_run(one_and_three, tmp_path):
    from gptcore.gate import baselines, results

    one, shards_ = one_and_three
    logs = [str(s / "run.jsonl") for s in shards_]
    merged = merge_cli(*logs, "--baselines-dir", str(tmp_path), "--gate-markdown", str(tmp_path / "verdict.md"))
    assert merged.returncode == 0, merged.stdout + merged.stderr
    single = results.latest(results.read(one / "run.jsonl"))
    assert sum(len(results.read(log)) for log in logs) == len(single) == 4  # each case in exactly one shard
    assert [results.read_plan(log).split_of for log in logs] == [4, 4, 4]  # what the merge checks the plans by
    assert all(r.baseline == {} for log in logs for r in results.read(log))  # each judged against no entry, kept
    for record in single.values():  # the merged end table has every case, with the single run's verdict
        line = next(line for line in merged.stdout.splitlines() if line.strip().startswith(record.name))
        assert line.rstrip().endswith(record.verdict)
    recorded = baselines.load(tmp_path / "cpu.json", expect_slug="cpu")
    alone = baselines.load(one / "baselines" / "cpu.json", expect_slug="cpu")
    assert set(recorded.entries) == set(alone.entries) == {r.name for r in single.values()}
    for name, entry in alone.entries.items():  # the exact figures, to the byte and to the last count
        other = recorded.entries[name]
        assert (other.peak_allocated_bytes, other.loss, other.loss_step) == (
            entry.peak_allocated_bytes,
            entry.loss,
            entry.loss_step,
        )
        assert other.work.to_json() == entry.work.to_json()
    effects = [line for line in merged.stdout.splitlines() if line.startswith("cpu-small ") and " vs " in line]
    assert len(effects) == 2 and all(line.rstrip().endswith("ok") for line in effects)
    for line in effects:  # judged again over the shards, as the single run judged them: the same line
        assert line in (one / "stdout.txt").read_text().splitlines()
    assert "merged 3 of 3 shard(s): 4 case(s)" in merged.stdout
    assert (tmp_path / "verdict.md").read_text().startswith("## gptcore benchmark gate: ok (4 cases)")


@pytest.mark.slow  # reads the module's shards
def test_a_missing_or_cut_shard_fails_and_is_named_and_foreign_logs_are_refused(one_and_three, tmp_path):
    import json

    one, shards_ = one_and_three
    logs = [s / "run.jsonl" for s in shards_]
    missing = merge_cli(str(logs[0]), str(logs[1]), "--baselines-dir", str(tmp_path))
    assert missing.returncode == 1 and "FAIL: shard 3 of 3: no results" in missing.stdout
    cut = tmp_path / "cut.jsonl"
    lines = logs[0].read_text().splitlines()
    cut.write_text("\n".join(lines[:-1]) + "\n")  # the shard's last case never written: its job was killed
    short = merge_cli(str(cut), str(logs[1]), str(logs[2]), "--baselines-dir", str(tmp_path))
    assert short.returncode == 1 and "FAIL: shard 1 of 3: cut short: 1 of " in short.stdout
    twice = tmp_path / "twice.jsonl"
    twice.write_text(logs[1].read_text() + lines[-1] + "\n")  # shard 2's log also holds a case of shard 1
    both = merge_cli(str(logs[0]), str(twice), str(logs[2]), "--baselines-dir", str(tmp_path))
    name = json.loads(lines[-1])["name"]
    assert both.returncode == 1 and f"FAIL: {name}: ran in shards 1 and 2 of 3" in both.stdout
    other = tmp_path / "other.jsonl"
    plan = json.loads(lines[0])
    plan["plan"]["commit"] = "0" * 40
    other.write_text(json.dumps(plan) + "\n" + "\n".join(lines[1:]) + "\n")
    foreign = merge_cli(str(other), str(logs[1]), str(logs[2]))
    assert foreign.returncode == 2 and foreign.stderr.count("\n") == 1 and "Traceback" not in foreign.stderr
    assert "logs of different commits" in foreign.stderr
    plan["plan"].update(commit=json.loads(lines[0])["plan"]["commit"], slug="nvidia-h100-80gb-hbm3")
    other.write_text(json.dumps(plan) + "\n" + "\n".join(lines[1:]) + "\n")
    assert "logs of different devices" in merge_cli(str(other), str(logs[1]), str(logs[2])).stderr
    again = merge_cli(str(logs[0]), str(logs[0]), str(logs[2]))  # shard 1 given twice, shard 2 not at all
    assert again.returncode == 2 and f"{logs[0]} and {logs[0]}: both are shard 1 of 3" in again.stderr
    alone = merge_cli(str(one / "run.jsonl"))
    assert alone.returncode == 2 and "not a shard's results log" in alone.stderr


@pytest.mark.slow  # one CPU case run: ~10 s
def test_a_shard_resumed_into_another_log_is_that_shard_whole_and_merges_with_the_others(one_and_three, tmp_path):
    """A shard's job killed after its first case, resumed with --resume A --results-log B (a job whose output folder
    starts empty, with the log brought in): B starts as A's copy, with the plan A began with, and the merge of B with
    the other shards is the one run. Planted by the code before this test: B held only what the resumed job ran,
    under a new plan of the one case left, split from the 3 not finished, which no merge could take."""
    from gptcore.gate import results

    _, shards_ = one_and_three
    logs = [s / "run.jsonl" for s in shards_]
    k = max(range(3), key=lambda i: len(results.read(logs[i])))
    plan, first, *rest = logs[k].read_text().splitlines()
    assert rest, "the shard of two cases"
    killed = tmp_path / "killed.jsonl"
    killed.write_text(f"{plan}\n{first}\n{rest[0][:40]}")  # the job killed as it wrote its second case's line
    cont = tmp_path / "out" / "shard.jsonl"
    resume = [
        str(ROOT / "bench"), "-m", "cpu", "-k", FOUR, "-p", "no:cacheprovider", *TIMING, "--update-baselines",
        "--baselines-dir", str(tmp_path / "baselines"), "--resume", str(killed), "--results-log", str(cont),
    ]  # fmt: skip
    done = run_pytest(tmp_path, *resume)
    assert done.ret == 0, done.stdout.str()[-3000:] + done.stderr.str()
    assert killed.read_text() == f"{plan}\n{first}\n{rest[0][:40]}"  # the log resumed is left as it was
    lines = cont.read_text().splitlines()
    assert lines[:2] == [plan, first] and len(lines) == 2 + len(rest)  # A's whole lines, then what it had left
    assert results.read_plan(cont) == results.read_plan(logs[k])
    assert [r.nodeid for r in results.read(cont)] == [r.nodeid for r in results.read(logs[k])]
    others = [str(log) for i, log in enumerate(logs) if i != k]
    merged = merge_cli(str(cont), *others, "--baselines-dir", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "merged 3 of 3 shard(s): 4 case(s)" in merged.stdout

    again = run_pytest(tmp_path, *resume)  # the same command again: B holds a log now, and it is not overwritten
    said = again.stderr.str()
    assert again.ret == 4 and "Traceback" not in said and cont.read_text().splitlines() == lines
    assert f"--results-log {cont}: already holds a results log; with --resume {killed} it would start as its " in said


@pytest.mark.slow  # reads the module's shards
def test_shards_that_recorded_nothing_record_nothing_in_the_merge(one_and_three, tmp_path):
    """The shards of a verify run judge against the baselines and record nothing: their merge records nothing
    either, while the same logs as recorded (--update-baselines) give their four entries."""
    import json

    from gptcore.gate.merge import merge

    _, shards_ = one_and_three
    logs = [s / "run.jsonl" for s in shards_]
    assert sorted(merge(logs, tmp_path).recorded) == sorted(
        json.loads(line)["name"] for log in logs for line in log.read_text().splitlines()[1:]
    )
    verify = []
    for k, log in enumerate(logs, 1):
        plan, *lines = log.read_text().splitlines()
        verify.append(tmp_path / f"verify-{k}.jsonl")
        verify[-1].write_text("\n".join([plan, *(json.dumps(json.loads(x) | {"recorded": False}) for x in lines)]))
    merged = merge(verify, tmp_path)
    assert merged.recorded == {} and not merged.problems and "merged 3 of 3 shard(s): 4 case(s)" in merged.gate.notes


@pytest.mark.slow  # reads the module's shards
def test_the_shards_pytest_benchmark_runs_are_saved_as_one_run_that_history_reads(one_and_three, tmp_path):
    """What gpu.yml's merge job does with the shards' --benchmark-json: one saved run of the device, per commit, so
    that history and the next --benchmark-compare see every case at every commit whichever runner ran it."""
    import dataclasses
    import json

    from gptcore import storage
    from gptcore.gate import results
    from gptcore.gate.merge import MergeError, save_run

    _, shards_ = one_and_three
    plan = dataclasses.replace(results.read_plan(shards_[0] / "run.jsonl"), commit="a" * 40)
    jsons = []
    for k, shard in enumerate(shards_, 1):  # as written in a checkout at commit aaaa... (these ran outside git)
        run = json.loads((shard / "bench.json").read_text())
        run["commit_info"].update(id="a" * 40, dirty=False)
        run["datetime"] = f"2026-11-{24 - k}T10:00:00"  # started in parallel: shard 3 first, on the 21st
        jsons.append(tmp_path / f"shard-{k}.json")
        jsons[-1].write_text(json.dumps(run))
    where = tmp_path / "storage"
    first = save_run(jsons, where, plan)
    assert first.parent.parent == where / "cpu" and first.name == "0001_" + "a" * 40 + "_20261121_100000.json"
    saved = storage.read(where)
    [run] = saved.runs
    assert run.commit == "a" * 40 and saved.device == "cpu"
    names = sorted(b["name"] for b in run.benchmarks)
    assert len(names) == 4 == len(set(names))  # every case of the three shards, once
    assert len(run.data["machine_info"]["shards"]) == 3
    assert save_run(jsons, where, plan).name.startswith("0002_")  # the next run appends
    with pytest.raises(MergeError, match="2 pytest-benchmark JSON for 3 shards"):
        save_run(jsons[:2], where, plan)
    with pytest.raises(MergeError, match=" in .*shard-1.json and .*shard-1.json"):
        save_run([jsons[0], jsons[0], jsons[1]], where, plan)
    with pytest.raises(MergeError, match="not the shards' cpu at bbbb"):
        save_run(jsons, where, dataclasses.replace(plan, commit="b" * 40))
    assert len(storage.read(where).runs) == 2  # a refused run writes nothing
    dirty = []  # the same shards run from uncommitted changes: the plan's commit has '+dirty', their JSON the flag
    for k, path in enumerate(jsons, 1):
        run = json.loads(path.read_text())
        run["commit_info"]["dirty"] = True
        dirty.append(tmp_path / f"dirty-{k}.json")
        dirty[-1].write_text(json.dumps(run))
    saved_dirty = save_run(dirty, where, dataclasses.replace(plan, commit="a" * 40 + "+dirty"))
    assert saved_dirty.name.startswith("0003_" + "a" * 40 + "_") and saved_dirty.stem.endswith("_uncommitted-changes")
    # a shard whose time carries an offset beside ones without (UTC, as pytest-benchmark writes it): a traceback
    # before; the earliest instant names the run
    zoned = json.loads(jsons[2].read_text()) | {"datetime": "2026-11-21T10:30:00+01:00"}  # 09:30 UTC, before 10:00
    jsons[2].write_text(json.dumps(zoned))
    assert save_run(jsons, where, plan).name == "0004_" + "a" * 40 + "_20261121_093000.json"


def shard_log(path: Path, plan: dict | None = None, record: dict | None = None) -> Path:
    """A one-shard log of one passed case (no figures), its plan and record updated with ``plan`` and ``record``."""
    import json

    lines = [
        {"plan": {"shard": [1, 1], "cases": ["b.py::test_x[a]"], "slug": "cpu", "commit": "c0", **(plan or {})}},
        {"nodeid": "b.py::test_x[a]", "name": "test_x[a]", "outcome": "passed", "seconds": 1.0, **(record or {})},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


EFFECT = {"model": "cpu-small", "recipe": "fp32", "device": "cpu", "world": 1, "figures": [1, 2.0, 0.1, 1, 8]}
"""A record's well-formed effect, each case above breaking one of its fields."""


@pytest.mark.parametrize(
    ("plan", "record", "message"),
    [
        ({"shard": [0, 3]}, None, "not a shard's plan (ValueError: shard 0 of 3: expected 1 <= K <= N)"),
        ({"shard": [1, 0]}, None, "shard 1 of 0: expected 1 <= K <= N"),
        # each of these was a traceback (an infinite N) or read as shard 1 of 3
        ({"shard": [1, float("inf")]}, None, "shard: [1, inf]: expected [K, N], two whole numbers"),
        ({"shard": [1.5, 3]}, None, "shard: [1.5, 3]: expected [K, N], two whole numbers"),
        ({"shard": ["1", "3"]}, None, "shard: ['1', '3']: expected [K, N], two whole numbers"),
        ({"shard": [1, 3, 5]}, None, "shard: [1, 3, 5]: expected [K, N], two whole numbers"),
        ({"shard": "13"}, None, "shard: 13: expected [K, N], two whole numbers"),
        ({"shard": [True, 1]}, None, "shard: [True, 1]: expected [K, N], two whole numbers"),
        ({"cases": "abc"}, None, "cases: must be a list of case ids"),
        ({"slug": "../../x"}, None, "slug '../../x': not a device slug"),  # it names the baseline file written
        ({"recording": {"bogus": 1}}, None, "recording: unknown field 'bogus'"),
        (None, {"name": ["x"]}, "line 2: name: list where the log has str"),
        (None, {"seconds": "1"}, "line 2: seconds: str where the log has int or float"),
        (None, {"failures": [1]}, "line 2: failures: must be a list of strings"),
        (None, {"effect": {"model": "x"}}, "line 2: effect: no 'recipe'"),
        (None, {"row": {"bogus": 1}}, "line 2: row: unknown cell 'bogus'"),
        (None, {"row": {"status": {}}}, "line 2: row: no 'verdict'"),  # a traceback in the end table before
        # each of these was a traceback in the merge's end table or its judging of the effects
        (None, {"row": {"verdict": -1}}, "line 2: row.verdict: int where the log has str"),
        (None, {"row": {"status": "x"}}, "line 2: row.status: str where the log has dict"),
        (None, {"row": {"status": {"loss": 1}}}, "line 2: row.status: must be an object of metric -> status"),
        (None, {"effect": {**EFFECT, "model": []}}, "line 2: effect.model: list where the log has str"),
        (None, {"effect": {**EFFECT, "world": 0}}, "line 2: effect.world: 0 is not a number of ranks"),
        (None, {"effect": {**EFFECT, "figures": "x"}}, "line 2: effect.figures: expected a list of 4 to 7 figures"),
        (None, {"effect": {**EFFECT, "figures": [1, "x", 0.1, 1]}}, "line 2: effect.figures[1]: 'x' where the log"),
        (None, {"effect": {**EFFECT, "figures": [1, 2.0, 0.1, 1, float("nan")]}}, "line 2: effect.figures[4]: nan"),
    ],
)
def test_a_shard_log_of_the_wrong_shape_is_one_line_naming_the_file_and_the_field(tmp_path, plan, record, message):
    # the record is the log's last line: only a line cut short by a kill is excused there, not a field of a wrong type
    log = shard_log(tmp_path / "shard.jsonl", plan, record)
    merged = merge_cli(str(log), "--baselines-dir", str(tmp_path))
    assert merged.returncode == 2 and "Traceback" not in merged.stderr, merged.stdout + merged.stderr
    assert merged.stderr.count("\n") == 1 and str(log) in merged.stderr and message in merged.stderr, merged.stderr
    assert list(tmp_path.iterdir()) == [log]  # nothing recorded


def test_plans_that_are_not_one_split_are_refused_naming_why(tmp_path):
    """Shards run one after another, the first recording into the baseline file the next plans from: case a moved
    from shard 2 to shard 1 after shard 1 had planned, so shard 2's plan lacks it and no shard ran it. Each shard's
    log is whole, and only the plans show it."""
    from gptcore.gate.merge import MergeError, _plans

    def logs(*plans: tuple[list[str], int | None]) -> list[Path]:
        return [
            shard_log(tmp_path / f"shard-{k}.jsonl", {"shard": [k, len(plans)], "cases": cases, "split_of": of}, {})
            for k, (cases, of) in enumerate(plans, 1)
        ]

    again = r"the shards were split from different inputs \(one after another, give each its own --baselines-dir\)$"
    with pytest.raises(MergeError, match=r"^the 2 plans hold 3 of the 4 cases split: " + again):
        _plans(logs((["b", "c"], 4), (["d"], 4)))  # a was in shard 2's share when shard 1 planned
    with pytest.raises(MergeError, match=r"^c: in the plans of shards 1 and 2: " + again):
        _plans(logs((["b", "c"], 3), (["c", "a"], 3)))
    with pytest.raises(MergeError, match=r"^plans split from 3 and 4 cases: " + again):
        _plans(logs((["b", "c"], 3), (["a", "d"], 4)))
    assert len(_plans(logs((["b", "c"], 3), (["a"], 3)))) == 2  # one split
    assert len(_plans(logs((["b", "c"], None), (["a"], None)))) == 2  # logs written before plans kept the count
    assert len(_plans(logs((["b", "c"], 3), (["a"], 3))[:1])) == 1  # a shard missing: named by the merge itself


def test_the_merge_fails_a_case_that_failed_without_a_line_and_judges_the_expected_effects_itself(tmp_path):
    """A case whose test failed outside the gate (an exception, a timeout) has no failure line of its own: the merge
    fails it by its reason. A shard's 'expected effect not met' lines are not taken: each shard saw part of the run,
    and the merge judges the effects again over the whole of it. What it records carries shard 1's versions."""
    from gptcore.gate.merge import NOT_MET, merge

    failed = shard_log(tmp_path / "failed.jsonl", record={"outcome": "failed", "reason": "RuntimeError: planted"})
    assert merge([failed], tmp_path).gate.failures == ["test_x[a]: RuntimeError: planted"]
    partial = shard_log(tmp_path / "partial.jsonl", record={"failures": [f"test_x[a]{NOT_MET}a shard's own view"]})
    merged = merge([partial], tmp_path)
    assert merged.gate.failures == [] and not merged.failed
    # the recorded entries carry shard 1's device and versions, in whatever order the logs are given
    first, second = (
        shard_log(
            tmp_path / f"{k}.jsonl",
            {"shard": [k, 2], "cases": [f"{k}"], "recording": {"torch_version": v}},
            {"nodeid": f"{k}"},
        )
        for k, v in ((1, "2.13.0+cpu"), (2, "2.15.0+cpu"))
    )
    plan = merge([second, first], tmp_path).plan
    assert plan.shard == (1, 2) and plan.recording == {"torch_version": "2.13.0+cpu"}


def test_a_log_or_a_baseline_file_that_is_not_text_is_one_line(tmp_path):
    log = tmp_path / "shard.jsonl"
    log.write_bytes(b"\xff\xfe{}\n")
    merged = merge_cli(str(log))
    assert merged.returncode == 2 and f"{log}: not a results log (not UTF-8 text)" in merged.stderr
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "cpu.json").write_bytes(b"\xff\xfe{}")
    merged = merge_cli(str(shard_log(log, record={"slug": "cpu"})), "--baselines-dir", str(tmp_path / "baselines"))
    assert merged.returncode == 2 and "cpu.json: not a baseline file (not UTF-8 text)" in merged.stderr
    assert "Traceback" not in merged.stderr


def test_merge_into_a_baselines_folder_that_does_not_exist_is_refused_as_the_plugin_refuses_it(tmp_path):
    # a misspelt folder would judge every case "no baseline" and pass: exit 2, as pytest's --baselines-dir is refused
    missing = tmp_path / "no-such-baselines"
    merged = merge_cli(str(shard_log(tmp_path / "shard.jsonl")), "--baselines-dir", str(missing))
    assert merged.returncode == 2 and f"--baselines-dir {missing}: no such folder" in merged.stderr, merged.stderr
    assert not missing.exists()
    ok = merge_cli(str(tmp_path / "shard.jsonl"), "--baselines-dir", str(tmp_path))
    assert ok.returncode == 0, ok.stdout + ok.stderr  # the same log into a folder that exists


def test_merge_checks_where_it_writes_before_it_records_anything(tmp_path):
    log = shard_log(tmp_path / "shard.jsonl")
    saving = ("--benchmark-json", str(tmp_path / "bench.json"))  # the storage is checked when a run is to be saved
    for option, target, message, more in (
        ("--gate-markdown", tmp_path, "is a folder; give a file", ()),
        ("--gate-markdown", log / "verdict.md", f"{log} is a file, not a folder", ()),  # mkdir said "File exists"
        ("--benchmark-storage", log, "not a folder", saving),
        ("--benchmark-storage", log / "storage", f"cannot create it under {log}", saving),
        ("--benchmark-json", tmp_path / "bench.json", "no such file", ()),  # read only after recording: checked first
    ):
        merged = merge_cli(str(log), "--baselines-dir", str(tmp_path), option, str(target), *more)
        assert merged.returncode == 2 and f"{option} {target}: {message}" in merged.stderr, merged.stderr
    assert list(tmp_path.iterdir()) == [log]  # nothing recorded, nothing saved


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ([], "not an object"),
        ({"commit_info": None, "machine_info": {}}, "commit_info: not an object"),
        (
            {"commit_info": {}, "machine_info": {}, "benchmarks": [{}]},
            "benchmarks: not a list of benchmarks with their fullname",
        ),
        ({"commit_info": {}, "machine_info": {}, "benchmarks": []}, "datetime: None is not an ISO date"),
    ],
)
def test_a_pytest_benchmark_json_of_the_wrong_shape_is_refused_naming_what_it_lacks(tmp_path, run, message):
    import json

    from gptcore.gate import results
    from gptcore.gate.merge import MergeError, save_run

    path = tmp_path / "bench.json"
    path.write_text(json.dumps(run))
    plan = results.Plan((1, 1), [], "cpu", "c0")
    with pytest.raises(MergeError) as refused:
        save_run([path], tmp_path / "storage", plan)
    assert str(refused.value) == f"{path}: not a pytest-benchmark JSON ({message})"


def test_a_resumed_shards_log_keeps_its_first_plan_and_only_that(tmp_path):
    """A shard's job killed at its limit and resumed appends to the same log: the plan stays the one line at its
    start, the plan the shard began with (the merge reads that one), and the records follow it."""
    import json

    from gptcore.gate import results

    log = results.ResultsLog(tmp_path / "run.jsonl")
    first, resumed = results.Plan((1, 2), ["a", "b"], "cpu", "c0"), results.Plan((1, 2), ["b"], "cpu", "c1")
    log.write_plan(first)
    with open(log.path, "a") as out:  # a case's record, as the first job wrote it before it was killed
        out.write(json.dumps({"nodeid": "a"}) + "\n")
    log.write_plan(resumed)
    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    assert [("plan" in json.loads(line)) for line in lines] == [True, False]
    assert results.read_plan(tmp_path / "run.jsonl") == first


WHOLE = ROOT / "tests" / "data" / "whole-tier-shards"
"""The CPU tier (37 cases) run once (one.jsonl) and as three shards (shard-K.jsonl), one after another on one machine
at 2607fdd (AMD EPYC family 25 model 1, torch 2.13.0+cpu: docs/gate.md), with the baselines both were judged against
(cpu.json). Running the tier four times here would add about six minutes; the four cases above are run live."""
EXACT = ("peak_allocated_bytes", "peak_by_category", "loss", "loss_step", "work")


def exact(entry) -> dict:
    """An entry's figures that two runs of one commit on one machine give alike: the EXACT ones, and a convergence
    run's every loss (its wall clock apart)."""
    figures = {k: getattr(entry, k) for k in EXACT}
    figures["convergence"] = entry.convergence and dataclasses.replace(entry.convergence, seconds=None)
    return figures


def test_the_whole_cpu_tier_as_three_shards_merges_into_the_one_runs_verdicts_and_exact_figures(tmp_path):
    """What merge makes of the three shards' logs is held against the one run: its end table's rows (merge's own, in
    process) are the one run's 37 cases, each once, with the one run's verdict and exact figures; the command's end
    table gives each case the same verdict."""
    from gptcore.gate import results
    from gptcore.gate.merge import merge
    from gptcore.gate.schema import Entry

    shutil.copy(WHOLE / "cpu.json", tmp_path / "cpu.json")
    logs = [str(WHOLE / f"shard-{k}.jsonl") for k in (1, 2, 3)]
    run = merge(logs, tmp_path)  # before the command, which records into tmp_path what the shards recorded
    assert not run.failed, run.problems + run.gate.failures
    merged = merge_cli(*logs, "--baselines-dir", str(tmp_path))
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "merged 3 of 3 shard(s): 37 case(s)" in merged.stdout
    single = results.latest(results.read(WHOLE / "one.jsonl"))
    rows = {row.case: row for row in run.gate.rows}
    assert len(single) == 37 and len(run.gate.rows) == len(rows) == 37  # every case of the tier, once
    assert set(rows) == {one.name for one in single.values()}
    for log in logs:  # the torchrun job's three cases in one shard
        assert sum("test_distributed" in n for n in results.latest(results.read(log))) in (0, 3)
    for nodeid, one in single.items():
        row = rows[one.name]
        assert row.verdict == one.verdict, nodeid
        assert one.entry and row.measured, nodeid  # every case of the one run measured, and merged with a figure
        assert exact(row.measured) == exact(Entry.from_json(one.entry, nodeid)), nodeid
        line = next(line for line in merged.stdout.splitlines() if line.strip().startswith(one.name + " "))
        assert line.rstrip().endswith(one.verdict), line
    # the expected effects judged again over the shards, as the one run judged them: the recipe study's 9, three
    # per model of the shape study's 4, the distributed study's 2, every one met
    effects = [line for line in merged.stdout.splitlines() if line.startswith("cpu-") and " vs " in line]
    assert len(effects) == 9 + 4 * 3 + 2 and all(line.rstrip().endswith("ok") for line in effects)


@pytest.mark.parametrize("figure", [float("nan"), float("inf")])
def test_a_recorded_entry_that_no_baseline_file_may_hold_is_one_line_and_nothing_is_written(tmp_path, figure):
    """A shard's line says it recorded an entry whose tokens/s is NaN or infinite (a log edited, or written by another
    program): the merge used to write it into the baseline file, exit 0, and every later read of that file failed.
    Now the entry is held to a baseline's own check first: one line naming the log and the field, exit 2, the
    baseline file as it was."""
    import json

    shutil.copy(WHOLE / "cpu.json", tmp_path / "cpu.json")
    before = (tmp_path / "cpu.json").read_bytes()
    plan, first, *rest = (WHOLE / "shard-1.jsonl").read_text().splitlines()
    record = json.loads(first)
    record["recorded"] = True
    record["entry"]["tokens_per_s"]["median"] = figure
    bad = tmp_path / "shard-1.jsonl"
    bad.write_text("\n".join([plan, json.dumps(record), *rest]) + "\n")
    merged = merge_cli(
        str(bad), str(WHOLE / "shard-2.jsonl"), str(WHOLE / "shard-3.jsonl"), "--baselines-dir", str(tmp_path)
    )
    said = merged.stderr
    assert merged.returncode == 2 and said.count("\n") == 1 and "Traceback" not in said, merged.stdout + said
    assert f"{bad}: {record['nodeid']}: its recorded entry: tokens_per_s.median: must be a finite number >= 0" in said
    assert (tmp_path / "cpu.json").read_bytes() == before


def test_a_merged_or_resumed_case_stands_beside_the_baseline_its_verdict_is_of(tmp_path):
    """A shard judged its case against its runner's baseline file; the merge reads another folder (--baselines-dir)
    whose entry differs 37,000-fold. The row keeps the shard's verdict, so it must keep the shard's baseline too:
    beside the merge's file's entry its peak would read -99.997% next to the shard's 'ok'. Lines written before
    lines kept their baseline are shown beside the merge's file, as they were."""
    import dataclasses
    from types import SimpleNamespace

    from gptcore.gate import baselines
    from gptcore.gate.results import Record
    from tests.test_gate import BASE, new_gate

    other = dataclasses.replace(BASE, peak_allocated_bytes=BASE.peak_allocated_bytes * 37_000)
    baselines.update(tmp_path / "cpu.json", "cpu", {"test_x[a]": other}, device_name="cpu", device_type="cpu")
    judged = {"nodeid": "b.py::test_x[a]", "name": "test_x[a]", "outcome": "passed", "seconds": 1.0, "slug": "cpu"}
    judged |= {"entry": BASE.to_json(), "row": {"verdict": "ok", "status": {"peak memory": "ok"}}}
    rows = {}
    for kept, baseline in (("as judged", BASE.to_json()), ("none", {}), ("not kept", None)):
        gate = new_gate(tmp_path)
        gate.take_record(Record(**judged, baseline=baseline), f"shard.jsonl: {kept}")
        rows[kept] = gate.rows[0].baseline
    assert rows["as judged"].peak_allocated_bytes == BASE.peak_allocated_bytes
    assert rows["none"] is None
    assert rows["not kept"].peak_allocated_bytes == other.peak_allocated_bytes

    # what a case's line keeps: the entry it was judged against, as read ({} where there was none)
    gate, node = new_gate(tmp_path), SimpleNamespace(name="test_x[a]", nodeid="b.py::test_x[a]")
    gate.judge_entry(node, BASE, "cpu")
    assert gate.cases[node.nodeid]["baseline"] == gate.load("cpu").entry("test_x[a]").to_json()
    gate.judge_entry(SimpleNamespace(name="test_x[new]", nodeid="b.py::test_x[new]"), BASE, "cpu")
    assert gate.cases["b.py::test_x[new]"]["baseline"] == {}
