"""Answer extraction and scoring for the dataset benchmarks (BBH, MMLU-Pro, GSM-Hard, HotpotQA).

Pure functions: no I/O, no model calls. Benchmark modules call them from ``score_text``.

Two named extraction filters are reported side by side (``EXTRACTION_MODES``):

``strict``
    The answer must follow an *answer cue*: ``the answer is X``, ``The final answer is X``,
    ``Answer: X``, ``answer = X`` or GSM8K's ``#### X`` (case-insensitive; markdown bold/italics,
    backticks, ``$...$`` and ``\\boxed{}`` around X are ignored; a trailing period is dropped).
    X must *start* the text after the cue and be in the format's strict form. When the cue occurs
    several times, the last cue whose text parses wins (models restate and self-correct).
    The text after the first answer that is followed by a new ``Q:`` line is a run-on few-shot
    continuation and is ignored in both modes.

``flexible``
    The strict answer when there is one; otherwise the first candidate of the format's looser
    grammar in the text after the last cue; otherwise the content of the last ``\\boxed{}``;
    otherwise the last well-formed candidate anywhere in the text. So flexible accuracy is never
    below strict accuracy, and the two differ only on outputs that break the answer form.

Extracted answers are returned in the target's canonical form, so ``extracted == target`` is the
score rule (with the documented exceptions: yes/no case, numeric tolerance, SQuAD normalisation).

Bad model output (None, not a string, no answer) never raises: it extracts to ``None`` and scores
0. Bad *arguments* (an unknown format or mode, a target that is not of its format) are programming
or data errors and raise ``ValueError`` with a clear message; :func:`answer_verdict` turns scores
into a :class:`~heldout.benchmarks.base.Verdict`.
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Iterator, Mapping

from heldout.contracts import Verdict

EXTRACTION_MODES: tuple[str, ...] = ("strict", "flexible")

# ---------------------------------------------------------------------------------------------
# Shared text handling
# ---------------------------------------------------------------------------------------------

# "answer" followed by "is" / ":" / "=" (markdown allowed in between), or GSM8K's "####".
_CUE = re.compile(r"\banswer\b[\s*_`]*(?:is\b|:|=)|####", re.IGNORECASE)
_RUN_ON = re.compile(r"\n\s*Q\s*:")
_MINUS_SIGNS = "\u2212\u2013\ufe63\uff0d"  # unicode minus, en dash, small/full-width hyphen-minus


def _as_text(text: Any, *, fold: bool) -> str:
    """Model output as a string to search; anything that is not a string is 'no output'.

    ``fold`` (every format except free-text spans): NFKC folds full-width letters and digits
    ("（Ｂ）" -> "(B)") and the curly apostrophe becomes "'". Spans are kept as written, because
    the official HotpotQA normalisation compares them as written."""
    if not isinstance(text, str):
        return ""
    return unicodedata.normalize("NFKC", text).replace("\u2019", "'") if fold else text


def _drop_run_on(text: str) -> str:
    """Cut a few-shot run-on: the first cue, then a new line starting with ``Q:``."""
    first = _CUE.search(text)
    if first is None:
        return text
    run_on = _RUN_ON.search(text, first.end())
    return text[: run_on.start()] if run_on else text


_LATEX_WRAPPERS = re.compile(r"\\(?:boxed|text|textbf|mathrm|mathbf|fbox)\s*\{([^{}]*)\}")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]*?)\s*\}\s*\{\s*([^{}]*?)\s*\}")


def _clean(segment: str) -> str:
    """Remove presentation around an answer: markdown emphasis, code ticks, LaTeX wrappers and
    math delimiters, surrounding quotes, a leading ':', one trailing period."""
    s = _LATEX_FRAC.sub(r"\1/\2", segment)
    for _ in range(3):  # nested wrappers: \boxed{\text{B}}
        s = _LATEX_WRAPPERS.sub(r"\1", s)
    s = s.replace("\\(", " ").replace("\\)", " ").replace("\\[", " ").replace("\\]", " ")
    s = s.replace("\\,", "").replace("\\%", "%").replace("\\$", "$")
    s = s.replace("**", "").replace("__", "").replace("*", "").replace("`", "")
    s = s.strip().lstrip(":").strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'":
        s = s[1:-1].strip()
    if s.endswith(".") and not s.endswith(".."):
        s = s[:-1].rstrip()
    return s


_NEXT_PARAGRAPH = re.compile(r"\s*(.*?)(?:\n[ \t]*\n|\Z)", re.DOTALL)
_MAX_CUES = 64  # the last 64 cues are tried: bounded work on degenerate, repetitive output


def _segments_after_cues(text: str) -> Iterator[str]:
    """The cleaned text after each answer cue, last cue first: the rest of the cue's line, or
    when that is empty, the next paragraph (a block of non-empty lines)."""
    cues = [m.end() for m in _CUE.finditer(text)][-_MAX_CUES:]
    for start in reversed(cues):
        line_end = text.find("\n", start)
        line = text[start:] if line_end < 0 else text[start:line_end]
        segment = _clean(line)
        if not segment and line_end >= 0:
            paragraph = _NEXT_PARAGRAPH.match(text, line_end)
            segment = _clean(paragraph.group(1)) if paragraph else ""
        yield segment


def _boxed(text: str) -> list[str]:
    return re.findall(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}", text)


@dataclass(frozen=True)
class _Grammar:
    """How one answer format is read. Each reader returns the canonical answer or None.

    ``strict``: the cleaned text after a cue must start with the answer in its strict form;
    ``loose``: first candidate of the looser grammar in the text after a cue;
    ``last``: last well-formed candidate anywhere in the text."""

    strict: Callable[[str], Any]
    loose: Callable[[str], Any]
    last: Callable[[str], Any]


def _extract(text: Any, grammar: _Grammar, mode: str, *, fold: bool = True) -> Any:
    _check_mode(mode)
    body = _drop_run_on(_as_text(text, fold=fold))
    if not body.strip():
        return None
    last_segment = None
    for segment in _segments_after_cues(body):
        last_segment = segment if last_segment is None else last_segment
        found = grammar.strict(segment)
        if found is not None:
            return found
    if mode == "strict":
        return None
    if last_segment is not None:
        found = grammar.loose(last_segment)
        if found is not None:
            return found
    for boxed in reversed(_boxed(body)):
        found = grammar.loose(_clean(boxed))
        if found is not None:
            return found
    return grammar.last(body)


def _check_mode(mode: str) -> None:
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"unknown extraction mode {mode!r}; expected one of {EXTRACTION_MODES}")


def _last(matches: list[str]) -> str | None:
    return matches[-1] if matches else None


# ---------------------------------------------------------------------------------------------
# Letter choices (BBH "(A)".."(R)", MMLU-Pro A..J)
# ---------------------------------------------------------------------------------------------

_LETTERS = "ABCDEFGHIJKLMNOPQR"
_OPTION_WORD = r"(?:(?:option|choice)\s*)?"


def _choice_grammar(letters: str, *, strict_bare: bool) -> _Grammar:
    """Letters are returned bare ("B"); callers add parentheses where the target has them.

    Strict: "(B)" (uppercase), and when ``strict_bare`` also "B" standing alone ("B", "B.",
    "B)"). Loose: any "(b)" in the answer text, or a bare letter opening it. Last candidate
    anywhere: "(B)" / "(b)", or a line that is only the letter or starts a list item "B) ..." /
    "B. ...". A capital letter inside prose is never a candidate: "A" is also an article."""
    cls = f"[{letters}]"
    cls_any = f"[{letters}{letters.lower()}]"
    option = rf"(?i:{_OPTION_WORD})"
    strict_paren = re.compile(rf"{option}\(({cls})\)")
    strict_bare_re = re.compile(rf"{option}\(?({cls})\)?(?!\w)")
    paren_any = re.compile(rf"\(({cls_any})\)")
    bare_upper = re.compile(rf"{option}({cls})(?!\w)")
    bare_lower = re.compile(rf"{option}({cls_any})(?:[).:,]|\s*$)")
    letter_line = re.compile(rf"(?i:(?:answer|option|choice)\s*:?\s*)?\(?({cls})\)?[.:]?")
    list_item = re.compile(rf"({cls})[).]\s")

    def strict(segment: str) -> str | None:
        m = (strict_bare_re if strict_bare else strict_paren).match(segment)
        return m.group(1) if m else None

    def loose(segment: str) -> str | None:
        m = paren_any.search(segment)
        if m:
            return m.group(1).upper()
        m = bare_upper.match(segment) or bare_lower.match(segment)
        return m.group(1).upper() if m else None

    def last(text: str) -> str | None:
        found = None
        for raw in text.split("\n"):  # in reading order; a later candidate replaces an earlier one
            line = _clean(raw).lstrip("#>-\t ")
            m = list_item.match(line)
            if m:
                found = m.group(1)
            for m in paren_any.finditer(raw):
                found = m.group(1).upper()
            m = letter_line.fullmatch(line)
            if m:
                found = m.group(1)
        return found

    return _Grammar(strict, loose, last)


def _letters(n_options: int) -> str:
    if not isinstance(n_options, int) or not 1 <= n_options <= 10:
        raise ValueError(f"MMLU-Pro questions have 1..10 options (A..J), got n_options={n_options!r}")
    return _LETTERS[:n_options]


def extract_choice_letter(text: Any, n_options: int, mode: str) -> str | None:
    """MMLU-Pro: the chosen letter ("A".."J", only letters within ``n_options``) or None.

    Strict follows MMLU-Pro's own first-stage rule: after the cue, the letter with or without
    parentheses ("The answer is (B)", "answer is B", "Answer: **B**."). Flexible adds lower-case
    "(b)", and falls back to the last "(B)" or a line that is only a letter / starts "B) ..."."""
    return _extract(text, _choice_grammar(_letters(n_options), strict_bare=True), mode)


def score_choice(text: Any, gold_letter: str, n_options: int) -> dict[str, Any]:
    """MMLU-Pro: {"strict": 0/1, "flexible": 0/1, "extracted_strict", "extracted_flexible"}.
    ``gold_letter`` may be "B" or "(B)"."""
    gold = str(gold_letter).strip().strip("()").upper()
    if len(gold) != 1 or gold not in _letters(n_options):
        raise ValueError(f"gold letter {gold_letter!r} is not one of the {n_options} options")
    return _scores(text, lambda mode: extract_choice_letter(text, n_options, mode), lambda got: got == gold)


def _scores(text: Any, extract: Callable[[str], Any], correct: Callable[[Any], bool]) -> dict[str, Any]:
    got = {mode: extract(mode) for mode in EXTRACTION_MODES}
    out: dict[str, Any] = {mode: int(got[mode] is not None and correct(got[mode])) for mode in EXTRACTION_MODES}
    out.update({f"extracted_{mode}": got[mode] for mode in EXTRACTION_MODES})
    return out


# ---------------------------------------------------------------------------------------------
# Numbers (GSM-Hard; BBH integers)
# ---------------------------------------------------------------------------------------------

_CURRENCY = "$€£¥₹"
# A number token: optional currency, sign, currency again ("$-5", "-$5"), digits with optional
# thousands commas, optional decimals, optional exponent; or a fraction "3/4". It may not start
# inside a word or another number ("x2", "3.14.15").
_NUMBER = re.compile(
    rf"""(?<![\w.])
    (?P<cur1>[{_CURRENCY}]\s?)?
    (?P<sign>[-+{_MINUS_SIGNS}])?
    (?P<cur2>[{_CURRENCY}]\s?)?
    (?:
        (?:(?P<whole>\d+)[ ](?=\d+/))?(?P<num>\d+)\s*/\s*(?P<den>\d+)(?![\d/]|\.\d)
      | (?P<int>\d{{1,3}}(?:,\d{{3}})+(?!\d)|\d+)(?P<frac>\.\d+)?(?P<exp>[eE][-+]?\d+)?
      | (?P<lead>\.\d+)
    )
    (?!\w*\.\d)""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class _Number:
    value: Decimal
    decimals: int | None  # digits written after the point; None for fractions / exponents


