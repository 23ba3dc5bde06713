"""The schema of a baseline entry: the device's ``Tolerances`` and an ``Entry`` per case (its figures, its loss
references per CPU model, its work ledger, a convergence run), each read with errors that name the file and the
field. The files that hold them are ``gptcore.gate.baselines``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gptcore.config import HALF_PRECISIONS, setup_differences
from gptcore.measure.convergence import Convergence
from gptcore.memory.categories import COMPILED_STEP, UNTRACKED

if TYPE_CHECKING:
    from gptcore.measure.work import WorkLedger

SCHEMA_VERSION = 2
AMP_PRECISIONS = ("fp16", "bf16", "bf16-pure")
VAL_LOSS_TOLERANCE = 0.025
"""How much worse than its baseline a convergence case's final validation loss may be (nats): what reseeding moves
it by. Measured (scripts/convergence_spread.py, kept in tests/data/convergence_spread_cpu.json): cpu-small under
the five CPU-shape recipes at 2,000 steps and ckpt-fp32 at CI's 400, 3 seeds each (weights, dropout and batch
order; the evaluation batches fixed): ranges 0.0018-0.0195, pooled standard deviation 0.0058 (12 degrees of
freedom). Two runs of different seeds then differ with a standard deviation of 0.0058 x sqrt(2) = 0.0082: 3 of
those is 0.0245. On the CPU model that recorded a case the run is bit-identical (one thread), so only a change of
the arithmetic moves it; another CPU model's rounding moves it by less than a reseed."""


GPU_BUSY_TOLERANCE = 0.03
"""Provisional, until a GPU session's ``verify`` measures the busy time's noise (scripts/gpu_noise.py then gives each
study its own): the issue's target for the host-bound case (deep-1.6b in pure bf16), 3%. A kernel's duration on a GPU
is set by the work and the clocks, not by the host; a run below its baseline's clocks is not gated (CLOCK_TOL), so
what is left is the device's own spread. The nearest evidence: on an H200 the ladder's device-bound rungs, whose
step time is mostly kernel time, moved by at most 1.69% in tokens/s between two runs on one host, and by -0.7% to
+3.0% on a second host."""


class BaselineError(ValueError):
    """A baseline file that cannot be used; the message names the file and the field."""


# -- schema ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerances:
    """Relative tolerances for memory and speed, absolute (nats) for the loss."""

    memory: float = 0.02
    """Peak allocated bytes fail above baseline x (1 + memory)."""
    speed: float | None = 0.05
    """tokens/s fail below baseline x (1 - speed); None: reported, not gated (the CPU default)."""
    loss: float = 1e-3
    """|loss - baseline| for fp32/tf32 recipes."""
    loss_amp: float = 2e-2
    """|loss - baseline| for fp16/bf16 recipes."""
    loss_other_cpu: float | None = None
    """|loss - baseline| for fp32 when the baseline was recorded on another CPU model (None: ``loss``)."""
    loss_amp_other_cpu: float | None = None
    """|loss - baseline| for fp16/bf16 when the baseline was recorded on another CPU model (None: ``loss_amp``)."""
    work: float = 0.0
    """Relative tolerance of the work ledger's counts: 0, exact (they are the same on every CPU, thread count and
    instruction set)."""
    val_loss: float = VAL_LOSS_TOLERANCE
    """A convergence case's final validation loss fails above baseline + this (nats); see VAL_LOSS_TOLERANCE."""
    gpu_busy: float | None = GPU_BUSY_TOLERANCE
    """The GPU busy time of a step fails above baseline x (1 + gpu_busy); None: not gated (CPU has no figure)."""

    @classmethod
    def default_for(cls, device_type: str) -> Tolerances:
        """CPU: memory exact (2% kept as the one memory rule); tokens/s not gated (a shared 2-core machine varies
        1.5-2x with no sign of it inside the process; opt in with --speed-tol); the loss from what runs actually
        differ by. On one CPU model, repeated runs are bit-identical and 1 vs 2 threads moved fp32 by at most
        2.4e-7 (1 ulp) and bf16 by 1.6e-4: 1e-6 and 5e-4. Between CPU models (AMD EPYC vs an AMX Xeon) fp32 moved
        by up to 2.9e-5 and bf16 by 5.3e-3: 1e-4 and 2e-2."""
        if device_type == "cpu":
            return cls(
                memory=0.02,
                speed=None,
                loss=1e-6,
                loss_amp=5e-4,
                loss_other_cpu=1e-4,
                loss_amp_other_cpu=2e-2,
                gpu_busy=None,
            )
        return cls()

    def loss_tolerance(self, precision: str, other_cpu: bool) -> float:
        """The loss tolerance for a recipe precision, wider when the baseline comes from another CPU model."""
        amp = precision in AMP_PRECISIONS
        wide = self.loss_amp_other_cpu if amp else self.loss_other_cpu
        return wide if other_cpu and wide is not None else self.loss_amp if amp else self.loss

    def validate(self, where: str) -> None:
        """BaselineError where a tolerance is out of range; ``where`` names the file and the object, as
        ``baselines/x.json: tolerances``."""
        optional = ("speed", "loss_other_cpu", "loss_amp_other_cpu", "gpu_busy")
        for name in ("memory", "loss", "loss_amp", "work", "val_loss", *optional):
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            # NaN compares false with every bound: it would pass every figure, the gate off without a word
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
                raise BaselineError(f"{where}.{name}: must be a finite number >= 0, got {value!r}")
        for name in ("speed", "gpu_busy"):
            if getattr(self, name) is not None and getattr(self, name) > 1:
                raise BaselineError(f"{where}.{name}: must be in [0, 1], got {getattr(self, name)}")


