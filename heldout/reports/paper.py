"""Paper-ready output of a report: Table 1 and the paired comparison as booktabs LaTeX and CSV, the
figures as PDF and SVG. ``heldout report RUN_DIRS --out DIR --format latex --format csv``.

Rules:

* LaTeX shows exactly the numbers the report shows (the display cells, same rounding), every
  special character escaped, one ``&`` per column boundary, ``\\toprule/\\midrule/\\bottomrule``
  (``\\usepackage{booktabs}``); the paired table keeps the CI and every test column, and turns
  the long verdict into ``separated`` yes/no (the report's verdict text says why);
* CSV holds the numbers *behind* the table (``Table.data``) at full precision, one row per data
  row, nested values flattened to dotted column names, so a spreadsheet gets what
  ``results.json`` has, not the rounded display;
* figures are written from the same matplotlib figures the report embeds (``Figure.figure``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from heldout.contracts import HeldoutError
from heldout.reports.render import Report
from heldout.reports.tables import Cell, Table

FORMATS = ("latex", "csv")
FIGURE_FORMATS = ("pdf", "svg")
PAPER_TABLES = {"results": "table1", "heldout": "paired"}  # report table key -> file stem

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "<": r"\textless{}", ">": r"\textgreater{}", "±": r"$\pm$", "†": r"$^{\dagger}$",
                  "‡": r"$^{\ddagger}$", "−": "-", "≥": r"$\geq$", "≤": r"$\leq$", "×": r"$\times$"}
_SUMMARY_ROWS = ("macro mean", "wins/ties/losses")  # rows under a \midrule in Table 1
PAPER_COLUMNS = {"heldout": ("task", "method", "seeds", "mean change", "95% CI", "test p", "Holm p", "verdict")}
"""The columns a paper table keeps (the paired table has 16: it ran 550-670 pt off the page)."""
_TEXT_COLUMNS = ("task", "method")


def latex_escape(text: str) -> str:
    """``text`` safe inside a LaTeX table cell (every special character escaped, line breaks folded)."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text).replace("\n", " "))


def latex_table(table: Table, label: str) -> str:
    """One booktabs ``table`` environment for ``table`` (caption: its title and settings note)."""
    columns, rows = list(table.columns), [list(row) for row in table.rows]
    keep = PAPER_COLUMNS.get(table.key)
    if keep:  # a page-wide table: the per-example and second-correction columns stay in the CSV
        at = [columns.index(c) for c in keep if c in columns]
        columns, rows = [columns[i] for i in at], [[row[i] for i in at] for row in rows]
    if "verdict" in columns:
        at = columns.index("verdict")
        columns[at] = "separated"
        for row in rows:
            row[at] = Cell("yes" if row[at].strong else "no")
    spec = "".join("l" if c in _TEXT_COLUMNS else "r" for c in columns)
    lines = ["% heldout report table; needs \\usepackage{booktabs}", "\\begin{table}[t]", "\\centering",
             "\\small", f"\\begin{{tabular}}{{{spec}}}", "\\toprule",
             " & ".join(latex_escape(c) for c in columns) + " \\\\", "\\midrule"]
    summary_started = False
    for row in rows:
        if not summary_started and row and row[0].text.startswith(_SUMMARY_ROWS):
            lines.append("\\midrule")
            summary_started = True
        cells = [f"\\textbf{{{latex_escape(c.text)}}}" if c.strong else latex_escape(c.text) for c in row]
        lines.append(" & ".join(cells) + " \\\\")
    # LaTeX numbers the table itself: a title "Table 1: ..." would print "Table 1: Table 1: ..."
    title = re.sub(r"^Table \d+:\s*", "", table.title)
    caption = title + (". " + table.notes[0] if table.notes else "")
    lines += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{latex_escape(caption)}}}",
              f"\\label{{tab:{label}}}", "\\end{table}", ""]
    return "\n".join(lines)


def flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted keys; lists as JSON (a cell holds one value)."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    return str(value)


def csv_table(table: Table) -> str:
    """The numbers behind ``table`` as CSV (full precision; ``repr`` floats parse back exactly)."""
    rows = [flatten(_paper_names(table.key, row)) for row in table.data]
    header: list[str] = []
    for row in rows:
        header += [k for k in row if k not in header]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow([_csv_value(row.get(k)) for k in header])
    return buffer.getvalue()


def _paper_names(key: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """The paired table's per-example verdict fields renamed so that no CSV column called
    ``separable`` disagrees with the report's run-level verdict, which becomes ``separated``."""
    if key != "heldout":
        return dict(row)
    out = {("per_example_" + k if k in ("separable", "verdict") else k): v for k, v in row.items()}
    verdict = str(row.get("report_verdict", ""))
    out["separated"] = bool(verdict) and not verdict.startswith("cannot separate")
    return out


def write_paper(report: Report, out_dir: str | Path, formats: Iterable[str] = FORMATS,
                figure_formats: Iterable[str] = FIGURE_FORMATS) -> dict[str, Path]:
    """Write ``paper/table1.{tex,csv}``, ``paper/paired.{tex,csv}`` (the tables the report has) and
    every figure as ``figures/<key>.{pdf,svg}``; returns what was written by name."""
    formats = list(formats)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise HeldoutError(f"unknown report format {unknown[0]!r}; accepted: {', '.join(FORMATS)}")
    out = Path(out_dir)
    (out / "paper").mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for key, stem in PAPER_TABLES.items():
        table = next((t for t in report.tables if t.key == key), None)
        if table is None:
            continue
        if "latex" in formats:
            written[f"{stem}.tex"] = _write(out / "paper" / f"{stem}.tex", latex_table(table, f"heldout-{stem}"))
        if "csv" in formats:
            written[f"{stem}.csv"] = _write(out / "paper" / f"{stem}.csv", csv_table(table))
    (out / "figures").mkdir(parents=True, exist_ok=True)
    for fig in report.figures:
        if fig.figure is None:
            continue
        for fmt in figure_formats:
            path = out / "figures" / f"{fig.key}.{fmt}"
            fig.figure.savefig(path, format=fmt, bbox_inches="tight")
            written[path.name] = path
    return written


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


__all__ = ["FIGURE_FORMATS", "FORMATS", "csv_table", "flatten", "latex_escape", "latex_table", "write_paper"]