def _read_number(m: re.Match[str], *, fractions: bool = True, exponents: bool = True) -> _Number | None:
    negative = m.group("sign") is not None and m.group("sign") != "+"
    try:
        if m.group("num") is not None:
            if not fractions or int(m.group("den")) == 0:
                return None
            value = Decimal(int(m.group("num"))) / Decimal(int(m.group("den")))
            if m.group("whole") is not None:  # mixed number "1 1/2"
                value += int(m.group("whole"))
            decimals = None
        elif m.group("lead") is not None:
            value, decimals = Decimal("0" + m.group("lead")), len(m.group("lead")) - 1
        else:
            if m.group("exp") and not exponents:
                return None
            digits = m.group("int").replace(",", "") + (m.group("frac") or "") + (m.group("exp") or "")
            value = Decimal(digits)
            decimals = None if m.group("exp") else len(m.group("frac") or ".") - 1
    except (InvalidOperation, ValueError):
        return None
    if not value.is_finite():
        return None
    return _Number(value.copy_negate() if negative else value, decimals)  # exact, no rounding


def _number_grammar(*, fractions: bool, exponents: bool) -> _Grammar:
    def read(m: re.Match[str]) -> _Number | None:
        return _read_number(m, fractions=fractions, exponents=exponents)

    def strict(segment: str) -> _Number | None:
        m = _NUMBER.match(segment.replace("$ ", "$"))
        return read(m) if m else None

    def loose(segment: str) -> _Number | None:
        for m in _NUMBER.finditer(segment):
            got = read(m)
            if got is not None:
                return got
        return None

    def last(text: str) -> _Number | None:
        found = [n for n in (read(m) for m in _NUMBER.finditer(_clean_numbers(text))) if n is not None]
        return found[-1] if found else None

    return _Grammar(strict, loose, last)


