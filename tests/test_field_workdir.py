"""Field conditions: a study rerun from another working directory.

In the lab a study is started and resumed from one folder. In the field it is resumed from
wherever the person (or a batch job, which starts in $HOME) happens to be, with the command its
saved file prints: ``heldout run RUN_DIR/study.toml``. The run dir that file states was relative
to the first run's folder, so from anywhere else the same command started a new study there,
spending the budget again, and left the original as it was. The study saved in a run dir reruns
that run dir, from any folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def heldout_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "heldout", "-q", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.fixture(scope="module")
def first_folder(tmp_path_factory) -> Path:
    """A finished study, started in its folder with a relative run dir."""
    folder = tmp_path_factory.mktemp("first")
    done = heldout_cli("run", "--task", "lockpicking/six", "--optimizer", "seed", "--seeds", "0", "--budget", "4",
                       "--run-dir", "runs/study", cwd=folder)
    assert done.returncode == 0, done.stderr[-1500:]
    assert 'run_dir = "runs/study"' in (folder / "runs" / "study" / "study.toml").read_text()
    return folder


def test_the_saved_study_resumed_from_another_folder_resumes_its_own_run_dir(first_folder, tmp_path):
    saved = first_folder / "runs" / "study" / "study.toml"
    done = heldout_cli("run", str(saved), "--resume", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-1500:]
    assert os.listdir(tmp_path) == []  # no second study here
    assert str(first_folder / "runs" / "study" / "lockpicking__six" / "seed" / "seed-0") in done.stdout


def test_the_saved_study_rerun_from_another_folder_without_resume_is_refused_as_the_same_study(first_folder,
                                                                                                tmp_path):
    done = heldout_cli("run", str(first_folder / "runs" / "study" / "study.toml"), cwd=tmp_path)
    assert done.returncode == 2 and "already holds this study" in done.stderr and "--resume" in done.stderr
    assert os.listdir(tmp_path) == []


def test_a_study_file_of_ones_own_keeps_its_run_dir_relative_to_the_working_directory(tmp_path):
    """Only the file heldout saved in a run dir is read as that run dir's: a study file a person
    writes keeps the documented rule (run_dir relative to where the command runs)."""
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "study.toml").write_text('run_dir = "runs/mine"\ntasks = ["lockpicking/six"]\nbudget = 4\n'
                                                  '[[methods]]\nname = "seed"\n')
    done = heldout_cli("run", "plan/study.toml", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "runs/mine/lockpicking__six" in done.stdout and "plan/runs" not in done.stdout
