"""Batched ledger writes (issue 60): a batch costs one write, one fsync and one head, and a writer
killed with SIGKILL at any point of a batch leaves a ledger that reopens, verifies and holds
exactly what was acknowledged. The adversary: entries appended behind the writer's back, a head
rewritten to cut the ledger short, a finished run's ledger with a tail."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from heldout.evaluators import ledger as ledger_module
from heldout.evaluators import ledger_io
from heldout.evaluators.ledger import (HEAD_FILE, LEDGER_FILE, RECORD_FILE, Ledger, LedgerError, LedgerWriteError,
                                       entry_hash, verify_ledger)

ROOT = Path(__file__).resolve().parent.parent


def lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / LEDGER_FILE).read_text().splitlines()]


def test_a_batch_is_one_write_one_fsync_and_one_head(tmp_path, monkeypatch):
    ledger = Ledger.open(tmp_path)
    ledger.append_entry("session_start", {})
    syncs, heads = [], []
    monkeypatch.setattr(ledger_io, "sync_data", lambda fd: syncs.append(fd))
    real_head = ledger._write_head
    monkeypatch.setattr(ledger, "_write_head", lambda *a, **k: (heads.append(a[1]), real_head(*a, **k)))
    with ledger.batch():
        ledger.append_entry("candidate", {"candidate_id": "c"}, sync=False)
        for i in range(50):
            ledger.append_entry("evaluation", {"i": i})
        assert len(lines(tmp_path)) == 1 and syncs == []  # nothing written inside the block
    assert len(syncs) == 1 and heads == [52]
    ledger.close()
    report = verify_ledger(tmp_path)
    assert report.ok and report.entries == 52


def test_an_unsynced_entry_waits_for_the_next_synced_one(tmp_path):
    ledger = Ledger.open(tmp_path)
    ledger.append_entry("candidate", {"candidate_id": "c"}, sync=False)
    assert not (tmp_path / LEDGER_FILE).read_bytes()
    assert [e["kind"] for e in ledger.entries()] == ["candidate"]  # the writer's chain has it
    ledger.append_entry("evaluation", {"i": 0})
    assert [e["kind"] for e in lines(tmp_path)] == ["candidate", "evaluation"]
    ledger.close()
    assert verify_ledger(tmp_path).ok


def test_an_unsynced_entry_is_written_at_close(tmp_path):
    ledger = Ledger.open(tmp_path)
    ledger.append_entry("evaluation", {"i": 0})
    ledger.append_entry("note", {"i": 1}, sync=False)
    ledger.close()
    assert [e["kind"] for e in lines(tmp_path)] == ["evaluation", "note"] and verify_ledger(tmp_path).ok


def test_a_batch_that_ends_by_an_exception_still_writes_its_entries(tmp_path):
    ledger = Ledger.open(tmp_path)
    with pytest.raises(RuntimeError):
        with ledger.batch():
            ledger.append_entry("evaluation", {"i": 0})
            raise RuntimeError("the scorer failed")
    assert len(lines(tmp_path)) == 1
    ledger.close()
    assert verify_ledger(tmp_path).ok


def test_another_threads_synced_append_is_durable_when_it_returns(tmp_path):
    ledger = Ledger.open(tmp_path)
    with ledger.batch():
        ledger.append_entry("evaluation", {"i": 0})
        other = threading.Thread(target=ledger.append_entry, args=("architect_call", {"t": 1}))
        other.start()
        other.join()
        # the other thread's entry (and the batch's so far, which it follows) is on disk already
        assert [e["kind"] for e in lines(tmp_path)] == ["evaluation", "architect_call"]
    ledger.close()
    assert verify_ledger(tmp_path).ok


# -- SIGKILL at every point of a batch -----------------------------------------------------------
# The child appends 5 acknowledged entries, then a batch of 20, and kills itself at STAGE of the
# batch's flush: before its write, after half of its bytes, after the write (before the fsync),
# after the fsync (before the head), after the head.
KILLER = r"""
import os, signal, sys
from heldout.evaluators import ledger as L
from heldout.evaluators import ledger_io as LIO
run_dir, stage, long_outputs = sys.argv[1], sys.argv[2], sys.argv[3] == "long outputs"
def data(i, acknowledged):  # long outputs: stored compressed, a repeat as a reference to an earlier line
    if not long_outputs:
        return {"i": i, "acknowledged": acknowledged}
    return {"i": i, "acknowledged": acknowledged, "verdict": {"output": f"reasoning {i % 3} " * 200}}