def _clean_numbers(text: str) -> str:
    return _LATEX_FRAC.sub(r"\1/\2", text).replace("\\,", "").replace("**", "")


_GSM_GRAMMAR = _number_grammar(fractions=True, exponents=True)


def _extract_number_token(text: Any, mode: str) -> _Number | None:
    return _extract(text, _GSM_GRAMMAR, mode)


def _finite(number: _Number | None) -> float | None:
    """The float of an extracted number; one too large for a float counts as no number."""
    if number is None:
        return None
    value = float(number.value)
    return value if math.isfinite(value) else None


def extract_number(text: Any, mode: str) -> float | None:
    """GSM-Hard: the final number of the model text as a float, or None.

    Accepts thousands commas ("1,234.5"), currency before or after the sign ("$-5", "-$5",
    "€3", "£2.50"), units and "%" after the number (ignored), negative signs including the
    unicode minus, decimals, fractions as decimals ("3/4" -> 0.75, ``\\frac{3}{4}`` too) and
    scientific notation ("1.5e6"). European decimal commas ("1.234,5") are not supported: "1,5"
    reads as 1 and 5."""
    return _finite(_extract_number_token(text, mode))


def numbers_match(pred: float, target: float, *, rel_tol: float = 1e-13, abs_tol: float = 1e-3,
                  decimals: int | None = None) -> bool:
    """True when ``pred`` equals ``target`` within the GSM-Hard tolerance.

    Rule: ``|pred - target| <= max(abs_tol, rel_tol * max(|pred|, |target|))``, or, when the
    prediction was written with ``decimals >= 2`` places, ``pred`` is ``target`` rounded to
    that many places.

    Why these numbers: targets are float64 results of executing PAL programs, so a correct answer
    agrees with them to well under a thousandth (``abs_tol=1e-3``, the rule in
    ../shared/data/SOURCES.md and PAL's own scorer). ``rel_tol`` only absorbs float64 noise in
    huge targets (a few ulps ~ 1e-16 relative); it must stay below 1 / max|target| (~9.3e12
    here) or an off-by-one answer would be accepted: 1e-6 would accept errors of up to 9 on the
    779 targets above 1e6. Rounding: 303 targets are non-integers such as 14053029.666666666;
    a model writing 14053029.67 is right, so a written precision of 2+ places is honoured
    (14053029.66 is still wrong). NaN/inf never match."""
    try:
        p, t = float(pred), float(target)
    except (TypeError, ValueError):
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
    """GSM-Hard: {"strict": 0/1, "flexible": 0/1, "extracted_strict", "extracted_flexible"}
    (extracted values are floats or None), compared with :func:`numbers_match`."""
    try:
        t = float(target)
    except (TypeError, ValueError):
        raise ValueError(f"GSM-Hard target must be a number, got {target!r}") from None
    if not math.isfinite(t):
        raise ValueError(f"GSM-Hard target must be finite, got {target!r}")
    out: dict[str, Any] = {}
    for mode in EXTRACTION_MODES:
        got = _extract_number_token(text, mode)
        value = _finite(got)
        out[mode] = int(value is not None and numbers_match(value, t, decimals=got.decimals))
        out[f"extracted_{mode}"] = value
    return out


