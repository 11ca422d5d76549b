"""The prompt autopsy of the generalisation protocol (step 6 of
:mod:`heldout.protocols.generalisation`): for every accepted candidate of each seed's run (each
one that became the best-so-far in the run record's ``trajectory``, then the final candidate),
its answer-key share (:func:`heldout.protocols.leak_scan.scan_candidate`) beside its validation
reward (the record's ``lineage`` mean on val, i.e. what the optimizer's own evaluations saw; the
harness's val score for a final candidate the optimizer never evaluated on val) and, for the
final candidate only, its held-out score. Held-out scores of intermediate candidates are not in
the records and are not scored here. The Spearman correlation of share with validation reward
is description, not a verdict (:data:`CAVEAT`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from scipy import stats as scipy_stats

from heldout.benchmarks.loading import Task
from heldout.evaluators.ledger import LEDGER_FILE, read_entries
from heldout.evaluators.records import RunRecord
from heldout.protocols.leak_scan import scan_candidate

CAVEAT = ("along one lineage each accepted candidate extends its parent, so answer-key share and validation reward "
          "tend to rise together and the candidates are not independent: the correlation is description, not a "
          "verdict")


@dataclass(frozen=True)
class AutopsyRow:
    """One accepted candidate of one seed's run. ``val_reward`` is the mean val score the
    optimizer's own evaluations gave it (``val_source`` "optimizer"), or for a final candidate it
    never evaluated on val, the harness's val score ("harness"); None when neither exists.
    ``heldout`` is set for the final candidate only. ``accepted``: it became the best-so-far
    during the run (a final candidate the run returned without that is ``final`` only)."""

    seed: int
    step: int
    candidate_id: str
    parent: str | None
    first_metric_call: int | None
    final: bool
    share: float
    key_words: int
    words: int
    encoded: int
    families: int
    val_reward: float | None
    val_source: str
    heldout: float | None
    accepted: bool = True


@dataclass
class Autopsy:
    rows: list[AutopsyRow]
    spearman_rho: float | None
    spearman_p: float | None
    n_candidates: int
    correlation_note: str
    notes: list[str] = field(default_factory=list)

    def final_shares(self) -> list[float]:
        return [r.share for r in self.rows if r.final]

    def as_dict(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows], "spearman_rho": self.spearman_rho,
                "spearman_p": self.spearman_p, "n_candidates": self.n_candidates,
                "correlation_note": self.correlation_note, "caveat": CAVEAT, "notes": self.notes}


def ledger_components(run_dir: Path) -> dict[str, dict[str, str]]:
    """candidate id -> components, from the session ledger's ``candidate`` / ``final_candidate`` entries."""
    entries, _ = read_entries(run_dir / LEDGER_FILE)
    return {e["data"]["candidate_id"]: dict(e["data"]["components"]) for e in entries
            if e.get("kind") in ("candidate", "final_candidate") and isinstance(e.get("data"), dict)}


def accepted_candidates(record: RunRecord) -> list[str]:
    """The candidates the run accepted, in order: each one that became the best-so-far (the
    record's ``trajectory``), then the final candidate if it is not among them."""
    order = list(dict.fromkeys(t["candidate_id"] for t in record.trajectory if t.get("candidate_id")))
    if record.final_candidate_id and record.final_candidate_id not in order:
        order.append(record.final_candidate_id)
    return order


def autopsy(records: Sequence[RunRecord], run_dirs: dict[int, Path], task: Task) -> Autopsy:
    """The prompt autopsy of the optimizer's runs (see the module docstring, step 6)."""
    rows: list[AutopsyRow] = []
    missing = 0
    for rec in sorted(records, key=lambda r: r.seed):
        lineage = {entry["candidate_id"]: entry for entry in rec.lineage}
        texts = ledger_components(run_dirs[rec.seed])
        if rec.final_candidate and rec.final_candidate_id:
            texts[rec.final_candidate_id] = dict(rec.final_candidate)
        best_so_far = {t["candidate_id"] for t in rec.trajectory if t.get("candidate_id")}
        for step, cid in enumerate(accepted_candidates(rec)):
            if cid not in texts:
                missing += 1
                continue
            scan = scan_candidate(texts[cid], task)
            info = lineage.get(cid, {})
            final = cid == rec.final_candidate_id
            val = info.get("means", {}).get("val")
            source = "optimizer"
            if val is None and final and rec.val_score is not None:
                val, source = float(rec.val_score), "harness"
            rows.append(AutopsyRow(seed=rec.seed, step=step, candidate_id=cid, parent=info.get("parent"),
                                   first_metric_call=info.get("first_metric_call"), final=final, share=scan.share,
                                   key_words=scan.key_words, words=scan.words, encoded=len(scan.encoded),
                                   families=len(scan.memorised_families),
                                   val_reward=None if val is None else float(val),
                                   val_source=source if val is not None else "none",
                                   heldout=float(rec.test_score) if final and rec.test_score is not None else None,
                                   accepted=cid in best_so_far))
    paired = [(r.share, r.val_reward) for r in rows if r.val_reward is not None]
    rho = p = None
    if len(paired) < 3:
        note = f"Spearman correlation not computed: {len(paired)} accepted candidate(s) with a validation reward (>= 3 needed)"
    elif len({s for s, _ in paired}) < 2 or len({v for _, v in paired}) < 2:
        constant = "answer-key share" if len({s for s, _ in paired}) < 2 else "validation reward"
        note = f"Spearman correlation undefined: the {constant} is the same for all {len(paired)} accepted candidates"
    else:
        result = scipy_stats.spearmanr([s for s, _ in paired], [v for _, v in paired])
        rho, p = float(result.statistic), float(result.pvalue)
        note = (f"Spearman rho of answer-key share with validation reward over {len(paired)} accepted candidates: "
                f"{rho:+.2f} (p {p:.3g}, description only)")
    notes = ["Held-out reward of intermediate candidates: not in the run records (the harness scores only the "
             "final candidate on test), and not scored here, which would spend test scoring on candidates the "
             "optimizer chose; the held-out column holds final candidates only."]
    if missing:
        notes.append(f"{missing} accepted candidate(s) have no components in their session ledger and are left out")
    return Autopsy(rows=rows, spearman_rho=rho, spearman_p=p, n_candidates=len(paired), correlation_note=note,
                   notes=notes)


__all__ = ["CAVEAT", "Autopsy", "AutopsyRow", "accepted_candidates", "autopsy", "ledger_components"]
