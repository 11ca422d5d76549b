"""Field conditions: the process's locale and the bytes of a name.

In the lab every process runs under a UTF-8 locale and every path is UTF-8. In the field a
machine may run under a legacy locale (``LC_ALL=en_US.ISO-8859-1``: Python then encodes text it
prints, and files opened without an encoding, as latin-1), and a folder may be named with bytes
that are not UTF-8 (Python reads them as lone surrogates). The adversary is not a person but the
machine: each test makes the condition for real (a latin-1 locale compiled with ``localedef`` into
the test's folder, a folder named with the byte 0xff) and expects what the lab gives, or one clear
line, exit 2, and nothing written; never a traceback after half the work, never other text."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from heldout.reports.store import TABLES

LATIN1 = "en_US.ISO-8859-1"
ARROW_AND_KANJI = "\u2192 \u65e5\u672c"  # outside latin-1, as a model's answer or a task's text may be


@pytest.fixture(scope="module")
def latin1_env(tmp_path_factory) -> dict[str, str]:
    """The environment of a process under a real latin-1 locale (compiled here, ~0.3 CPU-s)."""
    localedef = shutil.which("localedef")
    if localedef is None:
        pytest.skip("localedef (glibc's locale compiler) is not installed")
    where = tmp_path_factory.mktemp("locales")
    subprocess.run([localedef, "-i", "en_US", "-f", "ISO-8859-1", str(where / LATIN1)], capture_output=True,
                   timeout=60)
    if not (where / LATIN1).is_dir():
        pytest.skip("glibc's en_US source or ISO-8859-1 charmap is not installed")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LC_", "LANG", "PYTHONUTF8", "PYTHONIOENCODING"))}
    env.update(LOCPATH=str(where), LC_ALL=LATIN1)
    probe = subprocess.run([sys.executable, "-c", "import locale, sys; print(locale.getpreferredencoding(), "
                            "sys.stdout.encoding, sys.flags.utf8_mode)"], env=env, capture_output=True, text=True)
    assert probe.stdout.split() == ["ISO-8859-1", "iso8859-1", "0"], probe  # the condition is real
    return env


def heldout_cli(*args: str | bytes, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "heldout", *args], capture_output=True, cwd=cwd,
                          env=env, timeout=300)


def test_rows_the_locale_cannot_encode_are_printed_escaped_not_ended_by_a_traceback(tmp_path, latin1_env):
    """``heldout runs query`` prints a task name holding an arrow and kanji: under UTF-8 as they
    are, under latin-1 escaped (it was a UnicodeEncodeError traceback, exit 1, after the query ran)."""
    export = tmp_path / "export"
    export.mkdir()
    con = duckdb.connect(":memory:")
    for table in TABLES:
        con.execute(f"COPY (SELECT 'lockpicking/six {ARROW_AND_KANJI}' AS task) TO '{export / table}.parquet' "
                    "(FORMAT PARQUET)")
    con.close()
    lab = heldout_cli("runs", "query", str(export), "SELECT task FROM runs", cwd=tmp_path)
    assert lab.returncode == 0, lab.stderr.decode()
    assert f"lockpicking/six {ARROW_AND_KANJI}" in lab.stdout.decode("utf-8")

    field = heldout_cli("runs", "query", str(export), "SELECT task FROM runs", cwd=tmp_path, env=latin1_env)
    assert field.returncode == 0, field.stderr.decode("latin-1")[-800:]
    assert field.stderr == b""
    escaped = "\\u2192 \\u65e5\\u672c"
    assert f"lockpicking/six {escaped}" in field.stdout.decode("latin-1")

    def words(text: str) -> list[str]:  # the table's rule of dashes is as wide as the escaped text
        return [w for w in text.split() if set(w) != {"-"}]

    assert words(field.stdout.decode("latin-1").replace(escaped, ARROW_AND_KANJI)) == words(lab.stdout.decode())


def test_a_run_dir_whose_name_is_not_utf8_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    """A run dir named with the byte 0xff: the study wrote study.json, then raised
    UnicodeEncodeError writing study.toml (the name is recorded as text), leaving a half-made study."""
    run_dir = os.fsencode(tmp_path) + b"/study-\xff"
    done = heldout_cli("run", "--task", "lockpicking/six", "--optimizer", "seed", "--seeds", "0", "--budget", "4",
                       "--run-dir", run_dir, cwd=tmp_path)
    lines = done.stderr.decode("utf-8", "replace").splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines[-5:]
    assert "--run-dir" in lines[0] and "not UTF-8" in lines[0]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("flag", ["--data-dir", "--optimizer-cmd"])
def test_a_recorded_path_or_command_that_is_not_utf8_is_refused_in_one_line_and_nothing_is_written(flag, tmp_path):
    """A data dir named with the byte 0xff (a link to the real data) or an optimizer command
    naming such a file: the study wrote study.json, then raised UnicodeEncodeError writing study.toml."""
    odd = os.fsencode(tmp_path) + b"/data-\xff"
    os.symlink(os.environ.get("HELDOUT_DATA_DIR", "../shared/data"), odd)
    given = [b"--data-dir", odd, b"--optimizer", b"seed"] if flag == "--data-dir" else \
        [b"--optimizer-cmd", b"python " + odd + b"/optimizer.py"]
    done = heldout_cli("run", "--task", "lockpicking/six", *given, "--seeds", "0", "--budget", "4",
                       "--run-dir", str(tmp_path / "study"), cwd=tmp_path)
    lines = done.stderr.decode("utf-8", "replace").splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines[-5:]
    assert "not UTF-8" in lines[0] and ("data_dir" in lines[0] if flag == "--data-dir" else "command" in lines[0])
    assert os.listdir(tmp_path) == [os.fsdecode(b"data-\xff")]


def test_a_study_run_from_a_folder_whose_name_is_not_utf8_runs_as_in_any_other(tmp_path):
    """The working directory's name is never recorded (a relative run dir is), so a study started
    inside a folder named with the byte 0xff runs and reports as anywhere else."""
    folder = os.fsencode(tmp_path) + b"/lab-\xff"
    os.mkdir(folder)
    done = heldout_cli("-q", "run", "--task", "lockpicking/six", "--optimizer", "seed", "--seeds", "0", "--budget",
                       "4", "--run-dir", "runs", cwd=Path(os.fsdecode(folder)))
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")[-1500:]
    assert (Path(os.fsdecode(folder)) / "runs" / "lockpicking__six" / "seed" / "seed-0" / "run_record.json").is_file()


def test_a_session_under_a_latin1_locale_ends_with_its_record(tmp_path, latin1_env):
    script = textwrap.dedent(f"""
        import heldout
        from heldout.evaluators.session import Budget, Session

        def optimize(view, seed):
            candidate = dict(view.seed_candidate)
            name = next(iter(candidate))
            return {{**candidate, name: candidate[name] + "\\n-- {ARROW_AND_KANJI}\\n"}}

        session = Session(heldout.load_task("lockpicking/six"), budget=Budget(4), seed=0, run_dir="run")
        print(session.run(optimize).status)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=tmp_path, env=latin1_env,
                          timeout=300)
    assert done.returncode == 0, done.stderr.decode("latin-1")[-600:]
    assert done.stdout.split() == [b"ok"] and (tmp_path / "run" / "run_record.json").is_file()
