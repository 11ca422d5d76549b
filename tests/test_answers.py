"""Answer extraction and scoring: what counts as the model's answer, per format and per mode."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heldout.benchmarks.extraction import (
    BBH_FORMATS,
    BBH_TASK_FORMATS,
    EXTRACTION_MODES,
    bbh_format_of,
    exact_match,
    extract_bbh,
    extract_choice_letter,
    extract_number,
    extract_span,
    normalize_answer,
    normalize_word_list,
    numbers_match,
    score_bbh,
    score_choice,
    score_number,
    score_span,
    token_f1,
    token_scores,
)


def core(result):
    """The strict and flexible scores and readings of a scorer's result."""
    return {k: result[k] for k in ("strict", "flexible", "extracted_strict", "extracted_flexible")}


def both(extract, text, *args):
    return tuple(extract(text, *args, mode) for mode in ("strict", "flexible"))


# --- the modes ----------------------------------------------------------------------------------


def test_the_three_named_modes_are_strict_flexible_published():
    assert EXTRACTION_MODES == ("strict", "flexible", "published")


def test_an_unknown_mode_or_format_is_a_clear_error():
    with pytest.raises(ValueError, match="extraction mode"):
        extract_bbh("So the answer is (A).", "choice", "lenient")
    with pytest.raises(ValueError, match="BBH answer format"):
        extract_bbh("So the answer is (A).", "letters", "strict")


@pytest.mark.parametrize("cue", [
    "So the answer is (B).", "the answer is (B)", "THE ANSWER IS (B)", "The final answer is (B).",
    "Answer: (B)", "**Answer:** (B)", "**Answer**: (B)", "The answer is **(B)**.", "The answer is: (B)",
    "The answer is `(B)`", "The answer is \\boxed{(B)}", "The correct answer is (B) because it fits.",
    "So the answer is:\n\n(B)",
])
def test_strict_accepts_the_answer_cue_in_its_usual_dressings(cue):
    assert extract_bbh("Step 1: (A) looks wrong.\n" + cue, "choice", "strict") == "(B)"


def test_strict_needs_the_cue_and_flexible_takes_the_last_candidate():
    assert both(extract_bbh, "Between (A) and (C), I pick (C)", "choice") == (None, "(C)")


def test_the_last_parsable_cue_wins_when_the_model_corrects_itself():
    text = "So the answer is (B). Wait, recheck step 3. So the answer is (C)."
    assert both(extract_bbh, text, "choice") == ("(C)", "(C)")
    restated = "So the answer is (D).\n\nIn short, the answer is clear."
    assert both(extract_bbh, restated, "choice") == ("(D)", "(D)")


def test_a_few_shot_run_on_after_the_answer_is_ignored():
    text = "So the answer is (B).\n\nQ: Which is next?\nA: Let's think step by step. So the answer is (E)."
    assert both(extract_bbh, text, "choice") == ("(B)", "(B)")


def test_flexible_never_overrides_a_strict_answer():
    text = "So the answer is (B), not (A)."
    assert both(extract_bbh, text, "choice") == ("(B)", "(B)")


@pytest.mark.parametrize("bad", [None, 42, "", "   \n  "])
def test_output_that_is_not_text_or_empty_extracts_nothing_and_scores_zero(bad):
    """(bytes are text: tests/test_scoring_verdicts.py)"""
    assert both(extract_bbh, bad, "choice") == (None, None)
    assert core(score_bbh(bad, "(A)", "choice")) == {
        "strict": 0, "flexible": 0, "extracted_strict": None, "extracted_flexible": None}
    assert score_number(bad, 3.0)["flexible"] == 0
    assert score_choice(bad, "A", 4)["flexible"] == 0
    assert score_span(bad, "Paris")["f1_flexible"] == 0.0


# --- BBH: choice -------------------------------------------------------------------------------


@pytest.mark.parametrize("text, strict, flexible", [
    ("(A) or (B)? Checking the dates... the answer is (B).", "(B)", "(B)"),
    ("Option (A) is tempting, option (C) is wrong. So the answer is (R).", "(R)", "(R)"),
    ("So the answer is B.", None, "(B)"),
    ("So the answer is B) Inc", None, "(B)"),
    ("So the answer is (b).", None, "(B)"),
    ("So the answer is option (D).", "(D)", "(D)"),
    ("The date is 12/14/1937.\n\n(D)", None, "(D)"),
    ("I reason about A and B.\nB", None, "(B)"),
    ("A: Let's think step by step. A typical person would agree.", None, None),
    ("So the answer is (S).", None, None),  # BBH letters stop at (R)
])
def test_bbh_choice(text, strict, flexible):
    assert both(extract_bbh, text, "choice") == (strict, flexible)


