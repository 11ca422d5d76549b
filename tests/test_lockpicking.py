"""lockpicking/six: the rule engine, the frozen pool, SQL candidates, feedback variants, the
AI_COMPLETE hook and the exhaustive recovery check."""

from __future__ import annotations

from pathlib import Path
import json
import time
from concurrent.futures import ThreadPoolExecutor
from collections import Counter
from functools import lru_cache

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from heldout import load_task
from heldout.models import ModelClient
from heldout.models.backends.deterministic import DeterministicBackend
from heldout.models.server import ChatServer
from heldout.models.workers import FunctionWorker
from heldout.contracts import Example, RunLimits, Verdict, is_infrastructure_failure
from heldout.evaluators.policy import Usage
from heldout.evaluators.scoring import MeteredWorker
from heldout.benchmarks.lockpicking import sql as sqlmod
from heldout.benchmarks.lockpicking.pool import SPEC_VECTORS, decisive, load_pool, masked
from heldout.benchmarks.lockpicking.rebuild import freeze_manifest
from heldout.benchmarks.lockpicking.rules import MALFORMED, SEED_RULES, TRUTH, Edge, RuleSystem, well_formed
from heldout.benchmarks.lockpicking.task import BENCHMARK, LockpickingBenchmark
from heldout.cli import main as cli_main
from heldout.data_manifests import Manifest

# the CoCoEvolve champion (the full rule set as SQL): a test fixture, never shipped in the package
CHAMPION = {"scorer.sql": (Path(__file__).resolve().parent / "fixtures" / "lockpicking_champion.sql").read_text(encoding="utf-8")}

SPEC_TEST_VECTORS = {"729405": 6, "429405": 4, "720105": 3, "729155": 2, "729489": 2, "129402": 3,
                     "789405": 4, "729705": 4, "723705": 3, "769405": 4, "72940": 0, "72940a": 0,
                     "000000": 2, "999999": 2, "147258": 0}


@pytest.fixture(scope="module")
def paper():
    return load_task("lockpicking/six", profile="paper")


def evaluate(bench: LockpickingBenchmark, candidate, examples, worker=None, **options) -> tuple[list[Verdict], dict]:
    context = bench.context(worker=worker, **options)
    verdicts = [bench.run(candidate, ex, context) for ex in examples]
    return verdicts, bench.summarize(candidate, verdicts, context)


def truth_agreement(system: RuleSystem) -> float:
    """Exhaustive agreement of a rule table with the truth, computed with numpy (independent of
    DuckDB): every table gives 0 on malformed strings, as the truth does."""
    same = int((system.labels_all() == truth_labels()).sum()) + len(MALFORMED)
    return same / (10**6 + len(MALFORMED))


# -- the rule engine --------------------------------------------------------------------------------
@pytest.mark.parametrize("program,label", sorted(SPEC_TEST_VECTORS.items()))
def test_spec_test_vectors(program, label):
    assert TRUTH.label(program) == label


def test_truth_has_twelve_rules_and_the_spec_per_target_killers():
    assert len(TRUTH.edges) == 24
    assert TRUTH.killers == {
        1: [(2, 8), (3, 3), (5, 5), (6, 2)], 2: [(1, 4), (3, 3), (4, 7), (5, 8)],
        3: [(1, 1), (2, 8), (4, 7), (6, 2)], 4: [(2, 6), (3, 0), (5, 5), (6, 9)],
        5: [(1, 1), (2, 6), (4, 1), (6, 9)], 6: [(1, 4), (3, 0), (4, 1), (5, 8)]}


def test_malformed_strings_are_label_zero_including_unicode_digits_and_whitespace():
    assert all(TRUTH.label(s) == 0 for s in MALFORMED)
    assert not well_formed("７２９４０５") and not well_formed("729405\n") and well_formed("729405")


@lru_cache(maxsize=None)
def truth_labels() -> np.ndarray:
    return TRUTH.labels_all()


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=10**6 - 1))
def test_vectorised_labels_agree_with_the_per_string_engine(k):
    assert truth_labels()[k] == TRUTH.label(f"{k:06d}")


