"""Hostile or broken input files and names, through the real command: each gets one clear line and
exit 2, no traceback, no hang, and nothing is written. (A name becomes a folder of every run dir; a
file a user hands heldout, or a file in a run dir someone copied, may be a directory, a FIFO, a link
to /dev/zero, binary, truncated, of the wrong JSON type, or not UTF-8.)

Every command that reads a file or a name is in the table: ``run`` (study files, ``--task``,
``--run-dir``, method names, ``--optimizer-cmd``, and ``--resume`` reading the run dir's ledgers and
study record), ``score --outputs``, ``eval --candidate`` and ``leak scan``, ``report``, ``check``,
``runs query``, ``plan --pilot`` and ``leak ablate`` reading run records, ledgers and study records,
``data freeze`` / ``split build`` (examples files, task and profile names), ``vliw simulate`` and
``compare``. ``ledger verify`` is the one command whose answer to a broken ledger is a verdict, not
an input error: one INVALID line and exit 1 (its documented "does not verify")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest


SESSION = "lockpicking__six/seed/seed-0"  # the one session of the finished run below
STUDY = """tasks = ["lockpicking/six"]
seeds = [0]
[budget]
default = 4
[[methods]]
name = {name}
{how}
"""
HUGE = 20 * 1024 * 1024  # a 20 MB line: over every text limit but the examples file's


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A real finished study: one seed of the seed optimizer on lockpicking/six."""
    root = tmp_path_factory.mktemp("finished")
    done = subprocess.run([sys.executable, "-m", "heldout.cli", "run", "--task", "lockpicking/six", "--optimizer",
                           "seed", "--seeds", "0", "--budget", "4", "--run-dir", str(root / "study")],
                          capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-1500:]
    return root / "study"


class Work:
    """The folder a case builds its hostile input in (the command's inputs live here too)."""

    def __init__(self, root: Path, finished: Path) -> None:
        self.root, self._finished = root, finished

    def file(self, name: str, data: bytes | str) -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return str(path)

    def link(self, name: str, target: str) -> str:
        (self.root / name).symlink_to(target)
        return str(self.root / name)

    def fifo(self, name: str) -> str:
        os.mkfifo(self.root / name)
        return str(self.root / name)

    def folder(self, name: str) -> str:
        (self.root / name).mkdir()
        return str(self.root / name)

    def study(self, name: str = '"m"', how: str = 'optimizer = "seed"', task: str = "lockpicking/six") -> list[str]:
        return self.study_file(STUDY.format(name=name, how=how).replace("lockpicking/six", task))

    def study_file(self, data: bytes | str, *, run_dir: bool = True) -> list[str]:
        return ["run", self.file("study.toml", data)] + (["--run-dir", str(self.root / "runs")] if run_dir else [])

    def flags(self, *extra: str) -> list[str]:
        return ["run", "--task", "lockpicking/six", "--seeds", "0", "--budget", "4",
                "--run-dir", str(self.root / "runs"), *extra]

    def run(self, file: str | None = None, becomes: bytes | str | Callable[[bytes], bytes] | None = None) -> str:
        """A copy of the finished study, with its session's ``file`` replaced: by bytes, by a
        function of the old bytes, by ``"<dir>"`` (a directory) or ``"->TARGET"`` (a symlink)."""
        copy = self.root / "study"
        shutil.copytree(self._finished, copy, symlinks=True)
        if file is not None:
            path = copy / (file if file == "study.json" else f"{SESSION}/{file}")
            old = path.read_bytes()
            path.unlink()
            if becomes == "<dir>":
                path.mkdir()
            elif isinstance(becomes, str) and becomes.startswith("->"):
                path.symlink_to(becomes[2:])
            else:
                path.write_bytes(becomes(old) if callable(becomes) else becomes)
        return str(copy)

    def record(self, **changes) -> Callable[[bytes], bytes]:
        return lambda old: json.dumps({**json.loads(old), **changes}).encode()


def _score(outputs: str) -> list[str]:
    return ["score", "--task", "bbh/snarks", "--outputs", outputs]


def _eval(candidate: str) -> list[str]:
    return ["eval", "--task", "circle_packing/square26", "--candidate", candidate]


def _report(run: str, w: Work) -> list[str]:
    return ["report", run, "--out", str(w.root / "report")]


