"""Width-N search with a real merge: the engine behind every reference optimizer's ``width`` option.

One round, from one parent:

1. **Propose.** ``width`` workers each propose an edit of the *same* parent, independently of one
   another (worker ``k`` has its own random stream). A proposal is scored on the same train ids
   as the parent; the proposals of a round are evaluated in parallel threads.
2. **Edits.** The artifact is seen as named *parts* (by default the candidate's components; an
   optimizer may decompose finer, e.g. a rule table into one rule per position). A worker's edit
   is the set of parts whose text differs from the parent's.
3. **Eligibility.** Only edits of workers whose proposal scored at least the parent's score go
   into the union (a merge of regressions is not a merge of improvements).
4. **Union.** A part edited by one eligible worker takes that edit; a part edited by several to
   the same text takes it (agreement is no conflict).
5. **Conflicts** (a part edited to different texts): the edit of the worker whose own proposal
   scored highest wins; a tie goes to the lowest worker index. Each is recorded as ``contested``.
6. The union is built (``union_built``) and evaluated only when it combines edits of two or more
   workers; otherwise it equals one proposal and merging degenerates to selection.
7. **Next parent:** the best of union, proposals and parent by train score; on a tie the union
   wins, then the lowest worker index, then the parent (neutral moves are taken, like the serial
   hill climbers do).

Scores are *oriented* (:func:`heldout.optimizers.evaluation.oriented_mean`: the metric's sign
times the mean shown score), so "scored highest" and "at least the parent's" mean better in the
metric's direction, a lower cost on a lower-is-better task; on such a task the recorded scores are
those oriented ones and a ``score_orientation`` event says so.

Width 1 is plain hill climbing on the same proposals (the serial and fork arms), and records no
merge events. Budget: a round of ``w`` workers costs ``w`` (+1 for the union) evaluations of the
train ids; the last rounds narrow to what the budget still pays for, so the whole budget is spent
in whole evaluations.

Mechanism evidence goes to the ledger through ``view.record_event``: ``merge_attempt`` (every
round of width >= 2: the workers and the parts each edited), ``contested`` (each conflict and how
it was resolved), ``union_built`` (parts merged, parts the artifact has, the union's score) and
``merge_round`` (which candidate became the next parent)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from heldout.contracts import BudgetExceeded, Candidate
from heldout.optimizers.evaluation import oriented_mean, state_orientation

Parts = dict[str, str]
Proposer = Callable[[Candidate, Parts, int, random.Random], "Candidate | None"]
"""``propose(parent, parent_parts, worker, rng) -> proposal`` (None: this worker has nothing)."""

CONFLICT_RULE = "highest own train score wins; a tie goes to the lowest worker index"


@dataclass(frozen=True)
class Decomposition:
    """How an optimizer sees its artifact as mergeable parts. Rule: ``join(split(c))`` is a
    candidate that behaves as ``c``; parts are independent edit sites of the optimizer's own
    model (the harness never relies on it)."""

    split: Callable[[Candidate], Parts] = lambda candidate: dict(candidate)
    join: Callable[[Parts], Candidate] = lambda parts: dict(parts)


COMPONENTS = Decomposition()
"""The default: one part per candidate component."""


@dataclass
class Union:
    """What step 4-5 produced: the merged parts, which workers contributed, the conflicts."""

    parts: Parts
    contributors: list[int]
    merged_parts: list[str]
    contested: list[dict] = field(default_factory=list)


def edited_parts(parent: Mapping[str, str], proposal: Mapping[str, str]) -> dict[str, str | None]:
    """Parts whose text differs from the parent's (None: the proposal dropped the part)."""
    names = set(parent) | set(proposal)
    return {n: proposal.get(n) for n in sorted(names) if proposal.get(n) != parent.get(n)}


def build_union(parent: Parts, proposals: Sequence[Parts | None], scores: Sequence[float | None],
                parent_score: float) -> Union:
    """Steps 3-5 of the module docstring over the workers' proposals (index = worker)."""
    eligible = [k for k, (p, s) in enumerate(zip(proposals, scores))
                if p is not None and s is not None and s >= parent_score]
    edits = {k: edited_parts(parent, proposals[k]) for k in eligible}
    by_part: dict[str, list[int]] = {}
    for k in eligible:
        for name in edits[k]:
            by_part.setdefault(name, []).append(k)
    merged = dict(parent)
    contributors: set[int] = set()
    contested = []
    for name, workers in sorted(by_part.items()):
        texts = {edits[k][name] for k in workers}
        winner = min(workers, key=lambda k: (-scores[k], k))
        if len(texts) > 1:
            contested.append({"part": name, "workers": workers, "winner": winner, "rule": CONFLICT_RULE})
        text = edits[winner][name]
        if text is None:
            merged.pop(name, None)
        else:
            merged[name] = text
        contributors.add(winner)
    return Union(merged, sorted(contributors), sorted(by_part), contested)