# -- the frozen pool and manifest -------------------------------------------------------------------
def test_manifest_profiles(paper):
    manifest = Manifest.load("lockpicking/six")
    assert manifest.source["embedded"] is True
    assert "train = test by design" in manifest.notes["paper"]
    assert manifest.profile("default") == manifest.profile("paper")
    assert paper.sizes() == {"train": 50, "test": 50}
    assert [e.id for e in paper.split("train")] == [e.id for e in paper.split("test")]
    gen = manifest.profile("generalise")
    assert set(gen["train"]) == set(manifest.profile("paper")["train"])
    assert not (set(gen["train"]) & set(gen["test"]) or set(gen["train"]) & set(gen["val"])
                or set(gen["val"]) & set(gen["test"]))
    assert len(gen["test"]) == 300


def test_manifest_is_reproducible_from_the_stored_pool():
    rebuilt = freeze_manifest()
    saved = Manifest.load("lockpicking/six")
    assert rebuilt.hashes == saved.hashes and rebuilt.profiles == saved.profiles


def test_a_tampered_label_is_detected_by_the_manifest():
    examples = BENCHMARK.load_raw(None)
    bad = examples[3]
    examples[3] = Example(bad.id, bad.input, bad.target + 1, meta=bad.meta)
    report = Manifest.load("lockpicking/six").verify(examples)
    assert not report.clean and report.changed == {bad.id: ["target"]}


def test_the_paper_fifty_exercise_the_rule_system(paper):
    programs = [e.input["program"] for e in paper.split("test")]
    assert set(SPEC_VECTORS) <= set(programs)
    assert set(Counter(TRUTH.label(p) for p in programs)) == set(range(7))
    formed = [p for p in programs if well_formed(p)]
    assert len(formed) < len(programs)  # some malformed strings
    # every true edge decides some label (so every edge is identifiable from the 50) ...
    assert set().union(*(decisive(TRUTH, p) for p in formed)) == set(TRUTH.edges)
    # ... and is also seen masked by a base-invalid target
    assert set().union(*(masked(TRUTH, p) for p in formed)) == set(TRUTH.edges)
    assert sum(len(TRUTH.fired(p)) >= 3 for p in formed) >= 12
    for edge in TRUTH.edges:  # hence dropping any true edge changes a label on the 50
        weaker = TRUTH.with_edges(remove=(edge,))
        assert any(weaker.label(p) != TRUTH.label(p) for p in programs), edge


def test_targets_are_the_truth_labels(paper):
    assert all(e.target == TRUTH.label(e.input["program"]) for e in paper.examples)
    assert load_pool()["paper"][:2] == ["729405", "429405"]


# -- SQL candidates -----------------------------------------------------------------------------------
def test_champion_scores_fifty_of_fifty_and_recovers_the_rules_exhaustively(paper):
    verdicts, summary = evaluate(BENCHMARK, CHAMPION, paper.split("test"))
    assert summary["correct"] == 50 and summary["n"] == 50 and summary["score"] == 1.0
    assert summary["exhaustive_accuracy"] == 1.0 and summary["exhaustive_n"] == 10**6 + len(MALFORMED)
    assert summary["error"] is None and all(v.valid for v in verdicts)


def test_seed_is_the_paper_seed_and_scores_below_fifty(paper):
    seed = BENCHMARK.seed_candidate()
    assert set(seed) == {"scorer.sql"}
    verdicts, summary = evaluate(BENCHMARK, seed, paper.split("test"))
    expected = sum(SEED_RULES.label(e.input["program"]) == e.target for e in paper.split("test"))
    assert summary["correct"] == expected < 50
    assert summary["exhaustive_accuracy"] == pytest.approx(truth_agreement(SEED_RULES), abs=1e-12)
    assert "P1 = 4 -> invalidate P2, P6" in BENCHMARK.seed_instruction()["instruction"]


def find_surrogate(programs: list[str]) -> RuleSystem:
    """A rule table with one extra edge that agrees with the truth on ``programs`` but not
    everywhere: found by search over every edge the truth lacks."""
    for trigger in range(1, 7):
        for digit in range(10):
            for target in range(1, 7):
                edge = Edge(trigger, digit, target)
                if target == trigger or edge in TRUTH.edges:
                    continue
                candidate = TRUTH.with_edges(add=(edge,))
                if all(candidate.label(p) == TRUTH.label(p) for p in programs):
                    return candidate
    raise AssertionError("no one-edge surrogate fits the 50")


