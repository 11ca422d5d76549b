"""The metric's direction reaches the optimizers: what an optimizer sees of a lower-is-better task.

Two real plugin tasks, installed by pip (their entry points) and frozen with ``heldout data freeze``:
``tourcost/ring8`` (tests/test_metric_direction.py: the length of a closed tour of 8 points, a
permutation) and ``costfit/pair2`` (the squared distance of two tunable numbers to each example's
point, a cost a literal search can lower). The rule under test (:class:`heldout.contracts.TaskView`):
the view carries ``metric``, a shown score is the metric's reading, and every reference search and
library adapter compares in the metric's direction.

The adversary: a candidate that crashes on purpose. Its verdict scores 0.0 by the validity rule,
and 0.0 is the best cost there is; an optimizer that read it so would keep the crash.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from heldout.adapters import openevolve as oe
from heldout.evaluators.records import RunRecord
from plugin_site import task_plugin_site
from test_metric_direction import PLUGIN as RING_PLUGIN
from test_metric_direction import heldout

RING, FIT = "tourcost/ring8", "costfit/pair2"
SEEDS = "0,1,2"

FIT_PLUGIN = textwrap.dedent('''
    """costfit/pair2: two numbers, the squared distance to each example's point (a cost)."""
    import random
    import re

    from heldout.benchmarks.base import Benchmark
    from heldout.benchmarks.registry import register
    from heldout.contracts import Example, MetricSpec, Source, Verdict

    NUMBER = r"(-?\\d+(?:\\.\\d+)?(?:e-?\\d+)?)"


    class PairFit(Benchmark):
        name = "costfit/pair2"
        family = "costfit"
        kind = "program"
        metric = MetricSpec("squared distance", higher_is_better=False, failure_score=100.0)
        score_ceiling = 0.0
        description = "params.txt: 'x = NUMBER' and 'y = NUMBER'; the closer to each example's point the better"
        source = Source(embedded=True)
        default_component = "params.txt"

        def load_raw(self, data_dir=None):
            rng = random.Random(7)
            return [Example(id=f"p{i}", input={"point": [0.4 + rng.uniform(-0.1, 0.1), 0.7 + rng.uniform(-0.1, 0.1)]},
                            target=None) for i in range(24)]

        def seed_candidate(self):
            return {"params.txt": "x = 3.0\\ny = -2.0\\n"}

        def run(self, candidate, example, context=None):
            text = candidate.get("params.txt", "")
            x, y = (re.search(rf"^{name} = {NUMBER}$", text, re.M) for name in ("x", "y"))
            if x is None or y is None:
                return Verdict.failure(example.id, "params.txt must set x and y", "bad_output")
            a, b = example.input["point"]
            cost = (float(x.group(1)) - a) ** 2 + (float(y.group(1)) - b) ** 2
            return Verdict(example.id, score=cost, output=[float(x.group(1)), float(y.group(1))])


    register(PairFit())
''')

# run once in-process (--trusted-optimizer) and once isolated (the default for user code)
SHOW = textwrap.dedent('''
    """What an optimizer sees of the metric, and of a crash, recorded as an event."""


    def optimize(view, seed):
        crash = {"order.txt": "crash"}
        view.record_event("seen", metric=view.metric.record_fields(), sign=view.metric.sign,
                          train_crash=view.evaluate(crash, "train", [view.train[0]["id"]])[0]["score"],
                          val_crash=view.evaluate(crash, "val", [view.val[0]["id"]])[0],
                          seed_cost=view.evaluate(view.seed_candidate, "train", [view.train[0]["id"]])[0]["score"])
        return dict(view.seed_candidate)
