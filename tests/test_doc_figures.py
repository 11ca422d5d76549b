"""Figures quoted in the docs come from the commands beside them (issue 58): each bash block of
docs/plug-an-optimizer.md that is followed by quoted scores is run here whole, as written (the
loopback test server for the doc's ``http://127.0.0.1:8000/v1``, the real data, a temporary folder;
tests/doc_blocks.py), and every score the next paragraph quotes as ```method` 0.747`` must be that
method's held-out score, to the decimals quoted. A figure whose command changes, or whose library
does, fails here instead of going stale in the doc."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from doc_blocks import DOC_URL, ROOT, python_blocks, run_shell
from heldout.evaluators.records import RunRecord
from heldout.models.testserver import TestServer

DOC = "docs/plug-an-optimizer.md"
BASH = re.compile(r"```bash\n(?P<code>.*?)```\n\n(?P<after>.*?)\n\n", re.S)
QUOTED = re.compile(r"`(?P<method>[\w-]+)` (?P<score>\d+\.\d+)")


def quoted_blocks(doc: str) -> list[tuple[str, dict[str, str]]]:
    """(a bash block that runs ``heldout run``, {method: quoted score}) for each such block whose next
    paragraph quotes scores."""
    found = []
    for match in BASH.finditer((ROOT / doc).read_text(encoding="utf-8")):
        quoted = {m["method"]: m["score"] for m in QUOTED.finditer(match["after"])}
        if quoted and "heldout run " in match["code"]:
            found.append((match["code"], quoted))
    return found


def scores(run_dir: Path) -> dict[str, float]:
    return {(rec := RunRecord.load(path.parent)).method: rec.test_score for path in run_dir.rglob("run_record.json")}


def test_the_doc_quotes_figures_for_its_blocks():
    blocks = quoted_blocks(DOC)
    assert len(blocks) == 2 and all(quoted for _, quoted in blocks)


@pytest.mark.parametrize("block", range(2))
def test_every_score_plug_an_optimizer_quotes_is_what_its_command_gives(block, tmp_path, data_dir):
    code, quoted = quoted_blocks(DOC)[block]
    for library in ("gepa", "dspy", "openevolve"):
        if f"--optimizer {library}" in code:
            pytest.importorskip(library, reason=f"the [{library}] extra is not installed (CI installs it)")
    (tmp_path / "my_opt.py").write_text(python_blocks(DOC)[0][0])  # the doc's own optimizer file
    tmp_path.chmod(0o755)  # the isolated child's throw-away uid reads run dirs inside it
    assert DOC_URL in code
    with TestServer() as server:
        done = run_shell(code, tmp_path, server_url=server.base_url, data_dir=Path(data_dir).resolve())
    assert done.returncode == 0, done.stderr[-3000:]
    got = scores(tmp_path / "runs")
    for method, text in quoted.items():
        decimals = len(text.split(".")[1])
        assert method in got, (method, sorted(got))
        assert f"{got[method]:.{decimals}f}" == text, f"{DOC} quotes {method} {text}; its command gives {got[method]}"
