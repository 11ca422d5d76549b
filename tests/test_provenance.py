"""Provenance of heldout itself: every run record and report header names the heldout code that
scored (the commit of heldout's own checkout, never of the directory it was run from, and the
hash of the package's files), so a paper can cite which heldout produced its numbers."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from heldout.evaluators.records import PACKAGE_DIR, RunRecord, git_checkout_of, heldout_code, package_files_sha256

REPO = Path(__file__).resolve().parents[1]


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.email=t@example.org", "-c", "user.name=t", *args], cwd=cwd,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def new_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    (path / "README").write_text("the user's own project\n")
    git(path, "add", "README")
    git(path, "commit", "-q", "-m", "user's commit")
    return path


def copy_package(to: Path) -> Path:
    shutil.copytree(PACKAGE_DIR, to, ignore=shutil.ignore_patterns("__pycache__"))
    return to


def test_a_run_from_the_users_own_repository_names_heldouts_commit_not_the_users(warm_cli, tmp_path):
    if git_checkout_of(PACKAGE_DIR) is None:
        pytest.skip("heldout is not imported from a git checkout here (a wheel install)")
    user = new_repo(tmp_path / "user-project")
    before = git(REPO, "rev-parse", "HEAD")
    # the command in a process of its own working in the user's repository (forked warm: heldout
    # finds its own code from where it was imported, not from the working directory)
    done = warm_cli.run("-q", "run", "--task", "lockpicking/six", "--optimizer", "seed", "--seeds", "0",
                        "--budget", "4", "--run-dir", "study", cwd=user)
    assert done.returncode == 0, done.stderr[-1500:]
    after = git(REPO, "rev-parse", "HEAD")  # others may commit to this checkout meanwhile
    code = RunRecord.load(user / "study" / "lockpicking__six" / "seed" / "seed-0").experiment["environment"]["heldout_code"]
    assert code["commit"] in {before, after} and code["commit"] != git(user, "rev-parse", "HEAD")
    assert isinstance(code["dirty"], bool) and len(code["files_sha256"]) == 64
    done = warm_cli.run("-q", "report", "study", "--out", "report", cwd=user)
    assert done.returncode == 0, done.stderr[-1500:]
    header = json.loads((user / "report" / "results.json").read_text())["provenance"]
    assert any(f"commit {code['commit'][:12]}" in line and f"files sha256 {code['files_sha256'][:12]}" in line
               for line in header), header
    assert f"commit {code['commit'][:12]}" in (user / "report" / "report.md").read_text()


def test_a_copy_outside_any_checkout_is_pinned_by_its_files_and_any_edit_changes_the_hash(tmp_path):
    copy = copy_package(tmp_path / "site-packages" / "heldout")
    pinned = heldout_code(copy)
    assert pinned["commit"] is None and pinned["dirty"] is None
    assert pinned["files_sha256"] == package_files_sha256(copy)
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "contracts.cpython-311.pyc").write_bytes(b"derived")  # compiled files are not the code
    assert heldout_code(copy)["files_sha256"] == pinned["files_sha256"]
    scoring = copy / "evaluators" / "scoring.py"
    scoring.write_text(scoring.read_text().replace("return verdicts", "return verdicts  # patched", 1))
    assert heldout_code(copy)["files_sha256"] != pinned["files_sha256"]
    scoring.unlink()  # a file removed is a change too
    assert heldout_code(copy)["files_sha256"] not in {pinned["files_sha256"], package_files_sha256(PACKAGE_DIR)}


def test_a_wheel_install_in_a_venv_inside_the_users_repository_is_not_given_the_users_commit(tmp_path):
    user = new_repo(tmp_path / "project")
    (user / ".gitignore").write_text(".venv/\n")
    copy = copy_package(user / ".venv" / "lib" / "site-packages" / "heldout")
    assert git_checkout_of(copy) is None and heldout_code(copy)["commit"] is None
    untracked = copy_package(user / "vendored" / "heldout")  # inside the repository, but never committed
    assert git_checkout_of(untracked) is None


def test_a_checkout_that_tracks_the_package_gives_its_commit_and_says_when_files_changed(tmp_path, monkeypatch):
    repo = new_repo(tmp_path / "heldout-checkout")
    package = repo / "heldout"
    package.mkdir()
    (package / "__init__.py").write_text("__version__ = '0.1.0'\n")
    git(repo, "add", "heldout")
    git(repo, "commit", "-q", "-m", "heldout")
    head = git(repo, "rev-parse", "HEAD")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere" / ".git"))  # the caller's git settings are not ours
    clean = heldout_code(package)
    assert clean["commit"] == head and clean["dirty"] is False
    (package / "scoring.py").write_text("SCORE = 1\n")  # a new, uncommitted module would be imported
    dirty = heldout_code(package)
    assert dirty["commit"] == clean["commit"] and dirty["dirty"] is True
    assert dirty["files_sha256"] != clean["files_sha256"]
    (repo / "notes.txt").write_text("outside the package")  # not heldout's code
    (package / "scoring.py").unlink()
    assert heldout_code(package) == clean
