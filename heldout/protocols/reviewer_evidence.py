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

from heldout.benchmarks.loading import Task, load_task
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.protocols.gain_evidence import (DimensionGain, ItemEvidence, LineageDelta, accepted_order,
                                             dimension_gains, ledger_components, lineage_deltas, seed_item_gains)
from heldout.protocols.leak_scan import scan_candidate
from heldout.protocols.folders import LEAK_ABLATION_DIR
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


@dataclass
class MethodEvidence:
    """The evidence for one optimizer of a ``leak ablate`` run dir, or why there is none."""

    task: str
    profile: str
    method: str
    evidence: ReviewerEvidence | None
    missing: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "profile": self.profile, "method": self.method, "missing": self.missing,
                "evidence": None if self.evidence is None else self.evidence.as_dict()}


def study_evidence(run_dir: str | Path, *, baseline: str, worker, data_dir: str | None = None,
                   jobs: int = 2) -> list[MethodEvidence]:
    """The evidence of every optimizer under a study's run dir against the ``baseline`` method's
    runs of the same seeds (``leak ablate``); the recipe baselines score under ``run_dir/recipe/``.
    A method whose seeds have no finished baseline run gets the reason instead (per-item gains and
    the recipe baseline compare the two records of one seed)."""
    root = Path(run_dir)
    found = [(p.parent, RunRecord.load(p.parent)) for p in sorted(root.rglob(RECORD_FILE))
             if LEAK_ABLATION_DIR not in p.relative_to(root).parts]
    found = [(d, r) for d, r in found if r.status == "ok" and r.final_candidate]
    out = []
    for task_name, profile in sorted({(r.task, r.profile) for _, r in found}):
        group = [(d, r) for d, r in found if (r.task, r.profile) == (task_name, profile)]
        task = load_task(task_name, profile, data_dir)
        for method in sorted({r.method for _, r in group if r.method != baseline}):
            pairs = pair_by_seed([r for _, r in group], baseline, method)
            if not pairs:
                out.append(MethodEvidence(task_name, profile, method, None,
                                          f"no seed of {method!r} has a finished run of {baseline!r}: per-item gains "
                                          "and the recipe baseline compare the two runs of one seed"))
                continue
            dirs = {r.seed: d for d, r in group if r.method == method}
            with_key = task.kind == "prompt" and bool(task.splits.get("train"))
            evidence = gather(pairs, task, accepted={r.seed: accepted_order(r) for _, r in pairs},
                              texts={s: ledger_components(d) for s, d in dirs.items()}, worker=worker,
                              run_dir=root, jobs=jobs, with_recipe=with_key)
            out.append(MethodEvidence(task_name, profile, method, evidence))
    return out


__all__ = ["MethodEvidence", "ReviewerEvidence", "gather", "pair_by_seed", "study_evidence"]
