"""The fixed example pool of ``lockpicking/six`` and how it was drawn.

The paper's 50 strings are unpublished, so the suite fixes its own, drawn once by
:func:`draw_pool` and stored in ``pool.json`` (the manifest freezes their hashes). The 50 are chosen
so that the aggregate count is informative about the rule table:

* every test vector of the spec is in it;
* every one of the 24 true edges is *decisive* on at least one string (it fires, its target is
  base-valid and no other fired edge hits that target), so dropping any true edge changes a label;
* every edge is also *masked* at least once (fires on a base-invalid target, so it changes nothing);
* several triggers fire together on many strings; every label 0..6 occurs; a few are malformed.

Rebuild (only when the task version changes): ``python -m heldout.benchmarks.lockpicking.rebuild``.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from heldout.benchmarks.lockpicking.rules import CANDIDATE_SETS, TRUTH, Edge, RuleSystem, well_formed

POOL_FILE = Path(__file__).resolve().parent / "pool.json"
PAPER_SIZE = 50
EXTRA_SIZE = 350  # the `generalise` profile: 50 val + 300 test, disjoint from the paper 50
SPEC_VECTORS = ("729405", "429405", "720105", "729155", "729489", "129402", "789405", "729705", "723705",
                "769405", "72940", "72940a", "000000", "999999", "147258")
EXTRA_MALFORMED = ("７２９４０５", "72 405", "7294051", "+72940")
MIN_MULTI_TRIGGER = 12  # strings on which at least three edges' triggers fire


def decisive(system: RuleSystem, program: str) -> set[Edge]:
    """Edges whose removal would change this string's label."""
    fired = system.fired(program)
    hits = Counter(e.target for e in fired)
    return {e for e in fired if hits[e.target] == 1
            and int(program[e.target - 1]) in system.candidate_sets[e.target - 1]}


def masked(system: RuleSystem, program: str) -> set[Edge]:
    """Edges that fire on a target that is base-invalid anyway."""
    return {e for e in system.fired(program) if int(program[e.target - 1]) not in system.candidate_sets[e.target - 1]}


def _biased_string(rng: random.Random) -> str:
    # Uniform digits almost never reach labels above 2; lean on the candidate sets.
    return "".join(str(rng.choice(sorted(s))) if rng.random() < 0.7 else str(rng.randrange(10))
                   for s in CANDIDATE_SETS)


def draw_pool(seed: int = 5) -> dict[str, list[str]]:
    rng = random.Random(seed)
    paper = list(SPEC_VECTORS) + [m for m in EXTRA_MALFORMED[:2]]
    need_decisive = set(TRUTH.edges) - set().union(*(decisive(TRUTH, p) for p in paper if well_formed(p)))
    need_masked = set(TRUTH.edges) - set().union(*(masked(TRUTH, p) for p in paper if well_formed(p)))
    multi = sum(len(TRUTH.fired(p)) >= 3 for p in paper)
    while need_decisive or need_masked or multi < MIN_MULTI_TRIGGER:
        s = _biased_string(rng)
        if s in paper:
            continue
        gain_d, gain_m = decisive(TRUTH, s) & need_decisive, masked(TRUTH, s) & need_masked
        is_multi = len(TRUTH.fired(s)) >= 3 and multi < MIN_MULTI_TRIGGER
        if gain_d or gain_m or (is_multi and len(paper) < PAPER_SIZE - 8):
            paper.append(s)
            need_decisive -= gain_d
            need_masked -= gain_m
            multi += len(TRUTH.fired(s)) >= 3
    # Fill up with strings of the rarest labels so every label 0..6 is well represented.
    while len(paper) < PAPER_SIZE:
        counts = Counter(TRUTH.label(p) for p in paper)
        s = _biased_string(rng)
        if s not in paper and counts[TRUTH.label(s)] <= min(counts.get(k, 0) for k in range(1, 6)):
            paper.append(s)
    if len(paper) != PAPER_SIZE:
        raise RuntimeError(f"drew {len(paper)} strings for the paper profile, wanted {PAPER_SIZE}")
    extra = list(EXTRA_MALFORMED[2:])
    while len(extra) < EXTRA_SIZE:
        s = _biased_string(rng) if rng.random() < 0.8 else f"{rng.randrange(10**6):06d}"
        if s not in paper and s not in extra:
            extra.append(s)
    rng.shuffle(extra)
    return {"paper": paper, "extra": extra}


def load_pool() -> dict[str, list[str]]:
    return json.loads(POOL_FILE.read_text(encoding="utf-8"))


def write_pool(pool: dict[str, list[str]]) -> Path:
    POOL_FILE.write_text(json.dumps(pool, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return POOL_FILE
