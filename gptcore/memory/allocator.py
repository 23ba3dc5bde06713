"""The CPU allocator's own count of bytes: the CPU peak of every case, eager or compiled.

The storage tracker (``tracker``) sees the tensors that ops return through the dispatcher. It cannot see inside
inductor's compiled code, whose wrapper allocates its buffers with ``empty_strided_cpu`` outside the dispatcher,
nor a kernel's own scratch, nor the Python numbers that the argument parser wraps as tensors and autograd keeps.
Every one of them is allocated through c10's CPU allocator. ``counting_allocator.cpp`` puts a counting allocator in
front of it (``c10::SetCPUAllocator``): the same memory, handed out by the default allocator, with the bytes
allocated now and their peak, as CUDA's caching allocator reports them (``torch.cuda.memory_allocated``,
``max_memory_allocated``, ``reset_peak_memory_stats``).

It is a small C++ file built once per torch release with the C++ compiler that inductor also needs on CPU
(``$CXX``, else ``c++``): about 2 s, cached under ``~/.cache/gptcore-bench/allocator`` (``$XDG_CACHE_HOME``) and
loaded with ctypes. It counts only inside ``counting()`` (and so inside ``window``): outside, c10's own allocator
serves alone. Its bookkeeping (a map from pointer to size, a heap node per allocation) changes how glibc reuses
freed memory, and left installed it made cpu-small's timed fp32 steps 6-28% slower (page faults on fresh memory);
a case's timed rounds therefore never run under it.

Chosen over ``torch.profiler(profile_memory=True)``, which sees the same allocations through c10's
``ProfiledCPUMemoryReporter``: the profiler records an event per allocation and op, and its ``total_allocated``
carries over between profiling sessions of one process, while this costs a counter update per allocation and
nothing per op.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("counting_allocator.cpp")


class Unavailable(RuntimeError):
    """The counting allocator cannot be built or installed here (one line: why)."""


_lib: ctypes.CDLL | None = None


def cache_dir() -> Path:
    """Where the built library is kept: ``$XDG_CACHE_HOME/gptcore-bench/allocator`` (default ``~/.cache/...``)."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "gptcore-bench" / "allocator"


def _library_path() -> Path:
    """The built library's path, named after the source, the torch release and its headers' folder: a change to
    any of them builds it again."""
    from torch.utils import cpp_extension

    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(torch.__version__.encode())
    key.update(" ".join(cpp_extension.include_paths()).encode())
    return cache_dir() / f"counting-{key.hexdigest()[:16]}.so"


def _build(target: Path) -> None:
    """Compile ``SOURCE`` into ``target`` (written beside it, then renamed: several processes may build at once)."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        raise Unavailable(f"no C++ compiler ({compiler}) to build the CPU allocator count; install g++ or set $CXX")
    libraries = cpp_extension.library_paths()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    command = [
        compiler,
        "-O2",
        "-shared",
        "-fPIC",
        "-std=c++17",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-I{p}" for p in cpp_extension.include_paths()),
        str(SOURCE),
        "-o",
        partial,
        *(f"-L{p}" for p in libraries),
        "-lc10",
        *(f"-Wl,-rpath,{p}" for p in libraries),
    ]
    if sys.platform == "darwin":
        command.insert(1, "-undefined")
        command.insert(2, "dynamic_lookup")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        os.unlink(partial)
        first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
        raise Unavailable(f"building the CPU allocator count failed ({compiler}): {first}")
    os.replace(partial, target)


def load() -> None:
    """Build (once per torch release) and load the counting allocator, ready for ``counting()``. Idempotent.
    Raises Unavailable with one line where it cannot be."""
    global _lib
    if _lib is not None:
        return
    if sys.platform == "win32":
        raise Unavailable("the CPU allocator count is built for Linux and macOS only")
    path = _library_path()
    if not path.exists():
        _build(path)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as err:
        raise Unavailable(f"loading the CPU allocator count {path} failed: {err}") from None
    for name in ("gptcore_allocated", "gptcore_peak", "gptcore_allocations"):
        getattr(lib, name).restype = ctypes.c_int64
    _lib = lib


_depth = 0


@contextlib.contextmanager
def counting() -> Iterator[None]:
    """Allocate through the counting allocator inside the block (nested blocks count once), c10's own outside it;
    what was allocated inside is still counted when it is freed. Loads it first (``load``)."""
    global _depth
    load()
    if _depth == 0 and _installed().gptcore_install() != 1:
        raise Unavailable("another CPU allocator was installed with a higher priority; nothing to count")
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            _installed().gptcore_uninstall()


def _installed() -> ctypes.CDLL:
    if _lib is None:
        raise RuntimeError("the counting CPU allocator is not loaded: call gptcore.memory.allocator.load()")
    return _lib


def allocated_bytes() -> int:
    """Bytes allocated inside ``counting()`` blocks and not yet freed."""
    return _installed().gptcore_allocated()


def max_allocated_bytes() -> int:
    """The peak of ``allocated_bytes`` since the last ``reset_peak``."""
    return _installed().gptcore_peak()


def allocations() -> int:
    """Allocations counted so far, freed or not."""
    return _installed().gptcore_allocations()


def reset_peak() -> None:
    """Start the peak again from the bytes allocated now."""
    _installed().gptcore_reset_peak()


@dataclass
class Window:
    """The peak over a block of code: what was live at its start, as the caller counts it, plus the allocator's
    rise above its count at the start."""

    start_bytes: int
    allocated_at_start: int
    rise: int = 0

    @property
    def peak_bytes(self) -> int:
        return self.start_bytes + self.rise


@contextlib.contextmanager
def window(start_bytes: int) -> Iterator[Window]:
    """Measure the peak of the block, counting inside it. ``start_bytes``: the bytes counted as live at its start
    (a model's parameters, buffers, gradients and optimizer state: ``state_bytes``), so that the figure means what
    the tracker's peak means and allocations made before the block (a dataset) stay out of it.

    CPython's cyclic collector is run once before the block and held off inside it: a collection runs when enough
    Python objects were made, by any thread, so one inside the block freed garbage before or after the peak from run
    to run (cpu-small under budget-0.60 peaked 128 B apart in about half of its runs at one commit; held off, 13 of 13
    runs gave the same byte count). Garbage made inside the block is freed after it."""
    gc.collect()
    held = gc.isenabled()
    gc.disable()
    try:
        with counting():
            now = allocated_bytes()
            reset_peak()
            measured = Window(start_bytes, now)
            yield measured
            measured.rise = max_allocated_bytes() - now
    finally:
        if held:
            gc.enable()


def state_bytes(model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> int:
    """Bytes of the distinct storages of a model's parameters, buffers and gradients and of its optimizers' state
    tensors: what the tracker counts as live when it starts."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for opt in optimizers:
        for state in opt.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return storage_bytes(tensors)


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages under ``tensors`` (a tied weight counts once; a DTensor as its local shard)."""
    storages = {}
    for t in tensors:
        storage = getattr(t, "_local_tensor", t).untyped_storage()
        if storage.nbytes():
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())