@dataclass
class Entry:
    """One benchmark's figures (measured now, or recorded in a baseline file)."""

    tokens_per_s: float | None
    tokens_per_s_iqr: float | None
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    loss: float | None
    loss_step: int
    precision: str = "fp32"
    cpu_model: str | None = None
    cpu_share: float | None = None
    work: WorkLedger | None = None
    recorded_at: str | None = None
    commit: str | None = None
    torch: str | None = None
    """The torch version the entry was measured under (None in entries recorded before it was kept: their file's
    ``torch`` is the best guess); an operator renamed between two releases is named, not failed
    (gptcore.gate.operators)."""
    loss_by_cpu: dict[str, float] = field(default_factory=dict)
    """The loss at ``loss_step`` on other CPU models (the recording model's is ``loss``)."""
    peak_by_category: dict[str, int] | None = None
    """What was live at the peak by category (the CPU tracker's), to say where a memory change is."""
    estimate_by_category: dict[str, int] | None = None
    """The memory estimate's peak by category (any device), the same where the device has no tracker."""
    kernel_scratch_bytes: int | None = None
    """CPU, a compiled half-precision case: the most of its peak that this CPU's matmul kernels may hold
    (gptcore.memory.scratch); None elsewhere."""
    kept_bytes: int | None = None
    """CPU: the bytes the second measured step left allocated beyond the first's (a steady step keeps none)."""
    convergence: Convergence | None = None
    """A convergence case's whole run (validation curve, time-to-loss); None for a benchmark case."""
    seconds: float | None = None
    """Wall time of the case (warm-up, timed rounds, the ledger pass): how --deadline plans it."""
    speed_note: str | None = None
    """CPU: why tokens/s was not recorded ('speed not recorded: machine busy (share 0.33)'); its median is null."""
    clocks: dict[str, Any] | None = None
    """GPU only: the clocks the timed rounds ran at (gptcore.measure.clocks.summary), and ``traced_sm_mhz``, the SM
    clock of the step traced for the busy time (absent before it was sampled), to tell a run at other clocks from a
    code change."""
    gpu_busy_seconds: float | None = None
    """GPU only: the device's busy time over one step (gptcore.measure.trace); absent from older baseline files."""
    gpu_kernel_seconds: dict[str, float] | None = None
    """GPU only: that step's kernel time by kind of kernel (gptcore.measure.trace.KINDS), to name what moved."""
    setup: dict[str, Any] | None = None
    """The case's model and recipe as flat fields (gptcore.config.fields): an entry of another setup is no baseline
    for the case; absent from entries recorded before it was kept."""

    @classmethod
    def from_measurement(
        cls, m: Any, *, precision: str, cpu_model: str | None, estimate_by_category: dict[str, int] | None = None
    ) -> Entry:
        """The entry of a ``gptcore.measure.runner.Measurement`` (or anything with its fields, such as a run's
        extra_info as a namespace); ``cpu_model`` is recorded on CPU only."""
        from gptcore.measure.work import WorkLedger

        busy = getattr(m, "speed_note", None) if m.device.startswith("cpu") else None
        unfit = getattr(m, "unfit", None)  # a GPU that could not hold its clocks: its speed is no reference either
        return cls(
            tokens_per_s=m.tokens_per_s,
            tokens_per_s_iqr=m.tokens_per_s_iqr,
            peak_allocated_bytes=m.peak_allocated_bytes,
            peak_reserved_bytes=m.peak_reserved_bytes,
            loss=m.loss,
            loss_step=m.loss_step,
            precision=precision,
            cpu_model=cpu_model if m.device.startswith("cpu") else None,
            cpu_share=m.cpu_share,
            work=WorkLedger.from_json(m.work) if m.work else None,
            peak_by_category=m.peak_by_category,
            estimate_by_category=estimate_by_category,
            kernel_scratch_bytes=getattr(m, "kernel_scratch_bytes", None),
            kept_bytes=getattr(m, "kept_bytes", None),
            seconds=getattr(m, "case_seconds", None) or None,
            clocks=getattr(m, "clocks", None),
            gpu_busy_seconds=getattr(m, "gpu_busy_seconds", None),
            gpu_kernel_seconds=getattr(m, "gpu_kernel_seconds", None) or None,
            setup=getattr(m, "setup", None),
            speed_note=busy or (f"speed not recorded: {unfit}" if unfit else None),
        )

    @classmethod
    def from_convergence(cls, run: Convergence | None, *, device: str, precision: str, cpu_model: str | None) -> Entry:
        """The entry of a convergence run (``run`` None: the case failed); ``cpu_model`` is recorded on CPU only.
        No step loss nor memory: such a case is judged on what it learned."""
        return cls(
            tokens_per_s=run and run.tokens_per_s,
            tokens_per_s_iqr=None,
            peak_allocated_bytes=None,
            peak_reserved_bytes=None,
            loss=None,
            loss_step=run.steps[-1] if run else 0,
            precision=precision,
            cpu_model=cpu_model if device.startswith("cpu") else None,
            convergence=run,
        )

    def setup_changes(self, recorded: Entry | None) -> list[str]:
        """The fields in which this entry's setup differs from ``recorded``'s ('recipe.fit_memory None -> 0.85'); none
        where either has no setup (an entry recorded before setups were kept)."""
        if recorded is None or not self.setup or not recorded.setup:
            return []
        return setup_differences(recorded.setup, self.setup)

    @property
    def eager_breakdown(self) -> bool:
        """The peak has the CPU tracker's breakdown: an eager single-process CPU case."""
        return eager_breakdown(self.peak_by_category)

    def kernel_free_peak(self) -> int | None:
        """The peak without what the matmul kernels held at it (:func:`kernel_free_peak`)."""
        return kernel_free_peak(
            self.peak_allocated_bytes, self.precision, self.cpu_model, self.peak_by_category, self.kernel_scratch_bytes
        )

    def loss_reference(self, cpu_model: str | None) -> tuple[float | None, str | None]:
        """The loss to hold a run on ``cpu_model`` to, and the CPU model it was measured on: that model's own
        reference when there is one, else the recorded loss (and the model that recorded it)."""
        if cpu_model is not None and cpu_model in self.loss_by_cpu:
            return self.loss_by_cpu[cpu_model], cpu_model
        return self.loss, self.cpu_model

    def to_json(self) -> dict:
        return {
            "tokens_per_s": {"median": self.tokens_per_s, "iqr": self.tokens_per_s_iqr}
            | ({"not_recorded": self.speed_note} if self.speed_note else {}),
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "loss": {"value": self.loss, "step": self.loss_step}
            | ({"by_cpu": dict(sorted(self.loss_by_cpu.items()))} if self.loss_by_cpu else {}),
            "precision": self.precision,
            "cpu_model": self.cpu_model,
            "cpu_share": self.cpu_share,
            "work": self.work.to_json() if self.work else None,
            **({"peak_by_category": self.peak_by_category} if self.peak_by_category else {}),
            **({"estimate_by_category": self.estimate_by_category} if self.estimate_by_category else {}),
            **({"kernel_scratch_bytes": self.kernel_scratch_bytes} if self.kernel_scratch_bytes is not None else {}),
            **({"kept_bytes": self.kept_bytes} if self.kept_bytes is not None else {}),
            **({"convergence": self.convergence.to_json()} if self.convergence else {}),
            **({"seconds": round(self.seconds, 2)} if self.seconds is not None else {}),
            **({"clocks": self.clocks} if self.clocks else {}),
            **({"gpu_busy_seconds": self.gpu_busy_seconds} if self.gpu_busy_seconds is not None else {}),
            **({"gpu_kernel_seconds": self.gpu_kernel_seconds} if self.gpu_kernel_seconds else {}),
            "recorded_at": self.recorded_at,
            "commit": self.commit,
            **({"torch": self.torch} if self.torch else {}),
            **({"setup": self.setup} if self.setup else {}),
        }

    @classmethod
    def from_json(cls, data: Any, where: str, *, measured: bool = False) -> Entry:
        """A baseline entry; ``measured``: a run's own figures as its results log keeps them, where a diverged run's
        loss and tokens/s may be NaN or infinite (the gate fails that case: it is never recorded)."""

        def get(obj: Any, key: str, types: tuple, path: str, nullable: bool = True) -> Any:
            if not isinstance(obj, dict):
                raise BaselineError(f"{where}: {path.rsplit('.', 1)[0]}: must be an object")
            if key not in obj:
                raise BaselineError(f"{where}: {path}: missing")
            value = obj[key]
            if value is None and nullable:
                return None
            if isinstance(value, bool) or not isinstance(value, types):
                raise BaselineError(
                    f"{where}: {path}: expected {' or '.join(t.__name__ for t in types)}"
                    f"{' or null' if nullable else ''}, got {value!r}"
                )
            if isinstance(value, (int, float)) and not (_figure(value) or (measured and not value < 0)):
                raise BaselineError(
                    f"{where}: {path}: must be a {'' if measured else 'finite '}number >= 0, got {value!r}"
                )
            return value

        def opt(key: str, types: tuple, obj: Any = data, path: str = "") -> Any:  # None where absent
            return get(obj, key, types, path or key) if key in obj else None

        num = (int, float)
        speed = get(data, "tokens_per_s", (dict,), "tokens_per_s", nullable=False)
        loss = get(data, "loss", (dict,), "loss", nullable=False)
        by_cpu = loss.get("by_cpu", {})
        if not isinstance(by_cpu, dict) or not all(isinstance(k, str) and _figure(v) for k, v in by_cpu.items()):
            raise BaselineError(f"{where}: loss.by_cpu: expected an object of CPU model -> loss, got {by_cpu!r}")
        return cls(
            tokens_per_s=get(speed, "median", num, "tokens_per_s.median"),
            tokens_per_s_iqr=get(speed, "iqr", num, "tokens_per_s.iqr"),
            speed_note=opt("not_recorded", (str,), speed, "tokens_per_s.not_recorded"),
            peak_allocated_bytes=get(data, "peak_allocated_bytes", (int,), "peak_allocated_bytes"),
            peak_reserved_bytes=get(data, "peak_reserved_bytes", (int,), "peak_reserved_bytes"),
            loss=get(loss, "value", num, "loss.value"),
            loss_step=get(loss, "step", (int,), "loss.step", nullable=False),
            precision=get(data, "precision", (str,), "precision", nullable=False),
            cpu_model=get(data, "cpu_model", (str,), "cpu_model"),
            cpu_share=get(data, "cpu_share", num, "cpu_share"),
            work=_work(data.get("work"), where),
            recorded_at=data.get("recorded_at"),
            commit=data.get("commit"),
            torch=opt("torch", (str,)),
            loss_by_cpu=dict(by_cpu),
            peak_by_category=_named(
                data.get("peak_by_category"), where, "peak_by_category", "category -> bytes", _bytes
            ),
            estimate_by_category=_named(
                data.get("estimate_by_category"), where, "estimate_by_category", "category -> bytes", _bytes
            ),
            kernel_scratch_bytes=opt("kernel_scratch_bytes", (int,)),
            kept_bytes=opt("kept_bytes", (int,)),
            convergence=_convergence(data.get("convergence"), where),
            seconds=opt("seconds", num),
            clocks=opt("clocks", (dict,)),
            gpu_busy_seconds=opt("gpu_busy_seconds", num),
            gpu_kernel_seconds=_named(
                data.get("gpu_kernel_seconds"), where, "gpu_kernel_seconds", "kind -> seconds", _figure
            ),
            setup=_setup(data.get("setup"), where),
        )


