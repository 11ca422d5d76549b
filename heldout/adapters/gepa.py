"""GEPA (``gepa`` 0.1.4) driven through a heldout view.

:class:`ViewGEPAAdapter` is a ``gepa.GEPAAdapter`` over any :class:`~heldout.contracts.TaskView`
(the in-process view or :class:`~heldout.adapters.client.TaskClient`), and :func:`optimize` runs
``gepa.optimize`` with it. The rules it keeps:

* **The ledger is the truth about the budget.** Every GEPA rollout is one ``view.evaluate``
  example; the adapter reports the metric calls the view charged (``num_metric_calls``, measured
  as the drop in ``view.remaining``). GEPA 0.1.4 uses that number for its minibatches but counts
  its validation passes one per example whatever it is told, so under ``--verifier repeated:K``
  GEPA's ``total_metric_calls`` is below the ledger's by ``(K - 1)`` per validation example; the
  run's ``gepa_run`` event records both and the difference (``val_calls_gepa_did_not_count``),
  and equals the ledger exactly at K = 1. An evaluation the budget cannot pay for is refused by the
  view (nothing runs); the adapter then raises :class:`BudgetExhausted` (GEPA counts nothing for a
  batch that raised), GEPA's engine logs it and its stop check, fed by :attr:`exhausted`, ends the
  run before the next iteration. GEPA returns its best candidate so far.
* **Never raising for one bad example**: a crashing or unscorable example comes back from the view
  as a verdict with the metric's failure score (0 for a score) and its error; outputs, scores
  and trajectories always have the batch's length. A whole request refused for any reason other
  than the budget (a malformed candidate, say) also scores the failure score per example, with
  the refusal as the error.
* **GEPA only maximises**, so it is fed the *oriented* score ``view.metric.sign * score``: a
  lower-is-better metric (a cost) reaches GEPA negated, and a refused request's examples the
  metric's failure score, oriented, never a 0 that would be the best cost there is. The
  ``gepa_run`` event states the orientation (``scores_fed_to_gepa``), and its
  ``val_aggregate_scores`` are GEPA's, so oriented. ``perfect_score`` is a score's: on a
  lower-is-better metric GEPA's skip of "perfect" minibatches is off (no perfect cost is known).
* **Ids are split-prefixed** (``train:160``, ``val:42``) and GEPA's data loaders are keyed by
  them, never by list position, so a train result can never pass for a val result at the same
  index.
* **Labels reach the reflection model only through the reflective dataset**, and only the fields
  the visibility policy showed for that split: ``Inputs`` (always visible), ``Generated Outputs``
  (when ``output`` is shown), ``Feedback`` (built from ``feedback``, ``target``, ``error`` and
  ``score``, each only when shown; under the standard policy val shows the score alone).
* **The reflection model is the session's metered architect** (``view.architect``), so GEPA's
  optimisation tokens land on the same scale as every other method's.

Run isolated: ``heldout run ... --optimizer-cmd "gepa=python -m heldout.adapters.gepa"``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from heldout.adapters.client import run_from_env
from heldout.adapters.settings import GEPASettings, refuse_below_minimum, verifier_repeats
from heldout.adapters.shown import feedback_text, output_text
from heldout.contracts import BudgetExceeded, Candidate, HeldoutError, InfrastructureFailure, TaskView

try:
    import gepa
    from gepa.core.adapter import EvaluationBatch
except ImportError as exc:  # an optional extra
    raise HeldoutError(f"the GEPA adapter needs gepa==0.1.4 (pip install 'heldout[gepa]'): {exc}") from exc

SPLIT_SEPARATOR = ":"
EVENT = "gepa_run"


class BudgetExhausted(BudgetExceeded):
    """The view refused a GEPA evaluation for lack of budget; the run stops at the next check."""


def prefixed(split: str, example_id: str) -> str:
    return f"{split}{SPLIT_SEPARATOR}{example_id}"


def unprefixed(data_id: str) -> tuple[str, str]:
    split, sep, example_id = data_id.partition(SPLIT_SEPARATOR)
    if not sep or split not in ("train", "val"):
        raise HeldoutError(f"GEPA data ids are split-prefixed like 'train:ID', got {data_id!r}")
    return split, example_id


class SplitLoader:
    """A GEPA ``DataLoader`` over one split of the view, keyed by split-prefixed ids."""

    def __init__(self, split: str, examples: Sequence[Mapping[str, Any]]) -> None:
        self.split = split
        self._items = {prefixed(split, ex["id"]): {"id": prefixed(split, ex["id"]), "input": ex["input"]}
                       for ex in examples}

    def all_ids(self) -> list[str]:
        return list(self._items)

    def fetch(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        return [self._items[i] for i in ids]

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class Trajectory:
    """One rollout as the adapter keeps it for reflection: what the view showed, nothing more."""

    data_id: str
    input: Any
    shown: dict[str, Any]


class ViewGEPAAdapter:
    """A ``gepa.GEPAAdapter`` whose system is the task's candidate run by the harness."""

    propose_new_texts = None  # GEPA's own reflective proposer writes the new texts

    def __init__(self, view: TaskView) -> None:
        self.view = view
        self.exhausted = False
        self.refusals = 0
        self.metric_calls = 0  # what this adapter reported to GEPA, summed
        self.val_examples = 0  # validation examples evaluated (GEPA counts each as one call)
        self.val_metric_calls = 0  # what the view charged for them

    # -- GEPAAdapter ----------------------------------------------------------------------------
    def evaluate(self, batch: list[dict[str, Any]], candidate: Candidate,
                 capture_traces: bool = False) -> EvaluationBatch:
        refs = [unprefixed(item["id"]) for item in batch]
        splits = {split for split, _ in refs}
        if len(splits) > 1:  # the loaders are split-pure; a mixed batch would be a bug here
            raise HeldoutError(f"a GEPA batch mixes splits {sorted(splits)}")
        split = splits.pop() if splits else "train"
        before = self.view.remaining
        try:
            results = self.view.evaluate(dict(candidate), split, [ex_id for _, ex_id in refs])
        except BudgetExceeded as exc:
            self.exhausted = True
            self.refusals += 1
            raise BudgetExhausted(str(exc)) from exc
        except InfrastructureFailure:
            raise  # the endpoint or sandbox failed: never a 0 for the candidate; the session has stopped
        except HeldoutError as exc:  # the whole request refused (e.g. a malformed candidate)
            failure = float(self.view.metric.failure_score or 0.0)
            results = [{"id": ex_id, "score": failure, "valid": False, "error": f"refused: {exc}"}
                       for _, ex_id in refs]
        spent = before - self.view.remaining
        self.metric_calls += spent
        if split == "val":
            self.val_examples += len(results)
            self.val_metric_calls += spent
        outputs = [dict(r) for r in results]
        # GEPA maximises: the oriented score makes its "best" the metric's best (a lower cost)
        sign = self.view.metric.sign
        scores = [sign * float(r.get("score", 0.0)) for r in results]
        trajectories = None
        if capture_traces:
            trajectories = [Trajectory(item["id"], item["input"], dict(r)) for item, r in zip(batch, results)]
        return EvaluationBatch(outputs=outputs, scores=scores, trajectories=trajectories,
                               num_metric_calls=spent)

    def make_reflective_dataset(self, candidate: Candidate, eval_batch: EvaluationBatch,
                                components_to_update: list[str]) -> dict[str, list[dict[str, Any]]]:
        records = []
        for trajectory in eval_batch.trajectories or []:
            record: dict[str, Any] = {"Inputs": trajectory.input}
            if "output" in trajectory.shown:
                record["Generated Outputs"] = output_text(trajectory.shown)
            record["Feedback"] = feedback_text(trajectory.shown)
            records.append(record)
        return {component: list(records) for component in components_to_update}

    # -- GEPA's stop check and reflection model ---------------------------------------------------
    def should_stop(self, state: Any) -> bool:
        return self.exhausted

    def reflection_lm(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else \
            [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
        try:
            return self.view.architect(messages)
        except BudgetExceeded:
            self.exhausted = True
            raise


def optimize(view: TaskView, seed: int, settings: GEPASettings = GEPASettings()) -> Candidate:
    """Run GEPA on the view's task and return its best candidate. A budget below GEPA's minimum
    (:meth:`GEPASettings.minimum_metric_calls`) is refused before anything runs; on a profile
    without a val split GEPA validates, and so selects, on train, and the run says so
    (``final_selection``)."""
    adapter = ViewGEPAAdapter(view)
    train = SplitLoader("train", view.train)
    val = SplitLoader("val", view.val) if view.val else train
    seed_candidate = dict(view.seed_candidate)
    budget = view.remaining if settings.max_metric_calls is None else min(settings.max_metric_calls,
                                                                          view.remaining)
    refuse_below_minimum("gepa", budget, settings.minimum_metric_calls(len(view.train), len(view.val)),
                         verifier_repeats(getattr(view, "verifier", None)))
    view.record_event("final_selection", split=val.split,
                      how="GEPA's best candidate by its aggregate score on this split (its valset)")
    try:
        result = gepa.optimize(
            seed_candidate=seed_candidate, trainset=train, valset=val, adapter=adapter,
            reflection_lm=adapter.reflection_lm, candidate_selection_strategy=settings.candidate_selection_strategy,
            reflection_minibatch_size=min(settings.reflection_minibatch_size, len(train)),
            # perfect_score is in a score's units; the view knows no perfect cost, so on a
            # lower-is-better metric GEPA never skips a minibatch as perfect (its default otherwise)
            perfect_score=settings.perfect_score, skip_perfect_score=view.metric.higher_is_better,
            use_merge=settings.use_merge,
            max_metric_calls=budget, stop_callbacks=[adapter.should_stop], seed=seed,
            raise_on_exception=False, run_dir=None, display_progress_bar=False)
    except BudgetExceeded as exc:  # before GEPA's loop: the seed's validation pass did not fit
        view.record_event(EVENT, outcome="budget_exhausted_before_loop", error=str(exc)[:500], settings=asdict(settings),
                          adapter_metric_calls=adapter.metric_calls)
        return seed_candidate
    view.record_event(EVENT, outcome="refused" if adapter.exhausted else "stopped", settings=asdict(settings),
                      gepa_total_metric_calls=result.total_metric_calls,
                      adapter_metric_calls=adapter.metric_calls, refusals=adapter.refusals,
                      val_calls_gepa_did_not_count=adapter.val_metric_calls - adapter.val_examples,
                      candidates=len(result.candidates), best_idx=result.best_idx,
                      val_aggregate_scores=[float(s) for s in result.val_aggregate_scores],
                      scores_fed_to_gepa=_orientation(view))
    best = result.best_candidate
    return dict(best) if isinstance(best, dict) else seed_candidate


def _orientation(view: TaskView) -> str:
    metric = view.metric
    return f"{metric.name} as it is ({metric.direction})" if metric.higher_is_better else \
        f"-1 * {metric.name} ({metric.direction}; GEPA maximises)"


def main() -> int:
    """Isolated entry point: ``python -m heldout.adapters.gepa`` under ``--optimizer-cmd``."""
    return run_from_env(optimize)


if __name__ == "__main__":
    raise SystemExit(main())
