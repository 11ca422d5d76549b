"""Optimizers the Ray executor tests run inside Ray workers (imported there by ``module:function``).

The adversaries: a worker that dies mid-cell (as a preempted node does), a cell that waits on its
node until the test removes that node, and a candidate that tries to read the study's run dirs
from inside the sandbox of a Ray worker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from heldout.optimizers.lockpicking_search import optimize as lockpicking_search

KILL_MARKERS = "HELDOUT_TEST_KILL_MARKERS"   # dir: one marker per cell that has been killed once
PROBE_TARGETS = "HELDOUT_TEST_PROBE_TARGETS"  # os.pathsep-separated paths the probe candidate tries
HOLD_MARKERS = "HELDOUT_TEST_HOLD_MARKERS"  # dir: one marker per cell, holding the id of the node it waits on
HOLD_SECONDS = 120.0  # a held cell goes on by itself after this long (the test then fails, not hangs)


def dies_once_mid_cell(view, seed: int):
    """Evaluate the seed on train (recorded in the ledger), then SIGKILL this worker the first
    time; on the retry the evaluation replays from the ledger and the search continues."""
    ids = [ex["id"] for ex in view.train]
    view.evaluate(view.seed_candidate, "train", ids)
    marker = Path(os.environ[KILL_MARKERS]) / f"seed-{seed}"
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return lockpicking_search(view, seed)


def holds_on_its_node(view, seed: int):
    """Evaluate the seed on train (recorded in the ledger), then, the first time, write this Ray
    node's id to a marker and wait for the node to be removed; on the retry (the marker exists)
    the evaluation replays from the ledger and the search continues."""
    import ray

    ids = [ex["id"] for ex in view.train]
    view.evaluate(view.seed_candidate, "train", ids)
    marker = Path(os.environ[HOLD_MARKERS]) / f"seed-{seed}"
    if not marker.exists():
        partial = marker.with_suffix(".partial")  # the test reads a whole id or none
        partial.write_text(ray.get_runtime_context().get_node_id())
        os.replace(partial, marker)
        deadline = time.monotonic() + HOLD_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.1)
    return lockpicking_search(view, seed)


PROBE_PROGRAM = '''
import os
import numpy as np

TARGETS = {targets!r}


def circle_packing26():
    seen = []
    for path in TARGETS:
        try:
            if os.path.isdir(path):
                seen.append(("LISTED", path, sorted(os.listdir(path))))
            else:
                with open(path) as fh:
                    seen.append(("READ", path, fh.read(200)))
        except BaseException as exc:
            seen.append(("blocked", path, type(exc).__name__))
    raise RuntimeError("probe: " + repr(seen))
'''


def probes_the_run_dir(view, seed: int):
    """Evaluate a circle-packing program that tries to list and read the run dirs."""
    targets = os.environ[PROBE_TARGETS].split(os.pathsep)
    candidate = {"program.py": PROBE_PROGRAM.format(targets=targets)}
    view.evaluate(candidate, "train", [ex["id"] for ex in view.train])
    return candidate
