"""Reports and the regression gate, on run dirs made by real sessions.

The runs are real: ``lockpicking/six`` (profile ``paper``) sessions with small in-process
optimizers, SQL candidates run in DuckDB, ledgers hash-chained on disk, an architect reached over
HTTP on a loopback test server (so optimisation tokens are real counts). Methods:

* ``seed``      - returns the task's seed candidate (the baseline every table needs);
* ``champion``  - evaluates the seed and the stored champion on train, returns the champion;
* ``search``    - asks the architect once, then tries random mixes of the champion's and the
                  seed's rules (a seeded draw) on train and returns the best: it varies by seed.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from heldout.benchmarks.lockpicking.task import CANDIDATES_DIR  # the seed only
from heldout.cli import main
from heldout.evaluators.session import Session
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient
from heldout.models.testserver import TestServer
from heldout.reports import build_report, check_runs, collect_runs
from heldout.reports.check import GateInputError
from heldout.reports.tables import budget_table
from synthetic_study import write_run

TASK, PROFILE, BUDGET = "lockpicking/six", "paper", 60
CHAMPION = (Path(__file__).resolve().parent / "fixtures" / "lockpicking_champion.sql").read_text()
SEED_SQL = (CANDIDATES_DIR / "seed.sql").read_text()


def rules(sql: str, lines_per_rule: int) -> tuple[str, list[str], str]:
    """Split a stored candidate into header, its six rule terms and footer."""
    lines = sql.strip().splitlines()
    body = lines[1:-1]
    terms = ["\n".join(body[i:i + lines_per_rule]) for i in range(0, len(body), lines_per_rule)]
    assert len(terms) == 6
    return lines[0], terms, lines[-1]


def mix(mask: list[bool]) -> dict[str, str]:
    """The champion's rule where ``mask`` is True, the seed's (looser) rule elsewhere."""
    head, champ_terms, foot = rules(CHAMPION, 2)
    _, seed_terms, _ = rules(SEED_SQL, 1)
    body = [c if keep else s for keep, c, s in zip(mask, champ_terms, seed_terms)]
    return {"scorer.sql": "\n".join([head, *body, foot]) + "\n"}


def seed_method(view, seed):
    return view.seed_candidate


def champion_method(view, seed):
    ids = [ex["id"] for ex in view.train[:10]]
    view.evaluate(view.seed_candidate, "train", ids)
    view.evaluate({"scorer.sql": CHAMPION}, "train", ids)
    return {"scorer.sql": CHAMPION}


def search_method(view, seed):
    view.architect([{"role": "user", "content": f"Propose rule edits for {view.task_name}. Seed {seed}."}])
    rng = random.Random(seed)
    best, best_score = view.seed_candidate, float("-inf")
    ids = [ex["id"] for ex in view.train]
    for k in range(5):
        candidate = mix([rng.random() < 0.5 for _ in range(6)])
        shown = view.evaluate(candidate, "train", rng.sample(ids, 12))
        score = sum(row["score"] for row in shown) / len(shown)
        if score > best_score:
            best, best_score = candidate, score
    return best


METHODS = {"seed": seed_method, "champion": champion_method, "search": search_method}


def run_cell(root: Path, method: str, seed: int, architect=None) -> Path:
    run_dir = root / TASK.replace("/", "__") / method / f"seed-{seed}"
    Session(TASK, profile=PROFILE, budget=BUDGET, seed=seed, run_dir=run_dir, method=method,
            models=SessionModels(architect=architect)).run(METHODS[method])
    return run_dir


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """``main``: seed, champion, search on seeds 0-2; ``fresh``: search and champion on seeds 3-5."""
    root = tmp_path_factory.mktemp("runs")
    with TestServer() as server:
        architect = ModelClient("test-architect", server.base_url)
        for method in METHODS:
            for seed in (0, 1, 2):
                run_cell(root / "main", method, seed, architect)
        for method in ("search", "champion"):
            for seed in (3, 4, 5):
                run_cell(root / "fresh", method, seed, architect)
    return root


@pytest.fixture(scope="module")
def report_dir(study, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    assert main(["report", str(study / "main"), "--out", str(out)]) == 0
    return out


# -- collecting --------------------------------------------------------------------------------------
def test_collect_finds_every_run_recursively_and_groups_by_task_method_seed(study):
    runs = collect_runs([study / "main"])
    assert not runs.excluded and not runs.failed
    cells = runs.cells()
    assert sorted(cells) == [(TASK, "champion"), (TASK, "search"), (TASK, "seed")]
    assert all(sorted(cell) == [0, 1, 2] for cell in cells.values())


def test_search_method_really_varies_by_seed_and_spends_architect_tokens(study):
    cell = collect_runs([study / "main"]).cells()[(TASK, "search")]
    assert len({run.record.final_candidate_id for run in cell.values()}) > 1
    assert all(run.record.usage["tokens"]["architect"]["prompt"] > 0 for run in cell.values())


# -- the report ------------------------------------------------------------------------------------
def test_report_writes_markdown_html_and_json_with_every_table(report_dir):
    md = (report_dir / "report.md").read_text()
    for title in ("Table 1: held-out score by task and method", "Held-out paired comparison against seed",
                  "Table 5 analogue", "Budget-matched best-so-far", "How each method chose its final candidate",
                  "Runs"):
        assert f"## {title}" in md
    # champion is best (bold) but one search seed also reaches 1.0: the ranking is not separated (†)
    assert "| lockpicking/six | **1.000 ± 0.000 (n=3) †** |" in md
    html = (report_dir / "report.html").read_text()
    # the report's six tables (the per-example drill-down adds its own, inside collapsed <details>);
    # no deployment tokens in a program task: that Pareto plot is left out and the report says so
    assert html.count('<table id="table-') == 6 and html.count('src="data:image/png;base64,') == 4
    assert "No Pareto plot of deployment tokens" in html
    assert "http://" not in html and "https://" not in html and "<script" not in html
    results = json.loads((report_dir / "results.json").read_text())
    assert set(results["tables"]) == {"results", "heldout", "cost", "budget", "selection", "runs"}
    # these test methods state no selecting split (user code need not): the report says so, per method
    assert {row["method"]: row["selected_on"] for row in results["tables"]["selection"]["data"]} == {
        "champion": ["not stated"], "search": ["not stated"], "seed": ["not stated"]}
    for fig in results["figures"]:
        assert (report_dir / fig["file"]).read_bytes().startswith(b"\x89PNG")


def test_every_table_states_profile_policy_budget_tolerance_and_drift(report_dir):
    results = json.loads((report_dir / "results.json").read_text())
    expected = (f"split profile: {PROFILE}; visibility policy: standard; budget: {BUDGET} metric calls; "
                "tolerance: task default; data drift override: none")
    for key in ("results", "heldout", "cost", "budget"):
        assert expected in results["tables"][key]["notes"][0], key


def test_heldout_table_matches_the_paired_statistics_of_the_scores(study, report_dir):
    from heldout.protocols.stats import paired_comparison

    results = json.loads((report_dir / "results.json").read_text())
    rows = {row["method"]: row for row in results["tables"]["heldout"]["data"]}
    assert set(rows) == {"champion", "search"}
    champ = rows["champion"]
    runs = collect_runs([study / "main"]).cells()
    seed_scores = runs[(TASK, "seed")][0].test_scores()
    champ_scores = runs[(TASK, "champion")][0].test_scores()
    ids = list(seed_scores)
    expected = paired_comparison([seed_scores[i] for i in ids], [champ_scores[i] for i in ids])
    assert champ["mean_diff"] == pytest.approx(expected.mean_diff)
    assert champ["wilcoxon_p"] == pytest.approx(expected.wilcoxon_p)
    assert (champ["wins"], champ["ties"], champ["losses"]) == (expected.wins, expected.ties, expected.losses)
    # both methods repeat one candidate: 3 runs a side cannot reach alpha with the exact permutation test
    assert champ["mean_diff"] > 0.5 and champ["report_verdict"].startswith("cannot separate: exact permutation "
                                                                           "needs >= 4 runs per arm")
    # one task: the corrections cannot change a single p-value
    assert champ["p_holm"] == pytest.approx(champ["run_level_p"]) == pytest.approx(champ["p_fdr_bh"])
    assert champ["run_level"]["run_sd_base"] == pytest.approx(0.0, abs=1e-12)  # both methods are deterministic: no run-to-run spread


def test_a_comparison_without_evidence_says_cannot_separate(study, tmp_path):
    # "twin" returns the champion too: identical held-out scores, nothing to call
    for seed in (0, 1, 2):
        run_dir = tmp_path / "twin" / f"seed-{seed}"
        Session(TASK, profile=PROFILE, budget=BUDGET, seed=seed, run_dir=run_dir, method="twin").run(champion_method)
    report = build_report([study / "main", tmp_path / "twin"], baseline="champion", n_boot=1000)
    rows = {row["method"]: row for row in report.table("heldout").data}
    assert rows["twin"]["report_verdict"] == "cannot separate: all 50 paired differences are 0"
    assert rows["seed"]["report_verdict"].startswith("cannot separate: exact permutation needs >= 4 runs per arm")
    results_rows = report.table("results").rows
    assert any("†" in cell.text for row in results_rows for cell in row)  # champion and twin tie for best


def test_a_single_instance_task_is_paired_by_seed_and_three_seeds_cannot_separate(tmp_path):
    from heldout.optimizers import resolve_optimizer

    for method in ("seed", "local-search"):
        for seed in (0, 1, 2):
            Session("heilbronn/triangle11", budget=6, seed=seed, run_dir=tmp_path / method / f"seed-{seed}",
                    method=method).run(resolve_optimizer(method))
    report = build_report([tmp_path], n_boot=1000)
    row = report.table("heldout").data[0]
    assert (row["unit"], row["n"]) == ("seeds", 3)
    # even 3 wins out of 3 seeds cannot reach Wilcoxon p < 0.05 (the smallest two-sided p is 0.25)
    assert row["wilcoxon_p"] == pytest.approx(0.25) and row["wins"] == 3
    assert row["report_verdict"].startswith("cannot separate")
    assert "0.000562" in report.table("results").rows[0][2].text  # the seed's ~5.6e-4 area is not shown as 0.001


def test_cost_table_counts_architect_tokens_and_gain_per_million(report_dir):
    results = json.loads((report_dir / "results.json").read_text())
    rows = {row["method"]: row for row in results["tables"]["cost"]["data"]}
    assert rows["search"]["architect_tokens"] > 0
    assert rows["search"]["optimisation_tokens"] == rows["search"]["architect_tokens"]  # program task: no worker
    assert rows["search"]["gain_per_million_optimisation_tokens"] == pytest.approx(
        rows["search"]["gain"] / (rows["search"]["optimisation_tokens"] / 1e6))
    assert rows["champion"]["gain_per_million_optimisation_tokens"] is None  # no tokens: n/a, not inf
    assert rows["champion"]["candidate_chars"] == len(CHAMPION)


def test_budget_table_reports_best_so_far_at_checkpoints(study):
    report = build_report([study / "main"], checkpoints=[10, 20, 60], n_boot=1000)
    rows = {row["method"]: row for row in report.table("budget").data}
    champ = rows["champion"]["checkpoints"]
    assert champ["10"]["mean"] == pytest.approx(0.2)  # the seed candidate on the first 10 train examples
    assert champ["20"]["mean"] == champ["60"]["mean"] == pytest.approx(1.0)
    assert rows["seed"]["checkpoints"]["60"] is None  # the seed method never evaluates


# -- tampering and failures are excluded loudly -------------------------------------------------------
def copy_main(study: Path, dest: Path) -> Path:
    shutil.copytree(study / "main", dest)
    return dest / TASK.replace("/", "__")


def test_a_tampered_ledger_is_excluded_and_announced_everywhere(study, tmp_path, capsys):
    cells = copy_main(study, tmp_path / "runs")
    ledger = cells / "champion" / "seed-1" / "ledger.jsonl"
    lines = ledger.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if '"test_scoring"' in line and '"score": 0.0' not in line)
    lines[index] = lines[index].replace('"score": 1.0', '"score": 0.0', 1)
    ledger.write_text("\n".join(lines) + "\n")

    out = tmp_path / "report"
    assert main(["report", str(tmp_path / "runs"), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "EXCLUDED" in err and "champion/seed-1" in err and "content was edited" in err
    assert "**WARNING**" in (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    assert 'class="warning"' in html and "ledger does not verify" in html
    results = json.loads((out / "results.json").read_text())
    assert [Path(e["path"]).parts[-2:] for e in results["excluded"]] == [("champion", "seed-1")]
    champ = next(r for r in results["tables"]["results"]["data"] if r["method"] == "champion")
    assert champ["seeds"] == [0, 2]


def test_a_run_record_edited_behind_the_ledger_is_excluded(study, tmp_path):
    cells = copy_main(study, tmp_path / "runs")
    path = cells / "seed" / "seed-2" / "run_record.json"
    record = json.loads(path.read_text())
    record["test_verdicts"][0]["score"] = 1.0 - record["test_verdicts"][0]["score"]
    path.write_text(json.dumps(record))
    runs = collect_runs([tmp_path / "runs"])
    assert [e.path.parts[-2:] for e in runs.excluded] == [("seed", "seed-2")]
    assert str(path) in runs.excluded[0].reason and "was edited" in runs.excluded[0].reason


def test_an_edited_test_score_can_never_change_a_table_or_the_gate(study, tmp_path):
    # the reproduction: test_score set to 0.9 in run_record.json put 0.900 in Table 1
    cells = copy_main(study, tmp_path / "runs")
    for seed in (0, 1, 2):
        path = cells / "seed" / f"seed-{seed}" / "run_record.json"
        record = json.loads(path.read_text())
        record["test_score"] = 0.9
        path.write_text(json.dumps(record, indent=1))
    report = build_report([tmp_path / "runs"], n_boot=200)
    assert sorted(e.path.parts[-2:] for e in report.runs.excluded) == [("seed", f"seed-{s}") for s in (0, 1, 2)]
    assert all("run_record.json was edited" in e.reason for e in report.runs.excluded)
    table = report.table("results")
    assert "seed" not in table.columns and not any("0.900" in c.text for row in table.rows for c in row)
    # the gate refuses too: no verified seed run is left to compare
    with pytest.raises(GateInputError, match="incomplete study|no verified, finished current run"):
        check_runs([study / "main"], [tmp_path / "runs"], method="seed")


def test_runs_of_another_worker_model_are_never_pooled(study, tmp_path):
    with TestServer() as server:
        for seed in (0, 1, 2):
            Session(TASK, profile=PROFILE, budget=BUDGET, seed=seed, run_dir=tmp_path / "m2" / f"seed-{seed}",
                    method="seed", models=SessionModels(worker=ModelClient("other-model", server.base_url))).run(seed_method)
    report = build_report([study / "main", tmp_path / "m2"], n_boot=200)
    labels = [row[0].text for row in report.table("results").rows]
    assert f"{TASK} [worker model: none]" in labels and f"{TASK} [worker model: other-model]" in labels
    cells = report.runs.cells()
    assert sorted(cells[(f"{TASK} [worker model: other-model]", "seed")]) == [0, 1, 2]
    assert sorted(cells[(f"{TASK} [worker model: none]", "seed")]) == [0, 1, 2]
    from heldout.reports.collect import pooling_conflicts
    conflicts = pooling_conflicts(collect_runs([study / "main"]), collect_runs([tmp_path / "m2"]))
    assert conflicts == [f"{TASK}: worker model none -> other-model"]


def test_every_run_record_describes_its_experiment_in_full(study):
    run = collect_runs([study / "main"]).cells()[(TASK, "search")][1]
    exp = run.record.experiment
    assert run.record.format_version == exp["format_version"] == 2
    for key in ("task", "profile", "manifest", "verifier", "policy", "budget", "seed", "optimizer", "worker",
                "architect", "decoding", "isolation", "environment", "started_at"):
        assert key in exp, key
    assert exp["architect"]["model"] == "test-architect" and exp["architect"]["base_url"].startswith("http://127.0.0.1")
    assert len(exp["manifest"]["profile_sha256"]) == 64 and exp["environment"]["python"]
    assert exp["environment"]["heldout_version"] and "numpy" in exp["environment"]["packages"]
    assert run.record.finished_at >= run.record.started_at
    assert run.record.isolation == "in-process (trusted)"


def test_an_interrupted_run_and_a_crashed_optimizer_are_listed_not_used(study, tmp_path):
    cells = copy_main(study, tmp_path / "runs")
    (cells / "search" / "seed-0" / "run_record.json").unlink()

    def crashing(view, seed):
        view.evaluate(view.seed_candidate, "train", [view.train[0]["id"]])
        raise RuntimeError("optimizer bug")

    Session(TASK, profile=PROFILE, budget=BUDGET, seed=7, run_dir=cells / "crashy" / "seed-7",
            method="crashy").run(crashing)
    report = build_report([tmp_path / "runs"], n_boot=1000)
    assert any("no run record" in w and "search/seed-0" in w for w in report.warnings)
    assert any(w.startswith("FAILED") and "optimizer bug" in w for w in report.warnings)
    assert "crashy" not in report.runs.methods()


def test_report_on_an_empty_or_missing_dir_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    assert "no run records found" in capsys.readouterr().err


# -- the regression gate -----------------------------------------------------------------------------
def heldout_check(warm_cli, *args: str) -> subprocess.CompletedProcess:
    """``heldout check``, a process of its own (forked warm: tests/warm_cli.py)."""
    return warm_cli.run("check", *args, cwd=Path.cwd())


def test_check_exits_1_on_a_planted_regression_and_prints_the_evidence(study, warm_cli):
    cells = study / "main" / TASK.replace("/", "__")
    # baseline: the champion; current: the worse seed candidate on the same seeds
    done = heldout_check(warm_cli, "--baseline", str(cells / "champion"), "--current", str(cells / "seed"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("REGRESSION: 1 regressed")
    assert "over 3 seed pairs x 50 example(s)" in done.stdout and "change -0.62" in done.stdout
    assert "baseline seeds [0, 1, 2] current seeds [0, 1, 2]" in done.stdout


def test_check_is_inconclusive_not_a_pass_when_the_same_method_reruns_on_3_fresh_seeds(study):
    # the same seed-dependent search on seeds 3-5 against seeds 0-2: run-to-run noise only; with
    # no tolerated drop and 3 runs a side the gate cannot show "no regression", and says so
    base = study / "main" / TASK.replace("/", "__") / "search"
    cur = study / "fresh" / TASK.replace("/", "__") / "search"
    result = check_runs([base], [cur], pair_seeds="independent")
    assert not result.regressed, result.evidence()
    assert result.outcome == "inconclusive" and "cannot separate" in result.gate.tasks[0].reason
    assert result.gate.tasks[0].comparison.test == "exact permutation" and result.gate.tasks[0].comparison.n_cur == 3
    assert main(["check", "--baseline", str(base), "--current", str(cur), "--pair-seeds", "rank"]) == 2


def test_check_exits_0_on_the_same_candidate_and_1_only_above_min_effect(study, capsys):
    cells = study / "main" / TASK.replace("/", "__")
    same = check_runs([cells / "champion"], [study / "fresh" / TASK.replace("/", "__") / "champion"],
                      pair_seeds="rank")
    assert same.outcome == "pass" and same.gate.tasks[0].identical
    # no margin lets a score lose more than half of itself: a drop of 0.62 from 1 is a regression
    # even under --min-effect 0.7 (held to 0.5), or a collapse could pass the gate
    assert main(["check", "--baseline", str(cells / "champion"), "--current", str(cells / "seed"),
                 "--min-effect", "0.7"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "capped from 0.7" in out


def test_check_refuses_what_it_cannot_pair(study, capsys):
    cells = study / "main" / TASK.replace("/", "__")
    fresh = study / "fresh" / TASK.replace("/", "__") / "champion"
    assert main(["check", "--baseline", str(cells / "champion"), "--current", str(fresh)]) == 2
    assert "do not pair one to one" in capsys.readouterr().err
    assert main(["check", "--baseline", str(study / "main"), "--current", str(study / "main")]) == 2
    assert "pass --method" in capsys.readouterr().err
    assert main(["check", "--baseline", str(study / "main"), "--current", str(study / "main"),
                 "--method", "search"]) == 0


def test_check_refuses_a_study_with_an_excluded_current_run(study, tmp_path, capsys):
    cells = copy_main(study, tmp_path / "runs")
    (cells / "seed" / "seed-0" / "ledger.head").write_text('{"count": 1, "hash": "x"}')
    baseline = study / "main" / TASK.replace("/", "__") / "champion"
    assert main(["check", "--baseline", str(baseline), "--current", str(cells / "seed")]) == 2
    err = capsys.readouterr().err
    assert "incomplete study" in err and "current run EXCLUDED" in err and "seed-0" in err


# -- the HTML renders in a real browser ------------------------------------------------------------
CHROMIUM = Path("/usr/bin/chromium")
RENDER_PROBE = """<script>
window.addEventListener('load', function () {
  var imgs = Array.from(document.images);
  var shown = function (el) { return el.offsetHeight > 0 && el.offsetWidth > 0; };
  var out = document.createElement('pre');
  out.id = 'render-check';
  out.textContent = 'images=' + imgs.length
    + ' decoded=' + imgs.filter(function (i) { return i.complete && i.naturalWidth > 0 && shown(i); }).length
    + ' tables=' + Array.from(document.querySelectorAll('table[id^="table-"]')).filter(shown).length
    + ' rows=' + Array.from(document.querySelectorAll('table[id^="table-"] tbody tr')).filter(shown).length;
  document.body.appendChild(out);
});
</script></body>"""


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (/usr/bin/chromium absent)")
def test_report_html_renders_tables_and_images_in_headless_chromium(report_dir, tmp_path):
    # The report itself has no script; a copy gets a probe that writes what rendered into the DOM.
    page = tmp_path / "probe.html"
    page.write_text((report_dir / "report.html").read_text().replace("</body>", RENDER_PROBE))
    done = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    results = json.loads((report_dir / "results.json").read_text())
    n_rows = sum(len(t["rows"]) for t in results["tables"].values())
    assert f'id="render-check">images=4 decoded=4 tables=6 rows={n_rows}<' in dom
    # the verdict cell holds the short verdict; its reasoning is a note below the table
    # 3 runs a side: the verdict cell says the exact test cannot reach alpha, and its reason is below
    assert "<td>cannot separate</td>" in dom
    assert "champion: cannot separate: exact permutation needs &gt;= 4 runs per arm" in dom and "+0.62" in dom


# -- several tasks: labels, corrections, mixed settings ---------------------------------------------
def test_two_profiles_are_two_comparisons_corrected_together_and_flagged_as_mixed(study, tmp_path):
    from statsmodels.stats.multitest import multipletests

    for method in ("seed", "champion"):
        for seed in (0, 1):
            Session(TASK, profile="generalise", budget=BUDGET, seed=seed, method=method,
                    run_dir=tmp_path / method / f"seed-{seed}").run(METHODS[method])
    report = build_report([study / "main", tmp_path], n_boot=1000)
    assert report.runs.tasks() == [f"{TASK} [generalise]", f"{TASK} [paper]"]
    rows = [r for r in report.table("heldout").data if r["method"] == "champion"]
    assert [r["n"] for r in rows] == [300, 50]
    raw = [r["run_level_p"] for r in rows]  # the test the conclusion rests on: runs are the unit
    assert [r["p_holm"] for r in rows] == pytest.approx(list(multipletests(raw, method="holm")[1]))
    assert [r["p_fdr_bh"] for r in rows] == pytest.approx(list(multipletests(raw, method="fdr_bh")[1]))
    for table in ("results", "heldout", "cost", "budget"):
        assert f"split profile: per task: {TASK} [generalise] generalise, {TASK} [paper] paper" in report.table(table).notes[0]
    assert "macro mean" in [row[0].text for row in report.table("results").rows]


# -- figure helpers ---------------------------------------------------------------------------------
def test_pareto_front_keeps_only_points_no_other_beats_on_both_axes():
    from heldout.reports.figures import pareto_front

    points = [(0.0, 0.5), (10.0, 0.9), (5.0, 0.4), (20.0, 0.9), (10.0, 0.7)]
    assert pareto_front(points) == [(0.0, 0.5), (10.0, 0.9)]


def test_scatter_aggregates_by_topic_when_groups_are_known(study):
    from heldout.reports.figures import paired_scatter

    runs = collect_runs([study / "main"])
    ids = list(runs.cells()[(TASK, "seed")][0].test_scores())
    by_example = paired_scatter(runs, "seed")
    by_group = paired_scatter(runs, "seed", {TASK: {ex: f"topic-{i % 4}" for i, ex in enumerate(ids)}})
    assert by_example.title.startswith("Per-example") and by_group.title.startswith("Per-group (topic)")
    assert by_group.png.startswith(b"\x89PNG") and by_group.png != by_example.png


# -- a prompt task: worker and architect tokens over loopback HTTP --------------------------------
def test_prompt_task_report_counts_deployment_tokens_and_refuses_a_split_seed_range(data_dir, tmp_path):
    from heldout.optimizers import resolve_optimizer

    with TestServer() as server:
        worker = ModelClient("test-worker", server.base_url)
        architect = ModelClient("test-architect", server.base_url)
        for method in ("seed", "reflective"):
            for seed in (0, 1):
                Session("bbh/boolean_expressions", budget=24, seed=seed, method=method, models=SessionModels(worker=worker, architect=architect), data_dir=str(data_dir),
                        run_dir=tmp_path / "runs" / method / f"seed-{seed}").run(resolve_optimizer(method))
    report = build_report([tmp_path / "runs"], data_dir=str(data_dir), n_boot=1000)
    cost = {row["method"]: row for row in report.table("cost").data}
    assert cost["seed"]["optimisation_tokens"] == 0 and cost["seed"]["deployment_tokens"] > 0
    assert cost["reflective"]["optimisation_tokens"] > cost["reflective"]["architect_tokens"] > 0
    assert cost["reflective"]["gain_per_million_optimisation_tokens"] == pytest.approx(
        cost["reflective"]["gain"] / (cost["reflective"]["optimisation_tokens"] / 1e6))
    # the report calls a difference only with the paired test, Holm AND non-overlapping seed ranges
    row = report.table("heldout").data[0]
    called = row["separable"] and row["p_holm"] < 0.05 and row["seed_ranges_separate"]
    assert row["report_verdict"].startswith("cannot separate") is (not called)
    assert {f.key for f in report.figures} >= {"pareto_optimisation", "pareto_deployment"}
    assert "No deployment tokens" not in next(f.caption for f in report.figures if f.key == "pareto_deployment")
    # the three extraction modes side by side, the headline marked and equal to the results table's mean
    modes = {row["method"]: row for row in report.table("extraction").data}
    results = {row["method"]: row["mean"] for row in report.table("results").data}
    for method, row in modes.items():
        records = [r.record for r in collect_runs([tmp_path / "runs" / method]).runs]
        for mode in ("strict", "flexible", "published"):
            by_seed = [sum(v["dimensions"][mode] for v in rec.test_verdicts) / len(rec.test_verdicts) for rec in records]
            assert row["modes"][mode] == pytest.approx(sum(by_seed) / len(by_seed))
        assert row["headline"] == "published" and row["modes"]["published"] == pytest.approx(results[method])


def test_markdown_escapes_text_from_runs_and_states_settings_and_models_once(study, tmp_path):
    def hostile(view, seed):
        raise RuntimeError("<script>alert('x')</script> | **bold** _it_")
    Session(TASK, profile=PROFILE, budget=BUDGET, seed=0, run_dir=tmp_path / "hostile" / "seed-0",
            method="hostile").run(hostile)
    out = tmp_path / "report"
    assert main(["report", str(study / "main"), str(tmp_path / "hostile"), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "<script" not in md and "&lt;script&gt;" in md and "\\*\\*bold\\*\\*" in md
    assert md.count("Settings - ") == 1
    assert "Architect model: test-architect at 127.0.0.1" in md and "Scored by heldout 0.1.0 (" in md and "files sha256 " in md
    html = (out / "report.html").read_text()
    assert "<script" not in html and html.count("Settings - ") == 1


def test_figures_zoom_to_the_data_and_mark_the_baseline(study):
    import matplotlib.image as mpimg
    import io
    from heldout.reports.figures import score_bars

    runs = collect_runs([study / "main"])
    fig = score_bars(runs, "seed")
    assert "dashed line marks seed's mean" in fig.caption and "does not start at 0" in fig.caption
    assert mpimg.imread(io.BytesIO(fig.png)).shape[2] in (3, 4)


def test_each_task_is_read_at_checkpoints_of_its_own_budget_not_the_largest_one(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path, "synthetic/small", "m", seed, budget=20)
        write_run(tmp_path, "synthetic/large", "m", seed, budget=2000)
    table = budget_table(collect_runs([tmp_path]))
    points = {row["task"]: list(row["checkpoints"]) for row in table.data}
    assert points == {"synthetic/large": ["500", "1000", "1500", "2000"], "synthetic/small": ["5", "10", "15", "20"]}
    assert table.columns[2:] == ["checkpoint 1", "checkpoint 2", "checkpoint 3", "checkpoint 4"]
    assert any("its own checkpoints" in note for note in table.notes)


def test_tasks_of_one_budget_keep_call_count_columns(tmp_path):
    for task in ("synthetic/a", "synthetic/b"):
        write_run(tmp_path, task, "m", 0, budget=40)
    assert budget_table(collect_runs([tmp_path])).columns[2:] == ["@10 calls", "@20 calls", "@30 calls", "@40 calls"]
