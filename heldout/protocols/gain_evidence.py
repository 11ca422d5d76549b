"""What a reviewer asks of a held-out gain beyond its seed-level verdict, computed from the run
records and session ledgers the study already wrote (nothing here scores anything):

* **per seed, the held-out gain with its interval over test items** (:func:`seed_item_gains`):
  the mean paired difference final minus seed candidate over the test questions and its 95%
  bootstrap interval (:func:`heldout.protocols.stats.mean_interval`). It describes one run; the
  verdict stays the seed-level one (:mod:`heldout.protocols.decide`), since a run's questions
  share its candidate;
* **improved / regressed / unchanged** test questions, per seed and net over the seeds (each
  question once, its change summed over the seeds, as :func:`heldout.protocols.decide.changed_examples`
  counts them);
* **per-dimension gains** (:func:`dimension_gains`) where the verifier ledgered dimensions: the
  held-out gain of each dimension per seed and pooled, so a gain is located (exact match against
  token F1, tests passed against the objective);
* **lineage deltas** (:func:`lineage_deltas`): each accepted candidate against its parent, which
  components changed, its word count and the change in words (prompt bloat), and the change in the
  optimizer's own validation mean."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from heldout.evaluators.ledger import LEDGER_FILE, read_entries
from heldout.evaluators.records import RunRecord
from heldout.protocols.decide import changed_examples
from heldout.protocols.stats import mean_interval

CHANGE_EPS = 1e-12


@dataclass(frozen=True)
class SeedItemGain:
    """One seed's held-out gain over its test items (description of one run)."""

    seed: int
    n_items: int
    gain: float
    low: float
    high: float
    interval: str  # the bootstrap method used ("bca", "percentile", "degenerate", "undefined")
    improved: int
    regressed: int
    unchanged: int


@dataclass(frozen=True)
class ItemEvidence:
    per_seed: list[SeedItemGain]
    net_improved: int
    net_regressed: int
    net_unchanged: int
    net_p: float  # the exact sign test over net-changed questions (description beside the seed verdict)

    def as_dict(self) -> dict[str, Any]:
        return {"per_seed": [asdict(s) for s in self.per_seed], "net_improved": self.net_improved,
                "net_regressed": self.net_regressed, "net_unchanged": self.net_unchanged, "net_p": self.net_p}


def seed_item_gains(pairs: Sequence[tuple[RunRecord, RunRecord]], split: str = "test", *,
                    n_boot: int = 4000) -> ItemEvidence:
    """``pairs``: per seed, (seed candidate's record, optimizer's record). The interval's
    bootstrap seed is the run's seed, so a report re-renders the same numbers."""
    rows = []
    examples: dict[int, dict[str, tuple[float, float]]] = {}
    for base, final in sorted(pairs, key=lambda p: p[1].seed):
        b, f = base.verdict_scores(split), final.verdict_scores(split)
        common = sorted(set(b) & set(f))
        diff = np.array([f[i] - b[i] for i in common], dtype=float)
        examples[final.seed] = {i: (b[i], f[i]) for i in common}
        if len(diff):
            ci = mean_interval(diff, n_boot=n_boot, seed=final.seed)
            low, high, method = ci.low, ci.high, ci.method
        else:
            low = high = float("nan")
            method = "undefined"
        rows.append(SeedItemGain(seed=final.seed, n_items=len(common), gain=float(diff.mean()) if len(diff) else 0.0,
                                 low=float(low), high=float(high), interval=method,
                                 improved=int((diff > CHANGE_EPS).sum()), regressed=int((diff < -CHANGE_EPS).sum()),
                                 unchanged=int((np.abs(diff) <= CHANGE_EPS).sum())))
    p, up, down = changed_examples(examples, sorted(examples))
    questions = set().union(*(set(v) for v in examples.values())) if examples else set()
    return ItemEvidence(per_seed=rows, net_improved=up, net_regressed=down, net_unchanged=len(questions) - up - down,
                        net_p=p)


