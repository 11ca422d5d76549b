"""Temp folders do not outlive their process, even one killed with SIGKILL (heldout.files).

The adversary is the field, not a candidate: a study killed with kill -9, a CI job cancelled, an
out-of-memory kill. Each left its fork servers' inboxes, its isolated optimizers' folders and its
scratch tables in /tmp for good (about 2,500 on one development machine). Now every temp folder
lives in one folder per process whose owner file is locked while the process (or a child it
forked) runs; the next heldout process removes the folders whose lock is free. A live process's
folder is never touched, whatever its pid says."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heldout.files import PROCESS_DIR_PREFIX, remove_orphaned_temp_dirs

MAKE_AND_REPORT = """
import os, sys
from heldout.files import make_temp_dir
folder = make_temp_dir("probe-")
(folder / "work").write_text("half done")
print(folder, flush=True)
"""


def start(temp_root: Path, then: str) -> subprocess.Popen:
    """A heldout process with ``temp_root`` as its temp dir that makes a temp folder, prints it,
    then runs ``then``."""
    env = {**os.environ, "TMPDIR": str(temp_root)}
    return subprocess.Popen([sys.executable, "-c", MAKE_AND_REPORT + then], env=env, stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True)


def process_dirs(temp_root: Path) -> list[Path]:
    return sorted(p for p in temp_root.iterdir() if p.name.startswith(PROCESS_DIR_PREFIX))


def test_a_normal_exit_removes_the_process_folder(tmp_path):
    proc = start(tmp_path, "")
    folder = Path(proc.stdout.readline().strip())
    assert proc.wait(timeout=60) == 0
    assert folder.parent.parent == tmp_path and not folder.exists()
    assert process_dirs(tmp_path) == []


def test_a_killed_process_folder_is_removed_by_the_next_process_and_a_live_one_never(tmp_path):
    killed = start(tmp_path, "os.kill(os.getpid(), 9)")
    orphan = Path(killed.stdout.readline().strip())
    assert killed.wait(timeout=60) == -signal.SIGKILL
    live = start(tmp_path, "sys.stdin.readline()")  # waits until told to exit
    try:
        mine = Path(live.stdout.readline().strip())
        assert not orphan.exists()  # the live process's first temp folder removed the orphan's
        assert mine.exists()
        assert remove_orphaned_temp_dirs(tmp_path) == []  # its lock is held: never touched
        assert (mine / "work").read_text() == "half done"
    finally:
        live.communicate("\n", timeout=60)
    assert process_dirs(tmp_path) == []


def test_a_killed_owner_folder_stays_while_a_child_it_forked_runs(tmp_path):
    # the forked child holds the lock (it may still be using the folder) until it ends
    owner = start(tmp_path, "pid = os.fork()\n"
                            "if pid == 0:\n    sys.stdin.readline(); os._exit(0)\n"
                            "print(pid, flush=True); os.kill(os.getpid(), 9)")
    folder = Path(owner.stdout.readline().strip())
    child = int(owner.stdout.readline())
    owner.wait(timeout=60)
    try:
        assert remove_orphaned_temp_dirs(tmp_path) == [] and folder.exists()
    finally:
        os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not remove_orphaned_temp_dirs(tmp_path):
        time.sleep(0.05)  # the child is reaped by init, not by us: its lock goes when it is gone
    assert not folder.parent.exists()


def test_an_unclaimed_folder_goes_only_after_its_grace_minute_and_another_users_never(tmp_path):
    fresh = tmp_path / f"{PROCESS_DIR_PREFIX}1-fresh"
    stale = tmp_path / f"{PROCESS_DIR_PREFIX}2-stale"
    fresh.mkdir()
    stale.mkdir()
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    assert remove_orphaned_temp_dirs(tmp_path) == [stale]
    assert fresh.exists()
    if os.geteuid() != 0:
        pytest.skip("making a folder another user owns needs root")
    theirs = tmp_path / f"{PROCESS_DIR_PREFIX}3-theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    os.utime(theirs, (time.time() - 3600, time.time() - 3600))
    assert remove_orphaned_temp_dirs(tmp_path) == [] and theirs.exists()
