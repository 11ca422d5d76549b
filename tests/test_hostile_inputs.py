"""Hostile or broken input files and names, through the real command: each gets one clear line and
exit 2, no traceback, and nothing is written. (A name becomes a folder of every run dir; a file a
user hands heldout may be a directory, binary, or not UTF-8.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

STUDY = """tasks = ["lockpicking/six"]
seeds = [0]
[budget]
default = 4
[[methods]]
name = {name}
optimizer = "seed"
"""


def heldout(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "heldout.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def _study(tmp: Path, name_toml: str) -> list[str]:
    path = tmp / "study.toml"
    path.write_text(STUDY.format(name=name_toml))
    return ["run", str(path), "--run-dir", str(tmp / "runs")]


def _bytes(tmp: Path, data: bytes, suffix: str) -> Path:
    path = tmp / f"input{suffix}"
    path.write_bytes(data)
    return path


CASES = {
    "study method name with a newline": lambda t: _study(t, '"a\\nb"'),
    "study method name with NUL": lambda t: _study(t, '"a\\u0000b"'),
    "study method name climbing out of the run dir": lambda t: _study(t, '"../../escape"'),
    "study method name with a slash": lambda t: _study(t, '"a/b"'),
    "study file that is a directory": lambda t: ["run", str(t), "--run-dir", str(t / "runs")],
    "study file that is not UTF-8": lambda t: ["run", str(_bytes(t, b"tasks = [\"\xff\xfe\"]\n", ".toml")),
                                               "--run-dir", str(t / "runs")],
    "study file with a NUL byte": lambda t: ["run", str(_bytes(t, b"tasks = []\x00\n", ".toml")),
                                             "--run-dir", str(t / "runs")],
    "study file that does not exist": lambda t: ["run", str(t / "missing.toml"), "--run-dir", str(t / "runs")],
    "study file with the wrong type": lambda t: ["run", str(_bytes(t, b"tasks = 5\n", ".toml")),
                                                 "--run-dir", str(t / "runs")],
    "flag method name with a newline": lambda t: ["run", "--task", "lockpicking/six", "--optimizer", "a\nb=seed",
                                                  "--seeds", "0", "--budget", "4", "--run-dir", str(t / "runs")],
    "optimizer-cmd name with a newline": lambda t: ["run", "--task", "lockpicking/six", "--optimizer-cmd",
                                                    "x\ny=python my_opt.py", "--seeds", "0", "--budget", "4",
                                                    "--run-dir", str(t / "runs")],
    "outputs that are a directory": lambda t: ["score", "--task", "bbh/snarks", "--outputs", str(t)],
    "outputs that are not UTF-8": lambda t: ["score", "--task", "bbh/snarks", "--outputs",
                                             str(_bytes(t, b'{"id": "0", "output": "\xff"}\n', ".jsonl"))],
    "outputs with the wrong JSON type": lambda t: ["score", "--task", "bbh/snarks", "--outputs",
                                                   str(_bytes(t, b'["not", "an", "object"]\n', ".jsonl"))],
    "candidate that is not UTF-8": lambda t: ["eval", "--task", "circle_packing/square26", "--candidate",
                                              str(_bytes(t, b"\xff\xfe\x00\x01", ".py"))],
    "candidate that is an empty folder": lambda t: ["eval", "--task", "circle_packing/square26", "--candidate",
                                                    str((t / "empty").mkdir() or t / "empty")],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_input_is_one_clear_line_and_exit_2_and_nothing_written(case, tmp_path, data_dir):
    work = tmp_path / "work"
    work.mkdir()
    args = CASES[case](work)
    if args[0] == "score":
        args += ["--data-dir", str(data_dir)]
    before = sorted(p.relative_to(work) for p in work.rglob("*"))
    done = heldout(*args, cwd=tmp_path)
    assert done.returncode == 2, (case, done.stdout[-500:], done.stderr[-1500:])
    assert "Traceback" not in done.stderr, done.stderr[-1500:]
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("heldout"), done.stderr
    assert sorted(p.relative_to(work) for p in work.rglob("*")) == before  # nothing written
    assert not (work / "runs").exists()
