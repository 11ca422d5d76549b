"""Assemble a report from run dirs and write ``report.md``, ``report.html`` and ``results.json``.

``report.html`` is self-contained: inline CSS, figures embedded as base64 PNG, no script, no
external resource, so it opens the same on an air-gapped machine or as a CI artifact.
Excluded runs (ledger or record does not verify) are announced at the top of every output.
"""

from __future__ import annotations

import base64
import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from heldout.contracts import HeldoutError, json_safe
from heldout.files import write_bytes_atomically, write_text_atomically
from heldout.benchmarks.loading import load_task, resolve_data_dir
from heldout.benchmarks.registry import get_benchmark
from heldout.evaluators.records import heldout_code, heldout_version
from heldout.evaluators.same_experiment import split_experiment
from heldout.reports.collect import RunSet, collect_runs
from heldout.reports.drilldown import drilldown_html
from heldout.reports.figures import Figure, best_so_far_plot, paired_scatter, pareto_plot, score_bars
from heldout.protocols.leak_scan import answer_key_rows
from heldout.reports.paired_table import heldout_table
from heldout.reports.protocol_tables import protocol_tables
from heldout.reports.tables import (
    Table,
    answer_key_table,
    budget_table,
    cost_table,
    extraction_modes_table,
    results_table,
    runs_table,
    selection_table,
    settings_note,
)

DEFAULT_BASELINE = "seed"
#: results.json's record of how it was made (run dirs relative to the report, settings), so
#: ``heldout verify`` can rebuild it anywhere the study is copied to (heldout/reports/verify.py)
DERIVED_FROM = "derived_from"


@dataclass
class Report:
    runs: RunSet
    baseline: str
    alpha: float
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    derived_from: dict[str, Any] = field(default_factory=dict)  # the run dirs as given and the settings

    def table(self, key: str) -> Table:
        return next(t for t in self.tables if t.key == key)


def build_report(paths: Iterable[str | Path], *, baseline: str = DEFAULT_BASELINE, alpha: float = 0.05,
                 checkpoints: Sequence[int] | None = None, data_dir: str | None = None,
                 n_boot: int = 10_000) -> Report:
    """Collect and verify the runs under ``paths`` and compute every table and figure."""
    paths = list(paths)
    runs = collect_runs(paths)
    report = Report(runs=runs, baseline=baseline, alpha=alpha, derived_from={
        "run_dirs": [str(Path(p)) for p in paths], "baseline": baseline, "alpha": alpha,
        "checkpoints": sorted(checkpoints) if checkpoints else None, "n_boot": n_boot,
        "data_dir": _has_data_dir(data_dir), "heldout": {"version": heldout_version(), **heldout_code()}})
    incomplete = [ex for ex in runs.excluded if ex.incomplete]
    if incomplete:  # first: a study with unscored cells is not a finished study, whatever the tables show
        report.warnings.append(f"INCOMPLETE STUDY: {len(incomplete)} run(s) have no score because the infrastructure "
                               "failed (endpoint, sandbox or disk); their cells are marked ‡ and every number "
                               "below is over the remaining seeds. Resume the study with --resume")
    for ex in runs.excluded:
        report.warnings.append(f"EXCLUDED {ex.path}: {ex.reason}")
    report.notes += [folder.describe() for folder in runs.protocols]  # a protocol's folder, not a run
    compared, unreadable = protocol_tables(paths)  # what a protocol's run dir compared (compare arms)
    report.tables += compared
    report.warnings += unreadable
    for run in runs.failed:
        report.warnings.append(f"FAILED {run.path}: {run.record.error}")
    if not runs.runs:
        report.warnings.append("no verified, finished run: every table is empty")
        report.tables.append(runs_table(runs))
        return report
    has_baseline = baseline in runs.methods()
    if not has_baseline:
        report.warnings.append(f"baseline method {baseline!r} is not among the runs ({', '.join(runs.methods())}); "
                               "paired tables need it (pass --baseline)")
    report.tables.append(results_table(runs, baseline if has_baseline else None))
    if has_baseline:
        report.tables.append(heldout_table(runs, baseline, alpha=alpha, n_boot=n_boot))
    report.tables.append(cost_table(runs, baseline if has_baseline else None))
    report.tables.append(budget_table(runs, checkpoints))
    modes = extraction_modes_table(runs)
    if modes is not None:
        report.tables.append(modes)
    report.tables.append(selection_table(runs))
    report.tables.append(runs_table(runs))
    keys = answer_key_rows([r.record for r in runs.runs if _loadable(r.record.task, data_dir)],
                           data_dir=data_dir, prompt_only=True)
    if keys:
        report.tables.append(answer_key_table(runs, keys))
    report.figures.append(score_bars(runs, baseline if has_baseline else None))
    report.figures.append(best_so_far_plot(runs))
    for kind in ("optimisation", "deployment"):
        pareto = pareto_plot(runs, kind)
        if pareto is None:
            report.notes.append(f"No Pareto plot of {kind} tokens: no run recorded any (program tasks, or every "
                                "call served from a cache).")
        else:
            report.figures.append(pareto)
    if has_baseline:
        scatter = paired_scatter(runs, baseline, _groups(runs, data_dir))
        if scatter is not None:
            report.figures.append(scatter)
    return report


