"""The model-judge verifier, against the loopback test model server.

The task is the synthetic code-words JSONL (``tests/synthetic_code_words.py``) frozen with the
answer format ``judge``: the worker answers right when the instruction states the rule, and the
test model's judge rule gives full marks when the answer states the reference. An answer-key
instruction that makes the worker answer with the judge-breaking marker plays a prompt injection
against the judge: its verdicts must be clear judge errors, never scores."""

from __future__ import annotations

import json

import pytest

from heldout.benchmarks.judge import (DEFAULT_RUBRIC, JUDGE_MARKER, Dimension, JudgeReplyError, Rubric,
                                      RubricError, judged, parse_judgement)
from heldout.benchmarks.loading import load_task
from heldout.data_manifests import MANIFEST_PATH_ENV
from heldout.evaluators.session import Session
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient
from heldout.models.backends import deterministic
from heldout.models.testserver import TestServer
from heldout.reports.collect import collect_runs
from heldout.reports.tables import cost_table
from heldout import cli
from synthetic_code_words import RULE, key_line, rows

DIMENSIONS = {"correctness", "completeness", "clarity"}


def freeze(tmp_path, monkeypatch, name: str, answer_format: str) -> str:
    root = tmp_path / "manifests"
    source = tmp_path / "codes.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows()[:24]))
    monkeypatch.setenv(MANIFEST_PATH_ENV, str(root))
    assert cli.main(["data", "freeze", "--jsonl", str(source), "--task", name, "--answer-format", answer_format,
                     "--profile", "default", "--out", str(root)]) == 0
    return name


@pytest.fixture(scope="module")
def server():
    with TestServer() as srv:
        yield srv


def ledger(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]


def test_the_judge_marker_is_the_one_the_test_model_keys_on():
    assert JUDGE_MARKER == deterministic.JUDGE_MARKER


def test_a_judge_task_scores_every_dimension_with_reasons_through_the_metered_worker(tmp_path, monkeypatch, server):
    task = freeze(tmp_path, monkeypatch, "mine/judged-codes", "judge")
    worker = ModelClient("test-worker", base_url=server.base_url)
    session = Session(task, budget=6, models=SessionModels(worker=worker), run_dir=tmp_path / "run")
    ids = [ex["id"] for ex in session.view.train[:3]]
    right = session.view.evaluate({"instruction": RULE}, "train", ids)
    assert all(r["score"] == 1.0 and set(r["dimensions"]) == DIMENSIONS for r in right)
    assert all("correctness: 5/5 - the answer states the reference answer" in r["feedback"] for r in right)
    echo = session.view.evaluate({"instruction": "Answer briefly."}, "train", ids)
    assert all(r["valid"] and r["score"] < 1.0 and set(r["dimensions"]) == DIMENSIONS for r in echo)
    assert all("does not state the reference answer" in r["feedback"] for r in echo)

    entries = ledger(tmp_path / "run")
    calls = [e["data"] for e in entries if e["kind"] == "worker_call"]
    assert len(calls) == 6 and {c["channel"] for c in calls} == {"worker-optimisation"}  # one judge call each
    tokens = session.service.usage.tokens["worker-optimisation"]
    assert tokens["prompt"] > sum(c["prompt_tokens"] for c in calls)  # the answers' tokens and the judge's
    assert session.view.remaining == 0  # one metric call per example, the judge call inside it


def test_a_separate_judge_model_is_metered_on_its_own_channel(tmp_path, monkeypatch, server):
    task = freeze(tmp_path, monkeypatch, "mine/judged-codes-2", "judge")
    session = Session(task, budget=2, models=SessionModels(worker=ModelClient("test-worker", base_url=server.base_url), judge=ModelClient("test-judge", base_url=server.base_url)), run_dir=tmp_path / "run")
    session.view.evaluate({"instruction": RULE}, "train", [ex["id"] for ex in session.view.train[:2]])
    record = session.run(lambda view, seed: {"instruction": RULE})
    assert record.test_score == 1.0 and set(record.test_verdicts[0]["dimensions"]) == DIMENSIONS
    calls = [e["data"] for e in ledger(tmp_path / "run") if e["kind"] == "worker_call"]
    assert {c["channel"] for c in calls} == {"judge-optimisation", "judge-deployment"}
    assert {"judge-optimisation", "judge-deployment"} <= set(record.usage["tokens"])
    header = next(e["data"] for e in ledger(tmp_path / "run") if e["kind"] == "session_start")
    assert header["judge"]["model"] == "test-judge"
    # the report's cost table counts the judge: in optimisation and deployment, and apart
    cost = cost_table(collect_runs([tmp_path / "run"])).data[0]
    spent = {ch: t["prompt"] + t["completion"] for ch, t in record.usage["tokens"].items()}
    assert cost["judge_tokens"] == spent["judge-optimisation"] + spent["judge-deployment"] > 0
    assert cost["optimisation_tokens"] >= spent["judge-optimisation"] > 0
    assert cost["deployment_tokens"] >= spent["judge-deployment"] > 0