@dataclass(frozen=True)
class DimensionGain:
    dimension: str
    per_seed: dict[int, float]

    @property
    def pooled(self) -> float:
        return float(np.mean(list(self.per_seed.values()))) if self.per_seed else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"dimension": self.dimension, "per_seed": {str(k): v for k, v in self.per_seed.items()},
                "pooled": self.pooled}


def _dimensions(record: RunRecord, split: str) -> dict[str, dict[str, float]]:
    verdicts = record.test_verdicts if split == "test" else record.val_verdicts
    return {v["example_id"]: {k: float(x) for k, x in (v.get("dimensions") or {}).items()
                              if isinstance(x, (int, float)) and not isinstance(x, bool)} for v in verdicts}


def dimension_gains(pairs: Sequence[tuple[RunRecord, RunRecord]], split: str = "test") -> list[DimensionGain]:
    """Per dimension every verdict of both sides carries, the mean paired gain per seed; [] when
    the verifier ledgers no dimensions."""
    out: dict[str, dict[int, float]] = {}
    for base, final in pairs:
        b, f = _dimensions(base, split), _dimensions(final, split)
        common = [i for i in b if i in f]
        if not common:
            continue
        names = set.intersection(*(set(b[i]) & set(f[i]) for i in common))
        for name in sorted(names):
            out.setdefault(name, {})[final.seed] = float(np.mean([f[i][name] - b[i][name] for i in common]))
    return [DimensionGain(name, dict(sorted(per.items()))) for name, per in sorted(out.items())]


@dataclass(frozen=True)
class LineageDelta:
    """One accepted candidate against its parent (``parent`` None: no parent recorded, so the
    deltas are against the seed candidate)."""

    seed: int
    candidate_id: str
    parent: str | None
    changed: tuple[str, ...]  # components whose text differs from the parent's
    words: int
    words_delta: int
    val_reward: float | None
    val_delta: float | None


def _word_count(components: Mapping[str, str]) -> int:
    return sum(len(text.split()) for text in components.values())


def lineage_deltas(record: RunRecord, accepted: Sequence[str], texts: Mapping[str, Mapping[str, str]],
                   seed_candidate: Mapping[str, str]) -> list[LineageDelta]:
    """``accepted``: the run's accepted candidate ids in order; ``texts``: candidate id ->
    components (the session ledger's candidate entries); a candidate without text is left out."""
    lineage = {e["candidate_id"]: e for e in record.lineage}
    out = []
    for cid in accepted:
        if cid not in texts:
            continue
        info = lineage.get(cid, {})
        parent = info.get("parent")
        before = texts.get(parent) if parent else None
        reference = dict(before) if before is not None else dict(seed_candidate)
        now = dict(texts[cid])
        changed = tuple(sorted(k for k in set(now) | set(reference) if now.get(k) != reference.get(k)))
        val = info.get("means", {}).get("val")
        parent_val = lineage.get(parent, {}).get("means", {}).get("val") if parent else None
        out.append(LineageDelta(seed=record.seed, candidate_id=cid, parent=parent if before is not None else None,
                                changed=changed, words=_word_count(now),
                                words_delta=_word_count(now) - _word_count(reference),
                                val_reward=None if val is None else float(val),
                                val_delta=None if val is None or parent_val is None else float(val) - float(parent_val)))
    return out




def accepted_order(record: RunRecord) -> list[str]:
    """A run's accepted candidates in order: each best-so-far of its trajectory, then the final."""
    order = list(dict.fromkeys(t["candidate_id"] for t in record.trajectory if t.get("candidate_id")))
    if record.final_candidate_id and record.final_candidate_id not in order:
        order.append(record.final_candidate_id)
    return order


def ledger_components(run_dir: Path) -> dict[str, dict[str, str]]:
    """Candidate id -> components, from a session ledger's candidate entries."""
    entries, _ = read_entries(Path(run_dir) / LEDGER_FILE)
    return {e["data"]["candidate_id"]: dict(e["data"]["components"]) for e in entries
            if e.get("kind") in ("candidate", "final_candidate") and isinstance(e.get("data"), dict)}


__all__ = ["DimensionGain", "ItemEvidence", "LineageDelta", "SeedItemGain", "accepted_order", "dimension_gains",
           "ledger_components", "lineage_deltas", "seed_item_gains"]
