"""``constant-search``: tune the numeric literals of a multi-component program, one edit at a time.

A proposal picks one component (at random, among those holding a numeric literal), one literal in
it, and nudges it: an integer by +-1 or +-2, a float by a relative Gaussian step. It needs no
model and knows nothing of the task: every judgement comes from ``evaluate`` on train. With
``width`` N the proposals of N workers are merged component-wise (:mod:`heldout.optimizers.merge`),
so edits of different components combine; edits of one component conflict and are selected."""

from __future__ import annotations

import random
import re

from heldout.optimizers.merge import Parts, width_search

# a literal not glued to a name or another number (so `x2` and `1e5`'s parts stay untouched)
LITERAL = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")


def nudge(text: str, rng: random.Random) -> str | None:
    """``text`` with one numeric literal changed (None: it holds none)."""
    found = list(LITERAL.finditer(text))
    if not found:
        return None
    match = rng.choice(found)
    literal = match.group(0)
    if "." in literal:
        value = float(literal)
        new = repr(value + rng.gauss(0.0, 0.1 * (abs(value) or 1.0)))
    else:
        new = str(int(literal) + rng.choice((-2, -1, 1, 2)))
    return text[:match.start()] + new + text[match.end():]


def propose(parent, parts: Parts, worker: int, rng: random.Random):
    tunable = sorted(name for name, text in parts.items() if LITERAL.search(text))
    if not tunable:
        return None
    name = rng.choice(tunable)
    return {**parent, name: nudge(parent[name], rng)}


def minimum_budget(task: str, train: int, val: int, width: int = 1, stream: int = 0) -> int:
    """The start and one nudged proposal, each on all of train."""
    return 2 * train


def optimize(view, seed: int, width: int = 1, stream: int = 0):
    view.record_event("final_selection", split="train", how="the best train score of the search")
    return width_search(view, seed, propose, width=width, stream=stream)
