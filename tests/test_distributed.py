"""DDP and FSDP2 compute what one process computes: proofs over 2 gloo ranks started by torchrun.

One torchrun launch (tests/distributed_worker.py, ~15 s on 2 cores) runs every training proof, the per-rank memory
measurements, a planted memory regression and the command line; the test functions compare what it saved. Another
launch plants a failure on one rank, another runs HSDP on 4 ranks, and two agents meet as two nodes. Each launch has
a timeout: a hang fails the test instead of stalling CI.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from gptcore.config import PARALLELS, DDPOptions, FSDP2Options, Parallel, Recipe
from gptcore.measure.launch import LOG_DIR
from gptcore.memory import resolve
from gptcore.memory.parallel import estimate_per_rank
from gptcore.presets import MODELS, RECIPES
from gptcore.training.trainer import Trainer, UnsupportedRecipe
from tests import distributed_worker as worker

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[1]
WORLD = 2
LAUNCH_TIMEOUT_S = 240

# DDP over 2 ranks vs one process, float64: the all-reduce sums the two ranks' partial gradients and divides by 2,
# a different summation order than one process's mean over the whole batch; the difference is rounding of a few
# ulps (measured: losses 2e-16, parameters 2e-15 relative after 4 AdamW steps, gradient norms 2e-16). 1e-12 is 1000x
# that. A missing average over ranks doubles every gradient: the recorded gradient norm shows the factor 2 itself,
# while AdamW's update g / (sqrt(v) + eps) cancels it but for its eps (1e-8) term, which matters only where a
# gradient is near eps (measured in float64, every gradient doubled: parameters up to 8e-5 apart, losses 3e-8
# relative, after 4 steps; still 10^4 and more above these bounds).
F64 = dict(rtol=1e-12, atol=1e-14)
# FSDP2 vs DDP, float32: reduce-scatter vs all-reduce and a global norm over DTensor shards change the order of
# float32 sums; measured: parameters within 6e-8 absolute (1 ulp of values ~0.5), losses within 1.1e-7 relative
# after 4 steps. 1e-5 relative / 1e-6 absolute bounds that with margin. Neither sees the gradients' scale: the
# proofs clip on every step (worker.BASE), and a clipped gradient is rescaled to the clip whatever its scale.
F32 = dict(rtol=1e-5, atol=1e-6)
# What does see it: the total gradient norm before clipping, each step, FSDP2 and HSDP vs DDP, float32. On step 1
# the gradients are the same sums (on 2 ranks to the bit: a + b = b + a, and halving is exact); only the order of
# the norm's float32 sum of squares differs (DDP: one norm per parameter, of at most 4,096 squares, then the norm of
# the 15 norms; FSDP2 and HSDP: per shard, then over ranks). torch's float32 norm of 4,096 values is within ~1 eps
# of the float64 norm (50 random draws; ~3 eps at 27,712 values, all of TINY's), so two orders differ by a few eps;
# later steps start from parameters 1 ulp apart, which move the norm by about as much again. Measured: within 1 ulp
# (0.9 eps) on every step, on 2 ranks and on 4. 16 eps (1.9e-6) relative bounds that; doubled gradients, or
# gradients summed over ranks and not averaged, multiply the norm by 2 (by the world size).
F32_NORM = dict(rtol=16 * torch.finfo(torch.float32).eps, atol=0.0)


def trained(run: dict, tolerance: dict) -> bool:
    """Every parameter moved from its initial value by more than ``tolerance`` (the one the proof compares runs
    with): an equivalence of trained parameters within it is no equivalence of two untrained copies."""
    return all(
        not torch.allclose(final, first, **tolerance)
        for final, first in zip(run["params"], run["initial"], strict=True)
    )


def clipped_every_step(run: dict) -> bool:
    """The gradient norm before clipping, recorded on each step, is above the recipe's clip: clipping acted on each
    (and the recorded norms are the ones the clip divided by)."""
    return len(run["grad_norms"]) == worker.STEPS and min(run["grad_norms"]) > worker.BASE.grad_clip


def torchrun(
    mode: str, out: Path, timeout: float = LAUNCH_TIMEOUT_S, world: int = WORLD
) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc-per-node=2 tests/distributed_worker.py MODE OUT`` from the
    repository root, with a timeout, torchrun's log folder under OUT as gptcore's launch keeps it."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
    cmd += [f"--log-dir={out / LOG_DIR}", str(ROOT / "tests" / "distributed_worker.py"), mode, str(out)]
    with subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as proc:
        try:
            out_text, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers: a hang must not outlive the test
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out_text, err)


@pytest.fixture(scope="module")
def proofs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of one torchrun launch's figures: every training proof, each rank's memory, the one-node
    reference of the two-node job, the memory of a planted regression, and the launch's output, which ends with
    `gptcore train` on both ranks (tests/distributed_worker.py)."""
    out = tmp_path_factory.mktemp("distributed")
    done = torchrun("proofs", out)
    assert done.returncode == 0, done.stderr[-4000:]
    (out / "stdout.txt").write_text(done.stdout)
    return out


