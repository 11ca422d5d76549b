"""A metric with a direction: a cost-like task declared lower-is-better, end to end.

The task is a real plugin (installed by pip, its entry point found on the path, frozen with ``heldout data
freeze``): ``tourcost/ring8`` scores a visiting order of 8 jittered points on a circle by the
length of the closed tour, lower is better. ``heldout run`` runs the seed (a scrambled order) and
a seed-driven search that shortens the tour; ``heldout report``, ``check`` and ``plan`` must read
the shorter tour as the better one. The adversary: a candidate that crashes on purpose, whose
invalid verdicts score 0.0 by the validity rule, and 0.0 is the best cost there is.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from heldout.contracts import MetricSpec, Verdict
from plugin_site import task_plugin_site

TASK = "tourcost/ring8"
SEEDS = "0,1,2,3,4"  # 5 seed pairs: the gate's one-sided exact sign-flip reaches 1/32 < 0.05

PLUGIN = textwrap.dedent('''
    """tourcost/ring8: visit 8 points once each; the score is the closed tour's length (a cost)."""
    import math
    import random

    from heldout.benchmarks.base import Benchmark
    from heldout.benchmarks.registry import register
    from heldout.contracts import Example, MetricSpec, Source, Verdict

    POINTS = 8
    SLOT = [3, 6, 1, 4, 7, 2, 5, 0]  # point k sits at slot SLOT[k] of the circle: 0..7 in order is a bad tour


    class RingTour(Benchmark):
        name = "tourcost/ring8"
        family = "tourcost"
        kind = "program"
        metric = MetricSpec("tour length", higher_is_better=False, failure_score=2.0 * POINTS)
        score_ceiling = 0.0
        description = "order.txt: the 8 point labels in visiting order; shorter closed tours are better"
        source = Source(embedded=True)
        default_component = "order.txt"

        def load_raw(self, data_dir=None):
            out = []
            for i in range(24):
                rng = random.Random(i)
                angles = [2 * math.pi * (SLOT[k] + rng.uniform(-0.3, 0.3)) / POINTS for k in range(POINTS)]
                out.append(Example(id=f"ring{i}", input={"points": [[math.cos(a), math.sin(a)] for a in angles]},
                                   target=None))
            return out

        def seed_candidate(self):
            return {"order.txt": " ".join(map(str, range(POINTS)))}

        def run(self, candidate, example, context=None):
            try:
                order = [int(word) for word in candidate.get("order.txt", "").split()]
            except ValueError:
                order = []
            if sorted(order) != list(range(POINTS)):
                return Verdict.failure(example.id, "order.txt must list 0..7 once each", "bad_output")
            pts = example.input["points"]
            length = sum(math.dist(pts[order[j]], pts[order[(j + 1) % POINTS]]) for j in range(POINTS))
            return Verdict(example.id, score=length, output=order, feedback=f"tour length {length:.4f}")


    register(RingTour())
''')

SEARCH = textwrap.dedent('''
    """A seed-driven search that shortens the tour: random reversals, kept when the train cost drops."""
    import random

    from heldout.contracts import BudgetExceeded


    def optimize(view, seed):
        rng = random.Random(seed)
        best = dict(view.seed_candidate)

        def cost(candidate):
            rows = view.evaluate(candidate, "train")
            return sum(r["score"] for r in rows) / len(rows)

        best_cost = cost(best)
        try:
            while True:
                order = best["order.txt"].split()
                i, j = sorted(rng.sample(range(len(order)), 2))
                order[i:j + 1] = reversed(order[i:j + 1])
                candidate = {"order.txt": " ".join(order)}
                value = cost(candidate)
                if value < best_cost:
                    best, best_cost = candidate, value
        except BudgetExceeded:
            return best
