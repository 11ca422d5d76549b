"""The how-to pages' packages, installed by a real ``pip install`` and found through their entry points.

docs/write-a-task.md's task packages (``sumsq-tasks``, a program task; ``sums-tasks``, a JSONL file as a
``UserJsonlTask``) and docs/plug-an-optimizer.md's optimizer package (``my-package``) are laid out from
the docs' own blocks. Their bash blocks run as written (``pip install -e`` included) in a throw-away
venv; a second venv installs the same packages the way a wheel would (regular install, manifests
frozen into them first, as the doc says) and then loses their source folders, so what runs there can
only come from what pip installed. Every figure a block's comment quotes (``0.111, 1 of 9``) is
checked against what the command printed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from doc_blocks import FENCE, ROOT, json_objects, offline_venv, run_shell, the_block
from heldout.models.testserver import TestServer

TASK_DOC, OPT_DOC = "docs/write-a-task.md", "docs/plug-an-optimizer.md"


def jsonl_route():
    return the_block(TASK_DOC, "heldout data freeze --jsonl sums.jsonl")


def sumsq_block():
    return the_block(TASK_DOC, "pip install -e ./sumsq-tasks")


def sums_block():
    return the_block(TASK_DOC, "pip install -e ./sums-tasks")


def plugin_block():
    return the_block(OPT_DOC, "pip install -e ./my-package")

COMMENT_FIGURE = re.compile(r"#.*?(?P<score>\d+\.\d+), (?P<right>\d+) of (?P<n>\d+)")
QUOTED_MINE = re.compile(r"`mine` (?P<score>\d+\.\d+)")


def toml_blocks(doc: str) -> list[str]:
    return [m["code"] for m in FENCE.finditer((ROOT / doc).read_text(encoding="utf-8")) if m["lang"] == "toml"]


def lay_out_packages(root: Path) -> None:
    """The three packages exactly as the docs describe them, under ``root``."""
    entry_helper = the_block(TASK_DOC, "def call(n):").code
    sumsq_init = the_block(TASK_DOC, "class SumOfSquares(Benchmark):").code
    sumsq_toml = toml_blocks(TASK_DOC)[0]
    files = {
        "sumsq-tasks/pyproject.toml": sumsq_toml,
        "sumsq-tasks/sumsq_tasks/entry_helper.py": entry_helper,
        "sumsq-tasks/sumsq_tasks/__init__.py": sumsq_init,
        # "a pyproject.toml like sumsq's (sums for sumsq, and "sums.jsonl" added to its package-data)"
        "sums-tasks/pyproject.toml": sumsq_toml.replace("sumsq", "sums").replace(
            '["manifests/**/*.json"]', '["sums.jsonl", "manifests/**/*.json"]'),
        "sums-tasks/sums_tasks/__init__.py": the_block(TASK_DOC, "register(UserJsonlTask(").code,
        "sums-tasks/sums_tasks/sums.jsonl": route_one_jsonl(),
        "my-package/pyproject.toml": toml_blocks(OPT_DOC)[0],
        "my-package/my_package/__init__.py": "",
        "my-package/my_package/search.py": the_block(OPT_DOC, "def optimize(view, seed):").code,  # my_opt.py
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    readable(root)


def route_one_jsonl() -> str:
    """sums.jsonl as route 1's first line writes it (the line itself runs in test_doc_blocks.py)."""
    return "".join(json.dumps({"id": f"q{k}", "input": f"{k} + {k} = ?", "target": 2 * k}) + "\n"
                   for k in range(1, 21))


def readable(root: Path) -> None:
    """An isolated optimizer's throw-away uid reads the run dirs and the plugin's files. A symbolic
    link is left alone: chmod follows it (a venv's bin/python would take its interpreter's mode)."""
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


def comment_figures(code: str) -> list[tuple[str, int, int]]:
    """(score as quoted, right, n) for each ``heldout eval`` line whose comment quotes its result."""
    return [(m["score"], int(m["right"]), int(m["n"])) for line in code.splitlines()
            if line.startswith("heldout eval") and (m := COMMENT_FIGURE.search(line))]


def assert_quoted(printed: list[dict], code: str) -> None:
    quoted = comment_figures(code)
    assert quoted, "the block's eval lines quote no figure"
    evals = [obj for obj in printed if "score" in obj and "split" in obj]
    assert len(evals) == len(quoted), (evals, quoted)
    for obj, (score, right, n) in zip(evals, quoted):
        decimals = len(score.split(".")[1])
        assert (f"{obj['score']:.{decimals}f}", obj["n"]) == (score, n), f"the doc says {score}, {right} of {n}: {obj}"
        assert round(obj["score"] * obj["n"]) == right


def records(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.rglob("run_record.json"))]


def mine_figure() -> float:
    return float(QUOTED_MINE.search((ROOT / OPT_DOC).read_text(encoding="utf-8"))["score"])


@pytest.fixture(scope="module")
def editable_bin(tmp_path_factory) -> Path:
    """An empty venv: the doc blocks' own ``pip install -e`` lines install into it."""
    root = tmp_path_factory.mktemp("editable")
    root.chmod(0o755)
    return offline_venv(root / "venv")


