"""The report of the generalisation-first protocol (:mod:`heldout.protocols.generalisation`).

Tables, in this order: the split proof; validation gain vs held-out gain per seed and pooled
(with the three seed-paired verdicts); the topic-shared ablation; the prompt autopsy (table,
then its figure: :func:`heldout.reports.figures.autopsy_plot`); the verifier ablation (when variants were named); the reading, one sentence per row with the number
or verdict it comes from. Written to ``RUN_DIR/report/`` as ``report.md``, ``report.html`` and
``results.json`` by the ordinary renderers (:func:`heldout.reports.render.write_report`, with the
study's runs for provenance and the drill-down), ``generalisation.json`` (the whole protocol
result) and one LaTeX table per part in ``paper/`` (:func:`heldout.reports.paper.latex_table`)."""

from __future__ import annotations

import json
from pathlib import Path

from heldout.contracts import json_safe
from heldout.files import write_text_atomically
from heldout.protocols.decide import Contrast, replicates_nothing
from heldout.protocols.generalisation import RUNS_DIR, GeneralisationResult
from heldout.protocols.prompt_autopsy import CAVEAT
from heldout.protocols.leak_readings import HELD_OUT_ROW
from heldout.reports.collect import collect_runs
from heldout.reports.evidence_tables import evidence_tables
from heldout.reports.figures import autopsy_plot
from heldout.reports.paper import latex_table
from heldout.reports.render import Report, write_report
from heldout.reports.tables import Cell, Table

REPORT_DIR = "report"
RESULT_FILE = "generalisation.json"


def _verdict(c: Contrast | None) -> Cell:
    if c is None:
        return Cell("-")
    if replicates_nothing(c):  # one run re-scored by every seed: no seed-level verdict, no seed-level p
        evidence = (f"; per question {c.changed[0]} up / {c.changed[1]} down, p {c.p:.3g}"
                    if c.changed is not None else "")
        return Cell(f"one run (the seeds replicate nothing{evidence})")
    word = {"+": "higher", "-": "lower", "0": "not separated"}[c.sign]
    return Cell(f"{word} (Holm p {c.p_holm:.3g})", strong=c.decided)


def _ci(c: Contrast) -> str:
    return f"[{c.low:+.3f}, {c.high:+.3f}]"


def split_table(result: GeneralisationResult) -> Table:
    split = result.split
    rows = [[Cell(pool), Cell(str(c["examples"])), Cell(str(c["groups"])), Cell(str(c["ungrouped"]))]
            for pool, c in split.pools.items()]
    verdict = ("PROVEN topic-disjoint" if split.proven else
               "NOT PROVEN topic-disjoint; allowed by --allow-topic-shared (recorded)")
    notes = [f"Split check of {split.task} [{split.profile}]: {verdict}. {split.verdict}.",
             f"Near-duplicate pairs across pools: {split.near_duplicates} (listed in generalisation.json)."]
    return Table(key="split_proof", title="1. Split proof", columns=["pool", "examples", "groups", "ungrouped"],
                 rows=rows, notes=notes, data=[split.as_dict()])


