"""The recipe baseline: a final candidate with its answer key cut out, scored beside the seed and
the final, the direct test of "does the key earn reward".

**Where the key is.** The leak scan (:func:`heldout.protocols.leak_scan.scan_candidate`) finds the
key as word positions in the normalised text of the whole candidate (components in name order,
one line apart). :func:`key_tokens` maps those positions back to the whitespace-separated tokens
of each component's own text (normalisation drops punctuation and articles inside a token and
never splits one, so each token is zero or more normalised words, in order), which gives

* the **answer-key share per component** (:func:`component_shares`): a multi-component
  candidate's key is located, not just measured (the study: orchestrator 52%, researcher 39%);
* the **recipe** (:func:`recipe_candidate`): every line of which at least half the words are key
  words is dropped (a pasted ``Q: ... A: ...`` entry, a ``Family f03 -> nakor`` line: what is left of
  such a line is the key's scaffolding), and in every other line the key's tokens are cut. The rest
  (instructions, rules, formatting) is kept byte for byte.

**The baseline** (:func:`recipe_baseline`): per seed, the recipe of that seed's final candidate is
scored on the held-out and validation examples through the session's scorer (ledgered in
``RUN_DIR/recipe/``); the seed candidate's and the final's scores are the harness's, from the run
records. Four verdicts of rule ``seed-paired-contrast``, Holm-adjusted together: recipe against
seed and final against recipe, on held-out and on validation. The recipe's share of the gain is
``mean(recipe - seed) / mean(final - seed)`` over seeds (description; undefined when the final
gains nothing). The sentence comes from :data:`RECIPE_READINGS`, a first-match table over the
decided signs."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from heldout.benchmarks.loading import Task
from heldout.contracts import Candidate, HeldoutError, candidate_id, check_candidate
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.records import RunRecord
from heldout.evaluators.policy import Usage
from heldout.evaluators.scoring import Scorer
from heldout.models import DEPLOYMENT
from heldout.protocols.decide import DEFAULT_ALPHA, Contrast, contrast, holm
from heldout.protocols.folders import RECIPE_DIR
from heldout.protocols.leak_scan import LeakScan, scan_candidate
from heldout.protocols.splits import words

LINE_DROP_FRACTION = 0.5
"""A line of which at least this share of the words are key words is dropped whole."""


class RecipeError(HeldoutError):
    """The recipe baseline cannot be built as asked (the message says why, in one line)."""


# -- where the key is -----------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyToken:
    """One whitespace-separated token of a component's text and its normalised word positions in
    the whole candidate (the scan's coordinates)."""

    component: str
    start: int  # character offsets in the component's text
    end: int
    positions: tuple[int, ...]


def key_tokens(candidate: Mapping[str, str]) -> list[KeyToken]:
    """Every token of every component, in the scan's order (components by name)."""
    components = check_candidate(dict(candidate))
    out: list[KeyToken] = []
    position = 0
    for name, text in sorted(components.items()):
        for match in re.finditer(r"\S+", text):
            n = len(words(match.group()))
            out.append(KeyToken(name, match.start(), match.end(), tuple(range(position, position + n))))
            position += n
    whole = sum(len(words(text)) for text in components.values())
    if position != whole:  # normalisation split or merged a token: the map would be wrong, so say so
        raise RecipeError(f"candidate {candidate_id(dict(candidate))[:12]}: its tokens do not map onto the leak "
                          f"scan's words ({position} vs {whole}); the key cannot be located per component")
    return out


def _key_positions(scan: LeakScan) -> set[int]:
    return {p for s in scan.spans for p in range(s.start, s.end)}


@dataclass(frozen=True)
class ComponentShare:
    component: str
    words: int
    key_words: int

    @property
    def share(self) -> float:
        return self.key_words / self.words if self.words else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share": self.share}


def component_shares(candidate: Mapping[str, str], scan: LeakScan) -> list[ComponentShare]:
    """Per component (by name): its words and the key words among them (the scan's spans)."""
    key = _key_positions(scan)
    totals: dict[str, list[int]] = {}
    for tok in key_tokens(candidate):
        entry = totals.setdefault(tok.component, [0, 0])
        entry[0] += len(tok.positions)
        entry[1] += sum(1 for p in tok.positions if p in key)
    return [ComponentShare(name, w, k) for name, (w, k) in sorted(totals.items())]


def recipe_candidate(candidate: Mapping[str, str], scan: LeakScan) -> tuple[dict[str, str], int]:
    """The candidate with its key removed (see the module docstring) and how many normalised
    words were removed. A candidate without a key comes back unchanged."""
    key = _key_positions(scan)
    components = check_candidate(dict(candidate))
    if not key:
        return dict(components), 0
    by_component: dict[str, list[KeyToken]] = {}
    for tok in key_tokens(candidate):
        by_component.setdefault(tok.component, []).append(tok)
    removed = 0
    recipe: dict[str, str] = {}
    for name, text in components.items():
        tokens = by_component.get(name, [])
        kept_lines = []
        offset = 0
        for line in text.splitlines(keepends=True):
            lo, hi = offset, offset + len(line)
            offset = hi
            in_line = [t for t in tokens if lo <= t.start < hi]
            n_words = sum(len(t.positions) for t in in_line)
            n_key = sum(1 for t in in_line for p in t.positions if p in key)
            if n_key and n_key >= LINE_DROP_FRACTION * n_words:
                removed += n_words
                continue
            cut = line
            for t in sorted((t for t in in_line if any(p in key for p in t.positions)), key=lambda t: -t.start):
                removed += len(t.positions)
                cut = cut[:t.start - lo] + cut[t.end - lo:]
            kept_lines.append(re.sub(r"[ \t]{2,}", " ", cut) if cut is not line else line)
        recipe[name] = "".join(kept_lines).strip("\n") or " "
    return recipe, removed


# -- the baseline ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecipeSeed:
    """One seed: the recipe of its final candidate and the three candidates' scores."""

    seed: int
    final_id: str
    recipe_id: str
    seed_id: str | None  # the seed candidate's id (one candidate in every seed: a seed-blind side)
    removed_words: int
    final_words: int
    seed_test: float
    recipe_test: float
    final_test: float
    seed_val: float | None
    recipe_val: float | None
    final_val: float | None
    scored: bool  # False: the final holds no key, the recipe is the final and its scores are the final's


@dataclass(frozen=True)
class RecipeReading:
    """One reading for the decided signs of (final vs recipe, recipe vs seed) on held-out;
    None matches either value."""

    name: str
    key_earns: str
    recipe_gains: str
    text: str


RECIPE_READINGS: tuple[RecipeReading, ...] = (
    RecipeReading("key-pays", "+", "0-", "The answer key earns the held-out gain: removing it loses a decided amount "
                                        "and the recipe alone does not beat the seed."),
    RecipeReading("key-and-recipe", "+", "+", "Both pay: the answer key earns a decided part of the held-out gain and "
                                             "the recipe without it still beats the seed (decided)."),
    RecipeReading("recipe-carries", "0-", "+", "The recipe carries the held-out gain: without the answer key it still "
                                              "beats the seed (decided), and removing the key costs no decided amount."),
    RecipeReading("key-costs", "-", "0-", "Removing the answer key raises the held-out score (decided): the key costs "
                                          "reward there."),
    RecipeReading("recipe-loses", "0", "-", "Without the answer key the recipe scores below the seed on held-out "
                                           "(decided), and the key's own part does not separate."),
    RecipeReading("undecided", "0", "0", "Neither the key's part nor the recipe's separates on held-out at these "
                                         "seeds: the recipe's share is description only."),
)
"""First match wins; every pair of signs matches one row (``tests/test_recipe_baseline.py``)."""


def recipe_reading(key_earns: str, recipe_gains: str) -> RecipeReading:
    return next(r for r in RECIPE_READINGS if key_earns in r.key_earns and recipe_gains in r.recipe_gains)


@dataclass
class RecipeBaseline:
    per_seed: list[RecipeSeed]
    contrasts: dict[str, Contrast]  # heldout_recipe, heldout_key, val_recipe, val_key
    share_heldout: float | None
    share_val: float | None
    reading: str
    reading_rule: str
    metric_calls: int
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"per_seed": [asdict(s) for s in self.per_seed],
                "contrasts": {k: c.as_dict() for k, c in self.contrasts.items()},
                "share_heldout": self.share_heldout, "share_val": self.share_val, "reading": self.reading,
                "reading_rule": self.reading_rule, "metric_calls": self.metric_calls, "notes": self.notes}


