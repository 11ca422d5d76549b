"""What loading the task registry imports: every command that lists, verifies or resolves tasks
starts an interpreter that loads it (the CLI, a process pool's or a Ray node's worker), so a heavy
library imported there is paid by every one of them, whether or not it is used. Two were paid for
nothing: evalplus's sanitizer (HF datasets and pandas, about 1 CPU-s), needed only when an MBPP+
answer's code is extracted, and scipy.signal (about 0.9 CPU-s), needed only to score a long
autocorrelation step function. Each is imported where it is first used; the results are the same
(the extraction tests compare both backends; the scoring test below crosses the 64-step switch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from heldout.benchmarks.geometry import scoring

LOAD_EVERY_FAMILY = """
import importlib, json, sys
from heldout.benchmarks.registry import BUILTIN_FAMILIES
for name in BUILTIN_FAMILIES.values():
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def test_loading_every_task_family_imports_neither_evalplus_nor_scipy_signal():
    done = subprocess.run([sys.executable, "-c", LOAD_EVERY_FAMILY], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(json.loads(done.stdout))
    assert "heldout.benchmarks.extraction.code" in loaded and "heldout.benchmarks.geometry.scoring" in loaded
    assert not {name for name in loaded if name.split(".")[0] in ("evalplus", "datasets")}
    assert "scipy.signal" not in loaded


def test_a_long_step_function_scores_as_its_direct_convolution_across_the_fft_switch():
    # at 65 steps and beyond the score takes scipy.signal's FFT convolution (imported then); the
    # direct sum gives the same ratio to rounding, and the short one takes the direct sum itself
    rng = np.random.default_rng(0)
    for steps in (64, 65, 300):
        heights = rng.random(steps)
        f = heights / heights.max()
        conv = np.convolve(f, f)
        y = np.concatenate(([0.0], conv, [0.0]))
        step = 1.0 / (2 * steps)
        l2_sq = (step / 3.0) * float(np.sum(y[:-1] ** 2 + y[:-1] * y[1:] + y[1:] ** 2))
        expected = l2_sq / (step * float(np.sum(conv)) * float(conv.max()))
        scored = scoring.autocorrelation_c2(list(heights))
        assert scored.valid and abs(scored.objective - expected) < 1e-12, (steps, scored)


def test_an_interpreter_a_test_starts_reads_heldouts_modules_from_the_tests_bytecode():
    """tests/conftest.py: where the tests keep bytecode under a folder of their own (writing it is
    off, as on the shared dev machine), every interpreter started with their environment (a heldout
    command, the warm CLI server, a Ray worker) reads and writes its bytecode there too, instead of
    compiling heldout's modules again at every start (0.2 to 0.6 CPU-s of a 1-3 CPU-s start)."""
    if sys.pycache_prefix is None:
        pytest.skip("bytecode is kept beside the sources here: nothing is compiled again")
    code = "import sys, heldout.contracts as m; print(sys.pycache_prefix); print(m.__spec__.cached)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    prefix, cached = done.stdout.split()
    assert prefix == sys.pycache_prefix and cached.startswith(prefix + "/") and os.path.isfile(cached)
