"""A real small disk for full-disk tests: a tmpfs mounted for the block (root only, as in CI),
filled by a filler file or grown the way a user frees space; and the mount itself, for tests that
need another kind of tmpfs (a read-only one)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


@contextlib.contextmanager
def mounted_tmpfs(where: Path, options: str, what: str) -> Iterator[Path]:
    """A tmpfs mounted on the folder ``where`` with mount ``options`` for the block, unmounted after
    it (lazily when still busy); the test is skipped, naming ``what``, where none can be mounted."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount {what} here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


@contextlib.contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``where`` for the block; unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    where.mkdir(parents=True, exist_ok=True)
    with mounted_tmpfs(where, f"size={size},mode=0700", "a tmpfs") as disk:
        yield disk


def grow(disk: Path, size: str) -> None:
    """Free space the way a user would: make the disk bigger."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


def fill(disk: Path) -> Path:
    """Write a filler file until the disk is full; returns it (delete it to free the space)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as fh:
        with pytest.raises(OSError) as full:
            while True:
                fh.write(b"x" * 512)
    assert full.value.errno == errno.ENOSPC
    return filler
