"""``lockpicking-search``: hill climbing over rule tables that emits SQL candidates.

It reads the seed SQL's candidate sets and trigger edges (what the seed states), proposes the one
edge change (add or drop a trigger -> target edge) that best explains the train counts under its
own table, and keeps it when ``evaluate`` (the aggregate per-example counts) says the table got no
worse. Uses nothing but the view: train inputs and targets, and evaluate(). (It borrows the task's
rule-table type and SQL writer, never its hidden table.)"""

from __future__ import annotations

import random
import re

from heldout.benchmarks.lockpicking.rules import N_POSITIONS, Edge, RuleSystem
from heldout.benchmarks.lockpicking.sql import rule_table_sql
from heldout.optimizers import mean_train_score

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


MINIBATCH = 10
SHORTLIST = 3


def optimize(view, seed: int):
    """Each step: shortlist the few edge toggles that best explain the train counts under the
    optimizer's own table, try them in a seeded random order, and keep the first one the
    evaluator's counts on a seeded train minibatch do not reject. The seed drives the minibatches
    and the proposal order, so different seeds search differently."""
    rng = random.Random(seed)
    table = parse_seed(view.seed_candidate["scorer.sql"])
    train = view.train
    ids = [ex["id"] for ex in train]
    batch_size = min(MINIBATCH, len(ids))

    def score(system: RuleSystem, batch: list[str]) -> float | None:
        return mean_train_score(view, {"scorer.sql": rule_table_sql(system)}, batch)

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
