"""A real small disk for full-disk tests: a tmpfs mounted for the block (root only, as in CI),
filled by a filler file or grown the way a user frees space."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


@contextlib.contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``where`` for the block; unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


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
