"""The readings of the topic-shared ablation: a table of rules over the decided signs
(:data:`READINGS`, first match wins, total over the 3**4 sign patterns) and the sentences each
method's reading is written in (:func:`reading`): the headline from the signs alone, then the
numbers it was read from, the answer key and the validation gain beside the held-out one. On a
profile not proven topic-disjoint the held-out row is never called "held-out topics"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from heldout.contracts import HeldoutError
from heldout.protocols.decide import replicates_nothing
from heldout.protocols.leak_statistics import MethodAblation, SubsetGain


READING_AXES = ("exact training questions", "fresh questions of memorised families",
                "fresh questions of other trained families", "held-out topics")
"""The four signs a reading is read from, in order: exact (``train_encoded`` when the candidate
holds a key, else ``train``), ``probe_memorised``, ``probe_other``, ``test``. Each is the sign of
that row's seed-paired contrast after Holm ("0" when undecided or empty)."""


@dataclass(frozen=True)
class ReadingRule:
    """One reading: the signs it applies to (per axis, the set of signs allowed) and its words.
    ``with_key`` replaces ``text`` when the candidate holds an answer key, ``without_key`` when it
    holds none (a gain on training questions without a key is no memorisation of one);
    ``unproven`` replaces it when the profile is not proven topic-disjoint (a held-out gain then
    cannot tell a rule from a topic-level key)."""

    name: str
    pattern: tuple[str, str, str, str]
    text: str
    with_key: str | None = None
    unproven: str | None = None
    without_key: str | None = None

    def matches(self, signs: Sequence[str]) -> bool:
        return all(s in allowed for s, allowed in zip(signs, self.pattern))


READINGS: tuple[ReadingRule, ...] = (
    ReadingRule("transfer", ("+0", "+0", "+0", "+"),
                "The gain transfers to held-out topics: a rule, not a key.",
                with_key="The gain transfers to held-out topics: the candidate holds a rule beside its key.",
                unproven="The gain reaches the held-out split, but that split is not proven topic-disjoint, "
                         "so it cannot tell a rule from a topic-level key."),
    ReadingRule("transfer-mixed", ("+-0", "+-0", "+-0", "+"),
                "Held-out topics gain while other subsets lose: neither a clean rule nor a key."),
    ReadingRule("key-displaces-rule", ("+", "+-0", "+-0", "-"),
                "Memorisation pays on the exact training questions while held-out topics lose: "
                "the key displaced what generalised.",
                without_key="The training questions gain while held-out topics lose, with no answer key in the "
                            "candidate: a training-split gain that did not generalise, not a key."),
    ReadingRule("worse", ("-0", "+-0", "+-0", "-"),
                "The final candidate is worse than the baseline on held-out topics."),
    ReadingRule("topic-level-key", ("+0", "+", "0", "0"),
                "Memorisation pays at the topic level: fresh questions of the memorised families gain, "
                "held-out topics do not (a topic-level answer key)."),
    ReadingRule("topic-shared", ("+0", "+0", "+", "0"),
                "Fresh questions of trained families gain, held-out topics do not: the gain stays "
                "within the training topics (topic-level), it is not a rule that reaches new topics."),
    ReadingRule("exact-only", ("+", "0", "0", "0"),
                "Memorisation pays on the exact training questions only.",
                without_key="Only the training questions gain, and the candidate holds no answer key: a "
                            "training-split gain, not memorisation of a key."),
    ReadingRule("nothing", ("0", "0", "0", "0"),
                "No subset separates from the baseline."),
    ReadingRule("mixed", ("+-0", "+-0", "+-0", "0"),
                "Held-out topics do not separate and the other subsets disagree: no single reading."),
)
"""First match wins; every one of the 3**4 sign patterns matches one rule
(``tests/test_leak_readings.py`` enumerates them and checks no reading contradicts its signs)."""


def reading_rule(signs: Sequence[str]) -> ReadingRule:
    """The first rule of :data:`READINGS` whose pattern admits ``signs``."""
    for rule in READINGS:
        if rule.matches(signs):
            return rule
    raise HeldoutError(f"no reading for signs {tuple(signs)}")  # the table is total; a test proves it


HELD_OUT_ROW = {True: "held-out topics", False: "the held-out split (topics not proven disjoint)"}
"""What the ``test`` row is called: "held-out topics" only on a profile proven topic-disjoint."""


def axis_names(topic_disjoint: bool) -> tuple[str, ...]:
    """:data:`READING_AXES`, with the held-out row named for what it is on this profile."""
    return READING_AXES[:3] + (HELD_OUT_ROW[topic_disjoint],)


def headline(signs: Sequence[str], *, has_key: bool, topic_disjoint: bool) -> str:
    """The reading's first sentences from the signs alone: a loud NOT PROVEN when the profile is
    not proven topic-disjoint, the rule's words, and which axes were decided higher / lower. On
    such a profile the held-out row is never called "held-out topics"."""
    rule = reading_rule(signs)
    text = rule.text
    if has_key and rule.with_key:
        text = rule.with_key
    elif not has_key and rule.without_key:
        text = rule.without_key
    if not topic_disjoint and rule.unproven:
        text = rule.unproven
    if not topic_disjoint:
        text = text.replace("held-out topics", HELD_OUT_ROW[False]).replace("Held-out topics",
                                                                             "The held-out split")
    axes = axis_names(topic_disjoint)
    higher = [a for a, s in zip(axes, signs) if s == "+"]
    lower = [a for a, s in zip(axes, signs) if s == "-"]
    decided = (f" Decided higher on: {', '.join(higher)}." if higher else "") + \
              (f" Decided lower on: {', '.join(lower)}." if lower else "")
    prefix = "" if topic_disjoint else "NOT PROVEN topic-disjoint (split check): "
    return prefix + text + decided