def gains_table(result: GeneralisationResult) -> Table:
    comp = result.comparison
    rows = [[Cell(str(g.seed)), Cell(f"{g.seed_val:.3f}"), Cell(f"{g.final_val:.3f}"), Cell(f"{g.val_gain:+.3f}"),
             Cell(f"{g.seed_test:.3f}"), Cell(f"{g.final_test:.3f}"), Cell(f"{g.heldout_gain:+.3f}"),
             Cell(f"{g.val_gain - g.heldout_gain:+.3f}")] for g in comp.per_seed]
    rows.append([Cell("pooled"), Cell(""), Cell(""), Cell(f"{comp.pooled('val_gain'):+.3f}"), Cell(""), Cell(""),
                 Cell(f"{comp.pooled('heldout_gain'):+.3f}"),
                 Cell(f"{comp.pooled('val_gain') - comp.pooled('heldout_gain'):+.3f}")])
    rows.append([Cell("verdict"), Cell(""), Cell(""), _verdict(comp.validation), Cell(""), Cell(""),
                 _verdict(comp.heldout), _verdict(comp.gap)])
    rows.append([Cell("95% CI (seeds)"), Cell(""), Cell(""), Cell(_ci(comp.validation)), Cell(""), Cell(""),
                 Cell(_ci(comp.heldout)), Cell(_ci(comp.gap))])
    name = result.spec.optimizer.name
    notes = [f"{name} against the seed candidate, paired by seed; val and held-out scores of each final candidate "
             "scored once by the harness after the optimizer returned. Verdicts: rule seed-paired-contrast, Holm over "
             "these three."] + [c.sentence for c in (comp.validation, comp.heldout, comp.gap)]
    return Table(key="gains", title="2. Validation gain vs held-out gain",
                 columns=["seed", "seed val", f"{name} val", "val gain", "seed held-out", f"{name} held-out",
                          "held-out gain", "gap (val - held-out)"],
                 rows=rows, notes=notes, data=[comp.as_dict()])


ABLATION_LABELS = {"test": "held-out topics", "train": "exact training questions",
                   "train_encoded": "exact training questions the key encodes",
                   "probe_memorised": "fresh questions, memorised families",
                   "probe_other": "fresh questions, other trained families"}


def ablation_table(result: GeneralisationResult) -> Table:
    m = result.method_ablation()
    rows = []
    for r in m.rows:
        label = ABLATION_LABELS[r.subset] if r.subset != "test" else HELD_OUT_ROW[m.topic_disjoint]
        if r.gain is None or r.seed_contrast is None:
            rows.append([Cell(label), Cell(str(r.n_examples)), Cell(str(r.n_seeds)),
                         Cell("n/a (no examples)"), Cell(""), Cell("-")])
            continue
        rows.append([Cell(label), Cell(str(r.n_examples)), Cell(str(r.n_seeds)),
                     Cell(f"{r.gain:+.3f}"), Cell(_ci(r.seed_contrast)), _verdict(r.seed_contrast)])
    notes = [f"Topic-shared ablation (heldout leak ablate) of {m.method} against the seed candidate: per subset the "
             f"mean paired gain, the seed-level interval and the seed-paired verdict, Holm over the "
             f"{result.ablation.family} rows with examples; scored and ledgered in {RUNS_DIR}/ablation/."]
    notes += result.ablation.notes
    notes.append(f"Reading rule {m.reading_rule!r}: {m.reading}")
    return Table(key="ablation", title="3. Topic-shared ablation",
                 columns=["subset", "examples", "seeds", "gain", "95% CI (seeds)", "verdict"],
                 rows=rows, notes=notes, data=[m.to_dict()])


def autopsy_table(result: GeneralisationResult) -> Table:
    auto = result.autopsy
    rows = [[Cell(str(r.seed)), Cell(str(r.step)), Cell(r.candidate_id[:12]), Cell(", ".join(role for role, on in (("accepted", r.accepted), ("final", r.final)) if on)),
             Cell(f"{r.share:.1%}"), Cell(str(r.encoded)), Cell(str(r.families)),
             Cell("-" if r.val_reward is None else f"{r.val_reward:.3f} ({r.val_source})"),
             Cell("-" if r.heldout is None else f"{r.heldout:.3f}")] for r in auto.rows]
    notes = ["Every accepted candidate of each seed's run (each best-so-far of the run record's trajectory, then the "
             "final candidate): its answer-key share (heldout leak scan) beside its validation reward (optimizer: the "
             "mean of the optimizer's own val evaluations; harness: the harness's val score of the final candidate).",
             auto.correlation_note + ".", "Caveat: " + CAVEAT + "."] + auto.notes
    return Table(key="autopsy", title="4. Prompt autopsy",
                 columns=["seed", "step", "candidate", "role", "answer-key share", "encoded", "families",
                          "validation reward", "held-out"],
                 rows=rows, notes=notes, data=[auto.as_dict()], figure="autopsy")


