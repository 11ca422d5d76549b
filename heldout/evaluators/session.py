"""Sessions: the one choke point through which an optimizer touches a task.

* :class:`Session` owns the budget, the ledger, the visibility policy and the test split.
* :class:`~heldout.evaluators.evaluation.EvaluationService` (:mod:`.evaluation`) evaluates
  candidates on train/val examples only (it never holds test examples), counts every metric call
  before anything runs, and appends every result to the ledger before returning it.
* :class:`~heldout.evaluators.view.SessionView` (:mod:`.view`) is the only thing an optimizer gets
  (the in-process :class:`heldout.contracts.TaskView`): it wraps the service and filters verdicts
  through the visibility policy.

Test examples are not in the session while its optimizer runs: a session made from a task name
holds the task without its test split (:meth:`Task.without`: the sizes, not the examples) and
loads the test split again, verified against the manifest, only when it scores the final
candidate. So nothing reachable from the view, from what refers to it (``gc.get_referrers``, the
frames above the optimizer) or anywhere in the process (``gc.get_objects``) holds a test example
during optimisation. (A session handed a loaded :class:`Task` keeps it for the final scoring: its
caller holds that object anyway. A trusted in-process optimizer can still load the data itself:
trust, not containment, and the record says so.)

What a session may spend and show is in :mod:`.policy` (Budget, VisibilityPolicy); how a
candidate is scored, and metered, in :mod:`.scoring` (Scorer, Usage).

A metric call is one worker call, or one program execution, on one example. Cache hits count
as metric calls (so arms stay comparable) but cost no endpoint call. An evaluation that would
exceed the budget is refused before anything runs: overshoot is impossible.

Resuming: a session re-opened on an existing run dir reads its ledger. Budget already spent stays
spent; evaluations the optimizer asks for again (a deterministic optimizer restarted with the same
seed replays its requests) are served from the recorded results in order, without spending again.
While it replays, the view reports the budget as it was at that point of the original run (the
``remaining`` of the recorded request), so an optimizer that plans with ``remaining`` makes the
same plan as in an uninterrupted run and ends with the same final candidate. Architect calls are
replayed the same way (the recorded reply for the same request, in order, tokens not counted
twice). A ledger started by a different experiment is refused (:class:`ExperimentMismatch`).

Errors are not scores (:data:`heldout.contracts.INFRASTRUCTURE_ERROR_KINDS`): an example whose
verdict is a failure of the infrastructure (endpoint, sandbox) is scored once more, and if it still
fails the session stops. During optimisation the failed examples get no ledger entry (their metric
calls are refunded: a resumed session does not count them, and re-runs them when asked), an
``infrastructure_failure`` entry says which, and the optimizer gets :class:`InfrastructureFailure`.
During held-out scoring the examples scored so far stay in the ledger. Either way the session ends
with a ``session_incomplete`` entry, no ``session_end`` and no run record, so ``--resume`` replays
the optimizer and scores exactly the held-out examples still missing.
"""

from __future__ import annotations

import json
import math
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn

from heldout.benchmarks.loading import Task, load_task
from heldout.benchmarks.verifiers import CANONICAL, parse_verifier
from heldout.contracts import (Candidate, HeldoutError, InfrastructureFailure, MalformedCandidate, MetricSpec, Optimizer,
                               Verdict, candidate_id, check_candidate, is_infrastructure_failure)
from heldout.evaluators.ledger import Ledger, LedgerError
from heldout.evaluators.policy import POLICIES, STANDARD_POLICY, Budget, VisibilityPolicy
from heldout.evaluators.records import (RECORD_FILE, ExperimentMismatch, RunRecord, check_same_experiment,
                                        describe_experiment)
from heldout.evaluators.scoring import (DEPLOYMENT, Decoding, Execution, Scorer, SessionModels, Usage,
                                        infrastructure_failures)
from heldout.evaluators.evaluation import EvaluationService
from heldout.evaluators.view import MeteredArchitect, SessionView