def _has_data_dir(data_dir: str | None) -> bool:
    try:
        return resolve_data_dir(data_dir) is not None
    except HeldoutError:
        return False


def _loadable(task: str, data_dir: str | None) -> bool:
    """A report never downloads: a dataset task is loaded only from a local data dir
    (``--data-dir`` or ``$HELDOUT_DATA_DIR``); embedded and user tasks always."""
    try:
        resolve_data_dir(data_dir)
        return True
    except HeldoutError:
        pass
    try:
        return bool(get_benchmark(task).source.embedded)
    except (HeldoutError, KeyError, AttributeError):
        return False


def _groups(runs: RunSet, data_dir: str | None) -> dict[str, dict[str, str]]:
    """Held-out example id -> group (topic) per task label, when the task's examples carry
    groups and can be loaded from local files; other tasks fall back to per-example points.
    A report never downloads: a dataset task without a data dir (``--data-dir`` or
    ``$HELDOUT_DATA_DIR``) is not loaded."""

    try:
        local = resolve_data_dir(data_dir)
    except HeldoutError:
        local = None
    out: dict[str, dict[str, str]] = {}
    for label in runs.tasks():
        rec = next(r.record for r in runs.runs if r.label == label)
        try:
            if local is None and not get_benchmark(rec.task).source.embedded:
                continue
            task = load_task(rec.task, profile=rec.profile, data_dir=data_dir, allow_drift=bool(rec.drift))
        except (HeldoutError, OSError, ValueError):
            continue
        mapping = {ex.id: ex.group for ex in task.splits.get("test", []) if ex.group}
        if mapping:
            out[label] = mapping
    return out


