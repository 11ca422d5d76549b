"""The ``published`` extractors equal their reference rules on any output, and stay linear.

Each family's published extractor is compared with its reference rule, stated independently in
:mod:`reference_rules`, on random outputs built from answer-like fragments (short, so the direct
regexes are fast): BBH's rule, MMLU-Pro's official regexes (two of them quadratic on a long line;
heldout's :func:`reference.mmlu_pro_answer` finds the same matches in one pass each), PAL's text
rule for GSM-Hard's ``pal_text`` (and, on outputs in PAL's own form, its headline), and HotpotQA's headline (strict's reading, the whole output when it has no
cue, scored by the official EM and F1). Each is then run on 100,000-character outputs built to
make the direct regexes slow (:mod:`adversarial_outputs`). The time itself is measured in
``perf/extraction_speed.py`` (house rule: no timing assertions in unit tests); here only its
growth is guarded, loosely: from 50,000 to 400,000 characters a linear reader's CPU time grows
about 8x and a quadratic one's 64x, and the guard allows 24x."""

from __future__ import annotations

import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from adversarial_outputs import adversarial_outputs, published_reading
from heldout.benchmarks.extraction import (extract_bbh, extract_number, extract_span, pal_text_reading, reference,
                                           score_bbh, score_choice, score_number, score_span)
from heldout.benchmarks.extraction.text import forget_texts
from reference_rules import bbh_reference, official_em, official_f1, official_mmlu_pro, pal_text_rule


def outputs(fragments: list[str], max_size: int = 16) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(fragments), max_size=max_size).map("".join)


# Whole cues and answers as fragments (fewer draws per output than single characters).
MMLU_FRAGMENTS = [
    "answer is ", "answer is", "Answer is ", "the answer is (", "answer:", "Answer:", "ANSWER:", "nswer:",
    "A", "B", "C", "J", "K", "a", "b", "(", ")", " ", "\n", "\n\n", "\t", "\r\n", "*", "**", "***",
    ".", ":", "x", "é", "1", "Answer: ", "answer: (", "Answer:\n", "\u00a0", "AB", "A1",
    "answer is (A", "answer is A)", "Answer:**", "**Answer:**", "The answer is (C).", "Answer: **D**", " J ",
]
BBH_FRAGMENTS = [
    "the answer is", "the answer is ", "So the answer is ", "The answer is ", "(A)", "(B)", "True", "False",
    "yes", " ", "  ", "\n", "\n\n", ".", "..", "\t", "\r\n", "x", "\u00a0", "é", "Q: ", "So the answer is (A).",
]
PAL_FRAGMENTS = [
    "The answer is ", "The answer is", "the answer is ", "12", "12.0", "12.0004", "12.001", "-3", "1e3", "1_2",
    "inf", "nan", "\u0663", "$", ",", ".", " ", "\n", "\t", "x", "\u00a0", "0x1", "The answer is 12.",
]
SPAN_FRAGMENTS = [
    "So the answer is ", "the answer is ", "Answer:", "Answer: ", "Final answer: ", "not ", "Paris", "paris",
    "the Eiffel Tower", "Eiffel", "yes", "no", "**", "\n", "\n\n", ".", ". ", " ", "Q: ", "Question: ",
    "I hope this answer is helpful", ",", "\"", "noanswer", "So the answer is Paris.",
]


@settings(max_examples=600, deadline=None)
@given(outputs(MMLU_FRAGMENTS, max_size=24))
def test_the_linear_mmlu_pro_extractor_equals_the_official_regexes_on_any_output(text):
    assert reference.mmlu_pro_answer(text) == official_mmlu_pro(text), repr(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(outputs(MMLU_FRAGMENTS, max_size=8), min_size=1, max_size=6).map("\n".join))
def test_the_answer_colon_stage_reads_the_last_cue_of_the_first_line_that_has_one(text):
    m = re.search(r".*[aA]nswer:\s*([A-J])", text)
    assert reference.mmlu_pro_answer_colon(text) == (m.group(1) if m else None), repr(text)