def width_search(view, seed: int, propose: Proposer, *, width: int = 1, stream: int = 0,
                 decomposition: Decomposition = COMPONENTS, ids: Sequence[str] | None = None,
                 start: Candidate | None = None,
                 observe: Callable[[Candidate, list[dict]], None] | None = None, patience: int = 3,
                 restart: bool = True) -> Candidate:
    """Rounds of the module docstring until the budget cannot pay one more evaluation of ``ids``
    (default: all train ids). Returns the best candidate by train score over the whole search.
    ``observe(candidate, results)`` sees every evaluation (a proposer that reads feedback).

    After ``patience`` rounds in a row in which no worker proposed anything new the search has
    converged. With ``restart`` (the default) it then starts again from ``start`` with fresh
    random streams (recorded as a ``restart`` event) until the budget is spent, so an arm given
    a budget spends it: equal *allowed* budgets are only comparable when each arm uses what it
    was allowed. Without it the search stops and records a ``stopped`` event with the reason."""
    if type(width) is not int or width < 1:
        raise ValueError(f"width must be a positive int, got {width!r}")
    ids = [ex["id"] for ex in view.train] if ids is None else list(ids)
    per_eval = max(1, len(ids))
    rngs = [random.Random(f"{seed}:{stream}:{k}") for k in range(width)]
    origin = dict(start or view.seed_candidate)
    parent = dict(origin)
    state_orientation(view, "merge_attempt, union_built, merge_round and restart scores")
    score = _train_scorer(view, ids, observe)
    parent_score = score(parent)
    if parent_score is None:
        return parent
    best_seen, best_seen_score = dict(parent), parent_score
    round_no = idle = restarts = 0
    with ThreadPoolExecutor(max_workers=width) as pool:
        while view.remaining >= per_eval:
            workers = _workers_paid_for(view.remaining // per_eval, width)
            parent_parts = decomposition.split(parent)
            candidates = [_new_or_none(propose(parent, dict(parent_parts), k, rngs[k]), parent) for k in range(workers)]
            if not any(candidates):
                idle += 1  # a round with nothing new costs no metric call; a stochastic proposer may move next time
                if idle < patience:
                    continue
                # no worker can move: the search has converged
                if not restart or view.remaining < per_eval:
                    view.record_event("stopped", reason="converged: no worker proposed anything new in "
                                      f"{patience} rounds", metric_calls_left=view.remaining)
                    break
                restarts += 1
                rngs = [random.Random(f"{seed}:{stream}:{k}:restart-{restarts}") for k in range(width)]
                view.record_event("restart", restart=restarts, reason="converged", best_score=best_seen_score)
                parent, idle = dict(origin), 0
                parent_score = score(parent)
                if parent_score is None:
                    break
                continue
            idle = 0
            scores = list(pool.map(lambda c: None if c is None else score(c), candidates))
            if all(s is None for s, c in zip(scores, candidates) if c is not None):
                break  # budget gone
            next_parent, parent_score = _next_parent(view, round_no, decomposition, score, parent, parent_parts,
                                                     parent_score, candidates, scores)
            parent = dict(next_parent)
            if parent_score > best_seen_score:
                best_seen, best_seen_score = dict(parent), parent_score
            round_no += 1
    if 0 < view.remaining < per_eval:
        view.record_event("stopped", reason=f"the {view.remaining} metric calls left cannot pay for one evaluation "
                          f"of {per_eval} train examples", metric_calls_left=view.remaining)
    # without restarts the last parent is the best (neutral moves are taken); over restarts the
    # best seen wins, and a later restart that only ties it keeps the earlier candidate
    return parent if restarts == 0 else best_seen


def _train_scorer(view, ids: list[str], observe: Callable[[Candidate, list[dict]], None] | None
                  ) -> Callable[[Candidate], float | None]:
    """A candidate's oriented mean train score on ``ids``; None when the budget cannot pay for it."""
    def score(candidate: Candidate) -> float | None:
        if view.remaining < max(1, len(ids)):
            return None
        try:
            results = view.evaluate(candidate, "train", ids)
        except BudgetExceeded:
            return None
        if observe is not None:
            observe(candidate, results)
        return oriented_mean(view, results)
    return score


def _workers_paid_for(affordable: int, width: int) -> int:
    """Workers this round: at most ``width``, leaving room for the union when two or more workers
    can still be paid for (``affordable``: evaluations the budget still pays for)."""
    return min(width, affordable - 1) if width > 1 and affordable >= 3 else min(width, affordable)


def _new_or_none(proposal: Candidate | None, parent: Candidate) -> Candidate | None:
    return None if proposal is None or proposal == parent else dict(proposal)


def _next_parent(view, round_no: int, decomposition: Decomposition, score: Callable[[Candidate], float | None],
                 parent: Candidate, parent_parts: Parts, parent_score: float,
                 candidates: list[Candidate | None], scores: list[float | None]) -> tuple[Candidate, float]:
    """Steps 3-7 of the module docstring for one scored round: (next parent, its score). A round
    of two or more workers records its merge evidence."""
    choice, best, next_parent = "parent", parent_score, parent
    scored = [(s, k) for k, s in enumerate(scores) if s is not None]
    if scored:
        top, k = min(scored, key=lambda sk: (-sk[0], sk[1]))
        if top >= parent_score:  # neutral moves are taken
            choice, best, next_parent = f"worker-{k}", top, candidates[k]
    if len(candidates) > 1:
        proposals_parts = [None if c is None else decomposition.split(c) for c in candidates]
        view.record_event("merge_attempt", round=round_no, workers=len(candidates),
                          edits={str(k): sorted(edited_parts(parent_parts, p))
                                 for k, p in enumerate(proposals_parts) if p is not None},
                          scores=[s for s in scores], parent_score=parent_score)
        union = build_union(parent_parts, proposals_parts, scores, parent_score)
        for conflict in union.contested:
            view.record_event("contested", round=round_no, **conflict)
        if len(union.contributors) >= 2:
            merged = decomposition.join(union.parts)
            union_score = score(merged)
            view.record_event("union_built", round=round_no, contributors=union.contributors,
                              merged_parts=union.merged_parts, parts_total=len(parent_parts),
                              score=union_score, best_single=best)
            if union_score is not None and union_score >= best:
                choice, best, next_parent = "union", union_score, merged
        view.record_event("merge_round", round=round_no, chosen=choice, score=best, parts_total=len(parent_parts))
    return next_parent, best
