"""`heldout verify STUDY`: a reviewer with a copy of a real study and the writer's public key
re-derives every number (each run record from its ledger, the report's results.json from the
records) and is told exactly which number differs, in which file, with both values, whoever
edited it and whatever key they re-signed it with."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Callable

import pytest

from heldout.cli import main
from heldout.evaluators.ledger import GENESIS, HEAD_PURPOSE, entry_hash, head_payload
from heldout.evaluators.records import RunRecord
from heldout.evaluators.signing import SigningKey, load_signing_key, write_new_key
import heldout.reports.verify as verify
from heldout.reports.verify import EXIT_CODES

TASK_DIR = "lockpicking__six"
RUNS = [f"{TASK_DIR}/{method}/seed-{seed}" for method in ("seed", "local-search") for seed in (0, 1)]


@pytest.fixture(scope="module")
def study(warm_cli, tmp_path_factory) -> Path:
    """A real study (seed and local-search, two seeds each, on the embedded lockpicking/six) and its
    report, made by the real commands, in the study dir as docs/ci-regression-gate.md lays it out."""
    root = tmp_path_factory.mktemp("verify")
    for args in (["run", "--task", "lockpicking/six", "--optimizer", "seed", "--optimizer", "local-search",
                  "--seeds", "0,1", "--budget", "20", "--run-dir", "study"],
                 ["report", "study", "--out", "study/report"]):
        done = warm_cli.run("-q", *args, cwd=root, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    return root / "study"


@pytest.fixture(scope="module")
def writer(study) -> SigningKey:
    """The key the study was signed with (the tests' own, see conftest)."""
    key = load_signing_key(create=False)
    assert key is not None, "the tests' writer signs with a key of its own (conftest)"
    return key


@pytest.fixture
def reviewer(writer, tmp_path, monkeypatch) -> Callable[..., tuple[int, str]]:
    """`heldout verify` as a reviewer on another machine runs it: no ledger key, no signing key of
    the writer's, only the writer's public key to trust."""
    elsewhere = tmp_path / "reviewer-config"
    monkeypatch.setenv("HELDOUT_LEDGER_KEY", str(elsewhere / "ledger.key"))
    monkeypatch.setenv("HELDOUT_SIGNING_KEY_FILE", str(elsewhere / "signing.key"))

    def verify(study_dir: Path, *extra: str) -> tuple[int, str]:
        import contextlib
        import io
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["verify", str(study_dir), "--trust-key", f"writer={writer.public_key}", *extra])
        assert not (elsewhere / "ledger.key").exists() and not (elsewhere / "signing.key").exists()
        return code, out.getvalue() + err.getvalue()
    return verify


def copy_of(study: Path, tmp_path: Path) -> Path:
    """The study as a reviewer receives it: another machine, another absolute path."""
    return Path(shutil.copytree(study, tmp_path / "received" / "copy-of-study"))


def ledger_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]


def write_ledger(run_dir: Path, entries: list[dict]) -> None:
    (run_dir / "ledger.jsonl").write_text("".join(json.dumps(e, sort_keys=True, ensure_ascii=False) + "\n"
                                                  for e in entries))


def forge(run_dir: Path, key: SigningKey, edit_entries: Callable[[list[dict]], None],
          edit_record: Callable[[dict], None] = lambda record: None) -> None:
    """What a forger holding a key of their own does: edit entries and the record, re-chain every
    hash, re-anchor the record (its digest in session_end), and re-sign head and record."""
    entries = ledger_lines(run_dir)
    edit_entries(entries)
    data = json.loads((run_dir / "run_record.json").read_text())
    edit_record(data)
    record = RunRecord(**{k: data[k] for k in RunRecord.__dataclass_fields__ if k in data})
    next(e for e in entries if e["kind"] == "session_end")["data"]["record_sha256"] = record.digest()
    prev = GENESIS
    for seq, entry in enumerate(entries):
        entry.update(seq=seq, prev=prev)
        entry["hash"] = prev = entry_hash(entry)
    write_ledger(run_dir, entries)
    record.ledger_head, record.ledger_entries = prev, len(entries)
    record.sign(key)
    record.save(run_dir)
    (run_dir / "ledger.head").write_text(json.dumps({"count": len(entries), "hash": prev, "signature": key.sign(
        HEAD_PURPOSE, head_payload(entries[0]["hash"], len(entries), prev))}))