# ---------------------------------------------------------------------------------------------
# BBH
# ---------------------------------------------------------------------------------------------

BBH_FORMATS: tuple[str, ...] = ("choice", "true_false", "yes_no", "valid_invalid", "word_list", "integer", "dyck")

BBH_TASK_FORMATS: dict[str, str] = {
    "boolean_expressions": "true_false",
    "causal_judgement": "yes_no",
    "date_understanding": "choice",
    "disambiguation_qa": "choice",
    "dyck_languages": "dyck",
    "formal_fallacies": "valid_invalid",
    "geometric_shapes": "choice",
    "hyperbaton": "choice",
    "logical_deduction_five_objects": "choice",
    "logical_deduction_seven_objects": "choice",
    "logical_deduction_three_objects": "choice",
    "movie_recommendation": "choice",
    "multistep_arithmetic_two": "integer",
    "navigate": "yes_no",
    "object_counting": "integer",
    "penguins_in_a_table": "choice",
    "reasoning_about_colored_objects": "choice",
    "ruin_names": "choice",
    "salient_translation_error_detection": "choice",
    "snarks": "choice",
    "sports_understanding": "yes_no",  # lower-case targets: "yes" / "no"
    "temporal_sequences": "choice",
    "tracking_shuffled_objects_five_objects": "choice",
    "tracking_shuffled_objects_seven_objects": "choice",
    "tracking_shuffled_objects_three_objects": "choice",
    "web_of_lies": "yes_no",
    "word_sorting": "word_list",
}
"""The authoritative format of each of the 27 BBH tasks (from the task data, checked on all 6,511
targets by the tests)."""

