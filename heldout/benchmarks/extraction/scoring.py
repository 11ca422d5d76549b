"""Per-family scorers: every mode (``strict``, ``flexible``, ``published``) read and scored.

Each ``score_*`` returns a plain dict ``{"<mode>": 0/1 ..., "extracted_<mode>": answer or None,
"why_<mode>": why there is no answer (or None)}`` plus family extras (HotpotQA token F1 /
precision / recall per mode, GSM-Hard's ``pal``). Text is sanitised first (:func:`sanitize_text`);
bad *output* never raises (no text scores 0 with ``why`` ``no_output``), bad *arguments* (an
unknown format or mode, a target outside its format) raise ``ValueError`` with a clear message."""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from heldout.benchmarks.extraction import reference
from heldout.benchmarks.extraction.formats import (
    FORMATS,
    LETTERS,
    WORDS,
    Number,
    canonical_integer,
    normalize_word_list,
    number_grammar,
    options_grammar,
    span_grammar,
)
from heldout.benchmarks.extraction.pipeline import EXTRACTION_MODES, Grammar, Reading, check_mode, read, read_modes
from heldout.benchmarks.extraction.text import QUESTION_MARKERS, sanitize_text


def _read(text: Any, grammar: Grammar, mode: str, markers: tuple[str, ...] = QUESTION_MARKERS) -> Reading:
    return read(sanitize_text(text), grammar, mode, markers)


def _strict_and_flexible(clean: str | None, grammar: Grammar) -> dict[str, Reading]:
    """Both stage modes of sanitised text (prepared once: one fold, run-on cut and final cue)."""
    return read_modes(clean, grammar, ("strict", "flexible"))