def _check(run: str) -> list[str]:
    return ["check", "--baseline", run, "--current", run]


def _resume(run: str) -> list[str]:
    return ["run", str(Path(run) / "study.toml"), "--run-dir", run, "--resume"]


def _freeze(w: Work, *, task: str = "mine/x", profile: str = "p", jsonl: str | None = None) -> list[str]:
    rows = "".join(json.dumps({"id": f"e{i}", "input": {"question": "q"}, "target": "t"}) + "\n" for i in range(6))
    return ["data", "freeze", "--task", task, "--profile", profile, "--out", str(w.root / "manifests"),
            "--jsonl", jsonl or w.file("examples.jsonl", rows)]


NOT_UTF8, WITH_NUL, TRUNCATED = b'{"id": "\xff\xfe"}\n', b'{"id": "0"}\x00\n', b'{"id": "0", "outp'
BAD_RECORDS = {  # what a session's run_record.json may have become
    "empty": b"", "truncated JSON": b'{"task": "lockpicking/six", "se', "a JSON list, not an object": b"[1, 2]",
    "not UTF-8": b'{"task": "\xff"}', "holding a NUL byte": b'{"task": "a\x00"}', "a directory": "<dir>",
    "a link to /dev/zero": "->/dev/zero", "a link to /proc/self/mem": "->/proc/self/mem",
    "a FIFO": None,  # made below: the fifo must exist where the record was
}
BAD_LEDGERS = {
    "with a line that is not JSON": lambda old: old + b"not json\n",
    "with an entry missing its fields": lambda old: old + b'{"seq": 99}\n',
    "not UTF-8": lambda old: old + b'{"x": "\xff"}\n', "holding a NUL byte": lambda old: b"\x00" + old,
    "a directory": "<dir>", "a link to /dev/zero": "->/dev/zero",
}


def _fifo_record(w: Work) -> str:
    run = w.run()
    path = Path(run) / SESSION / "run_record.json"
    path.unlink()
    os.mkfifo(path)
    return run


def _bad_record(w: Work, how: str) -> str:
    return _fifo_record(w) if how == "a FIFO" else w.run("run_record.json", BAD_RECORDS[how])


