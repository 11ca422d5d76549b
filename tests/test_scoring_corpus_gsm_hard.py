"""GSM-Hard: a table of tricky outputs with the expected reading in every mode, judged by hand.
``published`` (the headline) is PAL's comparison ``abs(answer - target) < 1e-3`` of the number the
final answer cue introduces (strict's reading); ``pal`` is the same comparison of the flexible
reading; ``pal_text`` is PAL's text rule (reasoning-machines/pal ``scripts/gsm_zero_shot.py``),
re-implemented in :mod:`reference_rules` from its statement: the stripped output after its last
"The answer is " (case-sensitive, with the space), stripped, equals the target's string or floats
to within 1e-3 of it. On outputs in PAL's own form (a chain of thought ending "The answer is N",
as PAL's chain-of-thought prompts end) the headline and PAL's text rule give the same verdict."""

from __future__ import annotations

import pytest

from heldout.benchmarks.extraction import score_number
from reference_rules import pal_text_rule


def pal(answer: float | None, target: float) -> int:
    return int(answer is not None and abs(answer - target) < 1e-3)


BIG = 9284017268534.4  # the largest GSM-Hard target

# (text, target, strict reading, flexible reading, strict score, flexible score)
CORPUS = [
    ("16 - 3 - 4933828 = -4933815 eggs ... So the answer is -9867630.", -9867630.0, -9867630.0, -9867630.0, 1, 1),
    ("The answer is 1,234.5", 1234.5, 1234.5, 1234.5, 1, 1),
    ("The answer is 1 234 567.", 1234567.0, 1234567.0, 1234567.0, 1, 1),
    ("The answer is 1 234.", 1234.0, 1234.0, 1234.0, 1, 1),
    ("The answer is $-5.", -5.0, -5.0, -5.0, 1, 1),
    ("The answer is -$5.", -5.0, -5.0, -5.0, 1, 1),
    ("The answer is \u20ac1,000,000.", 1e6, 1e6, 1e6, 1, 1),
    ("The answer is \u22127 degrees", -7.0, -7.0, -7.0, 1, 1),
    ("The answer is 3/4.", 0.75, 0.75, 0.75, 1, 1),
    ("The answer is \u00bd.", 0.5, 0.5, 0.5, 1, 1),
    ("The answer is 2\u00bd hours.", 2.5, 2.5, 2.5, 1, 1),
    ("The answer is 2 1/2 hours.", 2.5, 2.5, 2.5, 1, 1),
    ("The answer is 1.5e6.", 1.5e6, 1.5e6, 1.5e6, 1, 1),
    ("The answer is 45%.", 45.0, 45.0, 45.0, 1, 1),
    ("#### 72", 72.0, 72.0, 72.0, 1, 1),
    ("The final answer is $\\boxed{\\frac{3}{4}}$", 0.75, 0.75, 0.75, 1, 1),
    ("The answer is $18$.", 18.0, 18.0, 18.0, 1, 1),
    ("The answer is .5", 0.5, 0.5, 0.5, 1, 1),
    ("The answer is **42**.", 42.0, 42.0, 42.0, 1, 1),
    ("Answer: 42", 42.0, 42.0, 42.0, 1, 1),
    # tolerance: PAL's absolute 1e-3; heldout adds a few ulps of relative slack
    ("The answer is 18.0004.", 18.0, 18.0004, 18.0004, 1, 1),
    ("The answer is 18.002.", 18.0, 18.002, 18.002, 0, 0),
    ("The answer is 1806106.8000000003.", 1806106.8, 1806106.8000000003, 1806106.8000000003, 1, 1),
    (f"The answer is {BIG!r}.", BIG, BIG, BIG, 1, 1),
    ("The answer is 9284017268534.", BIG, 9284017268534.0, 9284017268534.0, 0, 0),
    ("The answer is 9284017268535.4.", BIG, 9284017268535.4, 9284017268535.4, 0, 0),
    ("The answer is -9867631.", -9867630.0, -9867631.0, -9867631.0, 0, 0),
    # rounding to the written precision: flexible only
    ("The answer is 14,053,029.67.", 14053029.666666666, 14053029.67, 14053029.67, 0, 1),
    ("The answer is 14,053,029.66.", 14053029.666666666, 14053029.66, 14053029.66, 0, 0),
    ("The answer is 2.67.", 2.6666666666666665, 2.67, 2.67, 0, 1),
    ("The answer is 2.667.", 2.6666666666666665, 2.667, 2.667, 1, 1),
    ("The answer is 2.7.", 2.6666666666666665, 2.7, 2.7, 0, 0),
    # anchored cues
    ("The answer is 36. I am sure this answer is 100% correct.", 36.0, 36.0, 36.0, 1, 1),
    ("The answer is 36. I hope the answer is helpful.", 36.0, 36.0, 36.0, 1, 1),
    ("The answer is 36. Checking: 6 * 6 = 36, so the answer is right.", 36.0, 36.0, 36.0, 1, 1),
    ("An answer is 5 pages long. She reads 12 pages.", 12.0, None, 12.0, 0, 1),
    ("The answer is 10. Wait, I forgot the tax. The answer is 12.", 12.0, 12.0, 12.0, 1, 1),
    # hedges and negated cues
    ("The answer is 12 or 13.", 12.0, None, None, 0, 0),
    ("The answer is either 12 or 13.", 13.0, None, None, 0, 0),
    ("The answer is not 12. It is 13.", 13.0, None, None, 0, 0),
    ("The answer is not 12.", 12.0, None, None, 0, 0),
    # negation shapes (text.py's negated-cue rule): a denial cancels no other affirmed answer
    ("The answer is 12. The answer is not 13.", 12.0, 12.0, 12.0, 1, 1),
    ("#### 12\nThe answer is not 13.", 12.0, 12.0, 12.0, 1, 1),
    ("The answer is 12, and the answer is never 13.", 12.0, 12.0, 12.0, 1, 1),
    ("The answer is not 13. The answer is 12.", 12.0, 12.0, 12.0, 1, 1),
    ("The answer is not 13 but 12.", 12.0, 12.0, 12.0, 1, 1),
    ("The answer is 12. No, the answer is not 12.", 12.0, None, None, 0, 0),  # retracted
    ("The answer is 12. No, the answer is not 12.0.", 12.0, None, None, 0, 0),  # the same number
    ("The answer is definitely not 13.", 13.0, None, None, 0, 0),
    ("The answer is not only 12 but also 13.", 12.0, None, None, 0, 0),  # two answers: a hedge
    # run-ons
    ("The answer is 8.\n\nQ: Tom has 3 apples...\nA: The answer is 3.", 8.0, 8.0, 8.0, 1, 1),
    ("The answer is 8.\nQuestion: Next one?\nThe answer is 3.", 8.0, 8.0, 8.0, 1, 1),
    # no cue
    ("She has 3 boxes of 12, so 36 eggs in total.", 36.0, None, 36.0, 0, 1),
    ("The answer is: she earns $18 a day.", 18.0, None, 18.0, 0, 1),
    ("Total = \\boxed{42}. Check: 40 + 2", 42.0, None, 42.0, 0, 1),
    ("Version 3.14.15 of x2", 3.0, None, None, 0, 0),
    ("no numbers at all", 0.0, None, None, 0, 0),
    ("", 0.0, None, None, 0, 0),
    ("The answer is 1e999999.", 1.0, None, None, 0, 0),
    ("The answer is 0.", 0.0, 0.0, 0.0, 1, 1),
    ("The answer is -0.5.", -0.5, -0.5, -0.5, 1, 1),
    # where PAL's text rule ("The answer is " exactly, then what Python's float() accepts) differs
    ("Step 1 ... Step 3.\nThe answer is -9867630.0", -9867630.0, -9867630.0, -9867630.0, 1, 1),
    ("So the answer is 72", 72.0, 72.0, 72.0, 1, 1),  # PAL: no "The answer is ": the whole output
    ("The answer is 72.", 72.0, 72.0, 72.0, 1, 1),  # float("72.") is 72.0
    ("The answer is 72.0.", 72.0, 72.0, 72.0, 1, 1),  # float("72.0.") fails: PAL reads nothing
    ("The answer is  1_000 ", 1000.0, 1.0, 1.0, 0, 0),  # float("1_000") is 1000.0
]