def line_of(out: str, run_dir: Path | str) -> str:
    """The authenticity line verify prints for one run dir."""
    return next(line for line in out.splitlines() if f"{run_dir}: " in line and not line.startswith("  "))


def last_test_scoring(entries: list[dict]) -> dict:
    return [e for e in entries if e["kind"] == "test_scoring"][-1]


# -- a study that is what it says ------------------------------------------------------------------
def test_a_copy_of_a_real_study_re_derives_exactly_on_the_reviewers_side(study, writer, tmp_path, reviewer):
    stated = json.loads((study / "report" / "results.json").read_text())
    assert [d["from_report"] for d in stated["derived_from"]["run_dirs"]] == [".."]
    code, out = reviewer(copy_of(study, tmp_path))
    assert code == EXIT_CODES["VERIFIED"] == 0, out
    assert all(line_of(out, run).startswith("ok ") and f"signed by writer ({writer.fingerprint})" in line_of(out, run)
               for run in RUNS), out
    assert "copy-of-study/report/results.json: re-derived exactly" in out
    assert out.splitlines()[-1].startswith("VERIFIED: every number of 4 run(s) and 1 report(s) re-derives")


@pytest.mark.parametrize("given", [".", "absolute"])
def test_a_report_made_from_the_study_dir_itself_or_an_absolute_path_re_derives_in_a_copy(study, tmp_path, reviewer,
                                                                                          given, monkeypatch):
    made = copy_of(study, tmp_path)
    shutil.rmtree(made / "report")
    monkeypatch.chdir(made)  # `cd study && heldout report . --out report`: paths in it have no prefix at all
    assert main(["-q", "report", "." if given == "." else str(made), "--out", "report"]) == 0
    moved = Path(shutil.copytree(made, tmp_path / "moved" / "elsewhere"))
    monkeypatch.chdir(tmp_path)
    code, out = reviewer(moved)
    assert code == 0 and "elsewhere/report/results.json: re-derived exactly" in out, out


def test_a_reviewers_bundle_re_derives_exactly_with_its_manifests(study, writer, tmp_path, reviewer, monkeypatch):
    """`heldout bundle` keeps run dirs under runs/<name> and the report under report/: verify finds
    each run dir the report names there, and checks the examples against the bundled manifest."""
    archive = tmp_path / "study.tar.gz"
    assert main(["-q", "bundle", str(study), "--report", str(study / "report"), "--out", str(archive)]) == 0
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    bundle = tmp_path / "unpacked" / "heldout-bundle"
    code, out = reviewer(bundle, "--json")
    found = json.loads(out)
    assert code == 0 and found["verdict"] == "VERIFIED", out
    assert [r["path"] for r in found["reports"]] == [str(bundle / "report" / "results.json")]
    assert len(found["runs"]) == 4 and all(r["signer"] == "writer" and not r["notes"] for r in found["runs"])
    # a task whose manifest this heldout lacks is checked against the bundle's copy, which must match the record
    def no_manifest_here(task, profile):
        raise verify.HeldoutError(f"no manifest for {task} here")
    monkeypatch.setattr(verify, "manifest_holding", no_manifest_here)
    code, out = reviewer(bundle, "--json")
    assert code == 0 and not any(r["notes"] for r in json.loads(out)["runs"]), out
    manifest = next((bundle / "manifests").rglob("*.json"))
    forged = json.loads(manifest.read_text())
    forged["profiles"]["default"]["test"] = forged["profiles"]["default"]["test"][:-1]  # one held-out example fewer
    manifest.write_text(json.dumps(forged))
    code, out = reviewer(bundle, "--json")
    assert all("its examples are not checked" in r["notes"][0] for r in json.loads(out)["runs"]), out  # not used


