"""Text handling shared by every answer format: sanitising, folding, answer cues, run-on cuts.

Rules (each one named, each one tested):

* **sanitise** - whatever a worker returned becomes a plain ``str`` that can always be encoded as
  UTF-8: ``bytes`` are decoded as UTF-8 (bad bytes become U+FFFD), a lone surrogate (which
  ``json.loads`` produces from ``"\\ud83d"``) becomes U+FFFD, and control characters other than
  tab / newline / carriage return are dropped. Anything else (``None``, numbers) is *no output*.
* **cap** - an output longer than :data:`MAX_OUTPUT_CHARS` is not read at all (a degenerate,
  repeating generation; reading a megabyte costs seconds and never holds a better answer).
* **fold** - NFKC folds full-width letters and digits, vulgar fractions become ``n/d`` (``3½`` is
  ``3 1/2``), curly apostrophes become ``'``. Free-text spans are not folded: the official
  HotpotQA normalisation compares them as written.
* **anchored cue** - an answer cue *introduces* an answer: ``the answer is``, ``my/final/correct
  answer is``, ``Answer:`` / ``answer =`` at the start of a line, or GSM8K's ``####``. A phrase in
  which "answer" is the subject of a comment (``I hope this answer is helpful``, ``an answer is
  required``) is not a cue, and a cue followed by text that comments on an answer (``the answer is
  correct``) is skipped, so neither can replace the final answer.
* **negated cue** - ``the answer is not (A)`` (also ``isn't``, ``never``, ``neither``, ``none of``,
  ``definitely not``) introduces no answer and *denies* the answers it names. It does not cancel an
  earlier cue that affirms another answer (``Answer: B. The answer is not C.`` is B); it retracts
  one that affirms a denied answer (``Answer: B. No, the answer is not B.`` has no answer); with no
  earlier affirmed answer the output has none (whatever follows: the model's own last word is not
  an answer); ``none of the above`` denies every answer. ``not X but Y`` affirms Y; ``not only X
  but (also) Y`` is no negation: it names two answers, a hedge. The rule that picks the final cue
  is :func:`.pipeline.final_cue`.
* **run-on cut** - after the first cue, a new line that starts with one of the task prompt's
  question markers (``Q:``, ``Question:``) begins an invented next example; it is cut off.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

MAX_OUTPUT_CHARS = 131_072
"""Outputs longer than this (128 Ki characters, ~32k tokens) are not read: the verdict says so."""

QUESTION_MARKERS: tuple[str, ...] = ("Q:", "Question:")
"""The question markers of heldout's prompts (BBH's ``Q:``; MMLU-Pro's and HotpotQA's ``Question:``)."""

_T = TypeVar("_T")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def sanitize_text(value: Any) -> str | None:
    """The model output as encodable text, or None when there is no text at all (see module doc)."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", errors="replace")
    if not isinstance(value, str):
        return None
    if type(value) is str and len(value) <= MAX_OUTPUT_CHARS:
        return _sanitize_str(value)
    return _sanitized(value)


_TEXT_MEMOS: list[Any] = []


def text_memo(maxsize: int) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """An ``lru_cache`` for work on an example's or an output's text (a scorer reads an output
    several times; an option list is parsed once per example), registered so that
    :func:`forget_texts` empties it. Rule: every memo that keys on or keeps such a text is a
    ``text_memo``; a session forgets them all before its optimizer starts, so no test example nor
    test output scored earlier in the process (an earlier cell's held-out scoring, a leak
    ablation) is in it while an in-process optimizer runs."""
    def wrap(function: Callable[..., _T]) -> Callable[..., _T]:
        memo = functools.lru_cache(maxsize=maxsize)(function)
        _TEXT_MEMOS.append(memo)
        return memo
    return wrap


def forget_texts() -> None:
    """Empty every :func:`text_memo`: before a session's optimizer starts (see there), and where a
    measurement must read one text again as a new output."""
    for memo in _TEXT_MEMOS:
        memo.cache_clear()


# A verdict sanitises its output, then its task's scorer sanitises what it is given again: the
# second time is a lookup (equal texts have equal results; an output over the cap is not kept).
@text_memo(maxsize=8)
def _sanitize_str(value: str) -> str:
    return _sanitized(value)


