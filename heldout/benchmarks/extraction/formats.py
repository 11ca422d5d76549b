"""The grammars of every answer format, registered by name in :data:`FORMATS`.

Each grammar returns answers in the target's canonical form, so ``answer == target`` is the score
rule (with the documented exceptions: yes/no case, numeric tolerance, SQuAD normalisation)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

from heldout.benchmarks.extraction.pipeline import Grammar
from heldout.benchmarks.extraction.text import clean, clean_numbers, first_sentence, is_negated, text_memo

FORMATS: dict[str, Callable[..., Grammar]] = {}
"""Format name -> grammar factory (some take parameters: the letters, the option texts)."""


def register_format(name: str) -> Callable[[Callable[..., Grammar]], Callable[..., Grammar]]:
    def register(factory: Callable[..., Grammar]) -> Callable[..., Grammar]:
        if name in FORMATS:
            raise ValueError(f"answer format {name!r} registered twice")
        FORMATS[name] = factory
        return factory
    return register


def _last(matches: list[Any]) -> Any:
    return matches[-1] if matches else None


def _connected(candidate: str) -> re.Pattern[str]:
    """Two candidates joined by "or" / "and" / "/" / "," (a hedge when they differ)."""
    return re.compile(rf"(?:either\s+)?({candidate})\s*(?:,\s*|\s+)(?:or|and|and/or)\s+"
                      rf"(?:(?:maybe|perhaps|possibly|even|also|just)\s+)?({candidate})"
                      rf"|({candidate})\s*/\s*({candidate})", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# Letter choices (BBH "(A)".."(R)", MMLU-Pro A..J)
# ---------------------------------------------------------------------------------------------

LETTERS = "ABCDEFGHIJKLMNOPQR"
_OPTION_WORD = r"(?:(?:option|choice)\s*)?"


def normalize_option(text: str) -> str:
    """Option text compared without case, punctuation or extra spaces."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


@text_memo(maxsize=4096)
def choice_grammar(letters: str, *, strict_bare: bool, paren_out: bool,
                   options: tuple[str, ...] = ()) -> Grammar:
    """Letters within ``letters``. Strict: "(B)" or "( B )" (uppercase), and when ``strict_bare``
    also "B" standing alone ("B", "B.", "B)"); the option's own text when the options are known.
    Loose: any "(b)" in the cue's text, a bare letter opening it, or the text of one option
    opening it. Last candidate anywhere: "(B)" / "(b)", or a line that is only the letter or
    starts a list item "B) ..." / "B. ..."; a text that names every option has chosen none. A
    capital letter inside prose is never a candidate: "A" is also an article.
    Returns "B", or "(B)" when ``paren_out``."""
    cls = f"[{letters}]"
    cls_any = f"[{letters}{letters.lower()}]"
    option = rf"(?i:{_OPTION_WORD})"
    strict_paren = re.compile(rf"{option}\(\s*({cls})\s*\)")
    strict_bare_re = re.compile(rf"{option}(?:\(\s*({cls})\s*\)|({cls})\)?)(?!\w)")
    paren_any = re.compile(rf"\(\s*({cls_any})\s*\)")
    bare_upper = re.compile(rf"{option}({cls})(?!\w)")
    bare_lower = re.compile(rf"{option}({cls_any})(?:[).:,]|\s*$)")
    letter_line = re.compile(rf"(?i:(?:answer|option|choice)\s*:?\s*)?\(?\s*({cls})\s*\)?[.:]?")
    list_item = re.compile(rf"({cls})[).]\s")
    hedge = _connected(rf"\(\s*{cls_any}\s*\)|\b{cls}\b")
    by_text = {normalize_option(t): letters[i] for i, t in enumerate(options[:len(letters)]) if normalize_option(t)}
    if len(by_text) != len([t for t in options[:len(letters)] if normalize_option(t)]):
        by_text = {}  # two options with the same text: text cannot tell them apart

    def out(letter: str | None) -> str | None:
        if letter is None:
            return None
        return f"({letter.upper()})" if paren_out else letter.upper()

    def from_text(segment: str, *, prefix: bool) -> str | None:
        said = normalize_option(first_sentence(segment) if not prefix else segment)
        if said in by_text:
            return by_text[said]
        if prefix:
            starts = [letter for text, letter in by_text.items() if said.startswith(text + " ") or said == text]
            return starts[0] if len(starts) == 1 else None
        return None

    def strict(segment: str) -> str | None:
        m = (strict_bare_re if strict_bare else strict_paren).match(segment)
        if m:
            return out(next(g for g in m.groups() if g))
        return out(from_text(segment, prefix=False)) if by_text else None

    def loose(segment: str) -> str | None:
        m = paren_any.search(first_sentence(segment)) or paren_any.search(segment)
        if m:
            return out(m.group(1))
        m = bare_upper.match(segment) or bare_lower.match(segment)
        if m:
            return out(m.group(1))
        return out(from_text(segment, prefix=True)) if by_text else None

    def hedged(segment: str) -> bool:
        for m in hedge.finditer(first_sentence(segment)):
            pair = [re.sub(r"[()\s]", "", g).upper() for g in m.groups() if g]
            if len(set(pair)) > 1:
                return True
        return False

    def last(text: str) -> str | None:
        found, named = None, set()
        for raw in text.split("\n"):  # in reading order; a later candidate replaces an earlier one
            line = clean(raw).lstrip("#>-\t ")
            m = list_item.match(line)
            if m:
                found = m.group(1)
                named.add(found)
            for m in paren_any.finditer(raw):
                found = m.group(1).upper()
                named.add(found)
            m = letter_line.fullmatch(line)
            if m:
                found = m.group(1)
        if options and len(options) >= 2 and named >= set(letters[:len(options)]):
            return None  # every option named (an echo of the list): no choice made
        return out(found)

    return Grammar(f"choice[{letters[0]}-{letters[-1]}]", strict, loose, last, hedged)


