"""Git plumbing for comparing and bisecting revisions: run git, find the repository, name a revision's commit,
and check a revision out in a temporary worktree (or snapshot the working tree as it is)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


class RevisionError(ValueError):
    """git could not do what was asked (not a repository, an unknown revision, ...); the message is git's."""


def git(repo: str | Path, *args: str) -> str:
    """stdout of ``git -C repo args``; RevisionError with git's first line on failure."""
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if out.returncode:
        first = (out.stderr.strip().splitlines() or [f"git {' '.join(args)} failed"])[0]
        raise RevisionError(first)
    return out.stdout.strip()


def repo_root(cwd: str | Path | None = None) -> Path:
    """The top of the git working tree holding ``cwd``."""
    try:
        return Path(git(cwd or os.getcwd(), "rev-parse", "--show-toplevel"))
    except RevisionError:
        raise RevisionError(f"not a git repository: {Path(cwd or os.getcwd()).resolve()}") from None


def commit_of(repo: Path, rev: str) -> str:
    """The commit sha ``rev`` names in ``repo``."""
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except RevisionError:
        raise RevisionError(f"unknown revision {rev!r} in {repo}") from None


def subject(repo: Path, sha: str) -> str:
    return git(repo, "log", "-1", "--format=%s", sha)


@contextlib.contextmanager
def worktree(repo: Path, sha: str, parent: Path) -> Iterator[Path]:
    """A detached ``git worktree`` of ``sha`` under ``parent``, removed afterwards (errors and Ctrl-C included)."""
    path = Path(tempfile.mkdtemp(prefix=f"{sha[:8]}-", dir=parent))
    git(repo, "worktree", "add", "--detach", "--quiet", str(path), sha)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], capture_output=True)
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)


def snapshot(repo: Path, parent: Path) -> Path:
    """A copy of the working tree as it is (tracked and untracked files, not ignored ones) under ``parent``, so
    that edits made while the comparison runs do not reach it."""
    path = Path(tempfile.mkdtemp(prefix="worktree-", dir=parent))
    for name in git(repo, "ls-files", "-z", "-co", "--exclude-standard").split("\0"):
        source = repo / name
        if name and source.is_file():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, path / name)
    return path
