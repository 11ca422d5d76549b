"""``lockpicking-search``: hill climbing over rule tables that emits SQL candidates.

It reads the seed SQL's candidate sets and trigger edges (what the seed states), proposes the one
edge change (add or drop a trigger -> target edge) that best explains the train counts under its
own table, and keeps it when ``evaluate`` (the aggregate per-example counts) says the table got no
worse. Uses nothing but the view: train inputs and targets, and evaluate(). (It borrows the task's
rule-table type and SQL writer, never its hidden table.)

With ``width`` given, the same moves run through :func:`heldout.optimizers.merge.width_search`:
the table is decomposed into one part per target position (its trigger edges), worker ``k``
proposes the ``k``-th best move for the parent (further down the ranking each time the parent
stays), and moves on different positions merge. ``width=1`` is the serial hill climb on those
proposals."""

from __future__ import annotations

import random
import re

from heldout.benchmarks.lockpicking.rules import N_POSITIONS, Edge, RuleSystem
from heldout.benchmarks.lockpicking.sql import rule_table_sql
from heldout.optimizers.evaluation import oriented_train_score
from heldout.optimizers.merge import Decomposition, Parts, width_search

_SET = re.compile(r"SUBSTR\(PROGRAM, (\d), 1\) IN \(([^)]*)\)")
_KILL = re.compile(r"SUBSTR\(PROGRAM, (\d), 1\) <> '(\d)'")


def parse_seed(sql: str) -> RuleSystem:
    """The candidate sets and edges of a SQL body in the seed's (one IFF per position) shape."""
    sets: list[frozenset[int]] = [frozenset() for _ in range(N_POSITIONS)]
    edges: set[Edge] = set()
    for line in sql.splitlines():
        found = _SET.search(line)
        if not found:
            continue
        target = int(found.group(1))
        sets[target - 1] = frozenset(int(d) for d in re.findall(r"'(\d)'", found.group(2)))
        edges |= {Edge(int(t), int(d), target) for t, d in _KILL.findall(line)}
    return RuleSystem(tuple(sets), frozenset(edges))


def decomposition(candidate_sets: tuple[frozenset[int], ...]) -> Decomposition:
    """One part per target position: its trigger edges as ``"trigger:digit"`` words."""

    def split(candidate) -> Parts:
        table = parse_seed(candidate["scorer.sql"])
        return {f"P{g}": " ".join(f"{e.trigger}:{e.digit}" for e in sorted(
            table.edges, key=lambda e: (e.trigger, e.digit)) if e.target == g) for g in range(1, N_POSITIONS + 1)}

    def join(parts: Parts):
        edges = {Edge(int(t), int(d), int(name[1:])) for name, text in parts.items()
                 for t, d in (word.split(":") for word in text.split())}
        return {"scorer.sql": rule_table_sql(RuleSystem(candidate_sets, frozenset(edges)))}

    return Decomposition(split, join)


MINIBATCH = 10
SHORTLIST = 3


def optimize(view, seed: int, width: int | None = None, stream: int = 0):
    """Each step: shortlist the few edge toggles that best explain the train counts under the
    optimizer's own table, try them in a seeded random order, and keep the first one the
    evaluator's counts on a seeded train minibatch do not reject. The seed drives the minibatches
    and the proposal order, so different seeds search differently. ``width`` (and ``stream``)
    select the merged width search instead (see :func:`_optimize_width`)."""
    if width is not None:
        return _optimize_width(view, seed, width, stream)
    rng = random.Random(seed)
    table = parse_seed(view.seed_candidate["scorer.sql"])
    train = view.train
    ids = [ex["id"] for ex in train]
    batch_size = min(MINIBATCH, len(ids))

    def score(system: RuleSystem, batch: list[str]) -> float | None:
        return oriented_train_score(view, {"scorer.sql": rule_table_sql(system)}, batch)

    def local_accuracy(system: RuleSystem) -> int:
        return sum(system.label(ex["input"]["program"]) == ex["target"] for ex in train)

    def toggled(system: RuleSystem, edge: Edge) -> RuleSystem:
        return system.with_edges(remove=(edge,)) if edge in system.edges else system.with_edges(add=(edge,))

    moves = [Edge(t, d, g) for t in range(1, 7) for d in range(10) for g in range(1, 7) if t != g]
    rejected: set[Edge] = set()
    while view.remaining >= 2 * batch_size:  # ends when the budget runs out or no move helps on train
        here = local_accuracy(table)
        if here == len(train):
            break
        ranked = sorted(((local_accuracy(toggled(table, m)), m) for m in moves if m not in rejected),
                        key=lambda pair: pair[0], reverse=True)
        shortlist = [m for acc, m in ranked[:SHORTLIST] if acc > here]
        if not shortlist:
            break
        rng.shuffle(shortlist)
        batch = rng.sample(ids, batch_size)
        current = score(table, batch)
        if current is None:
            break
        for move in shortlist:
            got = score(toggled(table, move), batch)
            if got is None:
                return {"scorer.sql": rule_table_sql(table)}
            if got >= current:
                table = toggled(table, move)
                break
            rejected.add(move)
    return {"scorer.sql": rule_table_sql(table)}


def _optimize_width(view, seed: int, width: int, stream: int):
    train = view.train
    candidate_sets = parse_seed(view.seed_candidate["scorer.sql"]).candidate_sets
    moves = [Edge(t, d, g) for t in range(1, 7) for d in range(10) for g in range(1, 7) if t != g]
    rankings: dict[str, list[Edge]] = {}
    asked: dict[tuple[str, int], int] = {}

    def local_accuracy(system: RuleSystem) -> int:
        return sum(system.label(ex["input"]["program"]) == ex["target"] for ex in train)

    def toggled(system: RuleSystem, edge: Edge) -> RuleSystem:
        return system.with_edges(remove=(edge,)) if edge in system.edges else system.with_edges(add=(edge,))

    def propose(parent, parts, worker: int, rng: random.Random):
        sql = parent["scorer.sql"]
        table = parse_seed(sql)
        if sql not in rankings:  # the moves that explain the train counts better, best first
            here = local_accuracy(table)
            scored = [(local_accuracy(toggled(table, m)), rng.random(), m) for m in moves]
            rankings[sql] = [m for top, _, m in sorted(scored, key=lambda x: (-x[0], x[1])) if top > here]
        repeat = asked.get((sql, worker), 0)
        asked[(sql, worker)] = repeat + 1
        index = worker + width * repeat
        if index >= len(rankings[sql]):
            return None
        return {"scorer.sql": rule_table_sql(toggled(table, rankings[sql][index]))}

    start = {"scorer.sql": rule_table_sql(parse_seed(view.seed_candidate["scorer.sql"]))}
    return width_search(view, seed, propose, width=width, stream=stream,
                        decomposition=decomposition(candidate_sets), start=start)
