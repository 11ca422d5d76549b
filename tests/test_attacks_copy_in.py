"""The adversary: a downloaded candidate, or an optimizer's repository, that puts a symbolic link
(or a FIFO, a socket) where heldout expects a file, so that copying it into the sandbox carries a
host file in: the ledger key, another session's run record, the answer key of the task.

The rule for everything copied into a sandbox (a candidate folder or file for ``heldout eval
--candidate``, the user's code of an isolated optimizer, a command's files, a task's data files):
regular files from inside the stated folder, nothing reached through a link. Each case below is
one line, exit 2, nothing written, and the linked file's text is never printed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import heldout
from heldout.cli import main
from heldout.contracts import HeldoutError
from heldout.files import regular_files
from heldout.evaluators.isolated import command_files, copy_user_code
from heldout.sandbox import SandboxError
from heldout.sandbox.process import _write_code_dir

SECRET = "ledger-key-material-0123456789"
ANSWER_KEY = Path(heldout.__file__).parent / "benchmarks" / "lockpicking" / "rules.py"


@pytest.fixture
def secret(tmp_path):
    """A host file no sandbox may see (standing for the ledger key)."""
    path = tmp_path / "host" / "ledger.key"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


def one_line_refusal(capsys, code: int, *words: str) -> str:
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("heldout: error: "), err
    assert SECRET not in err
    for word in words:
        assert word in err, err
    return err


def eval_candidate(path: Path) -> int:
    return main(["eval", "--task", "lockpicking/six", "--candidate", str(path), "--json"])


# -- heldout eval --candidate ---------------------------------------------------------------------
def test_a_plain_candidate_folder_is_still_read(tmp_path, capsys):
    folder = tmp_path / "cand"
    folder.mkdir()
    (folder / "rules.txt").write_text("Answer the question.")
    assert eval_candidate(folder) in (0, 1)
    assert '"split"' in capsys.readouterr().out


@pytest.mark.parametrize("inside", ["program.py", "sub/notes.txt"])
def test_a_symlinked_file_in_a_candidate_folder_is_refused(tmp_path, secret, capsys, inside):
    folder = tmp_path / "cand"
    (folder / "sub").mkdir(parents=True)
    (folder / "rules.txt").write_text("Answer the question.")
    (folder / inside).symlink_to(secret)
    one_line_refusal(capsys, eval_candidate(folder), "symbolic link", inside)


def test_a_symlinked_folder_in_a_candidate_folder_is_refused(tmp_path, secret, capsys):
    folder = tmp_path / "cand"
    folder.mkdir()
    (folder / "rules.txt").write_text("Answer the question.")
    (folder / "host").symlink_to(secret.parent, target_is_directory=True)
    one_line_refusal(capsys, eval_candidate(folder), "symbolic link", "host")


def test_a_link_that_stays_inside_the_folder_is_refused_too(tmp_path, capsys):
    folder = tmp_path / "cand"
    folder.mkdir()
    (folder / "rules.txt").write_text("Answer the question.")
    (folder / "again.txt").symlink_to("rules.txt")
    one_line_refusal(capsys, eval_candidate(folder), "symbolic link", "again.txt")


@pytest.mark.parametrize("suffix", [".py", ".json", ".txt"])
def test_a_single_symlinked_candidate_file_is_refused(tmp_path, secret, capsys, suffix):
    link = tmp_path / f"candidate{suffix}"
    link.symlink_to(secret)
    one_line_refusal(capsys, eval_candidate(link), "symbolic link")


def test_a_symlinked_candidate_folder_is_refused(tmp_path, secret, capsys):
    link = tmp_path / "cand"
    link.symlink_to(secret.parent, target_is_directory=True)
    one_line_refusal(capsys, eval_candidate(link), "symbolic link")


def test_a_fifo_or_a_socket_in_a_candidate_folder_is_refused_without_blocking(tmp_path, capsys):
    folder = tmp_path / "cand"
    folder.mkdir()
    (folder / "rules.txt").write_text("Answer the question.")
    os.mkfifo(folder / "pipe.txt")
    one_line_refusal(capsys, eval_candidate(folder), "pipe.txt", "not a regular file")
    (folder / "pipe.txt").unlink()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(folder / "sock.txt"))
        one_line_refusal(capsys, eval_candidate(folder), "sock.txt", "not a regular file")


def test_a_fifo_as_the_candidate_file_is_refused_without_blocking(tmp_path, capsys):
    os.mkfifo(tmp_path / "candidate.txt")
    one_line_refusal(capsys, eval_candidate(tmp_path / "candidate.txt"), "not a regular file")


# -- the user's code of an isolated optimizer -------------------------------------------------------
@pytest.fixture
def code_folder():
    """An optimizer package in a folder the harness is run from."""
    code = Path(tempfile.mkdtemp(prefix="heldout-test-copyin-"))
    (code / "myopt").mkdir()
    (code / "myopt" / "__init__.py").write_text("")
    (code / "myopt" / "search.py").write_text("def optimize(client, seed):\n    return client.seed_candidate\n")
    yield code
    shutil.rmtree(code, ignore_errors=True)


def run_in(code: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "heldout", *args], cwd=code, capture_output=True, text=True,
                          env=env, timeout=300)


def refused_run(code: Path, tmp_path: Path, optimizer: list[str], *words: str) -> None:
    done = run_in(code, "run", "--task", "lockpicking/six", "--profile", "paper", "--budget", "4", *optimizer,
                  "--run-dir", str(tmp_path / "study"))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("heldout: error: ") and SECRET not in done.stderr
    for word in words:
        assert word in done.stderr, done.stderr
    assert not (tmp_path / "study").exists()


@pytest.mark.parametrize("how", ["helper file", "helper folder", "inner link"])
def test_a_link_inside_the_optimizers_package_is_refused_before_anything_is_written(code_folder, secret, tmp_path,
                                                                                    how):
    pkg = code_folder / "myopt"
    if how == "helper file":
        (pkg / "helper.py").symlink_to(secret)
    elif how == "helper folder":
        (pkg / "data").symlink_to(secret.parent, target_is_directory=True)
    else:
        (pkg / "again.py").symlink_to("search.py")
    refused_run(code_folder, tmp_path, ["--optimizer", "mine=myopt.search:optimize"], "symbolic link", "myopt")


def test_a_symlinked_optimizer_module_or_package_is_refused(code_folder, secret, tmp_path):
    (code_folder / "single.py").symlink_to(secret)
    refused_run(code_folder, tmp_path, ["--optimizer", "mine=single:optimize"], "symbolic link")
    real = code_folder / "elsewhere"
    (code_folder / "myopt").rename(real)
    (code_folder / "myopt").symlink_to(real, target_is_directory=True)
    refused_run(code_folder, tmp_path, ["--optimizer", "mine=myopt.search:optimize"], "symbolic link")


def test_a_fifo_in_the_optimizers_package_is_refused(code_folder, tmp_path):
    os.mkfifo(code_folder / "myopt" / "pipe")
    refused_run(code_folder, tmp_path, ["--optimizer", "mine=myopt.search:optimize"], "not a regular file")


def test_a_dspy_programs_symlinked_module_is_refused(code_folder, secret, tmp_path):
    (code_folder / "prog.py").symlink_to(secret)
    refused_run(code_folder, tmp_path, ["--optimizer", "dspy-gepa?program=prog:build"], "symbolic link")


def test_a_command_naming_a_symlinked_file_is_refused(code_folder, secret, tmp_path):
    (code_folder / "opt.py").symlink_to(secret)
    refused_run(code_folder, tmp_path, ["--optimizer-cmd", f"{sys.executable} opt.py"], "symbolic link", "opt.py")


def test_the_copy_itself_refuses_a_link_swapped_in_after_the_check(code_folder, secret, tmp_path):
    # the study was checked; then, before the cell starts, a file becomes a link: the copy refuses it
    (code_folder / "myopt" / "search.py").unlink()
    (code_folder / "myopt" / "search.py").symlink_to(secret)
    with pytest.raises(HeldoutError, match="symbolic link"):
        copy_user_code({"myopt": code_folder / "myopt"}, tmp_path / "copy")
    assert not any(SECRET in p.read_text() for p in (tmp_path / "copy").rglob("*") if p.is_file())


def test_the_copy_is_of_regular_files_only_and_readable_by_the_sandboxs_uid(code_folder, tmp_path):
    (code_folder / "myopt" / "__pycache__").mkdir()
    (code_folder / "myopt" / "__pycache__" / "search.cpython-311.pyc").write_bytes(b"stale")
    copy_user_code({"myopt": code_folder / "myopt"}, tmp_path / "copy")
    assert regular_files(tmp_path / "copy", "copy") == ["myopt/__init__.py", "myopt/search.py"]
    assert all(p.stat().st_mode & 0o004 for p in (tmp_path / "copy").rglob("*"))


def test_a_commands_fifo_argument_is_refused(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(HeldoutError, match="not a regular file"):
        command_files(["python", str(tmp_path / "pipe")])


# -- a task's data file (linked into the code dir) --------------------------------------------------
def test_a_symlinked_data_file_is_refused_before_it_is_linked_into_a_sandbox(tmp_path, secret):
    link = tmp_path / "table.bin"
    link.symlink_to(secret)
    with pytest.raises(SandboxError, match="symbolic link"):
        _write_code_dir({"program.py": "x = 1\n"}, {"table.bin": link})