register_format("choice")(choice_grammar)


# ---------------------------------------------------------------------------------------------
# Numbers (GSM-Hard; BBH integers)
# ---------------------------------------------------------------------------------------------

CURRENCY = "$€£¥₹"
MINUS_SIGNS = "\u2212\u2013\ufe63\uff0d"  # unicode minus, en dash, small/full-width hyphen-minus
# A number token: optional currency, sign, currency again ("$-5", "-$5"), digits with optional
# thousands separators (commas, or spaces between at least three groups: "1 234 567"), optional
# decimals, optional exponent; or a fraction "3/4" / mixed "2 1/2". It may not start inside a word
# or another number ("x2", "3.14.15").
NUMBER = re.compile(
    rf"""(?<![\w.])
    (?P<cur1>[{CURRENCY}]\s?)?
    (?P<sign>[-+{MINUS_SIGNS}])?
    (?P<cur2>[{CURRENCY}]\s?)?
    (?:
        (?:(?P<whole>\d+)[ ](?=\d+/))?(?P<num>\d+)\s*/\s*(?P<den>\d+)(?![\d/]|\.\d)
      | (?P<int>\d{{1,3}}(?:,\d{{3}})+(?!\d)|\d{{1,3}}(?:[ ]\d{{3}}){{2,}}(?![\d/])|\d+)
        (?P<frac>\.\d+)?(?P<exp>[eE][-+]?\d+)?
      | (?P<lead>\.\d+)
    )
    (?!\w*\.\d)""",
    re.VERBOSE,
)
_ONE_SPACE_GROUP = re.compile(rf"[{CURRENCY}]?[-+{MINUS_SIGNS}]?[{CURRENCY}]?\d{{1,3}} \d{{3}}(?:\.\d+)?")


@dataclass(frozen=True)
class Number:
    """A number as written; two are the same answer when their values are equal ("12" is "12.0")."""

    value: Decimal
    decimals: int | None = field(compare=False)  # digits written after the point; None for fractions / exponents


def read_number(m: re.Match[str], *, fractions: bool = True, exponents: bool = True) -> Number | None:
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
            digits = re.sub("[, ]", "", m.group("int")) + (m.group("frac") or "") + (m.group("exp") or "")
            value = Decimal(digits)
            decimals = None if m.group("exp") else len(m.group("frac") or ".") - 1
    except (InvalidOperation, ValueError):
        return None
    if not value.is_finite():
        return None
    return Number(value.copy_negate() if negative else value, decimals)  # exact, no rounding


