"""The evidence a reviewer of a prompt-optimisation paper asks for, gathered for one optimizer
against the seed candidate (used by ``protocol generalisation`` and ``leak ablate``):
per-seed held-out gains over test items and the improved / regressed / unchanged counts, the
per-dimension gains, lineage deltas (:mod:`heldout.protocols.gain_evidence`), the answer-key
share per component of each final candidate and the recipe baseline
(:mod:`heldout.protocols.recipe`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from heldout.benchmarks.loading import Task
from heldout.evaluators.records import RunRecord
from heldout.protocols.gain_evidence import (DimensionGain, ItemEvidence, LineageDelta, dimension_gains,
                                             lineage_deltas, seed_item_gains)
from heldout.protocols.leakage import scan_candidate
from heldout.protocols.recipe import RecipeBaseline, component_shares, recipe_baseline


@dataclass
class ReviewerEvidence:
    items: ItemEvidence
    dimensions: list[DimensionGain]
    lineage: list[LineageDelta]
    component_shares: dict[int, list[dict[str, Any]]]  # seed -> per component of its final candidate
    recipe: RecipeBaseline | None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"items": self.items.as_dict(), "dimensions": [d.as_dict() for d in self.dimensions],
                "lineage": [asdict(d) for d in self.lineage],
                "component_shares": {str(k): v for k, v in self.component_shares.items()},
                "recipe": None if self.recipe is None else self.recipe.as_dict(), "notes": self.notes}


def pair_by_seed(records: Sequence[RunRecord], baseline: str, method: str) -> list[tuple[RunRecord, RunRecord]]:
    """(baseline's record, method's record) for every seed both finished."""
    by = {(r.method, r.seed): r for r in records if r.status == "ok"}
    return [(by[(baseline, s)], by[(method, s)]) for (m, s) in sorted(by) if m == method and (baseline, s) in by]


def gather(pairs: Sequence[tuple[RunRecord, RunRecord]], task: Task, *, accepted: Mapping[int, Sequence[str]],
           texts: Mapping[int, Mapping[str, Mapping[str, str]]], worker, run_dir: str | Path,
           jobs: int = 2, with_recipe: bool = True) -> ReviewerEvidence:
    """``accepted[seed]``: that run's accepted candidate ids; ``texts[seed]``: candidate id ->
    components from its session ledger. The recipe baseline scores under ``run_dir/recipe/``."""
    seed_candidate = task.benchmark.seed_candidate()
    lineage = [d for base, final in pairs
               for d in lineage_deltas(final, accepted.get(final.seed, []), texts.get(final.seed, {}), seed_candidate)]
    shares = {final.seed: [c.as_dict() for c in component_shares(final.final_candidate,
                                                                 scan_candidate(final.final_candidate, task))]
              for _, final in pairs}
    dims = dimension_gains(pairs, "test")
    notes = [] if dims else ["per-dimension gains: the verifier ledgered no dimensions on the held-out verdicts"]
    recipe = recipe_baseline(pairs, task, worker=worker, run_dir=run_dir, jobs=jobs) if with_recipe else None
    return ReviewerEvidence(items=seed_item_gains(pairs, "test"), dimensions=dims, lineage=lineage,
                            component_shares=shares, recipe=recipe, notes=notes)


__all__ = ["ReviewerEvidence", "gather", "pair_by_seed"]
