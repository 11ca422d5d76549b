"""The ```python blocks of the newcomer docs run as written (docs that cannot rot).

Each block is extracted from the Markdown and executed in a fresh interpreter, with the files the
doc says to create laid out in a temporary folder; a block that needs a model gets the loopback
test server (``heldout.models.testserver``) in place of the doc's ``http://127.0.0.1:8000/v1``.
A block marked ``<!-- not-run: reason -->`` on the line before it is a deliberate fragment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from heldout.models.testserver import TestServer

ROOT = Path(__file__).resolve().parent.parent
DOC_URL = "http://127.0.0.1:8000/v1"
BLOCK = re.compile(r"(?:<!-- not-run: (?P<why>[^>]*) -->\n)?```python\n(?P<code>.*?)```", re.S)


def python_blocks(doc: str) -> list[tuple[str, str | None]]:
    """(code, not-run reason or None) for each ```python block, in order."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    return [(m["code"], m["why"]) for m in BLOCK.finditer(text)]


def run_python(code: str, cwd: Path, path: Path | None = None, **extra_env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **extra_env)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600)


def heldout(argv: list[str], cwd: Path, path: Path) -> subprocess.CompletedProcess:
    return run_python(f"import sys\nfrom heldout.cli import main\nsys.exit(main({argv!r}))\n", cwd, path)


def test_every_block_of_the_newcomer_docs_is_run_here_or_marked_as_a_fragment():
    counts = {doc: len(python_blocks(doc)) for doc in ("README.md", "docs/write-a-task.md",
                                                          "docs/plug-an-optimizer.md")}
    unmarked_fragments = [code[:60] for code, why in python_blocks("docs/plug-an-optimizer.md")[2:] if why is None]
    # the tests below run write-a-task's 3 blocks and plug-an-optimizer's first 2; a new block needs a test
    assert counts == {"README.md": 0, "docs/write-a-task.md": 3, "docs/plug-an-optimizer.md": 3}
    assert unmarked_fragments == [], "mark a fragment with <!-- not-run: reason --> or run it in a test"


def test_write_a_task_plugin_installs_freezes_and_scores_as_its_comments_say(tmp_path):
    helper, package, _ = (code for code, _ in python_blocks("docs/write-a-task.md"))
    site = tmp_path / "site"
    (site / "sumsq_tasks").mkdir(parents=True)
    (site / "sumsq_tasks" / "entry_helper.py").write_text(helper)
    (site / "sumsq_tasks" / "__init__.py").write_text(package)
    info = site / "sumsq_tasks-0.1.dist-info"  # what `pip install` of the doc's pyproject.toml leaves
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sumsq-tasks\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[heldout.tasks]\nsumsq = sumsq_tasks\n")
    frozen = heldout(["data", "freeze", "--task", "sumsq/basic", "--profile", "default",
                      "--out", str(site / "sumsq_tasks" / "manifests")], tmp_path, site)
    assert frozen.returncode == 0, frozen.stderr
    val = heldout(["eval", "--task", "sumsq/basic", "--json"], tmp_path, site)
    test = heldout(["eval", "--task", "sumsq/basic", "--split", "test", "--json"], tmp_path, site)
    assert val.returncode == 0 and test.returncode == 0, val.stderr + test.stderr
    val, test = json.loads(val.stdout), json.loads(test.stdout)
    # the doc's comments: "the seed on val (eval's default): 0.0, 0 of 3" and "0.111, 1 of 9"
    assert (val["split"], val["n"], val["score"]) == ("val", 3, 0.0)
    assert (test["n"], round(test["score"], 3)) == (9, 0.111)


def test_write_a_task_family_module_imports_registers_and_scores(tmp_path):
    _, _, family = (code for code, _ in python_blocks("docs/write-a-task.md"))
    check = family + (
        "\nfrom heldout.benchmarks.registry import get_benchmark\n"
        "task = get_benchmark('capitals')\n"
        "ex = Example(id='1', input={'country': 'France'}, target='Paris')\n"
        "print(task.format_input(ex))\n"
        "print(task.score_text('So the answer is Paris.', ex).score, task.score_text('So the answer is Lyon.', ex).score)\n")
    out = run_python(check, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["What is the capital of France?", "1.0 0.0"]


def test_plug_an_optimizer_module_and_session_run_against_the_loopback_model(tmp_path, data_dir):
    my_opt, session, _ = (code for code, _ in python_blocks("docs/plug-an-optimizer.md"))
    (tmp_path / "my_opt.py").write_text(my_opt)
    with TestServer() as server:
        assert DOC_URL in session
        out = run_python(session.replace(DOC_URL, server.base_url), tmp_path, tmp_path,
                         HELDOUT_DATA_DIR=str(Path(data_dir).resolve()))
    assert out.returncode == 0, out.stderr
    status, score, verifier = out.stdout.split()[:3]
    assert status == "ok" and 0.0 <= float(score) <= 1.0 and verifier
