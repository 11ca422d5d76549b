"""`heldout export inspect`: the written logs read back with the real inspect-ai and carry exactly
the ledger's scores, outputs, answers and dimensions, with the rendered prompt and the target;
a session whose ledger does not verify is not exported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

inspect_log = pytest.importorskip("inspect_ai.log", reason="the [inspect] extra (inspect-ai) is not installed")

from heldout.benchmarks.loading import load_task  # noqa: E402
from heldout.contracts import RunContext  # noqa: E402
from heldout.evaluators.ledger import read_entries  # noqa: E402
from heldout.evaluators.records import RunRecord  # noqa: E402
from heldout.evaluators.session import Session  # noqa: E402
from heldout.models import ModelClient  # noqa: E402
from heldout.models.testserver import TestServer  # noqa: E402
from heldout.optimizers import resolve_optimizer  # noqa: E402
from heldout.reports.inspect_export import export_inspect  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TASK, PROFILE = "bbh/causal_judgement", "sepo"


def _probe_then_seed(view, seed):
    """Pays for three train examples twice (the second time from the session's memo) and keeps the seed."""
    ids = [ex["id"] for ex in view.train[:3]]
    view.evaluate(view.seed_candidate, "train", ids)
    view.evaluate(view.seed_candidate, "train", ids)
    return dict(view.seed_candidate)


@pytest.fixture(scope="module")
def study(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("study")
    with TestServer() as server:
        session = Session(TASK, profile=PROFILE, budget=6, run_dir=root / "bbh__causal_judgement" / "probe" / "seed-0",
                          worker=ModelClient("test-model", base_url=server.base_url), data_dir=str(data_dir),
                          method="probe")
        session.run(_probe_then_seed)
    session = Session("lockpicking/six", budget=2, run_dir=root / "lockpicking__six" / "seed" / "seed-0", method="seed")
    session.run(resolve_optimizer("seed"))
    return root


def _ledger(session_dir: Path, kind: str) -> list[dict]:
    entries, _ = read_entries(session_dir / "ledger.jsonl")
    return [e["data"] for e in entries if e["kind"] == kind]


def test_heldout_logs_read_back_with_the_ledgers_scores(study, data_dir, tmp_path):
    result = export_inspect(study, tmp_path / "logs", with_optimisation=True, data_dir=str(data_dir))
    assert not result.skipped and len(result.written) == 3  # the seed session paid for no evaluation
    prompt_dir = study / "bbh__causal_judgement" / "probe" / "seed-0"
    log = inspect_log.read_eval_log(str(tmp_path / "logs" / "bbh__causal_judgement__probe__seed-0__heldout.eval"))
    scored = {d["example_id"]: d["verdict"] for d in _ledger(prompt_dir, "test_scoring")}
    assert len(scored) == 137 and {s.id for s in log.samples} == set(scored)
    task = load_task(TASK, profile=PROFILE, data_dir=str(data_dir))
    examples = {ex.id: ex for ex in task.split("test")}
    final = _ledger(prompt_dir, "final_candidate")[0]["components"]
    for sample in log.samples:
        verdict = scored[sample.id]
        score = sample.scores["heldout"]
        assert score.value == verdict["score"] and score.metadata["dimensions"] == verdict["dimensions"]
        assert score.answer == (None if verdict["output"]["answer"] is None else str(verdict["output"]["answer"]))
        assert sample.output.completion == verdict["output"]["text"]
        assert sample.target == examples[sample.id].target
        rendered = task.benchmark.render(final, examples[sample.id], RunContext())
        assert [(m.role, m.text) for m in sample.messages] == [(m.role, m.content) for m in rendered] + [
            ("assistant", verdict["output"]["text"])]
    metrics = log.results.scores[0].metrics
    assert metrics["task_metric"].value == pytest.approx(RunRecord.load(prompt_dir).test_score)
    assert log.eval.task == f"heldout/{TASK}" and log.eval.task_args["profile"] == PROFILE and log.status == "success"


def test_optimisation_logs_hold_every_paid_evaluation_with_repeats_as_epochs(study, data_dir, tmp_path):
    export_inspect(study, tmp_path / "logs", with_optimisation=True, data_dir=str(data_dir))
    log = inspect_log.read_eval_log(str(tmp_path / "logs" / "bbh__causal_judgement__probe__seed-0__optimisation.eval"))
    evaluations = _ledger(study / "bbh__causal_judgement" / "probe" / "seed-0", "evaluation")
    assert len(evaluations) == len(log.samples) == 6
    assert sorted(s.epoch for s in log.samples) == [1, 1, 1, 2, 2, 2]
    assert [s.scores["heldout"].value for s in log.samples] == [e["verdict"]["score"] for e in evaluations]
    assert {s.metadata["split"] for s in log.samples} == {"train"}


def test_program_samples_carry_the_candidate_and_the_verdict(study, tmp_path):
    export_inspect(study / "lockpicking__six", tmp_path / "logs")
    log = inspect_log.read_eval_log(str(tmp_path / "logs" / "seed__seed-0__heldout.eval"))
    scored = {d["example_id"]: d["verdict"] for d in _ledger(study / "lockpicking__six" / "seed" / "seed-0", "test_scoring")}
    assert {s.id: s.scores["heldout"].value for s in log.samples} == {i: v["score"] for i, v in scored.items()}
    assert "scorer.sql" in log.samples[0].input[0].text


def test_a_session_whose_ledger_does_not_verify_is_not_exported(study, tmp_path):
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(study / "lockpicking__six"), str(copy)], check=True)
    ledger = copy / "seed" / "seed-0" / "ledger.jsonl"
    lines = ledger.read_text().splitlines()
    at = max(k for k, line in enumerate(lines) if json.loads(line)["kind"] == "test_scoring")
    entry = json.loads(lines[at])
    entry["data"]["verdict"]["score"] = 1.0  # a better held-out score than was earned
    lines[at] = json.dumps(entry)
    ledger.write_text("\n".join(lines) + "\n")
    done = subprocess.run([sys.executable, "-m", "heldout.cli", "export", "inspect", str(copy), "--out",
                           str(tmp_path / "logs")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 1 and "SKIPPED" in done.stderr and "ledger does not verify" in done.stderr
    assert not list((tmp_path / "logs").glob("*.eval"))