def _sanitized(value: str) -> str:
    if type(value) is str and value.isascii() and not _CONTROL.search(value):
        return value  # nothing to replace or drop (most outputs): no copy
    return _CONTROL.sub("", _SURROGATE.sub("\ufffd", value))


_VULGAR = re.compile("[\u00bc-\u00be\u2150-\u215e]")


def _vulgar_fraction(m: re.Match[str]) -> str:
    numerator, _, denominator = unicodedata.normalize("NFKC", m.group(0)).partition("\u2044")
    return f" {numerator}/{denominator}"


def fold(text: str) -> str:
    """NFKC, vulgar fractions as `` n/d`` (a mixed number keeps its space), ``'`` for ``’``."""
    if text.isascii():
        return text  # ASCII is NFKC already and holds no fraction, curly apostrophe or fraction slash
    text = _VULGAR.sub(_vulgar_fraction, text)
    return unicodedata.normalize("NFKC", text).replace("\u2019", "'").replace("\u2044", "/")


# "the/my/final/correct answer is|:|=" anywhere; "Answer:" / "answer =" opening a line; "####".
# The lookahead names every first character a match can have (a word of the first form, the
# second's padding or "answer", "#"), so most positions fail at once: the same matches, found
# in about three quarters of the time.
_CUE = re.compile(
    r"(?=[tmocrfba \t>#*_-])(?:"
    r"\b(?:the|my|our|final|correct|right|best)\s+(?:(?:final|correct|right|best)\s+)?answer\b[\s*_`]*(?:is\b|:|=)"
    r"|(?:^|(?<=\n)|(?<=[.!?]\s))[ \t>#*_-]*answer\b[\s*_`]*[:=]"
    r"|####)",
    re.IGNORECASE,
)
_NEGATION = re.compile(
    r"[\s*_`:]*(?:(?:definitely|certainly|clearly|surely|obviously|actually|probably|really)\s+)?"
    r"(?:not\b|n't\b|never\b|neither\b|none of\b)", re.IGNORECASE)
_NOT_ONLY = re.compile(r"[\s*_`:]*(?:not|n't)\s+(?:only|just|merely)\b", re.IGNORECASE)
_BUT = re.compile(r"\s*[,;]?\s+but\s+(?:rather\s+|instead\s+|it\s+is\s+|it's\s+)?", re.IGNORECASE)
_COMMENTARY = re.compile(
    r"(?:(?:100%|definitely|clearly|certainly|surely|very|quite|most likely|likely|probably|indeed)\s+)*"
    r"(?:correct|right|wrong|incorrect|helpful|clear|obvious|accurate|true to|as follows|as above|above|below|"
    r"given (?:above|below)|shown (?:above|below)|unclear|uncertain|ambiguous|unknown)"
    r"(?:\s*(?:[.,:;!]|$)|\s+(?:because|since|given|as|and|but|based|for|in|to|here|now|then)\b)",
    re.IGNORECASE,
)


def is_negated(segment: str) -> bool:
    """Whether a cue's text opens with a negation (``not``, ``definitely not``, ``never`` ...)."""
    return bool(_NEGATION.match(segment)) and not _NOT_ONLY.match(segment)


def cue_ends(text: str) -> list[int]:
    """Where each answer cue ends, in reading order."""
    return list(_cue_ends(text))


# Every cue holds an anchor: "answer" (any case), or "####". What a cue holds before its "answer"
# (the words of the first form and whitespace, or the second form's padding) is made of these
# characters (and whitespace); the letters' case-insensitive equivalents outside ASCII (dotted and
# dotless i, long s) are named, and tests/test_cue_scan.py checks the set against the regex. No "w"
# is among them, so that text never runs across an "answer".
_BEFORE_ANCHOR = frozenset("themyourfinalcgbsTHEMYOURFINALCGBS\u0130\u0131\u017f>#*_-")
_CUE_FIRST = frozenset("tmocrfbaTMOCRFBA \t>#*_-")  # where _CUE's lookahead lets a match start
_ANSWER = re.compile("answer", re.IGNORECASE)
_ANSWER_TAIL = re.compile(r"answer\b[\s*_`]*(?:is\b|:|=)", re.IGNORECASE)  # how every cue's "answer" goes on
_LONG_RUN = 64  # a longer run before an anchor is searched by the regex itself (one scan, in C)
# an anchor costs about as much to try as the regex's scan of 55 characters (perf/extraction_speed.py's
# cue-dense outputs): with more than one anchor in this many characters, the plain scan is cheaper
_CHARS_PER_ANCHOR = 55