class Session:
    """One optimizer run on one task with one seed. See the module docstring."""

    def __init__(self, task: Task | str, profile: str = "default", budget: Budget | int = 100,
                 seed: int = 0, run_dir: str | Path = "runs/session", *, models: SessionModels = SessionModels(),
                 policy: VisibilityPolicy | str = STANDARD_POLICY, verifier: str = CANONICAL,
                 data_dir: str | None = None, allow_drift: bool = False, method: str = "unnamed",
                 options: Mapping[str, Any] | None = None, execution: Execution = Execution(),
                 provenance: Mapping[str, Any] | None = None) -> None:
        """``task`` is a task name (loaded with ``profile``, ``data_dir``, ``allow_drift``) or a
        loaded :class:`Task`; ``models`` the chat clients it talks to (:class:`SessionModels`);
        ``options`` the experiment's options as a study states them: task options, and the models'
        :class:`~heldout.evaluators.scoring.Decoding` (``temperature``, ``max_tokens``, ``judge_*``),
        which scoring keeps apart; ``execution`` the sandbox limits and jobs;
        ``provenance`` fields the record keeps (the optimizer's code hash, ...)."""
        if not isinstance(models, SessionModels):  # e.g. a bare client: name the fix, not an AttributeError later
            raise HeldoutError(f"models must be SessionModels(worker=..., architect=...), got {type(models).__name__}")
        loaded = task if isinstance(task, Task) else load_task(task, profile, data_dir, allow_drift)
        # the test split is held back until the final candidate is scored (see the module docstring)
        self._heldout_source: Task | tuple[str, str, str | None, bool] = (
            task if isinstance(task, Task) else (task, profile, data_dir, allow_drift))
        self.task = loaded.without("test")
        del loaded
        self.budget = budget if isinstance(budget, Budget) else Budget(metric_calls=int(budget))
        self.policy = POLICIES[policy] if isinstance(policy, str) else policy
        self.seed = seed
        self.method = method
        self.run_dir = Path(run_dir)
        self.options = dict(options or {})  # as the study states them: task options and the models' decoding
        Decoding.split(self.options)  # a bad decoding is refused here, before the ledger is opened
        self.provenance = dict(provenance or {})  # e.g. the optimizer's code hash (see records)
        self.models = models
        self.ledger = Ledger.open(self.run_dir)
        bench = self.task.benchmark
        self.variant = parse_verifier(verifier, bench.verifier_options, bench.score_ceiling)
        if "prompt_format" in self.options:  # a wrong name is a clear error now, not one per example later
            check = getattr(bench, "check_prompt_format", None)
            if check is None:
                raise HeldoutError(f"{bench.name} has no prompt formats")
            check(self.options["prompt_format"])
        self._started = time.time()
        self.scorer = Scorer(bench, models.worker, execution.limits, self.options, execution.jobs, self.ledger,
                             models.judge)
        # held-out scoring: the canonical verifier, the experiment's own options, never a variant's
        self.deploy_scorer = Scorer(bench, models.deployment_worker or models.worker, execution.limits, self.options,
                                    execution.jobs, self.ledger, models.judge)
        visible = {s: self.task.splits.get(s, []) for s in ("train", "val")}
        self.service = EvaluationService(visible, self.scorer, self.ledger, self.budget, self.policy,
                                         self._started, self.variant, seed)
        self.resumed = len(self.ledger) > 0
        header = self.header()
        if not self.resumed:
            self.ledger.append("session_start", header)
        else:
            self._check_resumable(header)
            self.ledger.append("session_resumed", {"metric_calls_spent": self.service.usage.metric_calls,
                                                   "environment": header["environment"]})
        self.view = SessionView(bench.name, bench.description, bench.kind, bench.seed_candidate(),
                             visible["train"], visible["val"], self.service,
                             MeteredArchitect(models.architect, self.service),
                             MetricSpec.of(getattr(bench, "metric", "score")))
        # (split, examples scored, of total, infrastructure failures so far) during held-out scoring
        self.heldout_progress: Callable[[str, int, int, int], None] | None = None

    def header(self) -> dict[str, Any]:
        """The full description of this session's experiment (see :mod:`heldout.evaluators.records`)."""
        return describe_experiment(self)

    def _check_resumable(self, header: dict[str, Any]) -> None:
        """One run dir = one experiment: refuse a finished session and a ledger another
        experiment started (nothing is appended or overwritten)."""
        try:
            start = next((e["data"] for e in self.ledger.entries("session_start")), None)
            check_same_experiment(start, header, self.run_dir)
            if next(self.ledger.entries("session_end"), None) is not None:
                raise ExperimentMismatch(f"{self.run_dir} holds a finished session (its ledger has a session_end "
                                         "entry); nothing to resume, use a new run dir")
        except ExperimentMismatch:
            self.ledger.close()
            raise

    # -- the harness ----------------------------------------------------------------------------
    def run(self, optimizer: Optimizer) -> RunRecord:
        """Call the optimizer, then score its final candidate once on test (and val), outside the
        budget, and write the run record. A crashing optimizer gives a ``failed`` record; a
        session stopped by its infrastructure raises :class:`InfrastructureFailure` (no record)."""
        try:
            final = check_candidate(optimizer(self.view, self.seed))
        except Exception as exc:
            if self.service.stopped is not None or isinstance(exc, LedgerError):
                self.end_incomplete("optimisation", self.service.stopped or str(exc))
            kind = "malformed_candidate" if isinstance(exc, MalformedCandidate) else type(exc).__name__
            self.ledger.append("optimizer_failed", {"error": f"{kind}: {exc}",
                                                    "traceback": traceback.format_exc()[-4000:]})
            return self.finish(None, status="failed", error=f"optimizer failed: {kind}: {exc}")
        return self.finish(final)

    def end_incomplete(self, phase: str, problem: str) -> NoReturn:
        """End the session without a record: the infrastructure failed in ``phase``. The ledger
        says why (``session_incomplete``) and stays resumable (no ``session_end``)."""
        try:
            self.ledger.append("session_incomplete", {"phase": phase, "error": problem})
        except LedgerError:
            pass  # a disk that refused the entry: the ledger still holds everything before it
        self.ledger.close()
        raise InfrastructureFailure(f"incomplete ({phase}): {problem}")

    def finish(self, final: Candidate | None, status: str = "ok", error: str | None = None) -> RunRecord:
        """Score ``final`` on val and test and write the run record; :class:`InfrastructureFailure`
        (no record, the ledger resumable) when the session was stopped by its infrastructure or an
        example could not be scored for the infrastructure's sake."""
        if self.service.stopped is not None:  # whatever the optimizer made of it, the run is not complete
            self.end_incomplete("optimisation", self.service.stopped)
        try:
            self._attach_heldout()
            return self._finish(final, status, error)
        except (InfrastructureFailure, LedgerError) as exc:  # an endpoint, a sandbox or the disk
            self.end_incomplete("held-out scoring", str(exc))

    def _finish(self, final: Candidate | None, status: str, error: str | None) -> RunRecord:
        test_verdicts: list[Verdict] = []
        val_verdicts: list[Verdict] = []
        usage = self.service.usage
        metrics: dict[str, float] = {}
        own: float | None = None
        if final is not None:
            final = check_candidate(final)
            cid = candidate_id(final)
            self.ledger.append("final_candidate", {"candidate_id": cid, "components": dict(final)})
            val_verdicts = self._score_final(final, "val", usage)
            test_verdicts = self._score_final(final, "test", usage)
            own = self._score_val_own_verifier(final, usage)
            if test_verdicts:
                metrics = self.task.benchmark.extra_metrics(final, test_verdicts,
                                                            self.deploy_scorer.context(DEPLOYMENT, usage))
                if metrics:
                    self.ledger.append("test_metrics", {"candidate_id": cid, "metrics": metrics})
        record = RunRecord.build(session=self, final=final, status=status, error=error,
                                 test_verdicts=test_verdicts, val_verdicts=val_verdicts)
        record.extra["test_metrics"] = metrics  # the verifier is the experiment's (record.verifier), not restated
        record.extra.update(optimizer_statements(self.ledger))
        if final is not None and own is not None:
            record.extra["val_score_own_verifier"] = own
        self._reserve_room_for(record)
        self.ledger.append("session_end", {"status": status, "test_score": record.test_score,
                                           "metric_calls": usage.metric_calls, "record_sha256": record.digest()})
        record.ledger_head = self.ledger.head
        record.ledger_entries = len(self.ledger)
        if self.ledger.signing_key is not None:
            record.sign(self.ledger.signing_key)
        record.save(self.run_dir)
        self.ledger.close()
        return record

    def _attach_heldout(self) -> None:
        """The task with its test split again, once the optimizer has finished: reloaded (and
        verified against the manifest) for a session made from a task name, the caller's task for
        one handed a loaded :class:`Task`. A split that no longer loads as it did is an
        infrastructure failure (the session stays resumable)."""
        if "test" not in self.task.held_back:
            return
        source = self._heldout_source
        try:
            full = source if isinstance(source, Task) else load_task(*source)
        except HeldoutError as exc:
            raise InfrastructureFailure(f"cannot load the test split to score the final candidate: {exc}") from None
        if full.sizes() != self.task.sizes():
            raise InfrastructureFailure(f"the test split of {full.name} loads with sizes {full.sizes()}, not "
                                        f"{self.task.sizes()} as when the session started")
        self.task = full

    def _reserve_room_for(self, record: RunRecord) -> None:
        """Write the record once under a scratch name before ``session_end``: a disk that fills
        between that entry and the record would leave a finished ledger without a record, which no
        resume can finish; failing here leaves the session resumable instead."""
        probe = self.run_dir / f".{RECORD_FILE}.room"
        try:
            probe.write_text(json.dumps(record.content(), default=str) + " " * 4096)
        except OSError as exc:
            raise InfrastructureFailure(f"cannot write the run record in {self.run_dir}: {exc.strerror or exc}; "
                                        "free space, then rerun the same command with --resume") from None
        finally:
            probe.unlink(missing_ok=True)

    def _score_val_own_verifier(self, final: Candidate, usage: Usage) -> float | None:
        """Under a verifier variant, the final candidate's val score as the optimizer's own verifier
        would show it (what it optimised; the verifier ablation's "validation gain"). None when the
        session runs the canonical verifier (then it is the val score itself) or has no val split."""
        examples = self.task.splits.get("val", [])
        if self.variant.canonical or not examples:
            return None
        cid = candidate_id(final)
        with self.service.interruptible():
            scorings = [self.scorer.score_all(final, examples, DEPLOYMENT, usage, "val (own verifier)",
                                              self.variant.options, r)
                        for r in range(self.variant.repeats)]
        shown = [self.variant.show([s[k] for s in scorings], ex, seed=self.seed, candidate_id=cid)
                 for k, ex in enumerate(examples)]
        for ex, v in zip(examples, shown):
            self.ledger.append("val_scoring_own_verifier", {"candidate_id": cid, "example_id": ex.id,
                                                            "verifier": self.variant.name, "verdict": v.to_dict()})
        return self.task.benchmark.aggregate(shown)

    def _score_final(self, final: Candidate, split: str, usage: Usage) -> list[Verdict]:
        """Scored by the harness with the canonical verifier, outside the optimizer's budget. What
        this session's ledger already holds for this final candidate (scored before an
        interruption or an infrastructure failure; the harness's own entries of the same
        experiment, in a chain :meth:`Ledger.open` checked) is kept; only the examples still
        missing are scored, in chunks, with progress after each. An example that the
        infrastructure failed to score raises :class:`InfrastructureFailure` (never a 0)."""
        examples = self.task.splits.get(split, [])
        cid = candidate_id(final)
        recorded: dict[str, Verdict] = {}
        for entry in self.ledger.entries(f"{split}_scoring"):
            data = entry["data"]
            if data["candidate_id"] == cid and data.get("verifier") == CANONICAL:
                verdict = Verdict.from_dict(data["verdict"])
                if not is_infrastructure_failure(verdict):  # a ledger written before this rule may hold some
                    recorded[data["example_id"]] = verdict
        todo = [ex for ex in examples if ex.id not in recorded]
        done, failed = len(examples) - len(todo), []
        step = _progress_chunk(len(todo), self.deploy_scorer)
        for start in range(0, len(todo), step):
            chunk = todo[start:start + step]
            with self.service.interruptible():
                verdicts = self.deploy_scorer.score_retrying(final, chunk, DEPLOYMENT, usage)
            with self.ledger.batch():  # the chunk's entries in one write, fsync and head
                for ex, v in zip(chunk, verdicts):
                    if is_infrastructure_failure(v):
                        failed.append(v)
                        continue
                    self.ledger.append(f"{split}_scoring", {"candidate_id": cid, "example_id": ex.id,
                                                           "verifier": CANONICAL, "verdict": v.to_dict()})
                    recorded[ex.id] = v
            done += len(chunk)
            if self.heldout_progress is not None:
                self.heldout_progress(split, done, len(examples), len(failed))
        if failed:
            raise InfrastructureFailure(infrastructure_failures(
                split, failed + [recorded[ex.id] for ex in examples if ex.id in recorded]) or "")
        return [recorded[ex.id] for ex in examples]