_CHOICE_TARGET = re.compile(r"\(([A-R])\)")
_INTEGER_TARGET = re.compile(r"-?\d+")
_DYCK_TARGET = re.compile(r"[)\]}>](?: [)\]}>])*")
_WORDS = {
    "true_false": {"true": "True", "false": "False"},
    "yes_no": {"yes": "Yes", "no": "No"},
    "valid_invalid": {"valid": "valid", "invalid": "invalid", "not valid": "invalid"},
}


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
    for fmt, words in _WORDS.items():
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


def _word_grammar(words: Mapping[str, str]) -> _Grammar:
    alternatives = "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in sorted(words, key=len, reverse=True))
    start = re.compile(rf"({alternatives})\b", re.IGNORECASE)
    anywhere = re.compile(rf"\b({alternatives})\b", re.IGNORECASE)

    def canon(word: str) -> str:
        return words[re.sub(r"\s+", " ", word.lower())]

    def strict(segment: str) -> str | None:
        m = start.match(segment)
        return canon(m.group(1)) if m else None

    def loose(segment: str) -> str | None:
        m = anywhere.search(segment)
        return canon(m.group(1)) if m else None

    def last(text: str) -> str | None:
        return _last([canon(m.group(1)) for m in anywhere.finditer(text.replace("*", ""))])

    return _Grammar(strict, loose, last)