@settings(max_examples=300, deadline=None)
@given(outputs(BBH_FRAGMENTS), st.sampled_from([("(A)", "choice"), ("True", "true_false"), ("yes", "yes_no")]))
def test_the_bbh_published_extractor_equals_the_bbh_rule_on_any_output(text, target_and_format):
    target, fmt = target_and_format
    assert extract_bbh(text, fmt, "published") == bbh_reference(text), repr(text)
    assert score_bbh(text, target, fmt)["published"] == int(bbh_reference(text) == target), repr(text)


@settings(max_examples=400, deadline=None)
@given(outputs(PAL_FRAGMENTS), st.sampled_from([12.0, -3.0, 1000.0, 3.0]))
def test_the_gsm_hard_pal_text_dimension_equals_pals_text_rule_on_any_output(text, target):
    result = score_number(text, target)
    assert (pal_text_reading(text), result["pal_text"]) == pal_text_rule(text, target), repr(text)


REASONING = ["Step 1: 16 - 3 = 13.", " ", "\n", "She sells 13 eggs", " at $2 each", ", 4 * 5 = 20", "."]


@settings(max_examples=400, deadline=None)
@given(outputs(REASONING, max_size=8),
       st.one_of(st.integers(min_value=-10**13, max_value=10**13),
                 st.floats(min_value=-1e13, max_value=1e13, allow_nan=False)),
       st.sampled_from(["", "\n", "."]), st.sampled_from([0.0, 0.0004, 0.001, 1.0]))
def test_on_outputs_in_pals_own_form_the_gsm_hard_headline_is_pals_text_rule(reasoning, value, end, offset):
    # PAL's form: a chain of thought whose last line is "The answer is N", N as Python writes it
    # (a period after an integer only: PAL's float() refuses "2.5.", the headline reads 2.5)
    written = repr(value)
    end = end if end != "." or isinstance(value, int) else ""
    text = f"{reasoning}\nThe answer is {written}{end}"
    target = float(value) + offset
    result = score_number(text, target)
    assert (result["extracted_published"], result["published"]) == pal_text_rule(text, target), repr(text)


@settings(max_examples=300, deadline=None)
@given(outputs(SPAN_FRAGMENTS), st.sampled_from(["Paris", "yes", "the Eiffel Tower"]))
def test_the_hotpotqa_headline_scores_strict_reading_or_the_whole_cueless_output_by_the_official_metric(text, gold):
    result = score_span(text, gold)
    strict = extract_span(text, "strict")
    prediction = strict if strict is not None or result["why_strict"] != "no_cue" else (text.strip() or None)
    assert result["extracted_published"] == prediction, repr(text)
    assert result["published"] == official_em(prediction, gold), repr(text)
    assert result["f1_published"] == official_f1(prediction, gold), repr(text)


def direct_reading(family: str, text: str) -> object:
    """The family's reference rule applied directly (HotpotQA's and GSM-Hard's headlines read what
    strict reads)."""
    if family == "bbh":
        return bbh_reference(text)
    if family == "mmlu_pro":
        return official_mmlu_pro(text)
    return extract_span(text, "strict") if family == "hotpotqa" else extract_number(text, "strict")


def test_adversarial_outputs_give_the_reference_answer_when_short_enough_to_check_directly():
    for name, case in adversarial_outputs(3_000).items():
        assert published_reading(case.family, case.text) == direct_reading(case.family, case.text) == case.answer, name


def cpu_seconds(fn, repeat: int = 5) -> float:
    """The least CPU time of this process over ``repeat`` calls (another process's load adds none),
    each reading its text afresh."""
    best = float("inf")
    for _ in range(repeat):
        forget_texts()
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def test_every_published_extractor_grows_linearly_not_quadratically_with_the_output():
    short, long = adversarial_outputs(50_000), adversarial_outputs(400_000)
    growth = {}
    for name, case in long.items():
        small = short[name]
        growth[name] = cpu_seconds(lambda: published_reading(case.family, case.text)) / max(
            cpu_seconds(lambda: published_reading(small.family, small.text)), 1e-5)
    assert all(g < 24 for g in growth.values()), growth


def test_a_100k_character_adversarial_output_of_every_family_is_read_to_its_answer():
    for name, case in adversarial_outputs(100_000).items():
        assert len(case.text) == 100_000
        assert published_reading(case.family, case.text) == case.answer, name
        if case.family == "mmlu_pro":  # and scored through the family's scorer
            assert score_choice(case.text, case.answer, 10)["published"] == 1, name