def die():
    os.kill(os.getpid(), signal.SIGKILL)
wait = sys.argv[4] == "waits"  # or "behind": the batch's fsync and head are made on a thread
ledger = L.Ledger.open(run_dir)
for i in range(5):
    ledger.append_entry("evaluation", data(i, True))
real_write, real_fsync, real_head = L.write_all, LIO.sync_data, ledger._write_head
def write(fd, data):
    if stage == "before write":
        die()
    if stage == "mid write":
        real_write(fd, data[: len(data) // 2])
        die()
    real_write(fd, data)
    if stage == "after write":
        die()
def fsync(fd):
    real_fsync(fd)
    if stage == "after fsync":
        die()
def head(*args, **kwargs):
    real_head(*args, **kwargs)
    if stage == "after head":
        die()
L.write_all, LIO.sync_data, ledger._write_head = write, fsync, head
with ledger.batch(wait=wait):
    for i in range(20):
        ledger.append_entry("evaluation", data(5 + i, False))
ledger.close()  # waits for a batch made durable behind; the stages above kill first
"""
STAGES = ("before write", "mid write", "after write", "after fsync", "after head")


@pytest.mark.parametrize("wait", ["waits", "behind"])
@pytest.mark.parametrize("payload", ["short", "long outputs"])
@pytest.mark.parametrize("stage", STAGES)
def test_a_writer_killed_at_any_point_of_a_batch_reopens_verified_with_what_was_acknowledged(tmp_path, stage, payload,
                                                                                            wait):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", KILLER, str(run_dir), stage, payload, wait], env=env,
                          capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    reopened = Ledger.open(run_dir)
    kinds = [e["kind"] for e in reopened.entries()]
    evaluations = [e["data"] for e in reopened.entries("evaluation")]
    reopened.append_entry("session_resumed", {})
    reopened.close()
    assert verify_ledger(run_dir).ok
    if stage == "after head":  # the head named the batch: it was complete, and it stays
        assert len(evaluations) == 25 and kinds == ["evaluation"] * 25
    else:  # the batch was never acknowledged: exactly the five acknowledged entries stay
        assert [(e["i"], e["acknowledged"]) for e in evaluations] == [(i, True) for i in range(5)]
    if payload == "long outputs":  # stored packed, read back whole
        assert "packed" in (run_dir / LEDGER_FILE).read_text()
        assert [e["verdict"]["output"] for e in evaluations] == [f"reasoning {i % 3} " * 200
                                                                   for i in range(len(evaluations))]
    repairs = {"mid write": ["torn_tail_repaired", "unclaimed_tail_dropped"],
               "after write": ["unclaimed_tail_dropped"], "after fsync": ["unclaimed_tail_dropped"]}
    assert kinds[len(evaluations):] == repairs.get(stage, [])


# -- a batch made durable behind (held-out chunks) -----------------------------------------------
def test_a_batch_that_does_not_wait_returns_before_its_fsync_and_is_durable_by_the_next_flush(tmp_path, monkeypatch):
    ledger = Ledger.open(tmp_path)
    ledger.append_entry("session_start", {})
    release, syncing = threading.Event(), threading.Event()
    real_fsync = ledger_io.sync_data

    def slow_fsync(fd):  # the disk takes its time: until the test releases it
        syncing.set()
        assert release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(ledger_io, "sync_data", slow_fsync)
    with ledger.batch(wait=False):
        for i in range(10):
            ledger.append_entry("val_scoring", {"i": i})
    assert syncing.wait(10)  # the fsync is under way on its own thread, and the block has returned
    assert len(lines(tmp_path)) == 11  # written ...
    assert json.loads((tmp_path / HEAD_FILE).read_text())["count"] == 1  # ... but not yet claimed
    assert len(ledger) == 11 and [e["data"]["i"] for e in ledger.entries("val_scoring")] == list(range(10))
    release.set()
    ledger.append_entry("session_end", {})  # a synced entry waits for the batch before it
    assert json.loads((tmp_path / HEAD_FILE).read_text())["count"] == 12
    ledger.close()
    report = verify_ledger(tmp_path)
    assert report.ok and report.entries == 12


def test_a_batch_whose_fsync_fails_behind_is_refused_at_the_next_flush_and_the_ledger_stands_before_it(
        tmp_path, monkeypatch):
    ledger = Ledger.open(tmp_path)
    ledger.append_entry("session_start", {})
    before = (tmp_path / LEDGER_FILE).read_bytes(), (tmp_path / HEAD_FILE).read_bytes()

    def failing_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ledger_io, "sync_data", failing_fsync)
    with ledger.batch(wait=False):  # returns: the failure is not known yet
        ledger.append_entry("val_scoring", {"i": 0})
    with pytest.raises(LedgerWriteError, match="Input/output error"):
        ledger.append_entry("session_end", {})
    assert ((tmp_path / LEDGER_FILE).read_bytes(), (tmp_path / HEAD_FILE).read_bytes()) == before
    assert len(ledger) == 1
    with pytest.raises(LedgerWriteError):  # nothing is written after a hole
        ledger.append_entry("session_end", {})
    ledger.close()
    assert verify_ledger(tmp_path).ok


def test_a_head_that_fails_behind_for_any_reason_is_refused_at_the_next_flush_not_lost(tmp_path, monkeypatch):
    ledger = Ledger.open(tmp_path)
    ledger.append_entry("session_start", {})
    before = (tmp_path / HEAD_FILE).read_bytes()

    def broken_head(*args, **kwargs):
        raise ValueError("a bug in the head's code")

    monkeypatch.setattr(ledger, "_write_head", broken_head)
    with ledger.batch(wait=False):
        ledger.append_entry("val_scoring", {"i": 0})
    with pytest.raises(LedgerWriteError, match="ValueError: a bug in the head's code"):
        ledger.append_entry("session_end", {})
    assert (tmp_path / HEAD_FILE).read_bytes() == before and len(lines(tmp_path)) == 1
    ledger.close()
    assert verify_ledger(tmp_path).ok


def test_heads_are_written_in_place_one_write_each_and_a_signed_head_replaces_the_file(tmp_path, monkeypatch):
    ledger = Ledger.open(tmp_path)
    ledger.append_entry("evaluation", {"i": 0})
    first = (tmp_path / HEAD_FILE).stat().st_ino
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda *a: (renames.append(a), real_replace(*a)))
    for i in range(1, 12):  # the count grows a digit: the head grows in place
        ledger.append_entry("evaluation", {"i": i})
    assert renames == [] and (tmp_path / HEAD_FILE).stat().st_ino == first
    assert json.loads((tmp_path / HEAD_FILE).read_text())["count"] == 12
    ledger.close()  # signs: a new file, renamed into place
    assert verify_ledger(tmp_path).ok
    assert [Path(b).name for _, b in renames] == ([HEAD_FILE] if ledger.signing_key is not None else [])
    assert not list(tmp_path.glob("*.tmp"))


# -- the adversary -------------------------------------------------------------------------------
def forged_entry(previous: dict, kind: str, data: dict) -> dict:
    """A well-chained entry anyone can compute (the chain's hashes need no secret)."""
    entry = {"seq": previous["seq"] + 1, "prev": previous["hash"], "kind": kind, "time": previous["time"],
             "data": data}
    entry["hash"] = entry_hash(entry)
    return entry


def test_entries_appended_behind_the_writers_back_are_dropped_on_resume_not_adopted(tmp_path):
    ledger = Ledger.open(tmp_path)
    for i in range(3):
        ledger.append_entry("evaluation", {"i": i, "score": 0.0})
    ledger.close()
    last = lines(tmp_path)[-1]
    forged = [forged_entry(last, "evaluation", {"i": 3, "score": 1.0})]
    forged.append(forged_entry(forged[0], "evaluation", {"i": 4, "score": 1.0}))
    with open(tmp_path / LEDGER_FILE, "a") as fh:
        fh.writelines(json.dumps(e, sort_keys=True) + "\n" for e in forged)
    assert not verify_ledger(tmp_path).ok  # the head names 3 entries, the file holds 5
    reopened = Ledger.open(tmp_path)
    assert [e["data"].get("score") for e in reopened.entries("evaluation")] == [0.0, 0.0, 0.0]
    dropped = next(reopened.entries("unclaimed_tail_dropped"))["data"]
    assert dropped["entries"] == 2 and dropped["kinds"] == ["evaluation"]
    reopened.close()
    assert verify_ledger(tmp_path).ok


def test_a_head_rewritten_to_cut_the_ledger_short_is_refused_not_obeyed(tmp_path):
    ledger = Ledger.open(tmp_path)
    for i in range(4):
        ledger.append_entry("evaluation", {"i": i})
    ledger.close()
    entries = lines(tmp_path)
    head = json.loads((tmp_path / HEAD_FILE).read_text())
    head.update(count=2, hash=entries[1]["hash"])  # the mac still anchors 4 entries: a forgery
    head.pop("signature", None)
    (tmp_path / HEAD_FILE).write_text(json.dumps(head))
    with pytest.raises(LedgerError, match="does not verify"):
        Ledger.open(tmp_path)
    assert len(lines(tmp_path)) == 4  # nothing was cut


def test_a_finished_runs_ledger_is_never_cut(tmp_path):
    ledger = Ledger.open(tmp_path)
    ledger.append_entry("evaluation", {"i": 0})
    ledger.close()
    (tmp_path / RECORD_FILE).write_text(json.dumps({"ledger_head": lines(tmp_path)[-1]["hash"]}))
    with open(tmp_path / LEDGER_FILE, "a") as fh:
        fh.write(json.dumps(forged_entry(lines(tmp_path)[-1], "evaluation", {"i": 1}), sort_keys=True) + "\n")
    with pytest.raises(LedgerError, match="does not verify"):
        Ledger.open(tmp_path)
    assert len(lines(tmp_path)) == 2


@pytest.mark.parametrize("given,read_back", [({2: "a", 10: "b"}, {"10": "b", "2": "a"}),
                                             ({1: "one", "b": "two"}, {"1": "one", "b": "two"}),
                                             ({"n": [{3: 1.5, 20: None}]}, {"n": [{"20": None, "3": 1.5}]})])
def test_keys_that_are_not_text_are_recorded_as_read_back_so_the_ledger_verifies(tmp_path, given, read_back):
    ledger = Ledger.open(tmp_path)  # a task's output keyed by number: hashed in key order a reader reproduces
    entry = ledger.append_entry("evaluation", {"output": given})
    assert [e["data"]["output"] for e in ledger.entries()] == [read_back] and entry["data"]["output"] == read_back
    ledger.close()
    report = verify_ledger(tmp_path)
    assert report.ok, report.describe()
    assert report.checked[0]["data"]["output"] == read_back


@pytest.mark.parametrize("value", ["lone \ud800 surrogate", b"raw \xff bytes", {b"key": 1}, ("a", "tuple")])
def test_what_json_cannot_carry_as_utf8_is_still_made_encodable(tmp_path, value):
    ledger = Ledger.open(tmp_path)
    ledger.append_entry("evaluation", {"output": value})
    ledger.close()
    assert verify_ledger(tmp_path).ok
    recorded = lines(tmp_path)[0]["data"]["output"]
    assert recorded == ledger_module.encodable(value)
    assert "\ud800" not in json.dumps(recorded, ensure_ascii=False)


def test_entries_kept_on_disk_are_read_back_from_the_file_and_never_held_in_memory(tmp_path):
    first = Ledger.open(tmp_path)
    first.append_entry("evaluation", {"n": 1})
    first.append_entry("test_scoring", {"output": "the secret answer"})
    first.append_entry("evaluation", {"n": 2})
    first.close()
    reopened = Ledger.open(tmp_path, on_disk={"test_scoring"})
    assert not any("secret" in repr(r.__getattribute__(slot)) for r in reopened._entries
                   for slot in ("_canonical", "_entry"))  # kind and hash only
    reopened.append_entry("test_scoring", {"output": "scored after the reopening"})
    assert [e["data"] for e in reopened.entries("test_scoring")] == [{"output": "the secret answer"},
                                                                     {"output": "scored after the reopening"}]
    assert [e["seq"] for e in reopened.entries()] == [0, 1, 2, 3]
    reopened.close()
    # an entry edited on disk behind the open writer's back is refused when read, not served
    reopened = Ledger.open(tmp_path, on_disk={"test_scoring"})
    text = (tmp_path / LEDGER_FILE).read_text()
    (tmp_path / LEDGER_FILE).write_text(text.replace("the secret answer", "another answer!!!"))
    with pytest.raises(LedgerError, match="entry 1 \\(test_scoring\\) changed on disk"):
        list(reopened.entries("test_scoring"))
