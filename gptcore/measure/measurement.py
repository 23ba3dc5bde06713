"""What one benchmark case measured (:class:`Measurement`): the figures a runner fills in and the gate judges. No
torch here: a job's ranks are combined, and a results log read, without it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Measurement:
    """What one benchmark case measured. Bytes are None where the device has no such figure (reserved on CPU)."""

    device: str
    tokens_per_step: int
    steps_per_round: int
    round_seconds: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    """Median over the timed rounds."""
    tokens_per_s_iqr: float | None = None
    setup_seconds: float = 0.0
    """Building the Trainer (model, optimizer)."""
    warmup_seconds: float = 0.0
    """Warm-up steps: compile and optimizer-state creation happen here, never in the timed rounds."""
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_by_category: dict[str, int] | None = None
    """What was live at the peak, by category (CPU: from the tracked warm-up; None on a GPU, whose allocator has no
    categories)."""
    kernel_scratch_bytes: int | None = None
    """CPU, a compiled half-precision case: the most bytes one op held inside itself in an eager step at the same
    shapes (gptcore.memory.scratch), the most of its peak that this CPU's matmul kernels may hold. An eager case's
    tracker names the bytes instead (its breakdown's 'untracked')."""
    kept_bytes: int | None = None
    """CPU: the bytes the second measured step left allocated beyond the first's: a leak when above 0."""
    loss: float | None = None
    """Loss of the last timed optimizer step."""
    loss_step: int = 0
    """Optimizer steps taken when the loss was read (warm-up included)."""
    mfu: float | None = None
    flops_source: str | None = None
    """Where MFU's FLOPs come from: 'analytic' (6N + attention) or 'counted' (the work ledger's, where they
    differ: checkpointing's recomputation, a padded vocabulary)."""
    work: dict | None = None
    """The work ledger of one steady-state step (gptcore.measure.work.WorkLedger.to_json), from a pass apart from the
    timed rounds."""
    threads: int = 0
    cpu_share: float | None = None
    """CPU only: median over rounds of the process's CPU time / (wall time x threads); below ~0.9 the machine was
    busy with something else and tokens/s says little (see StepTimer)."""
    gpu_busy_seconds: float | None = None
    """GPU only: the device's busy time over a step traced after a warm-up one, apart from the timed rounds (the
    union of its kernels' intervals on the device timeline, gptcore.measure.trace): what a slower host cannot move."""
    gpu_kernel_seconds: dict[str, float] | None = None
    """GPU only: that traced step's kernel time summed by kind of kernel (gptcore.measure.trace.KINDS)."""
    error: str | None = None
    """Set when the case failed (out of memory), with what was allocated at the time."""
    case_seconds: float = 0.0
    """Wall time of the whole case: building, warm-up (tracked on CPU), timed rounds, the ledger pass."""
    round_clocks: list[dict] | None = None
    """GPU only: each timed round's seconds and its NVML sample, taken while its work ran
    (gptcore.measure.clocks.Sample), with its ``flag`` where the round was flagged; kept in the results log."""
    flagged_rounds: list[int] | None = None
    """GPU only: the rounds run below the GPU's clocks (throttled); the tokens/s median leaves them out."""
    clocks: dict | None = None
    """GPU only: the clocks of the unflagged rounds (gptcore.measure.clocks.summary) and ``traced_sm_mhz``, the SM
    clock of the step traced for the busy time; recorded with a baseline."""
    unfit: str | None = None
    """Set when more than half of the rounds were flagged: the machine could not run the case at its clocks."""
    allocated_before: int | None = None
    """GPU only: the bytes of live tensors when the case began, after a collection: what an earlier case left, which
    the peak includes (the CUDA libraries' workspaces are a few MiB of it)."""
    calibration_seconds: list[float] = field(default_factory=list)
    """CPU only: a fixed fp32 matmul (:func:`calibration_kernel`) timed before each round, outside its timing."""
    calibrated_cost: float | None = None
    """CPU only: the median over rounds of one step's time / the calibration kernel's time beside it."""
    setup: dict | None = None
    """The case's model (its batch as run) and recipe as flat fields (gptcore.config.fields.setup_of)."""
    speed_note: str | None = None
    """CPU only: why this tokens/s is not to be recorded ('speed not recorded: machine busy (share 0.33)'): some
    round had less than BUSY_SHARE of the CPU, or the calibration kernel strayed more than CALIBRATION_SPREAD
    from its median. None: quiet, recorded."""

    def left_out(self) -> str | None:
        """The rounds the tokens/s median left out and why, for the line under the end table: 'tokens/s over 6 of 7
        rounds, the rest ran below the GPU's clocks (round 4: thermal (hardware))'; None where it left none out."""
        if not self.flagged_rounds:
            return None
        why = "; ".join(f"round {i + 1}: {c['flag']}" for i, c in enumerate(self.round_clocks or []) if "flag" in c)
        kept = len(self.round_seconds) - len(self.flagged_rounds)
        said = f"tokens/s over {kept} of {len(self.round_seconds)} rounds, the rest ran below the GPU's clocks"
        return said + (f" ({why})" if why else "")

    def to_dict(self) -> dict:
        return asdict(self)
