"""A small isolated optimizer: (1+1) random search over the candidate's text, through the client.

Run it under heldout, which serves the task view and starts this script in a sandbox:

    heldout run --task lockpicking/six --profile paper --seeds 0 --budget 200 \
        --optimizer-cmd "python examples/isolated_random_search.py" --run-dir runs/demo

Each step mutates the best candidate so far, scores it on a random train minibatch next to the
best (the same examples, so the comparison is paired), keeps it when it is no worse, and submits
the best so far as the final candidate (the last submission is the one heldout scores on test).

Mutations are deliberately generic: a quoted single digit such as ``'7'`` (SQL) is replaced by
another digit; else a number literal is nudged (programs); else a sentence is added to or removed
from the text (prompts).
With ``--architect`` the session's metered architect model proposes rewrites instead.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys

from heldout.adapters.client import BudgetExceeded, TaskClient

DIGIT_LITERAL = re.compile(r"'(\d)'")
NUMBER = re.compile(r"(?<![\w.])(\d+\.\d+|\d+)(?![\w.])")
SENTENCES = (
    "Think step by step before answering.",
    "Check the answer against the question before giving it.",
    "List the relevant facts first.",
    "Answer in the exact format the question asks for.",
    "Rule out wrong options explicitly.",
)


def mutate(candidate: dict[str, str], rng: random.Random) -> dict[str, str]:
    name = rng.choice(sorted(candidate))
    text = candidate[name]
    digits = list(DIGIT_LITERAL.finditer(text))
    if digits:
        hit = rng.choice(digits)
        new = rng.choice([d for d in "0123456789" if d != hit.group(1)])
        text = text[:hit.start(1)] + new + text[hit.end(1):]
    elif NUMBER.search(text):
        hit = rng.choice(list(NUMBER.finditer(text)))
        old = hit.group(1)
        new = (f"{float(old) * rng.uniform(0.8, 1.2):.4g}" if "." in old
               else str(max(0, int(old) + rng.choice([-2, -1, 1, 2]))))
        text = text[:hit.start(1)] + new + text[hit.end(1):]
    else:
        present = [s for s in SENTENCES if s in text]
        if present and rng.random() < 0.4:
            text = text.replace(" " + rng.choice(present), "", 1)
        else:
            text = text.rstrip() + " " + rng.choice(SENTENCES)
    return {**candidate, name: text}


def architect_rewrite(client: TaskClient, candidate: dict[str, str], rng: random.Random) -> dict[str, str]:
    name = rng.choice(sorted(candidate))
    text = client.architect([{"role": "user", "content": "Rewrite and improve this instruction:\n\n"
                              + candidate[name]}], replicate=rng.randrange(1 << 30))
    return {**candidate, name: text.strip() or candidate[name]}


class Scores:
    """Remembers every score seen, so no example is paid for twice for the same candidate."""

    def __init__(self, client: TaskClient) -> None:
        self.client = client
        self.seen: dict[tuple, float] = {}

    def mean(self, candidate: dict[str, str], ids: list[str], parent: str | None = None) -> float:
        key = tuple(sorted(candidate.items()))
        todo = [i for i in ids if (key, i) not in self.seen]
        if todo:
            for result in self.client.evaluate(candidate, "train", todo, parent=parent):
                self.seen[(key, result["id"])] = float(result["score"])
        return sum(self.seen[(key, i)] for i in ids) / len(ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minibatch", type=int, default=10)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("HELDOUT_SEED", "0")))
    parser.add_argument("--architect", action="store_true", help="propose rewrites with the architect model")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    client = TaskClient.from_env()
    train_ids = [ex["id"] for ex in client.train]
    size = min(args.minibatch, len(train_ids))
    best = client.seed_candidate
    client.submit_final(best)
    best_id = None
    scores = Scores(client)
    steps = 0
    try:
        while client.remaining >= 2 * size:
            batch = rng.sample(train_ids, size)
            child = architect_rewrite(client, best, rng) if args.architect else mutate(best, rng)
            parent_score = scores.mean(best, batch)
            child_score = scores.mean(child, batch, parent=best_id)
            steps += 1
            # no worse in the metric's direction: a lower cost is better on a lower-is-better task
            if client.metric.sign * (child_score - parent_score) >= 0 and child != best:
                best, best_id = child, client.submit_final(child)
                print(f"step {steps}: {parent_score:.4g} -> {child_score:.4g}", flush=True)
    except BudgetExceeded as exc:
        print(f"stopping: {exc.message}", flush=True)
    print(f"done after {steps} steps; final {best_id or 'seed'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
