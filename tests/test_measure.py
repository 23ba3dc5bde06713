"""gptcore.measure.runner: the peak-FLOPs table and MFU, the timer, tokens/s statistics, and run_case on CPU."""

from __future__ import annotations

import dataclasses
import itertools
import resource
import statistics
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gptcore.config import CPU_THREADS, HALF_PRECISIONS
from gptcore.measure import runner as measure
from gptcore.measure import timing
from gptcore.measure.runner import out_of_memory_in, run_case
from gptcore.measure.timing import mfu, peak_flops, throughput, torch_threads
from gptcore.memory import track_training
from gptcore.memory.categories import UNTRACKED
from gptcore.memory.scratch import kernel_scratch
from gptcore.presets import MODELS, RECIPES, STUDIES
from gptcore.training.trainer import Trainer
from tests.helpers import TINY

pytestmark = pytest.mark.cpu

CPU_SMALL = MODELS["cpu-small"]
CHECKPOINTED = dataclasses.replace(RECIPES["fp32"], checkpoint=True)


KNOWN_GPUS = [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
    ("NVIDIA H100 80GB HBM3", "fp32", 67.0),
    ("NVIDIA H100 PCIe", "tf32", 378.0),
    ("NVIDIA H100 NVL", "fp16", 835.5),
    ("NVIDIA H200", "bf16-pure", 989.4),
    ("NVIDIA H200 NVL", "bf16", 835.5),
    ("NVIDIA A100-SXM4-40GB", "fp32", 19.5),
    ("NVIDIA A100 80GB PCIe", "bf16", 312.0),
    ("NVIDIA L4", "bf16", 121.0),
    ("NVIDIA L40S", "tf32", 183.0),
    ("NVIDIA L40", "fp16", 181.0),
    ("NVIDIA GeForce RTX 4090", "fp16", 165.2),
    ("NVIDIA A10G", "bf16", 140.0),
    ("NVIDIA A10", "bf16", 125.0),
]
"""(torch.cuda.get_device_name, a recipe precision, its dense peak TFLOP/s)."""


@pytest.mark.parametrize(("name", "precision", "tflops"), KNOWN_GPUS)
def test_known_gpu_gets_the_peak_of_its_precision(name: str, precision: str, tflops: float) -> None:
    assert peak_flops(name, precision) == pytest.approx(tflops * 1e12)


def test_every_gpu_of_the_peak_table_is_reached_by_its_device_name() -> None:
    """Each row of PEAK_TFLOPS is some device's: the names above reach every one (a pattern shadowed by an earlier
    one, 'l4' before 'l40s', would leave its row unreachable and give that GPU another's peak)."""
    assert {timing.gpu_key(name) for name, _, _ in KNOWN_GPUS} == set(timing.PEAK_TFLOPS)


@pytest.mark.parametrize("name", ["Tesla T4", "NVIDIA GeForce GTX 1080", "AMD Instinct MI300X", "NVIDIA B200"])
def test_unknown_gpu_gets_no_peak_and_no_mfu(name: str) -> None:
    assert peak_flops(name, "bf16") is None
    assert mfu(1e9, 1e5, name, "bf16") is None


def test_mfu_is_achieved_over_peak_flops_and_none_on_cpu() -> None:
    assert mfu(6e8, 1e5, "NVIDIA A100-SXM4-80GB", "bf16") == pytest.approx(6e13 / 312e12)
    assert mfu(6e8, 1e5, None, "fp32") is None


def test_cpu_timer_measures_the_block_on_the_host_clock_and_the_cpu_share(monkeypatch: pytest.MonkeyPatch) -> None:
    wall, cpu = iter([10.0, 12.5]), iter([1.0, 3.5])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(wall))
    monkeypatch.setattr(timing.time, "process_time", lambda: next(cpu))
    monkeypatch.setattr(measure.torch, "get_num_threads", lambda: 2)
    timer = timing.StepTimer("cpu")
    with timer:
        pass
    assert timer.seconds == 2.5
    assert timer.cpu_share == 0.5  # 2.5 s of CPU over 2.5 s x 2 threads: half the cores went elsewhere


def test_throughput_is_the_median_and_iqr_of_tokens_per_second() -> None:
    seconds = [1.0, 2.0, 4.0, 0.5, 1.0, 0.8]
    rates = [1000 / s for s in seconds]
    median, iqr = throughput(seconds, tokens_per_round=1000)
    assert median == pytest.approx(np.median(rates))
    assert iqr == pytest.approx(np.percentile(rates, 75) - np.percentile(rates, 25))