CASES: dict[str, Callable[[Work], list[str]]] = {
    # -- run: study files ----------------------------------------------------------------------
    "run: a study method name with a newline": lambda w: w.study('"a\\nb"'),
    "run: a study method name with NUL": lambda w: w.study('"a\\u0000b"'),
    "run: a study method name climbing out of the run dir": lambda w: w.study('"../../escape"'),
    "run: a study method name with a slash": lambda w: w.study('"a/b"'),
    "run: a study method name with a leading dash": lambda w: w.study('"-m"'),
    "run: a study method name that is an absolute path": lambda w: w.study('"/tmp/abs"'),
    "run: a study file that is a directory": lambda w: ["run", str(w.root), "--run-dir", str(w.root / "runs")],
    "run: a study file that is not UTF-8": lambda w: w.study_file(b'tasks = ["\xff\xfe"]\n'),
    "run: a study file with a NUL byte": lambda w: w.study_file(b"tasks = []\x00\n"),
    "run: a study file that does not exist": lambda w: ["run", str(w.root / "missing.toml"), "--run-dir",
                                                        str(w.root / "runs")],
    "run: a study file that is empty": lambda w: w.study_file(b""),
    "run: a study file that is truncated": lambda w: w.study_file(b'tasks = ["lockpick'),
    "run: a study file with a 20 MB line": lambda w: w.study_file(b"# " + b"x" * HUGE + b"\n"),
    "run: a study file that links to /dev/zero": lambda w: ["run", w.link("s.toml", "/dev/zero")],
    "run: a study file that links to /proc/self/mem": lambda w: ["run", w.link("s.toml", "/proc/self/mem")],
    "run: a study file that is a FIFO": lambda w: ["run", w.fifo("s.toml")],
    "run: a study file with the wrong type for tasks": lambda w: w.study_file(b"tasks = 5\n"),
    "run: a study file with a string where the budget is a number":
        lambda w: w.study_file(STUDY.format(name='"m"', how="").replace("default = 4", 'default = "4"')),
    "run: a study task name climbing out with ../": lambda w: w.study(task="../../etc"),
    "run: a study task name with a newline": lambda w: w.study(task="lock\\npicking"),
    "run: a study run_dir with a newline": lambda w: w.study_file(f'run_dir = "{w.root}/a\\nb"\n' + STUDY.format(
        name='"m"', how='optimizer = "seed"'), run_dir=False),
    "run: a study optimizer that does not exist": lambda w: w.study(how='optimizer = "no-such-optimizer"'),
    "run: a study optimizer command that is empty": lambda w: w.study(how='command = ""'),
    "run: a study optimizer command with NUL": lambda w: w.study(how='command = "python\\u0000 x.py"'),
    "run: a study optimizer command naming no program": lambda w: w.study(how='command = "/no/such/program --x"'),
    # -- run: flags --------------------------------------------------------------------------------
    "run: a flag method name with a newline": lambda w: w.flags("--optimizer", "a\nb=seed"),
    "run: a flag method name climbing out with ../": lambda w: w.flags("--optimizer", "../x=seed"),
    "run: an optimizer-cmd name with a newline": lambda w: w.flags("--optimizer-cmd", "x\ny=python my_opt.py"),
    "run: an optimizer-cmd that is empty": lambda w: w.flags("--optimizer-cmd", ""),
    "run: an optimizer-cmd of spaces": lambda w: w.flags("--optimizer-cmd", "   "),
    "run: an optimizer-cmd naming a program that does not exist": lambda w: w.flags("--optimizer-cmd", "/no/such/prog"),
    "run: an optimizer-cmd naming a program not on PATH": lambda w: w.flags("--optimizer-cmd", "no-such-prog-xyz --a"),
    "run: an optimizer-cmd naming a file that is not executable":
        lambda w: w.flags("--optimizer-cmd", w.file("opt.sh", "#!/bin/sh\n")),
    "run: an optimizer-cmd naming a directory": lambda w: w.flags("--optimizer-cmd", w.folder("optdir")),
    "run: an optimizer-cmd whose quoting does not close": lambda w: w.flags("--optimizer-cmd", "python 'unclosed"),
    "run: a task name with a newline": lambda w: ["run", "--task", "lock\npicking", "--optimizer", "seed",
                                                  "--budget", "4", "--run-dir", str(w.root / "runs")],
    "run: a task name climbing out with ../": lambda w: ["run", "--task", "../../etc", "--optimizer", "seed",
                                                         "--budget", "4", "--run-dir", str(w.root / "runs")],
    "run: a task name with a leading dash": lambda w: ["run", "--task=-x", "--optimizer", "seed", "--budget", "4",
                                                       "--run-dir", str(w.root / "runs")],
    "run: a task name that is an absolute path": lambda w: ["run", "--task", "/etc/passwd", "--optimizer", "seed",
                                                            "--budget", "4", "--run-dir", str(w.root / "runs")],
    "run: a run dir with a newline": lambda w: ["run", "--task", "lockpicking/six", "--optimizer", "seed",
                                                "--budget", "4", "--run-dir", str(w.root / "a\nb")],
    "run: a run dir that is a file": lambda w: ["run", "--task", "lockpicking/six", "--optimizer", "seed",
                                                "--budget", "4", "--run-dir", w.file("afile", "x")],
    "run: a profile name climbing out with ../": lambda w: w.flags("--optimizer", "seed", "--profile", "../../x"),
    # -- run --resume: the run dir's own files -----------------------------------------------------
    "run --resume: a study record that is truncated": lambda w: _resume(w.run("study.json", b'{"cells": [')),
    "run --resume: a study record that is a JSON list": lambda w: _resume(w.run("study.json", b"[]")),
    "run --resume: a study record that is not UTF-8": lambda w: _resume(w.run("study.json", b"\xff")),
    "run --resume: a study record that links to /dev/zero": lambda w: _resume(w.run("study.json", "->/dev/zero")),
    # -- score / eval / leak scan: outputs and candidates ------------------------------------------
    "score: outputs that are a directory": lambda w: _score(str(w.root)),
    "score: outputs that are not UTF-8": lambda w: _score(w.file("o.jsonl", b'{"id": "0", "output": "\xff"}\n')),
    "score: outputs with the wrong JSON type": lambda w: _score(w.file("o.jsonl", b'["not", "an", "object"]\n')),
    "score: outputs with a number where the output is text": lambda w: _score(w.file("o.jsonl", b'{"id": "0", "output": 3}\n')),
    "score: outputs that are empty": lambda w: _score(w.file("o.jsonl", b"")),
    "score: outputs that do not exist": lambda w: _score(str(w.root / "o.jsonl")),
    "score: outputs that are truncated": lambda w: _score(w.file("o.jsonl", TRUNCATED)),
    "score: outputs with a NUL byte": lambda w: _score(w.file("o.jsonl", WITH_NUL)),
    "score: outputs that are /dev/zero": lambda w: _score("/dev/zero"),
    "score: outputs that are /proc/self/mem": lambda w: _score("/proc/self/mem"),
    "score: outputs that are a FIFO": lambda w: _score(w.fifo("o.jsonl")),
    "score: a task name climbing out with ../": lambda w: ["score", "--task", "../../etc/passwd",
                                                           "--outputs", w.file("o.jsonl", b'{"id":"0","output":"x"}\n')],
    "eval: a candidate that is not UTF-8": lambda w: _eval(w.file("c.py", b"\xff\xfe\x00\x01")),
    "eval: a candidate that is an empty folder": lambda w: _eval(w.folder("empty")),
    "eval: a candidate that is an empty file": lambda w: _eval(w.file("c.py", b"")),
    "eval: a candidate that does not exist": lambda w: _eval(str(w.root / "c.py")),
    "eval: a candidate over the size limit": lambda w: _eval(w.file("c.py", b"#" + b"x" * HUGE + b"\n")),
    "eval: a candidate that links to /dev/zero": lambda w: _eval(w.link("c.py", "/dev/zero")),
    "eval: a candidate that is /proc/self/mem": lambda w: _eval("/proc/self/mem"),
    "eval: a candidate that is a FIFO": lambda w: _eval(w.fifo("c.py")),
    "eval: a JSON candidate that is a list": lambda w: _eval(w.file("c.json", b"[1, 2]")),
    "eval: a JSON candidate that is truncated": lambda w: _eval(w.file("c.json", b'{"program.py": "')),
    "eval: a JSON candidate with a number where the text is": lambda w: _eval(w.file("c.json", b'{"program.py": 5}')),
    "eval: a task name with a newline": lambda w: ["eval", "--task", "circle\npacking"],
    "leak scan: a candidate that is not UTF-8": lambda w: ["leak", "scan", w.file("c.txt", b"\xff"), "--task",
                                                           "bbh/snarks", "--profile", "default"],
    # -- report / check / runs / plan / leak ablate: run records, ledgers, study records -----------
    **{f"report: a run record that is {how}": (lambda how: lambda w: _report(_bad_record(w, how), w))(how)
       for how in BAD_RECORDS},
    "report: a run record with a string where the seed is a number":
        lambda w: _report(w.run("run_record.json", w.record(seed="zero")), w),
    "report: a run record whose format version is from the future":
        lambda w: _report(w.run("run_record.json", w.record(format_version=99)), w),
    **{f"report: a ledger {how}": (lambda how: lambda w: _report(w.run("ledger.jsonl", BAD_LEDGERS[how]), w))(how)
       for how in BAD_LEDGERS},
    "report: an output folder that is a file": lambda w: ["report", w.run(), "--out", w.file("out", "x")],
    "check: a run record that is truncated": lambda w: _check(_bad_record(w, "truncated JSON")),
    "check: a run record that links to /dev/zero": lambda w: _check(_bad_record(w, "a link to /dev/zero")),
    "check: a run record whose format version is from the future":
        lambda w: _check(w.run("run_record.json", w.record(format_version=99))),
    "check: a ledger that links to /dev/zero": lambda w: _check(w.run("ledger.jsonl", "->/dev/zero")),
    "check: a ledger that is a directory": lambda w: _check(w.run("ledger.jsonl", "<dir>")),
    "plan: a pilot whose run record links to /dev/zero":
        lambda w: ["plan", "--task", "lockpicking/six", "--seeds", "3", "--pilot", _bad_record(w, "a link to /dev/zero")],
    "leak ablate: a study record that is truncated": lambda w: ["leak", "ablate", w.run("study.json", b'{"a')],
    "leak ablate: a study record that is a JSON list": lambda w: ["leak", "ablate", w.run("study.json", b"[]")],
    "leak ablate: a study record that is not UTF-8": lambda w: ["leak", "ablate", w.run("study.json", b"\xff")],
    # -- data freeze / split build / vliw / compare / demo -----------------------------------------
    "data freeze: examples that are a directory": lambda w: _freeze(w, jsonl=str(w.root)),
    "data freeze: examples that are not UTF-8": lambda w: _freeze(w, jsonl=w.file("d.jsonl", b"\xff\n")),
    "data freeze: examples that link to /dev/zero": lambda w: _freeze(w, jsonl=w.link("d.jsonl", "/dev/zero")),
    "data freeze: an example that is a JSON list": lambda w: _freeze(w, jsonl=w.file("d.jsonl", b"[1]\n")),
    "data freeze: a task name with a newline": lambda w: _freeze(w, task="a\nb"),
    "data freeze: a task name climbing out with ../": lambda w: _freeze(w, task="../../x"),
    "data freeze: a profile name climbing out with ../": lambda w: _freeze(w, profile="../../p"),
    "data freeze: a profile name with a leading dash": lambda w: _freeze(w, profile="-p"),
    "split build: a profile name with a newline": lambda w: ["split", "build", "--task", "mmlu_pro/economics",
                                                             "--sizes", "1/1/1", "--name", "a\nb",
                                                             "--out", str(w.root / "manifests")],
    "vliw simulate: cases that are a directory": lambda w: ["vliw", "simulate", str(w.root)],
    "vliw simulate: cases that are not UTF-8": lambda w: ["vliw", "simulate", w.file("c.json", b"\xff")],
    "vliw simulate: cases that are an object, not a list": lambda w: ["vliw", "simulate", w.file("c.json", b"{}")],
    "vliw simulate: cases that are /dev/zero": lambda w: ["vliw", "simulate", "/dev/zero"],
    "compare arms: a run dir with a newline": lambda w: ["compare", "arms", "--task", "lockpicking/six", "--optimizer",
                                                         "local-search", "--budget", "8", "--width", "2",
                                                         "--run-dir", str(w.root / "a\nb")],
    "demo: a run dir that is a file": lambda w: ["demo", "--run-dir", w.file("afile", "x")],
}