@lru_cache(maxsize=None)
def number_grammar(*, fractions: bool = True, exponents: bool = True) -> Grammar:
    def readm(m: re.Match[str]) -> Number | None:
        return read_number(m, fractions=fractions, exponents=exponents)

    def strict(segment: str) -> Number | None:
        segment = segment.replace("$ ", "$")
        whole = _ONE_SPACE_GROUP.fullmatch(segment)  # "1 234" alone after the cue is one number
        if whole:
            segment = segment.replace(" ", "")
        m = NUMBER.match(segment)
        return readm(m) if m else None

    def loose(segment: str) -> Number | None:
        for m in NUMBER.finditer(segment):
            got = readm(m)
            if got is not None:
                return got
        return None

    def last(text: str) -> Number | None:
        return _last([n for n in (readm(m) for m in NUMBER.finditer(clean_numbers(text))) if n is not None])

    hedge = re.compile(r"(?:either\s+)?[-+$\d][\d,.]*\s+or\s+[-+$]?\d", re.IGNORECASE)

    def hedged(segment: str) -> bool:
        return bool(hedge.match(first_sentence(segment)))

    return Grammar("number", strict, loose, last, hedged)


register_format("number")(number_grammar)


def canonical_integer(n: Number) -> str:
    # Decimal formatting, not int(): a 5,000-digit "answer" must not hit int's str limit.
    value = n.value
    if value == value.to_integral_value():
        magnitude = format(value.to_integral_value().copy_abs(), "f")
        return "-" + magnitude if value < 0 else magnitude
    return format(value, "f")  # extracted but not an integer: scores 0


@register_format("integer")
@lru_cache(maxsize=None)
def integer_grammar() -> Grammar:
    numbers = number_grammar(fractions=False, exponents=False)

    def wrap(reader: Callable[[str], Any]) -> Callable[[str], str | None]:
        def inner(s: str) -> str | None:
            got = reader(s)
            return canonical_integer(got) if got is not None else None
        return inner

    return Grammar("integer", wrap(numbers.strict), wrap(numbers.loose), wrap(numbers.last), numbers.hedged)


# ---------------------------------------------------------------------------------------------
# Words (BBH true/false, yes/no, valid/invalid)
# ---------------------------------------------------------------------------------------------

WORDS: dict[str, dict[str, str]] = {
    "true_false": {"true": "True", "false": "False"},
    "yes_no": {"yes": "Yes", "no": "No"},
    "valid_invalid": {"valid": "valid", "invalid": "invalid", "not valid": "invalid"},
}


@lru_cache(maxsize=None)
def _word_grammar(fmt: str) -> Grammar:
    words: Mapping[str, str] = WORDS[fmt]
    alternatives = "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in sorted(words, key=len, reverse=True))
    start = re.compile(rf"({alternatives})\b", re.IGNORECASE)
    anywhere = re.compile(rf"\b({alternatives})\b", re.IGNORECASE)
    hedge = _connected(alternatives)

    def canon(word: str) -> str:
        return words[re.sub(r"\s+", " ", word.lower())]

    def strict(segment: str) -> str | None:
        m = start.match(segment)
        return canon(m.group(1)) if m and not hedged(segment) else None

    def loose(segment: str) -> str | None:
        m = anywhere.search(segment)
        return canon(m.group(1)) if m else None

    def last(text: str) -> str | None:
        return _last([canon(m.group(1)) for m in anywhere.finditer(text.replace("*", ""))])

    def hedged(segment: str) -> bool:
        return any(len({canon(g) for g in m.groups() if g}) > 1 for m in hedge.finditer(first_sentence(segment)))

    return Grammar(fmt, strict, loose, last, hedged)


for _fmt in WORDS:
    register_format(_fmt)(lambda _f=_fmt: _word_grammar(_f))


# ---------------------------------------------------------------------------------------------
# Word lists (BBH word_sorting) and closing brackets (BBH dyck_languages)
# ---------------------------------------------------------------------------------------------

# Words of a word list: letters/digits with inner apostrophes or ampersands ("o'connell", "r&d").
_WORD = re.compile(r"[a-z0-9]+(?:['&][a-z0-9]+)*")
_LIST_MARKER = re.compile(r"^\s*(?:\d+[.)]|[-*\u2022])\s+", re.MULTILINE)
_INLINE_MARKER = re.compile(r"(?:^|(?<=\s))\d+[.)]\s+")


def normalize_word_list(text: str) -> str:
    """Canonical word list: lower-case words joined by single spaces. Commas, quotes, brackets,
    list markers ("1.", "-", also inline "1. a 2. b") and other punctuation between words are
    dropped; apostrophes and ampersands inside a word are kept ("o'connell", "it&t")."""
    text = _LIST_MARKER.sub(" ", text)
    if len(_INLINE_MARKER.findall(text)) >= 2:  # "1. apple 2. banana 3. cherry" on one line
        text = _INLINE_MARKER.sub(" ", text)
    return " ".join(_WORD.findall(text.lower()))


