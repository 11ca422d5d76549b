"""Extraction as named, composable stages: a *mode* is a sequence of registered stages.

A :class:`Grammar` says how one answer format is read (a letter, a number, a word list ...); a
stage is a named step that reads the prepared text with a grammar and either gives an answer,
refuses (the output's final answer is hedged or negated: no answer, stop), or passes to the next
stage. :data:`MODES` names the stage sequences; :func:`read` runs one of them.

``strict``    ``final_cue_strict``: the final answer cue must be followed by the answer in the
              format's strict form.
``flexible``  ``final_cue_strict``, ``final_cue_loose`` (the format's looser grammar in the final
              cue's text), ``boxed`` (the last ``\\boxed{}``), ``last_candidate`` (the last
              well-formed candidate anywhere; an output that names every option has chosen none).

Both first fold the text and cut a few-shot run-on (:mod:`.text`). The ``published`` mode is not a
stage sequence: it is each family's reference rule, reproduced exactly (:mod:`.reference`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from heldout.benchmarks.extraction.text import (
    QUESTION_MARKERS,
    CueSegment,
    boxed,
    clean,
    cut_run_on,
    fold,
    segments_after_cues,
)

EXTRACTION_MODES: tuple[str, ...] = ("strict", "flexible", "published")
"""Every verdict reports all three, side by side."""

HEADLINE_MODE = "published"
"""The mode whose score is a verdict's ``score`` (see docs/scoring.md for why)."""


@dataclass(frozen=True)
class Grammar:
    """How one answer format is read. Each reader returns the canonical answer or None, and is a
    pure function of its text (a read may ask it twice about one text and use its first answer).

    ``strict``: the cleaned text after a cue starts with the answer in its strict form;
    ``loose``: the first candidate of a looser grammar in that text;
    ``last``: the last well-formed candidate anywhere in the text;
    ``hedged``: the cue's text offers two different answers ("(A) or (B)");
    ``fold``: fold the text first (every format but free-text spans)."""

    name: str
    strict: Callable[[str], Any]
    loose: Callable[[str], Any]
    last: Callable[[str], Any]
    hedged: Callable[[str], bool] = lambda segment: False
    fold: bool = True


@dataclass(frozen=True)
class Reading:
    """What a mode made of an output: the canonical answer, or None and why."""

    answer: Any
    why: str | None = None  # when answer is None: no_output, no_cue, negated, hedged, unreadable


@dataclass
class Context:
    """The prepared text of one output and its final answer cue (computed once per mode)."""

    text: str
    grammar: Grammar
    final: CueSegment | None = field(default=None)


Stage = Callable[[Context], "Reading | None"]
STAGES: dict[str, Stage] = {}


def stage(name: str) -> Callable[[Stage], Stage]:
    """Register a stage under ``name`` (a new mode is a new sequence of registered names)."""
    def register(fn: Stage) -> Stage:
        if name in STAGES:
            raise ValueError(f"extraction stage {name!r} registered twice")
        STAGES[name] = fn
        return fn
    return register


@stage("final_cue_strict")
def _final_cue_strict(ctx: Context) -> Reading | None:
    if ctx.final is None:
        return None
    if ctx.final.both or ctx.grammar.hedged(ctx.final.text):
        return Reading(None, "hedged")
    found = ctx.grammar.strict(ctx.final.text)
    if found is not None:
        return Reading(found)  # the format's own word may hold a "not": "not valid"
    if ctx.final.negated:
        return Reading(None, "negated")
    return None


@stage("final_cue_loose")
def _final_cue_loose(ctx: Context) -> Reading | None:
    if ctx.final is None:
        return None
    found = ctx.grammar.loose(ctx.final.text)
    return Reading(found) if found is not None else None


@stage("boxed")
def _boxed(ctx: Context) -> Reading | None:
    for content in reversed(boxed(ctx.text)):
        found = ctx.grammar.loose(clean(content))
        if found is not None:
            return Reading(found)
    return None


