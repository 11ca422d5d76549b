"""Held-out scoring: the final candidate scored by the harness once the optimizer has returned,
outside its budget, and what the session's end must record of it.

* :meth:`HeldoutScoring.score` (on the session's task with its test split back:
  :meth:`~heldout.benchmarks.loading.Task.restored`) scores val and test with the canonical
  verifier and the experiment's own options (the deployment scorer), in chunks. Each chunk's
  verdicts reach the ledger as one batch before the next chunk is scored: after an interruption,
  an infrastructure failure or a kill the ledger keeps what was scored, and a resumed session
  scores only the examples still missing. Under a verifier variant, val is scored once more as
  the optimizer's own verifier shows it; then the benchmark's extra test metrics.
* What it returns (:class:`HeldoutScores`) holds the entries the session writes with its
  ``session_end`` in one batch: the own-verifier verdicts and the test metrics, which no resume
  reads back (they are scored again), so they need no write of their own.

An example that the infrastructure failed to score raises :class:`InfrastructureFailure`, never
a verdict that scores it 0."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

from heldout.benchmarks.loading import Task
from heldout.benchmarks.verifiers import CANONICAL, Variant
from heldout.contracts import (Candidate, Example, InfrastructureFailure, Verdict, candidate_id,
                               is_infrastructure_failure)
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.policy import Usage
from heldout.evaluators.scoring import Arrivals, InOrder, Scorer, infrastructure_failures
from heldout.models import DEPLOYMENT


TEST_ENTRY_KINDS = frozenset({"test_scoring", "test_metrics"})
"""The ledger entries that hold test results: a resumed session keeps them on disk, not in memory
(:meth:`Ledger.open`'s ``on_disk``), while its optimizer runs again."""


@dataclass
class HeldoutScores:
    """The final candidate's held-out verdicts, and the ledger entries its session's end writes
    together with ``session_end`` (see the module docstring)."""

    val: list[Verdict] = field(default_factory=list)
    test: list[Verdict] = field(default_factory=list)
    val_score_own_verifier: float | None = None
    test_metrics: dict[str, float] = field(default_factory=dict)
    end_entries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


@dataclass
class HeldoutScoring:
    """How a session scores its final candidate: ``deploy_scorer`` (the canonical verifier, the
    experiment's options, the deployment worker) for val and test; ``scorer`` under ``variant`` for
    the optimizer's own view of val; ``interruptible`` around each wait on scoring (a stop may
    interrupt it: no ledger write happens there); ``progress`` after each chunk (split, examples
    scored, of total, infrastructure failures so far)."""

    scorer: Scorer
    deploy_scorer: Scorer
    variant: Variant
    ledger: Ledger
    seed: int = 0
    interruptible: Callable[[], ContextManager[Any]] = contextlib.nullcontext
    progress: Callable[[str, int, int, int], None] | None = None

    def score(self, task: Task, final: Candidate, usage: Usage) -> HeldoutScores:
        """``final`` (checked) scored on ``task``'s val and test, the canonical verdicts written
        chunk by chunk behind a ``final_candidate`` entry; then, under a verifier variant, val as
        the optimizer's own verifier shows it (what it optimised; the verifier ablation's "validation
        gain"; the val score itself under the canonical verifier, so not scored again); then the
        benchmark's extra test metrics."""
        cid = candidate_id(final)
        self.ledger.append_entry("final_candidate", {"candidate_id": cid, "components": dict(final)})
        canonical = {split: self._score_canonical(final, cid, split, task.splits.get(split, []), usage)
                     for split in ("val", "test")}
        scores = HeldoutScores(val=canonical["val"], test=canonical["test"])
        val = task.splits.get("val", [])
        if not self.variant.canonical and val:
            with self.interruptible():
                scorings = [self.scorer.score_all(final, val, DEPLOYMENT, usage, "val (own verifier)",
                                                  self.variant.options, r)
                            for r in range(self.variant.repeats)]
            shown = [self.variant.show([s[k] for s in scorings], ex, seed=self.seed, candidate_id=cid)
                     for k, ex in enumerate(val)]
            scores.end_entries += [("val_scoring_own_verifier", {"candidate_id": cid, "example_id": ex.id,
                                                                 "verifier": self.variant.name, "verdict": v.to_dict()})
                                   for ex, v in zip(val, shown)]
            scores.val_score_own_verifier = task.benchmark.aggregate(shown)
        if scores.test:
            scores.test_metrics = task.benchmark.extra_metrics(final, scores.test,
                                                               self.deploy_scorer.context(DEPLOYMENT, usage))
            if scores.test_metrics:
                scores.end_entries.append(("test_metrics", {"candidate_id": cid, "metrics": scores.test_metrics}))
        return scores

    def _score_canonical(self, final: Candidate, cid: str, split: str, examples: list[Example],
                         usage: Usage) -> list[Verdict]:
        """What the ledger already holds for this candidate (scored before an interruption or an
        infrastructure failure; the harness's own entries of the same experiment, in a chain
        :meth:`Ledger.open` checked) is kept; only the examples still missing are scored, in
        chunks, each chunk's entries one ledger batch, with progress after each."""
        recorded = recorded_verdicts(self.ledger, split, cid)
        todo = [ex for ex in examples if ex.id not in recorded]
        done, failed = len(examples) - len(todo), []
        step = progress_chunk(len(todo), self.deploy_scorer)
        for start in range(0, len(todo), step):
            chunk = todo[start:start + step]
            scored: dict[str, Verdict] = {}

            def record(k: int, verdict: Verdict, chunk: list[Example] = chunk, scored: dict = scored) -> None:
                self.ledger.append_entry(f"{split}_scoring", {"candidate_id": cid, "example_id": chunk[k].id,
                                                             "verifier": CANONICAL, "verdict": verdict.to_dict()})
                scored[chunk[k].id] = verdict
            # the chunk's entries, each added as it is scored (in order, outside the interruptible waits),
            # in one write, fsync and head made durable behind the next chunk's requests: nothing is
            # returned before session_end's flush, which waits for them
            in_order = InOrder(len(chunk), record)
            with self.ledger.batch(wait=False):
                verdicts = self.deploy_scorer.score_retrying(final, chunk, DEPLOYMENT, usage,
                                                             arrivals=Arrivals(self.interruptible, in_order.scored))
                in_order.finish(verdicts)
            failed += [v for v in verdicts if is_infrastructure_failure(v)]
            recorded.update(scored)
            done += len(chunk)
            if self.progress is not None:
                self.progress(split, done, len(examples), len(failed))
        if failed:
            raise InfrastructureFailure(infrastructure_failures(
                split, failed + [recorded[ex.id] for ex in examples if ex.id in recorded]) or "")
        return [recorded[ex.id] for ex in examples]


def recorded_verdicts(ledger: Ledger, split: str, cid: str) -> dict[str, Verdict]:
    """Example id -> the canonical verdict ``ledger`` holds for candidate ``cid`` on ``split``; an
    infrastructure failure is no verdict (a ledger written before that rule may hold some)."""
    recorded: dict[str, Verdict] = {}
    for entry in ledger.entries(f"{split}_scoring"):
        data = entry["data"]
        if data["candidate_id"] == cid and data.get("verifier") == CANONICAL:
            verdict = Verdict.from_dict(data["verdict"])
            if not is_infrastructure_failure(verdict):
                recorded[data["example_id"]] = verdict
    return recorded


def progress_chunk(count: int, scorer: Scorer) -> int:
    """How many held-out examples are scored between two progress reports: about 25 reports a
    split, but never fewer in a chunk than twice the calls the worker keeps in flight (a chunk
    waits for its slowest call, so a smaller one would leave the endpoint idle)."""
    in_flight = max(1, int(getattr(scorer.worker, "concurrency", 0) or 0), scorer.jobs)
    return max(1, 2 * in_flight, math.ceil(count / 25))
