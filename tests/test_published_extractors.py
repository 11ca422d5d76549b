"""The ``published`` extractors equal their reference rules on any output, and stay linear.

MMLU-Pro's official extractor (TIGER-AI-Lab/MMLU-Pro ``evaluate_from_api.py``) is three regexes,
two of them quadratic on a long line. heldout's :func:`reference.mmlu_pro_answer` finds the same
matches in one pass each; here it is compared with those regexes applied directly, on random
outputs built from answer-like fragments (short, so the direct regexes are fast), and run on
100,000-character outputs built to make the direct regexes slow. The time itself is measured in
``perf/extraction_speed.py`` (house rule: no timing assertions in unit tests)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from heldout.benchmarks.extraction import reference, score_choice


def official_mmlu_pro(text: str) -> str | None:
    """The official rule stated directly: delete every ``**``, then the three regexes in order."""
    text = text.replace("**", "")
    for pattern in (r"answer is \(?([A-J])\)?", r".*[aA]nswer:\s*([A-J])"):
        m = re.search(pattern, text)
        if m:
            return m.group(1)
    m = re.search(r"\b[A-J]\b(?!.*\b[A-J]\b)", text, re.DOTALL)
    return m.group(0) if m else None


FRAGMENTS = [
    "answer is ", "answer is", "Answer is ", "the answer is (", "answer:", "Answer:", "ANSWER:", "nswer:",
    "A", "B", "C", "J", "K", "a", "b", "(", ")", " ", "  ", "\n", "\n\n", "\t", "\r\n", "*", "**", "***",
    ".", ",", ":", "x", "é", "_", "1", "Q", "option ", "So ", "Answer: ", "answer: (", "Answer:\n",
    "\u00a0", "AB", "A1", "answer is (A", "answer is A)", "Answer:**", "**Answer:**",
]
outputs = st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)


@settings(max_examples=3000, deadline=None)
@given(outputs)
def test_the_linear_mmlu_pro_extractor_equals_the_official_regexes_on_any_output(text):
    assert reference.mmlu_pro_answer(text) == official_mmlu_pro(text), repr(text)


@settings(max_examples=1000, deadline=None)
@given(st.lists(outputs, min_size=1, max_size=6).map("\n".join))
def test_the_answer_colon_stage_reads_the_last_cue_of_the_first_line_that_has_one(text):
    m = re.search(r".*[aA]nswer:\s*([A-J])", text)
    assert reference.mmlu_pro_answer_colon(text) == (m.group(1) if m else None), repr(text)


def adversarial_outputs(length: int) -> dict[str, str]:
    """Outputs the direct regexes take quadratic time on: one long line of standalone letters
    (stage 3 looks ahead to the end from every letter), of "Answer:" cues without a letter
    (stage 2's ``.*`` backs off from the line's end at every start), and both with the answer at
    the very end."""
    def fill(unit: str, tail: str) -> str:
        return (unit * (length // len(unit) + 1))[: length - len(tail)] + tail
    return {
        "letters on one line": fill("A B C D E ", " F"),
        "cues without letters on one line": fill("Answer: (x) then ", "Answer: G"),
        "stars and cues": fill("**Answer:** x * ", "answer is **H**"),
        "letters on many lines": fill("so B\nor C\n", "\nJ"),
    }


EXPECTED = {"letters on one line": "F", "cues without letters on one line": "G", "stars and cues": "H",
            "letters on many lines": "J"}


def test_adversarial_outputs_give_the_official_answer_when_short_enough_to_check_directly():
    for name, text in adversarial_outputs(3_000).items():
        assert reference.mmlu_pro_answer(text) == official_mmlu_pro(text) == EXPECTED[name], name


def test_a_100k_character_adversarial_output_is_read_to_its_answer():
    for name, text in adversarial_outputs(100_000).items():
        assert len(text) == 100_000
        assert reference.mmlu_pro_answer(text) == EXPECTED[name], name
        assert score_choice(text, EXPECTED[name], 10)["published"] == 1, name
