"""MMLU-Pro: a table of tricky outputs with the expected reading in every mode. ``published`` must
equal the official three-stage extractor, re-implemented in :mod:`reference_rules` from its
published regexes (applied directly: quadratic, fine on these short texts) as
``evaluate_from_local.py`` runs them: the script whose prompt ``cot_5shot`` sends, so prompt and
extraction follow one reference (``evaluate_from_api.py`` deletes every ``**`` first; the two
scripts read the constructed outputs below differently, and ``published`` reads as the local one)."""

from __future__ import annotations

import pytest

from heldout.benchmarks.extraction import score_choice
from reference_rules import api_script_mmlu_pro
from reference_rules import official_mmlu_pro as official

OPTIONS = ("mitosis", "meiosis", "osmosis", "diffusion", "photosynthesis",
           "respiration", "fermentation", "transcription", "translation", "replication")


# (text, gold, strict reading, flexible reading, published reading)
CORPUS = [
    ("Let's think step by step. Cells divide. The answer is (A).", "A", "A", "A", "A"),
    ("the answer is (B)", "B", "B", "B", "B"),
    ("The answer is B.", "B", "B", "B", "B"),
    ("The answer is ( C ).", "C", "C", "C", "C"),  # official: stage 3, the last capital letter
    ("The answer is $D$.", "D", "D", "D", "D"),
    ("The answer is **E**.", "E", "E", "E", "E"),
    ("The answer is \\boxed{F}.", "F", "F", "F", "F"),
    ("Answer: G", "G", "G", "G", "G"),
    ("**Answer:** H", "H", "H", "H", "H"),
    ("The final answer is (I)", "I", "I", "I", "I"),
    ("The answer is (j).", "J", None, "J", None),
    ("The answer is option (C).", "C", "C", "C", "C"),
    ("THE ANSWER IS (C).", "C", "C", "C", "C"),
    ("The answer is （Ｃ）.", "C", "C", "C", None),
    # option text maps to its letter
    ("The answer is osmosis.", "C", "C", "C", None),
    ("The answer is Photosynthesis.", "E", "E", "E", None),
    ("The answer is photosynthesis, which makes sugar.", "E", None, "E", None),
    ("The answer is binary fission.", "A", None, None, None),
    # anchored cues
    ("The answer is (A). I hope this answer is helpful.", "A", "A", "A", "A"),
    ("The answer is (A). I am confident the answer is correct.", "A", "A", "A", "A"),
    ("So the answer is (B). Wait, I erred. The answer is (D).", "D", "D", "D", "B"),
    ("An answer is expected. Thinking... Answer: (E)", "E", "E", "E", "E"),
    # hedges and negated cues
    ("The answer is (A) or (B).", "A", None, None, "A"),
    ("The answer is either (C) or (D).", "C", None, None, "D"),
    ("The answer is (A)/(B).", "A", None, None, "A"),
    ("The answer is not (A). It is (B).", "B", None, None, "B"),
    ("The answer is not (A).", "B", None, None, "A"),
    ("The answer is (B), not (A).", "B", "B", "B", "B"),
    # negation shapes (text.py's negated-cue rule): a denial cancels no other affirmed answer
    ("Answer: B. The answer is not C.", "B", "B", "B", "B"),
    ("The answer is (B). The answer is not (C).", "B", "B", "B", "B"),
    ("Answer: (B)\nThe answer is neither (A) nor (C).", "B", "B", "B", "C"),
    ("The answer is meiosis. The answer is not osmosis.", "B", "B", "B", None),
    ("The answer isn't (D). The answer is (B).", "B", "B", "B", "B"),
    ("The answer is not (A) but (B).", "B", "B", "B", "B"),
    ("The answer is (B). No wait, the answer is not (B).", "B", None, None, "B"),  # retracted
    ("The answer is definitely not (A).", "A", None, None, "A"),
    ("Answer: (B). Actually, the answer is none of the above.", "B", None, None, "B"),  # every answer denied
    ("The answer is not osmosis.", "C", None, None, None),
    ("The answer is not only (A) but also (B).", "B", None, None, "B"),  # two answers: a hedge
    ("The answer is (B). The answer is not only correct but also well supported.", "B", "B", "B", "B"),
    # echoes, run-ons, letters beyond the options
    ("(A) mitosis (B) meiosis (C) osmosis (D) diffusion (E) photosynthesis (F) respiration "
     "(G) fermentation (H) transcription (I) translation (J) replication", "J", None, None, "J"),
    ("The answer is (B).\n\nQuestion: What is ATP?\nThe answer is (F).", "B", "B", "B", "B"),
    ("The answer is (B).\nQ: next\nThe answer is (F).", "B", "B", "B", "B"),
    ("The answer is (K).", "A", None, None, None),  # K is no option
    # no cue: flexible looks further, published's stage 3 takes the last capital letter
    ("Eliminating (A) and (C)... (J)", "J", None, "J", "J"),
    ("Final choice:\nE", "E", None, "E", "E"),
    ("I believe B is right.", "B", None, None, "B"),
    ("A careful reading is needed.", "A", None, None, "A"),
    ("no letters here at all", "A", None, None, None),
    ("E. is the option I like.\nSo the answer is Bob's.", "E", None, "E", "B"),  # official stage 1 reads Bob's B
    ("Answer: the one with (D)", "D", None, "D", "D"),
    ("The answer is: D", "D", "D", "D", "D"),
    ("The correct answer is (F) respiration.", "F", "F", "F", "F"),
    ("My answer is (G).", "G", "G", "G", "G"),
    ("Step 1: compute.\nStep 2: compare.\nAnswer: H.", "H", "H", "H", "H"),
    ("The answer is (h)", "H", None, "H", None),
    ("The answer is I)", "I", "I", "I", "I"),
    ("The answer is I.", "I", "I", "I", "I"),
    ("Therefore, (B) is wrong and (C) is right.\nThe answer is (C)", "C", "C", "C", "C"),
    ("The answer is (D)\n\n**Explanation:** (A) and (B) are both wrong.", "D", "D", "D", "D"),
    ("So, the answer is $\\boxed{\\text{(E)}}$", "E", "E", "E", "E"),
    ("Answer: (B) or maybe (C)", "B", None, None, "C"),
    ("", "A", None, None, None),
    # "**" stays (evaluate_from_local.py): stage 2 and stage 1 miss a bold letter, stage 3 reads a stray one
    ("Answer: **B**\nOption A was tempting.", "B", "B", "B", "A"),
    ("The answer is **C**. (D) was close.", "C", "C", "C", "D"),
    ("So answer is *(E)* and not (F)", "E", None, "F", "F"),  # a single "*" stays: stage 1 misses
]


@pytest.mark.parametrize("text, gold, strict, flexible, published", CORPUS)
def test_mmlu_pro_corpus(text, gold, strict, flexible, published):
    result = score_choice(text, gold, len(OPTIONS), options=OPTIONS)
    assert (result["extracted_strict"], result["extracted_flexible"], result["extracted_published"]) == (
        strict, flexible, published)
    assert result["extracted_published"] == official(text)
    for mode, reading in (("strict", strict), ("flexible", flexible), ("published", published)):
        assert result[mode] == int(reading == gold), mode


def test_published_reads_as_the_local_script_where_the_api_script_reads_another_letter():
    # the constructed case: evaluate_from_api.py deletes "**" (stage 2 then reads B), the local
    # script keeps it (stage 2 misses, stage 3 reads the stray A); the prompt is the local
    # script's, so the extraction is too
    text = "Answer: **B**\nOption A was tempting."
    assert (official(text), api_script_mmlu_pro(text)) == ("A", "B")
    result = score_choice(text, "B", len(OPTIONS), options=OPTIONS)
    assert result["extracted_published"] == "A" and result["published"] == 0
    assert result["extracted_strict"] == "B"  # heldout's own modes read the bold answer


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 50
