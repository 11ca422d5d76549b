"""Sessions: the one choke point through which an optimizer touches a task.

* :class:`Session` owns the budget, the ledger, the visibility policy and the test split.
* :class:`~heldout.evaluators.evaluation.EvaluationService` (:mod:`.evaluation`) evaluates
  candidates on train/val examples only (it never holds test examples), counts every metric call
  before anything runs, and appends every result to the ledger before returning it.
* :class:`~heldout.evaluators.view.SessionView` (:mod:`.view`) is the only thing an optimizer gets
  (the in-process :class:`heldout.contracts.TaskView`): it wraps the service and filters verdicts
  through the visibility policy.

A run has three steps: the session opened (new, or resumed from its ledger), the optimizer run to
an :class:`Outcome` (:meth:`Session.optimise` in this process, or
:func:`~heldout.evaluators.isolated.launch_isolated` in the sandbox), and :meth:`Session.finish`,
the one end of every run, whatever its outcome (:meth:`Session.run` is the last two).

Test examples are not in the session while its optimizer runs: a session made from a task name
holds the task without its test split (:meth:`Task.without`: the sizes, not the examples) and
loads the test split again, verified against the manifest, only when it scores the final
candidate. So nothing reachable from the view, from what refers to it (``gc.get_referrers``, the
frames above the optimizer) or anywhere in the process (``gc.get_objects``) holds a test example
during optimisation. (A session handed a loaded :class:`Task` keeps it for the final scoring: its
caller holds that object anyway. A trusted in-process optimizer can still load the data itself:
trust, not containment, and the record says so.)

What a session may spend and show, and what it has spent, is in :mod:`.policy` (Budget,
VisibilityPolicy, Usage); how a candidate is scored, in :mod:`.scoring` (Scorer); how its final
candidate is scored on val and test, chunk by chunk into the ledger, in :mod:`.heldout_scoring`.

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
twice). A ledger started by a different experiment is refused (:class:`ExperimentMismatch`, the
identity rule of :mod:`.same_experiment`).

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

import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from heldout.benchmarks.extraction.text import forget_texts
from heldout.benchmarks.loading import Task, load_task
from heldout.benchmarks.verifiers import CANONICAL, parse_verifier
from heldout.contracts import (Candidate, HeldoutError, InfrastructureFailure, MalformedCandidate, MetricSpec, Optimizer,
                               check_candidate)
from heldout.evaluators.ledger import Ledger, LedgerError
from heldout.evaluators.policy import POLICIES, STANDARD_POLICY, Budget, VisibilityPolicy
from heldout.evaluators.records import RunRecord, describe_experiment
from heldout.evaluators.same_experiment import ExperimentMismatch, check_resumable
from heldout.evaluators.scoring import Decoding, Execution, Scorer, SessionModels, refuse_decoding_among
from heldout.evaluators.evaluation import EvaluationService
from heldout.evaluators.heldout_scoring import TEST_ENTRY_KINDS, HeldoutScores, HeldoutScoring
from heldout.evaluators.view import MeteredArchitect, SessionView


@dataclass(frozen=True)
class Outcome:
    """How an optimizer's run ended, for :meth:`Session.finish`: with its ``final`` candidate (a
    malformed one is refused here: :class:`MalformedCandidate`); or ``failed`` for the optimizer's
    sake (``error`` says why: it crashed, its process died, it gave no final); or ``incomplete``
    for the infrastructure's sake (an endpoint, a sandbox, the disk: no record, the ledger
    resumable)."""

    final: Candidate | None = None
    error: str | None = None
    incomplete: str | None = None
    traceback: str | None = None  # where an in-process optimizer raised: the ledger's optimizer_failed entry

    def __post_init__(self) -> None:  # what is scored and recorded is the plain copy of the final
        if self.final is not None:
            object.__setattr__(self, "final", check_candidate(self.final))

    @property
    def status(self) -> str:
        return "ok" if self.error is None else "failed"


class Session:
    """One optimizer run on one task with one seed. See the module docstring."""

    def __init__(self, task: Task | str, profile: str = "default", budget: Budget | int = 100,
                 seed: int = 0, run_dir: str | Path = "runs/session", *, models: SessionModels = SessionModels(),
                 policy: VisibilityPolicy | str = STANDARD_POLICY, verifier: str = CANONICAL,
                 data_dir: str | None = None, allow_drift: bool = False, method: str = "unnamed",
                 decoding: Decoding | None = None, options: Mapping[str, Any] | None = None,
                 execution: Execution = Execution(), provenance: Mapping[str, Any] | None = None) -> None:
        """``task`` is a task name (loaded with ``profile``, ``data_dir``, ``allow_drift``) or a
        loaded :class:`Task` (whose holder keeps its test split in the process: a name is what keeps
        the test split out of the process while an in-process optimizer runs); ``models`` the chat
        clients it talks to (:class:`SessionModels`);
        ``decoding`` how they decode (:class:`~heldout.evaluators.scoring.Decoding`: ``temperature``,
        ``max_tokens``, ``judge_*``; None: the task's prompt setting's); ``options`` the task options
        a task's context carries (``prompt_format``, ``tolerance``, ...), never a decoding setting;
        ``execution`` the sandbox limits and jobs; ``provenance`` fields the record keeps (the
        optimizer's code hash, ...)."""
        if decoding is not None and not isinstance(decoding, Decoding):
            raise HeldoutError(f"decoding must be a Decoding(...), got {type(decoding).__name__}")
        if not isinstance(models, SessionModels):  # e.g. a bare client: name the fix, not an AttributeError later
            raise HeldoutError(f"models must be SessionModels(worker=..., architect=...), got {type(models).__name__}")
        loaded = task if isinstance(task, Task) else load_task(task, profile, data_dir, allow_drift)
        # the test split is held back until the final candidate is scored (see the module docstring)
        self._heldout_source: Task | tuple[str, str, str | None, bool] = (
            task if isinstance(task, Task) else (task, profile, data_dir, allow_drift))
        self.task = loaded.without("test")
        del loaded
        # everything given is checked against the task before the ledger opens: a refused session writes nothing
        bench = self.task.benchmark
        self.variant = parse_verifier(verifier, bench.verifier_options, bench.score_ceiling)
        self.options = dict(options or {})  # the task options
        refuse_decoding_among(self.options, "options")  # a study's combined table is split by make_study
        if "prompt_format" in self.options:  # a wrong name is a clear error now, not one per example later
            check = getattr(bench, "check_prompt_format", None)
            if check is None:
                raise HeldoutError(f"{bench.name} has no prompt formats")
            check(self.options["prompt_format"])
        self.budget = budget if isinstance(budget, Budget) else Budget(metric_calls=int(budget))
        self.policy = POLICIES[policy] if isinstance(policy, str) else policy
        self.seed = seed
        self.method = method
        self.run_dir = Path(run_dir)
        self.decoding = decoding or Decoding()  # a bad one was refused when it was made
        self.provenance = dict(provenance or {})  # e.g. the optimizer's code hash (see records)
        self.models = models
        self.ledger = Ledger.open(self.run_dir, on_disk=TEST_ENTRY_KINDS)
        self._started = time.monotonic()  # the wall-time budget's start: a clock stepped by an hour is no hour spent
        self.scorer = Scorer(bench, models.worker, execution.limits, self.options, execution.jobs, self.ledger,
                             models.judge, self.decoding)
        # held-out scoring: the canonical verifier, the experiment's own options, never a variant's
        self.deploy_scorer = Scorer(bench, models.deployment_worker or models.worker, execution.limits, self.options,
                                    execution.jobs, self.ledger, models.judge, self.decoding)
        self.resumed = len(self.ledger) > 0
        header = self.header()
        if self.resumed:  # one run dir = one experiment; refused, nothing is appended or overwritten
            try:
                check_resumable(self.ledger.entries(), header, self.run_dir)
            except ExperimentMismatch:
                self.ledger.close()
                raise
        visible = {s: self.task.splits.get(s, []) for s in ("train", "val")}
        self.service = EvaluationService(visible, self.scorer, self.ledger, self.budget, self.policy,
                                         self._started, self.variant, seed)
        self.ledger.append_entry(*(("session_resumed", {"metric_calls_spent": self.service.usage.metric_calls,
                                                        "environment": header["environment"]})
                                   if self.resumed else ("session_start", header)))
        self.view = SessionView(bench.name, bench.description, bench.kind, bench.seed_candidate(),
                             visible["train"], visible["val"], self.service,
                             MeteredArchitect(models.architect, self.service),
                             MetricSpec.of(getattr(bench, "metric", "score")))
        # (split, examples scored, of total, infrastructure failures so far) during held-out scoring
        self.heldout_progress: Callable[[str, int, int, int], None] | None = None

    def header(self) -> dict[str, Any]:
        """The full description of this session's experiment (see :mod:`heldout.evaluators.records`)."""
        return describe_experiment(self)

    # -- the harness ----------------------------------------------------------------------------
    def run(self, optimizer: Optimizer) -> RunRecord:
        """Run an in-process optimizer to its end: :meth:`optimise`, then :meth:`finish`."""
        return self.finish(self.optimise(optimizer))

    def optimise(self, optimizer: Optimizer) -> Outcome:
        """Call the optimizer on the view; its :class:`Outcome`. A crashing optimizer (or a malformed
        final candidate) is its ``error``, with its ``traceback`` (:meth:`finish` records both); a
        session stopped by its infrastructure is ``incomplete``. The scorers' memos are emptied
        first: whatever this process scored before (an earlier cell's test split, a leak ablation)
        is not in it while the optimizer runs (:func:`~heldout.benchmarks.extraction.text.text_memo`)."""
        forget_texts()
        try:
            return Outcome(optimizer(self.view, self.seed))
        except Exception as exc:
            if self.service.stopped is not None or isinstance(exc, LedgerError):
                return Outcome(incomplete=self.service.stopped or str(exc))
            kind = "malformed_candidate" if isinstance(exc, MalformedCandidate) else type(exc).__name__
            return Outcome(error=f"optimizer failed: {kind}: {exc}", traceback=traceback.format_exc()[-4000:])

    def finish(self, outcome: Outcome) -> RunRecord:
        """End the session, the one way every run ends: score the outcome's final candidate on val
        and test (:mod:`.heldout_scoring`), then write the run record and the session's last
        entries. An outcome that is ``incomplete``, a session its infrastructure stopped, or an
        example that could not be scored for the infrastructure's sake ends it without a record:
        a ``session_incomplete`` entry, the ledger resumable, :class:`InfrastructureFailure`."""
        stopped = outcome.incomplete if outcome.incomplete is not None else self.service.stopped
        try:
            if stopped is not None:  # whatever the optimizer made of it, the run is not complete
                raise InfrastructureFailure(stopped)
            try:  # the test split again, held back while the optimizer ran (see the module docstring)
                self.task = self.task.restored(self._heldout_source)
            except HeldoutError as exc:
                raise InfrastructureFailure(f"cannot load the test split to score the final candidate: {exc}") from None
            final = outcome.final
            scoring = HeldoutScoring(self.scorer, self.deploy_scorer, self.variant, self.ledger, self.seed,
                                     self.service.interruptible, self.heldout_progress)
            scores = HeldoutScores() if final is None else scoring.score(self.task, final, self.service.usage)
            record = RunRecord.build(session=self, final=final, status=outcome.status, error=outcome.error,
                                     test_verdicts=scores.test, val_verdicts=scores.val,
                                     test_metrics=scores.test_metrics,
                                     val_score_own_verifier=scores.val_score_own_verifier)
            sealed = record.sealed_content()  # final from here: reserved, digested and signed as it is
            record_sha256 = record.digest(sealed)
            record.reserve_room(self.run_dir, sealed)
            failed = [] if outcome.traceback is None else [
                ("optimizer_failed", {"error": outcome.error, "traceback": outcome.traceback})]
            with self.ledger.batch():  # the optimizer's failure, what scoring left for the end, session_end
                for kind, data in failed + scores.end_entries:
                    self.ledger.append_entry(kind, data)
                self.ledger.append_entry("session_end", {"status": outcome.status, "test_score": record.test_score,
                                                         "metric_calls": self.service.usage.metric_calls,
                                                         "record_sha256": record_sha256})
            record.ledger_head, record.ledger_entries = self.ledger.head, len(self.ledger)
            if self.ledger.signing_key is not None:
                record.sign(self.ledger.signing_key, record_sha256)
            record.save(self.run_dir, sealed)
        except (InfrastructureFailure, LedgerError) as exc:  # the infrastructure's failure: no record
            phase, problem = ("optimisation", stopped) if stopped is not None else ("held-out scoring", str(exc))
            try:
                self.ledger.append_entry("session_incomplete", {"phase": phase, "error": problem})
            except LedgerError:
                pass  # a disk that refused the entry: the ledger still holds everything before it
            self.ledger.close()
            raise InfrastructureFailure(f"incomplete ({phase}): {problem}") from None
        self.ledger.close()
        return record
