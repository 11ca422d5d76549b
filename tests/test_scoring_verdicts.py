"""The one verdict builder of prompt tasks and its validity rule; hostile text never crashes the
scorer or the ledger."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heldout.benchmarks.extraction import HEADLINE_MODE, MAX_OUTPUT_CHARS, sanitize_text, score_bbh
from heldout.benchmarks.prompt_task import Scored, modes_scored, prompt_verdict
from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import Example
from heldout.evaluators.ledger import Ledger, verify_ledger

SNARKS = Example(id="0", input={"question": "Which is sarcastic?\nOptions:\n(A) Yay, rain\n(B) Nice day"},
                 target="(A)", meta={"format": "choice", "options": ["Yay, rain", "Nice day"]})


def bbh_verdict(text):
    return get_benchmark("bbh/snarks").score_text(text, SNARKS)


def test_the_headline_is_the_published_mode_and_every_mode_is_a_dimension():
    assert HEADLINE_MODE == "published"
    v = bbh_verdict("Let's think. So the answer is (A).")
    assert v.valid and v.score == 1.0
    assert v.dimensions == {"strict": 1.0, "flexible": 1.0, "published": 1.0}
    assert v.output["answer"] == "(A)" and v.output["extracted_flexible"] == "(A)"
    loose = bbh_verdict("So the answer is A")
    assert loose.score == 0.0 and loose.dimensions == {"strict": 0.0, "flexible": 1.0, "published": 0.0}
    assert "flexible 1" in loose.feedback


@pytest.mark.parametrize("text, why", [
    ("I cannot decide.", "no answer cue"),
    ("So the answer is (A) or (B).", "more than one answer"),
    ("The answer is not (B). Hmm.", "negated"),
    ("", "empty"),
])
def test_an_output_without_an_answer_is_valid_scores_zero_and_says_why(text, why):
    v = bbh_verdict(text)
    assert v.valid and v.score == 0.0 and v.error is None
    assert why in v.feedback and "'(A)'" in v.feedback


@pytest.mark.parametrize("output", [None, 42, 3.5, ["So the answer is (A)."], {"text": "x"}])
def test_no_text_at_all_is_the_only_invalid_output(output):
    v = bbh_verdict(output)
    assert not v.valid and v.score == 0.0 and v.error_kind == "no_output"


def test_bytes_surrogates_and_control_characters_are_read_as_text():
    assert bbh_verdict(b"So the answer is (A).").score == 1.0
    assert bbh_verdict(b"\xff\xfeSo the answer is (A).").score == 1.0
    lone = json.loads('"\\ud83d So the answer is (A)."')
    v = bbh_verdict(lone)
    assert v.score == 1.0 and "\ufffd" in v.output["text"]
    v.output["text"].encode("utf-8")  # always encodable
    assert bbh_verdict("So the answer is\x07 (A).\x00").score == 1.0
    assert sanitize_text("a\x00b\x07c\td\ne") == "abc\td\ne"


def test_an_output_over_the_length_cap_is_not_read_and_says_so():
    text = "So the answer is (A). " * (MAX_OUTPUT_CHARS // 20)
    v = bbh_verdict(text)
    assert v.valid and v.score == 0.0 and set(v.dimensions.values()) == {0.0}
    assert "over the cap" in v.feedback and v.output["why"] == "too_long"
    assert len(v.output["text"]) == MAX_OUTPUT_CHARS


def test_a_scorer_that_crashes_is_an_invalid_scoring_error_not_an_exception():
    def broken(_text):
        raise ValueError("BBH integer target 'three' is not an integer")
    v = prompt_verdict("x", "So the answer is 3.", broken)
    assert not v.valid and v.error_kind == "scoring_error" and "not an integer" in v.error


def test_partial_credit_and_other_metrics_come_through_modes_scored():
    v = get_benchmark("hotpotqa/distractor").score_text(
        "So the answer is Bath in Maine.", Example(id="h", input={"question": "q", "context": []},
                                                  target={"answer": "Bath, Maine", "supporting_facts": []}))
    assert v.valid and v.score == 0.0 and v.dimensions["f1_published"] == pytest.approx(0.8)
    scored = modes_scored(score_bbh("So the answer is (B).", "(B)", "choice"), "(B)", metric="strict")
    assert isinstance(scored, Scored) and scored.headline == "strict"


def test_the_old_verdict_builders_are_gone():
    import heldout.benchmarks.mbpp_plus.execution as execution
    import heldout.benchmarks.prompt_task as prompt_task

    assert not hasattr(prompt_task, "mode_verdict") and not hasattr(execution.MbppResult, "to_verdict")
    with pytest.raises(ModuleNotFoundError):
        __import__("heldout.benchmarks.answers")


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(alphabet=st.characters(), max_size=80), st.binary(max_size=80)))
def test_any_model_output_scores_and_is_recorded_in_the_ledger(tmp_path_factory, output):
    verdict = bbh_verdict(output)
    run_dir = tmp_path_factory.mktemp("ledger")
    ledger = Ledger.open(run_dir)
    ledger.append_entry("evaluation", {"raw": output, "verdict": verdict.to_dict()})
    ledger.close()
    assert verify_ledger(run_dir).ok


def test_the_ledger_accepts_surrogates_bytes_and_control_characters(tmp_path):
    ledger = Ledger.open(tmp_path)
    entry = ledger.append_entry("evaluation", {"text": json.loads('"\\udc80x"'), "b": b"\xffok", "c": "a\x00\x1b"})
    ledger.close()
    assert entry["data"] == {"text": "\ufffdx", "b": "\ufffdok", "c": "a\x00\x1b"}
    assert verify_ledger(tmp_path).ok
    assert json.loads((tmp_path / "ledger.jsonl").read_text().splitlines()[0])["data"]["c"] == "a\x00\x1b"
