"""Field conditions: a home folder that cannot hold the signing key.

In the lab $HOME is a writable folder of the user's, where the first session makes the key it
signs with (``~/.config/heldout/signing.key``). In the field a batch job or a container may run
with $HOME read-only or pointing somewhere no file can be made, or with no $HOME at all under a
uid that has no passwd entry (``docker run --user 12345``), where ``~`` stays ``~``: a relative
path, so the private key went into the working directory, and every folder a study ran from
signed with a key of its own. A study must refuse either before it writes anything, and no
command may make a key in the working directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

KEY_VARIABLES = ("HELDOUT_SIGNING_KEY", "HELDOUT_SIGNING_KEY_FILE", "HELDOUT_LEDGER_KEY", "XDG_CONFIG_HOME", "HOME")
STUDY = ("run", "--task", "lockpicking/six", "--optimizer", "seed", "--seeds", "0", "--budget", "4")


def environment(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KEY_VARIABLES}
    env.update(changes)
    return env


def test_a_study_whose_key_cannot_be_made_under_an_unwritable_home_is_refused_before_any_file(tmp_path):
    """/proc refuses even root a new folder. The study wrote study.json, study.toml and a cell's
    ledger lock, then failed making the key in its first session."""
    done = subprocess.run([sys.executable, "-m", "heldout", *STUDY, "--run-dir", str(tmp_path / "study")],
                          capture_output=True, text=True, cwd=tmp_path, env=environment(HOME="/proc/self/fdinfo"),
                          timeout=300)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines[-5:]
    assert "signing key" in lines[0] and "/proc/self/fdinfo/.config/heldout" in lines[0] and "$HOME" in lines[0]
    assert os.listdir(tmp_path) == []


@pytest.fixture
def homeless_user():
    """A command line run as uid 12345 (no passwd entry) with no $HOME, and a folder it may write."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and util-linux's setpriv to run as a uid without a passwd entry")
    folder = Path(tempfile.mkdtemp(prefix="heldout-homeless-"))  # not under pytest's owner-only tmp
    folder.chmod(0o777)
    prefix = [setpriv, "--reuid", "12345", "--regid", "12345", "--clear-groups"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "import os; print(os.path.expanduser('~'))"],
                           capture_output=True, text=True, env=environment(), cwd=folder)
    if probe.stdout.strip() != "~":
        shutil.rmtree(folder)
        pytest.skip(f"uid 12345 has a home here ({probe.stdout.strip()})")
    yield prefix, folder
    shutil.rmtree(folder)


def test_a_study_by_a_user_with_no_home_is_refused_and_writes_no_key_into_the_working_directory(homeless_user):
    prefix, folder = homeless_user
    # unsandboxed: bubblewrap needs namespaces this uid may not make, and the sandbox is not the question
    done = subprocess.run([*prefix, sys.executable, "-m", "heldout", "--unsafe-no-sandbox", *STUDY, "--run-dir",
                           "study"], capture_output=True, text=True, cwd=folder, env=environment(), timeout=300)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines[-5:]
    assert "relative to the working directory" in lines[0] and "$HOME" in lines[0]
    assert os.listdir(folder) == []


def test_key_show_by_a_user_with_no_home_writes_no_key_into_the_working_directory(homeless_user):
    prefix, folder = homeless_user
    done = subprocess.run([*prefix, sys.executable, "-m", "heldout", "key", "show"], capture_output=True, text=True,
                          cwd=folder, env=environment(), timeout=120)
    assert done.returncode == 2 and os.listdir(folder) == [], (done.returncode, os.listdir(folder))
