"""Paper-ready output and the per-example drill-down, from real sessions: the LaTeX tables are
balanced booktabs tabulars with every special character escaped, the CSV parses back to the
report's numbers, figures come out as PDF and SVG, and report.html says which examples changed."""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

import pytest

from heldout.evaluators.session import Session
from heldout.reports import build_report
from heldout.reports.drilldown import drilldown_html, example_changes
from heldout.reports.paper import PAPER_COLUMNS, csv_table, flatten, latex_escape, latex_table, write_paper
from heldout.reports.render import render_html

REPO = Path(__file__).resolve().parents[1]
CHAMPION = {"scorer.sql": (Path(__file__).resolve().parent / "fixtures" / "lockpicking_champion.sql").read_text()}
METHOD = "tuned_50%&more"  # a legal folder name full of LaTeX specials


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("paper")
    for seed in (0, 1):
        Session("lockpicking/six", budget=1, seed=seed, method="seed",
                run_dir=root / "lockpicking__six" / "seed" / f"seed-{seed}").run(lambda view, s: dict(view.seed_candidate))
        Session("lockpicking/six", budget=1, seed=seed, method=METHOD,
                run_dir=root / "lockpicking__six" / METHOD / f"seed-{seed}").run(lambda view, s: dict(CHAMPION))
    return root


@pytest.fixture(scope="module")
def report(runs):
    return build_report([runs], n_boot=500)


def _body_rows(tex: str) -> list[str]:
    body = tex.split("\\toprule", 1)[1].split("\\bottomrule", 1)[0]
    return [line for line in body.splitlines() if line.strip() and not line.startswith("\\midrule")]


def test_latex_tables_are_balanced_booktabs_with_escaped_specials(report):
    for key in ("results", "heldout"):
        table = report.table(key)
        tex = latex_table(table, key)
        assert tex.count("\\begin{tabular}") == tex.count("\\end{tabular}") == 1
        assert tex.count("\\begin{table}") == tex.count("\\end{table}") == 1
        assert tex.index("\\toprule") < tex.index("\\midrule") < tex.index("\\bottomrule")
        spec = re.search(r"\\begin\{tabular\}\{([lr]+)\}", tex).group(1)
        # the paired table keeps the 8 columns a page holds (16 ran 550-670 pt off the page)
        width = len(PAPER_COLUMNS.get(key, table.columns))
        assert len(spec) == width and (key != "heldout" or width == 8)
        rows = _body_rows(tex)
        assert len(rows) == len(table.rows) + 1  # the header row
        for row in rows:
            assert len(re.findall(r"(?<!\\)&", row)) == width - 1 and row.endswith("\\\\")
        # LaTeX numbers the table: the caption does not repeat "Table 1:"
        assert not re.search(r"\\caption\{Table \d+:", tex)
        unescaped = re.sub(r"\\[{}]", "", tex)
        assert unescaped.count("{") == unescaped.count("}")
        # no raw special survives outside its escape (lines starting with % are LaTeX comments)
        for line in tex.splitlines():
            if not line.startswith("%"):
                assert not re.search(r"[_%#]", re.sub(r"\\[_%#&]", "", line)), line
        assert "tuned\\_50\\%\\&more" in tex
    assert "$\\pm$" in latex_table(report.table("results"), "results")


def test_escaping_covers_every_latex_special():
    assert latex_escape("a_b 5% x&y #1 $2 {c} ~ ^ \\ ± †") == (
        "a\\_b 5\\% x\\&y \\#1 \\$2 \\{c\\} \\textasciitilde{} \\textasciicircum{} \\textbackslash{} $\\pm$ $^{\\dagger}$")


def test_csv_parses_back_to_the_reports_numbers(report):
    for key in ("results", "heldout"):
        table = report.table(key)
        parsed = list(csv.DictReader(io.StringIO(csv_table(table))))
        assert len(parsed) == len(table.data)
        compared = 0
        for row, data in zip(parsed, table.data):
            for name, value in flatten(data).items():
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                back = float(row[name])
                assert (math.isnan(back) and math.isnan(value)) or back == value, (key, name)
                compared += 1
        assert compared >= 5 * len(parsed)
    paired = list(csv.DictReader(io.StringIO(csv_table(report.table("heldout")))))[0]
    assert {"ci_low", "ci_high", "wilcoxon_p", "p_holm"} <= set(paired) and paired["method"] == METHOD
    # no column called "separable" can contradict the report's verdict: the per-example one is named so
    assert "separable" not in paired and "per_example_separable" in paired
    assert paired["separated"] == str(not paired["report_verdict"].startswith("cannot separate"))


def test_report_format_writes_tables_and_vector_figures(warm_cli, runs, tmp_path):
    done = warm_cli.run("report", str(runs), "--out", str(tmp_path), "--format", "latex", "--format", "csv", cwd=REPO)
    assert done.returncode == 0, done.stderr
    for name in ("table1.tex", "paired.tex", "table1.csv", "paired.csv"):
        assert (tmp_path / "paper" / name).stat().st_size > 100
    assert (tmp_path / "figures" / "bars.pdf").read_bytes().startswith(b"%PDF")
    assert b"<svg" in (tmp_path / "figures" / "bars.svg").read_bytes()[:2000]


def test_unknown_format_is_a_clear_error(report, tmp_path):
    with pytest.raises(Exception, match="unknown report format 'docx'"):
        write_paper(report, tmp_path, ["docx"])


def test_the_drilldown_says_which_examples_changed(report):
    cells = report.runs.cells()
    changes = example_changes(cells[("lockpicking/six", "seed")], cells[("lockpicking/six", METHOD)])
    assert len(changes) == 50
    changed = [c for c in changes if c.status != "same"]
    assert changed, "the champion scorer should change some held-out verdicts"
    assert [c.status for c in changes] == sorted((c.status for c in changes), key=lambda s: s == "same")
    base = {v["example_id"]: v["score"] for v in cells[("lockpicking/six", "seed")][0].record.test_verdicts}
    tuned = {v["example_id"]: v["score"] for v in cells[("lockpicking/six", METHOD)][0].record.test_verdicts}
    assert {c.example_id for c in changed} == {e for e in base if base[e] != tuned[e]}  # deterministic scorers

    fragment = drilldown_html(report.runs, "seed")
    assert fragment.count("<details") == 1 and "<details open" not in fragment  # collapsed by default
    improved = sum(c.status == "improved" for c in changes)
    worse = sum(c.status == "worsened" for c in changes)
    assert f"{improved} improved, {worse} worse, {50 - improved - worse} unchanged of 50" in fragment
    assert fragment.count('<tr class="same">') == 50 - len(changed)
    assert "tuned_50%&amp;more" in fragment and "<script" not in fragment
    page = render_html(report)
    assert fragment in page and "<script" not in page
    assert drilldown_html(report.runs, "nobody") == ""