''')


def heldout(env, *argv, timeout=600):
    code = "import sys\nfrom heldout.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The plugin installed, its manifest frozen, and a finished study: seed and the search on 5 seeds."""
    root = tmp_path_factory.mktemp("direction")
    _, manifests, env = task_plugin_site(root, "tourcost", {"tourcost_tasks": PLUGIN, "tourcost_search": SEARCH},
                                         {"tourcost": "tourcost_tasks"})
    frozen = heldout(env, "data", "freeze", "--task", TASK, "--profile", "default", "--sizes", "8/4/12",
                     "--out", str(manifests))
    assert frozen.returncode == 0, frozen.stderr[-2000:]
    runs = root / "runs"
    for method in ("seed", "tourcost_search:optimize"):
        done = heldout(env, "run", "--task", TASK, "--optimizer", method, "--trusted-optimizer", "--seeds", SEEDS,
                       "--budget", "160", "--run-dir", str(runs / method.split(":")[0]))
        assert done.returncode == 0, done.stderr[-3000:]
    return {"env": env, "root": root, "runs": runs}


def _records(folder):
    return [json.loads(p.read_text()) for p in sorted(folder.rglob("run_record.json"))]


# -- the spec -------------------------------------------------------------------------------------------
def test_a_lower_is_better_metric_must_say_what_a_failure_counts_as():
    with pytest.raises(ValueError, match="failure_score"):
        MetricSpec("seconds", higher_is_better=False)


def test_an_invalid_verdict_counts_as_the_failure_score_never_as_the_best_cost():
    cost = MetricSpec("seconds", higher_is_better=False, failure_score=30.0)
    crashed = Verdict.failure("a", "crashed on purpose", "crash")
    assert crashed.score == 0.0 and cost.aggregate([crashed, Verdict("b", 2.0)]) == 16.0


def test_a_plain_name_and_a_record_from_before_directions_read_higher_is_better():
    assert MetricSpec.of("accuracy") == MetricSpec("accuracy") and MetricSpec("accuracy").sign == 1
    assert MetricSpec.from_record({"metric": "accuracy"}).higher_is_better is True


def test_a_named_aggregation_is_computed_and_an_unknown_one_is_refused():
    verdicts = [Verdict("a", 1.0), Verdict("b", 2.0), Verdict("c", 9.0)]
    assert MetricSpec("x", aggregation="median").aggregate(verdicts) == 2.0
    with pytest.raises(ValueError, match="named aggregations"):
        MetricSpec("x", aggregation="147734 / max cycles").aggregate(verdicts)


# -- run: the record states the direction; the best-so-far goes down ------------------------------------
def test_the_run_record_states_the_metric_and_the_search_lowers_the_cost(study):
    seed = _records(study["runs"] / "seed")
    search = _records(study["runs"] / "tourcost_search")
    assert len(seed) == len(search) == 5
    for record in seed + search:
        assert record["status"] == "ok", record.get("error")
        exp = record["experiment"]
        assert (exp["metric"], exp["higher_is_better"], exp["failure_score"]) == ("tour length", False, 16.0)
    assert max(r["test_score"] for r in search) < min(r["test_score"] for r in seed)
    for record in search:  # best-so-far is the lowest cost seen so far, never the highest
        best = [point["best_score"] for point in record["trajectory"]]
        assert best == sorted(best, reverse=True) and len(best) >= 2


def test_a_candidate_that_crashes_on_purpose_scores_the_worst_cost_not_the_best(study, tmp_path):
    bad = tmp_path / "order.txt"
    bad.write_text("crash")
    result = heldout(study["env"], "eval", "--task", TASK, "--candidate", str(bad), "--split", "test", "--json")
    assert result.returncode == 1, result.stderr[-2000:]  # eval's exit for a candidate whose verdicts failed
    summary = json.loads(result.stdout)
    assert summary["valid"] is False and summary["score"] == 16.0


# -- report: best, wins, gains and verdicts read "lower is better" ---------------------------------------
def test_the_report_calls_the_shorter_tour_better(study):
    out = study["root"] / "report"
    made = heldout(study["env"], "report", str(study["runs"]), "--out", str(out))
    assert made.returncode == 0, made.stderr[-2000:]
    tables = json.loads((out / "results.json").read_text())["tables"]
    best = {row["method"]: row["best"] for row in tables["results"]["data"] if row["task"] == TASK}
    assert best == {"seed": False, "tourcost_search:optimize": True}
    wins = next(row for row in tables["results"]["rows"] if row[0].startswith("wins/ties/losses"))
    assert wins[tables["results"]["columns"].index("tourcost_search:optimize")].startswith("1/0/0 (sep. 1/0)")
    [paired] = tables["heldout"]["data"]
    assert paired["higher_is_better"] is False and paired["mean_diff"] < 0
    assert paired["report_verdict"].startswith("tourcost_search:optimize is better than seed"), paired["report_verdict"]
    assert paired["wins"] > paired["losses"]
    [cost] = [row for row in tables["cost"]["data"] if row["method"] != "seed"]
    assert cost["gain"] > 0  # a gain is an improvement: the tour got shorter
    assert any("Lower is better on tourcost/ring8" in note for note in tables["heldout"]["notes"])
    assert all("metric: tour length (lower is better)" in table["notes"][0] for table in tables.values()
               if table["notes"] and table["notes"][0].startswith("Settings - "))
    page = (out / "report.html").read_text()
    improved, worse = map(int, re.search(r"(\d+) improved, (\d+) worse", page).groups())
    assert improved > worse  # the drill-down counts shorter tours as improved examples
    assert "below it where lower is better: tourcost/ring8" in page


# -- check: lowering the cost passes, raising it is a regression -----------------------------------------
def test_the_gate_passes_a_shorter_tour_and_calls_a_longer_one_a_regression(study):
    runs = study["runs"]
    better = heldout(study["env"], "check", "--baseline", str(runs / "seed"), "--current", str(runs / "tourcost_search"))
    assert better.returncode == 0, better.stdout[-3000:] + better.stderr[-2000:]
    assert "lower-is-better" in better.stdout
    worse = heldout(study["env"], "check", "--baseline", str(runs / "tourcost_search"), "--current", str(runs / "seed"))
    assert worse.returncode == 1, worse.stdout[-3000:] + worse.stderr[-2000:]


def test_the_plan_reads_the_room_left_as_a_drop_in_cost(study):
    planned = heldout(study["env"], "plan", "--task", TASK, "--seeds", "5", "--pilot", str(study["runs"] / "seed"))
    assert planned.returncode == 0, planned.stdout[-2000:] + planned.stderr[-2000:]
    assert "lower-is-better" in planned.stdout


# -- compare arms: the seed's room to improve is measured downwards for a cost ---------------------------
def test_the_arms_headroom_of_a_cost_is_the_seeds_distance_down_to_the_best():
    from heldout.protocols.arms_plan import Headroom

    roomy = Headroom("val", seed_score=10.0, ceiling=6.0, min_headroom=0.1, higher_is_better=False)
    assert roomy.room == 4.0 and not roomy.little
    tight = Headroom("val", seed_score=6.2, ceiling=6.0, min_headroom=0.1, higher_is_better=False)
    assert tight.little and "lower is better" in tight.describe()
    assert Headroom("val", seed_score=0.5, ceiling=1.0, min_headroom=0.1).room == 0.5  # a score: upwards


# -- protocol generalisation: a held-out gain is a drop in cost beyond the placebo floor ------------------
def _record(method, seed, test, val, metric):
    from heldout.evaluators.records import RunRecord

    return RunRecord(task="t", profile="p", seed=seed, method=method, status="ok", budget={}, policy={}, limits={},
                     options={}, drift=None, final_candidate={"prompt": f"{method} {seed}"},
                     final_candidate_id=f"{method}-{seed}", test_verdicts=[], val_verdicts=[], test_score=test,
                     val_score=val, usage={}, trajectory=[], lineage=[], experiment=metric.record_fields())


def test_the_generalisation_verdicts_call_a_lower_cost_a_gain():
    from heldout.protocols.generalisation import compare_heldout
    from heldout.protocols.placebo import placebo_seeds

    cost = MetricSpec("seconds", higher_is_better=False, failure_score=60.0)
    seeds = [0, 1, 2, 3, 4]
    records = [_record("seed", s, 10.0, 10.0, cost) for s in seeds]
    records += [_record("placebo", p, 10.0 + 0.1 * (p % 3), 10.0 + 0.1 * (p % 3), cost)
                for p in placebo_seeds(seeds, 3)]
    records += [_record("opt", s, 7.0 - 0.1 * s, 6.5 - 0.1 * s, cost) for s in seeds]
    comparison = compare_heldout(records, "opt", {"val": 20, "test": 40})
    assert comparison.pooled("heldout_gain") > 2.5 and comparison.pooled("val_gain") > 3.0
    assert comparison.heldout.decided and comparison.heldout.sign == "+", comparison.heldout.sentence


# -- compare verifiers: validation gain and held-out transfer are improvements, a drop in cost -----------
def test_the_verifier_ablation_reads_a_lower_cost_as_a_gain_and_a_transfer():
    from types import SimpleNamespace

    from heldout.protocols.verifier_ablation import _variant_row

    cost = MetricSpec("seconds", higher_is_better=False, failure_score=60.0)
    seeds = [0, 1, 2, 3, 4]
    records = {("seed", "decomposed", s): _record("seed", s, 10.0, 10.0, cost) for s in seeds}
    records.update({("opt", "decomposed", s): _record("opt", s, 8.0, 6.0, cost) for s in seeds})
    plan = SimpleNamespace(seeds=seeds, optimizer=SimpleNamespace(name="opt"))
    row = _variant_row(plan, "decomposed", records, None, None)
    # the validation gain (4 seconds saved) overstates the held-out transfer (2 seconds saved)
    assert row.mean_val_gain == 4.0 and row.mean_transfer == 2.0 and row.mean_gap == 2.0


# -- the adversary: one task's runs that disagree on the direction are never compared --------------------
def test_runs_of_one_task_that_disagree_on_the_direction_are_refused_in_one_line_writing_nothing(study):
    flipped_site = study["root"] / "flipped-site"
    flipped_site.mkdir(exist_ok=True)
    (flipped_site / "tourcost_tasks.py").write_text(PLUGIN.replace("higher_is_better=False", "higher_is_better=True"))
    (flipped_site / "tourcost-0.1.dist-info").mkdir(exist_ok=True)
    for name in ("METADATA", "entry_points.txt"):
        source = study["root"] / "site" / "tourcost-0.1.dist-info" / name
        (flipped_site / "tourcost-0.1.dist-info" / name).write_text(source.read_text())
    env = dict(study["env"], PYTHONPATH=os.pathsep.join([str(flipped_site), os.environ.get("PYTHONPATH", "")]))
    flipped = study["root"] / "flipped"
    done = heldout(env, "run", "--task", TASK, "--optimizer", "seed", "--seeds", "0,1", "--budget", "160",
                   "--run-dir", str(flipped))
    assert done.returncode == 0, done.stderr[-2000:]
    out = study["root"] / "mixed-report"
    mixed = heldout(study["env"], "report", str(study["runs"] / "tourcost_search"), str(flipped), "--out", str(out))
    assert mixed.returncode == 2 and "state different metrics" in mixed.stderr, mixed.stderr[-2000:]
    assert len(mixed.stderr.strip().splitlines()) == 1 and not out.exists()
    gate = heldout(study["env"], "check", "--baseline", str(flipped), "--current", str(study["runs"] / "seed"),
                   "--pair-seeds", "independent")
    assert gate.returncode == 2 and "state different metrics" in gate.stderr, gate.stderr[-2000:]
