"""Corpora and deterministic batch sampling for the gptcore benchmarks.

Three corpora, picked by name with :func:`load_corpus`:

* ``"shakespeare"`` -- about 1.07M characters of Shakespeare's plays (shipped as
  ``gptcore/corpora/shakespeare.txt.gz``, see ``corpora/ATTRIBUTION.md``), character-level
  tokens as in nanoGPT's shakespeare_char; first 90% train, last 10% val. Real text, so the
  loss floor is unknown (``entropy_rate=None``).
* ``"markov"`` -- tokens sampled from a seeded first-order Markov chain with peaked Dirichlet
  rows. Its entropy rate is known exactly, so it is the floor a model's val loss approaches:
  a numerics check with a known answer.
* ``"random"`` -- uniform i.i.d. tokens drawn on the fly (no stored data). Nothing to learn:
  the loss floor is ln V. For pure throughput / memory measurements.

:class:`TokenBatches` makes batch ``i`` a function of ``(seed, i, split)`` only, so a
DataLoader gives the same batches in the same order for any number of workers.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import math
from dataclasses import dataclass
from importlib import resources

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from gptcore.config import DATASETS as CORPORA

MARKOV_TRAIN_TOKENS, MARKOV_VAL_TOKENS = 300_000, 30_000
_SPLITS = ("train", "val")


class CharTokenizer:
    """Character-level tokenizer over a fixed sorted alphabet."""

    def __init__(self, chars: str) -> None:
        if list(chars) != sorted(set(chars)):
            raise ValueError("alphabet must be sorted and without repeats")
        self.chars = chars
        self.vocab_size = len(chars)
        self._lut = np.full(max(map(ord, chars), default=-1) + 1, -1, dtype=np.int64)
        self._lut[[ord(c) for c in chars]] = np.arange(len(chars))

    def encode(self, text: str) -> torch.Tensor:
        """Text -> int64 1-D tensor of ids; ValueError on a char outside the alphabet."""
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        ids = self._lut[np.minimum(cps, len(self._lut) - 1)]
        bad = (ids < 0) | (cps >= len(self._lut))
        if bad.any():
            raise ValueError(f"character {text[int(bad.argmax())]!r} is not in the tokenizer alphabet")
        return torch.from_numpy(ids)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """Ids (tensor or list of ints) -> text."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return "".join(self.chars[i] for i in ids)


@dataclass(frozen=True, eq=False)  # eq=False: identity equality, since fields hold tensors
class Corpus:
    name: str  # one of CORPORA
    vocab_size: int
    train: torch.Tensor | None  # 1-D int64 token ids; None for "random" (drawn on the fly)
    val: torch.Tensor | None
    entropy_rate: float | None  # nats/token of the source when known exactly
    tokenizer: CharTokenizer | None  # shakespeare only


@functools.lru_cache(maxsize=1)
def _shakespeare() -> tuple[CharTokenizer, torch.Tensor]:
    blob = (resources.files("gptcore") / "corpora" / "shakespeare.txt.gz").read_bytes()
    text = gzip.decompress(blob).decode("ascii")
    tok = CharTokenizer("".join(sorted(set(text))))
    return tok, tok.encode(text)


def markov_source(vocab_size: int, seed: int, concentration: float = 0.1) -> torch.Tensor:
    """Float64 (V, V) row-stochastic transition matrix, rows drawn from Dirichlet(concentration)."""
    rng = np.random.default_rng([seed, vocab_size])
    return torch.from_numpy(rng.dirichlet(np.full(vocab_size, concentration), size=vocab_size))


def _stationary(P: np.ndarray) -> np.ndarray:
    """Solve pi P = pi, sum(pi) = 1 (least squares, so reducible chains give some valid answer)."""
    V = P.shape[0]
    A = np.vstack([P.T - np.eye(V), np.ones((1, V))])
    b = np.zeros(V + 1)
    b[-1] = 1.0
    pi = np.clip(np.linalg.lstsq(A, b, rcond=None)[0], 0.0, None)
    return pi / pi.sum()


def entropy_rate(P: torch.Tensor) -> float:
    """Entropy rate sum_i pi_i H(P[i]) in nats of the stationary Markov chain with transitions P."""
    P64 = P.detach().to(torch.float64).cpu()
    row_entropy = -torch.special.xlogy(P64, P64).sum(dim=1)
    pi = torch.from_numpy(_stationary(P64.numpy()))
    return float((pi * row_entropy).sum())