def eager_breakdown(by_category: dict[str, int] | None) -> bool:
    """``by_category`` is the CPU tracker's breakdown of a peak: an eager single-process CPU case's."""
    return bool(by_category) and COMPILED_STEP not in by_category


def kernel_free_peak(
    peak: int | None,
    precision: str,
    cpu_model: str | None,
    by_category: dict[str, int] | None,
    kernel_scratch: int | None,
) -> int | None:
    """A CPU peak without what the matmul kernels held at it, which for a half-precision case depends on the CPU's
    instruction set (gptcore.memory.scratch): an eager case's tracked peak (its peak less the bytes only the
    allocator counted), exact; a compiled case's peak less ``kernel_scratch``, the most one op held, so at least
    that. Any other peak as it is: no CPU model moves it."""
    if peak is None or precision not in HALF_PRECISIONS or cpu_model is None:
        return peak
    if eager_breakdown(by_category):
        return peak - by_category.get(UNTRACKED, 0)
    return peak - (kernel_scratch or 0)


def _convergence(value: Any, where: str) -> Convergence | None:
    if value is None:
        return None
    try:
        return Convergence.from_json(value, where)
    except ValueError as err:
        raise BaselineError(str(err)) from None


def _named(value: Any, where: str, path: str, what: str, valid: Callable[[Any], bool]) -> dict[str, Any] | None:
    """None, or ``value`` as an object of name -> figure with every figure ``valid``; else one BaselineError line
    naming ``path`` and ``what`` it holds."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and valid(v) for k, v in value.items()):
        raise BaselineError(f"{where}: {path}: expected an object of {what}, got {value!r}")
    return dict(value)


def _figure(v: Any) -> bool:
    """A figure an entry can hold: a number, finite and not negative (bytes, seconds, losses, counts, tokens/s)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf


def _bytes(v: Any) -> bool:
    return isinstance(v, int) and _figure(v)


def _setup(value: Any, where: str) -> dict[str, Any] | None:
    plain = (str, int, float, bool, list, type(None))
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, plain) for k, v in value.items()):
        raise BaselineError(f"{where}: setup: expected an object of field -> value, got {value!r}")
    return dict(value)


def _work(data: Any, where: str) -> WorkLedger | None:
    from gptcore.measure.work import WorkLedger

    if data is None:
        return None
    try:
        return WorkLedger.from_json(data)
    except ValueError as err:
        raise BaselineError(f"{where}: {err}") from None
    except (KeyError, TypeError, AttributeError) as err:
        raise BaselineError(f"{where}: work: not a work ledger ({type(err).__name__}: {err})") from None