# A task's scorer reads one output several times (published, strict and flexible rules, the run-on
# cut), and the cue scan is most of a read's time on a chain of thought: scanned once per text.
@text_memo(maxsize=32)
def _cue_ends(text: str) -> tuple[int, ...]:
    """The ends of ``_CUE.finditer(text)``'s matches, found by trying the regex only where a match
    can start: in the run of anchor-prefix characters that ends at an anchor. Positions before
    ``pos`` are tried already or hold no match, so each position is tried at most once."""
    anchors = _anchors(text)
    if len(anchors) * _CHARS_PER_ANCHOR > len(text):  # dense anchors: one scan in C costs less
        return tuple(m.end() for m in _CUE.finditer(text))
    ends: list[int] = []
    pos = 0
    for anchor in anchors:
        if anchor < pos:
            continue
        if text[anchor] != "#" and not _ANSWER_TAIL.match(text, anchor):
            pos = anchor + 1  # no cue holds this "answer" ("answering"), nor runs across it to a later one
            continue
        start = anchor
        while start > pos and (text[start - 1] in _BEFORE_ANCHOR or text[start - 1].isspace()):
            start -= 1
        if anchor - start > _LONG_RUN:
            found = _CUE.search(text, start)  # the leftmost match from here, wherever it is
        else:
            found = next((m for p in range(start, anchor + 1)
                          if text[p] in _CUE_FIRST and (m := _CUE.match(text, p))), None)
            if found is None:
                pos = anchor + 1
                continue
        if found is None:
            break
        ends.append(found.end())
        pos = found.end()
    return tuple(ends)


def _anchors(text: str) -> list[int]:
    """Where each "answer" (any case) and each "####" (overlapping ones too) starts, in order."""
    if text.isascii():  # ASCII: lower() keeps every index, and "answer"'s letters have no other case
        lowered, found, k = text.lower(), [], 0
        while (k := lowered.find("answer", k)) >= 0:
            found.append(k)
            k += 6
    else:
        found = [m.start() for m in _ANSWER.finditer(text)]
    k = 0
    while (k := text.find("####", k)) >= 0:
        found.append(k)
        k += 1
    return sorted(found)


@functools.lru_cache(maxsize=16)
def _run_on(markers: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(m[:-1]) + r"\s*:" if m.endswith(":") else re.escape(m) for m in markers)
    return re.compile(rf"\n[ \t]*(?:{alternatives})")


def cut_run_on(text: str, markers: tuple[str, ...] = QUESTION_MARKERS) -> str:
    """Drop an invented next example: after the first cue, the first line opening with a marker."""
    ends = _cue_ends(text)
    if not ends or not markers:
        return text
    run_on = _run_on(tuple(markers)).search(text, ends[0])
    return text[: run_on.start()] if run_on else text


_LATEX_WRAPPERS = re.compile(r"\\(?:boxed|text|textbf|mathrm|mathbf|fbox)\s*\{([^{}]*)\}")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]*?)\s*\}\s*\{\s*([^{}]*?)\s*\}")
_INLINE_MATH = re.compile(r"\$([^$\s]{1,60})\$")


def clean(segment: str) -> str:
    """Remove presentation around an answer: markdown emphasis, code ticks, LaTeX wrappers and
    ``$..$`` math, surrounding quotes, a leading ':', one trailing period."""
    s = _LATEX_FRAC.sub(r"\1/\2", segment)
    for _ in range(3):  # nested wrappers: \boxed{\text{B}}
        s = _LATEX_WRAPPERS.sub(r"\1", s)
    s = _INLINE_MATH.sub(r"\1", s)
    s = s.replace("\\(", " ").replace("\\)", " ").replace("\\[", " ").replace("\\]", " ")
    s = s.replace("\\,", "").replace("\\%", "%").replace("\\$", "$")
    s = s.replace("**", "").replace("__", "").replace("*", "").replace("`", "")
    s = _drop_period(s.strip().lstrip(":").strip())
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'":
        s = _drop_period(s[1:-1].strip())
    return s


