"""Equal-budget arms (serial vs best-of-N fork vs merge-of-N), specified on program tasks built here.

``armstoy/independent`` scores a candidate of four components, each holding one constant, as the
mean over components of its closeness to a hidden target: the components are independent, so
merging edits of different components helps by construction. ``armstoy/single`` holds the same
four constants in one component: every pair of edits conflicts, merging degenerates to selection,
and the comparison must say so. Both run with the reference ``constant-search`` (no model)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from heldout.benchmarks.base import Benchmark
from heldout.benchmarks.registry import register
from heldout.cli import main
from heldout.contracts import Example, Source, Verdict
from heldout.data_manifests import MANIFEST_PATH_ENV, freeze
from heldout.evaluators.ledger import read_entries
from heldout.evaluators.session import Session
from heldout.optimizers import resolve_optimizer
from heldout.optimizers.merge import build_union
from heldout.protocols.arms import check_headroom
from heldout.protocols.arms_comparison import arms_table, compare_arms
from heldout.protocols.arms_plan import ArmsError, ArmsSpec, plan_arms
from heldout.protocols.decide import contrast
from heldout.protocols.run import StudyConfig

TARGETS = (12, -9, 15, 8)
SCALE = 20.0
_VALUE = re.compile(r"=\s*(-?\d+)")


class FourConstants(Benchmark):
    """Score = mean over the four constants of max(0, 1 - |value - target| / 20); example ``i``
    shifts every target by ``i % 3`` (so val and test are not copies of train)."""

    family = "armstoy"
    kind = "program"
    metric = "closeness"
    source = Source(embedded=True)

    def __init__(self, name: str, components: tuple[str, ...], seed_values: tuple[int, ...] = (0, 0, 0, 0)) -> None:
        self.name = name
        self.components = components
        self.seed_values = seed_values

    def load_raw(self, data_dir=None):
        return [Example(id=f"i{i}", input={"shift": i % 3}, target=[t + i % 3 for t in TARGETS]) for i in range(12)]

    def seed_candidate(self):
        if len(self.components) == 1:
            return {self.components[0]: "\n".join(f"k{j} = {v}" for j, v in enumerate(self.seed_values))}
        return {name: f"k = {v}" for name, v in zip(self.components, self.seed_values)}

    def values(self, candidate) -> list[int] | None:
        found = [int(m) for name in self.components for m in _VALUE.findall(candidate.get(name, ""))]
        return found if len(found) == len(TARGETS) else None

    def run(self, candidate, example, context=None):
        values = self.values(candidate)
        if values is None:
            return Verdict.failure(example.id, "expected four constants", "bad_output")
        closeness = [max(0.0, 1 - abs(v - t) / SCALE) for v, t in zip(values, example.target)]
        return Verdict(example.id, score=sum(closeness) / len(closeness))


INDEPENDENT = register(FourConstants("armstoy/independent", ("c0.txt", "c1.txt", "c2.txt", "c3.txt")))
SINGLE = register(FourConstants("armstoy/single", ("params.txt",)))
SOLVED = register(FourConstants("armstoy/solved", ("params.txt",), seed_values=TARGETS))


@pytest.fixture(scope="module", autouse=True)
def manifests(tmp_path_factory):
    root = tmp_path_factory.mktemp("manifests")
    for bench in (INDEPENDENT, SINGLE, SOLVED):
        examples = bench.load_raw()
        ids = [ex.id for ex in examples]
        freeze(bench.name, bench.version, bench.source, examples,
               {"default": {"train": ids[:4], "val": ids[4:8], "test": ids[8:]}}).save(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(MANIFEST_PATH_ENV, str(root))
        yield root


def compare(run_dir: Path, *extra: str, task: str = "armstoy/independent", budget: int = 160,
            width: int = 4, seeds: str = "0,1,2", capsys=None) -> tuple[int, str]:
    code = main(["compare", "arms", "--task", task, "--optimizer", "constant-search", "--budget", str(budget),
                 "--width", str(width), "--seeds", seeds, "--run-dir", str(run_dir), *extra])
    return code, capsys.readouterr().out if capsys else ""


SEEDS = "0,1,2,3,4,5,6"  # seven: the exact sign-flip reaches Holm's first step (0.05 / 3) at 2/128


@pytest.fixture(scope="module")
def independent(tmp_path_factory):
    # seven seeds: with the seed as the unit and any law of outcomes, fewer cannot separate after Holm
    run_dir = tmp_path_factory.mktemp("independent")
    assert main(["compare", "arms", "--task", "armstoy/independent", "--optimizer", "constant-search",
                 "--budget", "160", "--width", "4", "--seeds", SEEDS, "--run-dir", str(run_dir)]) == 0
    return run_dir


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single")
    assert main(["compare", "arms", "--task", "armstoy/single", "--optimizer", "constant-search",
                 "--budget", "160", "--width", "4", "--seeds", "0,1,2", "--run-dir", str(run_dir)]) == 0
    return run_dir


# -- the merge rule ---------------------------------------------------------------------------------
def test_the_union_takes_every_improving_edit_and_resolves_a_conflict_by_the_higher_score():
    parent = {"a": "1", "b": "1", "c": "1"}
    proposals = [{"a": "2", "b": "1", "c": "1"},   # edits a, scored 0.6
                 {"a": "3", "b": "2", "c": "1"},   # edits a (conflict) and b, scored 0.7
                 {"a": "1", "b": "1", "c": "5"},   # edits c but scored below the parent: not eligible
                 None]
    union = build_union(parent, proposals, [0.6, 0.7, 0.4, None], parent_score=0.5)
    assert union.parts == {"a": "3", "b": "2", "c": "1"}
    assert union.contributors == [1]
    assert [c["part"] for c in union.contested] == ["a"] and union.contested[0]["winner"] == 1
    tie = build_union(parent, proposals[:2], [0.7, 0.7], parent_score=0.5)
    assert tie.parts["a"] == "2"  # a tie goes to the lowest worker index
    agree = build_union(parent, [{"a": "2", "b": "1", "c": "1"}, {"a": "2", "b": "1", "c": "9"}], [0.6, 0.6], 0.5)
    assert agree.contested == [] and agree.parts == {"a": "2", "b": "1", "c": "9"} and agree.contributors == [0, 1]


def test_a_width_run_records_its_merges_in_the_ledger(tmp_path):
    session = Session("armstoy/independent", budget=60, run_dir=tmp_path, method="constant-search?width=3")
    record = session.run(resolve_optimizer("constant-search?width=3"))
    entries, _ = read_entries(tmp_path / "ledger.jsonl")
    kinds = [e["data"]["kind"] for e in entries if e["kind"] == "optimizer_event"]
    assert record.status == "ok" and record.usage["metric_calls"] == 60
    assert "merge_attempt" in kinds and "union_built" in kinds and "merge_round" in kinds
    union = next(e["data"]["data"] for e in entries if e["kind"] == "optimizer_event"
                 and e["data"]["kind"] == "union_built")
    assert union["parts_total"] == 4 and len(union["contributors"]) >= 2


# -- the two workloads ----------------------------------------------------------------------------------
def test_where_components_are_independent_merging_helps_and_the_report_says_so(independent):
    result = compare_arms(independent)
    assert result.broken == [] and result.flags == []
    assert result.conclusion.startswith("merging helped")
    rows = {r["arm"]: r for r in result.rows()}
    assert rows["merge-of-4"]["unions_accepted"] > 0 and rows["fork-of-4 (selected)"]["merge_rounds"] == 0
    # the oracle fork is never below the selected one, and is marked as not shippable
    assert rows["fork-of-4 (oracle)"]["median"] >= rows["fork-of-4 (selected)"]["median"]
    assert not rows["fork-of-4 (oracle)"]["shippable"]
    merge_vs_fork = result.comparisons[0]
    assert merge_vs_fork.label == "merge-of-4 vs fork-of-4 (selected)" and merge_vs_fork.sign == "+"
    # the three printed comparisons are one Holm family, paired by seed
    assert {c.family for c in result.comparisons} == {3} and all(c.paired for c in result.comparisons)
    assert merge_vs_fork.p_holm >= merge_vs_fork.p and merge_vs_fork.rule == "seed-paired-contrast"


def test_where_the_artifact_is_one_component_the_report_says_merging_is_only_selection(single):
    result = compare_arms(single)
    assert result.broken == []
    assert any("has one component: merging degenerates to selection" in f for f in result.flags)
    assert result.conclusion.startswith("merging cannot explain any difference here")
    rows = {r["arm"]: r for r in result.rows()}
    assert rows["merge-of-4"]["unions_built"] == 0 and rows["merge-of-4"]["contested"] > 0
    _, text = arms_table(single)
    assert "FLAG: merge-of-4: the artifact has one component" in text and "min" in text and "median" in text


# -- spend and plan -----------------------------------------------------------------------------------------
def ledger_metric_calls(run_dir: Path) -> int:
    entries, _ = read_entries(run_dir / "ledger.jsonl")
    return sum(e["data"]["cost"] for e in entries if e["kind"] == "evaluation")


def test_spend_accounting_is_exact_per_arm(independent):
    spec = ArmsSpec.from_dict(json.loads((independent / "arms.json").read_text())["spec"])
    plan = plan_arms(spec, independent)
    rows = {r["arm"]: r for r in compare_arms(independent).rows()}
    for arm, label in (("serial", "serial"), ("fork-of-4", "fork-of-4 (selected)"), ("merge-of-4", "merge-of-4")):
        runs = [r for r in plan if r.arm == arm]
        per_run = [ledger_metric_calls(r.run_dir) for r in runs]
        assert all(spent <= r.metric_calls for spent, r in zip(per_run, runs))
        records = [json.loads((r.run_dir / "run_record.json").read_text()) for r in runs]
        assert per_run == [rec["usage"]["metric_calls"] for rec in records]
        assert rows[label]["spent_metric_calls"] == sum(per_run) == len(SEEDS.split(",")) * 160
    assert {r.metric_calls for r in plan if r.arm == "fork-of-4"} == {40}


def test_plan_lists_exactly_the_runs_that_then_execute(tmp_path, capsys):
    run_dir = tmp_path / "arms"
    code, out = compare(run_dir, "--plan", budget=40, width=2, capsys=capsys)
    assert code == 0 and not run_dir.exists()  # nothing spent, nothing written
    planned = {line.split()[-1] for line in out.splitlines() if line.startswith("  ") and "seed-" in line}
    assert "total: 12 run(s), 360 metric_calls" in out  # 3 seeds x (1 serial + 2 forks + 1 merge) x B
    code, _ = compare(run_dir, budget=40, width=2, capsys=capsys)
    assert code == 0
    executed = {str(p.parent) for p in run_dir.rglob("run_record.json")}
    assert executed == planned and len(planned) == 12


def test_an_arm_that_cannot_spend_its_allowance_is_reported_as_stopped_not_broken(tmp_path, capsys):
    # B = 44 with 4 train examples per evaluation: each fork's 11 calls pay for two evaluations (its
    # minimum, 8), so the fork arm spends 32 of its 44 while serial and merge spend 44: the optimizer's
    # doing, at equal allowed budgets, so the comparison stands and says why the arm stopped
    code, out = compare(tmp_path / "arms", budget=44, width=4, capsys=capsys)
    assert code == 0, out
    assert "BROKEN" not in out
    assert ("stopped by itself: fork-of-4 stopped at 32 of 44 metric_calls at seed 0 (the largest arm spent 44): "
            "the 3 metric calls left cannot pay for one evaluation of 4 train examples") in out
    assert "conclusion: comparison broken" not in out


def test_a_run_whose_allowed_budget_is_not_the_planned_one_is_broken(tmp_path, capsys):
    run_dir = tmp_path / "arms"
    assert compare(run_dir, budget=40, width=2, capsys=capsys)[0] == 0
    record_path = next((run_dir / "arm-serial").rglob("run_record.json"))
    record = json.loads(record_path.read_text())
    record["budget"]["metric_calls"] = 80  # a harness that gave one arm more than the plan
    record_path.write_text(json.dumps(record))
    result = compare_arms(run_dir)
    assert any("allowed 80 metric_calls, the plan 40" in b for b in result.broken)
    assert result.conclusion.startswith("comparison broken")


def test_a_fixed_unit_no_arm_spends_is_broken_not_equal(tmp_path, capsys):
    code, out = compare(tmp_path / "arms", "--fixed", "architect_calls", "--metric-cap", "40", budget=8, width=2,
                        capsys=capsys)
    assert code == 1 and "no arm spent any architect_calls" in out


# -- separation and headroom ---------------------------------------------------------------------------------
def test_separation_needs_three_seeds_and_treats_seeds_as_the_unit():
    two = contrast([0.1, 0.2], [0.9, 0.95], n_examples=4)
    assert not two.decided and "a verdict needs >= 3" in two.sentence  # two seeds: refused
    three = contrast([0.1, 0.2, 0.15], [0.9, 0.91, 0.95], n_examples=4)  # any law: 3 seeds cannot decide
    assert not three.decided and ">= 6 seeds would" in three.sentence
    assert contrast([0.1, 0.2, 0.15] * 2, [0.9, 0.91, 0.95] * 2, n_examples=4).decided
    overlap = contrast([0.55, 0.65, 0.6], [0.5, 0.7, 0.6], n_examples=4)
    assert not overlap.decided and "cannot separate" in overlap.sentence


def test_disjoint_seed_ranges_alone_do_not_separate():
    # 3 vs 3 seeds with disjoint ranges happen with probability 0.1 under the null; the old rule
    # called them separated. Paired by seed, these differences (+0.01, +0.30, +0.12) are not
    # consistent enough for a paired t with 2 df
    a, b = [0.40, 0.20, 0.30], [0.41, 0.50, 0.42]
    assert min(b) > max(a)
    verdict = contrast(a, b, n_examples=50)
    assert not verdict.decided and verdict.p > 0.05


def test_plan_refuses_designs_that_cannot_conclude_before_spending(tmp_path, capsys):
    code = main(["compare", "arms", "--task", "armstoy/independent", "--optimizer", "constant-search",
                 "--budget", "40", "--width", "2", "--seeds", "0,1", "--run-dir", str(tmp_path / "a"), "--plan"])
    assert code == 2 and "need >= 3 seeds" in capsys.readouterr().err
    code = main(["compare", "arms", "--task", "armstoy/independent", "--optimizer", "no-such-optimizer",
                 "--budget", "40", "--width", "2", "--run-dir", str(tmp_path / "b"), "--plan"])
    assert code == 2 and "unknown optimizer" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_headroom_warns_when_the_seed_is_already_at_the_ceiling():
    config = StudyConfig(run_root="unused")
    solved = check_headroom(ArmsSpec("armstoy/solved", "constant-search", 40, 2, (0, 1, 2)), config)
    assert solved.split == "val" and solved.little and "WARNING: little room" in solved.describe()
    open_task = check_headroom(ArmsSpec("armstoy/independent", "constant-search", 40, 2, (0, 1, 2)), config)
    assert not open_task.little


def test_bad_arms_input_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(ArmsError, match="--width must be an int >= 2"):
        ArmsSpec("armstoy/independent", "constant-search", 40, 1, (0,))
    with pytest.raises(ArmsError, match="needs --metric-cap"):
        ArmsSpec("armstoy/independent", "constant-search", 40, 2, (0,), fixed="tokens")
    code = main(["compare", "arms", "--task", "armstoy/independent", "--optimizer", "seed", "--budget", "8",
                 "--width", "2", "--seeds", "0", "--run-dir", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "takes no option width" in err


def test_a_run_dir_holds_one_arms_experiment(independent, capsys):
    code = main(["compare", "arms", "--task", "armstoy/independent", "--optimizer", "constant-search",
                 "--budget", "80", "--width", "4", "--seeds", SEEDS, "--run-dir", str(independent), "--plan"])
    assert code == 2 and "holds another arms experiment" in capsys.readouterr().err


# -- a prompt task end to end: the loopback test server as worker and architect ----------------------
def test_prompt_task_arms_with_architect_calls_fixed_print_the_metric_call_confound(data_dir, tmp_path, capsys):
    from heldout.models.testserver import TestServer

    run_dir = tmp_path / "arms"
    with TestServer() as server:
        code = main(["compare", "arms", "--task", "bbh/word_sorting",
                     "--optimizer", "reflective", "--budget", "4", "--width", "2", "--seeds", "0,1,2",
                     "--fixed", "architect_calls", "--metric-cap", "200", "--worker-model", "test-worker",
                     "--architect-model", "test-architect", "--base-url", server.base_url,
                     "--data-dir", str(data_dir), "--run-dir", str(run_dir)])
    out = capsys.readouterr().out
    result = compare_arms(run_dir)
    rows = {r["arm"]: r for r in result.rows()}
    # the sessions enforce the fixed unit: 4 architect calls per seed in every arm (2 per fork)
    assert code == 0 and result.broken == [], out
    assert rows["serial"]["spent_architect_calls"] == rows["merge-of-2"]["spent_architect_calls"] == 12
    assert rows["fork-of-2 (selected)"]["spent_architect_calls"] == 12
    assert "confound: merge-of-2 spent" in out and "metric calls vs fork-of-2" in out
    assert "the selected fork is the best on val" in out
    assert "headroom: the seed scores" in out and " on val " in out
    # one instruction component: the merge arm is flagged, not credited
    assert any("has one component" in f for f in result.flags)


def test_lockpicking_search_merges_edge_moves_per_target_position(tmp_path):
    session = Session("lockpicking/six", budget=300, run_dir=tmp_path, method="lockpicking-search?width=3")
    record = session.run(resolve_optimizer("lockpicking-search?width=3"))
    entries, _ = read_entries(tmp_path / "ledger.jsonl")
    events = [e["data"] for e in entries if e["kind"] == "optimizer_event"]
    assert record.status == "ok" and record.usage["metric_calls"] == 300
    attempt = next(e["data"] for e in events if e["kind"] == "merge_attempt")
    assert attempt["workers"] == 3 and len(attempt["edits"]) == 3
    # the rule table is six parts (one per target position), each worker's move edits one of them
    assert all(len(parts) == 1 for parts in attempt["edits"].values())
    assert next(e["data"] for e in events if e["kind"] == "merge_round")["parts_total"] == 6


def test_a_report_on_an_arms_run_dir_shows_the_arms_table(single, tmp_path):
    """`heldout report` on a compare-arms run dir: the arms table (every arm, the fork twice, the
    seed-paired verdicts and the conclusion) leads the report, beside the ordinary tables where
    the fork's branches are a task of their own (they spend budget / width each)."""
    assert main(["report", str(single), "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.index("## Arms: armstoy/single") < md.index("## Table 1")
    result = compare_arms(single)
    table = json.loads((tmp_path / "report" / "results.json").read_text())
    arms = table["tables"]["arms"]
    assert [r[0] for r in arms["rows"]] == [r["arm"] for r in result.rows()] + [c.label for c in result.comparisons]
    assert arms["data"][0]["conclusion"] == result.conclusion and f"conclusion: {result.conclusion}" in arms["notes"]
    assert "budget / width" not in md and "160 / 4 each" in md