''')


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """Both plugins installed and frozen (8 train, 4 val, 12 test examples)."""
    root = tmp_path_factory.mktemp("optimizer-direction")
    site, manifests, env = task_plugin_site(
        root, "costtasks", {"tourcost_tasks": RING_PLUGIN, "costfit_tasks": FIT_PLUGIN, "show_metric": SHOW},
        {"tourcost": "tourcost_tasks", "costfit": "costfit_tasks"})
    for task in (RING, FIT):
        frozen = heldout(env, "data", "freeze", "--task", task, "--profile", "default", "--sizes", "8/4/12",
                         "--out", str(manifests))
        assert frozen.returncode == 0, frozen.stderr[-2000:]
    return {"env": env, "root": root, "site": site}


def _run(tasks, task, *methods, budget="160", extra=()):
    runs = tasks["root"] / "runs" / task.replace("/", "_") / "-".join(m.split(":")[0] for m in methods)
    argv = ["run", "--task", task, "--seeds", SEEDS, "--budget", budget, "--run-dir", str(runs), *extra]
    for method in methods:
        argv += ["--optimizer", method]
    done = heldout(tasks["env"], *argv)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return {(r.method, r.seed): r for r in map(RunRecord.load, (p.parent for p in runs.rglob("run_record.json")))}


def _events(record_dir, kind):
    lines = (json.loads(line) for line in (record_dir / "ledger.jsonl").open())
    return [e["data"] for e in lines if e["kind"] == "optimizer_event" and e["data"]["kind"] == kind]


# -- a reference search lowers a cost ---------------------------------------------------------------
def test_constant_search_lowers_the_cost_on_every_seed_and_says_its_recorded_scores_are_oriented(tasks):
    records = _run(tasks, FIT, "seed", "constant-search")
    for seed in map(int, SEEDS.split(",")):
        start, searched = records["seed", seed], records["constant-search", seed]
        assert start.status == searched.status == "ok", searched.error
        # a maximising search would have walked away from the point: a cost above the seed's
        assert searched.test_score < 0.9 * start.test_score, (seed, searched.test_score, start.test_score)
        best = [point["best_score"] for point in searched.trajectory]
        assert best == sorted(best, reverse=True) and len(best) >= 2
    run_dir = next((tasks["root"] / "runs").rglob("constant-search/**/run_record.json")).parent
    [stated] = _events(run_dir, "score_orientation")
    assert stated["data"]["sign"] == -1 and stated["data"]["metric"] == "squared distance"


def test_on_the_tour_a_literal_search_never_keeps_a_crashing_order_and_local_search_has_no_search(tasks):
    # every nudge of a literal of "0 1 2 ... 7" breaks the permutation: an invalid verdict, whose
    # shown score is the failure cost 16, never the 0.0 that would beat any tour
    records = _run(tasks, RING, "seed", "constant-search")
    for seed in map(int, SEEDS.split(",")):
        searched = records["constant-search", seed]
        assert searched.status == "ok" and all(v["valid"] for v in searched.test_verdicts)
        assert searched.final_candidate == records["seed", seed].final_candidate
        assert searched.test_score == pytest.approx(records["seed", seed].test_score)
    refused = heldout(tasks["env"], "run", "--task", RING, "--seeds", "0", "--budget", "160", "--optimizer",
                      "local-search", "--run-dir", str(tasks["root"] / "runs" / "ring-local"))
    said = refused.stdout + refused.stderr
    assert "local-search" in said and "tourcost/ring8" in said, said[-2000:]


# -- the isolated client shows what the in-process view shows --------------------------------------------
def test_the_isolated_view_shows_the_same_metric_and_the_same_crash_cost_as_the_in_process_view(tasks):
    seen = {}
    for mode, extra in (("in-process", ("--trusted-optimizer",)), ("isolated", ())):
        runs = tasks["root"] / "runs" / f"show-{mode}"
        done = heldout(tasks["env"], "run", "--task", RING, "--seeds", "0", "--budget", "20", "--optimizer",
                       "show_metric:optimize", *extra, "--run-dir", str(runs))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        [record_path] = runs.rglob("run_record.json")
        [event] = _events(record_path.parent, "seen")
        seen[mode] = event["data"]
        kinds = {json.loads(line)["kind"] for line in (record_path.parent / "ledger.jsonl").open()}
        assert ("optimizer_launch" in kinds) == (mode == "isolated")  # the sandboxed process, served over HTTP
    assert seen["isolated"] == seen["in-process"]
    shown = seen["isolated"]
    assert shown["metric"] == {"metric": "tour length", "higher_is_better": False, "aggregation": "mean",
                               "failure_score": 16.0} and shown["sign"] == -1
    # val shows the score alone: the crash's is the failure cost there too, never 0.0
    assert shown["train_crash"] == 16.0 and shown["val_crash"] == {"id": shown["val_crash"]["id"], "score": 16.0}
    assert 0.0 < shown["seed_cost"] < 16.0


# -- the libraries that only maximise are fed the oriented score ---------------------------------------------
GEPA_PROBE = textwrap.dedent('''
    """GEPA's adapter over a real session of the cost task: the scores it hands GEPA, as JSON."""
    import json
    import sys

    from heldout.adapters.gepa import SplitLoader, ViewGEPAAdapter
    from heldout.evaluators.session import Budget, Session

    session = Session("costfit/pair2", budget=Budget(12), run_dir=sys.argv[1], method="probe")
    adapter, loader = ViewGEPAAdapter(session.view), SplitLoader("train", session.view.train)
    batch = loader.fetch(loader.all_ids()[:2])
    seed = dict(session.view.seed_candidate)
    print(json.dumps({
        "seed": adapter.evaluate(batch, seed).scores,
        "shown": [r["score"] for r in session.view.evaluate(seed, "train", [e["id"] for e in session.view.train[:2]])],
        "crash": adapter.evaluate(batch, {"params.txt": "crash"}).scores,
        "refused": adapter.evaluate(batch, {"params.txt": 7}).scores,  # not text: the whole request refused
    }))
