"""Tests for gptcore.training.data: corpora, tokenizer, entropy rates and deterministic batching."""

from __future__ import annotations

import gzip
import math
import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch

from gptcore.config import CHAR_VOCAB
from gptcore.training.data import (
    CORPORA,
    CharTokenizer,
    TokenBatches,
    entropy_rate,
    load_corpus,
    make_loader,
    markov_source,
)

ROOT = Path(__file__).resolve().parents[1]


def _shakespeare_text() -> str:
    blob = (resources.files("gptcore") / "corpora" / "shakespeare.txt.gz").read_bytes()
    return gzip.decompress(blob).decode("ascii")


@pytest.mark.cpu
def test_tokenizer_round_trips_val_text_and_rejects_unknown_chars():
    c = load_corpus("shakespeare")
    tok = c.tokenizer
    text = tok.decode(c.val)
    assert len(text) == len(c.val) > 0
    ids = tok.encode(text)
    assert ids.dtype == torch.int64 and ids.dim() == 1
    assert tok.decode(ids) == text
    assert tok.decode(ids[:50].tolist()) == text[:50]  # list input too
    for text, bad in (("caf\u00e9", "\u00e9"), ("tab\there", "\t"), ("~", "~")):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            tok.encode(text)


@pytest.mark.cpu
def test_tokenizer_requires_sorted_unique_alphabet():
    assert CharTokenizer("abc").vocab_size == 3
    with pytest.raises(ValueError):
        CharTokenizer("cba")
    with pytest.raises(ValueError):
        CharTokenizer("aab")


@pytest.mark.cpu
def test_shakespeare_vocab_constant_matches_shipped_corpus():
    text = _shakespeare_text()
    assert len(text) >= 900_000
    assert text.isascii()
    assert CHAR_VOCAB == len(set(text))
    c = load_corpus("shakespeare", vocab_size=CHAR_VOCAB)
    assert c.vocab_size == CHAR_VOCAB and c.entropy_rate is None
    assert c.tokenizer.chars == "".join(sorted(set(text)))
    with pytest.raises(ValueError, match="^vocab_size: the model has 78, corpus 'shakespeare' has 77"):
        load_corpus("shakespeare", vocab_size=CHAR_VOCAB + 1)


@pytest.mark.cpu
def test_shakespeare_split_is_contiguous_and_disjoint():
    text = _shakespeare_text()
    c = load_corpus("shakespeare")
    full = c.tokenizer.encode(text)
    assert len(c.train) + len(c.val) == len(full)
    assert torch.equal(torch.cat([c.train, c.val]), full)
    assert abs(len(c.val) / len(full) - 0.1) < 1e-3
    assert c.tokenizer.decode(c.train) + c.tokenizer.decode(c.val) == text


def _window_keys(windows: torch.Tensor, base: int) -> torch.Tensor:
    """Exact int64 key of each row of (N, W) token windows (base**W must fit in int64)."""
    return (windows * base ** torch.arange(windows.shape[-1])).sum(dim=-1)


@pytest.mark.cpu
def test_val_batches_only_contain_val_windows():
    c = load_corpus("shakespeare")
    T, V = 8, c.vocab_size
    assert V ** (T + 1) < 2**63
    val_keys = _window_keys(c.val.unfold(0, T + 1, 1), V)
    train_keys = _window_keys(c.train.unfold(0, T + 1, 1), V)
    tb = TokenBatches(c, "val", batch_size=32, block_size=T, seed=0, length=20)
    for i in range(len(tb)):
        x, y = tb[i]
        assert x.shape == y.shape == (32, T) and x.dtype == y.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        assert torch.isin(_window_keys(torch.cat([x, y[:, -1:]], dim=1), V), val_keys).all()
    # and train batches come from train: all windows in train, some of them nowhere in val
    xt, yt = TokenBatches(c, "train", batch_size=32, block_size=T, seed=0)[0]
    keys = _window_keys(torch.cat([xt, yt[:, -1:]], dim=1), V)
    assert torch.isin(keys, train_keys).all()
    assert not torch.isin(keys, val_keys).all()


@pytest.mark.cpu
def test_markov_train_and_val_are_different_samples():
    c = load_corpus("markov")
    assert c.vocab_size == 16 and c.tokenizer is None
    assert len(c.train) == 300_000 and len(c.val) == 30_000
    assert not torch.equal(c.train[: len(c.val)], c.val)
    assert (c.train[:1000] != c.val[:1000]).float().mean() > 0.3
    assert int(c.train.min()) >= 0 and int(c.train.max()) < 16
    other = load_corpus("markov", seed=1)
    assert not torch.equal(other.train, c.train)


@pytest.mark.cpu
@pytest.mark.parametrize("name", ["shakespeare", "random"])
def test_worker_count_changes_no_batch(name):
    c = load_corpus(name, vocab_size=50 if name == "random" else None)
    tb = TokenBatches(c, "train", batch_size=4, block_size=16, seed=3, length=6)
    serial = list(make_loader(tb, num_workers=0))
    loader = make_loader(tb, num_workers=2)
    parallel = list(loader)
    del loader
    assert len(serial) == len(parallel) == 6
    for (x0, y0), (x1, y1) in zip(serial, parallel):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert not torch.equal(serial[0][0], serial[1][0])


