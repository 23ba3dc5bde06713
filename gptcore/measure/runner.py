"""One benchmark case measured: timing (gptcore.measure.timing), peak memory, tokens/s and MFU.

A case is (GPTConfig, Recipe, device): :class:`CaseRunner` builds a fresh Trainer and runs the warm-up steps
(compile and optimizer-state creation happen there, timed apart), then each call of :meth:`CaseRunner.round`
times ``steps_per_round`` optimizer steps. :func:`run_case` strings it together; a benchmark hands ``round`` to
``benchmark.pedantic`` instead of the plain loop so that pytest-benchmark keeps its own statistics too.

Peak memory: on CUDA the caching allocator's peaks over the timed rounds (stats reset after the warm-up). On CPU
the CPU allocator's own count over the case's first two steps (:mod:`gptcore.measure.cpu_peak`), the first steps
of its warm-up, so that measuring never slows the timed steps and costs no steps of its own. It sees compiled code
too; an eager case has the tracker's breakdown beside it. The figure is exact and deterministic: the same as a
pass of its own on a fresh Trainer (``cpu_peak_bytes``), byte for byte.
"""

from __future__ import annotations

import gc
import re
import statistics
import time
from collections.abc import Callable

import torch

from gptcore.config import HALF_PRECISIONS, GPTConfig, Recipe, setup_of
from gptcore.measure import trace
from gptcore.measure.clocks import BUSY_SHARE, Clocks, Sample, open_clocks
from gptcore.measure.clocks import summary as clock_summary
from gptcore.measure.cpu_peak import TRACKED_STEPS, cpu_peak, measured_steps
from gptcore.measure.measurement import Measurement
from gptcore.measure.timing import CALIBRATION_SPREAD, StepTimer, calibration_kernel, mfu, throughput, torch_threads
from gptcore.measure.work import CompileWatch, compile_stats, counted_step
from gptcore.memory import allocator
from gptcore.memory.scratch import kernel_scratch

# -- one case ------------------------------------------------------------------------------------------------------