def test_a_surrogate_that_fits_the_fifty_is_caught_by_the_exhaustive_check(paper):
    surrogate = find_surrogate([e.input["program"] for e in paper.split("test")])
    candidate = {"scorer.sql": sqlmod.rule_table_sql(surrogate)}
    _, summary = evaluate(BENCHMARK, candidate, paper.split("test"))
    assert summary["correct"] == 50
    assert summary["exhaustive_accuracy"] < 1.0
    assert summary["exhaustive_accuracy"] == pytest.approx(truth_agreement(surrogate), abs=1e-12)


@pytest.fixture
def batches(monkeypatch) -> list[int]:
    """The size of every SQL batch run from here on (the real execution, counted)."""
    calls: list[int] = []
    real = sqlmod.execute
    monkeypatch.setattr(sqlmod, "execute", lambda *a, **k: calls.append(len(a[1])) or real(*a, **k))
    return calls


def test_a_deterministic_sql_batch_runs_once_for_all_examples(paper, batches):
    bench = LockpickingBenchmark()
    candidate = {"scorer.sql": "IFF(SUBSTR(PROGRAM, 1, 1) = '7', 1, 0)"}
    verdicts, _ = evaluate(bench, candidate, paper.split("test"))
    assert batches == [400]  # the whole pool, once
    assert [v.output for v in verdicts] == [int(e.input["program"][:1] == "7") for e in paper.split("test")]
    bench.run(candidate, Example("new", {"program": "700000"}, 1))  # an unknown string: one more batch
    assert len(batches) == 2


def test_examples_scored_at_once_on_many_threads_share_one_batch(paper, batches):
    # a session scores an evaluation's examples concurrently: each computing the pool's batch at
    # once multiplied the work eightfold, and under a wall-clock limit failed some on a loaded machine
    bench = LockpickingBenchmark()
    candidate = {"scorer.sql": "IFF(SUBSTR(PROGRAM, 2, 1) = '2', 1, 0)"}
    examples = paper.split("test")[:16]
    with ThreadPoolExecutor(8) as pool:
        verdicts = list(pool.map(lambda e: bench.run(candidate, e), examples))
    assert batches == [400]
    assert [v.output for v in verdicts] == [int(e.input["program"][1:2] == "2") for e in examples]


@pytest.mark.parametrize("body,program,expected", [
    ("IFF(REGEXP_LIKE(PROGRAM, '[0-9]{6}'), 1, 0)", "7294051", 0),  # Snowflake REGEXP_LIKE matches the whole string
    ("IFF(REGEXP_LIKE(PROGRAM, '[0-9]{6}'), 1, 0)", "729405", 1),
    ("LENGTH(PROGRAM) + POSITION('9' IN PROGRAM)", "729405", 9),
    ("DECODE(SUBSTR(PROGRAM, 1, 1), '7', 5, 0)", "729405", 5),
    ("TRY_TO_NUMBER(RIGHT(PROGRAM, 2)) - 3", "729405", 2),
    ("COALESCE(NULLIF(PROGRAM, ''), 'x') || ''", "", None),  # the string 'x': not an integer
    ("' 3 '", "729405", 3),
    ("IFF(STARTSWITH(PROGRAM, '72') AND CONTAINS(PROGRAM, '94'), 6, 0)", "729405", 6),
    ("REGEXP_COUNT(PROGRAM, '[147]')", "147258", 3),
    ("CASE WHEN PROGRAM BETWEEN '1' AND '5' THEN 1 ELSE 2 END", "729405", 2),
])
def test_accepted_snowflake_expressions_run_in_duckdb(body, program, expected):
    run = sqlmod.execute(sqlmod.check_sql(body), [program], limits=RunLimits(cpu_seconds=10, memory_mb=256))
    assert run.parsed == [expected]


def test_invalid_output_scores_zero_with_the_output_named():
    example = Example("e", {"program": "729405"}, 6)
    verdict = BENCHMARK.run({"scorer.sql": "'six'"}, example)
    assert verdict.score == 0 and verdict.error_kind == "bad_output" and "'six'" in verdict.error
    verdict = BENCHMARK.run({"scorer.sql": "NULLIF(1, 1)"}, example)
    assert verdict.error_kind == "bad_output" and "NULL" in verdict.error
    verdict = BENCHMARK.run({"scorer.sql": "2.5"}, example)
    assert verdict.error_kind == "bad_output"


