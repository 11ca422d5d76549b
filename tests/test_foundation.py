"""The foundation's promises, end to end: the task's stated metric reaches records and reports,
held-out scoring is canonical whatever verifier the optimizer ran under, Lockpicking's prompt
forms get a metered worker, one optimizer runs unchanged in-process and over HTTP, and tasks come
from outside the repository (an entry-point plugin, a user's JSONL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from heldout.adapters.client import TaskClient
from heldout.benchmarks.registry import get_benchmark
from heldout.benchmarks.verifiers import UnknownVerifier, parse_verifier
from heldout.contracts import (BudgetExceeded, Example, MalformedCandidate, ProgramTask, TaskView, Verdict,
                               VisibilityError, check_candidate)
from heldout.evaluators.session import Budget, Outcome, Session
from heldout.evaluators.scoring import SessionModels
from heldout.evaluators.view_server import ViewServer
from heldout.models import ModelClient
from heldout.models.testserver import TestServer
from heldout.optimizers import lockpicking_search
from plugin_site import pip_installed_site

REPO = Path(__file__).resolve().parents[1]
PACKED_KERNEL = REPO / "heldout" / "benchmarks" / "vliw" / "kernels" / "packed.py"


def command_env(env: dict | None) -> dict[str, str]:
    base = dict(os.environ)
    if base.get("HELDOUT_DATA_DIR"):  # the command may run elsewhere: pass the data dir absolute
        base["HELDOUT_DATA_DIR"] = str((REPO / base["HELDOUT_DATA_DIR"]).resolve())
    return {**base, **(env or {})}


def cli(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``python -m heldout.cli``, started cold (its PYTHONPATH may add a plugin's site)."""
    return subprocess.run([sys.executable, "-m", "heldout.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=command_env(env), timeout=600)


def warm(warm_cli, *args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """The same command through the session's warm_cli (tests/conftest.py), for a plain environment."""
    return warm_cli.run(*args, cwd=cwd, env=command_env(env), timeout=600)


# -- contracts -------------------------------------------------------------------------------------
def test_candidates_are_copied_to_plain_dicts_and_subclasses_are_refused():
    class Sneaky(dict):
        pass

    class SneakyText(str):
        pass

    plain = {"program.py": "x = 1"}
    assert check_candidate(plain) == plain and check_candidate(plain) is not plain
    with pytest.raises(MalformedCandidate):
        check_candidate(Sneaky(plain))
    with pytest.raises(MalformedCandidate):
        check_candidate({"program.py": SneakyText("x = 1")})


def test_an_invalid_verdict_scores_zero():
    with pytest.raises(ValueError):
        Verdict("e", score=1.0, valid=False)
    assert Verdict.failure("e", "boom", "crash").score == 0.0


def test_every_task_meets_its_protocol():
    from heldout.benchmarks.registry import all_tasks
    for bench in all_tasks():
        assert callable(bench.aggregate) and callable(bench.seed_candidate)
        if bench.kind == "program":
            assert isinstance(bench, ProgramTask), bench.name


# -- the VLIW metric in records and reports ------------------------------------------------------------
def test_vliw_records_and_reports_the_task_metric(warm_cli, tmp_path):
    run_root = tmp_path / "study"
    done = warm(warm_cli, "run", "--task", "vliw/takehome", "--optimizer", "seed", "--seeds", "0", "--budget", "1",
                "--run-dir", str(run_root), "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(next(run_root.rglob("run_record.json")).read_text())
    assert record["test_score"] == 1.0  # 147734 / max cycles over the hidden instances, exactly

    session = Session("vliw/takehome", budget=1, run_dir=tmp_path / "packed", method="packed")
    packed = {"perf_takehome.py": PACKED_KERNEL.read_text()}
    record = session.run(lambda view, seed: packed)
    cycles = max(v["dimensions"]["cycles"] for v in record.test_verdicts)
    assert cycles == 1905 and record.test_score == 147734 / 1905

    out = tmp_path / "report"
    done = warm(warm_cli, "report", str(run_root), str(tmp_path / "packed"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    text = (out / "report.md").read_text()
    assert "1.000" in text and f"{147734 / 1905:.3f}"[:5] in text


# -- verifier variants never reach held-out scoring ---------------------------------------------------
def test_a_coarse_variant_is_what_the_optimizer_sees_and_held_out_stays_canonical(tmp_path):
    seen: list[float] = []

    def optimizer(view, seed):
        assert view.verifier == "coarse:3"
        for result in view.evaluate(view.seed_candidate, "train"):
            seen.append(result["score"])
            assert "dimensions" not in result or not result["dimensions"]
        return view.seed_candidate

    session = Session("circle_packing/square26", budget=1, run_dir=tmp_path / "run", verifier="coarse:3")
    record = session.run(optimizer)
    ceiling = get_benchmark("circle_packing/square26").score_ceiling
    assert seen and all(s in (0.0, ceiling / 2, ceiling) for s in seen)
    (held_out,) = record.test_verdicts
    assert held_out["score"] not in (0.0, ceiling / 2, ceiling)  # the raw objective, not a level
    assert held_out["dimensions"]["ratio"] > 0  # the canonical verdict keeps its dimensions
    assert record.verifier == "coarse:3" and "verifier" not in record.extra  # recorded once, as the experiment's
    entries = [json.loads(line) for line in (tmp_path / "run" / "ledger.jsonl").read_text().splitlines()]
    assert all(e["data"]["verifier"] == "decomposed" for e in entries if e["kind"] == "test_scoring")


def test_verifier_specs_are_checked_against_the_task():
    bench = get_benchmark("lockpicking/six")
    assert parse_verifier("tests:per-position", bench.verifier_options).options == {"feedback": "decomposed"}
    assert parse_verifier("scalar+coarse:3").coarse_levels == 3
    with pytest.raises(UnknownVerifier, match="no test set"):
        parse_verifier("tests:base-only", bench.verifier_options)
    with pytest.raises(UnknownVerifier, match="K must be"):
        parse_verifier("coarse:1")


def test_repeated_scoring_costs_one_metric_call_per_scoring(tmp_path):
    session = Session("lockpicking/six", profile="paper", budget=10, run_dir=tmp_path / "run",
                      verifier="repeated:2")
    ids = [ex["id"] for ex in session.view.train[:5]]
    session.view.evaluate(session.view.seed_candidate, "train", ids)
    assert session.view.remaining == 0
    with pytest.raises(BudgetExceeded):
        session.view.evaluate({"scorer.sql": "'1'"}, "train", ids[:1])


# -- Lockpicking prompt forms through a real session ---------------------------------------------------
def test_a_lockpicking_prompt_candidate_calls_the_metered_worker(tmp_path):
    bench = get_benchmark("lockpicking/six")
    with TestServer() as server:
        worker = ModelClient("test-worker", base_url=server.base_url)
        session = Session("lockpicking/six", profile="paper", budget=5, models=SessionModels(worker=worker), run_dir=tmp_path / "run")
        ids = [ex["id"] for ex in session.view.train[:5]]
        results = session.view.evaluate(bench.seed_instruction(), "train", ids)
    assert len(results) == 5 and all(r["error_kind"] != "model_error" for r in results)
    entries = [json.loads(line) for line in (tmp_path / "run" / "ledger.jsonl").read_text().splitlines()]
    assert sum(e["kind"] == "worker_call" for e in entries) == 5
    assert sum(e["kind"] == "evaluation" for e in entries) == 5 and session.view.remaining == 0


# -- one optimizer, two modes -----------------------------------------------------------------------------
def test_a_reference_optimizer_runs_unchanged_in_process_and_over_http(tmp_path):
    in_process = Session("lockpicking/six", profile="paper", budget=60, run_dir=tmp_path / "a", method="ls")
    assert isinstance(in_process.view, TaskView)
    record_a = in_process.run(lockpicking_search.optimize)

    over_http = Session("lockpicking/six", profile="paper", budget=60, run_dir=tmp_path / "b", method="ls")
    with ViewServer(over_http, host="127.0.0.1") as server:
        client = TaskClient(server.token, url=server.url)
        assert isinstance(client, TaskView)
        final = lockpicking_search.optimize(client, 0)
        client.record_event("note", detail="finished")
        with pytest.raises(VisibilityError):
            client.evaluate(final, "test")
    record_b = over_http.finish(Outcome(final))
    assert record_a.final_candidate == record_b.final_candidate
    assert record_a.test_score == record_b.test_score
    events = [json.loads(line) for line in (tmp_path / "b" / "ledger.jsonl").read_text().splitlines()]
    assert {"kind": "note", "data": {"detail": "finished"}}.items() <= next(
        e["data"] for e in events if e["kind"] == "optimizer_event").items()


def test_split_names_must_be_exactly_train_or_val(tmp_path):
    class Train(str):
        pass

    session = Session("lockpicking/six", profile="generalise", budget=5, run_dir=tmp_path / "run")
    with pytest.raises(VisibilityError):
        session.view.evaluate(session.view.seed_candidate, Train("val"), [session.view.val[0]["id"]])
    assert session.view.remaining == 5


# -- tasks from outside the repository ---------------------------------------------------------------------
PLUGIN = '''
"""A task plugin: a program task that scores how many distinct words a text component holds."""
from heldout.benchmarks.base import Benchmark
from heldout.benchmarks.registry import register
from heldout.contracts import Example, Source, Verdict


class DistinctWords(Benchmark):
    name = "wordy/distinct"
    family = "wordy"
    kind = "program"
    metric = "distinct words / target"
    source = Source(embedded=True)
    default_component = "text"

    def load_raw(self, data_dir=None):
        return [Example(id=f"n{k}", input={"n": k}, target=k) for k in range(1, 11)]

    def seed_candidate(self):
        return {"text": "one two"}

    def run(self, candidate, example, context=None):
        words = len(set(candidate.get("text", "").split()))
        return Verdict(example.id, score=min(1.0, words / example.target), feedback=f"{words} words")


TASK = register(DistinctWords())
'''


def test_a_plugin_package_adds_a_task_through_the_entry_point(tmp_path):
    site = pip_installed_site(tmp_path, "wordy-tasks", {"wordy_tasks/__init__.py": textwrap.dedent(PLUGIN)},
                              {"heldout.tasks": {"wordy": "wordy_tasks"}})
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    freeze = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import wordy_tasks
        from heldout.data_manifests import freeze
        from pathlib import Path
        t = wordy_tasks.TASK
        ex = t.load_raw()
        ids = [e.id for e in ex]
        freeze(t.name, t.version, t.source, ex, {{"default": {{"train": ids[:4], "val": ids[4:6], "test": ids[6:]}}}}
               ).save(Path({str(site / "wordy_tasks" / "manifests")!r}))
        """)], capture_output=True, text=True, env={**os.environ, **env}, cwd=tmp_path)
    assert freeze.returncode == 0, freeze.stderr

    listed = cli("tasks", "list", "--json", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "wordy/distinct" in {row["name"] for row in json.loads(listed.stdout)}
    verified = cli("data", "verify", "wordy", env=env, cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    ran = cli("run", "--task", "wordy/distinct", "--optimizer", "seed", "--seeds", "0", "--budget", "4",
              "--run-dir", str(tmp_path / "runs"), "--json", env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    record = json.loads(next((tmp_path / "runs").rglob("run_record.json")).read_text())
    assert record["status"] == "ok" and record["test_score"] == pytest.approx(sum(2 / k for k in range(7, 11)) / 4)


def test_a_user_jsonl_frozen_with_data_freeze_runs(warm_cli, tmp_path):
    rows = [{"id": f"q{k}", "input": f"What is {k} plus {k}?", "target": 2 * k} for k in range(12)]
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifests = tmp_path / "manifests"
    frozen = warm(warm_cli, "data", "freeze", "--task", "mine/sums", "--jsonl", str(data), "--answer-format", "number",
                  "--profile", "default", "--out", str(manifests))
    assert frozen.returncode == 0, frozen.stderr
    env = {"HELDOUT_MANIFEST_PATH": str(manifests)}
    assert warm(warm_cli, "data", "verify", "mine/sums", env=env).returncode == 0
    with TestServer() as server:
        ran = warm(warm_cli, "run", "--task", "mine/sums", "--optimizer", "seed", "--seeds", "0", "--budget", "3",
                   "--worker-model", "test", "--base-url", server.base_url, "--run-dir", str(tmp_path / "runs"),
                   "--json", env=env)
    assert ran.returncode == 0, ran.stderr
    record = json.loads(next((tmp_path / "runs").rglob("run_record.json")).read_text())
    assert record["status"] == "ok" and len(record["test_verdicts"]) > 0
    # tampering with the frozen copy is drift, not a silent reshuffle
    copy = manifests / "mine" / "sums.jsonl"
    copy.write_text(copy.read_text().replace('"target": 4', '"target": 5'))
    assert warm(warm_cli, "data", "verify", "mine/sums", env=env).returncode == 1


def test_each_verifier_variant_changes_one_knob_and_combinations_are_named():
    example = Example(id="e1", input={"q": "?"}, target="x")
    canonical = Verdict(example_id="e1", score=0.62, valid=True, dimensions={"base": 1.0, "plus": 0.24},
                        feedback="base: pass; plus: 6 of 25 fail", output={"answer": "x"})
    # coarse and noisy show their score alone: feedback ("6 of 25 fail"), dimensions and output
    # state or grade the exact score and would undo the knob (tests/test_variant_information.py)
    noisy = parse_verifier("noisy:0.1").show([canonical], example, seed=1, candidate_id="c")
    assert noisy.score != 0.62 and (noisy.dimensions, noisy.output) == ({}, None)
    assert noisy.feedback == f"score {noisy.score:.4g}"
    coarse = parse_verifier("coarse:3").show([canonical], example)
    assert (coarse.score, coarse.dimensions, coarse.feedback, coarse.output) == (0.5, {}, "score 0.5", None)
    scalar = parse_verifier("scalar").show([canonical], example)
    assert (scalar.score, scalar.dimensions, scalar.feedback, scalar.output) == (0.62, {}, "score 0.62", None)
    both = parse_verifier("coarse:3+scalar").show([canonical], example)
    assert (both.score, both.dimensions, both.feedback, both.output) == (0.5, {}, "score 0.5", None)
    noisy_coarse = parse_verifier("noisy:0.1+coarse:3").show([canonical], example, seed=1, candidate_id="c")
    assert noisy_coarse.score in (0.0, 0.5, 1.0) and noisy_coarse.feedback == f"score {noisy_coarse.score:.4g}"
