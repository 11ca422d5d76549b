"""Tables for run dirs a protocol command wrote, so ``heldout report RUN_DIR`` shows what the
protocol compared and not only the runs it left behind.

* **compare arms** (a run dir holding :data:`heldout.protocols.arms_plan.ARMS_FILE`): the arms table
  of :func:`heldout.protocols.arms_comparison.compare_arms` (one row per arm, the fork arm twice: the
  shippable selected branch and the oracle), its seed-paired verdicts, confounds, flags and
  conclusion. The fork arm's branches spend ``budget / width`` each, so the ordinary tables show
  them as a task of their own; the arms table is the equal-spend comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from heldout.contracts import HeldoutError
from heldout.protocols.arms_comparison import compare_arms
from heldout.protocols.arms_plan import ARMS_FILE
from heldout.reports.tables import Cell, Table


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def arms_report_table(run_dir: Path) -> Table:
    comparison = compare_arms(run_dir)
    spec = comparison.spec
    unit = spec.fixed
    rows = []
    for row in comparison.rows():
        rows.append([Cell(row["arm"]), Cell(str(row["seeds"])), Cell(_num(row["min"])), Cell(_num(row["median"])),
                     Cell(_num(row["max"])), Cell(str(row[f"spent_{unit}"])), Cell(str(row["merge_rounds"])),
                     Cell(f"{row['unions_accepted']} of {row['unions_built']}"),
                     Cell("yes" if row["shippable"] else "no (oracle)")])
    for c in comparison.comparisons:
        word = {"+": "higher", "-": "lower", "0": "not separated"}[c.sign]
        rows.append([Cell(c.label), Cell(str(len(c.seeds))), Cell(""), Cell(f"{c.estimate:+.4f}"), Cell(""), Cell(""),
                     Cell(""), Cell(""), Cell(f"{word} (Holm p {c.p_holm:.3g})", strong=c.decided)])
    notes = [f"compare arms of {spec.task} [{spec.profile}] with {spec.optimizer}: serial against best-of-{spec.width} "
             f"fork and merge-of-{spec.width}, {spec.budget} {unit} per seed and arm (held fixed), seeds "
             f"{', '.join(map(str, spec.seeds))}. Held-out score per arm over seeds (min, median, max); the verdict "
             "rows are rule seed-paired-contrast, Holm over the comparisons printed, with the mean paired difference "
             "over seeds in the median column. The fork's branches spend "
             f"{spec.budget} / {spec.width} each, so the tables below list them as a task of their own."]
    notes += [f"confound: {line}" for line in comparison.confounds()]
    notes += [f"stopped by itself: {line}" for line in comparison.stopped]
    notes += [f"FLAG: {flag}" for flag in comparison.flags]
    notes += [f"BROKEN: {line}" for line in comparison.broken]
    notes.append(f"conclusion: {comparison.conclusion}")
    return Table(key="arms", title=f"Arms: {spec.task} ({run_dir.name})",
                 columns=["arm", "seeds", "min", "median", "max", f"spent {unit.replace('_', ' ')}", "merge rounds", "unions accepted",
                          "shippable / verdict"], rows=rows, notes=notes,
                 data=[{"run_dir": str(run_dir), "rows": comparison.rows(),
                        "comparisons": [c.as_dict() for c in comparison.comparisons],
                        "conclusion": comparison.conclusion, "flags": comparison.flags, "broken": comparison.broken}])


def protocol_tables(paths: Iterable[str | Path]) -> tuple[list[Table], list[str]]:
    """The protocol tables of every given path that is a protocol's run dir, and a warning per
    one that cannot be read back (never an exception: the rest of the report stands)."""
    tables, warnings = [], []
    for path in paths:
        root = Path(path)
        if (root / ARMS_FILE).is_file():
            try:
                tables.append(arms_report_table(root))
            except HeldoutError as exc:
                warnings.append(f"arms run dir {root}: no arms table ({exc})")
    return tables, warnings


__all__ = ["arms_report_table", "protocol_tables"]
