"""A folder heldout cannot create or write into is one clear line and exit 2, no traceback, and
nothing written (issue 55: 18 of 18 such paths ended in tracebacks across ``run``, ``compare
verifiers`` and ``protocol generalisation``). The adversary is a mistyped or hostile path: one under
a regular file, a device, a FIFO, a link to nothing or a link loop; one in a read-only folder or in
/proc or /sys (which refuse even root); a name or a whole path over the system's limits; a file
where a folder goes. Each row is one command and one such path, through the real command, against
every option that names a folder a command writes (``Command.writes`` in the CLI, a study file's
``run_dir`` and ``[models] cache_dir``, a protocol file's ``run_dir``).

The same suite holds study and protocol files nested 5,000 deep (a ``RecursionError`` before)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from heldout.cli.commands import COMMANDS
from heldout.contracts import HeldoutError
from heldout.files import MAX_TOML_DEPTH, check_folder, read_user_toml
from small_disk import mounted_tmpfs

PROMPT_TASK = "bbh/boolean_expressions"
LONG_NAME = "n" * 300  # over every Linux file system's 255-byte name


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A real finished study (the input of the commands that read one and write elsewhere)."""
    root = tmp_path_factory.mktemp("finished")
    done = subprocess.run([sys.executable, "-m", "heldout.cli", "-q", "run", "--task", "lockpicking/six", "--optimizer",
                           "seed", "--seeds", "0", "--budget", "4", "--run-dir", str(root / "study")],
                          capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-1500:]
    return root / "study"


@contextlib.contextmanager
def read_only_folder(where: Path) -> Iterator[Path]:
    """A folder nothing may be created in: a read-only tmpfs for root (who ignores permission
    bits, as in CI), a folder without write permission for anyone else."""
    where.mkdir()
    if os.geteuid() != 0:
        where.chmod(0o555)
        try:
            yield where
        finally:
            where.chmod(0o755)
        return
    with mounted_tmpfs(where, "ro,size=64k", "a read-only tmpfs"):
        yield where


class Place:
    """The folder a row builds its bad path in."""

    def __init__(self, root: Path, read_only: Path) -> None:
        self.root, self.read_only = root, read_only

    def file(self) -> Path:
        path = self.root / "a-file"
        path.write_text("x")
        return path

    def link(self, target: str) -> Path:
        path = self.root / "a-link"
        path.symlink_to(target)
        return path


BAD_PATHS: dict[str, Callable[[Place], str]] = {
    "under a regular file": lambda p: f"{p.file()}/run",
    "two levels under a regular file": lambda p: f"{p.file()}/a/b",
    "that is a regular file": lambda p: str(p.file()),
    "under a device": lambda p: "/dev/null/run",
    "under a FIFO": lambda p: (os.mkfifo(p.root / "fifo"), f"{p.root}/fifo/run")[1],
    "under a link to nothing": lambda p: f"{p.link(str(p.root / 'missing'))}/run",
    "under a link loop": lambda p: f"{p.link(str(p.root / 'a-link'))}/run",
    "under a read-only folder": lambda p: f"{p.read_only}/run",
    "in /proc": lambda p: "/proc/self/heldout-run",
    "in /sys": lambda p: "/sys/heldout-run",
    "with a name over 255 bytes": lambda p: str(p.root / LONG_NAME),
    "over the system's path length": lambda p: str(p.root / "/".join(["d" * 200] * 25)),
}


def _study_file(where: Path, *, run_dir: str, cache_dir: str | None = None) -> str:
    path = where / "study.toml"
    path.write_text(f'run_dir = "{run_dir}"\ntasks = ["lockpicking/six"]\nseeds = [0]\n[budget]\ndefault = 4\n'
                    '[[methods]]\nname = "seed"\noptimizer = "seed"\n'
                    + (f'[models]\ncache_dir = "{cache_dir}"\n' if cache_dir else ""))
    return str(path)


def _protocol_file(where: Path, run_dir: str) -> str:
    path = where / "protocol.toml"
    path.write_text(f'run_dir = "{run_dir}"\ntask = "{PROMPT_TASK}"\noptimizer = "reflective"\nbudget = 5\n'
                    'seeds = [0]\nprofile = "default"\nallow_topic_shared = true\n')
    return str(path)


