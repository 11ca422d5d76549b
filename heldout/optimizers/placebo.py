"""``placebo``: the seed candidate with one neutral re-wording, drawn from the seed number.

The noise floor of every verdict against the seed. A worker model answers some questions
differently after any change of wording (every real LLM; the loopback server's yes/no items), so
the seed prompt's score is one draw of "the seed, worded some way", and a method that makes a
meaningless edit moves the score as much as a real one does. Scoring several placebo draws per
seed turns "the method beats the seed" into "the method beats what re-wording the seed does"
(:func:`heldout.protocols.decide.beyond_placebo`).

Rules of the draw:

* It reads no score and spends no metric call: a placebo run costs only the harness's held-out
  scoring, charged to no method's budget.
* It is a pure function of the seed number (``random.Random("placebo:<seed>")``) and of the
  seed candidate, and it is recorded (a ``placebo`` ledger event names every edit).
* Edits add no information about the task: a neutral opening or closing sentence, a synonym for
  one function word, a change of paragraph spacing. At least one edit, so a draw is never the seed
  itself.
* Program tasks: a deterministic evaluator does not move with a comment or a blank line, so the
  placebo returns the seed candidate unchanged and says so; verdicts on program tasks keep the
  seed's one score as their baseline.
"""

from __future__ import annotations

import random
import re

OPENINGS = ("Here is the task.", "Please do the following.", "Your task is described below.",
            "Read the instructions below.", "The task follows.")
CLOSINGS = ("Thank you.", "Thanks.", "That is all.", "End of instructions.", "Good luck.")
SYNONYMS = ((r"\bthe question\b", "this question"), (r"\bGive\b", "Provide"), (r"\bgive\b", "provide"),
            (r"\banswer\b", "reply"), (r"\bPlease\s+", ""), (r"\bexample\b", "instance"))
SPACINGS = ("\n\n", "\n")


def neutral_edit(text: str, rng: random.Random) -> tuple[str, list[str]]:
    """``text`` with at least one neutral edit; returns the new text and the edits made."""
    edits: list[str] = []
    while not edits:
        if rng.random() < 0.5:
            opening = rng.choice(OPENINGS)
            text, edits = f"{opening} {text}", edits + [f"opening {opening!r}"]
        if rng.random() < 0.5:
            closing = rng.choice(CLOSINGS)
            text, edits = f"{text.rstrip()} {closing}", edits + [f"closing {closing!r}"]
        if rng.random() < 0.4:
            pattern, replacement = rng.choice(SYNONYMS)
            new = re.sub(pattern, replacement, text, count=1)
            if new != text:
                text, edits = new, edits + [f"synonym {pattern!r} -> {replacement!r}"]
        if rng.random() < 0.3 and "\n" in text.strip():
            spacing = rng.choice(SPACINGS)
            new = re.sub(r"\n\s*\n|\n", spacing, text.strip())
            if new != text.strip():
                text, edits = new, edits + [f"paragraph spacing {spacing!r}"]
    return text, edits


def placebo_candidate(seed_candidate: dict[str, str], seed: int) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The placebo draw of ``seed``: one component (drawn) re-worded; returns it and its edits."""
    rng = random.Random(f"placebo:{seed}")
    names = sorted(n for n, text in seed_candidate.items() if isinstance(text, str) and text.strip())
    candidate = dict(seed_candidate)
    if not names:
        return candidate, {}
    name = rng.choice(names)
    candidate[name], edits = neutral_edit(candidate[name], rng)
    return candidate, {name: edits}


def optimize(view, seed: int):
    if view.kind != "prompt":
        view.record_event("placebo", edits={}, note="program task: a deterministic evaluator does not move with "
                          "neutral edits, so the placebo is the seed candidate itself")
        view.record_event("final_selection", split="none", how="the seed candidate (program task placebo)")
        return dict(view.seed_candidate)
    candidate, edits = placebo_candidate(dict(view.seed_candidate), seed)
    view.record_event("placebo", edits=edits, note="neutral re-wording of the seed, drawn from the seed number")
    view.record_event("final_selection", split="none", how="a neutral re-wording of the seed, unselected")
    return candidate


def minimum_budget(task: str, train: int, val: int) -> int:
    """A placebo spends nothing, by design."""
    return 0