def test_execution_failure_scores_zero_for_every_example_with_the_diagnostic(paper):
    verdicts, summary = evaluate(BENCHMARK, {"scorer.sql": "CAST(PROGRAM AS INTEGER)"}, paper.split("test"))
    assert all(v.score == 0 and v.error_kind == "crash" for v in verdicts)
    assert "Conversion Error" in verdicts[0].error or "convert" in verdicts[0].error.lower()
    assert summary["score"] == 0 and summary["error"] and summary["exhaustive_accuracy"] is None


def test_malformed_sql_and_malformed_candidates_score_zero():
    example = Example("e", {"program": "729405"}, 6)
    verdict = BENCHMARK.run({"scorer.sql": "CASE WHEN PROGRAM = '1' THEN"}, example)
    assert verdict.score == 0 and verdict.error_kind == "malformed_candidate" and "parse" in verdict.error
    verdict = BENCHMARK.run({"notes.txt": "hello"}, example)
    assert verdict.error_kind == "malformed_candidate" and "scorer.sql" in verdict.error


# -- feedback variants ------------------------------------------------------------------------------
def test_counts_feedback_shows_only_predicted_and_expected():
    example = Example("e", {"program": "429405"}, 4)
    verdict = BENCHMARK.run(BENCHMARK.seed_candidate(), example)
    assert verdict.feedback == "PROGRAM '429405': predicted 4, expected 4"
    verdict = BENCHMARK.run({"scorer.sql": "6"}, example)
    assert verdict.score == 0 and verdict.feedback == "PROGRAM '429405': predicted 6, expected 4"
    assert "valid" not in verdict.feedback and "exhaustive" not in verdict.feedback


def test_decomposed_feedback_reveals_per_position_validity():
    verdict = BENCHMARK.run({"scorer.sql": "6"}, Example("e", {"program": "429405"}, 4), BENCHMARK.context(feedback="decomposed"))
    assert verdict.feedback.endswith("P1=valid P2=invalid P3=valid P4=valid P5=valid P6=invalid")
    with pytest.raises(ValueError, match="feedback"):
        BENCHMARK.run({"scorer.sql": "6"}, Example("e", {"program": "1"}, 0), BENCHMARK.context(feedback="everything"))


# -- the worker hook: AI_COMPLETE and prompt candidates ---------------------------------------------
def oracle_worker(prompts: list[str]):
    """A local stand-in for the worker model: reads the string after the last 'PROGRAM: ' and
    answers with its true label."""
    def complete(prompt: str) -> str:
        prompts.append(prompt)
        return f"The count is {TRUTH.label(prompt.rsplit('PROGRAM: ', 1)[1].split(chr(10))[0])}"
    return FunctionWorker(complete)


AI_SQL = "TRY_TO_NUMBER(REGEXP_SUBSTR(AI_COMPLETE('worker', CONCAT('Count the valid positions. PROGRAM: ', PROGRAM)), '[0-9]+$'))"


def test_ai_complete_without_a_worker_is_a_clear_error():
    verdict = LockpickingBenchmark().run({"scorer.sql": AI_SQL}, Example("e", {"program": "729405"}, 6))
    assert verdict.score == 0 and verdict.error_kind == "model_error"
    assert "no worker model is configured" in verdict.error


def test_ai_complete_calls_the_registered_worker_once_per_example(paper):
    bench, prompts = LockpickingBenchmark(), []
    examples = paper.split("test")[:10]
    verdicts, summary = evaluate(bench, {"scorer.sql": AI_SQL}, examples, worker=oracle_worker(prompts))
    assert summary["correct"] == 10
    assert len(prompts) == 10 and prompts[0] == f"Count the valid positions. PROGRAM: {examples[0].input['program']}"
    assert summary["exhaustive_accuracy"] is None  # not deterministic: never checked exhaustively


def test_a_failing_worker_fails_only_its_example_and_never_as_the_candidates_output():
    # the endpoint failed, not the candidate: an infrastructure failure (the session retries the
    # example, and ends the cell incomplete if it still fails), never a 0 for the candidate
    def flaky(prompt: str) -> str:
        if "429405" in prompt:
            raise TimeoutError("worker timed out")
        return "3"
    sql = "AI_COMPLETE('worker', CONCAT('PROGRAM: ', PROGRAM))"
    bad = BENCHMARK.run({"scorer.sql": sql}, Example("a", {"program": "429405"}, 4), BENCHMARK.context(worker=FunctionWorker(flaky)))
    good = BENCHMARK.run({"scorer.sql": sql}, Example("b", {"program": "720105"}, 3), BENCHMARK.context(worker=FunctionWorker(flaky)))
    assert is_infrastructure_failure(bad) and bad.error_kind == "model_error"
    assert "AI_COMPLETE failed" in bad.error and "TimeoutError: worker timed out" in bad.error
    assert good.score == 1.0
    prompt = BENCHMARK.run({"instruction": "Count."}, Example("a", {"program": "429405"}, 4),
                           BENCHMARK.context(worker=FunctionWorker(flaky)))
    assert is_infrastructure_failure(prompt) and prompt.error_kind == "model_error"


