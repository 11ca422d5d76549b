"""The reviewer-evidence tables of a generalisation report (and of ``leak ablate``), from
:class:`heldout.protocols.reviewer_evidence.ReviewerEvidence`: held-out gain per seed over test
items with the changed-question counts, per-dimension gains, lineage deltas, answer-key share per
component, and the recipe baseline."""

from __future__ import annotations

import math

from heldout.protocols.decide import Contrast
from heldout.protocols.reviewer_evidence import ReviewerEvidence
from heldout.reports.tables import Cell, Table


def _num(x: float | None, fmt: str = "+.3f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def _verdict(c: Contrast) -> Cell:
    word = {"+": "higher", "-": "lower", "0": "not separated"}[c.sign]
    return Cell(f"{word} (Holm p {c.p_holm:.3g})", strong=c.decided)


def item_gain_table(ev: ReviewerEvidence, prefix: str = "") -> Table:
    items = ev.items
    rows = [[Cell(str(s.seed)), Cell(str(s.n_items)), Cell(_num(s.gain)),
             Cell(f"[{_num(s.low)}, {_num(s.high)}]" + ("" if s.interval in ("bca", "percentile") else f" ({s.interval})")),
             Cell(str(s.improved)), Cell(str(s.regressed)), Cell(str(s.unchanged))] for s in items.per_seed]
    total = items.net_improved + items.net_regressed + items.net_unchanged
    rows.append([Cell("net over seeds"), Cell(str(total)), Cell(""), Cell(""), Cell(str(items.net_improved)),
                 Cell(str(items.net_regressed)), Cell(str(items.net_unchanged))])
    notes = ["Per seed: the held-out gain of the final candidate over the seed candidate as the mean paired "
             "difference over test questions, with a 95% bootstrap interval over those questions (BCa; description of "
             "one run, not a verdict: the verdict is the seed-level one of table 2). Improved / regressed / unchanged: "
             "test questions whose score went up, down or stayed.",
             f"Net over seeds: each question once, its change summed over the seeds; exact sign test over the "
             f"{items.net_improved + items.net_regressed} net-changed questions p {items.net_p:.3g} (description)."]
    return Table(key="item_gains", title=f"{prefix}Held-out gain per seed over test items",
                 columns=["seed", "questions", "gain", "95% CI (items)", "improved", "regressed", "unchanged"],
                 rows=rows, notes=notes, data=[items.as_dict()])


def dimension_table(ev: ReviewerEvidence, prefix: str = "") -> Table | None:
    if not ev.dimensions:
        return None
    seeds = sorted({s for d in ev.dimensions for s in d.per_seed})
    rows = [[Cell(d.dimension)] + [Cell(_num(d.per_seed.get(s))) for s in seeds] + [Cell(_num(d.pooled))]
            for d in ev.dimensions]
    notes = ["Held-out gain per verifier dimension (final minus seed candidate, mean over test questions), per seed "
             "and pooled: where the gain comes from. Dimensions as the verifier ledgered them; the score is the "
             "verifier's combination of them."]
    return Table(key="dimension_gains", title=f"{prefix}Held-out gain per verifier dimension",
                 columns=["dimension"] + [f"seed {s}" for s in seeds] + ["pooled"], rows=rows, notes=notes,
                 data=[d.as_dict() for d in ev.dimensions])


def lineage_table(ev: ReviewerEvidence, prefix: str = "") -> Table:
    rows = [[Cell(str(d.seed)), Cell(d.candidate_id[:12]), Cell((d.parent or "seed candidate")[:14]),
             Cell(", ".join(d.changed) or "none"), Cell(str(d.words)), Cell(f"{d.words_delta:+d}"),
             Cell(_num(d.val_reward, ".3f")), Cell(_num(d.val_delta))] for d in ev.lineage]
    notes = ["Each accepted candidate against its parent (the lineage the optimizer recorded; no parent: against the "
             "seed candidate): the components whose text changed, its whitespace word count and the change (prompt "
             "bloat), its validation reward from the optimizer's own evaluations and the change from the parent's."]
    return Table(key="lineage", title=f"{prefix}Lineage deltas", columns=["seed", "candidate", "parent", "changed",
                                                                          "words", "Δ words", "val reward", "Δ val"],
                 rows=rows, notes=notes, data=[{"seed": d.seed, "candidate_id": d.candidate_id, "parent": d.parent,
                                                "changed": list(d.changed), "words": d.words,
                                                "words_delta": d.words_delta, "val_reward": d.val_reward,
                                                "val_delta": d.val_delta} for d in ev.lineage])


def component_share_table(ev: ReviewerEvidence, prefix: str = "") -> Table:
    rows = [[Cell(str(seed)), Cell(c["component"]), Cell(str(c["words"])), Cell(str(c["key_words"])),
             Cell(f"{c['share']:.1%}")] for seed, comps in sorted(ev.component_shares.items()) for c in comps]
    notes = ["Answer-key share of each component of each seed's final candidate: the leak scan's key words located "
             "in that component, over its words."]
    return Table(key="component_shares", title=f"{prefix}Answer-key share per component",
                 columns=["seed", "component", "words", "key words", "share"], rows=rows, notes=notes,
                 data=[{"seed": s, **c} for s, comps in sorted(ev.component_shares.items()) for c in comps])


def recipe_table(ev: ReviewerEvidence, prefix: str = "") -> Table | None:
    rec = ev.recipe
    if rec is None:
        return None
    rows = [[Cell(str(r.seed)), Cell(f"{r.removed_words} of {r.final_words}"), Cell(f"{r.seed_test:.3f}"),
             Cell(f"{r.recipe_test:.3f}"), Cell(f"{r.final_test:.3f}"), Cell(_num(r.seed_val, ".3f")),
             Cell(_num(r.recipe_val, ".3f")), Cell(_num(r.final_val, ".3f"))] for r in rec.per_seed]
    c = rec.contrasts
    rows.append([Cell("verdict"), Cell(""), Cell(""), _verdict(c["heldout_recipe"]), _verdict(c["heldout_key"]),
                 Cell(""), _verdict(c["val_recipe"]) if "val_recipe" in c else Cell("-"),
                 _verdict(c["val_key"]) if "val_key" in c else Cell("-")])
    share = "undefined" if rec.share_heldout is None else f"{rec.share_heldout:.0%}"
    share_val = "undefined" if rec.share_val is None else f"{rec.share_val:.0%}"
    notes = ["Recipe baseline: each seed's final candidate with its answer key removed (the leak scan's spans; a line "
             "at least half key words is dropped whole), scored on held-out and validation; seed and final scores are "
             "the harness's. Verdicts: rule seed-paired-contrast, Holm over the four; under 'recipe held-out' the "
             "recipe against the seed, under 'final held-out' the final against the recipe (what the key earns), and "
             "the same on validation.",
             f"The recipe's share of the gain: held-out {share}, validation {share_val} (mean over seeds of recipe - "
             "seed over final - seed; description).", f"Reading rule {rec.reading_rule!r}: {rec.reading}"] + rec.notes
    return Table(key="recipe", title=f"{prefix}Recipe baseline (final minus its answer key)",
                 columns=["seed", "key words removed", "seed held-out", "recipe held-out", "final held-out",
                          "seed val", "recipe val", "final val"], rows=rows, notes=notes, data=[rec.as_dict()])


def evidence_tables(ev: ReviewerEvidence, prefix: str = "") -> list[Table]:
    """Every evidence table that has something to show, in reading order."""
    tables = [item_gain_table(ev, prefix), dimension_table(ev, prefix), lineage_table(ev, prefix),
              component_share_table(ev, prefix), recipe_table(ev, prefix)]
    return [t for t in tables if t is not None]


def tables_text(tables: list[Table]) -> str:
    """The tables as plain text for a terminal: title, header, rows, notes."""
    lines = []
    for table in tables:
        cells = [table.columns] + [[c.text for c in row] for row in table.rows]
        widths = [max(len(r[i]) if i < len(r) else 0 for r in cells) for i in range(len(table.columns))]
        lines += ["", table.title]
        lines += ["  " + "  ".join(text.ljust(w) for text, w in zip(row, widths)).rstrip() for row in cells]
        lines += ["  " + note for note in table.notes]
    return "\n".join(lines)


__all__ = ["tables_text", "component_share_table", "dimension_table", "evidence_tables", "item_gain_table", "lineage_table",
           "recipe_table"]
