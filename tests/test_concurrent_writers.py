"""Concurrent writers of one study (containment family 7).

The adversary is not malicious here, only unlucky: two ``heldout run --resume`` started together
on a killed study. One of them used to end with a ``FileNotFoundError`` traceback renaming
``study.tmp`` (both wrote the same temp name). Now the study dir is held by one process for its
whole run, and every shared file is written through a temp name unique to its writer: the loser
gets one clear "in use" line and exit 2, the winner finishes, nothing is torn. Timing varies, so
the race is run in a loop."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from heldout.files import remove_stale_temp_files, write_text_atomically
from heldout.evaluators.ledger import LEDGER_FILE, verify_ledger
from heldout.evaluators.records import RECORD_FILE
from paced_studies import PACED_SEARCH, env, kill_after, start_cli

ARGS = ["run", "--task", "circle_packing/square26", "--optimizer", "search=paced:optimize", "--seeds", "0,1",
        "--budget", "12"]


def start(cwd: Path, run_dir: Path, *extra: str, pace: float = 0.0) -> subprocess.Popen:
    return start_cli([*ARGS, "--run-dir", str(run_dir), *extra], cwd, pace)


def killed_study(tmp_path: Path, name: str) -> Path:
    run_dir = tmp_path / name
    kill_after(start(tmp_path, run_dir, pace=0.3), run_dir, 3)
    return run_dir


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_second_runner_of_a_running_study_is_refused_in_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "paced.py").write_text(textwrap.dedent(PACED_SEARCH))
    run_dir = killed_study(tmp_path, "study")
    holder = start(tmp_path, run_dir, "--resume")
    try:
        give_up = time.monotonic() + 120
        # the killed study left its own pid in study.lock; wait for the holder's, or the second
        # runner may take the free lock first and the holder be the one refused
        while (run_dir / "study.lock").read_bytes() != f"pid {holder.pid}".encode():
            assert holder.poll() is None and time.monotonic() < give_up, holder.communicate()
            time.sleep(0.01)
        # stopped while it holds the lock, so it is still running (not finished) when the second
        # comes, however loaded the machine: PACE cannot slow it, its optimizer runs isolated and
        # sees only the sandbox's environment (a loaded run once finished first)
        os.killpg(holder.pid, signal.SIGSTOP)
        before = snapshot(run_dir)
        before.pop("study.lock")
        second = subprocess.run([sys.executable, "-m", "heldout.cli", *ARGS, "--run-dir", str(run_dir), "--resume"],
                                cwd=tmp_path, env=env(0.0), capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stdout + second.stderr
        assert "is in use by another study process (pid " in second.stderr and "Traceback" not in second.stderr
        assert second.stderr.strip().count("\n") == 0  # one line
        after = snapshot(run_dir)
        assert all(after.get(name) is not None for name in before)  # nothing the second one touched was lost
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def test_two_resumes_started_together_give_one_runner_and_a_clean_refusal_in_a_loop(tmp_path):
    (tmp_path / "paced.py").write_text(textwrap.dedent(PACED_SEARCH))
    for trial in range(3):
        run_dir = killed_study(tmp_path, f"study-{trial}")
        pair = [start(tmp_path, run_dir, "--resume") for _ in range(2)]
        done = [(p.wait(timeout=600), p.stdout.read(), p.stderr.read()) for p in pair]
        for code, out, err in done:
            assert "Traceback" not in err, err
            assert code == 0 or (code == 2 and "in use by another study process" in err), (code, out, err)
        assert any(code == 0 for code, _, _ in done)
        json.loads((run_dir / "study.json").read_text())  # whole, never torn
        assert len(list(run_dir.rglob(RECORD_FILE))) == 2
        assert all(verify_ledger(p.parent).ok for p in run_dir.rglob(LEDGER_FILE))
        assert not [p for p in run_dir.rglob("*.tmp")]


def _hammer(path: str, text: str, times: int) -> None:
    for _ in range(times):
        write_text_atomically(path, text)


def test_writers_of_one_file_never_share_a_temp_name_and_a_reader_sees_a_whole_text(tmp_path):
    target = tmp_path / "shared.json"
    texts = [json.dumps({"writer": k, "pad": "x" * 20_000}) for k in range(2)]
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_hammer, args=(str(target), text, 300)) for text in texts]
    for w in writers:
        w.start()
    seen = set()
    while any(w.is_alive() for w in writers):
        if target.exists():
            seen.add(target.read_text())
    for w in writers:
        w.join()
        assert w.exitcode == 0  # the old shared "shared.tmp" made one writer's rename fail
    assert seen <= set(texts) and target.read_text() in texts
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.json"]


def test_a_resume_removes_temp_files_of_dead_writers_and_never_a_live_ones(tmp_path):
    # kill -9 between a temp file's creation and its rename leaves it behind; the process that
    # claims the study next removes it, but not one whose writer still runs
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    nested = tmp_path / "cell" / "seed-0"
    nested.mkdir(parents=True)
    stale = nested / f"ledger.head.{gone.pid}.0a1b2c3d.tmp"
    live = nested / f"record.json.{os.getpid()}.0a1b2c3d.tmp"
    other = nested / "notes.tmp"  # not a temp name of write_text_atomically: left alone
    for path in (stale, live, other):
        path.write_text("x")
    assert remove_stale_temp_files(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()
