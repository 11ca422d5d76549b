"""Long model outputs built to make a direct regex reading slow, with the answer each family's
``published`` rule reads in them, for tests/test_published_extractors.py and
perf/extraction_speed.py.

Each is one long line with the answer at its very end (a reader that stops early reads wrong),
and none holds what the official MMLU-Pro regexes' first two stages look for (``answer is`` and a
letter; ``answer:`` and a letter): stage 2's ``.*`` then backs off from the line's end at every
start, quadratic in the line's length."""

from __future__ import annotations

from typing import NamedTuple

from heldout.benchmarks.extraction import extract_bbh, extract_choice_letter, extract_number, extract_span


class Adversarial(NamedTuple):
    family: str  # bbh, mmlu_pro, gsm_hard, hotpotqa
    text: str
    answer: object  # what the family's published extractor reads


def fill(unit: str, tail: str, length: int) -> str:
    """``unit`` repeated, then ``tail``: exactly ``length`` characters."""
    return (unit * (length // len(unit) + 1))[: length - len(tail)] + tail


def adversarial_outputs(length: int) -> dict[str, Adversarial]:
    return {
        "mmlu_pro: letters on one line": Adversarial("mmlu_pro", fill("A B C D E ", " F", length), "F"),
        "mmlu_pro: cues without letters on one line": Adversarial(
            "mmlu_pro", fill("Answer: (x) then ", " so the final choice is G", length), "G"),
        "mmlu_pro: stars and cues": Adversarial("mmlu_pro", fill("**Answer:** x * ", " **H**", length), "H"),
        "bbh: cues with no answer on one line": Adversarial(
            "bbh", fill("so the answer is unclear, and ", " So the answer is True.", length), "True"),
        "bbh: options then the answer": Adversarial(
            "bbh", fill("(A) (B) (C) ", " So the answer is True.", length), "True"),
        "gsm_hard: numbers and cues on one line": Adversarial(
            "gsm_hard", fill("The answer is maybe 7 or ", " The answer is 12", length), 12.0),
        "hotpotqa: denied cues on one line": Adversarial(
            "hotpotqa", fill("The answer is not Lyon. ", " So the answer is Paris. The answer is not Lyon.", length),
            "Paris"),
    }


def published_reading(family: str, text: str) -> object:
    """What heldout's ``published`` extractor of ``family`` reads in ``text``."""
    if family == "bbh":
        return extract_bbh(text, "choice", "published")  # the BBH rule does not depend on the format
    if family == "mmlu_pro":
        return extract_choice_letter(text, 10, "published")
    if family == "gsm_hard":
        return extract_number(text, "published")
    if family == "hotpotqa":
        return extract_span(text, "published")
    raise ValueError(f"unknown family {family!r}")