START_METHOD_CHILD = """
import multiprocessing, sys, torch
from gptcore.training.data import TokenBatches, load_corpus, make_loader
multiprocessing.set_start_method(sys.argv[1])
tb = TokenBatches(load_corpus("shakespeare"), "train", batch_size=4, block_size=16, seed=3, length=6)
serial, parallel = list(make_loader(tb, num_workers=0)), list(make_loader(tb, num_workers=2))
assert len(parallel) == 6 and all(torch.equal(a, b) for s, p in zip(serial, parallel) for a, b in zip(s, p))
print(multiprocessing.get_start_method(), len(parallel))
"""


@pytest.mark.cpu
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_loader_workers_give_the_same_batches_whatever_starts_them(method):
    # fork is Linux's default up to Python 3.13; 3.14 starts workers with forkserver, macOS with spawn: each pickles
    # the dataset (its corpus) into a fresh interpreter, which fork never did. In a child: the start method is global
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", START_METHOD_CHILD, method], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [method, "6"]


@pytest.mark.cpu
@pytest.mark.parametrize("name", CORPORA)
def test_batches_deterministic_by_seed(name):
    c = load_corpus(name, vocab_size=32 if name == "random" else None)
    a = TokenBatches(c, "train", batch_size=8, block_size=32, seed=7)
    b = TokenBatches(c, "train", batch_size=8, block_size=32, seed=7)
    other = TokenBatches(c, "train", batch_size=8, block_size=32, seed=8)
    val = TokenBatches(c, "val", batch_size=8, block_size=32, seed=7)
    for i in (0, 1, 12345):
        (xa, ya), (xb, yb) = a[i], b[i]
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert torch.equal(xa[:, 1:], ya[:, :-1])
        assert not torch.equal(xa, other[i][0])
        assert not torch.equal(xa, val[i][0])
        assert int(xa.min()) >= 0 and int(xa.max()) < c.vocab_size
    assert not torch.equal(a[0][0], a[1][0])


@pytest.mark.cpu
def test_entropy_rate_known_cases():
    for V in (2, 16, 65):
        assert entropy_rate(torch.full((V, V), 1.0 / V, dtype=torch.float64)) == pytest.approx(math.log(V), abs=1e-12)
    # doubly stochastic, non-uniform: stationary dist is uniform, rate = mean row entropy
    V = 8
    row = torch.tensor([0.5, 0.25, 0.125, 0.125, 0, 0, 0, 0], dtype=torch.float64)
    P = torch.stack([row.roll(i) for i in range(V)])
    assert entropy_rate(P) == pytest.approx(1.75 * math.log(2), abs=1e-12)
    # deterministic permutation: no uncertainty at all
    perm = torch.eye(V, dtype=torch.float64)[torch.tensor([3, 0, 7, 1, 2, 6, 4, 5])]
    assert entropy_rate(perm) == pytest.approx(0.0, abs=1e-12)
    assert entropy_rate(torch.eye(V, dtype=torch.float64)) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.cpu
def test_markov_source_and_empirical_entropy():
    V = 16
    P = markov_source(V, seed=0)
    assert P.dtype == torch.float64 and P.shape == (V, V)
    assert torch.allclose(P.sum(dim=1), torch.ones(V, dtype=torch.float64))
    assert torch.equal(P, markov_source(V, seed=0)) and not torch.equal(P, markov_source(V, seed=1))
    c = load_corpus("markov")
    rate = entropy_rate(P)
    assert c.entropy_rate == pytest.approx(rate, abs=1e-12)
    assert rate < math.log(V) - 0.5
    # plug-in conditional entropy H(next | prev) from bigram counts of the train sample
    t = c.train
    counts = torch.bincount(t[:-1] * V + t[1:], minlength=V * V).reshape(V, V).double()
    cond = counts / counts.sum(dim=1, keepdim=True).clamp_min(1)
    empirical = float(-(counts * torch.log(cond.clamp_min(1e-300))).sum() / counts.sum())
    # 299,999 transitions: the plug-in estimate's sampling sd is 0.0019 nats and its bias (V-1)V/2N = 4e-4, so 0.01
    # is 5 sd (measured -0.0036; the corpus is fixed by its seed, so this is no flake either way)
    assert abs(empirical - rate) < 0.01
    # the sampled chain follows P: the rarest row has 1,364 transitions, a probability's sampling sd there is at most
    # sqrt(0.25 / 1364) = 0.0135, and 0.05 is 3.7 of them (measured 0.019); a wrong P is off by far more
    assert (cond - P).abs().max() < 0.05


@pytest.mark.cpu
def test_random_corpus():
    c = load_corpus("random", vocab_size=100)
    assert c.train is None and c.val is None and c.tokenizer is None
    assert c.entropy_rate == pytest.approx(math.log(100))
    x, y = TokenBatches(c, "val", batch_size=4, block_size=1000, seed=0)[0]
    assert x.shape == (4, 1000) and int(x.max()) < 100 and len(x.unique()) > 90


@pytest.mark.cpu
def test_errors():
    with pytest.raises(ValueError, match="shakespeare.*markov.*random"):
        load_corpus("nope")
    with pytest.raises(ValueError, match="vocab_size"):
        load_corpus("random")
    c = load_corpus("markov")
    with pytest.raises(ValueError, match="split"):
        TokenBatches(c, "test", batch_size=2, block_size=8, seed=0)
    with pytest.raises(ValueError, match="block_size"):
        TokenBatches(c, "val", batch_size=2, block_size=len(c.val), seed=0)
    TokenBatches(c, "val", batch_size=2, block_size=len(c.val) - 1, seed=0)[0]  # largest that fits
    with pytest.raises(IndexError):
        TokenBatches(c, "val", batch_size=2, block_size=8, seed=0, length=3)[3]
