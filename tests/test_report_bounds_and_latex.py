"""What a report draws and typesets stays inside what it claims to show.

The adversary is a study near a bound: an accuracy of 1.0, 1.0 and 0.96 over three seeds, whose
95% t interval over seeds runs to about 1.04, and a tables' worth of long verdicts and sentences.
The held-out score figure must draw no interval outside the score's range (and say where it cut
one), Table 1's † legend must name the test it came from, and every LaTeX table the report writes
must compile in a one-column and a two-column paper with no overfull box and a caption that
defines every mark the table uses. The runs are real sessions of the loopback model on the
key-and-rule task of ``test_recipe_baseline``; TeX is Debian's ``pdflatex`` (scripts/_setup.sh
installs it for the tests), skipped with the reason where it is absent. The tables of a
generalisation protocol's report compile in tests/test_recipe_baseline.py, beside the study they
come from (one protocol run, not one more here)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
from matplotlib.collections import LineCollection
import pytest

import heldout
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient
from heldout.reports.paper import caption_text, latex_table, write_paper
from heldout.reports.collect import RunSet
from heldout.reports.render import Report, build_report, render_html, write_report
from heldout.reports.tables import Cell, Table
from latex_tables import compile_tables
from test_recipe_baseline import PROFILE, RULE, TASK, is_code_family, manifests, rows, server  # noqa: F401

CHROMIUM = Path("/usr/bin/chromium")
DROPPED = "f01"  # the fact family seed 2's near-perfect candidate does not key


def near_perfect(view, seed):
    """The rule and every fact family's answer (trusted test code knows the data), except that
    seed 2 leaves one family out: 1.0, 1.0 and a little less on held-out."""
    answers = {r["group"]: r["target"] for r in rows() if not is_code_family(r["group"])}
    keep = [f for f in sorted(answers) if not (seed == 2 and f == DROPPED)]
    key = "\n".join(f"Q: Family {f} A: {answers[f]}" for f in keep)
    return {"instruction": view.seed_candidate["instruction"] + "\n" + RULE + "\nKnown answers:\n" + key}


def seed_only(view, seed):
    return view.seed_candidate


@pytest.fixture(scope="module")
def near_bound(manifests, server, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("near-bound")
    task = heldout.load_task(TASK, PROFILE)
    worker = ModelClient("test-model", base_url=server.base_url, api_key="k", concurrency=4)
    for method, fn in (("seed", seed_only), ("near-perfect", near_perfect)):
        for seed in (0, 1, 2):
            record = Session(task, budget=Budget(0), seed=seed, models=SessionModels(worker=worker), method=method,
                             run_dir=root / "runs" / method / f"seed-{seed}").run(fn)
            assert record.status == "ok"
    report = build_report([root / "runs"], n_boot=500)
    write_report(report, root / "report")
    write_paper(report, root / "report", formats=["latex"], figure_formats=[])
    return root, report


def test_no_interval_is_drawn_outside_the_scores_range(near_bound):
    _, report = near_bound
    scores = [r["mean"] for r in report.table("results").data if r["method"] == "near-perfect"]
    assert scores and 0.95 < scores[0] < 1.0  # the case: a mean just below the ceiling over 3 seeds
    figure = next(f for f in report.figures if f.key == "bars")
    (ax,) = [a for a in figure.figure.axes if a.has_data()]
    drawn = [y for line in ax.get_lines() for y in np.asarray(line.get_ydata(), dtype=float)]
    for collection in ax.collections:
        if isinstance(collection, LineCollection):  # whiskers (vlines, errorbar) in data coordinates
            drawn += [float(y) for path in collection.get_paths() for y in path.vertices[:, 1]]
        else:  # the seeds' dots: their offsets are the data (their paths are marker shapes)
            drawn += [float(y) for _, y in np.asarray(collection.get_offsets()).reshape(-1, 2)]
    assert drawn and max(drawn) <= 1.0 + 1e-12 and min(drawn) >= 0.0
    assert ax.get_ylim()[1] <= 1.05
    assert "Whiskers cut at the score's range" in figure.caption and "near-perfect on" in figure.caption


def test_the_dagger_legend_names_the_test_it_came_from(near_bound):
    _, report = near_bound
    legend = next(n for n in report.table("results").notes if "†" in n)
    assert "seed range overlaps" not in legend
    assert "exact permutation" in legend or "welch t" in legend.lower()


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (/usr/bin/chromium absent)")
def test_the_rendered_report_shows_the_cut_figure_and_fits_the_page(near_bound, tmp_path):
    root, report = near_bound
    probe = """<script>window.addEventListener('load', function () {
      var imgs = Array.from(document.images);
      var cells = Array.from(document.querySelectorAll('#table-heldout td.verdict'));
      var lines = cells.map(function (c) {  // distinct line tops of the cell's text
        var range = document.createRange(); range.selectNodeContents(c);
        return new Set(Array.from(range.getClientRects()).map(function (r) { return Math.round(r.top); })).size; });
      var wide = Array.from(document.querySelectorAll('table')).filter(function (t) {
        return t.getBoundingClientRect().right > window.innerWidth; }).map(function (t) { return t.id; });
      var out = document.createElement('pre'); out.id = 'probe';
      out.textContent = 'decoded=' + imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length
        + ' images=' + imgs.length + ' verdict_lines=' + lines.join(',')
        + ' wider_than_page=' + (document.documentElement.scrollWidth > window.innerWidth) + ' wide=' + wide.join(',');
      document.body.appendChild(out); });</script></body>"""
    done = in_chromium(root / "report" / "report.html", probe, tmp_path)
    found = re.search(r'id="probe">([^<]*)<', done.stdout)
    assert found, done.stdout[-2000:]
    check = found.group(1)
    images, decoded = (int(re.search(rf"{k}=(\d+)", check).group(1)) for k in ("images", "decoded"))
    assert images >= 1 and decoded == images, check
    assert "Whiskers cut at the score&#x27;s range" in done.stdout or "Whiskers cut at the score's range" in done.stdout
    assert "wider_than_page=false" in check, check


def in_chromium(html: Path, probe: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """The report with ``probe`` (a script writing a <pre id="probe">) laid out by headless Chromium."""
    page = tmp_path / "probe.html"
    page.write_text(html.read_text().replace("</body>", probe))
    done = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1280,900",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


VERDICT = ("one run (the seeds replicate nothing; per question 17 up / 0 down, p 1.5e-05): the gain is one run's "
           "number, untested for the method")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (/usr/bin/chromium absent)")
def test_a_verdict_written_as_a_sentence_gets_room_in_the_rendered_report(tmp_path):
    """A verdict column of sentences beside eight columns of numbers and labels (the shape of the
    verifier and ablation tables) is no longer the narrowest column: at most 4 lines a row, and
    the table still fits a 1280-pixel page."""
    label = "fresh questions of the families the final candidate memorised, scored with no further search"
    path = "runs/hotpotqa__distractor/reflective/seed-0/verifier_ablation/ledger.jsonl"
    table = Table(key="verdicts", title="verdicts", columns=["subset", "examples", "seeds", "gain", "95% CI (seeds)",
                                                             "ledger", "transfer", "gaming gap", "verdict"],
                  rows=[[Cell(label), Cell("48"), Cell("3"), Cell("+0.743"), Cell("[+0.512, +0.974]"), Cell(path),
                         Cell("+0.701"), Cell("-0.049"), Cell(VERDICT)] for _ in range(3)])
    # and a row of verdicts under three gains, as the generalisation report's table 2 has
    gains = Table(key="gains", title="gains", columns=["seed", "seed val", "opt val", "val gain", "seed held-out",
                                                       "opt held-out", "held-out gain", "gap (val - held-out)"],
                  rows=[[Cell(str(s)), Cell("0.400"), Cell("0.700"), Cell("+0.300"), Cell("0.500"), Cell("0.700"),
                         Cell("+0.200"), Cell("+0.100")] for s in range(3)]
                  + [[Cell("verdict"), Cell(""), Cell(""), Cell(VERDICT), Cell(""), Cell(""), Cell(VERDICT), Cell(VERDICT)]])
    html = tmp_path / "report.html"
    html.write_text(render_html(Report(runs=RunSet(), baseline="seed", alpha=0.05, tables=[table, gains])))
    probe = """<script>window.addEventListener('load', function () {
      var cells = Array.from(document.querySelectorAll('#table-verdicts tbody td:last-child'))
        .concat(Array.from(document.querySelectorAll('#table-gains td.verdict')));
      var lines = cells.map(function (c) {
        var range = document.createRange(); range.selectNodeContents(c);
        return new Set(Array.from(range.getClientRects()).map(function (r) { return Math.round(r.top); })).size; });
      var out = document.createElement('pre'); out.id = 'probe';
      out.textContent = 'verdict_lines=' + lines.join(',')
        + ' wider_than_page=' + (document.documentElement.scrollWidth > window.innerWidth);
      document.body.appendChild(out); });</script></body>"""
    done = in_chromium(html, probe, tmp_path)
    check = re.search(r'id="probe">([^<]*)<', done.stdout).group(1)
    lines = [int(n) for n in re.search(r"verdict_lines=([\d,]*)", check).group(1).split(",") if n]
    assert len(lines) == 6 and max(lines) <= 4, check
    assert "wider_than_page=false" in check, check


def test_every_latex_table_compiles_without_an_overfull_box_and_defines_its_marks(near_bound, tmp_path):
    root, report = near_bound
    tex = sorted((root / "report" / "paper").glob("*.tex"))
    assert [p.name for p in tex] == ["paired.tex", "table1.tex"]
    # the wide form too, and every table of the report (the runs table's paths are long)
    for table in report.tables:
        (tmp_path / f"{table.key}.tex").write_text(latex_table(table, table.key))
    (tmp_path / "wide.tex").write_text(latex_table(report.table("results"), "wide", wide=True))
    code, log = compile_tables(tex + sorted(tmp_path.glob("*.tex")), tmp_path)
    assert code == 0, log[-3000:]
    assert "Overfull \\hbox" not in log, re.findall(r"Overfull \\hbox.*", log)[:5]
    table1 = report.table("results")
    caption = caption_text(table1)
    for mark in ("±", "†"):
        assert mark in " ".join(c.text for row in table1.rows for c in row)
        assert f"{mark} the best" in caption or f"mean {mark} std" in caption, (mark, caption)