# Outputs in PAL's own form: a chain of thought whose last line is "The answer is N" (optionally
# a period after an integer), N written as Python writes numbers. (text, target)
PAL_FORM = [
    ("Step 1 ... Step 3.\nThe answer is -9867630.0", -9867630.0),
    ("There are 15 trees. 21 - 15 = 6. The answer is 6.", 6.0),
    ("5 + 6 = 11. The answer is 11.", 12.0),
    ("Janet sells 16 - 3 - 4933828 = -4933815 eggs. -4933815 * 2 = -9867630.\nThe answer is -9867630", -9867630.0),
    ("The answer is 18.0004", 18.0),
    ("The answer is 18.001", 18.0),  # not strictly within 1e-3
    ("The answer is 2.6666666666666665", 2.6666666666666665),
    ("The answer is 2.67", 2.6666666666666665),
    (f"The answer is {BIG!r}", BIG),
    ("The answer is 9284017268534", BIG),
    ("The answer is -0.5\n", -0.5),
    ("The answer is 1806106.8000000003", 1806106.8),
]


@pytest.mark.parametrize("text, target, strict, flexible, strict_score, flexible_score", CORPUS)
def test_gsm_hard_corpus(text, target, strict, flexible, strict_score, flexible_score):
    result = score_number(text, target)
    assert (result["extracted_strict"], result["extracted_flexible"]) == (strict, flexible)
    assert (result["strict"], result["flexible"]) == (strict_score, flexible_score)
    assert (result["extracted_published"], result["published"]) == (strict, pal(strict, target))
    assert result["pal"] == pal(flexible, target)
    assert result["pal_text"] == pal_text_rule(text, target)[1]


