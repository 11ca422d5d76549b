"""A full disk never invalidates finished work (issue 53): a ledger write that fails leaves the
ledger as it was before that entry (verifiable, never "appended behind the writer's back"), the
user gets one line naming the run dir and the way out, and ``--resume`` finishes the study once
space is freed, with the records an uninterrupted run gives.

The disk is real: a small tmpfs mounted for the test (root only, as in CI), filled by the study
itself or by a filler file the test writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from heldout.contracts import HeldoutError
from heldout.evaluators.ledger import HEAD_FILE, LEDGER_FILE, Ledger, LedgerError, LedgerWriteError, verify_ledger
from heldout.evaluators.records import RECORD_FILE
from small_disk import fill, grow, small_disk

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def entry_data(n: int) -> dict:
    return {"n": n, "text": "y" * 3000}  # most of a page: a write near the end of the disk is cut short


# -- the ledger itself ------------------------------------------------------------------------------------
def test_a_write_that_fails_for_space_leaves_the_ledger_as_it_was_and_the_writer_stops(tmp_path):
    with small_disk(tmp_path / "disk", "64k") as disk:
        run_dir = disk / "cell"
        ledger = Ledger.open(run_dir)
        for n in range(3):
            ledger.append_entry("event", entry_data(n))
        filler = fill(disk)
        before = (run_dir / LEDGER_FILE).read_bytes(), (run_dir / HEAD_FILE).read_bytes()

        appended = 0
        with pytest.raises(LedgerWriteError) as failed:
            while True:  # the file's last page may still hold an entry or two; then the disk is full
                ledger.append_entry("event", entry_data(3 + appended))
                appended += 1
                before = (run_dir / LEDGER_FILE).read_bytes(), (run_dir / HEAD_FILE).read_bytes()
        message = str(failed.value)
        assert isinstance(failed.value, LedgerError) and isinstance(failed.value, HeldoutError)
        assert "\n" not in message and str(run_dir) in message
        assert "no space left on device" in message and "--resume" in message

        # no partial line, no entry the head does not name: the files are exactly as before the failed entry
        assert ((run_dir / LEDGER_FILE).read_bytes(), (run_dir / HEAD_FILE).read_bytes()) == before
        report = verify_ledger(run_dir)
        assert report.ok, report.describe()
        assert report.entries == len(ledger) == 3 + appended

        # nothing is written after a hole: this writer refuses even once there is space again
        filler.unlink()
        with pytest.raises(LedgerWriteError):
            ledger.append_entry("event", {"n": "after"})
        assert (run_dir / LEDGER_FILE).read_bytes() == before[0]
        ledger.close()

        # a new writer (what --resume opens) continues the same chain
        resumed = Ledger.open(run_dir)
        resumed.append_entry("event", {"n": "resumed"})
        resumed.close()
        report = verify_ledger(run_dir)
        assert report.ok, report.describe()
        assert [e["data"]["n"] for e in report.checked][-2:] == [2 + appended, "resumed"]


def test_a_new_cell_on_a_full_disk_gets_the_one_line_error_and_no_ledger_file(tmp_path):
    with small_disk(tmp_path / "disk", "32k") as disk:
        filler = fill(disk)
        run_dir = disk / "cell"
        ledger = Ledger.open(run_dir)  # the lock and the empty ledger need no data page
        with pytest.raises(LedgerWriteError, match="no space left on device"):
            ledger.append_entry("session_start", {"task": "t"})
        ledger.close()
        # nothing was recorded, so there is no ledger to verify (nor one that looks emptied)
        assert not (run_dir / LEDGER_FILE).exists() and not (run_dir / HEAD_FILE).exists()
        filler.unlink()
        again = Ledger.open(run_dir)
        again.append_entry("session_start", {"task": "t"})
        again.close()
        assert verify_ledger(run_dir).entries == 1


# -- a whole study through the command line ------------------------------------------------------------------
STUDY = ["--task", "lockpicking/six", "--profile", "paper", "--optimizer", "seed", "--optimizer", "local-search",
         "--seeds", "0,1", "--budget", "60"]
# A finished study of STUDY takes ~330 KB of run dir (4 cells); 200 KB runs out in its third cell.
TOO_SMALL, ENOUGH = "200k", "4m"


@pytest.fixture
def heldout(warm_cli):
    """The real ``heldout`` command, a process of its own (forked warm: tests/warm_cli.py)."""
    return lambda *args: warm_cli.run(*args, cwd=REPO, env=ENV, timeout=600)


def records(root: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(root.rglob(RECORD_FILE)):
        record = json.loads(path.read_text())
        out[str(path.parent.relative_to(root))] = {"status": record["status"], "test_score": record["test_score"],
                                                   "final_candidate": record["final_candidate"]}
    return out


def test_a_study_that_fills_the_disk_says_so_in_one_line_and_resumes_to_the_uninterrupted_records(tmp_path, heldout):
    uninterrupted = tmp_path / "uninterrupted"
    assert heldout("run", *STUDY, "--run-dir", str(uninterrupted)).returncode == 0
    expected = records(uninterrupted)
    assert len(expected) == 4

    with small_disk(tmp_path / "disk", TOO_SMALL) as disk:
        study = disk / "study"
        full = heldout("run", *STUDY, "--run-dir", str(study))
        output = full.stdout + full.stderr
        assert full.returncode != 0, output
        assert "Traceback" not in output and "Errno" not in output, output
        said = [line for line in output.splitlines() if "no space left on device" in line]
        assert said and all("--resume" in line and str(study) in line for line in said), output

        # the cell the disk stopped is consistent (not INVALID), and so is every finished one
        cells = sorted({p.parent for p in study.rglob(LEDGER_FILE)})
        unfinished = [c for c in cells if not (c / RECORD_FILE).exists()]
        assert unfinished, "the disk should have run out before the last cell finished"
        for cell in cells:
            assert verify_ledger(cell).ok, verify_ledger(cell).describe()
        check = heldout("ledger", "verify", str(study))
        assert "INVALID" not in check.stdout and check.returncode == 0, check.stdout + check.stderr

        grow(disk, ENOUGH)
        resumed = heldout("run", *STUDY, "--run-dir", str(study), "--resume")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert records(study) == expected
        check = heldout("ledger", "verify", str(study))
        assert check.returncode == 0 and check.stdout.count("ok ") == 4, check.stdout + check.stderr


def test_a_study_that_cannot_write_its_first_file_says_so_in_one_line_and_the_same_command_then_runs(tmp_path, heldout):
    with small_disk(tmp_path / "disk", ENOUGH) as disk:
        filler = fill(disk)
        study = disk / "study"
        full = heldout("run", *STUDY, "--seeds", "0", "--run-dir", str(study))
        assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr
        assert full.stderr.count("\n") == 1 and "no space left on device" in full.stderr, full.stderr
        filler.unlink()
        again = heldout("run", *STUDY, "--seeds", "0", "--run-dir", str(study))
        assert again.returncode == 0, again.stdout + again.stderr