def test_throughput_of_one_round_has_zero_iqr_and_none_is_an_error() -> None:
    assert throughput([0.5], 100) == (200.0, 0.0)
    with pytest.raises(ValueError, match="round_seconds"):
        throughput([], 100)


def test_the_calibration_kernel_is_the_faster_of_its_two_timings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake clock: the first timing 5 s and the second 1 s, then the other way; either way 1 s (a one-off stall
    in one timing is dropped)."""

    for ticks in ([0.0, 5.0, 5.0, 6.0], [0.0, 1.0, 1.0, 6.0]):  # the module's clock only: pytest's stays real
        monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=iter(ticks).__next__))
        assert timing.calibration_kernel() == 1.0


def test_a_cpu_processs_peak_memory_is_its_peak_resident_bytes() -> None:
    """The kernel's high-water mark of this process's resident memory, in bytes: getrusage's ru_maxrss is in KiB on
    Linux. The mark only rises, so the figure lies between two readings of it taken just before and just after, to
    the byte: a figure in KiB or at any other scale falls outside. (A bound from /proc's VmHWM could not be exact:
    getrusage leaves out pages the CPUs have counted but not yet folded in, and keeps a peak inherited from the
    parent process.) The mark holds a 64 MiB tensor this process touched."""
    touched = torch.ones(16 * 2**20)  # 64 MiB, every page written
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak, kind = timing.process_peak_memory(torch.device("cpu"))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert kind == "process RSS" and before <= peak <= after
    assert peak >= touched.numel() * touched.element_size()


def test_a_cpu_processs_peak_memory_is_in_bytes_on_macos_too(monkeypatch) -> None:
    # macOS's getrusage gives ru_maxrss in bytes, Linux's in KiB: one scale for both would be 1,024 times off on one
    usage = SimpleNamespace(ru_maxrss=123_456_789)
    monkeypatch.setattr(timing.resource, "getrusage", lambda who: usage)
    for platform, peak in (("darwin", 123_456_789), ("linux", 123_456_789 * 1024)):
        monkeypatch.setattr(timing.sys, "platform", platform)
        assert timing.process_peak_memory(torch.device("cpu")) == (peak, "process RSS")


@pytest.mark.parametrize("recipe", ["ckpt-fp32", "ckpt-grad-accum-2", "optim-in-bwd", "bf16-pure"])
def test_run_case_cpu_peak_equals_a_tracked_pass_of_its_own_and_tracking_moves_no_loss(recipe: str) -> None:
    # the case's first two steps run under the tracker: the same peak and breakdown, byte for byte, as two tracked
    # steps of a fresh Trainer, and the same loss, bit for bit, as steps that nothing tracked
    m = run_case(TINY, RECIPES[recipe], "cpu", warmup=1, rounds=2, steps_per_round=1, loss_step=4)
    tracked = track_training(Trainer(TINY, RECIPES[recipe], "cpu"), steps=2)
    by_category = dict(m.peak_by_category)
    untracked = by_category.pop(UNTRACKED, 0)  # what only the allocator counted: here, only a kernel's scratch
    assert (m.peak_allocated_bytes - untracked, by_category) == (tracked.peak_bytes, dict(tracked.by_category))
    half = RECIPES[recipe].precision in HALF_PRECISIONS  # oneDNN's, on a CPU with AVX-512 (gptcore.memory.scratch)
    assert untracked <= (kernel_scratch(TINY, RECIPES[recipe]) if half else 0)
    assert m.loss == Trainer(TINY, RECIPES[recipe], "cpu").run(4)[-1]
    assert m.peak_reserved_bytes is None and m.mfu is None  # no allocator reserve and no peak table on CPU
    assert 0 < m.cpu_share


def test_a_cpu_case_runs_on_its_studys_threads_whatever_the_process_has_and_gives_them_back() -> None:
    # a 1-core runner, OMP_NUM_THREADS=1 or a 4-core machine: the case runs on the threads it was recorded on
    seen = []
    step = Trainer.step

    def step_seen(self: Trainer, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return step(self, *args, **kwargs)

    with torch_threads(1), pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "step", step_seen)
        m = run_case(TINY, RECIPES["fp32"], "cpu", warmup=1, rounds=1, steps_per_round=1, threads=CPU_THREADS)
        assert torch.get_num_threads() == 1
    assert m.threads == CPU_THREADS and seen and set(seen) == {CPU_THREADS}


def test_every_cpu_study_pins_its_threads() -> None:
    cpu = [s for s in STUDIES.values() if s.device == "cpu" and s.timing is not None]
    assert cpu and all(s.timing.threads == CPU_THREADS for s in cpu), [s.name for s in cpu]


def test_fewer_rounds_than_the_loss_step_run_the_steps_before_it_untimed_and_read_the_loss_there() -> None:
    """A study reads its loss at a fixed step: a run cut to 1 round (--bench-rounds 1) still reads it at step 6,
    bit for bit the loss of 6 plain steps, not at the step its rounds ended."""
    m = run_case(TINY, RECIPES["fp32"], "cpu", warmup=1, rounds=1, steps_per_round=1, loss_step=6)
    assert (m.loss_step, len(m.round_seconds)) == (6, 1)
    assert m.loss == Trainer(TINY, RECIPES["fp32"], "cpu").run(6)[-1]


def test_run_case_times_the_rounds_apart_from_warmup_and_reads_the_last_loss() -> None:
    calls = []

    def timed_loop(round_fn, rounds: int, between) -> None:
        calls.append(rounds)
        for _ in range(rounds):
            between()
            round_fn()

    # 3 warm-up steps: the 2 whose peak is tracked, and 1 more
    m = run_case(CPU_SMALL, RECIPES["fp32"], "cpu", warmup=3, rounds=3, steps_per_round=2, timed_loop=timed_loop)
    assert calls == [3] and len(m.round_seconds) == 3
    assert m.loss_step == 3 + 3 * 2
    assert m.tokens_per_step == 12 * 64
    # a round is 2 steps' tokens: tokens/s is their median rate
    assert m.tokens_per_s == pytest.approx(2 * 12 * 64 / statistics.median(m.round_seconds), rel=1e-12)
    expected = Trainer(CPU_SMALL, RECIPES["fp32"], "cpu").run(9)[-1]  # same seed, same batches: bit-identical
    assert m.loss == expected


def test_a_case_says_whether_its_flops_are_the_analytic_count_or_the_ledgers() -> None:
    """MFU is taken over the analytic FLOPs (6 x weights + attention) where the step's ledger counted exactly those,
    and over the ledger's count where the step did more: checkpointing recomputes each block's forward in backward."""
    plain = run_case(TINY, RECIPES["fp32"], "cpu", warmup=2, rounds=1, steps_per_round=1)
    recomputed = run_case(TINY, RECIPES["checkpoint"], "cpu", warmup=2, rounds=1, steps_per_round=1)
    assert (plain.flops_source, recomputed.flops_source) == ("analytic", "counted")


def oom_at_step(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Trainer.step raises CUDA's OutOfMemoryError on its ``n``-th call (0-based), and steps as usual before it."""
    step, count = Trainer.step, itertools.count()

    def step_then_oom(self, batch=None):
        if next(count) == n:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return step(self, batch)

    monkeypatch.setattr(Trainer, "step", step_then_oom)