@pytest.fixture(scope="module")
def regular_bin(tmp_path_factory) -> Path:
    """A venv holding the three packages installed like wheels, their source folders gone."""
    root = tmp_path_factory.mktemp("regular")
    lay_out_packages(root / "src")
    bin_dir = offline_venv(root / "venv")
    packages = [str(root / "src" / name) for name in ("sumsq-tasks", "sums-tasks", "my-package")]

    def sh(*argv: str) -> None:
        done = subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=root / "src", capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{argv}: {done.stderr[-3000:]}"

    # the doc's order: install, freeze the manifests into the package, then build what is shipped
    sh("pip", "install", *[arg for p in packages for arg in ("-e", p)])
    for task in ("sumsq", "sums"):
        sh("heldout", "data", "freeze", "--task", f"{task}/basic", "--profile", "default",
           "--out", f"{task}-tasks/{task}_tasks/manifests")
    sh("pip", "install", "--force-reinstall", *packages)
    shutil.rmtree(root / "src")
    root.chmod(0o755)  # the isolated child reads what it needs under it
    return bin_dir


def test_the_jsonl_route_block_freezes_verifies_and_runs_a_study(tmp_path, data_dir):
    block = jsonl_route()
    with TestServer() as server:
        done = run_shell(block.code, tmp_path, server_url=server.base_url, data_dir=data_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    got = {(r["method"], r["seed"], r["status"]) for r in records(tmp_path / "runs")}
    assert got == {(m, s, "ok") for m in ("seed", "reflective") for s in (0, 1)}, got


def test_the_task_package_installs_editable_freezes_and_scores_as_its_comments_say(tmp_path, editable_bin):
    lay_out_packages(tmp_path)
    block = sumsq_block()
    assert block.code.startswith("pip install -e ./sumsq-tasks\n")
    done = run_shell(block.code, tmp_path, bin_dir=editable_bin)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sumsq/basic" in done.stdout and (tmp_path / "sumsq-tasks/sumsq_tasks/manifests/sumsq/basic.json").is_file()
    assert_quoted(json_objects(done.stdout), block.code)
    assert {(r["method"], r["status"]) for r in records(tmp_path / "runs")} == {("seed", "ok")}


def test_a_packaged_jsonl_file_is_one_user_jsonl_task_found_by_its_entry_point(tmp_path, editable_bin):
    lay_out_packages(tmp_path)
    block = sums_block()
    assert block.code.startswith("pip install -e ./sums-tasks\n")
    with TestServer() as server:
        done = run_shell(block.code, tmp_path, bin_dir=editable_bin, server_url=server.base_url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_quoted(json_objects(done.stdout), block.code)


def test_the_optimizer_package_installed_editable_runs_by_its_entry_point_name(tmp_path, editable_bin, data_dir):
    lay_out_packages(tmp_path)
    block = plugin_block()
    assert block.code.startswith("pip install -e ./my-package")
    with TestServer() as server:
        done = run_shell(block.code, tmp_path, bin_dir=editable_bin, server_url=server.base_url, data_dir=data_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = records(tmp_path / "runs" / "plugin")
    assert (record["method"], record["status"]) == ("my-search", "ok"), record.get("error")
    assert record["experiment"]["optimizer"]["target"] == "my_package.search:optimize"
    assert record["isolation"].startswith("isolated")  # a plugin is user code: isolated unless trusted
    assert round(record["test_score"], 3) == mine_figure()  # "it makes mine's calls and reaches its score"


def test_regular_installs_serve_the_tasks_and_the_optimizer_without_their_source(tmp_path, regular_bin, data_dir):
    tmp_path.chmod(0o755)
    after_freeze = sumsq_block().code.split("\n", 2)[2]  # its study ran in the editable test
    uses = "".join(line + "\n" for line in after_freeze.splitlines() if not line.startswith("heldout run "))
    sumsq = run_shell(uses, tmp_path, bin_dir=regular_bin)
    assert sumsq.returncode == 0, sumsq.stderr[-3000:]
    assert_quoted(json_objects(sumsq.stdout), sumsq_block().code)
    plugin_run = plugin_block().code.split("\n", 1)[1]
    sums_eval = sums_block().code.split("\n", 2)[2]
    with TestServer() as server:
        sums = run_shell(sums_eval, tmp_path, bin_dir=regular_bin, server_url=server.base_url)
        plugin = run_shell(plugin_run, tmp_path, bin_dir=regular_bin, server_url=server.base_url, data_dir=data_dir)
    assert sums.returncode == 0 and plugin.returncode == 0, sums.stderr[-2000:] + plugin.stderr[-2000:]
    assert_quoted(json_objects(sums.stdout), sums_block().code)
    (record,) = records(tmp_path / "runs" / "plugin")
    assert record["status"] == "ok" and round(record["test_score"], 3) == mine_figure(), record.get("error")
    where = subprocess.run([str(regular_bin / "python"), "-c", "import my_package.search, sumsq_tasks, sums_tasks as s\n"
                            "for m in (my_package.search, sumsq_tasks, s): print(m.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path)
    files = where.stdout.splitlines()
    assert len(files) == 3 and all("site-packages" in f for f in files), where  # installed copies, no source folder