def _drop_period(s: str) -> str:
    return s[:-1].rstrip() if s.endswith(".") and not s.endswith("..") else s


def clean_numbers(text: str) -> str:
    return _INLINE_MATH.sub(r"\1", _LATEX_FRAC.sub(r"\1/\2", text)).replace("\\,", "").replace("**", "")


def boxed(text: str) -> list[str]:
    return re.findall(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}", text)


@dataclass(frozen=True)
class CueSegment:
    """The cleaned text one cue introduces. ``negated``: the cue says what the answer is *not*
    (``denied``: the cleaned first sentence after the negation; ``correction``: what follows ``but`` in
    ``not X but Y``, else None); ``both``: ``not only X but (also) Y`` names two answers;
    ``commentary``: the text comments on an answer instead of giving one."""

    text: str
    negated: bool
    commentary: bool
    denied: str = ""
    correction: str | None = None
    both: bool = False
    denies_all: bool = False  # "none of the above": every answer is denied


_NEXT_PARAGRAPH = re.compile(r"\s*(.*?)(?:\n[ \t]*\n|\Z)", re.DOTALL)
MAX_CUES = 64  # the last 64 cues are tried: bounded work on degenerate, repetitive output
MAX_CUE_CHARS = 10_000  # what one cue introduces is read from this much: answers are short, and
# a walk past denials may read MAX_CUES cues, so each must cost little on a 100k-character line
MAX_DENIAL_CHARS = 200  # the answers a denial names are read from this much of its first sentence


def segments_after_cues(text: str) -> Iterator[CueSegment]:
    """The text after each cue, last cue first: the rest of the cue's line, or when that is empty,
    the next paragraph (a block of non-empty lines); at most :data:`MAX_CUE_CHARS` of either."""
    for start in reversed(cue_ends(text)[-MAX_CUES:]):
        line_end = text.find("\n", start, start + MAX_CUE_CHARS)
        line = text[start:start + MAX_CUE_CHARS] if line_end < 0 else text[start:line_end]
        segment = clean(line)
        if not segment and line_end >= 0:
            paragraph = _NEXT_PARAGRAPH.match(text, line_end, line_end + MAX_CUE_CHARS)
            segment = clean(paragraph.group(1)) if paragraph else ""
        not_only, negation = _NOT_ONLY.match(line), _NEGATION.match(line)
        if not_only:  # "not only correct but elegant" comments; "not only (A) but (B)" names two
            yield CueSegment(segment, negated=False, both=True,
                             commentary=bool(_COMMENTARY.match(clean(line[not_only.end():]))))
        elif negation:
            denied, corrected = _split_correction(line[negation.end():])
            yield CueSegment(segment, negated=True, commentary=bool(_COMMENTARY.match(segment)),
                             denied=denied, correction=corrected,
                             denies_all=negation.group(0).lower().endswith("none of"))
        else:
            yield CueSegment(segment, negated=False, commentary=bool(_COMMENTARY.match(segment)))


def _split_correction(rest: str) -> tuple[str, str | None]:
    """``X but Y`` -> (X, Y), ``X`` -> (X, None), cleaned; X is the first sentence of what is
    denied, at most :data:`MAX_DENIAL_CHARS` of it."""
    but = _BUT.search(rest, 0, MAX_DENIAL_CHARS)  # "but" right after a short X, not anywhere
    denied = rest if but is None else rest[:but.start()]
    return clean(first_sentence(denied[:MAX_DENIAL_CHARS])), None if but is None else clean(rest[but.end():])


def first_sentence(segment: str) -> str:
    """The segment up to its first sentence end ("." "!" "?" or ";" followed by a space)."""
    return re.split(r"(?<!\d)[.!?;](?:\s|$)|\n", segment, maxsplit=1)[0]
