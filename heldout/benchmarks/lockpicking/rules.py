"""The Lockpicking-with-interference rule engine (ground truth of ``lockpicking/six``).

A :class:`RuleSystem` is a rule table: six candidate sets plus trigger -> target edges. The label
of a string is the number of positions that are base-valid and not invalidated by any edge whose
trigger matches the *original* digit (so edge order never matters); a string that is not exactly
six ASCII digits has label 0. :data:`TRUTH` is the hidden system of ../shared/specs/lockpicking.md;
other tables (the seed's, surrogates) are the same type, which is how tests build look-alikes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

N_POSITIONS = 6
N_STRINGS = 10**N_POSITIONS
_ASCII_DIGITS = frozenset("0123456789")


@dataclass(frozen=True)
class Edge:
    """When position ``trigger`` (1-based) holds ``digit``, position ``target`` is invalidated."""

    trigger: int
    digit: int
    target: int

    def __post_init__(self) -> None:
        if not (1 <= self.trigger <= N_POSITIONS and 1 <= self.target <= N_POSITIONS and 0 <= self.digit <= 9):
            raise ValueError(f"bad edge {self}")

    def __str__(self) -> str:
        return f"P{self.trigger}={self.digit} -> P{self.target}"


def well_formed(program: str) -> bool:
    """Rule 1: exactly six ASCII digits (Unicode digits such as full-width ones do not count)."""
    return isinstance(program, str) and len(program) == N_POSITIONS and set(program) <= _ASCII_DIGITS


@dataclass(frozen=True)
class RuleSystem:
    """Candidate sets (one per position) and the invalidation edges."""

    candidate_sets: tuple[frozenset[int], ...]
    edges: frozenset[Edge]

    def __post_init__(self) -> None:
        if len(self.candidate_sets) != N_POSITIONS:
            raise ValueError("a rule system needs one candidate set per position")

    def with_edges(self, add: tuple[Edge, ...] = (), remove: tuple[Edge, ...] = ()) -> "RuleSystem":
        return RuleSystem(self.candidate_sets, (self.edges - set(remove)) | set(add))

    def fired(self, program: str) -> list[Edge]:
        """The edges whose trigger matches (empty for a malformed string)."""
        if not well_formed(program):
            return []
        return sorted((e for e in self.edges if int(program[e.trigger - 1]) == e.digit),
                      key=lambda e: (e.trigger, e.digit, e.target))

    def positions(self, program: str) -> tuple[bool, ...]:
        """Per position: base-valid and not invalidated (all False for a malformed string)."""
        if not well_formed(program):
            return (False,) * N_POSITIONS
        killed = {e.target for e in self.fired(program)}
        return tuple(int(d) in self.candidate_sets[i] and (i + 1) not in killed
                     for i, d in enumerate(program))

    def label(self, program: str) -> int:
        return sum(self.positions(program))

    def labels_all(self) -> np.ndarray:
        """Labels of all 10^6 six-digit strings, indexed by their integer value ("000123" -> 123)."""
        digits = all_digits()
        valid = np.stack([np.isin(digits[:, i], sorted(s)) for i, s in enumerate(self.candidate_sets)], axis=1)
        for e in self.edges:
            valid[:, e.target - 1] &= digits[:, e.trigger - 1] != e.digit
        return valid.sum(axis=1).astype(np.int8)

    @cached_property
    def killers(self) -> dict[int, list[tuple[int, int]]]:
        """Per target position, the (trigger position, digit) pairs that invalidate it."""
        out: dict[int, list[tuple[int, int]]] = {p: [] for p in range(1, N_POSITIONS + 1)}
        for e in sorted(self.edges, key=lambda e: (e.trigger, e.digit)):
            out[e.target].append((e.trigger, e.digit))
        return out


_DIGITS_CACHE: list[np.ndarray] = []


def all_digits() -> np.ndarray:
    """(10^6, 6) array of the digits of every six-digit string, row k = ``f"{k:06d}"``."""
    if not _DIGITS_CACHE:
        k = np.arange(N_STRINGS, dtype=np.int32)
        _DIGITS_CACHE.append(np.stack([(k // 10 ** (N_POSITIONS - 1 - i)) % 10 for i in range(N_POSITIONS)],
                                      axis=1).astype(np.int8))
    return _DIGITS_CACHE[0]


def _table(rows: list[tuple[int, int, int, int]]) -> frozenset[Edge]:
    return frozenset(Edge(t, d, target) for t, d, a, b in rows for target in (a, b))


CANDIDATE_SETS: tuple[frozenset[int], ...] = (
    frozenset({1, 4, 7}), frozenset({2, 6, 8}), frozenset({0, 3, 9}),
    frozenset({1, 4, 7}), frozenset({0, 5, 8}), frozenset({2, 5, 9}),
)

# The twelve trigger rules of the spec: (trigger position, digit, target, target).
TRIGGER_RULES: tuple[tuple[int, int, int, int], ...] = (
    (1, 4, 2, 6), (1, 1, 3, 5), (2, 8, 1, 3), (2, 6, 4, 5), (3, 3, 1, 2), (3, 0, 4, 6),
    (4, 7, 2, 3), (4, 1, 5, 6), (5, 5, 1, 4), (5, 8, 2, 6), (6, 2, 1, 3), (6, 9, 4, 5),
)

TRUTH = RuleSystem(CANDIDATE_SETS, _table(list(TRIGGER_RULES)))
"""The hidden rule system: six candidate sets, twelve rules, 24 edges."""

SEED_RULES = RuleSystem(CANDIDATE_SETS, _table([TRIGGER_RULES[0]]))
"""What the seed candidate knows: every candidate set, only rule 1 (P1 = 4 -> P2, P6)."""

MALFORMED: tuple[str, ...] = (
    "", "7", "72940", "7294051", "72940a", "a29405", " 729405", "729405 ", "729405\n", "\n729405",
    "+72940", "-72940", "72.405", "7,9405", "72 405", "0x1234", "1e5000", "７２９４０５", "٧٢٩٤٠٥",
    "729405729405", "null", "NULL", "\t72940", "72940\x00", "abcdef", "ZZZZZZ", "１２３４５６", "²²²²²²",
)
"""Malformed strings for the exhaustive check (every one has label 0), including look-alikes that
naive checks accept: Unicode digits, surrounding whitespace, signs, a trailing newline."""
