"""The seed's noise floor, end to end: a method that makes one meaningless edit is not read as a gain.

On the loopback server the answers to BBH navigate's yes/no items are re-drawn by any change of
wording, as a real worker's prompt-sensitive items are. A planted optimizer that returns the seed
with one random neutral edit, never reading a score, ran through `heldout protocol
generalisation` at 3, 5 and 10 seeds: no verdict of the protocol may be decided (the held-out and
validation gains, the gap, the ablation's held-out row), while the placebo draws show
the worker does move with wording. The placebo draws themselves spend nothing and say what they
edited.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from heldout import cli
from heldout.evaluators.ledger import read_entries
from heldout.models.testserver import TestServer
from heldout.optimizers.placebo import placebo_candidate
from heldout.protocols.placebo import STRIDE, draws_for, placebo_seeds
from heldout.reports.check import check_runs

TASK, PROFILE = "bbh/navigate", "default"
EDITS = ("Note: the task follows.", "Kindly complete the task.", "Below is what to do.", "Thanks in advance.",
         "Here is the request.", "Attend to the instructions.")


def neutral_edit(view, seed):
    """The adversary of the issue: one random neutral edit of the seed, no score read. Each seed's
    edit is its own (a reference number drawn beside the phrase): a handful of fixed edits would be
    a method with its own fixed scores, which enough seeds tell apart from re-wording in general."""
    rng = random.Random(f"planted:{seed}")
    candidate = dict(view.seed_candidate)
    name = sorted(candidate)[0]
    edit = f"{rng.choice(EDITS)} (ref. {rng.randrange(10**6)})"
    candidate[name] = f"{edit} {candidate[name]}" if rng.random() < 0.5 else f"{candidate[name]} {edit}"
    return candidate


@pytest.fixture(scope="module")
def server():
    with TestServer(seed=0) as srv:
        yield srv


def test_placebo_draws_are_neutral_edits_drawn_from_the_seed_number():
    seed = {"instruction": "Answer the question. Give the answer at the end.\n\nThink about the question."}
    draws = [placebo_candidate(seed, s) for s in placebo_seeds([0, 1], 7)]
    assert all(candidate != seed and edits for candidate, edits in draws)
    assert draws == [placebo_candidate(seed, s) for s in placebo_seeds([0, 1], 7)]  # a pure function of the seed
    assert len({json.dumps(c, sort_keys=True) for c, _ in draws}) > 7  # fresh draws, not one repeated
    assert placebo_seeds([2], 3) == [2 * STRIDE, 2 * STRIDE + 1, 2 * STRIDE + 2]
    assert [draws_for(n, family=3) for n in (3, 5, 10)] == [7, 3, 1]


@pytest.mark.parametrize("seeds", [3, 5, 10])
def test_one_meaningless_edit_gets_no_decided_verdict(server, data_dir, tmp_path, monkeypatch, seeds):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    run_dir = tmp_path / "planted"
    code = cli.main(["-q", "protocol", "generalisation", "--task", TASK, "--profile", PROFILE, "--allow-topic-shared",
                     "--optimizer", "neutral=test_placebo_floor:neutral_edit", "--trusted-optimizer",
                     "--seeds", ",".join(map(str, range(seeds))), "--budget", "1", "--run-dir", str(run_dir),
                     "--worker-model", "test-model", "--base-url", server.base_url, "--data-dir", str(data_dir)])
    assert code == 0
    result = json.loads((run_dir / "report" / "generalisation.json").read_text())
    comparison = result["comparison"]
    verdicts = [comparison[k] for k in ("heldout", "validation", "gap")]
    assert all(v["rule"] == "placebo-floor" and not v["decided"] for v in verdicts), [v["sentence"] for v in verdicts]
    # the topic-shared ablation's held-out row is the same question on the same floor
    rows = {r["subset"]: r for r in result["ablation"]["methods"][0]["rows"]}
    assert not rows["test"]["separable"], rows["test"]["seed_contrast"]["sentence"]
    # the worker does move with wording: the floor is not a constant
    floors = [g["floor_test"] for g in comparison["per_seed"]]
    placebo_tests = [json.loads(p.read_text())["test_score"]
                     for p in (run_dir / "runs").glob("*/placebo/seed-*/run_record.json")]
    assert len(placebo_tests) == seeds * draws_for(seeds, family=3) and len(set(placebo_tests)) > 1, floors
    # a placebo draw reads no score, spends nothing and says what it edited
    record = next((run_dir / "runs").glob("*/placebo/seed-*/run_record.json"))
    assert json.loads(record.read_text())["usage"]["metric_calls"] == 0
    entries, _ = read_entries(record.parent / "ledger.jsonl")
    edits = [e["data"] for e in entries if e.get("kind") == "optimizer_event" and e["data"].get("kind") == "placebo"]
    assert edits and json.dumps(edits[0]).count("opening") + json.dumps(edits[0]).count("closing") \
        + json.dumps(edits[0]).count("synonym") + json.dumps(edits[0]).count("spacing") >= 1, edits
    assert "beyond the seed's re-wording noise" not in json.dumps(result["reading"])  # nothing was decided
    print(f"\n{seeds} seeds: " + "; ".join(v["sentence"].split("(")[0] + f"p_holm {v['p_holm']:.3g}" for v in verdicts),
          file=sys.stderr)


def test_check_reads_a_fixed_seed_side_against_its_placebo_runs_or_decides_nothing(server, data_dir, tmp_path,
                                                                                    monkeypatch):
    # `heldout check` with the seed candidate on one side: six seeds of it are one score repeated.
    # Against the meaningless edit, that one draw of the seed's wording luck would be read as the
    # baseline's true level; the gate must either stand placebo runs in for it or decide nothing.
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    root, floor_root = tmp_path / "gate", tmp_path / "floor"
    common = ["--task", TASK, "--profile", PROFILE, "--seeds", "0,1,2,3,4,5", "--budget", "1",
              "--worker-model", "test-model", "--base-url", server.base_url, "--data-dir", str(data_dir)]
    assert cli.main(["-q", "run", "--optimizer", "seed", "--optimizer", "neutral=test_placebo_floor:neutral_edit",
                     "--trusted-optimizer", "--run-dir", str(root), *common]) == 0
    task_dir = root / TASK.replace("/", "__")
    alone = check_runs([task_dir / "seed"], [task_dir / "neutral"])
    decision = alone.gate.tasks[0]
    assert alone.outcome == "inconclusive" and "the seeds replicate nothing" in decision.reason, decision.reason

    assert cli.main(["-q", "run", "--optimizer", "placebo", "--run-dir", str(floor_root), *common]) == 0
    floored = check_runs([task_dir / "seed", floor_root / TASK.replace("/", "__") / "placebo"], [task_dir / "neutral"])
    decision = floored.gate.tasks[0]
    assert decision.comparison.test == "exact permutation" and decision.comparison.n_base == 6
    assert any("6 placebo run(s)" in s and "placebo-floor" in s for s in floored.statements), floored.statements
    assert floored.outcome != "regression", floored.gate.evidence
    # the placebo runs are the floor, not a method: they never make the side "several methods"
    assert floored.per_task[0]["baseline_seeds"] == list(range(6))
