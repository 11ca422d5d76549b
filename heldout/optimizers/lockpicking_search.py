"""``lockpicking-search``: hill climbing over rule tables that emits SQL candidates.

It reads the seed SQL's candidate sets and trigger edges (what the seed states), proposes the one
edge change (add or drop a trigger -> target edge) that best explains the train counts under its
own table, and keeps it when ``evaluate`` (the aggregate per-example counts) says the table got no
worse. Uses nothing but the
view: train inputs and targets, and evaluate()."""

from __future__ import annotations

import random
import re

from heldout.evaluators.session import BudgetExceeded

_SET = re.compile(r"SUBSTR\(PROGRAM, (\d), 1\) IN \(([^)]*)\)")
_KILL = re.compile(r"SUBSTR\(PROGRAM, (\d), 1\) <> '(\d)'")


def parse_seed(sql: str) -> tuple[list[set[int]], set[tuple[int, int, int]]]:
    """Candidate sets and (trigger, digit, target) edges of a seed-style SQL body."""
    sets: list[set[int]] = [set() for _ in range(6)]
    edges: set[tuple[int, int, int]] = set()
    for line in sql.splitlines():
        found = _SET.search(line)
        if not found:
            continue
        target = int(found.group(1))
        sets[target - 1] = {int(d) for d in re.findall(r"'(\d)'", found.group(2))}
        edges |= {(int(t), int(d), target) for t, d in _KILL.findall(line)}
    return sets, edges


def to_sql(sets: list[set[int]], edges: set[tuple[int, int, int]]) -> str:
    terms = []
    for pos in range(1, 7):
        digits = ", ".join(f"'{d}'" for d in sorted(sets[pos - 1]))
        kills = "".join(f" AND SUBSTR(PROGRAM, {t}, 1) <> '{d}'" for t, d, g in sorted(edges) if g == pos)
        terms.append(f"IFF(SUBSTR(PROGRAM, {pos}, 1) IN ({digits}){kills}, 1, 0)")
    body = "\n  + ".join(terms)
    return f"CASE WHEN NOT REGEXP_LIKE(PROGRAM, '^[0-9]{{6}}$') THEN '0' ELSE CAST(\n    {body}\n  AS VARCHAR) END\n"


def predict(sets, edges, program: str) -> int:
    if len(program) != 6 or not program.isascii() or not program.isdigit():
        return 0
    killed = {g for t, d, g in edges if int(program[t - 1]) == d}
    return sum(int(c) in sets[i] and (i + 1) not in killed for i, c in enumerate(program))


def optimize(view, seed: int):
    rng = random.Random(seed)
    sets, edges = parse_seed(view.seed_candidate["scorer.sql"])
    train = view.train
    ids = [ex["id"] for ex in train]

    def score(edge_set) -> float | None:
        if view.remaining < len(ids):
            return None
        try:
            results = view.evaluate({"scorer.sql": to_sql(sets, edge_set)}, "train", ids)
        except BudgetExceeded:
            return None
        return sum(r["score"] for r in results) / len(results)

    best = score(edges)
    if best is None:
        return dict(view.seed_candidate)
    def local_accuracy(edge_set) -> int:
        return sum(predict(sets, edge_set, ex["input"]["program"]) == ex["target"] for ex in train)

    moves = [(t, d, g) for t in range(1, 7) for d in range(10) for g in range(1, 7) if t != g]
    for _ in range(10_000):  # ends when the budget runs out or no move helps on train
        here = local_accuracy(edges)
        if here == len(train):
            break
        # the move that best explains the train counts under the optimizer's own table...
        scored = [(local_accuracy(edges ^ {m}), rng.random(), m) for m in moves]
        top, _, move = max(scored)
        if top <= here:
            break
        proposal = edges ^ {move}
        # ...is kept only if the evaluator's aggregate counts agree
        got = score(proposal)
        if got is None:
            break
        if got >= best:
            best, edges = got, proposal
        else:
            moves.remove(move)
    return {"scorer.sql": to_sql(sets, edges)}