# Words of a word list: letters/digits with inner apostrophes or ampersands ("o'connell", "r&d").
_WORD = re.compile(r"[a-z0-9]+(?:['&][a-z0-9]+)*")
_LIST_MARKER = re.compile(r"^\s*(?:\d+[.)]|[-*\u2022])\s+", re.MULTILINE)


def normalize_word_list(text: str) -> str:
    """Canonical word list: lower-case words joined by single spaces. Commas, quotes, brackets,
    list markers ("1.", "-") and other punctuation between words are dropped; apostrophes and
    ampersands inside a word are kept ("o'connell", "it&t")."""
    return " ".join(_WORD.findall(_LIST_MARKER.sub(" ", text).lower()))


def _word_list_grammar() -> _Grammar:
    def from_segment(segment: str) -> str | None:
        # "The answer is: a b c" / "sorted list: a b c" -> after the last colon of the line;
        # one explanatory sentence after the list is cut at the first sentence end.
        if ":" in segment.split("\n", 1)[0]:
            head, _, rest = segment.partition("\n")
            segment = head.rsplit(":", 1)[1] + ("\n" + rest if rest else "")
        segment = re.split(r"[.!?](?:\s|$)", _LIST_MARKER.sub(" ", segment), maxsplit=1)[0]
        found = normalize_word_list(segment)
        return found or None

    def last(text: str) -> str | None:
        blocks = [b for b in re.split(r"\n\s*\n", text.strip()) if b.strip()]
        if not blocks:
            return None
        lines = [_clean(line) for line in blocks[-1].split("\n") if line.strip()]
        if len(lines) > 1 and all(_LIST_MARKER.match(line + " ") for line in lines):
            return normalize_word_list("\n".join(lines)) or None
        return from_segment(lines[-1]) if lines else None

    return _Grammar(from_segment, from_segment, last)


_CLOSING_RUN = re.compile(r"[)\]}>](?:[\s,'\"]*[)\]}>])*")


def _dyck_grammar() -> _Grammar:
    def canon(run: str) -> str:
        return " ".join(c for c in run if c in ")]}>")

    def strict(segment: str) -> str | None:
        m = _CLOSING_RUN.match(segment.lstrip("'\""))
        return canon(m.group(0)) if m else None

    def loose(segment: str) -> str | None:
        m = _CLOSING_RUN.search(segment)
        return canon(m.group(0)) if m else None

    def last(text: str) -> str | None:
        return _last([canon(m.group(0)) for m in _CLOSING_RUN.finditer(text)])

    return _Grammar(strict, loose, last)


def _canonical_integer(n: _Number) -> str:
    # Decimal formatting, not int(): a 5,000-digit "answer" must not hit int's str limit.
    value = n.value
    if value == value.to_integral_value():
        magnitude = format(value.to_integral_value().copy_abs(), "f")
        return "-" + magnitude if value < 0 else magnitude
    return format(value, "f")  # extracted but not an integer: scores 0