''')


def test_gepa_is_fed_a_cost_negated_and_a_crash_or_a_refusal_as_the_worst_cost(tasks, tmp_path):
    pytest.importorskip("gepa", reason="the [gepa] extra is not installed (CI installs it)")
    (tmp_path / "probe.py").write_text(GEPA_PROBE)
    done = subprocess.run([sys.executable, str(tmp_path / "probe.py"), str(tmp_path / "run")], capture_output=True,
                          text=True, env=tasks["env"], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    fed = json.loads(done.stdout.strip().splitlines()[-1])
    assert fed["seed"] == [-cost for cost in fed["shown"]] and all(cost > 1.0 for cost in fed["shown"])
    assert fed["crash"] == fed["refused"] == [-100.0, -100.0]  # below the seed's: GEPA never prefers them


def test_dspys_metrics_return_a_cost_negated_so_its_optimizers_maximise_towards_the_lowest_cost():
    dspy = pytest.importorskip("dspy", reason="the [dspy] extra is not installed (CI installs it)")
    from heldout.adapters.dspy import _with_verdict, feedback_metric, metric

    shown = {"id": "a", "score": 4.5, "feedback": "tour length 4.5"}
    as_cost = _with_verdict(dspy.Prediction(answer="x"), shown, -1)
    assert metric(None, as_cost) == -4.5 and feedback_metric(None, as_cost).score == -4.5
    assert metric(None, _with_verdict(dspy.Prediction(answer="x"), shown, 1)) == 4.5


def test_reflective_shows_the_architect_a_costs_highest_examples_and_an_accuracys_misses():
    from heldout.contracts import MetricSpec
    from heldout.optimizers.reflective import _failures

    rows = [{"id": str(i), "score": s} for i, s in enumerate((1.0, 9.0, 0.0, 4.0, 7.0, 2.0))]
    cost = MetricSpec("seconds", higher_is_better=False, failure_score=60.0)
    assert [r["id"] for r in _failures(cost, rows)] == ["1", "4", "3", "5"]
    assert [r["id"] for r in _failures(MetricSpec("accuracy"), rows)] == ["2"]


def test_openevolve_is_fed_a_cost_negated_so_its_maximum_is_the_lowest_cost():
    rows = {"train": [{"id": "a", "score": 3.0}, {"id": "b", "score": 5.0}], "val": [{"id": "c", "score": 1.0}]}
    as_cost = oe._metrics(rows, -1).metrics
    assert as_cost["combined_score"] == -3.0 and as_cost["train_score"] == -4.0 and as_cost["val_score"] == -1.0
    assert oe._metrics(rows, 1).metrics["combined_score"] == 3.0


# -- tasks list -------------------------------------------------------------------------------------------
def test_tasks_list_shows_the_direction_beside_the_metric(tasks):
    listed = heldout(tasks["env"], "tasks", "list")
    assert listed.returncode == 0, listed.stderr[-2000:]
    [ring] = [line for line in listed.stdout.splitlines() if line.startswith(RING)]
    assert "tour length (lower is better)" in ring
    [six] = [line for line in listed.stdout.splitlines() if line.startswith("lockpicking/six")]
    assert "(higher is better)" in six
    rows = json.loads(heldout(tasks["env"], "tasks", "list", "--json").stdout)
    assert {r["name"]: r["higher_is_better"] for r in rows if r["name"] in (RING, FIT)} == {RING: False, FIT: False}
