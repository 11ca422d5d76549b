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
from heldout.files import write_bytes_atomically, write_text_atomically
from heldout.reports.render import Report
from heldout.reports.tables import Cell, Table

FORMATS = ("latex", "csv")
FIGURE_FORMATS = ("pdf", "svg")
PAPER_TABLES = {"results": "table1", "heldout": "paired"}  # report table key -> file stem

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "<": r"\textless{}", ">": r"\textgreater{}", "±": r"$\pm$", "†": r"$^{\dagger}$",
                  "‡": r"$^{\ddagger}$", "−": "-", "≥": r"$\geq$", "≤": r"$\leq$", "×": r"$\times$",
                  "Δ": r"$\Delta$", "ρ": r"$\rho$", "α": r"$\alpha$", "→": r"$\rightarrow$", "≈": r"$\approx$",
                  "–": "--", "—": "---", "‘": "`", "’": "'", "“": "``", "”": "''", "…": r"\ldots{}"}
_SUMMARY_ROWS = ("macro mean", "wins/ties/losses")  # rows under a \midrule in Table 1
PAPER_COLUMNS = {"heldout": ("task", "method", "seeds", "mean change", "95% CI", "test p", "Holm p", "verdict")}
"""The columns a paper table keeps (the paired table has 16: it ran 550-670 pt off the page)."""
_TEXT_COLUMNS = ("task", "method")


def latex_escape(text: str) -> str:
    """``text`` safe inside a LaTeX table cell (every special character escaped, line breaks folded;
    a character beyond Latin-1 that pdflatex cannot set and the table above does not map is written
    as ``[U+XXXX]``, never a compile error)."""
    return "".join(_LATEX_SPECIAL.get(ch, ch if ord(ch) < 0x100 else f"[U+{ord(ch):04X}]")
                   for ch in str(text).replace("\n", " "))


PROSE_CHARS = 32
"""A column whose longest cell is longer than this is set as a wrapping paragraph column."""
NOMINAL_WIDTH_PT = 345.0
"""The width paragraph columns are laid out for (an article's one-column text): fixed in points,
so a narrow two-column page scales the whole table down instead of squeezing a long word such as
``seed-paired-contrast`` past a paragraph column's edge (an overfull box)."""
_MARKS = ("†", "‡", "±")


def _column_spec(columns: list[str], rows: list[list[Cell]]) -> str:
    """``l`` for text columns, ``r`` for numbers, and for long text a ragged-right paragraph
    column whose width is its share of the table's long text (at least a quarter of
    :data:`NOMINAL_WIDTH_PT`), so prose wraps instead of running off the page."""
    longest = [max([len(c)] + [len(row[i].text) for row in rows if i < len(row)]) for i, c in enumerate(columns)]
    prose = {i: n for i, n in enumerate(longest) if n > PROSE_CHARS}
    room = 0.7 if len(prose) < len(columns) else 0.95
    spec = []
    for i, c in enumerate(columns):
        if i in prose:
            width = NOMINAL_WIDTH_PT * max(0.25, room * prose[i] / sum(prose.values()))
            spec.append(f">{{\\raggedright\\arraybackslash}}p{{{width:.0f}pt}}")
        else:
            spec.append("l" if c in _TEXT_COLUMNS else "r")
    return "".join(spec)


def caption_text(table: Table) -> str:
    """The title, the first note (the settings), and every note that defines a mark the table's
    cells or columns use (†, ‡, ±), so the caption explains what the reader sees."""
    title = re.sub(r"^Table \d+:\s*", "", table.title)  # LaTeX numbers the table itself
    shown = " ".join(table.columns + [c.text for row in table.rows for c in row])
    used = [m for m in _MARKS if m in shown]
    notes = table.notes[:1] + [n for n in table.notes[1:] if any(m in n for m in used)]
    return title + "".join(". " + n.rstrip(".") for n in notes) + "."


def latex_table(table: Table, label: str, *, wide: bool = False) -> str:
    """One booktabs table for ``table`` (caption: :func:`caption_text`). It fits the column: long
    text wraps (:func:`_column_spec`) and a table still wider than ``\\columnwidth`` is scaled
    down to it (never up). ``wide``: a ``table*`` across both columns of a two-column paper,
    fitted to ``\\textwidth``. Needs ``booktabs``, ``array`` and ``graphicx``."""
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
    env, width = ("table*", "\\textwidth") if wide else ("table", "\\columnwidth")
    spec = _column_spec(columns, rows)
    lines = ["% heldout report table; needs \\usepackage{booktabs,array,graphicx}", f"\\begin{{{env}}}[t]",
             "\\centering", "\\small",
             # scaled to the column only when wider than it (\\width is the table's natural width)
             f"\\resizebox{{\\ifdim\\width>{width}{width}\\else\\width\\fi}}{{!}}{{\\begin{{tabular}}{{{spec}}}",
             "\\toprule",
             " & ".join(latex_escape(c) for c in columns) + " \\\\", "\\midrule"]
    summary_started = False
    for row in rows:
        if not summary_started and row and row[0].text.startswith(_SUMMARY_ROWS):
            lines.append("\\midrule")
            summary_started = True
        cells = [f"\\textbf{{{latex_escape(c.text)}}}" if c.strong else latex_escape(c.text) for c in row]
        lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}}", f"\\caption{{{latex_escape(caption_text(table))}}}",
              f"\\label{{tab:{label}}}", f"\\end{{{env}}}", ""]
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
            drawn = io.BytesIO()
            fig.figure.savefig(drawn, format=fmt, bbox_inches="tight")
            write_bytes_atomically(path, drawn.getvalue())
            written[path.name] = path
    return written


def _write(path: Path, text: str) -> Path:
    write_text_atomically(path, text)
    return path


__all__ = ["FIGURE_FORMATS", "FORMATS", "csv_table", "flatten", "latex_escape", "latex_table", "write_paper"]
