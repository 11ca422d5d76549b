"""MBPP+ expected outputs kept between test runs, so the suite runs the slow canonical solutions
(Mbpp/599 alone is 23 s of CPU) once per machine rather than in every module and every run.

A module that checks solutions against expected outputs, and does not test how they are computed,
uses :func:`kept_truths` as a module-scoped fixture: the module gets a truth cache of its own
(``execution._truth_cache``), filled from the file, and what it computed is written back when the
module ends; the process's cache is restored, so no other module sees truths it did not compute.

The file is keyed by the data file's bytes, the source of the MBPP+ execution package (which
computes the truths) and the Python version, so an edited dataset, a changed way to compute or
store them, or another interpreter starts afresh. It is a pickle, so it is only read from a
directory of this user's own that no one else can write (``$TMPDIR/heldout-tests-<uid>``): another
user who could plant it would otherwise run code in the tests."""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import stat
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from heldout.benchmarks.mbpp_plus import execution

SOURCES = sorted(Path(execution.__file__).parent.glob("*.py"))


def cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"heldout-tests-{os.getuid()}"


def cache_file(data_file: Path) -> Path:
    digest = hashlib.sha256(sys.version.encode())
    for path in (data_file, *SOURCES):
        digest.update(path.read_bytes())
    return cache_dir() / f"mbpp-truths-{digest.hexdigest()[:24]}.pickle"


def _private(path: Path) -> bool:
    """Owned by this user and writable by no one else (a directory or a file)."""
    info = path.lstat()
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) \
        and not stat.S_ISLNK(info.st_mode)


def load(file: Path) -> dict[str, execution.GroundTruth]:
    if not file.exists() or not (_private(file.parent) and _private(file)):
        return {}
    try:
        kept = pickle.loads(file.read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        return {}  # a torn or outdated file: computed again
    return kept if isinstance(kept, dict) else {}


def save(file: Path, truths: dict[str, execution.GroundTruth]) -> None:
    file.parent.mkdir(mode=0o700, exist_ok=True)
    if not _private(file.parent):
        return
    # one writer at a time: two pytest-xdist workers that read the file, merged their own and
    # replaced it together would keep only the last one's truths (the others computed again next run)
    with open(file.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = {**load(file), **truths}  # another worker may have added its own
        partial = file.with_suffix(f".{os.getpid()}.part")
        partial.write_bytes(pickle.dumps(merged))
        partial.chmod(0o600)
        os.replace(partial, file)  # readers see the old file or the new one, never half of one


@contextmanager
def kept_truths(data_file: Path) -> Iterator[dict[str, execution.GroundTruth]]:
    file = cache_file(data_file)
    truths = load(file)
    known = set(truths)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(execution, "_truth_cache", truths)
        yield truths
    if set(truths) - known:
        save(file, truths)
