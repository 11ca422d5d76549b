"""Attack suite, integrity: edited split lists, truncated ledgers with rewritten heads, replayed
or borrowed heads, a second writer on a run dir, and files left readable for others. Each attack
is a real edit of real files; each must be detected with a clear error."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest

import heldout
from heldout.contracts import DataError
from heldout.data_manifests import MANIFEST_PATH_ENV, Manifest
from heldout.evaluators.ledger import HEAD_FILE, LEDGER_FILE, Ledger, LedgerError, verify_ledger
from heldout.evaluators.records import RECORD_FILE
from heldout.evaluators.session import Budget, Session

REPO = Path(__file__).resolve().parents[1]
SQUARE = REPO / "heldout" / "data_manifests" / "circle_packing" / "square26.json"


def copy_manifest(tmp_path: Path, task: str) -> tuple[Path, dict]:
    src = REPO / "heldout" / "data_manifests" / f"{task}.json"
    dst = tmp_path / "manifests" / f"{task}.json"
    dst.parent.mkdir(parents=True)
    shutil.copyfile(src, dst)
    return dst, json.loads(dst.read_text())


@pytest.mark.parametrize("edit", ["move_test_id_to_train", "drop_a_test_id", "reorder_test", "add_a_profile_digest"])
def test_an_edited_split_list_is_refused_on_load(tmp_path, edit):
    path, data = copy_manifest(tmp_path, "lockpicking/six")
    splits = data["profiles"]["paper"]
    if edit == "move_test_id_to_train":
        splits["train"].append(splits["test"].pop())
    elif edit == "drop_a_test_id":
        splits["test"].pop()
    elif edit == "reorder_test":
        splits["test"].reverse()
    else:
        data["profile_digests"]["made-up"] = "0" * 64
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match="digest"):
        Manifest.load("lockpicking/six", root=tmp_path / "manifests")


def test_heldout_data_verify_fails_on_an_edited_split_list(warm_cli, tmp_path):
    path, data = copy_manifest(tmp_path, "vliw/takehome")
    data["profiles"]["default"]["train"].append(data["profiles"]["default"]["test"][0])
    path.write_text(json.dumps(data))
    env = {**__import__("os").environ, MANIFEST_PATH_ENV: str(tmp_path / "manifests")}
    done = warm_cli.run("data", "verify", "vliw", cwd=REPO, env=env)
    assert done.returncode != 0
    assert "digest" in done.stdout + done.stderr


def test_the_shipped_manifest_itself_verifies(tmp_path):
    path, _ = copy_manifest(tmp_path, "lockpicking/six")
    assert Manifest.load("lockpicking/six", root=tmp_path / "manifests").profiles  # the control


# -- ledgers --------------------------------------------------------------------------------------------
@pytest.fixture
def finished_run(tmp_path) -> Path:
    task = heldout.load_task("circle_packing/square26")
    run_dir = tmp_path / "run"
    session = Session(task, budget=Budget(3), seed=0, run_dir=run_dir, method="integrity")
    session.run(lambda view, seed: view.seed_candidate)
    assert verify_ledger(run_dir).ok
    return run_dir


def lines(run_dir: Path) -> list[str]:
    return (run_dir / LEDGER_FILE).read_text().splitlines(keepends=True)


def truncate_and_rewrite_head(run_dir: Path, keep: int, mac: str | None) -> None:
    kept = lines(run_dir)[:keep]
    (run_dir / LEDGER_FILE).write_text("".join(kept))
    head = {"count": keep, "hash": json.loads(kept[-1])["hash"]}
    if mac is not None:
        head["mac"] = mac
    (run_dir / HEAD_FILE).write_text(json.dumps(head))


def test_truncation_with_a_rewritten_head_is_detected(finished_run):
    (finished_run / RECORD_FILE).unlink()  # the record's anchor is tested separately
    truncate_and_rewrite_head(finished_run, 3, mac=None)
    report = verify_ledger(finished_run)
    assert not report.ok and any("anchor" in p for p in report.problems)


def test_truncation_with_a_forged_mac_is_detected(finished_run):
    (finished_run / RECORD_FILE).unlink()
    truncate_and_rewrite_head(finished_run, 3, mac="f" * 64)
    assert any("anchor" in p for p in verify_ledger(finished_run).problems)


def test_a_head_borrowed_from_another_ledger_is_detected(finished_run, tmp_path):
    other = tmp_path / "other"
    Session(heldout.load_task("circle_packing/square26"), budget=Budget(3), seed=1, run_dir=other,
            method="integrity").run(lambda view, seed: view.seed_candidate)
    shutil.copyfile(other / HEAD_FILE, finished_run / HEAD_FILE)
    assert not verify_ledger(finished_run).ok


def test_truncation_below_the_run_records_head_is_detected_without_the_key(finished_run, monkeypatch, tmp_path):
    monkeypatch.setenv("HELDOUT_LEDGER_KEY", str(tmp_path / "a-reviewer-without-the-key"))
    truncate_and_rewrite_head(finished_run, 3, mac=None)
    report = verify_ledger(finished_run)
    assert any("run record's ledger head" in p for p in report.problems)


def test_a_second_writer_on_a_run_dir_gets_a_clear_error(tmp_path):
    first = Ledger.open(tmp_path / "run")
    try:
        with pytest.raises(LedgerError, match="in use by another session"):
            Ledger.open(tmp_path / "run")
    finally:
        first.close()
    Ledger.open(tmp_path / "run").close()  # released


def test_ledger_head_and_record_are_owner_only(finished_run):
    for name in (LEDGER_FILE, HEAD_FILE, RECORD_FILE):
        assert stat.S_IMODE((finished_run / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE(finished_run.stat().st_mode) == 0o700


def test_duplicate_seeds_are_refused_by_the_cli(warm_cli, tmp_path):
    done = warm_cli.run("run", "--task", "circle_packing/square26", "--optimizer", "seed", "--seeds", "0,0", "--budget",
                        "2", "--run-dir", str(tmp_path / "s"), "--jobs", "2", cwd=REPO)
    assert done.returncode != 0 and "seed" in done.stderr.lower()
