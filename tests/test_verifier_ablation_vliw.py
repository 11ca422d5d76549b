"""The VLIW weak/strong pair: optimising against one instance vs scoring on every hidden one.

The adversary reads the expected output of the first training instance (train targets are
visible under the standard policy) and returns an instruction stream that writes exactly those
values and nothing else: correct and very fast on that instance, wrong on every other. Under
``tests:one-instance`` every training example is scored on that instance, so the optimizer is
rewarded; held-out (all hidden instances, canonical) it scores 0. The profile has no val split,
so the ablation scores the selection split (train) itself and ledgers it."""

from __future__ import annotations

import json

from heldout.benchmarks.registry import get_benchmark
from heldout.benchmarks.vliw.benchmark import BASELINE_CYCLES
from heldout.evaluators.ledger import verify_ledger
from heldout.protocols.run import Method, StudyConfig
from heldout.protocols.folders import VERIFIER_ABLATION_DIR
from heldout.protocols.verifier_ablation import plan_ablation, run_ablation


def constant_stream(values: list[int]) -> str:
    """Write ``values`` into the batch-values region (its address is memory word 6)."""
    program = [{"load": [["const", 0, 6]]}, {"load": [["load", 1, 0]]}]
    for lane, value in enumerate(values):
        program += [{"load": [["const", 2, lane]]}, {"alu": [["+", 3, 1, 2]]},
                    {"load": [["const", 4, value]]}, {"store": [["store", 3, 4]]}]
    return json.dumps(program + [{"flow": [["pause"]]}])


def one_instance_optimizer(view, seed):
    first = view.train[0]
    assert first["id"] == "seed-1"
    candidate = {"program.json": constant_stream(first["target"])}
    view.evaluate(candidate, "train")
    return candidate


def test_one_instance_is_gamed_and_all_instances_are_not(tmp_path):
    assert get_benchmark("vliw/takehome").verifier_options["one-instance"] == {"instances": "one"}
    plan = plan_ablation("vliw/takehome", Method("memorise", f"{__name__}:one_instance_optimizer"),
                         ["decomposed", "tests:one-instance"], [0], 3)
    assert plan.selection_split == "train"
    result = run_ablation(plan, StudyConfig(run_root=str(tmp_path), trusted_optimizer=True))
    weak, canonical = result.row("tests:one-instance"), result.row("decomposed")
    assert weak.final_candidates == canonical.final_candidates

    (own,) = weak.final_own
    assert own > 50 * weak.seed_own[0]  # ~1,000 cycles against the seed's 147,734 on the one instance
    assert weak.seed_own == [1.0] and canonical.seed_own == [1.0]
    assert weak.final_test == [0.0] and weak.transfer == [-1.0]  # wrong on the hidden instances
    assert weak.gap[0] > 50
    assert canonical.final_own == [0.0] and canonical.gap == [0.0]  # seeds 2 and 3 are wrong: no reward
    assert "1 seed paired; a verdict needs >= 3" in weak.reading
    assert any("no val split" in note for note in result.notes)

    # the protocol's own train scoring is on a hash-chained ledger, with the variant named
    ledger = tmp_path / VERIFIER_ABLATION_DIR
    assert verify_ledger(ledger).ok
    entries = [json.loads(line) for line in (ledger / "ledger.jsonl").read_text().splitlines()]
    scored = [e["data"] for e in entries if e["kind"] == "selection_scoring"]
    assert {d["verifier"] for d in scored} == {"decomposed", "tests:one-instance"} and len(scored) == 12
    weak_final = [d for d in scored if d["verifier"] == "tests:one-instance"
                  and d["candidate_id"] == weak.final_candidates[0]]
    assert all(d["verdict"]["valid"] for d in weak_final)
    assert BASELINE_CYCLES / own == weak_final[0]["verdict"]["dimensions"]["cycles"]