def test_bbh_choice_scores_the_letter_against_the_target():
    assert core(score_bbh("So the answer is (C).", "(C)", "choice")) == {
        "strict": 1, "flexible": 1, "extracted_strict": "(C)", "extracted_flexible": "(C)"}
    assert score_bbh("So the answer is C", "(C)", "choice")["strict"] == 0
    assert score_bbh("So the answer is C", "(C)", "choice")["flexible"] == 1
    assert score_bbh("So the answer is (A).", "(C)", "choice")["flexible"] == 0


@pytest.mark.parametrize("target, right, wrong", [
    ("Monsters, Inc", "So the answer is Monsters, Inc.", "So the answer is (A)."),
    ("dearth, wind, & fire", "So the answer is **dearth, wind, & fire**.", "So the answer is (I)."),
    ("rita, sue and bob poo", "The answer is: Rita, Sue and Bob Poo", "So the answer is rita, sue and bob too."),
])
def test_bbh_choice_targets_that_are_not_letters_compare_as_text(target, right, wrong):
    assert score_bbh(right, target, "choice")["strict"] == 1
    assert score_bbh(right, target, "choice")["flexible"] == 1
    assert score_bbh(wrong, target, "choice")["flexible"] == 0
    assert core(score_bbh(f"Thinking...\n{target}", target, "choice")) == {
        "strict": 0, "flexible": 1, "extracted_strict": None, "extracted_flexible": target}


# --- BBH: word answers --------------------------------------------------------------------------


@pytest.mark.parametrize("fmt, text, strict, flexible", [
    ("true_false", "not ( True ) is False. So the answer is False.", "False", "False"),
    ("true_false", "The answer is **TRUE**", "True", "True"),
    ("true_false", "True and False is False; then not False gives true", None, "True"),
    ("yes_no", "So the answer is Yes.", "Yes", "Yes"),
    ("yes_no", "No, he did not. Yes, the detector... So the answer is: no", "No", "No"),
    ("yes_no", "Yesterday nobody came. So the answer is yes", "Yes", "Yes"),
    ("yes_no", "Is this plausible? I would say yes.", None, "Yes"),
    ("yes_no", "The answer is that it is plausible.", None, None),
    ("valid_invalid", "So the answer is invalid.", "invalid", "invalid"),
    ("valid_invalid", "So the answer is valid.", "valid", "valid"),
    ("valid_invalid", "So the answer is not valid.", "invalid", "invalid"),
    ("valid_invalid", "Premise 2 is valid ... the argument is deductively invalid", None, "invalid"),
])
def test_bbh_word_answers(fmt, text, strict, flexible):
    assert both(extract_bbh, text, fmt) == (strict, flexible)


def test_yes_no_compares_without_case_and_reports_the_targets_case():
    lower = score_bbh("So the answer is Yes.", "yes", "yes_no")  # sports_understanding
    assert core(lower) == {"strict": 1, "flexible": 1, "extracted_strict": "yes", "extracted_flexible": "yes"}
    upper = score_bbh("so the answer is no", "No", "yes_no")  # causal_judgement
    assert core(upper) == {"strict": 1, "flexible": 1, "extracted_strict": "No", "extracted_flexible": "No"}
    assert score_bbh("So the answer is no.", "yes", "yes_no")["flexible"] == 0


# --- BBH: word lists ----------------------------------------------------------------------------


def test_word_list_normalisation_keeps_apostrophes_and_ampersands_inside_words():
    assert normalize_word_list("  O'Connell,  it&t;\n 'you've'  R&D. ") == "o'connell it&t you've r&d"
    assert normalize_word_list("['apple', 'banana', 'cherry']") == "apple banana cherry"
    assert normalize_word_list("1. apple\n2. banana\n- cherry") == "apple banana cherry"


@pytest.mark.parametrize("text, strict, flexible", [
    ("So the answer is arson aspect census.", "arson aspect census", "arson aspect census"),
    ("So the answer is: Arson, Aspect, Census", "arson aspect census", "arson aspect census"),
    ("The answer is arson aspect census. These are now in order.", "arson aspect census",
     "arson aspect census"),
    ("The answer is:\n1. arson\n2. aspect\n3. census", "arson aspect census", "arson aspect census"),
    ("Sorted:\n\narson aspect census", None, "arson aspect census"),
    ("Sorted:\n\n1. arson\n2. aspect\n3. census", None, "arson aspect census"),
    ("The answer is **can't o\u2019connor won't**", "can't o'connor won't", "can't o'connor won't"),
])
def test_bbh_word_list(text, strict, flexible):
    assert both(extract_bbh, text, "word_list") == (strict, flexible)