def test_out_of_memory_is_reported_with_the_case_failed_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    oom_at_step(monkeypatch, 4)
    # the two warm-up steps (tracked for the peak on CPU), two rounds of one step, then the fifth step fails
    m = run_case(CPU_SMALL, RECIPES["fp32"], "cpu", warmup=2, rounds=3, steps_per_round=1)
    assert m.error.startswith("out of memory after 4 steps: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert m.tokens_per_s is None and m.loss is None
    assert len(m.round_seconds) == 2  # the rounds before the failure


def test_a_compiled_case_out_of_memory_in_its_rounds_gives_dynamos_record_ring_back(monkeypatch) -> None:
    # the steady CompileWatch enlarges Dynamo's ring of compilation records while it watches; the counted step that
    # normally stops it never runs after an OOM. The compiler itself is not under test: the model runs eagerly.
    from torch._dynamo import utils as dynamo

    kept = dynamo._compilation_metrics.maxlen
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)
    oom_at_step(monkeypatch, 3)
    m = run_case(CPU_SMALL, RECIPES["compile"], "cpu", warmup=2, rounds=3, steps_per_round=1)
    assert m.error.startswith("out of memory after 3 steps")
    assert dynamo._compilation_metrics.maxlen == kept


@pytest.mark.cpu
def test_a_gpu_case_the_estimate_says_cannot_fit_is_skipped_with_the_estimate(monkeypatch):
    from types import SimpleNamespace

    from gptcore.measure.runner import cannot_fit

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: SimpleNamespace(total_memory=80 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H100 80GB HBM3")
    assert cannot_fit(79 * 2**30, "cuda") is None  # fits
    assert cannot_fit(200 * 2**30, "cpu") is None  # CPU memory is not the GPU's
    assert cannot_fit(120 * 2**30, "cuda") == "estimated peak 120.0 GiB exceeds the 80.0 GiB of NVIDIA H100 80GB HBM3"


def test_out_of_memory_while_compiling_is_a_failed_case_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # Dynamo wraps what a compiler raises in BackendCompilerFailed: the OOM is found inside it
    import torch._inductor.compile_fx as compile_fx

    def partition_out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(compile_fx, "min_cut_rematerialization_partition", partition_out_of_memory)
    # torch's config modules are patched with their own context managers (a cached compile skips the partitioner)
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        m = run_case(CPU_SMALL, RECIPES["budget-0.05"], "cpu", warmup=1, rounds=2, steps_per_round=1)
    assert m.error.startswith("out of memory after 0 steps: CUDA out of memory. Tried to allocate 20.00 GiB")
    assert m.tokens_per_s is None and m.round_seconds == []


def test_the_cpu_allocators_failure_is_out_of_memory_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # the CPU allocator raises a plain RuntimeError: a real one, 2**62 bytes (more than any address space holds)
    with pytest.raises(RuntimeError) as failed:
        torch.empty(2**62, dtype=torch.uint8)
    assert out_of_memory_in(failed.value) is failed.value
    step = Trainer.step

    def step_then_cpu_oom(self, batch=None):
        if self.step_count == 3:
            torch.empty(2**62, dtype=torch.uint8)
        return step(self, batch)

    monkeypatch.setattr(Trainer, "step", step_then_cpu_oom)
    m = run_case(CPU_SMALL, RECIPES["fp32"], "cpu", warmup=2, rounds=3, steps_per_round=1)
    assert m.error.startswith("out of memory after 3 steps: [enforce fail at"), m.error
    assert "DefaultCPUAllocator: can't allocate memory" in m.error and m.loss is None


def test_an_error_that_is_not_out_of_memory_is_raised() -> None:
    assert out_of_memory_in(RuntimeError("boom")) is None
    oom = torch.OutOfMemoryError("x")
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = oom
    assert out_of_memory_in(wrapped) is oom


def test_a_cpu_bf16_case_takes_four_steps_its_ledger_step_the_loss_step_and_every_other_case_keeps_its_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gptcore.config import Timing

    study = Timing(warmup=2, rounds=3, steps_per_round=2, loss_step=8, speed_rounds=11)
    bf16 = study.on(RECIPES["ckpt-bf16"], "cpu")
    # the two tracked warm-up steps (the peak), one timed round of one step, then the ledger's step, whose loss is
    # read: step 4, as before the ledger's step was the loss step
    assert (bf16.warmup, bf16.rounds, bf16.steps_per_round, bf16.loss_step) == (2, 1, 1, 4)
    speed = study.on(RECIPES["ckpt-bf16"], "cpu", speed=True)  # --cpu-speed times the study's rounds
    assert (speed.rounds, speed.steps_per_round, speed.loss_step, speed.speed_rounds) == (3, 2, 4, 11)
    assert study.on(RECIPES["bf16-pure"], "cpu").loss_step == 4
    assert study.on(RECIPES["ckpt-fp32"], "cpu") is study and study.on(RECIPES["ckpt-bf16"], "cuda") is study
    to_the_end = Timing(warmup=2, rounds=3, steps_per_round=2)  # no loss step: the loss of the last step is read
    assert to_the_end.on(RECIPES["ckpt-bf16"], "cpu") is to_the_end
    steps = []
    step = Trainer.step
    monkeypatch.setattr(Trainer, "step", lambda self, batch=None: steps.append(1) or step(self, batch))
    m = run_case(
        TINY,
        RECIPES["ckpt-bf16"],
        "cpu",
        warmup=bf16.warmup,
        rounds=bf16.rounds,
        steps_per_round=bf16.steps_per_round,
        loss_step=bf16.loss_step,
    )
    assert len(steps) == 4 and m.loss_step == 4 and len(m.round_seconds) == 1 and m.work is not None
    monkeypatch.setattr(Trainer, "step", step)
    # the loss of the ledger's step, counted under its modes, is that of a plain fourth step, bit for bit
    assert m.loss == Trainer(TINY, RECIPES["ckpt-bf16"], "cpu").run(4)[-1]
    assert m.peak_allocated_bytes > 0