# every command and option that names a folder heldout writes: (command, the bad path) -> argv
COMMANDS_WRITING: dict[str, Callable[[str, Path, Path], list[str]]] = {
    "run --run-dir": lambda bad, w, run: ["run", "--task", "lockpicking/six", "--optimizer", "seed", "--budget", "4",
                                          "--run-dir", bad],
    "run --cache-dir": lambda bad, w, run: ["run", "--task", "lockpicking/six", "--optimizer", "seed", "--budget", "4",
                                            "--run-dir", str(w / "study"), "--cache-dir", bad],
    "run STUDY.toml (run_dir)": lambda bad, w, run: ["run", _study_file(w, run_dir=bad)],
    "run STUDY.toml ([models] cache_dir)": lambda bad, w, run: ["run", _study_file(w, run_dir=str(w / "study"),
                                                                                   cache_dir=bad)],
    "compare verifiers --run-dir": lambda bad, w, run: ["compare", "verifiers", "--task", "lockpicking/six",
                                                        "--optimizer", "local-search", "--budget", "4",
                                                        "--run-dir", bad],
    "compare verifiers --cache-dir": lambda bad, w, run: ["compare", "verifiers", "--task", "lockpicking/six",
                                                          "--optimizer", "local-search", "--budget", "4",
                                                          "--run-dir", str(w / "ablation"), "--cache-dir", bad],
    "compare arms --run-dir": lambda bad, w, run: ["compare", "arms", "--task", "lockpicking/six", "--optimizer",
                                                   "local-search", "--budget", "8", "--width", "2", "--run-dir", bad],
    "compare arms --cache-dir": lambda bad, w, run: ["compare", "arms", "--task", "lockpicking/six", "--optimizer",
                                                     "local-search", "--budget", "8", "--width", "2",
                                                     "--run-dir", str(w / "arms"), "--cache-dir", bad],
    "protocol generalisation --run-dir": lambda bad, w, run: [
        "protocol", "generalisation", "--task", PROMPT_TASK, "--profile", "default", "--allow-topic-shared",
        "--optimizer", "reflective", "--seeds", "0", "--budget", "5", "--run-dir", bad],
    "protocol generalisation --cache-dir": lambda bad, w, run: [
        "protocol", "generalisation", "--task", PROMPT_TASK, "--profile", "default", "--allow-topic-shared",
        "--optimizer", "reflective", "--seeds", "0", "--budget", "5", "--run-dir", str(w / "protocol"),
        "--cache-dir", bad],
    "protocol generalisation --study (run_dir)": lambda bad, w, run: ["protocol", "generalisation", "--study",
                                                                      _protocol_file(w, bad)],
    "report --out": lambda bad, w, run: ["report", str(run), "--out", bad],
    "export inspect --out": lambda bad, w, run: ["export", "inspect", str(run), "--out", bad],
    "runs export --parquet": lambda bad, w, run: ["runs", "export", str(run), "--parquet", bad],
    "leak ablate --cache-dir": lambda bad, w, run: ["leak", "ablate", str(run), "--cache-dir", bad],
    "data freeze --out": lambda bad, w, run: ["data", "freeze", "--task", "lockpicking/six", "--profile", "p",
                                              "--out", bad],
    "split build --out": lambda bad, w, run: ["split", "build", "--task", "mmlu_pro/economics", "--sizes", "1/1/1",
                                              "--name", "n", "--out", bad],
    "demo --run-dir": lambda bad, w, run: ["demo", "--run-dir", bad],
    "demo --out": lambda bad, w, run: ["demo", "--run-dir", str(w / "demo"), "--out", bad],
}


def _snapshot(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("bad", sorted(BAD_PATHS))
@pytest.mark.parametrize("command", sorted(COMMANDS_WRITING))
def test_a_folder_that_cannot_be_made_is_one_line_and_exit_2_and_nothing_is_written(command, bad, tmp_path,
                                                                                   finished_run, data_dir, warm_cli):
    work = tmp_path / "work"
    work.mkdir()
    with read_only_folder(tmp_path / "read-only") as read_only:
        path = BAD_PATHS[bad](Place(work, read_only))
        args = COMMANDS_WRITING[command](path, work, finished_run)
        before, run_before = _snapshot(tmp_path), _snapshot(finished_run)
        done = warm_cli.run(*args, cwd=work, env={**os.environ, "HELDOUT_DATA_DIR": str(data_dir)})
        assert done.returncode == 2, (done.stdout[-500:], done.stderr[-1500:])
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("heldout: error: ") and "Traceback" not in done.stderr, \
            done.stderr[-1500:]
        assert "run_dir" in lines[0] or "--" in lines[0] or "cache" in lines[0], lines[0]  # names what was wrong
        assert _snapshot(tmp_path) == before and _snapshot(finished_run) == run_before


def test_every_command_that_writes_a_folder_is_in_the_table():
    """A new command with an output folder joins the table (its rows then run)."""
    declared = {(" ".join(c.words), dest) for c in COMMANDS for dest in c.writes}
    flag_rows = [row.split(" --") for row in COMMANDS_WRITING if " --" in row and "--study" not in row]
    tabled = {(words, flag.replace("-", "_")) for words, flag in flag_rows}
    assert declared == tabled


def test_a_folder_that_exists_or_can_be_made_passes_and_nothing_is_left_behind(tmp_path):
    (tmp_path / "exists").mkdir()
    for path in (tmp_path / "exists", tmp_path / "new", tmp_path / "new" / "deeper", f"{tmp_path}/trailing/"):
        assert check_folder(path, "--run-dir") == os.fspath(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists"]  # the probe folder is gone


def _nested_arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("file_kind, argv", [
    ("study file", lambda path: ["run", path, "--run-dir", "runs"]),
    ("protocol file", lambda path: ["protocol", "generalisation", "--study", path]),
])
@pytest.mark.parametrize("nesting", ["arrays 5,000 deep", "inline tables 5,000 deep", "arrays 17 deep"])
def test_a_toml_file_nested_too_deep_is_one_line_and_exit_2(file_kind, argv, nesting, tmp_path, warm_cli):
    value = {"arrays 5,000 deep": _nested_arrays(5000), "inline tables 5,000 deep": "{a = " * 5000 + "1" + "}" * 5000,
             "arrays 17 deep": _nested_arrays(MAX_TOML_DEPTH + 1)}[nesting]
    path = tmp_path / "deep.toml"
    path.write_text(f"tasks = {value}\n")
    done = warm_cli.run(*argv(str(path)), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-1500:]
    assert done.stderr.strip() == (f"heldout: error: {file_kind} {path} nests arrays or tables deeper than "
                                   f"{MAX_TOML_DEPTH} levels: refused")
    assert _snapshot(tmp_path) == ["deep.toml"]


def test_toml_at_the_depth_limit_is_read(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text(f"x = {_nested_arrays(MAX_TOML_DEPTH - 1)}\n")  # the top-level table is a level too
    assert read_user_toml(path, "study file", error=HeldoutError)["x"]