def _sample_chain(P: np.ndarray, n: int, rng: np.random.Generator) -> torch.Tensor:
    """n tokens of the chain, started from its stationary distribution (inverse CDF, one bisect per token)."""
    cum = np.cumsum(P, axis=1)
    cum[:, -1] = 1.0
    rows = cum.tolist()
    pi_cum = np.cumsum(_stationary(P))
    pi_cum[-1] = 1.0
    u = rng.random(n).tolist()
    s = bisect.bisect_right(pi_cum.tolist(), u[0])
    out = [s]
    for x in u[1:]:
        s = bisect.bisect_right(rows[s], x)
        out.append(s)
    return torch.tensor(out, dtype=torch.int64)


@functools.lru_cache(maxsize=8)
def _markov(vocab_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    P = markov_source(vocab_size, seed)
    Pn = P.numpy()
    train = _sample_chain(Pn, MARKOV_TRAIN_TOKENS, np.random.default_rng([seed, vocab_size, 1]))
    val = _sample_chain(Pn, MARKOV_VAL_TOKENS, np.random.default_rng([seed, vocab_size, 2]))
    return train, val, entropy_rate(P)


def load_corpus(name: str, *, vocab_size: int | None = None, seed: int = 0, val_fraction: float = 0.1) -> Corpus:
    """Load a corpus by name (see module docstring). val_fraction applies to shakespeare only."""
    if name == "shakespeare":
        tok, data = _shakespeare()
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        n = int(len(data) * (1.0 - val_fraction))
        corpus = Corpus(name, tok.vocab_size, data[:n], data[n:], None, tok)
        if vocab_size is not None:
            check_vocab(corpus, vocab_size)
        return corpus
    if name == "markov":
        V = 16 if vocab_size is None else vocab_size
        if V < 2:
            raise ValueError(f"markov needs vocab_size >= 2, got {V}")
        train, val, rate = _markov(V, seed)
        return Corpus(name, V, train, val, rate, None)
    if name == "random":
        if vocab_size is None or vocab_size < 1:
            raise ValueError(f"the random corpus needs an explicit vocab_size >= 1, got {vocab_size}")
        return Corpus(name, vocab_size, None, None, math.log(vocab_size), None)
    raise ValueError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)}")


def check_vocab(corpus: Corpus, vocab_size: int) -> None:
    """The one check that a model's vocabulary is its corpus's: ValueError naming vocab_size otherwise."""
    if corpus.vocab_size != vocab_size:
        raise ValueError(f"vocab_size: the model has {vocab_size}, corpus {corpus.name!r} has {corpus.vocab_size}")


class TokenBatches(Dataset):
    """Map-style dataset: item i is batch i, a pair (x, y) of int64 (batch, block) tensors, y = x shifted by one.
    Batch i depends only on (seed, i), never on which worker draws it, so a DataLoader yields the same batches
    in the same order for any num_workers."""

    def __init__(
        self, corpus: Corpus, split: str, batch_size: int, block_size: int, seed: int, length: int = 10**9
    ) -> None:
        if split not in _SPLITS:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if batch_size < 1 or block_size < 1 or length < 1:
            raise ValueError(
                f"batch_size, block_size and length must be >= 1, got {batch_size}, {block_size}, {length}"
            )
        self.data = corpus.train if split == "train" else corpus.val
        if self.data is not None and len(self.data) < block_size + 1:
            raise ValueError(
                f"block_size={block_size} is too large for the {corpus.name} {split} split "
                f"({len(self.data)} tokens; need at least block_size + 1)"
            )
        self.corpus, self.split = corpus, split
        self.batch_size, self.block_size, self.seed, self.length = batch_size, block_size, seed, length

    def __len__(self) -> int:
        return self.length

    def _generator(self, i: int) -> torch.Generator:
        mix = np.random.SeedSequence([self.seed, i, _SPLITS.index(self.split)])
        return torch.Generator().manual_seed(int(mix.generate_state(1, np.uint64)[0]))

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.length:
            raise IndexError(f"batch index {i} out of range [0, {self.length})")
        g, B, T = self._generator(i), self.batch_size, self.block_size
        if self.data is None:
            w = torch.randint(self.corpus.vocab_size, (B, T + 1), generator=g)
        else:
            offsets = torch.randint(0, len(self.data) - T, (B,), generator=g)
            w = self.data[offsets[:, None] + torch.arange(T + 1)]
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def make_loader(batches: TokenBatches, *, num_workers: int = 0, pin_memory: bool = False) -> DataLoader:
    """DataLoader over pre-batched items, in index order (batch_size=None, no shuffling)."""
    return DataLoader(
        batches,
        batch_size=None,
        shuffle=False,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        prefetch_factor=4 if num_workers > 0 else None,
    )