def test_word_list_order_matters():
    assert score_bbh("So the answer is aspect arson census.", "arson aspect census", "word_list")["flexible"] == 0


# --- BBH: integers ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, strict, flexible", [
    ("A - B = -163 - 56 = -219. So the answer is -219.", "-219", "-219"),
    ("So the answer is \u221212.", "-12", "-12"),  # unicode minus
    ("So the answer is 1,234.", "1234", "1234"),
    ("So the answer is 12.0", "12", "12"),
    ("So the answer is **-50**", "-50", "-50"),
    ("1 + 1 + 2 = 4 apples, plus 3 = 7", None, "7"),
    ("So the answer is 7.5", "7.5", "7.5"),  # extracted as written, never equals an integer target
    ("the result is unclear", None, None),
])
def test_bbh_integer(text, strict, flexible):
    assert both(extract_bbh, text, "integer") == (strict, flexible)


def test_integer_targets_compare_as_numbers():
    assert score_bbh("So the answer is −219.", "-219", "integer")["strict"] == 1
    assert score_bbh("So the answer is 219.", "-219", "integer")["flexible"] == 0
    assert score_bbh("So the answer is 7.5", "7", "integer")["flexible"] == 0


def test_absurdly_long_numbers_are_read_without_crashing():
    huge = "9" * 5000
    assert extract_bbh(f"So the answer is -{huge}.", "integer", "strict") == "-" + huge
    assert extract_bbh("So the answer is -0.", "integer", "strict") == "0"
    assert core(score_number(f"So the answer is {huge}.", 3.0)) == {
        "strict": 0, "flexible": 0, "extracted_strict": None, "extracted_flexible": None}
    assert extract_number("The answer is 1e999999.", "flexible") is None


# --- BBH: dyck ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text, strict, flexible", [
    ('So, we need "]", "}", "]". So the answer is ] } ].', "] } ]", "] } ]"),
    ("So the answer is ])>.", "] ) >", "] ) >"),
    ("So the answer is `} ] >`", "} ] >", "} ] >"),
    ("The answer is: ']', ')', ')'", "] ) )", "] ) )"),
    ("We close them with ] ) )", None, "] ) )"),
    ("No closing needed", None, None),
])
def test_bbh_dyck(text, strict, flexible):
    assert both(extract_bbh, text, "dyck") == (strict, flexible)


def test_dyck_target_without_spaces_still_scores():
    assert score_bbh("So the answer is ] ) >.", "])>", "dyck")["strict"] == 1


# --- BBH: formats of tasks -----------------------------------------------------------------------


def test_the_format_table_covers_all_27_bbh_tasks_with_known_formats():
    assert len(BBH_TASK_FORMATS) == 27
    assert set(BBH_TASK_FORMATS.values()) == set(BBH_FORMATS)
    assert bbh_format_of("(A)", "bbh/word_sorting") == "word_list"  # the table beats the target
    assert bbh_format_of("Monsters, Inc", "movie_recommendation") == "choice"


@pytest.mark.parametrize("target, fmt", [
    ("(K)", "choice"), ("True", "true_false"), ("no", "yes_no"), ("invalid", "valid_invalid"),
    ("-12", "integer"), ("] ) >", "dyck"), ("apple banana", "word_list"),
])
def test_unknown_tasks_get_their_format_from_the_target(target, fmt):
    assert bbh_format_of(target, "my_own_task") == fmt


def test_a_format_that_cannot_be_told_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot tell the answer format"):
        bbh_format_of("Monsters, Inc", "my_own_task")


def test_a_target_outside_its_format_is_a_clear_error():
    with pytest.raises(ValueError, match="not an integer"):
        score_bbh("So the answer is 3.", "three", "integer")
    with pytest.raises(ValueError, match="not a yes_no answer"):
        score_bbh("So the answer is yes.", "maybe", "yes_no")