def _result(readings: dict[str, Reading], correct: Callable[[Any], bool]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in EXTRACTION_MODES:
        got = readings[mode]
        out[mode] = int(got.answer is not None and bool(correct(got.answer)))
    for mode in EXTRACTION_MODES:
        out[f"extracted_{mode}"] = readings[mode].answer
        out[f"why_{mode}"] = readings[mode].why
    return out


def _published(answer: Any) -> Reading:
    return Reading(answer, None if answer is not None else "no_cue")


# ---------------------------------------------------------------------------------------------
# BBH
# ---------------------------------------------------------------------------------------------

BBH_FORMATS: tuple[str, ...] = ("choice", "true_false", "yes_no", "valid_invalid", "word_list", "integer", "dyck")

BBH_TASK_FORMATS: dict[str, str] = {
    "boolean_expressions": "true_false", "causal_judgement": "yes_no", "date_understanding": "choice",
    "disambiguation_qa": "choice", "dyck_languages": "dyck", "formal_fallacies": "valid_invalid",
    "geometric_shapes": "choice", "hyperbaton": "choice", "logical_deduction_five_objects": "choice",
    "logical_deduction_seven_objects": "choice", "logical_deduction_three_objects": "choice",
    "movie_recommendation": "choice", "multistep_arithmetic_two": "integer", "navigate": "yes_no",
    "object_counting": "integer", "penguins_in_a_table": "choice", "reasoning_about_colored_objects": "choice",
    "ruin_names": "choice", "salient_translation_error_detection": "choice", "snarks": "choice",
    "sports_understanding": "yes_no",  # lower-case targets: "yes" / "no"
    "temporal_sequences": "choice", "tracking_shuffled_objects_five_objects": "choice",
    "tracking_shuffled_objects_seven_objects": "choice", "tracking_shuffled_objects_three_objects": "choice",
    "web_of_lies": "yes_no", "word_sorting": "word_list",
}
"""The authoritative format of each of the 27 BBH tasks (checked on all 6,511 targets by the tests)."""

_CHOICE_TARGET = re.compile(r"\(([A-R])\)")
_INTEGER_TARGET = re.compile(r"-?\d+")
_DYCK_TARGET = re.compile(r"[)\]}>](?: [)\]}>])*")


def bbh_format_of(target: str, task: str) -> str:
    """The answer format of a BBH task: from :data:`BBH_TASK_FORMATS` for the 27 BBH tasks
    (``task`` may carry the ``bbh/`` prefix); for a task outside the table it is inferred from the
    shape of ``target``. Raises ``ValueError`` when neither says."""
    name = task.split("/", 1)[1] if task.startswith("bbh/") else task
    if name in BBH_TASK_FORMATS:
        return BBH_TASK_FORMATS[name]
    t = str(target).strip()
    if _CHOICE_TARGET.fullmatch(t):
        return "choice"
    for fmt, words in WORDS.items():
        if t.lower() in words:
            return fmt
    if _INTEGER_TARGET.fullmatch(t):
        return "integer"
    if _DYCK_TARGET.fullmatch(t):
        return "dyck"
    if re.fullmatch(r"[a-z0-9'&]+(?: [a-z0-9'&]+)*", t):
        return "word_list"
    raise ValueError(f"cannot tell the answer format of task {task!r} from target {target!r}; "
                     f"known formats: {BBH_FORMATS}")


def _check_bbh_format(fmt: str) -> None:
    if fmt not in BBH_FORMATS:
        raise ValueError(f"unknown BBH answer format {fmt!r}; expected one of {BBH_FORMATS}")


def bbh_grammar(fmt: str, options: Sequence[str] = ()) -> Grammar:
    _check_bbh_format(fmt)
    if fmt == "choice":
        return options_grammar(len(options) if options else len(LETTERS), options, paren_out=True)
    return FORMATS[fmt]()


def extract_bbh(text: Any, fmt: str, mode: str, *, target: str | None = None,
                options: Sequence[str] = ()) -> str | None:
    """The BBH answer in the model text, in the canonical form of ``fmt``, or None.

    Canonical forms: choice "(B)" (strict needs the parentheses; flexible also takes "B", "B)",
    "(b)"; with ``options`` the option's text maps to its letter); true_false "True"/"False";
    yes_no "Yes"/"No" (or the case of ``target`` when given: sports_understanding's targets are
    lower-case); valid_invalid "valid"/"invalid" ("not valid" counts as invalid); word_list
    lower-case words joined by single spaces (:func:`normalize_word_list`); integer "-12" (commas,
    spaces between digit groups and the unicode minus accepted, "12.0" is 12); dyck closing
    brackets joined by single spaces ("])>" -> "] ) >"). ``published`` gives the raw text the BBH
    rule compares."""
    check_mode(mode)
    if mode == "published":
        clean = sanitize_text(text)
        return reference.bbh_answer(clean) if clean is not None else None
    got = _read(text, bbh_grammar(fmt, options), mode).answer
    if got is not None and fmt == "yes_no" and target is not None and str(target).strip().islower():
        got = got.lower()
    return got


def _canonical_bbh_target(target: Any, fmt: str) -> str:
    # not cached across calls: a process-wide cache kept the test split's targets in the process
    # while the next session's optimizer ran (test_in_process_reach)
    t = str(target).strip()
    if fmt == "choice":
        return t
    if fmt in WORDS:
        words = WORDS[fmt]
        if t.lower() not in words:
            raise ValueError(f"BBH target {target!r} is not a {fmt} answer ({'/'.join(sorted(set(words.values())))})")
        return t
    if fmt == "word_list":
        return normalize_word_list(t)
    if fmt == "integer":
        if not _INTEGER_TARGET.fullmatch(t):
            raise ValueError(f"BBH integer target {target!r} is not an integer")
        return str(int(t))
    if not _DYCK_TARGET.fullmatch(re.sub(r"\s+", " ", t)) and not re.fullmatch(r"[)\]}>]+", t):
        raise ValueError(f"BBH dyck target {target!r} is not a closing-bracket sequence")
    return " ".join(c for c in t if c in ")]}>")


def score_bbh(text: Any, target: str, fmt: str, *, options: Sequence[str] = ()) -> dict[str, Any]:
    """Every mode of one BBH example. yes/no answers compare case-insensitively in strict and
    flexible and are reported in the target's case; ``published`` compares the raw string with the
    raw target. A choice target that is not a letter (movie_recommendation[163] "Monsters, Inc",
    ruin_names[99] and [144]: the option list split the title at a comma) is compared as text
    after SQuAD-style normalisation in strict and flexible."""
    _check_bbh_format(fmt)
    gold = _canonical_bbh_target(target, fmt)
    clean = sanitize_text(text)
    published = _published(reference.bbh_answer(clean) if clean is not None else None)
    raw_target = str(target)
    if fmt == "choice" and not _CHOICE_TARGET.fullmatch(gold):
        norm_gold = normalize_answer(gold)
        readings = _strict_and_flexible(clean, span_grammar())
        readings["published"] = published
        out = _result(readings, lambda got: normalize_answer(got) == norm_gold)
    else:
        grammar, lower = bbh_grammar(fmt, options), fmt == "yes_no" and gold.islower()
        readings = {mode: Reading(got.answer.lower(), None) if lower and got.answer else got
                    for mode, got in _strict_and_flexible(clean, grammar).items()}
        readings["published"] = published
        if fmt in WORDS:
            out = _result(readings, lambda got: got.lower() == gold.lower())
        else:
            out = _result(readings, lambda got: got == gold)
    out["published"] = int(published.answer is not None and published.answer == raw_target)
    return out


# ---------------------------------------------------------------------------------------------
# MMLU-Pro
# ---------------------------------------------------------------------------------------------


def _letters(n_options: int) -> str:
    if not isinstance(n_options, int) or not 1 <= n_options <= 10:
        raise ValueError(f"MMLU-Pro questions have 1..10 options (A..J), got n_options={n_options!r}")
    return LETTERS[:n_options]


def extract_choice_letter(text: Any, n_options: int, mode: str, *, options: Sequence[str] = ()) -> str | None:
    """MMLU-Pro: the chosen letter ("A".."J", only letters within ``n_options``) or None.

    Strict: after the final cue, the letter with or without parentheses ("The answer is (B)",
    "answer is B", "Answer: **B**.", "( B )"), or the exact text of one option. Flexible adds
    lower-case "(b)", option text opening the answer, the last "(B)" or a line that is only a
    letter / starts "B) ...". Published: the official three-stage extractor (letters A..J)."""
    check_mode(mode)
    _letters(n_options)
    if mode == "published":
        clean = sanitize_text(text)
        return reference.mmlu_pro_answer(clean) if clean is not None else None
    return _read(text, options_grammar(n_options, options, paren_out=False), mode).answer


def score_choice(text: Any, gold_letter: str, n_options: int, *, options: Sequence[str] = ()) -> dict[str, Any]:
    """MMLU-Pro, every mode. ``gold_letter`` may be "B" or "(B)"."""
    gold = str(gold_letter).strip().strip("()").upper()
    if len(gold) != 1 or gold not in _letters(n_options):
        raise ValueError(f"gold letter {gold_letter!r} is not one of the {n_options} options")
    clean = sanitize_text(text)
    readings = _strict_and_flexible(clean, options_grammar(n_options, options, paren_out=False))
    readings["published"] = _published(reference.mmlu_pro_answer(clean) if clean is not None else None)
    return _result(readings, lambda got: got == gold)


# ---------------------------------------------------------------------------------------------
# GSM-Hard
# ---------------------------------------------------------------------------------------------

REL_TOL = 1e-15
ABS_TOL = 1e-3


def _finite(number: Number | None) -> float | None:
    """The float of an extracted number; one too large for a float counts as no number."""
    if number is None:
        return None
    value = float(number.value)
    return value if math.isfinite(value) else None


def extract_number(text: Any, mode: str) -> float | None:
    """GSM-Hard: the final number of the model text as a float, or None.

    Accepts thousands commas ("1,234.5") and spaces between three or more digit groups
    ("1 234 567"; "1 234" only when it is the whole answer), currency before or after the sign
    ("$-5", "-$5", "€3"), units and "%" after the number (ignored), negative signs including the
    unicode minus, decimals, fractions ("3/4", ``\\frac{3}{4}``, "½", "2½") and scientific notation
    ("1.5e6"). European decimal commas ("1.234,5") are not supported. ``published`` reads what
    ``strict`` reads, the number the final answer cue introduces (:func:`score_number` then
    compares it by PAL's rule); :func:`pal_text_reading` is PAL's text rule."""
    check_mode(mode)
    return _finite(_read(text, number_grammar(), "strict" if mode == "published" else mode).answer)


def pal_text_reading(text: Any) -> float | None:
    """PAL's text rule (:func:`reference.pal_text_answer`): Python's ``float`` of what follows the
    last ``The answer is ``, or None where ``float`` refuses it ("$5", "1,234", "5 apples")."""
    clean = sanitize_text(text)
    return _pal_text_reading(clean)[1] if clean is not None else None


def _pal_text_reading(clean: str) -> tuple[str, float | None]:
    """PAL's text answer and its float (None when float() refuses it or it is not finite)."""
    answer = reference.pal_text_answer(clean)
    value = reference.pal_text_value(answer)
    return answer, value if value is not None and math.isfinite(value) else None


def numbers_match(pred: float, target: float, *, rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL,
                  decimals: int | None = None) -> bool:
    """True when ``pred`` equals ``target`` within heldout's GSM-Hard tolerance.

    Rule: ``|pred - target| <= max(abs_tol, rel_tol * max(|pred|, |target|))``; with ``decimals``
    (flexible mode only) a prediction written with 2+ decimal places also matches ``target``
    rounded to that many places.

    Why: targets are float64 results of executing PAL programs, so a correct answer agrees with
    them to well under a thousandth (``abs_tol=1e-3``, PAL's own scorer). ``rel_tol`` only absorbs
    float64 noise in huge targets: 1e-15 is a few ulps (2.2e-16 each); on the largest target
    (9284017268534.4) it allows 0.009, while the former 1e-13 allowed 0.93 and so accepted
    9284017268534. NaN/inf never match."""
    try:
        p, t = float(pred), float(target)
    except (TypeError, ValueError, OverflowError):
        return False
    if not (math.isfinite(p) and math.isfinite(t)):
        return False
    if math.isclose(p, t, rel_tol=rel_tol, abs_tol=abs_tol):
        return True
    if decimals is not None and decimals >= 2:
        half_unit = 0.5 * 10.0 ** (-decimals)
        return abs(p - t) <= half_unit * (1 + 1e-9) + rel_tol * abs(t)
    return False


def score_number(text: Any, target: float) -> dict[str, Any]:
    """GSM-Hard, every mode, plus two more PAL comparisons.

    strict: heldout's tolerance on the number the final answer cue introduces; flexible: heldout's
    tolerance plus written-precision rounding on the flexible reading; published (the headline):
    PAL's comparison ``abs(answer - target) < 1e-3`` (:func:`reference.pal_match`, the rule of
    GSM-Hard's published numbers) of strict's reading, so ``So the answer is 1,234.`` and
    ``The answer is 1234`` score alike; ``pal``: the same comparison of the flexible reading;
    ``pal_text``: PAL's text rule (``scripts/gsm_zero_shot.py``) exactly, its extraction and its
    check (:func:`reference.pal_text_correct`). So ``published`` vs ``strict`` isolates the
    tolerance, ``pal`` vs ``published`` flexible's fallbacks, ``pal_text`` vs ``published`` PAL's
    cue string and ``float``."""
    try:
        t = float(target)
    except (TypeError, ValueError):
        raise ValueError(f"GSM-Hard target must be a number, got {target!r}") from None
    if not math.isfinite(t):
        raise ValueError(f"GSM-Hard target must be finite, got {target!r}")
    clean = sanitize_text(text)
    raw = _strict_and_flexible(clean, number_grammar())
    value = {mode: _finite(raw[mode].answer) for mode in raw}
    pal_answer = _pal_text_reading(clean)[0] if clean is not None else ""
    out: dict[str, Any] = {
        "strict": int(value["strict"] is not None and numbers_match(value["strict"], t)),
        "flexible": int(value["flexible"] is not None and numbers_match(
            value["flexible"], t, decimals=raw["flexible"].answer.decimals)),
        "published": int(value["strict"] is not None and reference.pal_match(value["strict"], t)),
        "pal": int(value["flexible"] is not None and reference.pal_match(value["flexible"], t)),
        "pal_text": int(clean is not None and reference.pal_text_correct(pal_answer, target)),
    }
    for mode in ("strict", "flexible"):
        out[f"extracted_{mode}"] = value[mode]
        out[f"why_{mode}"] = raw[mode].why if value[mode] is None and raw[mode].why else (
            "too_large" if value[mode] is None else None)
    out["extracted_published"], out["why_published"] = value["strict"], out["why_strict"]
    return out


# ---------------------------------------------------------------------------------------------
# HotpotQA (SQuAD-style normalisation, official EM / F1)
# ---------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD/HotpotQA normalisation: lower-case, drop ASCII punctuation, drop the articles
    a/an/the, collapse whitespace."""
    s = str(text).lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str | None, gold: str) -> int:
    """1 when the normalised prediction equals the normalised gold answer, else 0."""
    if prediction is None:
        return 0
    return int(normalize_answer(prediction) == normalize_answer(gold))


@dataclass(frozen=True)
class TokenScores:
    """Token overlap of a prediction with a gold answer (after :func:`normalize_answer`)."""

    precision: float
    recall: float
    f1: float


_SPECIAL_ANSWERS = ("yes", "no", "noanswer")


def token_scores(prediction: str | None, gold: str) -> TokenScores:
    """Official HotpotQA token precision / recall / F1. Special case: when either side
    normalises to yes / no / noanswer, the two must be identical, else everything is 0."""
    zero = TokenScores(0.0, 0.0, 0.0)
    if prediction is None:
        return zero
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _SPECIAL_ANSWERS or ref in _SPECIAL_ANSWERS) and pred != ref:
        return zero
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = Counter(pred_tokens) & Counter(ref_tokens)
    same = sum(common.values())
    if same == 0:
        return zero
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return TokenScores(precision, recall, 2 * precision * recall / (precision + recall))


def token_f1(prediction: str | None, gold: str) -> float:
    return token_scores(prediction, gold).f1


def extract_span(text: Any, mode: str) -> str | None:
    """HotpotQA: the answer span. Strict: the rest of the line after the final answer cue
    (markdown, quotes and one trailing period removed), or the next paragraph when the cue ends
    its line. Flexible: that, else the last non-empty line of the text. Published:
    :func:`hotpot_prediction`."""
    check_mode(mode)
    if mode == "published":
        return hotpot_prediction(text).answer
    return _read(text, span_grammar(), mode).answer


def hotpot_prediction(text: Any) -> Reading:
    """The prediction the ``published`` (headline) HotpotQA score gives the official metric.

    The official script (``hotpot_evaluate_v1.py``: ``normalize_answer``, exact match, token F1)
    scores a prediction string and extracts nothing, so heldout supplies the string by a rule
    consistent with strict: the answer the final anchored cue introduces, read exactly as strict
    reads it (``Answer: **X**``, ``So the answer is\nX``, ``Final answer: X`` all give X; a negated
    or empty final cue gives no prediction); an output with no answer cue at all is taken whole, as
    a bare answer. The official normalisation then compares it with the gold."""
    clean = sanitize_text(text)
    return _hotpot_prediction(clean, read(clean, span_grammar(), "strict"))


def _hotpot_prediction(clean: str | None, strict: Reading) -> Reading:
    if strict.why != "no_cue":
        return strict
    whole = (clean or "").strip()
    return Reading(whole) if whole else Reading(None, "empty")


def score_span(text: Any, gold: str) -> dict[str, Any]:
    """Every mode: exact match (0/1) as ``<mode>``, plus ``f1_<mode>``, ``precision_<mode>``,
    ``recall_<mode>`` (floats), ``extracted_<mode>`` and ``why_<mode>``."""
    clean = sanitize_text(text)
    readings = _strict_and_flexible(clean, span_grammar())
    readings["published"] = _hotpot_prediction(clean, readings["strict"])
    out = _result(readings, lambda got: exact_match(got, gold) == 1)
    for mode in EXTRACTION_MODES:
        overlap = token_scores(readings[mode].answer, gold)
        out[f"f1_{mode}"] = overlap.f1
        out[f"precision_{mode}"] = overlap.precision
        out[f"recall_{mode}"] = overlap.recall
    return out


__all__ = ["BBH_FORMATS", "BBH_TASK_FORMATS", "bbh_format_of", "extract_bbh", "score_bbh", "extract_choice_letter",
           "score_choice", "extract_number", "pal_text_reading", "numbers_match", "score_number", "normalize_answer",
           "exact_match", "TokenScores", "token_scores", "token_f1", "extract_span", "hotpot_prediction", "score_span",
           "canonical_integer"]
