"""Field conditions of the protocols that run several studies (``heldout compare arms``, one study
per arm; ``heldout compare verifiers``, one per variant and seed): a stop request in the middle,
and a second process in the same run dir.

In the lab a protocol runs alone and to its end. In the field it is stopped: a batch scheduler
sends SIGTERM at its time limit (then SIGKILL after a grace period), a person presses Ctrl-C.
``heldout run`` stops at a safe point and exits 130; a stop must end the whole comparison there,
not only the arm that was running. The signal here is real: the task's scoring sends it to the
process during the first arm's first session. And two processes started on one folder (a job
resubmitted while the first still runs) must not both write it: one study process per run dir."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from heldout.benchmarks.base import Benchmark
from heldout.benchmarks.registry import register
from heldout.cli import main
from heldout.contracts import Example, Source, Verdict
from heldout.data_manifests import MANIFEST_PATH_ENV, freeze
from heldout.evaluators.records import RECORD_FILE
from heldout.protocols.study_dir import STUDY_LOCK

TARGET = 7


class OneConstant(Benchmark):
    """Score = max(0, 1 - |k - 7| / 10) of the constant ``k = ...`` of ``k.txt``. Once a session
    has started under ``stop_in`` (its first ledger exists), the next call sends the process the
    signal ``stop_with``: mid-session, after the protocol's own checks."""

    family = "fieldtoy"
    kind = "program"
    metric = "closeness"
    source = Source(embedded=True)
    stop_with: int | None = None
    stop_in: Path | None = None

    def __init__(self, name: str) -> None:
        self.name = name

    def load_raw(self, data_dir=None):
        return [Example(id=f"i{i}", input={}, target=TARGET) for i in range(9)]

    def seed_candidate(self):
        return {"k.txt": "k = 0"}

    def run(self, candidate, example, context=None):
        if OneConstant.stop_with is not None and any(OneConstant.stop_in.rglob("ledger.jsonl")):
            sig, OneConstant.stop_with = OneConstant.stop_with, None
            os.kill(os.getpid(), sig)
        found = re.search(r"=\s*(-?\d+)", candidate.get("k.txt", ""))
        if found is None:
            return Verdict.failure(example.id, "expected k = <integer>", "bad_output")
        return Verdict(example.id, score=max(0.0, 1 - abs(int(found.group(1)) - example.target) / 10))


TOY = register(OneConstant("fieldtoy/one-constant"))


@pytest.fixture(scope="module", autouse=True)
def manifests(tmp_path_factory):
    root = tmp_path_factory.mktemp("manifests")
    ids = [ex.id for ex in TOY.load_raw()]
    freeze(TOY.name, TOY.version, TOY.source, TOY.load_raw(),
           {"default": {"train": ids[:3], "val": ids[3:6], "test": ids[6:]}}).save(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(MANIFEST_PATH_ENV, str(root))
        yield root


def compare_arms(run_dir: Path) -> int:
    return main(["-q", "compare", "arms", "--task", TOY.name, "--optimizer", "constant-search", "--budget", "24",
                 "--width", "2", "--seeds", "0,1,2", "--run-dir", str(run_dir), "--min-headroom", "0"])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_during_one_arm_ends_the_whole_comparison_and_a_rerun_finishes_it(sig, tmp_path, capsys):
    """It stopped only the arm that was running: the next arms ran in full after the stop request,
    and the comparison was read and written from a run dir missing the stopped runs (exit 1)."""
    run_dir = tmp_path / "arms"
    OneConstant.stop_with, OneConstant.stop_in = sig, run_dir
    assert compare_arms(run_dir) == 130
    err = capsys.readouterr().err
    assert "stopped in arm serial" in err and "re-run the same command" in err and "Traceback" not in err
    assert "--resume" not in err  # compare arms has no such flag: the same command continues it
    assert OneConstant.stop_with is None  # the signal was sent, during the first arm
    started = sorted(p.parent.relative_to(run_dir).parts[0] for p in run_dir.rglob("ledger.jsonl"))
    assert started and set(started) == {"arm-serial"}, started  # no later arm began
    assert not (run_dir / "arms_result.json").exists()

    assert compare_arms(run_dir) == 0  # the same command continues it
    assert len(list(run_dir.rglob(RECORD_FILE))) == 3 + 3 * 2 + 3  # serial, 2 forks, merge; 3 seeds each
    assert (run_dir / "arms_result.json").is_file()


def compare_verifiers(run_dir: Path) -> int:
    return main(["-q", "compare", "verifiers", "--task", TOY.name, "--optimizer", "constant-search", "--variants",
                 "decomposed,scalar", "--seeds", "0,1,2", "--budget", "24", "--run-dir", str(run_dir)])


def test_a_stop_during_a_verifier_ablation_is_an_interruption_not_a_failure_and_a_rerun_finishes_it(tmp_path, capsys):
    """compare verifiers runs one study of every variant and seed: a stop was reported as
    "N session(s) failed" with exit 2 (bad input, by the house rules), and the summary told the
    user to rerun with --resume, a flag compare verifiers does not have."""
    run_dir = tmp_path / "verifiers"
    OneConstant.stop_with, OneConstant.stop_in = signal.SIGTERM, run_dir
    assert compare_verifiers(run_dir) == 130
    err = capsys.readouterr().err
    assert "re-run the same command" in err and "failed" not in err.splitlines()[-1] and "--resume" not in err
    assert compare_verifiers(run_dir) == 0
    assert len(list(run_dir.rglob(RECORD_FILE))) == 2 * 2 * 3  # each variant: the optimizer and the seed, 3 seeds


def test_a_run_dir_another_study_process_holds_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    """Another process holds the run dir's study lock, as a running ``heldout run`` or ``compare
    arms`` does: compare arms went ahead (it took no lock), writing arms.json and its arms' runs
    beside the other process's."""
    run_dir = tmp_path / "arms"
    run_dir.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from heldout.evaluators.ledger_io import hold_lock; "
                               f"hold_lock(Path({str(run_dir / STUDY_LOCK)!r})); print('held', flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert compare_arms(run_dir) == 2
    finally:
        holder.communicate("", timeout=30)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "in use by another study process" in err[0], err
    assert sorted(os.listdir(run_dir)) == [STUDY_LOCK]