# -- writing -----------------------------------------------------------------------------------------
def write_report(report: Report, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    for fig in report.figures:
        write_bytes_atomically(out / "figures" / f"{fig.key}.png", fig.png)
    paths = {"md": out / "report.md", "html": out / "report.html", "json": out / "results.json"}
    write_text_atomically(paths["md"], render_markdown(report))
    write_text_atomically(paths["html"], render_html(report))
    write_text_atomically(paths["json"], json.dumps(json_safe(results(report, out)), indent=1, sort_keys=False))
    return paths


def results(report: Report, out_dir: str | Path | None = None) -> dict[str, Any]:
    """What results.json holds; with ``out_dir`` (where it is written) also how it was derived,
    each run dir named relative to it."""
    runs = report.runs
    derivation = dict(report.derived_from)
    if out_dir is not None and derivation:
        # the folder's own name too: a bundle keeps each run dir under runs/<its name> (reports/bundle.py)
        derivation["run_dirs"] = [{"given": given, "name": Path(given).resolve().name,
                                   "from_report": os.path.relpath(os.path.abspath(given), os.path.abspath(out_dir))}
                                  for given in derivation["run_dirs"]]
    return {
        DERIVED_FROM: derivation,
        "baseline": report.baseline,
        "alpha": report.alpha,
        "settings": runs.settings() if runs.runs else {},
        "warnings": report.warnings,
        "notes": report.notes,
        "provenance": provenance_lines(runs) if runs.runs or runs.failed else [],
        "excluded": [{"path": str(e.path), "reason": e.reason} for e in runs.excluded],
        "failed": [{"path": str(r.path), "task": r.label, "method": r.record.method, "seed": r.record.seed,
                    "error": r.record.error} for r in runs.failed],
        "tables": {t.key: t.as_dict() for t in report.tables},
        "figures": [{"key": f.key, "title": f.title, "caption": f.caption, "file": f"figures/{f.key}.png"}
                    for f in report.figures],
    }


def provenance_lines(runs: RunSet) -> list[str]:
    """Which models and versions produced the numbers, from the runs' experiment descriptions."""
    every = runs.runs + runs.failed

    def distinct(get) -> str:
        values = sorted({str(v) for v in (get(r.record.experiment) for r in every) if v not in (None, "")})
        return ", ".join(values) if values else "none"

    def model(key):
        # the endpoint without its scheme: the report must not look like it links anywhere
        return lambda e: None if not e.get(key) else \
            f"{e[key].get('model')} at {str(e[key].get('base_url')).split('://', 1)[-1]}"

    env = lambda e: e.get("environment") or {}  # noqa: E731
    return [f"Worker model: {distinct(model('worker'))}. Architect model: {distinct(model('architect'))}. "
            f"Decoding: {distinct(lambda e: json.dumps(_sent(e), sort_keys=True) if _sent(e) else None)}.",
            f"Scored by {distinct(lambda e: describe_heldout_code(env(e)))}; Python {distinct(lambda e: env(e).get('python'))}; "
            f"isolation {', '.join(sorted({r.record.isolation for r in every})) or 'n/a'}; "
            f"optimizers: {distinct(lambda e: _optimizer(e))}.",
            f"Data: {distinct(lambda e: _manifest(e))}."]


def _sent(exp: dict[str, Any]) -> dict[str, Any] | None:
    """The decoding a run's requests carried, whichever heldout wrote its experiment."""
    return (split_experiment(exp).get("decoding") or {}).get("sent")


def describe_heldout_code(env: dict[str, Any]) -> str:
    """Which heldout scored, as a record's ``environment`` pins it (records.heldout_code): version,
    commit of heldout's own checkout (+ uncommitted changes) and the hash of its files."""
    version = f"heldout {env.get('heldout_version') or 'unknown'}"
    code = env.get("heldout_code")
    if not isinstance(code, dict):  # written before heldout pinned its own code
        return f"{version} (code not recorded)"
    files = f"files sha256 {str(code.get('files_sha256'))[:12]}"
    if not code.get("commit"):
        return f"{version} ({files}; not a git checkout)"
    dirty = " + uncommitted changes" if code.get("dirty") else ""
    return f"{version} (commit {str(code['commit'])[:12]}{dirty}; {files})"


def _optimizer(exp: dict[str, Any]) -> str | None:
    opt = exp.get("optimizer") or {}
    code = opt.get("code_sha256")
    return f"{opt.get('name')} ({code[:10]})" if code else opt.get("name")


def _manifest(exp: dict[str, Any]) -> str | None:
    man = exp.get("manifest") or {}
    digest = man.get("profile_sha256")
    return f"{exp.get('task')} {exp.get('profile')} v{man.get('version')} ({digest[:10]})" if digest else None


def _title(report: Report) -> str:
    runs = report.runs
    return (f"heldout report: {len(runs.tasks())} task(s), {len(runs.methods())} method(s), "
            f"{len(runs.runs)} run(s)")


def md_figure(fig: Figure) -> list[str]:
    esc = _md_escape
    return [f"## {esc(fig.title)}", "", f"![{esc(fig.title)}](figures/{fig.key}.png)", "", esc(fig.caption), ""]


def html_figure(fig: Figure) -> str:
    esc = html.escape
    data = base64.b64encode(fig.png).decode("ascii")
    return (f'<figure id="figure-{esc(fig.key)}"><h2>{esc(fig.title)}</h2>'
            f'<img alt="{esc(fig.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{esc(fig.caption)}</figcaption></figure>")


def render_markdown(report: Report) -> str:
    """Every text taken from runs is escaped (an optimizer's output or error may hold HTML or
    Markdown); the settings line is printed once, at the top, and in a table only when it differs."""
    esc = _md_escape
    lines = [f"# {esc(_title(report))}", ""]
    if report.warnings:
        lines += ["> **WARNING**", ">"] + [f"> - {esc(w)}" for w in report.warnings] + [""]
    settings = settings_note(report.runs) if report.runs.runs else None
    if report.runs.runs or report.runs.failed:
        lines += [esc(line) for line in provenance_lines(report.runs)] + [""]
    if settings:
        lines += [esc(settings), ""]
    for table in report.tables:
        lines += [f"## {esc(table.title)}", ""]
        lines.append("| " + " | ".join(esc(c) for c in table.columns) + " |")
        lines.append("|" + "---|" * len(table.columns))
        for row in table.rows:
            lines.append("| " + " | ".join(f"**{esc(c.text)}**" if c.strong else esc(c.text) for c in row) + " |")
        lines.append("")
        lines += [esc(note) for note in table.notes if note != settings]
        lines.append("")
        lines += [line for fig in report.figures if fig.key == table.figure for line in md_figure(fig)]
    placed = {table.figure for table in report.tables}
    lines += [line for fig in report.figures if fig.key not in placed for line in md_figure(fig)]
    lines += [esc(note) for note in report.notes]
    return "\n".join(lines)


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]#|~"})


def _md_escape(text: str) -> str:
    """Plain text for Markdown: HTML characters as entities, Markdown punctuation backslashed,
    newlines as spaces (one cell or line stays one)."""
    return html.escape(str(text), quote=False).translate(_MD_SPECIAL).replace("\r", " ").replace("\n", " ")


CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
table { border-collapse: collapse; margin: 0.5em 0 0.5em 0; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #eee; }
td.verdict { min-width: 16em; }
.warning { background: #fde2e1; border: 2px solid #c0392b; padding: 0.6em 1em; margin: 1em 0; }
.note { font-size: 0.85em; color: #444; margin: 0.2em 0; }
img { max-width: 100%; border: 1px solid #ddd; }
figure { margin: 1em 0; }
"""


def render_html(report: Report) -> str:
    esc = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{esc(_title(report))}</title><style>{CSS}</style></head><body>",
             f"<h1>{esc(_title(report))}</h1>"]
    if report.warnings:
        items = "".join(f"<li>{esc(w)}</li>" for w in report.warnings)
        parts.append(f'<div class="warning" id="warnings"><strong>WARNING</strong><ul>{items}</ul></div>')
    settings = settings_note(report.runs) if report.runs.runs else None
    if report.runs.runs or report.runs.failed:
        parts += [f'<p class="note provenance">{esc(line)}</p>' for line in provenance_lines(report.runs)]
    if settings:
        parts.append(f'<p class="note">{esc(settings)}</p>')
    for table in report.tables:
        parts.append(f'<h2>{esc(table.title)}</h2><table id="table-{esc(table.key)}"><thead><tr>')
        parts.append("".join(f"<th>{esc(c)}</th>" for c in table.columns) + "</tr></thead><tbody>")
        # a verdict column written in sentences gets room (as the narrowest column it ran 7 lines a
        # row); a 16-column table's short verdicts keep the page width instead
        verdicts = {i for i, name in enumerate(table.columns) if "verdict" in name.lower() and len(table.columns) <= 10
                    and max((len(row[i].text) for row in table.rows if i < len(row)), default=0) > 20}
        for row in table.rows:
            # so does a row of verdicts (the generalisation table's "verdict" row under three gains)
            in_row = bool(row) and row[0].text == "verdict" and len(table.columns) <= 10
            cells = "".join(('<td class="verdict">' if i in verdicts or (in_row and len(c.text) > 20) else "<td>")
                            + (f"<strong>{esc(c.text)}</strong>" if c.strong else esc(c.text)) + "</td>"
                            for i, c in enumerate(row))
            parts.append(f"<tr>{cells}</tr>")
        parts.append("</tbody></table>")
        parts += [f'<p class="note">{esc(note)}</p>' for note in table.notes if note != settings]
        parts += [html_figure(fig) for fig in report.figures if fig.key == table.figure]
    parts.append(drilldown_html(report.runs, report.baseline))
    placed = {table.figure for table in report.tables}
    parts += [html_figure(fig) for fig in report.figures if fig.key not in placed]
    parts += [f'<p class="note">{esc(note)}</p>' for note in report.notes]
    parts.append("</body></html>")
    return "\n".join(parts)