def test_an_endpoint_that_refuses_the_candidates_prompt_is_the_candidates_failure(tmp_path):
    # a 400 (a prompt the endpoint will not take) is what the candidate asked for: it scores 0
    with ChatServer(DeterministicBackend(), max_body_bytes=2000) as srv:  # larger bodies: 413
        client = ModelClient("test-model", srv.base_url, max_retries=0)
        context = BENCHMARK.context(worker=MeteredWorker(client, Usage(), "worker-optimisation", None, 0.0, None))
        long_sql = "AI_COMPLETE('worker', CONCAT('" + "x" * 5000 + "', PROGRAM))"
        verdict = BENCHMARK.run({"scorer.sql": long_sql}, Example("a", {"program": "429405"}, 4), context)
        client.close()
    assert verdict.error_kind == "bad_output" and not is_infrastructure_failure(verdict)
    assert "AI_COMPLETE failed" in verdict.error and "413" in verdict.error


def test_prompt_candidates_go_to_the_worker(paper):
    example = paper.split("test")[1]
    missing = LockpickingBenchmark().run(BENCHMARK.seed_instruction(), example)
    assert missing.error_kind == "model_error" and "worker" in missing.error
    prompts: list[str] = []
    verdict = BENCHMARK.run(BENCHMARK.seed_instruction(), example, BENCHMARK.context(worker=oracle_worker(prompts)))
    assert verdict.score == 1.0 and "P1 in {1, 4, 7}" in prompts[0]
    # no integer in the answer: a valid verdict (the worker answered) that scores 0
    no_answer = BENCHMARK.run(BENCHMARK.seed_instruction(), example, BENCHMARK.context(worker=FunctionWorker(lambda p: "no idea")))
    assert no_answer.valid and no_answer.score == 0.0 and "no integer" in no_answer.feedback


# -- the CLI ----------------------------------------------------------------------------------------
def test_cli_eval_prints_the_summary(tmp_path, capsys):
    path = tmp_path / "surrogate.sql"
    path.write_text(CHAMPION["scorer.sql"])
    assert cli_main(["eval", "--task", "lockpicking/six", "--candidate", str(path), "--profile", "paper",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {k: out[k] for k in ("task", "score", "correct", "n", "exhaustive_accuracy", "error")} == {
        "task": "lockpicking/six", "score": 1.0, "correct": 50, "n": 50, "exhaustive_accuracy": 1.0, "error": None}
    path.write_text("(SELECT COUNT(*) FROM examples)")
    assert cli_main(["eval", "--task", "lockpicking/six", "--candidate", str(path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["score"] == 0 and "not allowed" in out["error"] and out["exhaustive_accuracy"] is None


def test_a_slow_worker_is_not_the_candidates_timeout_but_the_querys_own_time_still_is():
    # the query's limit counts its own time only: eight answers of 0.3 s each (2.4 s in all) under
    # a 1 s limit are the endpoint's time, and the candidate is scored
    def slow(prompt: str) -> str:
        time.sleep(0.3)
        return "3"
    limits = BENCHMARK.default_limits.replace(wall_seconds=1.0)
    programs = [ex.input["program"] for ex in BENCHMARK.load_raw(None)[:8]]
    run = sqlmod.execute(sqlmod.check_sql("AI_COMPLETE('worker', CONCAT('PROGRAM: ', PROGRAM))"), programs,
                         limits=limits, ai_complete=slow)
    assert run.parsed == [3] * 8 and run.seconds > 2.4
    # control: the same limit stops a query that computes for longer than it, waits or not
    waits = sqlmod.WaitClock()
    con = duckdb.connect()
    with pytest.raises(sqlmod.SqlExecutionError, match="own time") as stopped:
        sqlmod.run_query(con, "SELECT count(*) FROM range(1000000000) a, range(1000000000) b", 1.0, waits=waits)
    assert stopped.value.kind == "timeout"