def _share(seed: Sequence[float], recipe: Sequence[float], final: Sequence[float]) -> float | None:
    total = sum(f - s for s, f in zip(seed, final)) / len(seed)
    if abs(total) < 1e-12:
        return None
    return (sum(r - s for s, r in zip(seed, recipe)) / len(seed)) / total


def recipe_baseline(pairs: Sequence[tuple[RunRecord, RunRecord]], task: Task, *, worker, run_dir: str | Path,
                    jobs: int = 2, alpha: float = DEFAULT_ALPHA) -> RecipeBaseline:
    """``pairs``: per seed, (the seed candidate's run record, the optimizer's). Scores each recipe
    that differs from its final on test and (when the profile has it) val, ledgered in
    ``run_dir/recipe/``; decides the four contrasts (module docstring)."""
    if not pairs:
        raise RecipeError("no seed with finished runs of both the seed candidate and the optimizer")
    ledger = Ledger.open(Path(run_dir) / RECIPE_DIR)
    options = pairs[0][1].options_as_stated
    scorer = Scorer(task.benchmark, worker, None, options, jobs, ledger=ledger)
    usage = Usage()
    rows: list[RecipeSeed] = []
    examples: dict[str, dict[str, dict[int, dict[str, tuple[float, float]]]]] = {"test": {}, "val": {}}
    ledger.append_entry("recipe_start", {"seeds": [b.seed for b, _ in pairs], "line_drop_fraction": LINE_DROP_FRACTION})
    try:
        for base, final in sorted(pairs, key=lambda p: p[0].seed):
            scan = scan_candidate(final.final_candidate, task)
            recipe, removed = recipe_candidate(final.final_candidate, scan)
            rid = candidate_id(recipe)
            scored = rid != final.final_candidate_id and removed > 0
            scores: dict[str, dict[str, float]] = {}
            for split in ("test", "val"):
                examples_of = task.splits.get(split, [])
                if not scored or not examples_of:
                    scores[split] = final.verdict_scores(split)
                    continue
                verdicts = scorer.score_all(recipe, examples_of, DEPLOYMENT, usage, f"recipe of seed {final.seed} ({split})")
                usage.charge(len(examples_of))
                for ex, v in zip(examples_of, verdicts):
                    ledger.append_entry("recipe_scoring", {"seed": final.seed, "split": split, "candidate_id": rid,
                                                           "example_id": ex.id, "verdict": v.to_dict()})
                scores[split] = {ex.id: v.score for ex, v in zip(examples_of, verdicts)}
            ledger.append_entry("recipe", {"seed": final.seed, "final_id": final.final_candidate_id, "recipe_id": rid,
                                           "components": recipe, "removed_words": removed, "scored": scored})
            mean = lambda d: sum(d.values()) / len(d) if d else None  # noqa: E731
            for split in ("test", "val"):
                b, f, r = base.verdict_scores(split), final.verdict_scores(split), scores[split]
                examples[split][final.seed] = {ex: (b[ex], r[ex]) for ex in b if ex in r}
                examples[split][-1 - final.seed] = {ex: (r[ex], f[ex]) for ex in f if ex in r}  # key side
            rows.append(RecipeSeed(seed=final.seed, final_id=final.final_candidate_id, recipe_id=rid,
                                   seed_id=base.final_candidate_id,
                                   removed_words=removed, final_words=scan.words,
                                   seed_test=float(base.test_score), recipe_test=mean(scores["test"]) or 0.0,
                                   final_test=float(final.test_score), seed_val=base.val_score,
                                   recipe_val=mean(scores["val"]), final_val=final.val_score, scored=scored))
    finally:
        ledger.append_entry("recipe_end", {"metric_calls": usage.metric_calls})
        ledger.close()
    return decide_recipe(rows, examples, n_test=len(task.splits.get("test", [])),
                         n_val=len(task.splits.get("val", [])), metric_calls=usage.metric_calls, alpha=alpha)