def verifier_table(result: GeneralisationResult) -> Table | None:
    ver = result.verifier
    if ver is None:
        return None
    rows = [[Cell(r.variant), Cell(str(len(r.seeds))), Cell(f"{r.mean_val_gain:+.3f}"), Cell(f"{r.mean_transfer:+.3f}"),
             Cell(f"{r.mean_gap:+.3f}"), _verdict(r.gap_verdict), _verdict(r.transfer_vs_canonical)]
            for r in ver.rows]
    notes = [f"Verifier ablation (heldout compare verifiers): validation gain on {ver.selection_split} under each "
             "variant's own verifier, transfer on held-out under the canonical verifier; verdicts Holm over every gap "
             "and transfer contrast."] + ver.notes + [f"{r.variant}: {r.reading}" for r in ver.rows]
    return Table(key="verifiers", title="5. Verifier ablation",
                 columns=["variant", "seeds", "val gain", "transfer", "gaming gap", "gap verdict",
                          "transfer vs canonical"], rows=rows, notes=notes, data=[ver.to_dict()])


def reading_table(result: GeneralisationResult) -> Table:
    rows = [[Cell(str(k + 1)), Cell(s.text, strong=k == len(result.reading) - 1), Cell(s.source)]
            for k, s in enumerate(result.reading)]
    return Table(key="reading", title="Reading (generated from the decision rules)", columns=["#", "sentence", "from"],
                 rows=rows, notes=[f"Answer rule: {result.answer}."],
                 data=[{"answer": result.answer, "sentences": [{"text": s.text, "source": s.source}
                                                              for s in result.reading]}])


def generalisation_report(result: GeneralisationResult, run_dir: str | Path) -> Report:
    """The protocol's tables over the study's verified runs (for provenance and the drill-down)."""
    runs = collect_runs([Path(run_dir) / RUNS_DIR])
    report = Report(runs=runs, baseline="seed", alpha=0.05)
    report.warnings += [f"EXCLUDED {ex.path}: {ex.reason}" for ex in runs.excluded]
    if not result.split.proven:
        report.warnings.append(f"NOT PROVEN topic-disjoint: {result.split.verdict}; run with --allow-topic-shared")
    report.tables += [split_table(result), gains_table(result), ablation_table(result), autopsy_table(result)]
    figure = autopsy_plot(result.autopsy.rows, CAVEAT)
    if figure is not None:
        report.figures.append(figure)
    if result.evidence is not None:  # what a reviewer asks beside the verdicts (reviewer_evidence)
        report.tables += evidence_tables(result.evidence)
    verifier = verifier_table(result)
    if verifier is not None:
        report.tables.append(verifier)
    else:
        report.notes.append("Verifier ablation: skipped (no --variants named).")
    report.tables.append(reading_table(result))
    return report


def write_generalisation_report(result: GeneralisationResult, run_dir: str | Path) -> dict[str, Path]:
    """Write the report to ``RUN_DIR/report/``; returns what was written by name."""
    out = Path(run_dir) / REPORT_DIR
    report = generalisation_report(result, run_dir)
    written = dict(write_report(report, out))
    written["generalisation.json"] = out / RESULT_FILE
    write_text_atomically(out / RESULT_FILE, json.dumps(json_safe(result.as_dict()), indent=1, default=str))
    (out / "paper").mkdir(parents=True, exist_ok=True)
    for table in report.tables:
        path = out / "paper" / f"{table.key}.tex"
        write_text_atomically(path, latex_table(table, f"heldout-generalisation-{table.key}"))
        written[path.name] = path
    return written


__all__ = ["REPORT_DIR", "RESULT_FILE", "ablation_table", "autopsy_table", "gains_table", "generalisation_report",
           "reading_table", "split_table", "verifier_table", "write_generalisation_report"]