def human_judged(corpus):
    """The rows with an answer cue whose verdict is not in doubt: strict reads a number and the
    strict and flexible verdicts (judged by hand in the table) agree."""
    return [(row[0], row[1], row[4]) for row in corpus
            if row[4] == row[5] and row[2] is not None and "answer is" in row[0].lower()]


def test_the_headline_agrees_with_every_human_verdict_and_pals_text_rule_with_few():
    judged = human_judged(CORPUS)
    assert len(judged) == 46
    assert sum(score_number(text, target)["published"] == right for text, target, right in judged) == 46
    assert sum(score_number(text, target)["pal_text"] == right for text, target, right in judged) == 12


@pytest.mark.parametrize("text, target", PAL_FORM)
def test_on_outputs_in_pals_own_form_the_headline_is_pals_text_rule(text, target):
    assert pal_text_rule(text, target)[0] is not None  # the rule reads a number: PAL's form
    result = score_number(text, target)
    assert (result["extracted_published"], result["published"]) == pal_text_rule(text, target)
    assert result["pal_text"] == result["published"]


def test_a_lower_case_cue_or_a_comma_is_read_by_the_headline_and_not_by_pals_text_rule():
    for text in ("So the answer is -9867630.", "The answer is -9,867,630.", "the answer is -9867630",
                 "The answer is $-9867630.", "The answer is -9867630.0."):
        result = score_number(text, -9867630.0)
        assert (result["published"], result["pal_text"]) == (1, 0), text


def test_pal_text_rule_reads_only_the_last_the_answer_is_and_what_float_accepts():
    assert score_number("The answer is 10. Wait, I forgot the tax. The answer is 12", 12.0)["pal_text"] == 1
    assert score_number("The answer is 12.\nQ: next\nThe answer is 3.", 12.0)["pal_text"] == 0
    assert score_number("The answer is $18", 18.0)["pal_text"] == 0
    assert score_number("The answer is 18.0004", 18.0)["pal_text"] == 1
    assert score_number("The answer is 18.001", 18.0)["pal_text"] == 0  # strictly less than 1e-3


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 50