def decide_recipe(rows: Sequence[RecipeSeed], examples: Mapping[str, Mapping[int, Mapping[str, tuple[float, float]]]],
                  *, n_test: int, n_val: int, metric_calls: int = 0, alpha: float = DEFAULT_ALPHA) -> RecipeBaseline:
    """The four contrasts, Holm together, the shares and the reading (module docstring).
    ``examples[split][seed]``: example -> (seed, recipe) scores; ``examples[split][-1 - seed]``:
    example -> (recipe, final)."""
    def pair(split: str, which: str) -> Contrast:
        a_key, b_key = {("test", "recipe"): ("seed_test", "recipe_test"), ("test", "key"): ("recipe_test", "final_test"),
                        ("val", "recipe"): ("seed_val", "recipe_val"), ("val", "key"): ("recipe_val", "final_val")}[
            (split, which)]
        use = [r for r in rows if getattr(r, a_key) is not None and getattr(r, b_key) is not None]
        per_example = {(r.seed if which == "recipe" else -1 - r.seed): r.seed for r in use}
        ex = {per_example[k]: v for k, v in examples.get(split, {}).items() if k in per_example}
        where = "held-out" if split == "test" else "validation"
        labels = ("seed", "recipe") if which == "recipe" else ("recipe", "final")
        label = f"recipe vs seed on {where}" if which == "recipe" else f"answer key (final vs recipe) on {where}"
        # every seed compared the same two candidates (identical recipes of a seed-blind key, say):
        # the seeds re-score one run, and the decision layer must know it
        sides = {(r.seed_id, r.recipe_id) if which == "recipe" else (r.recipe_id, r.final_id) for r in use}
        return contrast({r.seed: getattr(r, a_key) for r in use}, {r.seed: getattr(r, b_key) for r in use},
                        n_examples=max(1, n_test if split == "test" else n_val), alpha=alpha, labels=labels,
                        label=label, examples=ex, replayed=len(sides) == 1)
    names = ["heldout_recipe", "heldout_key"] + (["val_recipe", "val_key"] if n_val else [])
    raw = [pair("test", "recipe"), pair("test", "key")] + ([pair("val", "recipe"), pair("val", "key")] if n_val else [])
    decided = dict(zip(names, holm(raw, alpha)))
    share_test = _share([r.seed_test for r in rows], [r.recipe_test for r in rows], [r.final_test for r in rows])
    vals = [r for r in rows if None not in (r.seed_val, r.recipe_val, r.final_val)]
    share_val = (_share([r.seed_val for r in vals], [r.recipe_val for r in vals], [r.final_val for r in vals])
                 if vals else None)
    notes = []
    if not any(r.scored for r in rows):
        rule = RecipeReading("no-key", "", "", "No final candidate holds an answer key the scan finds: each recipe is "
                                               "its final candidate, so there is nothing to remove.")
    else:
        rule = recipe_reading(decided["heldout_key"].sign, decided["heldout_recipe"].sign)
    unscored = [r.seed for r in rows if not r.scored]
    if unscored and len(unscored) < len(rows):
        notes.append(f"seed(s) {unscored}: the final holds no key, so its recipe is the final (its scores are reused)")
    if share_test is None:
        notes.append("the recipe's share of the held-out gain is undefined: the final gains nothing over the seed")
    elif not math.isfinite(share_test):
        share_test = None
    return RecipeBaseline(per_seed=list(rows), contrasts=decided, share_heldout=share_test, share_val=share_val,
                          reading=rule.text, reading_rule=rule.name, metric_calls=metric_calls, notes=notes)


__all__ = ["LINE_DROP_FRACTION", "RECIPE_READINGS", "ComponentShare", "KeyToken", "RecipeBaseline",
           "RecipeError", "RecipeReading", "RecipeSeed", "component_shares", "decide_recipe", "key_tokens",
           "recipe_baseline", "recipe_candidate", "recipe_reading"]