@stage("last_candidate")
def _last_candidate(ctx: Context) -> Reading | None:
    found = ctx.grammar.last(ctx.text)
    return Reading(found) if found is not None else None


MODES: dict[str, tuple[str, ...]] = {
    "strict": ("final_cue_strict",),
    "flexible": ("final_cue_strict", "final_cue_loose", "boxed", "last_candidate"),
}


def check_mode(mode: str) -> None:
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"unknown extraction mode {mode!r}; expected one of {EXTRACTION_MODES}")


def final_cue(text: str, grammar: Grammar) -> CueSegment | None:
    """The cue that introduces the final answer. Cues are read last first; commentary is skipped.
    A *denial* (a negated cue the grammar reads no answer in: "not valid" is an answer, "not (C)"
    is not) is skipped too, and the answers its first sentence names (the first and the last) are
    denied. The final cue is the latest cue that is neither, unless the answer it affirms is
    denied by a later cue (a retraction): then the latest denial is final and the output has no
    answer; the latest denial is also final when no cue affirms anything, and when it says
    ``none of`` (every answer denied). ``not X but Y`` affirms Y when the grammar reads Y."""
    denial, denied = None, set()
    for segment in segments_after_cues(text):
        if segment.commentary:
            continue
        if segment.negated and grammar.strict(segment.text) is None:
            if segment.denies_all:
                return denial or segment
            if segment.correction is None or grammar.strict(segment.correction) is None:
                denial = denial or segment
                denied.update(a for a in (grammar.loose(segment.denied), grammar.last(segment.denied)) if a is not None)
                continue
            segment = replace(segment, text=segment.correction, negated=False)
        affirmed = grammar.strict(segment.text)
        if denial is not None and (affirmed if affirmed is not None else grammar.loose(segment.text)) in denied:
            return denial
        return segment
    return denial


def read(text: str | None, grammar: Grammar, mode: str,
         markers: tuple[str, ...] = QUESTION_MARKERS) -> Reading:
    """Run the stages of ``mode`` (``strict`` or ``flexible``) over sanitised text."""
    return read_modes(text, grammar, (mode,), markers)[mode]


def read_modes(text: str | None, grammar: Grammar, modes: tuple[str, ...],
               markers: tuple[str, ...] = QUESTION_MARKERS) -> dict[str, Reading]:
    """:func:`read` in each of ``modes``, the text prepared and its final cue found once for all."""
    for mode in modes:
        check_mode(mode)
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is a reference rule, not a stage sequence: use the family's scorer")
    if text is None:
        return {mode: Reading(None, "no_output") for mode in modes}
    body = cut_run_on(fold(text) if grammar.fold else text, markers)
    if not body.strip():
        return {mode: Reading(None, "empty") for mode in modes}
    grammar = _remembering(grammar)
    ctx = Context(body, grammar, final_cue(body, grammar))
    return {mode: _run_stages(ctx, MODES[mode]) for mode in modes}


def _remembering(grammar: Grammar) -> Grammar:
    """``grammar`` for one text, each reader remembering what it read: the final-cue rule and the
    stages of every mode read the same cue's text again (readers are pure functions of it)."""
    def remember(reader: Callable[[str], Any]) -> Callable[[str], Any]:
        seen: dict[str, Any] = {}

        def read_once(segment: str) -> Any:
            if segment not in seen:
                seen[segment] = reader(segment)
            return seen[segment]
        return read_once
    return Grammar(grammar.name, remember(grammar.strict), remember(grammar.loose), remember(grammar.last),
                   remember(grammar.hedged), grammar.fold)


def _run_stages(ctx: Context, names: tuple[str, ...]) -> Reading:
    for name in names:
        got = STAGES[name](ctx)
        if got is not None:
            return got
    return Reading(None, "unreadable" if ctx.final is not None else "no_cue")