#: what an optimizer states about its run (an ``optimizer_event`` of these kinds) and the record keeps:
#: the split that selected its final candidate, and what its library could not make reproducible
SELECTION_EVENT, NOT_REPRODUCIBLE_EVENT = "final_selection", "not_reproducible"
SELECTION_SPLITS = ("val", "train", "train+val", "none")


def optimizer_statements(ledger: Ledger) -> dict[str, Any]:
    """``selection`` ({split, how}) and ``not_reproducible`` ({what}) as the optimizer last stated
    them in the ledger, each None when it stated nothing (user code need not). The optimizer's word,
    not the harness's measurement; the report says so. A split outside :data:`SELECTION_SPLITS` is
    kept as "unknown"; texts are cut to 300 characters."""
    stated: dict[str, Any] = {"selection": None, "not_reproducible": None}
    for entry in ledger.entries("optimizer_event"):
        kind, data = entry["data"].get("kind"), entry["data"].get("data") or {}
        if kind == SELECTION_EVENT:
            split = data.get("split")
            stated["selection"] = {"split": split if split in SELECTION_SPLITS else "unknown",
                                   "how": str(data.get("how", ""))[:300]}
        elif kind == NOT_REPRODUCIBLE_EVENT:
            stated["not_reproducible"] = {"what": str(data.get("what", ""))[:300]}
    return stated


def _progress_chunk(count: int, scorer: Scorer) -> int:
    """How many held-out examples are scored between two progress reports: about 25 reports a
    split, but never fewer in a chunk than twice the calls the worker keeps in flight (a chunk
    waits for its slowest call, so a smaller one would leave the endpoint idle)."""
    in_flight = max(1, int(getattr(scorer.worker, "concurrency", 0) or 0), scorer.jobs)
    return max(1, 2 * in_flight, math.ceil(count / 25))
