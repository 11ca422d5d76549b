"""A synthetic study of any size written through the real :class:`Ledger` and :class:`RunRecord`
(hash-chained ledgers, anchored records), with its ground truth, for the results store's tests
and perf. No optimizer runs: each cell's scores are drawn from a seeded generator."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from heldout.contracts import candidate_id
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.records import FORMAT_VERSION, RunRecord
from heldout.protocols.run import Cell, Method

POLICY = {"name": "standard", "train": ["score"], "val": ["score"], "test": []}
LIMITS = {"wall_seconds": 30.0, "cpu_seconds": 30.0, "memory_mb": 512}


@dataclass(frozen=True)
class SyntheticRun:
    """What was written for one cell: the truth the store's numbers are checked against."""

    task: str
    method: str
    seed: int
    status: str
    test_scores: dict[str, float]
    metric_calls: int
    run_dir: Path

    @property
    def test_score(self) -> float | None:
        return sum(self.test_scores.values()) / len(self.test_scores) if self.test_scores else None


def grid(n_tasks: int, n_methods: int, n_seeds: int) -> list[tuple[str, str, int]]:
    return [(f"synthetic/task{t:03d}", f"method{m:02d}", s)
            for t in range(n_tasks) for m in range(n_methods) for s in range(n_seeds)]


def write_run(root: Path, task: str, method: str, seed: int, *, n_test: int = 3, budget: int = 40,
              failed: bool = False) -> SyntheticRun:
    """One finished session: start, a candidate, one train evaluation, the final candidate, its
    held-out scoring and the end, then the record anchored to the ledger's head."""
    rng = random.Random(f"{task}|{method}|{seed}")
    run_dir = Cell(task, Method(method), seed, budget).run_dir(root)
    ledger = Ledger.open(run_dir)
    header = {"task": task, "profile": "default", "seed": seed, "method": method,
              "budget": {"metric_calls": budget, "architect_tokens": None, "wall_seconds": None},
              "policy": POLICY, "limits": LIMITS, "options": {}, "drift": None}
    ledger.append_entry("session_start", header)
    candidate = {"instruction": f"{method} seed {seed} {rng.random():.6f}"}
    cid = candidate_id(candidate)
    ledger.append_entry("candidate", {"candidate_id": cid, "components": candidate, "parent": None})
    calls = rng.randint(1, budget)
    ledger.append_entry("evaluation", {"candidate_id": cid, "example_id": "train-0", "split": "train", "cost": 1,
                                       "metric_calls": calls, "cached": False,
                                       "verdict": {"example_id": "train-0", "score": rng.random(), "valid": True}})
    test_verdicts: list[dict] = []
    if not failed:
        ledger.append_entry("final_candidate", {"candidate_id": cid, "components": candidate})
        for k in range(n_test):
            verdict = {"example_id": f"test-{k}", "score": round(rng.random(), 6), "valid": True,
                       "dimensions": {}, "feedback": "", "error": None, "error_kind": None}
            ledger.append_entry("test_scoring", {"candidate_id": cid, "example_id": verdict["example_id"],
                                                 "verdict": verdict, "verifier": "decomposed"})
            test_verdicts.append(verdict)
    scores = {v["example_id"]: v["score"] for v in test_verdicts}
    status = "failed" if failed else "ok"
    truth = SyntheticRun(task, method, seed, status, scores, calls, run_dir)
    record = RunRecord(**header, status=status, final_candidate=None if failed else candidate,
                       final_candidate_id=None if failed else cid, test_verdicts=test_verdicts,
                       val_verdicts=[], test_score=truth.test_score, val_score=None,
                       usage={"metric_calls": calls, "metric_call_budget": budget}, trajectory=[],
                       lineage=[], error="optimizer crashed" if failed else None,
                       format_version=FORMAT_VERSION, experiment=dict(header))
    # anchored as a session anchors it: the record's digest in session_end, then the head
    ledger.append_entry("session_end", {"status": status, "metric_calls": calls, "test_score": truth.test_score,
                                        "record_sha256": record.digest()})
    record.ledger_head, record.ledger_entries = ledger.head, len(ledger)
    record.sign(ledger.signing_key)
    ledger.close()
    record.save(run_dir)
    return truth


def write_study(root: Path, n_tasks: int, n_methods: int, n_seeds: int, *, failed_every: int = 0,
                n_test: int = 3) -> list[SyntheticRun]:
    """``n_tasks * n_methods * n_seeds`` runs under ``root``; every ``failed_every``-th one failed."""
    return [write_run(root, task, method, seed, n_test=n_test,
                      failed=bool(failed_every) and k % failed_every == failed_every - 1)
            for k, (task, method, seed) in enumerate(grid(n_tasks, n_methods, n_seeds))]