@pytest.fixture(scope="module")
def proofs(proofs_dir: Path) -> tuple[dict, list[dict]]:
    """The training results (rank 0) and each rank's memory figures."""
    return torch.load(proofs_dir / "results.pt"), [torch.load(proofs_dir / f"memory-{r}.pt") for r in range(WORLD)]


def free_port() -> int:
    """A free TCP port on 127.0.0.1 below the kernel's ephemeral range. A port the kernel hands out (bind to port 0)
    is free only until released: in the seconds before torchrun's agent binds its store there, any connection of the
    other xdist worker's tests (gloo's, another torchrun's) can be given it as its own port, and the second agent then
    waits on a stranger until the launch times out (seen once, in a whole run of tests/ under Python 3.13). Below the
    range only an explicit bind can take it, and no other test binds one."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    for port in random.Random().sample(range(max(1024, low - 8192), low), 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port below the ephemeral range ({low})")


@pytest.mark.slow  # two torchrun agents that meet: ~15 s on 2 cores
def test_two_torchrun_agents_meeting_at_a_c10d_rendezvous_train_as_one_node_does(proofs_dir, tmp_path):
    """Two nodes of one process each on 127.0.0.1 (gptcore.measure.launch.Launcher: --nnodes 2 --node-rank R
    --rdzv-backend c10d --rdzv-endpoint HOST:PORT), against the standalone 2-rank job: the same gloo collectives
    over the same two ranks, so every loss and parameter of DDP and FSDP2 is the same to the bit."""
    from gptcore.measure.launch import Launcher

    worker = str(ROOT / "tests" / "distributed_worker.py")
    one, two = proofs_dir, tmp_path / "two-nodes"  # the standalone job: the proofs' launch
    two.mkdir()
    endpoint = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                *Launcher(nnodes=2, node_rank=k, rdzv_endpoint=endpoint, rdzv_id="two-nodes").args(WORLD),
                f"--log-dir={tmp_path / LOG_DIR}",
                worker,
                "nodes",
                str(two),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        for k in (0, 1)
    ]
    try:
        outputs = [agent.communicate(timeout=LAUNCH_TIMEOUT_S)[0] for agent in agents]
    finally:
        for agent in agents:  # a hang must not outlive the test
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.communicate()
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    for rank in range(WORLD):
        alone, apart = torch.load(one / f"nodes-{rank}.pt"), torch.load(two / f"nodes-{rank}.pt")
        for name in ("ddp", "fsdp2"):
            assert alone[name]["losses"] == apart[name]["losses"]
            assert all(torch.equal(a, b) for a, b in zip(alone[name]["params"], apart[name]["params"], strict=True))
            assert alone[name]["grad_norms"] == apart[name]["grad_norms"]
            assert trained(apart[name], dict(rtol=0.0, atol=0.0))  # bit-identical trained parameters, not initial ones


def test_a_launcher_is_torchruns_own_words_and_bad_words_are_one_line():
    from gptcore.measure.launch import Launcher

    assert Launcher.parse(None).args(2) == ["--standalone", "--nproc-per-node=2"]
    nodes = Launcher.parse("--nnodes 2 --node-rank 1 --rdzv-backend c10d --rdzv-endpoint node0:29400")
    assert nodes.args(8) == [
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node0:29400",
        "--rdzv-id=gptcore",
        "--nproc-per-node=4",
    ]
    for bad in ("--nnodes 2", "--nnodes two --rdzv-endpoint h:1", "--nnodes 2 --rdzv-endpoint h:1 --oops"):
        with pytest.raises(ValueError, match="^--launcher "):
            Launcher.parse(bad)
    with pytest.raises(ValueError, match="--node-rank must be in 0..1 \\(--nnodes 2\\)"):  # torchrun would wait for it
        Launcher.parse("--nnodes 2 --node-rank 2 --rdzv-endpoint h:1")
    with pytest.raises(ValueError, match="--nnodes must be >= 1"):
        Launcher.parse("--nnodes 0 --rdzv-endpoint h:1")
    with pytest.raises(ValueError, match="a world of 3 ranks does not divide over 2 nodes"):
        nodes.args(3)


def test_ddp_over_two_ranks_equals_one_process_with_the_whole_batch(proofs):
    results, _ = proofs
    ddp, single = results["ddp-f64"], results["single-f64"]
    assert (ddp["micro_batch"], single["micro_batch"]) == (4, 8)  # b per rank = 2b in one process
    assert_close(torch.tensor(ddp["losses"]), torch.tensor(single["losses"]), **F64)
    assert_close(ddp["params"], single["params"], **F64)
    assert len(ddp["grad_norms"]) == worker.STEPS  # the gradients' scale, which AdamW's update nearly cancels
    assert_close(torch.tensor(ddp["grad_norms"]), torch.tensor(single["grad_norms"]), **F64)
    assert trained(ddp, F64) and trained(single, F64)


@pytest.mark.parametrize("variant", ["", "-ckpt", "-accum"])
@pytest.mark.parametrize("fsdp", ["fsdp2", "fsdp2-no-reshard"])
def test_fsdp2_equals_ddp_within_float32_rounding(proofs, fsdp: str, variant: str):
    results, _ = proofs
    a, b = results[fsdp + variant], results["ddp" + variant]
    assert_close(torch.tensor(a["losses"]), torch.tensor(b["losses"]), **F32)
    assert_close(a["params"], b["params"], **F32)
    assert clipped_every_step(a) and clipped_every_step(b)
    assert_close(torch.tensor(a["grad_norms"]), torch.tensor(b["grad_norms"]), **F32_NORM)
    assert trained(a, F32) and trained(b, F32)
    if variant == "-accum":  # set_requires_gradient_sync / no_sync: 2 micro-batches of 2 per rank
        assert a["micro_batch"] == 2
        assert not torch.allclose(torch.tensor(a["losses"]), torch.tensor(results[fsdp]["losses"]))


def test_fsdp2_shards_parameters_gradients_and_optimizer_state(proofs):
    """Each rank holds 1/N of the unsharded bytes, up to FSDP2's padding of dim 0 to a multiple of N."""
    _, memory = proofs
    full = memory[0]["none"]
    for r in range(WORLD):
        for case in ("none", "ddp", "fsdp2"):
            if memory[r][case] is not None:
                assert memory[r][case]["no gradient"] == [], (r, case, "parameters with no gradient at the step")
        for what in ("parameters", "gradients", "optimizer state"):
            shard = memory[r]["fsdp2"][what]
            assert abs(shard - full[what] / WORLD) <= padding_bound(worker.TINY), (r, what, shard, full[what])
            assert memory[r]["ddp"][what] == full[what]  # DDP replicates
    # the tracker sees the same shards on every rank
    assert memory[0]["fsdp2"]["by_category"]["parameters"] == memory[0]["fsdp2"]["parameters"]


