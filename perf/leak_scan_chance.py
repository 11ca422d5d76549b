"""The leak scan's red flag against chance overlap, on real data: the figures in docs/statistics.md.

For BBH boolean_expressions (a small vocabulary) it scans the 50 training lines, 100 candidates
of the seed plus self-written true expressions (5 to 40 lines; none holds held-out data, so every
flag is false) and the seed plus k test items verbatim; for hotpotqa, gsm_hard and MMLU-Pro
economics the seed plus 1 and 3 test items verbatim. Prints, per case, the flag and its p.
Run: HELDOUT_DATA_DIR=../shared/data python perf/leak_scan_chance.py
"""

from __future__ import annotations

import random

import heldout
from heldout.protocols.leak_scan import scan_candidate
from heldout.protocols.splits import answer_text, question_text


def line(ex) -> str:
    return f"Q: {question_text(ex)} A: {answer_text(ex)}"


def self_written(rng: random.Random, n: int) -> str:
    """Boolean expressions an optimizer writes itself, with their true values."""
    out = []
    for _ in range(n):
        parts = [rng.choice(["True", "False", "not True", "not False"])]
        for _ in range(rng.randint(1, 4)):
            parts += [rng.choice(["and", "or"]), rng.choice(["True", "False", "not True", "not False", "( True )"])]
        expression = " ".join(parts)
        out.append(f"{expression} is {eval(expression.replace('( ', '(').replace(' )', ')'))}")  # noqa: S307
    return "\n".join(out)


def verdict(scan) -> str:
    if scan.chance is None:
        return "no held-out overlap left" if not scan.red_flag else "RED FLAG (no chance measured)"
    return f"{'RED FLAG' if scan.red_flag else 'no flag'} (p {scan.chance.p:.3g}, {len(scan.held_out)} matches)"


def main() -> None:
    task = heldout.load_task("bbh/boolean_expressions", "default")
    seed = task.benchmark.seed_candidate()["instruction"]
    print("bbh/boolean_expressions, 50 training lines:",
          verdict(scan_candidate({"instruction": "\n".join(line(e) for e in task.split("train"))}, task)))
    rng = random.Random(2026)
    flags = sum(scan_candidate({"instruction": seed + "\n" + self_written(rng, rng.choice((5, 10, 15, 20, 30, 40)))},
                               task).red_flag for _ in range(100))
    print(f"bbh/boolean_expressions, seed + self-written expressions: {flags} of 100 flagged (alpha 0.01)")
    for start, k in ((0, 1), (0, 3), (0, 5), (10, 5), (0, 10), (10, 10), (0, 20)):
        text = seed + "\n" + "\n".join(line(e) for e in task.split("test")[start:start + k])
        print(f"bbh/boolean_expressions, seed + test items {start + 1}-{start + k} verbatim:",
              verdict(scan_candidate({"instruction": text}, task)))
    for name, profile in (("hotpotqa/distractor", "topic-disjoint"), ("gsm_hard", "default"),
                          ("mmlu_pro/economics", "topic-disjoint")):
        other = heldout.load_task(name, profile)
        seed_text = "\n".join(other.benchmark.seed_candidate().values())
        for k in (1, 3):
            text = seed_text + "\n" + "\n".join(line(e) for e in other.split("test")[:k])
            print(f"{name}, seed + {k} test item(s) verbatim:", verdict(scan_candidate({"instruction": text}, other)))


if __name__ == "__main__":
    main()