# --- MMLU-Pro -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text, strict, flexible", [
    ("The answer is (B).", "B", "B"),
    ("the answer is B", "B", "B"),
    ("Options (A), (C) are out. Answer: **D**.", "D", "D"),
    ("The answer is (b)", None, "B"),
    ("Eliminating (A) and (C)... (J)", None, "J"),
    ("Eliminating (A)... the answer is (K).", None, "A"),  # K is not among 10 options
    ("Final choice:\nE", None, "E"),
    ("E. is the option I like.\nSo the answer is Bob's.", None, "E"),
    ("A careful reading is needed.", None, None),
])
def test_mmlu_pro_letters(text, strict, flexible):
    assert both(extract_choice_letter, text, 10) == (strict, flexible)


def test_mmlu_pro_letters_beyond_the_option_count_are_not_answers():
    assert both(extract_choice_letter, "The answer is (E).", 4) == (None, None)
    assert both(extract_choice_letter, "The answer is (D).", 4) == ("D", "D")
    with pytest.raises(ValueError, match="1..10 options"):
        extract_choice_letter("The answer is (A).", 11, "strict")


def test_score_choice_takes_bare_or_parenthesised_gold():
    assert core(score_choice("The answer is (C).", "C", 10)) == {
        "strict": 1, "flexible": 1, "extracted_strict": "C", "extracted_flexible": "C"}
    assert score_choice("The answer is (C).", "(C)", 10)["strict"] == 1
    assert score_choice("The answer is (C).", "D", 10)["flexible"] == 0
    with pytest.raises(ValueError, match="not one of the 4 options"):
        score_choice("The answer is (C).", "G", 4)


# --- GSM-Hard -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text, strict, flexible", [
    ("16 - 3 - 4933828 = -4933815 eggs ... So the answer is -9867630.", -9867630.0, -9867630.0),
    ("The answer is 1,234.5", 1234.5, 1234.5),
    ("The answer is $-5.", -5.0, -5.0),
    ("The answer is -$5.", -5.0, -5.0),
    ("The answer is \u20ac1,000,000.", 1e6, 1e6),
    ("The answer is \u00a32.50 per egg", 2.5, 2.5),
    ("The answer is \u22127 degrees", -7.0, -7.0),
    ("The answer is 3/4.", 0.75, 0.75),
    ("The answer is 2 1/2 hours.", 2.5, 2.5),
    ("The answer is 1.5e6.", 1.5e6, 1.5e6),
    ("The answer is 45%.", 45.0, 45.0),
    ("The answer is 12 kg", 12.0, 12.0),
    ("#### 72", 72.0, 72.0),
    ("The final answer is $\\boxed{\\frac{3}{4}}$", 0.75, 0.75),
    ("She has 3 boxes of 12, so 36 eggs in total.", None, 36.0),
    ("The answer is: she earns $18 a day.", None, 18.0),
    ("Total = \\boxed{42}. Check: 40 + 2", None, 42.0),
    ("The answer is .5", 0.5, 0.5),
    ("Version 3.14.15 of x2", None, None),
    ("no numbers at all", None, None),
])
def test_gsm_numbers(text, strict, flexible):
    assert both(extract_number, text) == (strict, flexible)


def test_numbers_match_tolerates_float_noise_but_not_off_by_one():
    assert numbers_match(1806106.8, 1806106.8000000003)
    assert numbers_match(18.0004, 18)
    assert not numbers_match(18.002, 18)
    assert not numbers_match(-9867631, -9867630)  # rel_tol=1e-6 would have accepted this
    assert not numbers_match(109844510401, 109844510400)
    assert numbers_match(9284017268534.4, 9284017268534.4)
    assert not numbers_match(9284017268535.4, 9284017268534.4)
    assert not numbers_match(float("nan"), float("nan"))
    assert not numbers_match(float("inf"), float("inf"))


def test_a_number_written_to_two_places_is_rounded_the_target_in_flexible_mode_only():
    target = 14053029.666666666
    rounded = score_number("So the answer is 14,053,029.67.", target)
    assert (rounded["strict"], rounded["flexible"], rounded["published"], rounded["pal"]) == (0, 1, 0, 0)
    assert rounded["pal_text"] == 0
    assert score_number("So the answer is 14,053,029.66.", target)["flexible"] == 0  # truncated
    assert score_number("So the answer is 14,053,030.", target)["flexible"] == 0  # not a rounding we honour
    assert numbers_match(2.67, 2.6666666, decimals=2)
    assert not numbers_match(2.7, 2.6666666, decimals=1)


