"""The configuration's types: GPTConfig (model shape), Recipe (every training switch, grouped by what it switches:
Recipe.parallel's data parallelism, Recipe.kernels' kernels past nanoGPT's), Study with its Schedule and Timing; a
case's setup as flat fields (gptcore.config.fields). The named values are in gptcore.presets. Frozen dataclasses
checked on creation (and by ``dataclasses.replace``): ValueError names the field, a nested one dotted. No torch, for
a fast CLI."""

from gptcore.config.fields import Setup, setup_differences, setup_of
from gptcore.config.model import CHAR_VOCAB, DATASETS, Dataset, GPTConfig
from gptcore.config.parallel import PARALLELS, DDPOptions, FSDP2Options, FSDPParamDtype, Parallel, ParallelMode
from gptcore.config.recipe import (
    CUDA_ATTENTION,
    HALF_PRECISIONS,
    AdamWImpl,
    Attention,
    CompileMode,
    CompileScope,
    Kernels,
    LossKernel,
    LRSchedule,
    Optimizer,
    Precision,
    Recipe,
)
from gptcore.config.study import CPU_THREADS, Schedule, Study, Timing

__all__ = [
    "CPU_THREADS",
    "CHAR_VOCAB",
    "DATASETS",
    "Dataset",
    "GPTConfig",
    "PARALLELS",
    "DDPOptions",
    "FSDP2Options",
    "FSDPParamDtype",
    "Parallel",
    "ParallelMode",
    "CUDA_ATTENTION",
    "HALF_PRECISIONS",
    "AdamWImpl",
    "Attention",
    "CompileMode",
    "CompileScope",
    "Kernels",
    "LossKernel",
    "LRSchedule",
    "Optimizer",
    "Precision",
    "Recipe",
    "Schedule",
    "Study",
    "Timing",
    "Setup",
    "setup_differences",
    "setup_of",
]
