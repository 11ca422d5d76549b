"""Packed model outputs (issue 60): a ledger's size follows what it must prove. A long output is
stored compressed and a repeated one (a memo hit) as a reference to the line that first held it,
yet every reader gets the entry back exactly as recorded, the hash chain is the one an unpacked
ledger has, and a ledger written before packing reads and verifies as before. The adversary: a
line whose stored output was edited, re-compressed to other content, cut, padded, made to point
elsewhere or to inflate to gigabytes; a model whose output looks like a packed value."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import zlib
from pathlib import Path

import pytest

from heldout.evaluators import ledger as ledger_module
from heldout.evaluators.ledger import LEDGER_FILE, Ledger, LedgerError, entry_hash, read_entries, verify_ledger

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "ledger_before_packing"


def reasoning(seed: str, words: int) -> str:
    """A chain of thought of varied words (compresses as prose does, not as a repeated sentence)."""
    vocab = ("the question asks which option follows from the premises so I check each one in turn first second "
             "third because therefore however 3 7 12 answer is not true false holds since").split()
    out, h = [], seed
    while len(out) < words:
        h = hashlib.sha256(h.encode()).hexdigest()
        out.append(vocab[int(h[:4], 16) % len(vocab)])
    return " ".join(out) + "\nSo the answer is (B)."


def evaluation(example: str, text: str, cached: bool = False) -> dict:
    return {"candidate_id": "c" * 64, "split": "train", "example_id": example, "cached": cached, "cost": 1,
            "verdict": {"example_id": example, "score": 0.0, "valid": True, "feedback": "wrong",
                        "output": {"text": text, "answer": "B", "extracted_strict": "B"}}}


def raw_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / LEDGER_FILE).read_text().splitlines()]


def write_lines(run_dir: Path, lines: list[dict]) -> None:
    (run_dir / LEDGER_FILE).write_text("".join(json.dumps(e, sort_keys=True, ensure_ascii=False) + "\n"
                                               for e in lines))


def written(tmp_path: Path, *datas: dict, kind: str = "evaluation") -> Path:
    run_dir = tmp_path / "run"
    ledger = Ledger.open(run_dir)
    with ledger.batch():
        for data in datas:
            ledger.append_entry(kind, data)
    ledger.close()
    return run_dir


def test_a_long_output_is_stored_compressed_and_read_back_exactly_as_recorded(tmp_path):
    text = reasoning("a", 400)
    run_dir = written(tmp_path, evaluation("1", text))
    (line,) = raw_lines(run_dir)
    assert line["packed"] == [[["verdict", "output", "text"], "z"]]
    assert len(json.dumps(line)) < 0.7 * len(json.dumps(evaluation("1", text)))
    (entry,), _ = read_entries(run_dir / LEDGER_FILE)
    assert entry["data"] == evaluation("1", text) and "packed" not in entry
    assert entry_hash(entry) == entry["hash"]  # the hash is of the entry as recorded, unpacked
    assert verify_ledger(run_dir).ok


def test_a_repeated_output_is_stored_once(tmp_path):
    text = reasoning("a", 400)
    run_dir = written(tmp_path, evaluation("1", text), evaluation("1", text, cached=True))
    first, repeat = raw_lines(run_dir)
    assert repeat["packed"] == [[["verdict", "output", "text"], [0, ["verdict", "output", "text"]]]]
    assert len(json.dumps(repeat)) < 700 < len(json.dumps(first))
    entries, _ = read_entries(run_dir / LEDGER_FILE)
    assert [e["data"] for e in entries] == [evaluation("1", text), evaluation("1", text, cached=True)]
    assert verify_ledger(run_dir).ok


def test_a_reopened_writer_and_its_readers_see_the_same_entries(tmp_path):
    texts = [reasoning(str(i % 3), 300) for i in range(6)]
    run_dir = written(tmp_path, *(evaluation(str(i), t) for i, t in enumerate(texts)))
    reopened = Ledger.open(run_dir)
    in_memory = list(reopened.entries())
    reopened.append_entry("evaluation", evaluation("6", texts[0]))
    reopened.close()
    entries, _ = read_entries(run_dir / LEDGER_FILE)
    assert entries[:6] == in_memory and entries[6]["data"] == evaluation("6", texts[0])
    assert verify_ledger(run_dir).ok


def test_an_output_repeated_inside_one_entry_is_compressed_again_not_a_reference_to_itself(tmp_path):
    text = reasoning("a", 400)
    data = evaluation("1", text)
    data["verdict"]["output"]["extracted_flexible"] = text  # extraction fell back to the whole text
    run_dir = written(tmp_path, data)
    assert {form for _, form in raw_lines(run_dir)[0]["packed"]} == {"z"}
    assert read_entries(run_dir / LEDGER_FILE)[0][0]["data"] == data


@pytest.mark.parametrize("output", [
    base64.b64encode(zlib.compress(b"x" * 4000)).decode() * 3,  # the model answers with what a packed value looks like
    "short answer",
    "".join(chr(0x4E00 + i % 2000) for i in range(900)),  # non-ASCII
    ["a list", reasoning("b", 300), {"nested": reasoning("c", 300)}],
])
def test_any_output_a_model_gives_round_trips(tmp_path, output):
    data = {"verdict": {"score": 1.0, "output": output}}
    run_dir = written(tmp_path, data, kind="test_scoring")
    assert read_entries(run_dir / LEDGER_FILE)[0][0]["data"] == data
    assert verify_ledger(run_dir).ok


def test_an_output_a_task_gives_as_a_tuple_or_with_keys_that_are_not_text_reads_back_as_json_has_it(tmp_path):
    text = reasoning("d", 300)
    given = {"verdict": {"score": 1.0, "output": {"steps": (text, "short"), "by_number": {7: text}}}}
    run_dir = written(tmp_path, given, kind="test_scoring")
    assert raw_lines(run_dir)[0]["packed"] == [[["verdict", "output", "steps", 0], "z"],  # as a reader finds them
                                               [["verdict", "output", "by_number", "7"], "z"]]
    read = read_entries(run_dir / LEDGER_FILE)[0][0]["data"]
    assert read == {"verdict": {"score": 1.0, "output": {"steps": [text, "short"], "by_number": {"7": text}}}}
    assert verify_ledger(run_dir).ok


def test_entries_without_a_verdict_are_stored_as_before(tmp_path):
    data = {"task": "t", "note": "n" * 2000}
    run_dir = written(tmp_path, data, kind="session_start")
    (line,) = raw_lines(run_dir)
    assert "packed" not in line and line["data"] == data


# -- the adversary -------------------------------------------------------------------------------
def flip_a_character(line: dict) -> None:
    text = line["data"]["verdict"]["output"]["text"]
    line["data"]["verdict"]["output"]["text"] = text[:40] + ("A" if text[40] != "A" else "B") + text[41:]


def recompress_other_content(line: dict) -> None:
    line["data"]["verdict"]["output"]["text"] = base64.b64encode(zlib.compress(b"a better answer")).decode()


def cut_short(line: dict) -> None:
    line["data"]["verdict"]["output"]["text"] = line["data"]["verdict"]["output"]["text"][:-8]


def pad_after_the_end(line: dict) -> None:
    raw = base64.b64decode(line["data"]["verdict"]["output"]["text"]) + b"extra"
    line["data"]["verdict"]["output"]["text"] = base64.b64encode(raw).decode()


def point_at_a_later_line(line: dict) -> None:
    line["packed"] = [[["verdict", "output", "text"], [5, ["verdict", "output", "text"]]]]


def point_at_a_path_that_is_not_there(line: dict) -> None:
    line["packed"] = [[["verdict", "output", "nowhere"], "z"]]


def drop_the_packed_list(line: dict) -> None:
    del line["packed"]


# (how the line of seq 1 is edited, what verify says about it)
EDITS = [(flip_a_character, "line 2 (seq 1, evaluation)"),
         (recompress_other_content, "entry 1 (seq 1, evaluation): content was edited"),
         (cut_short, "line 2 (seq 1, evaluation)"),
         (pad_after_the_end, "line 2 (seq 1, evaluation)"),
         (point_at_a_later_line, "line 2 (seq 1, evaluation)"),
         (point_at_a_path_that_is_not_there, "line 2 (seq 1, evaluation)"),
         (drop_the_packed_list, "entry 1 (seq 1, evaluation): content was edited")]


@pytest.mark.parametrize("edit, named", EDITS, ids=[e.__name__ for e, _ in EDITS])
def test_an_edited_packed_output_is_tampering_that_names_the_entry(tmp_path, edit, named):
    run_dir = written(tmp_path, evaluation("0", reasoning("z", 300)), evaluation("1", reasoning("a", 400)))
    lines = raw_lines(run_dir)
    edit(lines[1])
    write_lines(run_dir, lines)
    report = verify_ledger(run_dir)
    assert not report.ok and any(named in problem for problem in report.problems), report.problems
    with pytest.raises(LedgerError):
        Ledger.open(run_dir)


def test_a_packed_value_that_would_inflate_past_what_a_reader_takes_is_refused(tmp_path, monkeypatch):
    run_dir = written(tmp_path, evaluation("1", reasoning("a", 400)))
    lines = raw_lines(run_dir)
    lines[0]["data"]["verdict"]["output"]["text"] = base64.b64encode(zlib.compress(b"0" * 200_000, 9)).decode()
    write_lines(run_dir, lines)
    monkeypatch.setattr(ledger_module, "MAX_UNPACKED_CHARS", 100_000)
    report = verify_ledger(run_dir)
    assert not report.ok and "inflate past" in report.problems[0] and "seq 0" in report.problems[0]


# -- ledgers written before packing ---------------------------------------------------------------
def test_a_ledger_written_before_packing_reads_verifies_and_takes_new_entries(tmp_path):
    """The fixture was written by the ledger code of commit 3063550 (outputs stored plain)."""
    run_dir = Path(shutil.copytree(FIXTURE, tmp_path / "run"))
    before = (run_dir / LEDGER_FILE).read_bytes()
    assert b'"packed"' not in before
    entries, torn = read_entries(run_dir / LEDGER_FILE)
    assert not torn and [e["kind"] for e in entries] == ["session_start", "candidate", "evaluation", "evaluation",
                                                         "test_scoring", "session_end"]
    assert entries[2]["data"]["verdict"]["output"]["text"] == entries[3]["data"]["verdict"]["output"]["text"]
    assert len(entries[4]["data"]["verdict"]["output"]) > 1000
    report = verify_ledger(run_dir)
    assert report.ok and report.hmac == "another key", report.problems  # written on another machine
    ledger = Ledger.open(run_dir)
    ledger.append_entry("evaluation", {**entries[2]["data"], "cached": True})
    ledger.close()
    assert (run_dir / LEDGER_FILE).read_bytes().startswith(before)  # the old lines stay as they were
    assert raw_lines(run_dir)[-1]["packed"]
    again, _ = read_entries(run_dir / LEDGER_FILE)
    assert again[:6] == entries and again[6]["data"]["verdict"] == entries[2]["data"]["verdict"]
    assert verify_ledger(run_dir).ok