def _integer_grammar() -> _Grammar:
    numbers = _number_grammar(fractions=False, exponents=False)

    def wrap(read: Callable[[str], Any]) -> Callable[[str], str | None]:
        def inner(s: str) -> str | None:
            got = read(s)
            return _canonical_integer(got) if got is not None else None
        return inner

    return _Grammar(wrap(numbers.strict), wrap(numbers.loose), wrap(numbers.last))


def _bbh_choice_grammar() -> _Grammar:
    bare = _choice_grammar(_LETTERS, strict_bare=False)

    def paren(read: Callable[[str], str | None]) -> Callable[[str], str | None]:
        def inner(s: str) -> str | None:
            got = read(s)
            return f"({got})" if got is not None else None
        return inner

    return _Grammar(paren(bare.strict), paren(bare.loose), paren(bare.last))


_BBH_GRAMMARS: dict[str, _Grammar] = {
    "choice": _bbh_choice_grammar(),
    "true_false": _word_grammar(_WORDS["true_false"]),
    "yes_no": _word_grammar(_WORDS["yes_no"]),
    "valid_invalid": _word_grammar(_WORDS["valid_invalid"]),
    "word_list": _word_list_grammar(),
    "integer": _integer_grammar(),
    "dyck": _dyck_grammar(),
}


def _free_text_grammar() -> _Grammar:
    """For the BBH targets that are not letters (movie_recommendation[163] "Monsters, Inc",
    ruin_names[99], [144]): the answer is the text after the cue / the last line, compared after
    SQuAD-style normalisation."""
    def from_segment(segment: str) -> str | None:
        return segment.strip() or None

    def last(text: str) -> str | None:
        lines = [_clean(line) for line in text.strip().split("\n") if line.strip()]
        return lines[-1] if lines else None

    return _Grammar(from_segment, from_segment, last)


_FREE_TEXT = _free_text_grammar()


def _check_bbh_format(fmt: str) -> None:
    if fmt not in BBH_FORMATS:
        raise ValueError(f"unknown BBH answer format {fmt!r}; expected one of {BBH_FORMATS}")


def extract_bbh(text: Any, fmt: str, mode: str, *, target: str | None = None) -> str | None:
    """The BBH answer in the model text, in the canonical form of ``fmt``, or None.

    Canonical forms: choice "(B)" (strict needs the parentheses; flexible also takes "B", "B)",
    "(b)"); true_false "True"/"False"; yes_no "Yes"/"No" (or the case of ``target`` when given:
    sports_understanding's targets are lower-case); valid_invalid "valid"/"invalid" ("not valid"
    counts as invalid); word_list lower-case words joined by single spaces (see
    :func:`normalize_word_list`); integer "-12" (commas and the unicode minus accepted, "12.0"
    is 12); dyck closing brackets joined by single spaces ("])>" -> "] ) >")."""
    _check_bbh_format(fmt)
    got = _extract(text, _BBH_GRAMMARS[fmt], mode)
    if got is not None and fmt == "yes_no" and target is not None and str(target).strip().islower():
        got = got.lower()
    return got


def _canonical_bbh_target(target: str, fmt: str) -> str:
    t = str(target).strip()
    if fmt == "choice":
        return t
    if fmt in _WORDS:
        words = _WORDS[fmt]
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