class CaseRunner:
    """A fresh Trainer for one case: ``prepare()`` builds and warms it up, ``round()`` times K steps,
    ``finish()`` returns the Measurement."""

    def __init__(
        self,
        cfg: GPTConfig,
        recipe: Recipe,
        device: torch.device | str,
        *,
        warmup: int,
        steps_per_round: int,
        gpu_clocks: Clocks | None = None,
        loss_step: int | None = None,
    ) -> None:
        if warmup < 0 or steps_per_round < 1:
            raise ValueError(f"warmup must be >= 0 and steps_per_round >= 1, got {warmup}, {steps_per_round}")
        self.cfg, self.recipe, self.device = cfg, recipe, torch.device(device)
        self.warmup, self.steps_per_round, self.loss_step = warmup, steps_per_round, loss_step
        self.loss_at: torch.Tensor | float | None = None  # the loss of step ``loss_step``, kept on the device (no
        # sync; a float when read during the tracked steps, where holding a tensor would add its bytes to the peak)
        self.trainer = None
        self.steady: CompileWatch | None = None  # compiled recipes: what the steps after the warm-up compile
        self._tracked = False  # the peak was tracked over the first warm-up steps
        self.timer = StepTimer(self.device)
        self.gpu_clocks = gpu_clocks or open_clocks(self.device)
        self._traced_clock: Sample | None = None  # NVML's reading while the busy time's traced step ran
        self._samples: list[Sample] = []
        self.last_loss: torch.Tensor | None = None
        self._shares: list[float] = []
        self.m = Measurement(
            device=str(self.device),
            tokens_per_step=recipe.tokens_per_step(cfg),
            steps_per_round=steps_per_round,
            threads=torch.get_num_threads(),
            setup=setup_of(cfg, recipe),
        )

    def prepare(self) -> None:
        """Build the Trainer and run the warm-up steps; then reset the CUDA peak-memory stats. On CPU the first
        ``TRACKED_STEPS`` steps are measured for the peak (a warm-up of at least that many). Raises
        ``allocator.Unavailable`` where the CPU allocator cannot be counted."""
        from gptcore.training.trainer import Trainer

        if self.device.type == "cpu":
            allocator.load()  # built and loaded before anything runs: a case that cannot count fails at once
            if self.recipe.compile and self.recipe.precision in HALF_PRECISIONS and self.recipe.parallel.mode == "none":
                # before the case's own Trainer, which seeds torch again: the probe's step changes nothing it draws
                self.m.kernel_scratch_bytes = kernel_scratch(self.cfg, self.recipe)
                gc.collect()
        elif self.device.type == "cuda":  # what an earlier case left allocated is in this case's peak: the gate says so
            gc.collect()
            torch.cuda.empty_cache()
            trace.start_once(self.device)  # the profiler's first use in the process, before any CUDA graph is captured
            self.m.allocated_before = torch.cuda.memory_allocated(self.device)
        with compile_stats() as self.compiled:  # compilation happens while building and warming up
            t0 = time.perf_counter()
            self.trainer = Trainer(self.cfg, self.recipe, self.device)
            self.m.setup_seconds = time.perf_counter() - t0
            t0 = time.perf_counter()
            steps = self.warmup
            # under FSDP2 the tracker follows the storage resizes of the gathered parameters, which the tracked
            # ranks' arithmetic does not survive (measured: a NaN loss), so several ranks track a Trainer of their
            # own in finish()
            if self.device.type == "cpu" and self.trainer.rank.world_size == 1:
                self.m.peak_allocated_bytes, self.m.peak_by_category, self.m.kept_bytes = measured_steps(
                    self.trainer, TRACKED_STEPS, self._tracked_step
                )
                self._tracked = True
                steps -= TRACKED_STEPS
            for _ in range(steps):
                self._step()
        self.steady = CompileWatch() if self.recipe.compile else None  # the timed rounds and the steps after them
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.m.warmup_seconds = time.perf_counter() - t0

    def round(self) -> None:
        """One timed round of ``steps_per_round`` optimizer steps; the loss stays on the device."""
        with self.timer:
            for _ in range(self.steps_per_round):
                self._step()
            if self.gpu_clocks is not None:  # while the round's work still runs: before the timer's one sync
                self._samples.append(self.gpu_clocks.sample())
        self.m.round_seconds.append(self.timer.seconds)
        if self.timer.cpu_share is not None:
            self._shares.append(self.timer.cpu_share)

    def calibrate(self) -> None:
        """CPU: time the calibration kernel (before each round, outside its timing)."""
        if self.device.type == "cpu":
            self.m.calibration_seconds.append(calibration_kernel())

    def _tracked_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        """A step under the tracker that keeps no tensor of its own alive (the peak is the step's alone)."""
        loss = self.trainer.step(batch)
        if self.trainer.step_count == self.loss_step:
            self.loss_at = loss.item()  # CPU only: no sync to avoid

    def _step(self) -> None:
        self.last_loss = self.trainer.step()
        if self.trainer.step_count == self.loss_step:
            self.loss_at = self.last_loss

    def _sampled_step(self) -> None:
        """A step of the busy time's trace, its clocks sampled while its work runs, as a timed round's are: the last
        sample is the traced step's (gptcore.measure.trace traces a warm-up step before it)."""
        self.trainer.step()
        if self.gpu_clocks is not None:
            self._traced_clock = self.gpu_clocks.sample()

    def out_of_memory(self, err: BaseException) -> None:
        """Record an OOM with what was allocated at the time (call inside the ``except``)."""
        where = f"after {self.trainer.step_count} steps" if self.trainer is not None else "while building"
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else "out of memory"
        self.m.error = f"out of memory {where}: {first_line}"
        if self.device.type == "cuda":
            self.m.peak_allocated_bytes = torch.cuda.max_memory_allocated(self.device)
            self.m.peak_reserved_bytes = torch.cuda.max_memory_reserved(self.device)
            self.m.error += f" (allocated {torch.cuda.memory_allocated(self.device) / 2**30:.2f} GiB)"

    def finish(self) -> Measurement:
        """Read the final loss and the peaks, free the Trainer, and return the Measurement."""
        m, trainer = self.m, self.trainer
        if m.error is None:
            if m.round_seconds:
                m.tokens_per_s, m.tokens_per_s_iqr = throughput(
                    self._trusted_rounds(), m.tokens_per_step * self.steps_per_round
                )
            if self._shares:
                m.cpu_share = statistics.median(self._shares)
                self._judge_quiet()
            while self.loss_step is not None and trainer.step_count < self.loss_step - 1:  # fewer rounds than
                self._step()  # the loss step: the steps before it, untimed
            if self.device.type == "cuda":
                m.peak_allocated_bytes = torch.cuda.max_memory_allocated(self.device)
                m.peak_reserved_bytes = torch.cuda.max_memory_reserved(self.device)
            last = trainer.step_count
            self._count_work()  # one step more, eager: the loss step where that is the next (tests/test_measure.py)
            loss = self.loss_at if self.loss_step is not None else self.last_loss
            if loss is not None:
                m.loss = float(loss) if isinstance(loss, float) else float(loss.item())
            m.loss_step = self.loss_step if self.loss_step is not None else last
            if m.error is None:  # GPU: two steps more, traced (a warm-up, then the one read), after every other figure
                timeline = trace.step_timeline(self._sampled_step, self.device)
                if timeline is not None:
                    m.gpu_busy_seconds, m.gpu_kernel_seconds = timeline.busy_seconds, timeline.by_kind
                    if m.clocks is not None and self._traced_clock is not None:  # the clock its kernels ran at
                        m.clocks["traced_sm_mhz"] = self._traced_clock.sm_mhz
                m.error = trace.beyond_step(m.gpu_busy_seconds, max(m.round_seconds, default=0) / self.steps_per_round)
        if self.steady is not None:  # a case that ran out of memory in its rounds gives Dynamo's record ring back too
            self.steady.stop()
        self.trainer = self.last_loss = trainer = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        elif m.error is None and not self.recipe.compile and not self._tracked:  # several ranks: a pass of its own
            report = cpu_peak(self.cfg, self.recipe)
            m.peak_allocated_bytes, m.peak_by_category = report.peak_bytes, dict(report.by_category)
        return m

    def _judge_quiet(self) -> None:
        """CPU: the calibrated step cost, and whether the machine was quiet enough to record tokens/s."""
        m, cal = self.m, self.m.calibration_seconds
        stray = 0.0
        if cal:  # a timed loop that calls ``calibrate`` before each round
            m.calibrated_cost = statistics.median(t / self.steps_per_round / c for t, c in zip(m.round_seconds, cal))
            middle = statistics.median(cal)
            stray = max(abs(c / middle - 1) for c in cal)
        share = min(self._shares)
        if share < BUSY_SHARE and self.trainer.rank.world_size > 1:  # a rank's own share also drops while it
            # waits on the other ranks' collectives: an idle machine cannot be told from a busy one
            m.speed_note = (
                f"speed not recorded: share {share:.2f} (ranks waiting on each other's collectives, or a busy machine)"
            )
        elif share < BUSY_SHARE:
            m.speed_note = f"speed not recorded: machine busy (share {share:.2f})"
        elif stray > CALIBRATION_SPREAD:
            m.speed_note = f"speed not recorded: machine busy (calibration kernel {stray:.0%} off its median)"

    def _trusted_rounds(self) -> list[float]:
        """The rounds that count for tokens/s: those not run below the GPU's clocks (all where nothing was
        sampled); more than half flagged makes the case "machine unfit"."""
        m, samples = self.m, self._samples
        if not samples:
            return m.round_seconds
        why = {i: self.gpu_clocks.flag(s) for i, s in enumerate(samples)}
        m.flagged_rounds = [i for i, w in why.items() if w]
        m.round_clocks = [
            {"seconds": t} | s.to_json() | ({"flag": why[i]} if why[i] else {})
            for i, (t, s) in enumerate(zip(m.round_seconds, samples))
        ]
        m.clocks = clock_summary(samples, m.flagged_rounds, self.gpu_clocks.default_sm_mhz)
        if 2 * len(m.flagged_rounds) > len(samples):
            reasons = sorted({w for w in why.values() if w})
            m.unfit = (
                f"machine unfit: {len(m.flagged_rounds)} of {len(samples)} rounds ran below the GPU's clocks "
                f"({'; '.join(reasons)})"
            )
        kept = [t for i, t in enumerate(m.round_seconds) if i not in m.flagged_rounds]
        return kept or m.round_seconds

    def _count_work(self) -> None:
        """The work ledger of one more step (after the peaks are read; the loss step itself where that is the next
        step, whose loss is then read from it), and MFU from its FLOPs where they differ from the analytic formula."""
        trainer, m = self.trainer, self.m
        steady = self.steady.stop() if self.steady else None  # a steady step compiles nothing; stopped here, before
        try:  # the counted step (under its modes Dynamo compiles nothing), so that Dynamo's record ring is given back
            ledger, loss = counted_step(trainer)
            if trainer.step_count == self.loss_step:
                self.loss_at = loss
        except Exception as err:  # only an OOM is handled
            if (oom := out_of_memory_in(err)) is None:
                raise
            self.out_of_memory(oom)
            return
        if steady is not None:  # the warm-up's, and what the steps since compiled
            ledger.compile = self.compiled + steady
        m.work = ledger.to_json()
        analytic = trainer.model.flops_per_token()
        counted = sum(ledger.flops.values()) // m.tokens_per_step
        m.flops_source = "analytic" if counted == analytic else "counted"
        if self.device.type == "cuda" and m.tokens_per_s is not None:
            m.mfu = mfu(
                analytic if counted == analytic else counted,
                m.tokens_per_s,
                torch.cuda.get_device_name(self.device),
                self.recipe.precision,
            )


