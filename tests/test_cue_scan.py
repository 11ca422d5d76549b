"""The answer-cue scan tries the cue regex only next to an anchor ("answer" in any case, "####"),
and finds exactly the matches the regex finds scanning every position (``_CUE.finditer``).

The shortcut is sound only if every character a cue can hold before its anchor is one the scan
walks back over; that set is checked here against the regex itself on every code point, so a
new cue word with a new letter fails this test, not a reading."""

from __future__ import annotations

import re
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from heldout.benchmarks.extraction import text as extraction_text
from heldout.benchmarks.extraction.text import cue_ends

CUE = extraction_text._CUE


def regex_scan(text: str) -> list[int]:
    """The specification: every position tried, left to right."""
    return [m.end() for m in CUE.finditer(text)]


def anchored_scan(text: str) -> list[int]:
    """The scan next to anchors, however dense they are (it hands dense ones to the plain scan)."""
    extraction_text.forget_texts()
    dense = extraction_text._CHARS_PER_ANCHOR
    extraction_text._CHARS_PER_ANCHOR = 0
    try:
        return cue_ends(text)
    finally:
        extraction_text._CHARS_PER_ANCHOR = dense


FRAGMENTS = [
    "the answer is ", "The Answer: ", "ANSWER", "answer", "answers", "answer=", "my final answer is", "Our best answer",
    "the correct answer =", "theanswer is", "this answer is", "the  \n\t answer is", "the\u2003answer:", "####", "#",
    "> ", "- ", "* ", "_", "`", "**", "\n", ". ", "? ", "!\t", " ", "x", "(B)", "12", "Q: ", "\u0130", "\u0131",
    "\u017f", "be\u017ft answer is", "TH\u0130 answer", "\u212a", "é", "\u00a0", "\u2028", "answering", "answer_",
    "answer9", "answer ** is", "answer is", "answer`=", "ANSWERis", "the answering answer:", "answer\u00e9",
    "fin" * 30, " " * 70, "#" * 70, "the " * 20,
]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join))
def test_the_anchored_scan_finds_exactly_the_cues_the_regex_finds_at_every_position(text):
    assert anchored_scan(text) == regex_scan(text), repr(text)


def test_long_runs_before_an_anchor_and_anchors_that_are_no_cue_give_the_regex_matches():
    texts = [
        " " * 100_000 + "answer: (A)",                        # one long run: searched by the regex
        "the " * 25_000 + "answer is (B)",
        "this answer is not a cue. " * 4_000 + "So the answer is (C).",  # thousands of failing anchors
        "#" * 50_001 + " answer = 4",
        "\n" + "> " * 30_000 + "answer: yes",
    ]
    for text in texts:
        assert anchored_scan(text) == regex_scan(text)


def test_outputs_dense_with_anchors_are_scanned_plainly_with_the_same_cues():
    for text in ["The answer is maybe 7 or " * 4_000 + "The answer is 12", "So the answer is (A). " * 50]:
        extraction_text.forget_texts()
        assert cue_ends(text) == regex_scan(text) == anchored_scan(text)


def test_every_character_a_cue_can_hold_before_its_anchor_is_walked_back_over():
    prefix_char = re.compile(r"(?i)[themyourfinalcorrectrightbest]|[ \t>#*_-]|\s")
    walked = extraction_text._BEFORE_ANCHOR
    missing = [hex(c) for c in range(sys.maxunicode + 1)
               if prefix_char.fullmatch(chr(c)) and chr(c) not in walked and not chr(c).isspace()]
    assert missing == []
    assert not [ch for ch in walked if re.fullmatch("(?i)w", ch)]  # so no run crosses an "answer"


def test_a_match_is_tried_only_where_the_cue_regexs_own_lookahead_lets_it_start():
    lookahead = re.compile(r"(?i)[tmocrfba \t>#*_-]")
    starts = {chr(c) for c in range(sys.maxunicode + 1) if lookahead.fullmatch(chr(c))}
    assert starts == set(extraction_text._CUE_FIRST)
    assert CUE.pattern.startswith(r"(?=[tmocrfba \t>#*_-])")