def test_score_number_reports_both_modes():
    assert core(score_number("Janet makes 5 ... so -9867630 dollars", -9867630.0)) == {
        "strict": 0, "flexible": 1, "extracted_strict": None, "extracted_flexible": -9867630.0}
    with pytest.raises(ValueError, match="must be a number"):
        score_number("The answer is 3.", "three")
    with pytest.raises(ValueError, match="must be finite"):
        score_number("The answer is 3.", float("nan"))


# --- HotpotQA -----------------------------------------------------------------------------------


def test_squad_normalisation():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("Vivendi S.A.") == "vivendi sa"


def test_exact_match_and_token_overlap():
    assert exact_match("the Bath, Maine", "Bath, Maine") == 1
    assert exact_match(None, "Bath, Maine") == 0
    scores = token_scores("Bath in Maine", "Bath, Maine")  # 2 of 3 predicted tokens are gold
    assert scores.precision == pytest.approx(2 / 3)
    assert scores.recall == pytest.approx(1.0)
    assert scores.f1 == pytest.approx(0.8)
    assert token_f1("Paris", "London") == 0.0


@pytest.mark.parametrize("prediction, gold", [("no", "no way out"), ("yes sir", "yes"), ("noanswer", "no answer")])
def test_yes_no_noanswer_must_match_exactly_for_any_f1(prediction, gold):
    assert token_scores(prediction, gold) == token_scores(None, gold)
    assert token_f1(prediction, gold) == 0.0


def test_yes_no_matching_themselves_score_one():
    assert token_f1("Yes.", "yes") == 1.0


@pytest.mark.parametrize("text, strict, flexible", [
    ("Both were American. So the answer is yes.", "yes", "yes"),
    ("The answer is **Scott Derrickson**.", "Scott Derrickson", "Scott Derrickson"),
    ("Answer: \"Read It and Weep\" (2006)", "\"Read It and Weep\" (2006)", "\"Read It and Weep\" (2006)"),
    ("Reasoning here.\n\nCharles Dickens", None, "Charles Dickens"),
    ("Charles Dickens", None, "Charles Dickens"),
    ("So the answer is the Cold War (1947\u201391).", "the Cold War (1947\u201391)", "the Cold War (1947\u201391)"),
    ("", None, None),
])
def test_hotpot_spans(text, strict, flexible):
    assert both(extract_span, text) == (strict, flexible)


def test_score_span_gives_em_f1_precision_recall_per_mode():
    result = score_span("Thinking.\nThe answer is the city of Bath, Maine.", "Bath, Maine")
    assert result["strict"] == 0 and result["flexible"] == 0
    assert result["extracted_strict"] == "the city of Bath, Maine"
    assert result["recall_strict"] == 1.0
    assert result["precision_strict"] == pytest.approx(2 / 4)  # "city of bath maine"
    assert result["f1_strict"] == pytest.approx(2 / 3)


# --- properties ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_extractors_never_raise_and_flexible_is_never_below_strict(text):
    for fmt in BBH_FORMATS:
        result = score_bbh(text, {"choice": "(A)", "true_false": "True", "yes_no": "Yes",
                                  "valid_invalid": "valid", "word_list": "a b", "integer": "3",
                                  "dyck": "] )"}[fmt], fmt)
        assert result["flexible"] >= result["strict"]
    assert score_choice(text, "A", 10)["flexible"] >= score_choice(text, "A", 10)["strict"]
    assert score_number(text, 3.0)["flexible"] >= score_number(text, 3.0)["strict"]
    extract_span(text, "flexible")


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=-10**12, max_value=10**12), st.sampled_from(
    ["{:,}", "{}", "${:,}", "{:,} kg", "**{}**", "{}.00", "\\boxed{{{}}}"]))
def test_any_integer_written_any_usual_way_reads_back(value, template):
    text = "So the answer is " + template.format(value) + "."
    got = extract_number(text, "flexible")
    assert got is not None and numbers_match(got, value) and not numbers_match(got, value + 1)


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False).filter(lambda x: abs(x) > 1e-3 or x == 0))
def test_any_float_written_in_full_or_rounded_to_cents_reads_back(value):
    for written in (repr(value), f"{value:.17e}"):
        assert score_number(f"So the answer is {written}.", value)["strict"] == 1, written
        assert score_number(f"So the answer is {written}.", value)["published"] == 1, written
        assert score_number(f"Thinking...\nThe answer is {written}", value)["pal_text"] == 1, written  # PAL's form
    assert score_number(f"So the answer is {value:,.2f}.", value)["flexible"] == 1
    assert math.isfinite(extract_number(f"= {value!r}", "flexible"))