def test_a_malformed_judge_reply_is_a_clear_verdict_error(tmp_path, monkeypatch, server):
    task = freeze(tmp_path, monkeypatch, "mine/judged-codes-3", "judge")
    session = Session(task, budget=4, models=SessionModels(worker=ModelClient("test-worker", base_url=server.base_url)),
                      run_dir=tmp_path / "run")
    train = session.view.train[:4]
    # an answer key that makes the worker answer the first two questions with the judge-breaking text
    injected = [dict(ex, target=deterministic.JUDGE_MALFORMED_TRIGGER) for ex in train[:2]]
    instruction = RULE + "\n" + "\n".join(key_line(ex) for ex in injected)
    results = session.view.evaluate({"instruction": instruction}, "train", [ex["id"] for ex in train])
    broken, fine = results[:2], results[2:]
    for r in broken:
        assert not r["valid"] and r["score"] == 0.0 and r["error_kind"] == "judge_error"
        assert r["error"].startswith("malformed judge reply: judge reply is not one JSON object")
        assert "\n" not in r["error"]
    assert all(r["valid"] and r["score"] == 1.0 for r in fine)  # one bad reply loses nothing else


def test_the_judge_can_be_a_variant_while_held_out_keeps_the_rule(tmp_path, monkeypatch, server):
    task = freeze(tmp_path, monkeypatch, "mine/span-codes", "span")
    seen = []

    def optimizer(view, seed):
        seen.extend(view.evaluate({"instruction": RULE}, "train", [ex["id"] for ex in view.train[:2]]))
        return {"instruction": RULE}

    session = Session(task, budget=2, models=SessionModels(worker=ModelClient("test-worker", base_url=server.base_url)),
                      run_dir=tmp_path / "run", verifier="tests:judge")
    record = session.run(optimizer)
    assert all(set(r["dimensions"]) == DIMENSIONS for r in seen)  # optimised against the judge
    assert record.test_verdicts and all(not set(v["dimensions"]) & DIMENSIONS for v in record.test_verdicts)
    assert record.test_score == 1.0


def test_a_wrapped_task_takes_the_judge_as_canonical_and_offers_its_rule_as_a_variant(tmp_path, monkeypatch,
                                                                                       server):
    name = freeze(tmp_path, monkeypatch, "mine/span-codes-2", "span")
    rubric = Rubric("terse", (Dimension("states_code", "the answer states the code"),), max_points=3)
    task = judged(load_task(name), rubric)
    assert task.benchmark.verifier_options["rule"] == {"scorer": "rule"}
    session = Session(task, budget=1, models=SessionModels(worker=ModelClient("test-worker", base_url=server.base_url)),
                      run_dir=tmp_path / "run", verifier="tests:rule")
    (shown,) = session.view.evaluate({"instruction": RULE}, "train", [session.view.train[0]["id"]])
    assert "states_code" not in shown["dimensions"]  # the variant: the span rule
    record = session.run(lambda view, seed: {"instruction": RULE})
    assert all(v["dimensions"] == {"states_code": 1.0} for v in record.test_verdicts)  # canonical: the judge
    assert "3/3" in record.test_verdicts[0]["feedback"]


GOOD = {"scores": {"correctness": {"score": 5, "reason": "right"}, "completeness": {"score": 3, "reason": "ok"},
                   "clarity": {"score": 0, "reason": "buried"}}}


def test_a_well_formed_reply_parses_in_rubric_order():
    scores = parse_judgement(json.dumps(GOOD), DEFAULT_RUBRIC)
    assert [(s.name, s.points) for s in scores] == [("correctness", 5), ("completeness", 3), ("clarity", 0)]


@pytest.mark.parametrize("reply, problem", [
    ("Sure! " + json.dumps(GOOD), "not one JSON object"),
    ("```json\n" + json.dumps(GOOD) + "\n```", "not one JSON object"),
    (json.dumps([GOOD]), "and nothing else"),
    (json.dumps({**GOOD, "overall": 4}), "and nothing else"),
    (json.dumps({"scores": {k: v for k, v in GOOD["scores"].items() if k != "clarity"}}), "missing ['clarity']"),
    (json.dumps({"scores": {**GOOD["scores"], "style": {"score": 1, "reason": "x"}}}), "unknown ['style']"),
    (json.dumps({"scores": {**GOOD["scores"], "clarity": {"score": 4.5, "reason": "x"}}}), "integer 0..5"),
    (json.dumps({"scores": {**GOOD["scores"], "clarity": {"score": True, "reason": "x"}}}), "integer 0..5"),
    (json.dumps({"scores": {**GOOD["scores"], "clarity": {"score": 6, "reason": "x"}}}), "integer 0..5"),
    (json.dumps({"scores": {**GOOD["scores"], "clarity": {"score": 2, "reason": " "}}}), "non-empty reason"),
    (json.dumps({"scores": {**GOOD["scores"], "clarity": {"score": 2}}}), '"score", "reason"'),
    ('{"scores": {"correctness": {"score": NaN, "reason": "x"}}}', "not one JSON object"),
])
def test_a_malformed_reply_is_refused_with_its_reason(reply, problem):
    with pytest.raises(JudgeReplyError, match=None) as info:
        parse_judgement(reply, DEFAULT_RUBRIC)
    assert problem in str(info.value)


@pytest.mark.parametrize("make, problem", [
    (lambda: Rubric("r", ()), "no dimensions"),
    (lambda: Rubric("r", (Dimension("a b", ""),)), "identifiers"),
    (lambda: Rubric("r", (Dimension("a", ""), Dimension("a", ""))), "repeats"),
    (lambda: Rubric("r", (Dimension("a", "", weight=0),)), "weights"),
    (lambda: Rubric("r", (Dimension("a", ""),), max_points=0), "max_points"),
    (lambda: Rubric.from_dict({"name": "r"}), "a rubric is"),
])
def test_a_bad_rubric_is_refused(make, problem):
    with pytest.raises(RubricError, match=problem):
        make()