def _snapshot(root: Path) -> list[tuple[str, bool]]:
    return sorted((str(p.relative_to(root)), p.is_dir()) for p in root.rglob("*"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_input_is_one_clear_line_and_exit_2_and_nothing_written(case, tmp_path, data_dir, finished_run,
                                                                          warm_cli):
    work = Work(tmp_path / "work", finished_run)
    work.root.mkdir()
    args = CASES[case](work)
    before = _snapshot(tmp_path)
    env = {**os.environ, "HELDOUT_DATA_DIR": str(data_dir)}
    done = warm_cli.run(*args, cwd=tmp_path, env=env)
    assert done.returncode == 2, (case, done.stdout[-500:], done.stderr[-1500:])
    assert "Traceback" not in done.stderr, done.stderr[-1500:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("heldout") and "error" in lines[0], done.stderr
    assert _snapshot(tmp_path) == before  # nothing written: no file, no folder with an odd name


VERDICTS: dict[str, Callable[[Work], str]] = {
    **{f"a ledger {how}": (lambda how: lambda w: w.run("ledger.jsonl", BAD_LEDGERS[how]))(how) for how in BAD_LEDGERS},
    "a run record that is truncated beside an intact ledger": lambda w: _bad_record(w, "truncated JSON"),
    "a run record that links to /dev/zero beside an intact ledger": lambda w: _bad_record(w, "a link to /dev/zero"),
}


@pytest.mark.parametrize("case", sorted(VERDICTS))
def test_ledger_verify_calls_a_broken_ledger_invalid_in_one_line_with_exit_1(case, tmp_path, finished_run, warm_cli):
    work = Work(tmp_path / "work", finished_run)
    work.root.mkdir()
    run = VERDICTS[case](work)
    before = _snapshot(tmp_path)
    done = warm_cli.run("ledger", "verify", run, cwd=tmp_path)
    assert done.returncode == 1, (case, done.stdout[-500:], done.stderr[-1500:])
    assert "Traceback" not in done.stderr and not done.stderr.strip(), done.stderr[-1500:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("INVALID") and SESSION in lines[0], done.stdout
    assert _snapshot(tmp_path) == before
