"""The evaluation service: the one choke point through which every evaluation of a session passes.

:class:`EvaluationService` evaluates candidates on train/val examples only (it never holds test
examples), counts every metric call before anything runs (a request the budget cannot pay is
refused whole), appends every result to the ledger before returning it, and on a resumed ledger
serves the recorded results and architect replies again in order (the rules are in
:mod:`heldout.evaluators.session`'s docstring). The optimizer reaches it only through the view
(:mod:`heldout.evaluators.view`); the session owns it."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any, Callable, ContextManager, Iterable, Mapping, NoReturn, Sequence

from heldout.benchmarks.verifiers import CANONICAL, Variant, parse_verifier
from heldout.contracts import (BudgetExceeded, Candidate, Example, HeldoutError, InfrastructureFailure, MetricSpec,
                               Verdict, VisibilityError, candidate_id, check_candidate, is_infrastructure_failure)
from heldout.evaluators.ledger import Ledger, LedgerError
from heldout.evaluators.policy import Budget, Usage, VisibilityPolicy
from heldout.evaluators.scoring import Arrivals, InOrder, Scorer, infrastructure_failures
from heldout.models import OPTIMISATION

MAX_EVENT_BYTES = 64 * 1024  # one optimizer event in the ledger


def _verdict_from_entry(data: Mapping[str, Any]) -> Verdict:
    return Verdict.from_dict(data["verdict"])


class EvaluationService:
    """Evaluates candidates on train/val examples under the budget, appending to the ledger.

    Holds no test example (the harness keeps those), so nothing reachable from a view can yield
    a test target."""

    def __init__(self, examples: Mapping[str, Sequence[Example]], scorer: Scorer, ledger: Ledger,
                 budget: Budget, policy: VisibilityPolicy, started: float, variant: Variant | None = None,
                 seed: int = 0) -> None:
        if "test" in examples:  # an invariant of the trust model, so a raise (asserts vanish under -O)
            raise HeldoutError("the evaluation service never holds test examples")
        self._examples = {s: {ex.id: ex for ex in exs} for s, exs in examples.items()}
        self._scorer = scorer
        self._ledger = ledger
        self.__budget = budget  # read-only (see the property): the budget is the harness's, not the view's
        self.policy = policy
        self.variant = variant or parse_verifier(CANONICAL)
        self._seed = seed
        self._started = started
        self._lock = threading.Lock()
        self.usage = Usage()
        self.candidates: dict[str, dict[str, Any]] = {}  # id -> {"first_call", "parent", "sums"}
        self.trajectory: list[dict[str, Any]] = []
        self._best: tuple[float, str | None] = (float("-inf"), None)
        self._replay: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self._memo: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._recorded_candidates: set[str] = set()  # candidates whose components are in the ledger
        # metric calls as the optimizer has seen them: behind ``usage.metric_calls`` only while
        # recorded evaluations are being replayed after a resume (see the module docstring)
        self._clock = 0
        self._architect_replay: dict[str, list[dict[str, Any]]] = {}
        self.progress: Callable[[int, int, float | None], None] | None = None  # (used, budget, best)
        # around the scoring of an evaluation: the harness's thread only waits there and writes no
        # ledger entry, so a stop request may interrupt it at once (see protocols.run)
        self.interruptible: Callable[[], ContextManager[Any]] = contextlib.nullcontext
        self.stopped: str | None = None  # why the session stopped for an infrastructure failure
        self._load_recorded()

    # -- resume ---------------------------------------------------------------------------------
    def _load_recorded(self) -> None:
        for entry in self._ledger.entries():
            data = entry["data"]
            if entry["kind"] == "evaluation":
                key = (data["candidate_id"], data["split"], data["example_id"])
                self._replay.setdefault(key, []).append(data)
                self.usage.charge(int(data.get("cost", 1)))
            elif entry["kind"] == "candidate":
                self._recorded_candidates.add(data["candidate_id"])
            elif entry["kind"] == "architect_call":
                self.usage.count_architect_call(data["prompt_tokens"], data["completion_tokens"])
                if "text" in data:
                    self._architect_replay.setdefault(data["request_key"], []).append(data)

    # -- the budget -----------------------------------------------------------------------------
    @property
    def budget(self) -> Budget:
        return self.__budget

    @property
    def remaining(self) -> int:
        """What the budget leaves *now* (what enforcement uses)."""
        return self.budget.metric_calls - self.usage.metric_calls

    @property
    def visible_remaining(self) -> int:
        """What the optimizer is told is left: during a replay, as it was at that point of the
        original run; otherwise :attr:`remaining`."""
        return self.budget.metric_calls - min(self._clock, self.usage.metric_calls) \
            if self.replaying else self.remaining

    @property
    def replaying(self) -> bool:
        return any(self._replay.values())

    def stop_for_infrastructure(self, problem: str, **data: Any) -> NoReturn:
        """Stop the session: the infrastructure failed where a result was needed. Recorded once;
        every later ``evaluate`` or architect call raises the same :class:`InfrastructureFailure`."""
        if self.stopped is None:
            self.stopped = problem
            try:
                self._ledger.append_entry("infrastructure_failure", {"error": problem, **data})
            except LedgerError:
                pass  # the disk itself failed: the failure is still raised, and nothing is claimed
        raise InfrastructureFailure(problem)

    def check_running(self) -> None:
        if self.stopped is not None:
            raise InfrastructureFailure(f"the session has stopped: {self.stopped}")

    def check_wall_time(self) -> None:
        if self.budget.wall_seconds is not None and time.monotonic() - self._started > self.budget.wall_seconds:
            raise BudgetExceeded(f"wall-time budget of {self.budget.wall_seconds} s is used up")

    # -- evaluation -----------------------------------------------------------------------------
    def _check_split(self, split: Any) -> None:
        if type(split) is not str or split not in ("train", "val"):
            raise VisibilityError(f"split must be exactly 'train' or 'val', got {split!r}")
        self.policy.fields(split)  # refuses any split the policy hides
        if split not in self._examples:
            raise VisibilityError(f"unknown split {split!r}; the optimizer can use: {', '.join(self._examples)}")

    def _wanted(self, split: str, ids: Sequence[str] | None) -> list[str]:
        """The requested ids of ``split`` (all of it for None): plain strings, each once, all in it."""
        pool = self._examples[split]
        wanted = list(pool) if ids is None else list(ids)
        if any(type(i) is not str for i in wanted):
            raise VisibilityError("example ids are plain strings")
        if len(set(wanted)) != len(wanted):
            raise VisibilityError("ids repeat within one request; ask for each example once")
        unknown = [i for i in wanted if i not in pool]
        if unknown:
            raise VisibilityError(f"ids not in split {split!r}: {unknown[:5]}")
        return wanted

    def evaluate(self, candidate: Candidate, split: str, ids: Sequence[str] | None,
                 parent: str | None = None) -> list[tuple[Example, Verdict]]:
        self._check_split(split)
        candidate = check_candidate(candidate)
        cid = candidate_id(candidate)
        pool = self._examples[split]
        wanted = self._wanted(split, ids)
        with self._lock:
            self.check_running()
            self.check_wall_time()
            replayed, fresh = [], []
            for ex_id in wanted:
                (replayed if self._replay.get((cid, split, ex_id)) else fresh).append(ex_id)
            # replayed results were paid for before the interruption; only fresh ones cost now
            cost = len(fresh) * self.variant.repeats
            if cost > self.remaining:
                self._ledger.append_entry("budget_refused", {"candidate_id": cid, "split": split,
                                                             "requested": len(wanted), "new": len(fresh),
                                                             "remaining": self.remaining})
                raise BudgetExceeded(
                    f"evaluating {len(fresh)} new example(s) ({cost} metric call(s)) would exceed the budget: "
                    f"{self.remaining} of {self.budget.metric_calls} metric calls left; nothing was run")
            self.usage.charge(cost)
            results: dict[str, Verdict] = {}
            # when this request happened, in metric calls: now, or (all replayed) when it was recorded
            stamp = self.usage.metric_calls
            for ex_id in replayed:
                data = self._replay[(cid, split, ex_id)].pop(0)
                results[ex_id] = _verdict_from_entry(data)
                self.usage.replayed += 1
                self._memo[(cid, split, ex_id)] = data
            if replayed and not fresh:
                stamp = max(self._memo[(cid, split, i)]["metric_calls"] for i in replayed)
            self._clock = max(self._clock, stamp) if not fresh else self.usage.metric_calls
            self._register_candidate(candidate, cid, parent, stamp)
        memo_hits = [i for i in fresh if (cid, split, i) in self._memo]
        to_run = [i for i in fresh if (cid, split, i) not in self._memo]
        # one write, fsync and head for the whole batch, all before any result is returned; a fresh
        # verdict joins the batch as soon as it and every one before it are scored (InOrder)
        with self._ledger.batch():
            with self._lock:
                for ex_id in memo_hits:
                    self.usage.add(OPTIMISATION, cache_hits=1)  # the session's memo answered it
                    results[ex_id] = _verdict_from_entry(self._memo[(cid, split, ex_id)])
                    self._record(cid, split, ex_id, results[ex_id], cached=True)

            def record(k: int, raw: list[Verdict]) -> None:
                ex_id = to_run[k]
                shown = self.variant.show(raw, pool[ex_id], seed=self._seed, candidate_id=cid)
                with self._lock:
                    results[ex_id] = shown
                    self._record(cid, split, ex_id, shown, cached=False, raw=None if shown is raw[0] else raw)
            firsts = self._score_fresh(candidate, [pool[i] for i in to_run], record)
            with self._lock:
                failed = [ex_id for ex_id, v in zip(to_run, firsts) if is_infrastructure_failure(v)]
                if failed:  # no entry for them: not charged on resume, and re-run when asked again
                    self.stop_for_infrastructure(
                        infrastructure_failures(f"{split} evaluation", firsts) or "", phase="optimisation",
                        split=split, candidate_id=cid, examples=failed,
                        refunded=len(failed) * self.variant.repeats)
                self._update_trajectory(cid, split, [results[i] for i in wanted], stamp)
        if self.progress is not None:
            self.progress(min(self._clock, self.usage.metric_calls), self.budget.metric_calls,
                          None if self._best[1] is None else self._best[0])
        return [(pool[i], results[i]) for i in wanted]

    def _score_fresh(self, candidate: Candidate, examples: list[Example],
                     record: Callable[[int, list[Verdict]], None]) -> list[Verdict]:
        """Score ``examples`` (each ``variant.repeats`` times) and ``record(k, its verdicts)`` each
        one that the infrastructure did not fail, in order, as soon as it can; the waits for answers
        and their scoring are interruptible, the records are not (:class:`Arrivals`). Returns, per
        example, the verdict of an infrastructure failure when any of its repeats is one, else its
        first verdict."""
        repeats = self.variant.repeats
        if repeats == 1:
            in_order = InOrder(len(examples), lambda k, v: record(k, [v]))
            verdicts = self._scorer.score_retrying(candidate, examples, OPTIMISATION, self.usage, self.variant.options,
                                                   0, Arrivals(self.interruptible, in_order.scored))
            in_order.finish(verdicts)
            return verdicts
        waits = Arrivals(self.interruptible)
        scorings = [self._scorer.score_retrying(candidate, examples, OPTIMISATION, self.usage, self.variant.options,
                                                r, waits) for r in range(repeats)]
        firsts = [next((s[k] for s in scorings if is_infrastructure_failure(s[k])), scorings[0][k])
                  for k in range(len(examples))]
        for k, first in enumerate(firsts):
            if not is_infrastructure_failure(first):
                record(k, [s[k] for s in scorings])
        return firsts

    def _record(self, cid: str, split: str, ex_id: str, verdict: Verdict, cached: bool,
                raw: list[Verdict] | None = None) -> None:
        """``verdict`` is what the optimizer was shown; under a verifier variant ``scored`` keeps
        the task's own verdict(s) it was derived from."""
        data = {"candidate_id": cid, "split": split, "example_id": ex_id, "cached": cached,
                "metric_calls": self.usage.metric_calls, "verdict": verdict.to_dict(),
                "cost": self.variant.repeats}  # a memo hit is charged like a fresh evaluation
        if raw is not None:
            data["scored"] = [v.to_dict() for v in raw]
        self._ledger.append_entry("evaluation", data)
        self._memo[(cid, split, ex_id)] = data

    def _register_candidate(self, candidate: Candidate, cid: str, parent: str | None, stamp: int) -> None:
        if cid not in self.candidates:
            self.candidates[cid] = {"first_metric_call": stamp, "parent": parent,
                                    "sums": {}}
            if cid not in self._recorded_candidates:
                self._recorded_candidates.add(cid)
                # no result yet: the evaluation entry's fsync, before any result is returned, covers it
                self._ledger.append_entry("candidate", {"candidate_id": cid, "parent": parent,
                                                        "components": dict(candidate)}, sync=False)

    def _update_trajectory(self, cid: str, split: str, verdicts: Iterable[Verdict], stamp: int) -> None:
        sums = self.candidates[cid]["sums"].setdefault(split, [0.0, 0])
        metric = MetricSpec.of(getattr(self._scorer.benchmark, "metric", "score"))
        for v in verdicts:
            sums[0] += metric.reading(v)
            sums[1] += 1
        # best-so-far: a candidate's mean on val when it has val results, else on train
        stats = self.candidates[cid]["sums"]
        chosen = "val" if stats.get("val", (0, 0))[1] else split
        if not stats[chosen][1]:
            return
        score = stats[chosen][0] / stats[chosen][1]
        if self._best[1] is None or metric.sign * (score - self._best[0]) > 0:  # "best" in the metric's direction
            self._best = (score, cid)
            self.trajectory.append({"metric_calls": stamp, "best_score": score,
                                    "candidate_id": cid, "split": chosen})

    @property
    def best_candidate_id(self) -> str | None:
        return self._best[1]

    def record_event(self, kind: str, data: dict[str, Any]) -> None:
        self._ledger.append_entry(kind, data)

    def replay_architect(self, request_key: str) -> dict[str, Any] | None:
        with self._lock:
            queue = self._architect_replay.get(request_key)
            return queue.pop(0) if queue else None

    def record_optimizer_event(self, kind: Any, data: Mapping[str, Any]) -> None:
        """An optimizer's event, stored as ``optimizer_event`` (so it can never pose as a harness
        entry); the kind is a short identifier and the data plain JSON of bounded size."""
        if type(kind) is not str or not kind.replace("_", "").replace("-", "").isalnum() or len(kind) > 64:
            raise HeldoutError(f"event kind must be a short identifier (letters, digits, _ or -), got {kind!r}")
        try:
            encoded = json.dumps(dict(data), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise HeldoutError(f"event data must be plain JSON: {exc}") from None
        if len(encoded) > MAX_EVENT_BYTES:
            raise HeldoutError(f"event data is {len(encoded)} bytes; the limit is {MAX_EVENT_BYTES}")
        self._ledger.append_entry("optimizer_event", {"kind": kind, "metric_calls": self.usage.metric_calls,
                                                      "data": json.loads(encoded)})
