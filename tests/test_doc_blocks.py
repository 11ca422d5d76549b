"""Every shell and ```python block of README.md and docs/*.md runs in a test, or says in the Markdown
why it cannot (docs that cannot rot).

``RUN_BY`` names the test that runs each block; a block marked ``<!-- not-run: reason -->`` on the
line before its fence is a deliberate fragment or a command this suite cannot run (another machine,
a GPU-free compile of minutes, the suite itself). A new block that is neither fails here. How the
blocks run (the loopback model server, the real data, a temporary folder): tests/doc_blocks.py.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

from doc_blocks import DOC_URL, FENCE, ROOT, Block, blocks, run_python, run_shell, the_block
from heldout.models.testserver import TestServer

COMMAND = re.compile(r"^(?:heldout|python|pip|bash|scripts/\w+) ", re.M)
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

PACKAGES = "tests/test_doc_packages.py::"
# (doc, a snippet only that block holds) -> the test that runs the block
RUN_BY = {
    ("README.md", "heldout demo --run-dir"): "tests/test_demo.py::test_demo_runs_the_study_and_writes_a_self_contained_report",
    ("README.md", "heldout tasks list"): "tests/test_doc_blocks.py::test_the_readme_everyday_commands_run_in_order_as_written",
    ("README.md", "heldout split check"): "tests/test_doc_blocks.py::test_the_readme_protocol_commands_plan_and_run_as_written",
    ("docs/write-a-task.md", "heldout data freeze --jsonl sums.jsonl"):
        PACKAGES + "test_the_jsonl_route_block_freezes_verifies_and_runs_a_study",
    ("docs/write-a-task.md", "pip install -e ./sumsq-tasks"):
        PACKAGES + "test_the_task_package_installs_editable_freezes_and_scores_as_its_comments_say",
    ("docs/write-a-task.md", "pip install -e ./sums-tasks"):
        PACKAGES + "test_a_packaged_jsonl_file_is_one_user_jsonl_task_found_by_its_entry_point",
    ("docs/write-a-task.md", "def call(n):"):
        PACKAGES + "test_the_task_package_installs_editable_freezes_and_scores_as_its_comments_say",
    ("docs/write-a-task.md", "class SumOfSquares(Benchmark):"):
        PACKAGES + "test_the_task_package_installs_editable_freezes_and_scores_as_its_comments_say",
    ("docs/write-a-task.md", "register(UserJsonlTask("):
        PACKAGES + "test_a_packaged_jsonl_file_is_one_user_jsonl_task_found_by_its_entry_point",
    ("docs/write-a-task.md", "class Capitals(PromptBenchmark):"):
        "tests/test_doc_blocks.py::test_write_a_task_family_module_imports_registers_and_scores",
    ("docs/plug-an-optimizer.md", "--optimizer mine=my_opt:optimize"):
        "tests/test_doc_figures.py::test_every_score_plug_an_optimizer_quotes_is_what_its_command_gives",
    ("docs/plug-an-optimizer.md", "pip install -e ./my-package"):
        PACKAGES + "test_the_optimizer_package_installed_editable_runs_by_its_entry_point_name",
    ("docs/plug-an-optimizer.md", "--optimizer gepa --optimizer-cmd"):
        "tests/test_doc_figures.py::test_every_score_plug_an_optimizer_quotes_is_what_its_command_gives",
    ("docs/plug-an-optimizer.md", "def optimize(view, seed):"):
        PACKAGES + "test_the_optimizer_package_installed_editable_runs_by_its_entry_point_name",
    ("docs/plug-an-optimizer.md", "session.run(my_opt.optimize)"):
        "tests/test_doc_blocks.py::test_plug_an_optimizer_module_and_session_run_against_the_loopback_model",
}


def every_block() -> list[Block]:
    return [b for doc in DOCS for kind in ("shell", "python") for b in blocks(doc, kind)]


def test_every_block_of_the_docs_is_run_by_a_named_test_or_marked_with_its_reason():
    run_by = {(doc, the_block(doc, snippet).code): test for (doc, snippet), test in RUN_BY.items()}
    assert len(run_by) == len(RUN_BY), "two RUN_BY snippets name one block"
    found = every_block()
    unaccounted = [f"{b.doc} {b.lang} block {b.index}: {b.code[:60]!r}" for b in found
                   if b.not_run is None and (b.doc, b.code) not in run_by]
    assert unaccounted == [], "run each in a test (and name it in RUN_BY) or mark it <!-- not-run: reason -->"
    marked_and_run = [b.code[:60] for b in found if b.not_run is not None and (b.doc, b.code) in run_by]
    assert marked_and_run == [], "a block a test runs needs no not-run marker"
    assert all(b.not_run.strip() for b in found if b.not_run is not None), "a not-run marker needs its reason"


def test_a_command_is_never_in_an_unlabelled_fence():
    # the adversary: a command fenced without a language, which no test would look at
    hidden = [f"{doc}: {m['code'][:60]!r}" for doc in DOCS
              for m in FENCE.finditer((ROOT / doc).read_text(encoding="utf-8"))
              if m["lang"] == "" and COMMAND.search(m["code"])]
    assert hidden == [], "label these ```bash (and run or mark them)"


def test_every_test_run_by_names_exists():
    for test in set(RUN_BY.values()):
        path, name = test.split("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), test


def test_a_block_the_harness_must_run_cannot_hide_behind_another_fence_language(tmp_path):
    # the adversary: a doc writer who fences a command as ```sh or ```console to keep it out of the tests
    doc = tmp_path / "page.md"
    doc.write_text("```sh\nheldout run\n```\n\n<!-- not-run: another machine -->\n```console\nray start\n```\n")
    found = blocks(str(doc), "shell")  # an absolute path: ROOT / doc is doc itself
    assert [(b.lang, b.not_run) for b in found] == [("sh", None), ("console", "another machine")]


def test_write_a_task_family_module_imports_registers_and_scores(tmp_path):
    family = the_block("docs/write-a-task.md", "class Capitals(PromptBenchmark):").code
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
    my_opt = the_block("docs/plug-an-optimizer.md", "def optimize(view, seed):").code
    session = the_block("docs/plug-an-optimizer.md", "session.run(my_opt.optimize)").code
    (tmp_path / "my_opt.py").write_text(my_opt)
    with TestServer() as server:
        assert DOC_URL in session
        out = run_python(session.replace(DOC_URL, server.base_url), tmp_path, tmp_path,
                         HELDOUT_DATA_DIR=str(Path(data_dir).resolve()))
    assert out.returncode == 0, out.stderr
    status, score, verifier = out.stdout.split()[:3]
    assert status == "ok" and 0.0 <= float(score) <= 1.0 and verifier


def test_the_readme_everyday_commands_run_in_order_as_written(tmp_path, data_dir):
    block = the_block("README.md", "heldout tasks list")
    assert block.not_run is None
    done = run_shell(block.code, tmp_path, data_dir=data_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "runs" / "study").rglob("run_record.json")]
    assert sorted((r["method"], r["seed"], r["status"]) for r in records) == \
        [(m, s, "ok") for m in ("local-search", "seed") for s in (0, 1, 2)]
    assert (tmp_path / "runs/study-report/report.html").is_file() and list((tmp_path / "runs/study-parquet").glob("*.parquet"))
    assert "local-search" in done.stdout and "lockpicking/six" in done.stdout  # the query's rows
    (signer,) = (tmp_path / "allowed_signers").read_text().splitlines()
    assert signer.startswith("me ")
    with tarfile.open(tmp_path / "review.tar.gz") as bundle:  # "nothing secret"
        names = bundle.getnames()
    assert names and not [n for n in names if n.endswith((".key", "signing.key", "ledger.key"))]


def test_the_readme_protocol_commands_plan_and_run_as_written(tmp_path, data_dir):
    block = the_block("README.md", "heldout split check")
    assert block.not_run is None
    done = run_shell(block.code, tmp_path, data_dir=data_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "runs" / "cs").rglob("run_record.json")]
    assert sorted((r["method"], r["seed"], r["status"]) for r in records) == [("constant-search", s, "ok") for s in (0, 1)]
    assert done.stdout.count("what it can detect") >= 2  # both plans say what their seeds can separate
    assert not (tmp_path / "runs" / "arms").exists() and not (tmp_path / "runs" / "gen").exists()  # a plan runs nothing


def test_the_study_file_of_studies_and_exports_dry_runs_and_spends_nothing(tmp_path, data_dir):
    (study,) = [m["code"] for m in FENCE.finditer((ROOT / "docs/studies-and-exports.md").read_text(encoding="utf-8"))
                if m["lang"] == "toml"]
    (tmp_path / "study.toml").write_text(study)
    done = run_shell("heldout run study.toml --dry-run\n", tmp_path, data_dir=data_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    # every task of bbh/sepo and gsm_hard x 3 methods x 2 verifiers x 3 seeds: each cell listed, none run
    cells = re.match(r"(\d+) cell\(s\); total budget \d+ metric calls", done.stdout.splitlines()[-1])
    assert cells and int(cells[1]) % 18 == 0, done.stdout[-500:]
    assert all(f" {method} " in done.stdout for method in ("seed", "refl4", "mine"))
    assert not (tmp_path / "runs").exists()