def padding_bound(cfg) -> int:
    """FSDP2 pads dim 0 of every parameter to a multiple of N: at most one row per parameter, for the parameter,
    its gradient and its two AdamW moments (float32)."""
    from gptcore.training.model import GPT

    rows = sum(p.numel() // p.shape[0] for p in GPT(cfg, worker.BASE).parameters())
    return 4 * rows * 4


def block_activations(est) -> int:
    """One block's share of what the forward leaves for backward: how far above the real peak the estimate of a
    resharding FSDP2 may be (it counts every activation live when backward's first gradients appear)."""
    return est.single.at_forward_end["activations"] // worker.TINY.n_layer


@pytest.mark.parametrize("name", list(worker.MEMORY_CASES))
def test_per_rank_estimate_matches_the_tracked_peak(proofs, name: str):
    """The tracked peak is the same on every pass (it follows FSDP2's storage resizes and runs collectives in
    program order), so the bounds are in bytes. DDP: the single-process estimate is exact up to 8 bytes.
    FSDP2 without resharding: the estimate leaves out FSDP2's dim-0 padding (``padding_bound``). FSDP2 with
    resharding: an upper bound, over by at most one block's saved activations (it counts them all live at the
    start of backward; the real peak comes inside the last block's backward, after some are freed)."""
    _, memory = proofs
    recipe = dataclasses.replace(worker.BASE, **worker.MEMORY_CASES[name])
    est = estimate_per_rank(resolve(worker.TINY, recipe, device="cpu"), WORLD)
    for r in range(WORLD):
        measured = memory[r][name]["peak"]
        assert memory[r][name]["foreign_frees"] == 0, (r, "a tracked storage was freed by a collective's thread")
        assert memory[r]["again"][name] == measured, (r, "a second pass tracked another peak")
        gap = est.total_bytes - measured
        if recipe.parallel.ddp is not None:
            assert abs(gap) <= 8, (r, est.total_bytes, measured, est.adjustments)
        elif not recipe.parallel.fsdp2.reshard_after_forward:
            assert 0 <= -gap <= padding_bound(worker.TINY), (r, est.total_bytes, measured, est.adjustments)
        else:
            assert 0 <= gap <= block_activations(est), (r, est.total_bytes, measured, est.adjustments)


@pytest.fixture(scope="module")
def hsdp_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """DDP, FSDP2 and HSDP (2 replicas x 2 shards) on 4 gloo ranks: each rank's results."""
    out = tmp_path_factory.mktemp("hsdp")
    done = torchrun("hsdp", out, world=4)
    assert done.returncode == 0, done.stderr[-4000:]
    return [torch.load(out / f"hsdp-{r}.pt") for r in range(4)]


@pytest.mark.slow  # 4 ranks on 2 cores: ~30 s
def test_hsdp_equals_ddp_and_fsdp2_within_float32_rounding(hsdp_ranks):
    for rank in hsdp_ranks:
        for other in ("ddp", "fsdp2"):
            assert_close(torch.tensor(rank["hsdp"]["losses"]), torch.tensor(rank[other]["losses"]), **F32)
            assert_close(rank["hsdp"]["params"], rank[other]["params"], **F32)
            assert clipped_every_step(rank["hsdp"]) and clipped_every_step(rank[other])
            assert_close(torch.tensor(rank["hsdp"]["grad_norms"]), torch.tensor(rank[other]["grad_norms"]), **F32_NORM)
        assert trained(rank["hsdp"], F32)


@pytest.mark.slow  # the same 4-rank launch
def test_hsdp_shards_within_a_replica_and_tracks_the_same_peak_on_every_pass(hsdp_ranks):
    """Each rank holds 1/2 of the parameters and optimizer state (its replica's share, over 2 ranks), twice what
    FSDP2 holds over all 4, up to FSDP2's dim-0 padding; the tracked peak is the same on a second pass; and the
    per-rank estimate bounds it as it bounds resharding FSDP2's (test_per_rank_estimate_matches_the_tracked_peak):
    above by at most one block's activations, for HSDP and for FSDP2 over the same 4 ranks. At a micro-batch of 2
    rows the peak is in backward, where the root's and one block's gradients are unsharded before their
    reduce-scatter (without that moment both estimates fell 3.1% and 5.2% under)."""
    for r, rank in enumerate(hsdp_ranks):
        hsdp, fsdp2 = rank["memory"]["hsdp"], rank["memory"]["fsdp2"]
        for state in ("parameters", "optimizer state"):
            assert abs(hsdp[state] - 2 * fsdp2[state]) <= 2 * padding_bound(worker.TINY), (r, state, hsdp, fsdp2)
        assert rank["again"] == hsdp["peak"] and hsdp["foreign_frees"] == 0
        for name, parallel in (("hsdp", worker.HSDP), ("fsdp2", worker.FSDP2)):
            recipe = dataclasses.replace(worker.BASE, parallel=parallel)
            est = estimate_per_rank(resolve(worker.TINY, recipe, device="cpu"), 4)
            gap = est.total_bytes - rank["memory"][name]["peak"]
            assert 0 <= gap <= block_activations(est), (r, name, est.total_bytes, rank["memory"][name], est.adjustments)


def reshard_saves_memory(memory: list[dict]) -> None:
    """FSDP2 that reshards after forward must read below FSDP2 that keeps the gathered blocks, on every rank."""
    for r, figures in enumerate(memory):
        reshard, keep = figures["fsdp2"]["peak"], figures["fsdp2-no-reshard"]["peak"]
        assert reshard < keep, f"rank {r}: fsdp2 (reshard) peak {reshard:,} B is not below no-reshard's {keep:,} B"


def test_resharding_after_forward_lowers_the_tracked_peak(proofs):
    reshard_saves_memory(proofs[1])


def test_a_planted_always_reshard_is_caught(proofs_dir):
    """Planted in the worker processes after every other figure was taken: fully_shard ignores
    reshard_after_forward=False."""
    memory = [torch.load(proofs_dir / f"planted-{r}.pt") for r in range(WORLD)]
    with pytest.raises(AssertionError, match="is not below no-reshard's"):
        reshard_saves_memory(memory)


@pytest.mark.slow
def test_a_rank_that_raises_ends_the_job_with_its_error_and_leaves_nothing_in_the_temporary_directory(
    tmp_path, monkeypatch
):
    # rank 0 waits in an all-reduce: torchrun must stop it (a hang would end in the timeout's TimeoutExpired)
    temp = tmp_path / "temp"  # the job's TMPDIR: without --log-dir, torchrun leaves a torchelastic_* folder in it
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    done = torchrun("raise", tmp_path, timeout=120)
    assert done.returncode != 0
    assert "planted failure on rank 1" in done.stdout + done.stderr
    assert sorted(p.name for p in temp.iterdir()) == []
    assert (tmp_path / LOG_DIR).is_dir()  # where its logs went instead


def test_the_launch_gives_torchrun_a_log_folder_under_the_jobs_own(tmp_path, monkeypatch):
    """gptcore's launch, read by torchrun's own parser: its log folder is the job's, not a new torchelastic_*
    folder in the system's temporary directory for every job."""
    from torch.distributed.run import get_args_parser

    from gptcore.measure import launch as launching

    seen: list[list[str]] = []

    class Done:  # torchrun exits 0 at once, having written no rank's figures
        returncode = 0

        def __init__(self, cmd: list[str], **_: object) -> None:
            seen.append(cmd)

        def __enter__(self) -> Done:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def communicate(self, timeout: float | None = None) -> tuple[str, None]:
            return "", None

    monkeypatch.setattr(launching.subprocess, "Popen", Done)
    assert launching.launch("cpu-small", ["ddp"], WORLD, "cpu", tmp_path, (1, 1, 1)) == {"ddp": []}
    (cmd,) = seen
    args = get_args_parser().parse_args(cmd[cmd.index("torch.distributed.run") + 1 :])
    assert Path(args.log_dir) == tmp_path / LOG_DIR
    assert args.module and args.training_script == "gptcore.measure.worker"


def test_torchrun_train_prints_once_with_the_world_size(proofs_dir):
    stdout = (proofs_dir / "stdout.txt").read_text()
    summary = [line for line in stdout.splitlines() if line.startswith("cpu-small / ddp")]
    assert len(summary) == 1 and "world size 2" in summary[0], stdout


def test_a_ranks_estimate_starts_from_one_process_at_its_share_of_the_global_batch_under_accumulation():
    """What one rank computes is the single-process step at its share of the global batch (12 rows over 2 ranks:
    6), split into that many micro-batches: its token ids and accumulated gradients, not one micro-batch's."""
    from gptcore.memory import estimate

    cfg, recipe = MODELS["cpu-small"], dataclasses.replace(RECIPES["ddp"], grad_accum_steps=2)
    rank = estimate_per_rank(resolve(cfg, recipe, device="cpu"), 2)
    alone = dataclasses.replace(recipe, parallel=Parallel())
    assert rank.single == estimate(resolve(dataclasses.replace(cfg, batch_size=6), alone, device="cpu"))
    assert rank.single.by_category["other"] == 2 * 8 * 6 * cfg.block_size + 4  # the rank's token ids, the loss


def test_parallel_recipes_validate_and_refuse_what_does_not_work():
    ddp, fsdp2 = Parallel(ddp=DDPOptions()), Parallel(fsdp2=FSDP2Options())
    with pytest.raises(ValueError, match="^parallel: must be a Parallel"):
        Recipe(parallel="tp")
    with pytest.raises(ValueError, match="^parallel: DDP and FSDP2 at once"):
        Parallel(ddp=DDPOptions(), fsdp2=FSDP2Options())
    # an option of one where the other's go (a DDP or FSDP2 option without it cannot be written otherwise)
    with pytest.raises(ValueError, match="^parallel.ddp: must be DDPOptions"):
        Parallel(ddp=FSDP2Options(reshard_after_forward=False))
    with pytest.raises(ValueError, match="^parallel.fsdp2: must be FSDP2Options"):
        Parallel(fsdp2=DDPOptions(gradient_as_bucket_view=True))
    with pytest.raises(ValueError, match="^parallel.ddp.bucket_cap_mb:"):
        DDPOptions(bucket_cap_mb=0)
    with pytest.raises(ValueError, match="^parallel.fsdp2.param_dtype: unknown"):
        FSDP2Options(param_dtype="fp16")
    with pytest.raises(ValueError, match="^parallel.fsdp2.replicate: must be an int >= 1"):  # no group to shard in
        FSDP2Options(replicate=0)
    with pytest.raises(ValueError, match="^optim_in_backward:"):
        Recipe(parallel=ddp, optim_in_backward=True, grad_clip=None)
    with pytest.raises(ValueError, match="^compile:"):
        Recipe(parallel=fsdp2, compile=True)
    with pytest.raises(ValueError, match="^precision:"):
        Recipe(parallel=fsdp2, precision="fp16")
    with pytest.raises(ValueError, match="^precision: parallel.fsdp2.param_dtype already sets"):
        Recipe(parallel=Parallel(fsdp2=FSDP2Options(param_dtype="bf16")), precision="bf16")
    assert tuple(RECIPES[n].parallel.mode for n in ("fp32", "ddp", "fsdp2")) == PARALLELS
    assert RECIPES["ddp"].micro_batch(MODELS["cpu-small"], world_size=2) == 6  # the batch of 12 stays global
    with pytest.raises(ValueError, match="^parallel: the batch of 12 does not split into 5 ranks"):
        RECIPES["ddp"].micro_batch(MODELS["cpu-small"], world_size=5)


def test_a_parallel_recipe_outside_torchrun_is_refused_with_the_command(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(UnsupportedRecipe, match="runs under torchrun"):
        Trainer(MODELS["cpu-small"], RECIPES["fsdp2"], "cpu")
    # the command it gives runs what was asked for: HSDP's 2 replicas of 2 ranks each, not FSDP2 on 2
    with pytest.raises(UnsupportedRecipe, match=r"on a 2-D mesh \(2 replicas\).*--nproc-per-node=4 .*--recipe hsdp$"):
        Trainer(MODELS["cpu-small"], RECIPES["hsdp"], "cpu")
