"""``reflective``: a minimal reflective prompt rewriter (GEPA-style, stripped to its core).

Loop: score the current instruction on a train minibatch; show the architect the instruction and
the failures with their feedback; ask for an improved instruction (returned in a fenced block);
score it on the same minibatch; keep it when it is no worse in the metric's direction (the
failures shown are, on a lower-is-better metric, the batch's highest costs). Uses the metered architect, so its
optimisation tokens land on the same scale as any other method's.

With ``width`` given, the rounds of :func:`heldout.optimizers.merge.width_search` run on one
seeded minibatch: worker ``k`` rewrites component ``k mod (number of components)`` from its own
sample of the parent's failures (and architect replicate ``k``), so on a multi-component prompt the
workers' rewrites of different components merge; on a one-component prompt they conflict and the
round is a selection. A worker whose architect budget is used up proposes nothing."""

from __future__ import annotations

import random
import re

from heldout.contracts import BudgetExceeded, candidate_id
from heldout.optimizers.evaluation import oriented_mean
from heldout.optimizers.merge import width_search

MINIBATCH = 8
_FENCE = re.compile(r"```(?:[a-zA-Z]*\n)?(.*?)```", re.DOTALL)


def _failures(metric, results) -> list[dict]:
    """Up to 4 examples to reflect on: a higher-is-better score short of 1.0 (in batch order); on a
    lower-is-better metric, which has no perfect score, the 4 highest costs."""
    if metric.higher_is_better:
        return [r for r in results if r["score"] < 1.0][:4]
    return sorted(results, key=lambda r: metric.sign * r["score"])[:4]


def _shortfall(metric) -> str:
    return "got them wrong" if metric.higher_is_better else f"scored worst on them ({metric.name}, lower is better)"


def _reflection_prompt(instruction: str, results, train_by_id, metric) -> list[dict[str, str]]:
    failures = _failures(metric, results)
    shown = "\n\n".join(
        f"Input:\n{str(train_by_id[r['id']]['input'])[:1500]}\nExpected: {r.get('target')}\n"
        f"Feedback: {r.get('feedback', '')[:500]}" for r in failures) or "(no failures on this batch)"
    return [
        {"role": "system", "content": "You improve instructions for a language model."},
        {"role": "user", "content": (
            "Here is the current instruction:\n```\n" + instruction + "\n```\n\n"
            f"It was used on these examples and {_shortfall(metric)}:\n\n" + shown + "\n\n"
            "Please rewrite the instruction to fix these failures while keeping what works. "
            "Return only the improved instruction inside one ``` block.")},
    ]


def minimum_budget(task: str, train: int, val: int, width: int | None = None, stream: int = 0) -> int:
    """The instruction and one rewrite of it, on one train minibatch."""
    return 2 * min(MINIBATCH, train)


def optimize(view, seed: int, width: int | None = None, stream: int = 0):
    view.record_event("final_selection", split="train", how="kept when no worse on a train minibatch")
    if width is not None:
        return _optimize_width(view, seed, width, stream)
    rng = random.Random(seed)
    train_by_id = {ex["id"]: ex for ex in view.train}
    best = dict(view.seed_candidate)
    component = "instruction" if "instruction" in best else sorted(best)[0]
    while view.remaining >= 2 * min(MINIBATCH, len(view.train)):
        batch = rng.sample(sorted(train_by_id), min(MINIBATCH, len(train_by_id)))
        try:
            current = view.evaluate(best, "train", batch)
            reply = view.architect(_reflection_prompt(best[component], current, train_by_id, view.metric))
            blocks = _FENCE.findall(reply)
            proposal = {**best, component: (blocks[-1] if blocks else reply).strip()}
            trial = view.evaluate(proposal, "train", batch)
        except BudgetExceeded:
            break
        if proposal[component] and oriented_mean(view, trial) >= oriented_mean(view, current):
            best = proposal
    return best


def _optimize_width(view, seed: int, width: int, stream: int):
    train_by_id = {ex["id"]: ex for ex in view.train}
    batch = random.Random(f"{seed}:{stream}:batch").sample(sorted(train_by_id), min(MINIBATCH, len(train_by_id)))
    seen: dict[str, list[dict]] = {}

    def observe(candidate, results) -> None:
        seen[candidate_id(candidate)] = results

    def propose(parent, parts, worker: int, rng: random.Random):
        names = sorted(parent)
        component = names[worker % len(names)]
        results = list(seen.get(candidate_id(parent), []))
        rng.shuffle(results)  # each worker reflects on its own sample of the failures
        try:
            reply = view.architect(_reflection_prompt(parent[component], results, train_by_id, view.metric),
                                   replicate=worker)
        except BudgetExceeded:
            return None
        blocks = _FENCE.findall(reply)
        text = (blocks[-1] if blocks else reply).strip()
        return {**parent, component: text} if text else None

    return width_search(view, seed, propose, width=width, stream=stream, ids=batch, observe=observe)
