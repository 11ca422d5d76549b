"""BBH: a table of tricky outputs with the expected reading in every mode. ``published`` must equal
the BBH rule, re-implemented in :mod:`reference_rules` independently from its statement (text
after the last "the answer is", stripped, minus one trailing period, equals the target; the
answer starts on the cue's line after a space, as lm-evaluation-harness's bbh_cot_fewshot filter
requires: this re-implementation once accepted an answer on the next line too, the same bug as
heldout's)."""

from __future__ import annotations

import pytest

from heldout.benchmarks.extraction import score_bbh
from reference_rules import bbh_reference

CAPITALS = ("Paris", "London", "Rome", "Berlin")  # options (A)..(D) of the choice rows


# (text, target, format, strict reading, flexible reading, published score)
CORPUS = [
    # -- choice: the BBH form and its dressings
    ("Let's think step by step. Paris is in France. So the answer is (A).", "(A)", "choice", "(A)", "(A)", 1),
    ("So the answer is (A)", "(A)", "choice", "(A)", "(A)", 1),
    ("So the answer is (A).\n", "(A)", "choice", "(A)", "(A)", 1),
    ("So the answer is ( B ).", "(B)", "choice", "(B)", "(B)", 0),
    ("So the answer is $B$.", "(B)", "choice", None, "(B)", 0),
    ("So the answer is $(B)$.", "(B)", "choice", "(B)", "(B)", 0),
    ("So the answer is **(C)**.", "(C)", "choice", "(C)", "(C)", 0),
    ("The answer is (C).", "(C)", "choice", "(C)", "(C)", 0),  # capital T: not the BBH string
    ("So the answer is (c).", "(C)", "choice", None, "(C)", 0),
    ("So the answer is C.", "(C)", "choice", None, "(C)", 0),
    ("So the answer is (C) Rome.", "(C)", "choice", "(C)", "(C)", 0),
    ("So the answer is \\boxed{(D)}.", "(D)", "choice", "(D)", "(D)", 0),
    ("（Ｄ） is it. So the answer is （Ｄ）.", "(D)", "choice", "(D)", "(D)", 0),
    # -- choice: option text maps to its letter
    ("The capital of Italy. So the answer is Rome.", "(C)", "choice", "(C)", "(C)", 0),
    ("So the answer is rome.", "(C)", "choice", "(C)", "(C)", 0),
    ("So the answer is Rome, the eternal city.", "(C)", "choice", None, "(C)", 0),
    ("So the answer is Madrid.", "(C)", "choice", None, None, 0),
    # -- choice: anchored cues
    ("So the answer is (A). I hope this answer is helpful.", "(A)", "choice", "(A)", "(A)", 0),
    ("So the answer is (A). I am sure the answer is correct.", "(A)", "choice", "(A)", "(A)", 0),
    ("So the answer is (A).\n\nIn short, the answer is clear.", "(A)", "choice", "(A)", "(A)", 0),
    ("An answer is needed quickly: (B) fits.", "(B)", "choice", None, "(B)", 0),
    ("So the answer is (B). Wait, step 2 was wrong. So the answer is (C).", "(C)", "choice", "(C)", "(C)", 1),
    ("Answer: (D)", "(D)", "choice", "(D)", "(D)", 0),
    ("**Final answer:** (D)", "(D)", "choice", "(D)", "(D)", 0),
    # -- choice: hedges and negated cues are no answer
    ("So the answer is (A) or (B).", "(A)", "choice", None, None, 0),
    ("So the answer is either (A) or (C).", "(A)", "choice", None, None, 0),
    ("So the answer is (A)/(B).", "(A)", "choice", None, None, 0),
    ("So the answer is (A) and (B).", "(A)", "choice", None, None, 0),
    ("The answer is not (A). It is (B).", "(B)", "choice", None, None, 0),
    ("So the answer is not (A).", "(A)", "choice", None, None, 0),
    ("So the answer is (B), not (A).", "(B)", "choice", "(B)", "(B)", 0),
    # -- negation shapes (text.py's negated-cue rule): a denial cancels no other affirmed answer
    ("Answer: (B). So the answer is not (C).", "(B)", "choice", "(B)", "(B)", 0),
    ("So the answer is (B). I double-checked: the answer is not (C).", "(B)", "choice", "(B)", "(B)", 0),
    ("So the answer is (B). The answer isn't (D).", "(B)", "choice", "(B)", "(B)", 0),
    ("So the answer is (B). The answer is neither (A) nor (C).", "(B)", "choice", "(B)", "(B)", 0),
    ("So the answer is Rome. The answer is not Paris.", "(C)", "choice", "(C)", "(C)", 0),
    ("So the answer is not (A). So the answer is (B).", "(B)", "choice", "(B)", "(B)", 1),
    ("So the answer is not (A) but (B).", "(B)", "choice", "(B)", "(B)", 0),
    ("So the answer is (B). Hmm, no: the answer is not (B).", "(B)", "choice", None, None, 0),  # retracted
    ("So the answer is (B). The answer is neither (A) nor (B).", "(B)", "choice", None, None, 0),
    ("So the answer is definitely not (A).", "(A)", "choice", None, None, 0),
    ("So the answer is not Rome.", "(C)", "choice", None, None, 0),
    ("So the answer is not only (A) but also (B).", "(B)", "choice", None, None, 0),  # two answers: a hedge
    ("So the answer is (B). The answer is not only right but obvious.", "(B)", "choice", "(B)", "(B)", 0),
    ("So the answer is Yes. The answer is not No.", "Yes", "yes_no", "Yes", "Yes", 0),
    ("So the answer is not No. So the answer is Yes.", "Yes", "yes_no", "Yes", "Yes", 1),
    ("So the answer is not yes but no.", "no", "yes_no", "no", "no", 0),
    ("So the answer is Yes. Wait, the answer is not Yes.", "Yes", "yes_no", None, None, 0),
    ("So the answer is True. The answer is not False.", "True", "true_false", "True", "True", 0),
    ("So the answer is not True.", "False", "true_false", None, None, 0),
    ("So the answer is not only True but also False.", "True", "true_false", None, None, 0),
    ("So the answer is valid. So the answer is not invalid.", "valid", "valid_invalid", "valid", "valid", 0),
    ("So the answer is 6. The answer is not 7.", "6", "integer", "6", "6", 0),
    ("So the answer is not 7 but 6.", "6", "integer", "6", "6", 0),
    ("So the answer is 6. No, the answer is not 6.", "6", "integer", None, None, 0),
    ("So the answer is never 7.", "7", "integer", None, None, 0),
    # -- choice: echoes and run-ons
    ("Options:\n(A) Paris\n(B) London\n(C) Rome\n(D) Berlin", "(D)", "choice", None, None, 0),
    ("(A) no. (B) no. (C) no. (D) maybe.", "(D)", "choice", None, None, 0),
    ("Between (A) and (C), I pick (C)", "(C)", "choice", None, "(C)", 0),
    ("So the answer is (B).\n\nQ: Which city is in Spain?\nA: Let's think step by step. So the answer is (D).",
     "(B)", "choice", "(B)", "(B)", 0),
    ("So the answer is (B).\nQuestion: and the next one?\nThe answer is (D).", "(B)", "choice", "(B)", "(B)", 0),
    # -- yes / no (causal_judgement "Yes"; sports_understanding "yes")
    ("So the answer is Yes.", "Yes", "yes_no", "Yes", "Yes", 1),
    ("So the answer is yes.", "Yes", "yes_no", "Yes", "Yes", 0),  # the rule compares case-sensitively
    ("So the answer is yes.", "yes", "yes_no", "yes", "yes", 1),
    ("So the answer is yes or no.", "yes", "yes_no", None, None, 0),
    ("So the answer is not yes.", "no", "yes_no", None, None, 0),
    ("Is it plausible? I would say no.", "No", "yes_no", None, "No", 0),
    ("So the answer is No. I hope this answer is useful.", "No", "yes_no", "No", "No", 0),
    # -- true / false, valid / invalid
    ("not ( True ) is False. So the answer is False.", "False", "true_false", "False", "False", 1),
    ("So the answer is **TRUE**", "True", "true_false", "True", "True", 0),
    ("So the answer is True or False.", "True", "true_false", None, None, 0),
    ("So the answer is invalid.", "invalid", "valid_invalid", "invalid", "invalid", 1),
    ("So the answer is not valid.", "invalid", "valid_invalid", "invalid", "invalid", 0),
    ("So the answer is valid.", "invalid", "valid_invalid", "valid", "valid", 0),
    # -- word lists
    ("So the answer is arson aspect census.", "arson aspect census", "word_list",
     "arson aspect census", "arson aspect census", 1),
    ("So the answer is: 1. arson 2. aspect 3. census", "arson aspect census", "word_list",
     "arson aspect census", "arson aspect census", 0),
    ("So the answer is arson, aspect, census.", "arson aspect census", "word_list",
     "arson aspect census", "arson aspect census", 0),
    ("So the answer is above big broken.", "above big broken", "word_list",
     "above big broken", "above big broken", 1),
    # -- integers
    ("So the answer is -219.", "-219", "integer", "-219", "-219", 1),
    ("So the answer is \u2212219.", "-219", "integer", "-219", "-219", 0),
    ("So the answer is 1 234 567.", "1234567", "integer", "1234567", "1234567", 0),
    ("So the answer is 12 or 13.", "12", "integer", None, None, 0),
    ("So the answer is 7. I am sure this answer is 100% correct.", "7", "integer", "7", "7", 0),
    ("I count 3 apples, 2 pears and 1 plum, so 6.", "6", "integer", None, "6", 0),
    # -- dyck
    ("So the answer is ] ) >.", "] ) >", "dyck", "] ) >", "] ) >", 1),
    ("So the answer is ])>.", "] ) >", "dyck", "] ) >", "] ) >", 0),
    # -- the answer must start on the cue's line (lm-eval's bbh filter): a line break is no answer
    ("So the answer is\n(A).", "(A)", "choice", "(A)", "(A)", 0),
    ("So the answer is \n(A).", "(A)", "choice", "(A)", "(A)", 0),
    ("So the answer is\n\nFalse.", "False", "true_false", "False", "False", 0),
    ("So the answer is False.\n", "False", "true_false", "False", "False", 1),
    ("So the answer is  False.", "False", "true_false", "False", "False", 1),
    ("So the answer is(A).", "(A)", "choice", "(A)", "(A)", 0),
]


@pytest.mark.parametrize("text, target, fmt, strict, flexible, published", CORPUS)
def test_bbh_corpus(text, target, fmt, strict, flexible, published):
    options = CAPITALS if fmt == "choice" else ()
    result = score_bbh(text, target, fmt, options=options)
    assert (result["extracted_strict"], result["extracted_flexible"]) == (strict, flexible)
    assert result["published"] == published == int(bbh_reference(text) == target)
    gold = target.lower() if fmt in ("yes_no", "true_false") else target
    for mode, reading in (("strict", strict), ("flexible", flexible)):
        norm = (reading or "").lower() if fmt in ("yes_no", "true_false") else reading
        assert result[mode] == int(reading is not None and norm == gold), mode


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 50