SEED_BLIND = ("Every seed ended on the same candidate (seed-blind): the seeds replicate nothing, so no row has a "
              "seed-level verdict and each number below is one run's.")


def reading_signs(m: MethodAblation) -> tuple[tuple[str, str, str, str], bool]:
    """The four signs of :data:`READING_AXES` for ``m`` and whether its candidates hold a key."""
    encoded = m.row("train_encoded")
    has_key = any(s > 0 for s in m.key_share) and encoded.gain is not None
    exact = encoded if has_key else m.row("train")
    rows = (exact, m.row("probe_memorised"), m.row("probe_other"), m.row("test"))
    return tuple(r.sign for r in rows), has_key  # type: ignore[return-value]


def reading(m: MethodAblation) -> str:
    """The reading in words: the headline from the sign table (:data:`READINGS`), then the
    numbers it was read from, the key, and the validation gain beside the held-out one (numbers
    only: the validation gain is the optimizer's own selection score, not a verdict)."""
    signs, has_key = reading_signs(m)
    rule = reading_rule(signs)
    test, exact = m.row("test"), (m.row("train_encoded") if has_key else m.row("train"))
    mem, other = m.row("probe_memorised"), m.row("probe_other")
    contrasts = [r.seed_contrast for r in m.rows if r.seed_contrast is not None]
    blind = bool(contrasts) and all(c.replayed for c in contrasts)
    held_out = HELD_OUT_ROW[m.topic_disjoint]
    if blind:
        parts = [("" if m.topic_disjoint else "NOT PROVEN topic-disjoint (split check): ") + SEED_BLIND]
    else:
        parts = [headline(signs, has_key=has_key, topic_disjoint=m.topic_disjoint)]
        if rule.name == "exact-only":
            # "only" must not stand beside an undecided gain on another subset
            rest = [(a, r) for a, r in zip(axis_names(m.topic_disjoint)[1:], (mem, other, test))
                    if r.gain is not None and r.gain > 1e-12]
            if rest:
                parts[0] = parts[0].replace(" only.", ";").replace("Only the training questions gain",
                                                                    "The training questions gain")
                parts.append("Not only there: " + ", ".join(f"{a} gain {r.gain:+.3f}" for a, r in rest)
                             + ", undecided at these seeds.")
    parts.append(f"Exact training questions {_fmt(exact)}, fresh questions of memorised families {_fmt(mem)}, "
                 f"of other trained families {_fmt(other)}, {held_out} {_fmt(test)}.")
    if has_key:
        parts.append(f"Answer key in the final candidate ({np.mean(m.key_share):.0%} of its words on average, "
                     f"{max(m.families_memorised)} famil(ies) memorised at most).")
        if signs[0] == "0":
            parts.append(_key_sentence(exact))
    else:
        parts.append("No answer key found in the final candidate(s).")
    if m.val_gain is not None and test.gain is not None:
        if m.val_gain > test.gain + 1e-9:
            ratio = f", {m.val_gain / test.gain:.1f}x" if test.gain > 0 else ""
            parts.append(f"Validation gain {m.val_gain:+.3f} overstates the held-out gain {test.gain:+.3f}{ratio}.")
        else:
            parts.append(f"Validation gain {m.val_gain:+.3f} does not overstate the held-out gain {test.gain:+.3f}.")
    m.reading_rule = "seed-blind" if blind else rule.name
    return " ".join(parts)


def _fmt(row: SubsetGain) -> str:
    if row.gain is None:
        return "n/a (no examples)"
    c = row.seed_contrast
    if c is not None and replicates_nothing(c):
        # one run re-scored by every seed: its per-question evidence, never a seed-level p
        ev = (f", one run: {c.changed[0]} up / {c.changed[1]} down, per-question p {c.p:.3g}"
              if c.changed is not None else ", one run re-scored by every seed")
        return f"{row.gain:+.3f} (n={row.n_examples}{ev})"
    holm_p = "" if c is None else f", Holm p {c.p_holm:.3g}"
    return f"{row.gain:+.3f} (n={row.n_examples}, {row.n_seeds} seeds{holm_p})"


def _key_sentence(exact: SubsetGain) -> str:
    """What the key earns on the questions it encodes when that row is not decided: "nothing
    measurable" only when the row's own numbers agree (no replayed run, p not below alpha)."""
    c = exact.seed_contrast
    gain = exact.gain or 0.0
    if c is not None and replicates_nothing(c):
        if c.changed is not None and c.p < c.alpha:
            return (f"On the questions it encodes the key gains {gain:+.3f} in this one run ({c.changed[0]} up, "
                    f"{c.changed[1]} down, per-question p {c.p:.3g}): overwhelming for the run, untested for the "
                    "method (the seeds cannot separate what they do not replicate).")
        return (f"On the questions it encodes the key's gain {gain:+.3f} is one run's and not beyond chance even "
                "there.")
    if c is not None and c.p_holm < c.alpha:
        return (f"On the questions it encodes the key gains {gain:+.3f} (Holm p {c.p_holm:.3g}), but its seed-level "
                "interval includes 0: not separated.")
    return "The key earns nothing measurable even on the questions it encodes."


__all__ = ["HELD_OUT_ROW", "READINGS", "READING_AXES", "SEED_BLIND", "ReadingRule", "axis_names", "headline",
           "reading", "reading_rule", "reading_signs"]
