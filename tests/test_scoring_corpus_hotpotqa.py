"""HotpotQA: a table of tricky outputs with the expected reading in every mode. Scores use the
official normalisation, re-implemented in :mod:`reference_rules` from hotpot_evaluate_v1.py's
description (lower-case, drop punctuation, drop a/an/the, collapse whitespace). The
``published`` (headline) prediction is what strict reads, or the whole output when it has no
answer cue."""

from __future__ import annotations

import pytest

from heldout.benchmarks.extraction import score_span
from reference_rules import official_em as em


# (text, gold, strict reading, flexible reading, published reading)
CORPUS = [
    ("Both paragraphs agree. So the answer is Paris.", "Paris", "Paris", "Paris", "Paris"),
    ("So the answer is Paris", "Paris", "Paris", "Paris", "Paris"),
    ("The answer is **Scott Derrickson**.", "Scott Derrickson", "Scott Derrickson", "Scott Derrickson",
     "Scott Derrickson"),
    ("Answer: \"Read It and Weep\" (2006)", "\"Read It and Weep\" (2006)", "\"Read It and Weep\" (2006)",
     "\"Read It and Weep\" (2006)", "\"Read It and Weep\" (2006)"),
    ("So the answer is yes.", "yes", "yes", "yes", "yes"),
    ("So the answer is no.", "yes", "no", "no", "no"),
    ("So the answer is the Cold War (1947\u201391).", "Cold War (1947\u201391)", "the Cold War (1947\u201391)",
     "the Cold War (1947\u201391)", "the Cold War (1947\u201391)"),
    ("So the answer is Love and Theft.", "Love and Theft", "Love and Theft", "Love and Theft", "Love and Theft"),
    ("So the answer is To SquarePants or Not to SquarePants.", "To SquarePants or Not to SquarePants",
     "To SquarePants or Not to SquarePants", "To SquarePants or Not to SquarePants",
     "To SquarePants or Not to SquarePants"),
    ("So the answer is Japan and Hong Kong.", "Japan and Hong Kong", "Japan and Hong Kong",
     "Japan and Hong Kong", "Japan and Hong Kong"),
    # anchored cues: later talk about "this answer" does not replace the answer
    ("So the answer is Paris. I hope this answer is helpful.", "Paris", "Paris", "Paris", "Paris"),
    ("So the answer is M. Night Shyamalan. He directed it.", "M. Night Shyamalan", "M. Night Shyamalan",
     "M. Night Shyamalan", "M. Night Shyamalan"),
    ("So the answer is St. Louis.", "St. Louis", "St. Louis", "St. Louis", "St. Louis"),
    ("So the answer is Paris.\nI hope this answer is helpful.", "Paris", "Paris", "Paris", "Paris"),
    ("So the answer is Paris.\nI am sure the answer is correct.", "Paris", "Paris", "Paris", "Paris"),
    ("So the answer is Paris.\n\nIn short, the answer is clear.", "Paris", "Paris", "Paris", "Paris"),
    ("So the answer is Paris.\nThis answer is based on paragraph 2.", "Paris", "Paris", "Paris", "Paris"),
    ("An answer is hard. The first film was directed by Ed Wood.\nEd Wood", "Ed Wood", None, "Ed Wood",
     "An answer is hard. The first film was directed by Ed Wood.\nEd Wood"),  # no cue: taken whole
    ("So the answer is London. On reflection, the answer is Paris.", "Paris", "Paris", "Paris", "Paris"),
    # negated cues
    ("So the answer is not Paris.", "Paris", None, None, None),
    ("The answer is not London.\nParis", "Paris", None, None, None),
    ("Answer: Paris. The answer is not Lyon.", "Paris", "Paris", "Paris", "Paris"),
    ("So the answer is Paris. The answer isn't Lyon.", "Paris", "Paris", "Paris", "Paris"),
    ("So the answer is not Lyon. So the answer is Paris.", "Paris", "Paris", "Paris", "Paris"),
    ("So the answer is not Lyon but Paris.", "Paris", "Paris", "Paris", "Paris"),
    ("So the answer is Paris. Wait, the answer is not Paris.", "Paris", None, None, None),  # retracted
    ("The answer is definitely not Lyon.", "Paris", None, None, None),
    ("So the answer is not only Paris but also Lyon.", "Paris", None, None, None),  # two answers: a hedge
    ("So the answer is Paris. The answer is not only right but obvious.", "Paris", "Paris", "Paris", "Paris"),
    # run-ons at the prompt's question marker
    ("So the answer is Paris.\n\nQuestion: Where is the Louvre?\nSo the answer is Lyon.", "Paris", "Paris", "Paris",
     "Paris"),
    ("So the answer is Paris.\nQ: next?\nSo the answer is Lyon.", "Paris", "Paris", "Paris", "Paris"),
    # no cue: the last line
    ("Reasoning here.\n\nCharles Dickens", "Charles Dickens", None, "Charles Dickens",
     "Reasoning here.\n\nCharles Dickens"),
    ("Charles Dickens", "Charles Dickens", None, "Charles Dickens", "Charles Dickens"),
    ("Charles Dickens.", "Charles Dickens", None, "Charles Dickens", "Charles Dickens."),
    ("  the Eiffel Tower  ", "Eiffel Tower", None, "the Eiffel Tower", "the Eiffel Tower"),
    ("", "Paris", None, None, None),
    ("   \n ", "Paris", None, None, None),
    # presentation
    ("The answer is: *Bath, Maine*", "Bath, Maine", "Bath, Maine", "Bath, Maine", "Bath, Maine"),
    ("The answer is `1998`.", "1998", "1998", "1998", "1998"),
    ("The answer is \"The Simpsons\".", "The Simpsons", "The Simpsons", "The Simpsons", "The Simpsons"),
    ("So the answer is Hungarian Rhapsody No. 2.", "Hungarian Rhapsody No. 2", "Hungarian Rhapsody No. 2",
     "Hungarian Rhapsody No. 2", "Hungarian Rhapsody No. 2"),
    ("The answer is 'Gone with the Wind'", "Gone with the Wind", "Gone with the Wind", "Gone with the Wind",
     "Gone with the Wind"),
    ("Final answer: 3,677 seated", "3,677 seated", "3,677 seated", "3,677 seated", "3,677 seated"),
    ("The final answer is Vivendi S.A.", "Vivendi SA", "Vivendi S.A", "Vivendi S.A", "Vivendi S.A"),
    ("The answer is\n\nGreenwich Village", "Greenwich Village", "Greenwich Village", "Greenwich Village",
     "Greenwich Village"),
    ("Answer:\nGreenwich Village", "Greenwich Village", "Greenwich Village", "Greenwich Village",
     "Greenwich Village"),
    ("The answer is YES.", "yes", "YES", "YES", "YES"),
    ("Both were American, so the answer is yes", "yes", "yes", "yes", "yes"),
    ("My answer is Chicago.", "Chicago", "Chicago", "Chicago", "Chicago"),
    ("The correct answer is Chicago.", "Chicago", "Chicago", "Chicago", "Chicago"),
    ("THE ANSWER IS CHICAGO.", "Chicago", "CHICAGO", "CHICAGO", "CHICAGO"),
    ("The answer is Chicago, Illinois.", "Chicago", "Chicago, Illinois", "Chicago, Illinois", "Chicago, Illinois"),
    ("The answer is the city of Bath, Maine.", "Bath, Maine", "the city of Bath, Maine", "the city of Bath, Maine",
     "the city of Bath, Maine"),
    ("So the answer is\u00a0Paris.", "Paris", "Paris", "Paris", "Paris"),
    ("So the answer is Paris\u0000.", "Paris", "Paris", "Paris", "Paris"),
    ("So the answer is Par\ud83dis.", "Paris", "Par\ufffdis", "Par\ufffdis", "Par\ufffdis"),
    ("So the answer is caf\u00e9.", "cafe", "caf\u00e9", "caf\u00e9", "caf\u00e9"),
    ("So the answer is 1,000,000.", "1000000", "1,000,000", "1,000,000", "1,000,000"),
    ("So the answer is an apple.", "apple", "an apple", "an apple", "an apple"),
    ("So the answer is Paris!", "Paris", "Paris!", "Paris!", "Paris!"),
    ("Hmm.\nSo the answer is\n", "Paris", None, "Hmm", None),
    ("The answer is Paris.\nThe answer is London.", "London", "London", "London", "London"),
]


@pytest.mark.parametrize("text, gold, strict, flexible, published", CORPUS)
def test_hotpotqa_corpus(text, gold, strict, flexible, published):
    result = score_span(text, gold)
    assert (result["extracted_strict"], result["extracted_flexible"], result["extracted_published"]) == (
        strict, flexible, published)
    for mode, reading in (("strict", strict), ("flexible", flexible), ("published", published)):
        assert result[mode] == em(reading, gold), mode
    assert result["extracted_published"] == (strict if strict is not None or result["why_strict"] != "no_cue"
                                             else text.strip() or None)


@pytest.mark.parametrize("text", [
    "Both paragraphs name him.\nAnswer: **Scott Derrickson**",
    "Both paragraphs name him. So the answer is\nScott Derrickson",
    "Both paragraphs name him.\nFinal answer: Scott Derrickson",
])
def test_the_three_shapes_the_old_headline_scored_zero_now_score_one(text):
    result = score_span(text, "Scott Derrickson")
    assert (result["strict"], result["published"], result["f1_published"]) == (1, 1, 1.0)


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 50