TimedLoop = Callable[[Callable[[], None], int, Callable[[], None]], None]
"""timed_loop(round_fn, rounds, between): run ``round_fn`` ``rounds`` times, ``between`` before each, untimed."""


def _plain_loop(round_fn: Callable[[], None], rounds: int, between: Callable[[], None]) -> None:
    for _ in range(rounds):
        between()
        round_fn()


CPU_OUT_OF_MEMORY = re.compile(r"DefaultCPUAllocator: (can't allocate memory|not enough memory)")
"""What torch's CPU allocator says when malloc fails: a plain RuntimeError, not an OutOfMemoryError."""


def out_of_memory_in(err: BaseException) -> BaseException | None:
    """The out-of-memory error that ``err`` is or wraps, or None: CUDA's OutOfMemoryError, or the CPU allocator's
    RuntimeError. Dynamo wraps what a compiler raises (an OOM while compiling or autotuning) in
    BackendCompilerFailed, which keeps it as ``inner_exception``; causes count too."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, torch.OutOfMemoryError) or (
            isinstance(err, RuntimeError) and CPU_OUT_OF_MEMORY.search(str(err))
        ):
            return err
        seen.add(id(err))
        err = getattr(err, "inner_exception", None) or err.__cause__
    return None


def run_case(
    cfg: GPTConfig,
    recipe: Recipe,
    device: torch.device | str,
    *,
    warmup: int,
    rounds: int,
    steps_per_round: int,
    timed_loop: TimedLoop | None = None,
    loss_step: int | None = None,
    threads: int | None = None,
) -> Measurement:
    """Measure one case: warm-up, then ``rounds`` timed rounds of ``steps_per_round`` steps through
    ``timed_loop(round_fn, rounds, between)`` (default: a plain loop; a benchmark passes benchmark.pedantic with
    ``between`` as its untimed setup), on ``threads`` intra-op threads (None: the process's; restored after). An OOM
    anywhere is caught: the Measurement carries ``error`` and what was allocated, and memory is freed."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    t0 = time.perf_counter()
    with torch_threads(threads):
        runner = CaseRunner(cfg, recipe, device, warmup=warmup, steps_per_round=steps_per_round, loss_step=loss_step)
        try:
            runner.prepare()
            (timed_loop or _plain_loop)(runner.round, rounds, runner.calibrate)
        except allocator.Unavailable as err:  # a CPU case without its peak: failed, in one line
            runner.m.error = str(err)
        except Exception as err:  # only an OOM, also one raised while compiling, is handled
            if (oom := out_of_memory_in(err)) is None:
                raise
            runner.out_of_memory(oom)
        m = runner.finish()  # outside the except: the traceback (and the tensors its frames hold) is gone
    m.case_seconds = time.perf_counter() - t0
    return m


def cannot_fit(estimate: int | str, device: str) -> str | None:
    """Why a GPU case cannot fit in the device's memory by its estimated peak (bytes), so that it is skipped with the
    estimate instead of crashing into OOM; None where it fits, or on CPU (the GPU's memory is not the host's)."""
    if device != "cuda" or not isinstance(estimate, int):
        return None
    total = torch.cuda.get_device_properties(0).total_memory
    if estimate <= total:
        return None
    return (
        f"estimated peak {estimate / 2**30:.1f} GiB exceeds the {total / 2**30:.1f} GiB of "
        f"{torch.cuda.get_device_name()}"
    )
