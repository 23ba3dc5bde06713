"""GPTConfig: the shape of a nanoGPT-style model and the corpus it reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from gptcore.config.checks import check, check_counts

Dataset = Literal["shakespeare", "markov", "random"]
#: The corpora gptcore.training.data can load (gptcore.training.data.CORPORA is this tuple).
DATASETS: tuple[Dataset, ...] = get_args(Dataset)

#: Alphabet size of the shipped Shakespeare corpus (tests/test_data.py checks it against the corpus itself).
CHAR_VOCAB = 77


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Shape of a nanoGPT-style model and the corpus it reads."""

    n_layer: int
    """Number of transformer blocks."""
    n_head: int
    """Attention heads per block; must divide n_embd."""
    n_embd: int
    """Width of the residual stream."""
    block_size: int
    """Context length T: tokens per sequence (and size of the position table)."""
    vocab_size: int
    """Real vocabulary size; the loss is always over exactly these classes."""
    batch_size: int
    """Sequences per optimizer step in the study this preset comes from."""
    dropout: float = 0.0
    """Dropout on attention weights and residual branches (nanoGPT's char config uses 0.2)."""
    bias: bool = False
    """Biases in Linear and LayerNorm layers: off, as in nanoGPT's train.py; the GPT-2 presets turn them on."""
    dataset: Dataset = "shakespeare"
    """Corpus the preset trains on: 'shakespeare' (chars), 'markov' (synthetic, known entropy) or 'random'."""

    def __post_init__(self) -> None:
        check_counts(self, "n_layer", "n_head", "n_embd", "block_size", "vocab_size", "batch_size")
        check(self.n_embd % self.n_head == 0, "n_embd", f"{self.n_embd} is not divisible by n_head={self.n_head}")
        check(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}")
        check(self.dataset in DATASETS, "dataset", f"unknown {self.dataset!r}; choose from {', '.join(DATASETS)}")
        if self.dataset == "shakespeare":
            check(
                self.vocab_size == CHAR_VOCAB,
                "vocab_size",
                f"the shakespeare corpus has {CHAR_VOCAB} characters, got {self.vocab_size}",
            )