def test_without_the_writers_key_every_number_still_re_derives_but_nothing_is_called_authentic(study, tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setenv("HELDOUT_LEDGER_KEY", str(tmp_path / "none" / "ledger.key"))
    monkeypatch.setenv("HELDOUT_SIGNING_KEY_FILE", str(tmp_path / "none" / "signing.key"))
    stranger = write_new_key(tmp_path / "stranger.key")
    assert main(["verify", str(copy_of(study, tmp_path)), "--trust-key", stranger.public_key]) == EXIT_CODES["UNTRUSTED"]


# -- the number that changed is named ----------------------------------------------------------------
def test_an_edited_run_record_number_is_named_with_both_values(study, tmp_path, reviewer):
    copy = copy_of(study, tmp_path)
    path = copy / TASK_DIR / "seed" / "seed-0" / "run_record.json"
    record = json.loads(path.read_text())
    earned = record["test_score"]
    record["test_score"] = 0.99
    path.write_text(json.dumps(record))
    code, out = reviewer(copy)
    assert code == EXIT_CODES["DIFFERS"] == 1, out
    assert f"seed/seed-0/run_record.json: test_score: states 0.99, re-derived {earned}" in out
    assert "INVALID" in out and "was edited after the session wrote it" in out
    # the report was made from the intact record: rebuilt now, that run is excluded, so its numbers differ too
    assert "report/results.json: tables.results.data[1].seeds: states [0, 1], re-derived [1]" in out
    assert out.splitlines()[-1].startswith("DIFFERS: ")


def test_an_edited_report_number_is_named_with_both_values(study, tmp_path, reviewer):
    copy = copy_of(study, tmp_path)
    path = copy / "report" / "results.json"
    stated = json.loads(path.read_text())
    row = stated["tables"]["results"]["data"][0]
    earned, row["mean"] = row["mean"], row["mean"] + 0.25
    path.write_text(json.dumps(stated))
    code, out = reviewer(copy)
    assert code == 1, out
    assert f"report/results.json: tables.results.data[0].mean: states {earned + 0.25}, re-derived {earned}" in out
    assert all(line_of(out, run).startswith("ok ") for run in RUNS)  # the runs themselves are intact


def test_a_report_made_by_other_heldout_code_says_so_beside_its_differences(study, tmp_path, reviewer):
    copy = copy_of(study, tmp_path)
    path = copy / "report" / "results.json"
    stated = json.loads(path.read_text())
    made_by = stated["derived_from"]["heldout"]
    assert made_by["version"] and len(made_by["files_sha256"]) == 64
    made_by.update(version="0.0.9", commit="c" * 40, dirty=False, files_sha256="f" * 64)  # an older heldout made it
    path.write_text(json.dumps(stated))
    code, out = reviewer(copy)
    assert code == 0 and "note:" not in out, out  # nothing differs: which heldout made it is no matter
    stated["tables"]["results"]["data"][0]["std"] = 0.001  # ...until something does
    path.write_text(json.dumps(stated))
    code, out = reviewer(copy)
    assert code == 1 and "note: made by heldout 0.0.9 (commit cccccccccccc, files ffffffffffff); this is heldout " in out
    assert "a difference may be the code's, not the study's" in out


def test_an_edited_ledger_score_is_named_even_though_its_chain_is_broken(study, tmp_path, reviewer):
    copy = copy_of(study, tmp_path)
    run_dir = copy / TASK_DIR / "local-search" / "seed-1"
    entries = ledger_lines(run_dir)
    entry = last_test_scoring(entries)
    example, was = entry["data"]["example_id"], entry["data"]["verdict"]["score"]
    entry["data"]["verdict"]["score"] = 1.0 - was  # a 0/1 score, flipped
    write_ledger(run_dir, entries)
    code, out = reviewer(copy)
    assert code == 1, out
    assert f"local-search/seed-1/run_record.json: test_verdicts[{example}].score: states {was}, re-derived {1.0 - was}" in out
    assert "local-search/seed-1/run_record.json: test_score: states " in out
    assert line_of(out, run_dir).startswith("INVALID ") and \
        f"entry {entry['seq']} (seq {entry['seq']}, test_scoring): content was edited" in line_of(out, run_dir)


def test_an_edit_re_signed_with_an_untrusted_key_names_the_number_and_the_signer(study, tmp_path, reviewer):
    copy = copy_of(study, tmp_path)
    run_dir = copy / TASK_DIR / "seed" / "seed-1"
    forger = write_new_key(tmp_path / "forger.key")
    flipped = {}

    def flip(entries):
        data = last_test_scoring(entries)["data"]
        flipped[data["example_id"]] = data["verdict"]["score"] = 1.0 - data["verdict"]["score"]
    forge(run_dir, forger, flip)
    code, out = reviewer(copy)
    assert code == 1, out
    (example, score), = flipped.items()
    assert f"test_verdicts[{example}].score: states {1.0 - score}, re-derived {score}" in out
    assert line_of(out, run_dir).startswith("UNTRUSTED ") and f"signed by {forger.fingerprint}, a key that is not " \
        "among the trusted signers" in line_of(out, run_dir)


def test_a_record_edit_re_anchored_and_re_signed_with_an_untrusted_key_names_the_number(study, tmp_path, reviewer):
    copy = copy_of(study, tmp_path)
    run_dir = copy / TASK_DIR / "local-search" / "seed-0"
    forger = write_new_key(tmp_path / "forger.key")
    earned = json.loads((run_dir / "run_record.json").read_text())["test_score"]

    def better(record):
        record["test_score"] = 0.9
    forge(run_dir, forger, lambda entries: None, better)  # its digest in session_end, the chain and head redone
    code, out = reviewer(copy)
    assert code == 1, out
    assert f"local-search/seed-0/run_record.json: test_score: states 0.9, re-derived {earned}" in out
    assert line_of(out, run_dir).startswith("UNTRUSTED ") and forger.fingerprint in line_of(out, run_dir)


def test_a_consistent_forgery_re_derives_but_is_refused_by_its_signature(study, tmp_path, reviewer):
    """Ledger, record and report all made to agree, re-signed by the forger: no number differs, so
    only the signature can tell, and it does (exit 4, naming the key)."""
    copy = copy_of(study, tmp_path)
    run_dir = copy / TASK_DIR / "seed" / "seed-0"
    forger = write_new_key(tmp_path / "forger.key")
    entries = ledger_lines(run_dir)
    target = last_test_scoring(entries)["data"]["example_id"]

    def flip_entry(entries):
        verdict = last_test_scoring(entries)["data"]["verdict"]
        verdict["score"] = 1.0 - verdict["score"]

    def flip_record(record):
        verdict = next(v for v in record["test_verdicts"] if v["example_id"] == target)
        verdict["score"] = 1.0 - verdict["score"]
        record["test_score"] = sum(v["score"] for v in record["test_verdicts"]) / len(record["test_verdicts"])

    def end_agrees(entries):
        flip_entry(entries)
        end = next(e for e in entries if e["kind"] == "session_end")["data"]
        scores = [e["data"]["verdict"]["score"] for e in entries if e["kind"] == "test_scoring"]
        end["test_score"] = sum(scores) / len(scores)
    forge(run_dir, forger, end_agrees, flip_record)
    code, out = reviewer(copy, "--report", str(copy / "report"))
    assert code == 1 and "report/results.json: tables.results" in out, out  # the report still says otherwise
    assert main(["-q", "report", str(copy), "--out", str(copy / "report")]) == 0  # ...so the forger remakes it
    code, out = reviewer(copy)
    assert "DIFFERS" not in out, out
    assert code == EXIT_CODES["UNTRUSTED"] == 4
    assert line_of(out, run_dir).startswith("UNTRUSTED ") and f"signed by {forger.fingerprint}" in line_of(out, run_dir)
    assert out.splitlines()[-1].startswith("UNTRUSTED: every number re-derives")


def test_a_run_that_dropped_a_held_out_example_is_caught_by_the_manifest(study, tmp_path, reviewer):
    copy = copy_of(study, tmp_path)
    run_dir = copy / TASK_DIR / "local-search" / "seed-0"
    forger = write_new_key(tmp_path / "forger.key")
    dropped = {}

    def drop_entry(entries):
        entry = last_test_scoring(entries)
        dropped["id"] = entry["data"]["example_id"]
        entries.remove(entry)
        end = next(e for e in entries if e["kind"] == "session_end")["data"]
        scores = [e["data"]["verdict"]["score"] for e in entries if e["kind"] == "test_scoring"]
        end["test_score"] = sum(scores) / len(scores)

    def drop_record(record):
        record["test_verdicts"] = [v for v in record["test_verdicts"] if v["example_id"] != dropped["id"]]
        record["test_score"] = sum(v["score"] for v in record["test_verdicts"]) / len(record["test_verdicts"])
    forge(run_dir, forger, drop_entry, drop_record)
    code, out = reviewer(copy)
    assert code == 1, out
    assert (f"local-search/seed-0/run_record.json: test examples scored: states \"the manifest profile's 50\", "
            f"re-derived \"49 in the ledger (missing ['{dropped['id']}']") in out


def test_evidence_that_does_not_verify_is_tampered_even_when_every_number_re_derives(study, tmp_path, reviewer):
    copy = copy_of(study, tmp_path)
    run_dir = copy / TASK_DIR / "local-search" / "seed-1"
    entries = ledger_lines(run_dir)
    candidate = next(e for e in entries if e["kind"] == "candidate")
    candidate["data"]["parent"] = "someone else's idea"  # no number, but the chain no longer holds
    write_ledger(run_dir, entries)
    code, out = reviewer(copy)
    # a report rebuilt by the rule of `heldout report` leaves out a run that does not verify: its numbers differ
    assert code == 1 and "report/results.json: tables.results.data[0].seeds: states [0, 1], re-derived [0]" in out
    shutil.rmtree(copy / "report")  # the runs alone: every number they state still re-derives
    code, out = reviewer(copy)
    assert code == EXIT_CODES["TAMPERED"] == 5 and "DIFFERS" not in out, out
    assert line_of(out, run_dir).startswith("INVALID ") and "content was edited" in line_of(out, run_dir)


def test_a_run_whose_signatures_were_stripped_is_unsigned_not_verified(study, tmp_path, reviewer):
    copy = copy_of(study, tmp_path)
    run_dir = copy / TASK_DIR / "seed" / "seed-1"
    for name in ("run_record.json", "ledger.head"):
        data = json.loads((run_dir / name).read_text())
        data.pop("signature")
        (run_dir / name).write_text(json.dumps(data))
    code, out = reviewer(copy)
    assert code == EXIT_CODES["UNSIGNED"] == 3 and "DIFFERS" not in out, out
    assert line_of(out, run_dir).startswith("UNANCHORED ") and "unsigned" in line_of(out, run_dir)
    assert out.splitlines()[-1].startswith("UNSIGNED: every number re-derives")


# -- unusable input: one line, exit 2 ---------------------------------------------------------------
def hostile_report(copy: Path, tmp_path: Path, case: str) -> None:
    """What a forger does to keep a report's numbers from being checked."""
    path = copy / "report" / "results.json"
    stated = json.loads(path.read_text())
    if case == "a corrupted report":
        path.write_text(path.read_text()[:-40])
    elif case == "a report that is not one":
        path.write_text("[1, 2]")
    elif case == "a report derived from elsewhere":  # e.g. "/": the rebuild would walk the whole file system
        stated["derived_from"]["run_dirs"][0]["from_report"] = str(tmp_path.parent)
        path.write_text(json.dumps(stated))


@pytest.mark.parametrize("case", ["a missing dir", "a dir without runs", "a corrupted report",
                                  "a report that is not one", "a report derived from elsewhere"])
def test_unusable_input_is_one_line_and_exit_2(study, tmp_path, case, capsys):
    target = tmp_path / "empty"
    target.mkdir()
    if case == "a missing dir":
        target = tmp_path / "nowhere"
    elif case != "a dir without runs":
        target = copy_of(study, tmp_path)
        hostile_report(target, tmp_path, case)
    assert main(["verify", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("heldout: error: "), err