def score_bbh(text: Any, target: str, fmt: str) -> dict[str, Any]:
    """{"strict": 0/1, "flexible": 0/1, "extracted_strict", "extracted_flexible"} for one BBH
    example. yes/no answers compare case-insensitively and are reported in the target's case.
    A choice target that is not a letter (movie_recommendation[163] "Monsters, Inc",
    ruin_names[99] and [144]: the option list split the title at a comma) is compared as text
    after SQuAD-style normalisation, so "So the answer is Monsters, Inc." scores 1."""
    _check_bbh_format(fmt)
    gold = _canonical_bbh_target(target, fmt)
    if fmt == "choice" and not _CHOICE_TARGET.fullmatch(gold):
        norm_gold = normalize_answer(gold)
        return _scores(text, lambda mode: _extract(text, _FREE_TEXT, mode, fold=False),
                       lambda got: normalize_answer(got) == norm_gold)
    if fmt in _WORDS:
        return _scores(text, lambda mode: extract_bbh(text, fmt, mode, target=gold),
                       lambda got: got.lower() == gold.lower())
    return _scores(text, lambda mode: extract_bbh(text, fmt, mode), lambda got: got == gold)


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
    normalises to yes / no / noanswer, the two must be identical, else everything is 0 (a "no"
    prediction shares no credit with a gold "no way out")."""
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


def _span_grammar() -> _Grammar:
    def from_segment(segment: str) -> str | None:
        return segment.split("\n", 1)[0].strip() or None

    def last(text: str) -> str | None:
        lines = [_clean(line) for line in text.strip().split("\n") if _clean(line)]
        return lines[-1] if lines else None

    return _Grammar(from_segment, from_segment, last)


_SPAN = _span_grammar()


def extract_span(text: Any, mode: str) -> str | None:
    """HotpotQA: the answer span. Strict: the rest of the line after the last answer cue
    (markdown, quotes and one trailing period removed). Flexible: that, else the last non-empty
    line of the text (a one-line answer is the whole text)."""
    return _extract(text, _SPAN, mode, fold=False)


def score_span(text: Any, gold: str) -> dict[str, Any]:
    """{"strict", "flexible"} exact match (0/1), "f1_<mode>", "precision_<mode>",
    "recall_<mode>" (floats) and "extracted_<mode>" for both modes."""
    out: dict[str, Any] = {}
    for mode in EXTRACTION_MODES:
        got = extract_span(text, mode)
        overlap = token_scores(got, gold)
        out[mode] = exact_match(got, gold)
        out[f"f1_{mode}"] = overlap.f1
        out[f"precision_{mode}"] = overlap.precision
        out[f"recall_{mode}"] = overlap.recall
        out[f"extracted_{mode}"] = got
    return out


# ---------------------------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------------------------


def answer_verdict(example_id: str, text: Any, score: Callable[[Any], Mapping[str, Any]], *,
                   primary: str = "strict", metric: str | None = None) -> Verdict:
    """Run ``score(text)`` (one of the ``score_*`` functions with its target bound) and wrap the
    result as a :class:`Verdict`: ``score`` is ``result[metric or primary]``, every numeric entry
    becomes a dimension, the extracted answers are the output.

    Never raises: text that is not a string is a ``bad_output`` failure, a target the scorer
    rejects is a ``bad_target`` failure, and no answer in the ``primary`` mode is a
    ``no_answer`` failure (the other mode's dimensions are kept)."""
    _check_mode(primary)
    if not isinstance(text, str):
        return Verdict.failure(example_id, f"model output is {type(text).__name__}, not text", "bad_output")
    try:
        result = dict(score(text))
    except ValueError as exc:
        return Verdict.failure(example_id, f"cannot score against this target: {exc}", "bad_target")
    dims = {k: float(v) for k, v in result.items()
            if not k.startswith("extracted_") and isinstance(v, (int, float)) and not isinstance(v, bool)}
    output = {k: v for k, v in result.items() if k.startswith("extracted_")}
    if result.get(f"extracted_{primary}") is None:
        return Verdict.failure(example_id, f"no answer found in the {primary} form "
                               f"(e.g. 'So the answer is X.')", "no_answer",
                               dimensions=dims, output=output)
    value = float(result[metric or primary])
    got = result[f"extracted_{primary}"]
    return Verdict(example_id=example_id, score=value, dimensions=dims, output=output,
                   feedback=f"{primary} answer {got!r} scored {value:g}")