@register_format("word_list")
@lru_cache(maxsize=None)
def word_list_grammar() -> Grammar:
    def from_segment(segment: str) -> str | None:
        # "The answer is: a b c" / "sorted list: a b c" -> after the last colon of the line;
        # one explanatory sentence after the list is cut at the first sentence end.
        if ":" in segment.split("\n", 1)[0]:
            head, _, rest = segment.partition("\n")
            segment = head.rsplit(":", 1)[1] + ("\n" + rest if rest else "")
        segment = _LIST_MARKER.sub(" ", segment)
        if len(_INLINE_MARKER.findall(segment)) >= 2:
            segment = _INLINE_MARKER.sub(" ", segment)
        segment = re.split(r"[.!?](?:\s|$)", segment, maxsplit=1)[0]
        return normalize_word_list(segment) or None

    def last(text: str) -> str | None:
        blocks = [b for b in re.split(r"\n\s*\n", text.strip()) if b.strip()]
        if not blocks:
            return None
        lines = [clean(line) for line in blocks[-1].split("\n") if line.strip()]
        if len(lines) > 1 and all(_LIST_MARKER.match(line + " ") for line in lines):
            return normalize_word_list("\n".join(lines)) or None
        return from_segment(lines[-1]) if lines else None

    return Grammar("word_list", from_segment, from_segment, last)


_CLOSING_RUN = re.compile(r"[)\]}>](?:[\s,'\"]*[)\]}>])*")


@register_format("dyck")
@lru_cache(maxsize=None)
def dyck_grammar() -> Grammar:
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

    return Grammar("dyck", strict, loose, last)


# ---------------------------------------------------------------------------------------------
# Free text (HotpotQA spans; the three BBH targets that are option text)
# ---------------------------------------------------------------------------------------------

_BARE_CUE = re.compile(r"(?:so,?\s+)?(?:the\s+)?(?:final\s+|correct\s+)?answer(?:\s+is)?\s*:?", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?]\s+(?=[A-Z\"'(])")
_ABBREVIATION = re.compile(r"(?:(?:^|[\s(])[A-Z]|\b(?:St|Mt|Dr|Mr|Mrs|Ms|Jr|Sr|Ft|No|Co|Inc|Ltd|Corp|vs|Vol|Op))$")


def _first_span_sentence(line: str) -> str:
    """The line up to its first sentence end: "Paris. I hope this helps" -> "Paris"; an initial or
    a common abbreviation before the period is no end ("J. R. R. Tolkien", "No. 2", "St. Louis")."""
    for m in _SENTENCE_END.finditer(line):
        if not _ABBREVIATION.search(line[:m.start()]):
            return line[:m.start() + 1]
    return line


@register_format("span")
@lru_cache(maxsize=None)
def span_grammar() -> Grammar:
    """The rest of the final cue's line (markdown, quotes and one trailing period removed); the
    last non-empty line of the text as the last candidate (a one-line answer is the whole text).
    Not folded: the official normalisation compares spans as written. No hedge rule: 16 of the 302
    HotpotQA gold answers contain "and" ("Love and Theft"), one contains "or"."""
    def from_segment(segment: str) -> str | None:
        line = clean(_first_span_sentence(segment.split("\n", 1)[0].strip()))
        return line if line and not is_negated(line) else None

    def last(text: str) -> str | None:
        lines = [clean(line) for line in text.strip().split("\n") if clean(line) and not _BARE_CUE.fullmatch(clean(line))]
        return lines[-1] if lines else None

    return Grammar("span", from_segment, from_segment, last, fold=False)


def choice_options(question: str) -> tuple[str, ...]:
    """The option texts of a BBH question ("Options:\\n(A) text\\n(B) text"), in letter order;
    () when the question lists none."""
    _, sep, tail = question.rpartition("Options:")
    if not sep:
        return ()
    found = re.findall(r"^\(([A-R])\)\s*(.*?)\s*$", tail, re.MULTILINE)
    letters = [letter for letter, _ in found]
    if letters != list(LETTERS[:len(letters)]):
        return ()
    return tuple(text for _, text in found)


def options_grammar(n_options: int, options: Sequence[str] = (), *, paren_out: bool) -> Grammar:
    return choice_grammar(LETTERS[:n_options], strict_bare=not paren_out, paren_out=paren_out,
                          options=tuple(options))
