"""Figures quoted in the docs come from the commands beside them (issue 58): each ``heldout run``
of a docs/plug-an-optimizer.md bash block that is followed by quoted scores is run here as written
(the loopback test server for the doc's ``http://127.0.0.1:8000/v1``, a temporary run dir, the
real data), and every score the next paragraph quotes as ```method` 0.747`` must be that method's
held-out score, to the decimals quoted. A figure whose command changes, or whose library does,
fails here instead of going stale in the doc."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from heldout.evaluators.records import RunRecord
from heldout.models.testserver import TestServer
from test_doc_blocks import DOC_URL, ROOT, heldout, python_blocks

DOC = "docs/plug-an-optimizer.md"
BASH = re.compile(r"```bash\n(?P<code>.*?)```\n\n(?P<after>.*?)\n\n", re.S)
QUOTED = re.compile(r"`(?P<method>[\w-]+)` (?P<score>\d+\.\d+)")


def quoted_runs(doc: str) -> list[tuple[list[list[str]], dict[str, str]]]:
    """(the ``heldout run`` commands of a bash block, {method: quoted score}) for each block whose
    next paragraph quotes scores."""
    found = []
    for match in BASH.finditer((ROOT / doc).read_text(encoding="utf-8")):
        quoted = {m["method"]: m["score"] for m in QUOTED.finditer(match["after"])}
        lines = match["code"].replace("\\\n", " ").splitlines()
        commands = [shlex.split(line.split("#")[0])[1:] for line in lines if line.startswith("heldout run ")]
        if quoted and commands:
            found.append((commands, quoted))
    return found


def as_here(argv: list[str], base_url: str, data_dir: Path, runs: Path) -> list[str]:
    """The doc's command with this machine's endpoint, data and a temporary run dir."""
    out, args = [], iter(argv)
    for arg in args:
        if arg in ("--base-url", "--data-dir", "--run-dir"):
            value = next(args)
            arg, value = arg, {"--base-url": base_url, "--data-dir": str(data_dir),
                               "--run-dir": str(runs / Path(value).name)}[arg]
            out += [arg, value]
        else:
            out.append(arg)
    return ["-q", *out]


def scores(run_dir: Path) -> dict[str, float]:
    return {(rec := RunRecord.load(path.parent)).method: rec.test_score for path in run_dir.rglob("run_record.json")}


def test_the_doc_quotes_figures_for_its_blocks():
    blocks = quoted_runs(DOC)
    assert len(blocks) == 2 and all(quoted for _, quoted in blocks)


@pytest.mark.parametrize("block", range(2))
def test_every_score_plug_an_optimizer_quotes_is_what_its_command_gives(block, tmp_path, data_dir):
    commands, quoted = quoted_runs(DOC)[block]
    for library in ("gepa", "dspy", "openevolve"):
        if any(library in " ".join(c) for c in commands):
            pytest.importorskip(library, reason=f"the [{library}] extra is not installed (CI installs it)")
    (tmp_path / "my_opt.py").write_text(python_blocks(DOC)[0][0])  # the doc's own optimizer file
    tmp_path.chmod(0o755)  # the isolated child's throw-away uid reads run dirs inside it
    got: dict[str, float] = {}
    with TestServer() as server:
        for argv in commands:
            assert DOC_URL in argv
            run = heldout(as_here(argv, server.base_url, Path(data_dir).resolve(), tmp_path / "runs"), tmp_path,
                          tmp_path)
            assert run.returncode == 0, run.stderr[-3000:]
            got.update(scores(tmp_path / "runs" / Path(argv[argv.index("--run-dir") + 1]).name))
    for method, text in quoted.items():
        decimals = len(text.split(".")[1])
        assert method in got, (method, sorted(got))
        assert f"{got[method]:.{decimals}f}" == text, f"{DOC} quotes {method} {text}; its command gives {got[method]}"
