"""The per-example drill-down of ``report.html``: which held-out examples changed between the
baseline and each method.

One collapsed ``<details>`` per (task, method) against the baseline; its summary counts the
examples that improved, got worse and stayed the same; inside, one row per held-out example
(the seed-averaged score of each arm, the change, each seed's score, and the first seed's
extracted answer of each arm), changed examples first, largest change first. The fragment is
self-contained and script-free like the rest of the report: unchanged rows are hidden until
their checkbox is ticked (pure CSS), and the browser's find-in-page searches the closed
sections (it opens the one holding a match). Rows come from verified run records only
(:class:`~heldout.reports.collect.RunSet`), the same numbers the paired table pairs.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from heldout.contracts import Verdict
from heldout.protocols.placebo import PLACEBO_METHOD
from heldout.reports.collect import Run, RunSet
from heldout.reports.tables import decimals, fmt

MAX_ROWS = 2000  # per section: a 12k-example task still opens; the rest is counted, not listed
ANSWER_CHARS = 80
EPSILON = 1e-12  # a seed-averaged change smaller than this is float noise, not a change

CSS = """
.drilldown { margin: 0.4em 0; }
.drilldown summary { cursor: pointer; }
.drilldown table { font-size: 0.8em; }
.drilldown tr.improved td.change { color: #1e7b34; font-weight: bold; }
.drilldown tr.worsened td.change { color: #b0261c; font-weight: bold; }
.drilldown input.dd-show-same:not(:checked) ~ table tr.same { display: none; }
"""


@dataclass(frozen=True)
class ExampleChange:
    """One held-out example under two arms (scores averaged over each arm's seeds)."""

    example_id: str
    baseline: float
    method: float
    baseline_seeds: list[float]
    method_seeds: list[float]
    baseline_answer: str
    method_answer: str
    higher_is_better: bool = True  # the metric's direction: a drop in a cost is an improvement

    @property
    def change(self) -> float:
        return self.method - self.baseline

    @property
    def status(self) -> str:
        better = self.change if self.higher_is_better else -self.change
        return "improved" if better > EPSILON else "worsened" if better < -EPSILON else "same"


def _answer(verdict: dict[str, Any]) -> str:
    output = verdict.get("output")
    if isinstance(output, dict):
        value = output.get("answer", output.get("objective", ""))
    else:
        value = output
    if not verdict.get("valid", True):
        value = f"[{verdict.get('error_kind') or 'invalid'}]"
    text = "" if value is None else str(value)
    return text if len(text) <= ANSWER_CHARS else text[:ANSWER_CHARS - 1] + "…"


def example_changes(base: dict[int, Run], other: dict[int, Run]) -> list[ExampleChange]:
    """Per held-out example both arms scored in every seed, changed first (largest first); an
    invalid verdict counts as the metric's failure score, as in every table."""
    def per_example(cell: dict[int, Run]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for run in cell.values():
            for verdict in run.record.test_verdicts:
                out.setdefault(verdict["example_id"], []).append(verdict)
        return {ex: vs for ex, vs in out.items() if len(vs) == len(cell)}

    b, m = per_example(base), per_example(other)
    metric = next(iter(base.values())).metric
    changes = []
    for ex in b:
        if ex not in m:
            continue
        bs, ms = ([metric.reading(Verdict.from_dict(v)) for v in side[ex]] for side in (b, m))
        changes.append(ExampleChange(ex, sum(bs) / len(bs), sum(ms) / len(ms), bs, ms,
                                     _answer(b[ex][0]), _answer(m[ex][0]), metric.higher_is_better))
    return sorted(changes, key=lambda c: (c.status == "same", -abs(c.change), c.example_id))


def drilldown_html(runs: RunSet, baseline: str, max_rows: int = MAX_ROWS) -> str:
    """The drill-down fragment (``""`` when the baseline is absent or nothing pairs)."""
    esc = html.escape
    cells = runs.cells()
    sections = []
    for (task, method), cell in cells.items():
        if method in (baseline, PLACEBO_METHOD) or (task, baseline) not in cells:
            continue  # placebo draws are the baseline's noise floor, drawn per seed: no method to drill into
        changes = example_changes(cells[(task, baseline)], cell)
        if not changes:
            continue
        counts = {s: sum(c.status == s for c in changes) for s in ("improved", "worsened", "same")}
        d = decimals([v for c in changes for v in (c.baseline, c.method)])
        key = esc(f"dd-{task}-{method}".replace("/", "-").replace(" ", "-"))
        rows = []
        for c in changes[:max_rows]:
            rows.append(f'<tr class="{c.status}"><td>{esc(c.example_id)}</td><td>{fmt(c.baseline, d)}</td>'
                        f'<td>{fmt(c.method, d)}</td><td class="change">{c.change:+.{d}f}</td><td>{c.status}</td>'
                        f'<td>{esc(" ".join(fmt(s, d) for s in c.baseline_seeds))}</td>'
                        f'<td>{esc(" ".join(fmt(s, d) for s in c.method_seeds))}</td>'
                        f"<td>{esc(c.baseline_answer)}</td><td>{esc(c.method_answer)}</td></tr>")
        more = (f'<p class="note">{len(changes) - max_rows} more example(s) not listed (every change is in '
                "results.json's verdicts).</p>" if len(changes) > max_rows else "")
        sections.append(
            f'<details class="drilldown" id="{key}"><summary><strong>{esc(task)}</strong>: {esc(method)} vs '
            f'{esc(baseline)} - {counts["improved"]} improved, {counts["worsened"]} worse, {counts["same"]} '
            f"unchanged of {len(changes)} held-out example(s), {len(cell)}/{len(cells[(task, baseline)])} "
            f'seed(s)</summary><input type="checkbox" class="dd-show-same" id="{key}-same">'
            f'<label for="{key}-same"> show unchanged examples</label>'
            f"<table><thead><tr><th>example</th><th>{esc(baseline)}</th><th>{esc(method)}</th><th>change</th>"
            f"<th>status</th><th>{esc(baseline)} by seed</th><th>{esc(method)} by seed</th>"
            f"<th>{esc(baseline)} answer (first seed)</th><th>{esc(method)} answer (first seed)</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>{more}</details>")
    if not sections:
        return ""
    return (f'<style>{CSS}</style><h2 id="drilldown">Which examples changed? (per-example drill-down vs '
            f'{esc(baseline)})</h2><p class="note">Each section is collapsed; open it, or use the browser\'s '
            "find-in-page to search example ids and answers. Scores are averaged over each arm's seeds; rows "
            "changed first, largest change first; unchanged rows are hidden until ticked.</p>"
            + "".join(sections))


__all__ = ["ExampleChange", "drilldown_html", "example_changes"]
