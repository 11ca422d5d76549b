"""Field conditions: a report rewritten on a disk that fills up.

In the lab a report folder is written once on a disk with room. In the field it is rewritten as a
study grows (the same ``heldout report --out``, ``runs export``), on a shared or small disk that
fills. A write that fails must leave the files of the last report whole: the figures and the
paper's tables were written in place (opened, truncated, then written), so a full disk left them
empty or cut, and a LaTeX build or a reader took a torn table for a table. The disk is real: a
small tmpfs mounted for the test (root only, as in CI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from small_disk import fill, small_disk


def heldout_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "heldout", "-q", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("study")
    done = heldout_cli("run", "--task", "lockpicking/six", "--optimizer", "seed", "--optimizer", "local-search",
                       "--seeds", "0,1", "--budget", "20", "--run-dir", str(root / "runs"), cwd=root)
    assert done.returncode == 0, done.stderr[-1500:]
    return root / "runs"


@pytest.mark.parametrize("command", [("report", "--format", "latex"), ("runs", "export")],
                         ids=["report", "runs-export"])
def test_a_rewrite_that_fills_the_disk_leaves_the_last_files_whole(command, study, tmp_path):
    """The first report is of the seed's runs, the second of the whole study, as a study grows: its
    files are larger (rewritten in place at the same size, a file fits in the room it frees)."""
    def written(runs: Path, out: Path) -> list[str]:
        if command[0] == "report":
            return ["report", str(runs), "--out", str(out), *command[1:]]
        return [*command, str(runs), "--parquet", str(out)]

    with small_disk(tmp_path / "disk", "8m") as disk:
        out = disk / "out"
        first = heldout_cli(*written(study / "lockpicking__six" / "seed", out), cwd=tmp_path)
        assert first.returncode == 0, first.stderr[-1500:]
        before = contents(out)
        assert any(name.endswith((".png", ".tex", ".parquet")) for name in before), sorted(before)
        fill(disk)
        again = heldout_cli(*written(study, out), cwd=tmp_path)
        lines = again.stderr.splitlines()
        assert again.returncode == 2 and len(lines) == 1 and "no space left" in lines[0], lines[-8:]
        assert contents(out) == before  # every file of the last report as it was, and no temp file left
