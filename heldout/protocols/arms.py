"""Equal-budget arms: serial vs best-of-N fork vs merge-of-N, over one workload.

Throughput cannot tell merging from sampling-and-selecting; only held-out quality at an equal
budget can. Three arms, each replicated over the same seeds:

* ``serial``: one run of budget B (the optimizer at width 1);
* ``fork-of-N``: N independent runs of B/N each (width 1, random streams 0..N-1), reported twice:
  the *selected* fork (best on val, else on train when the task has no val, scored on test:
  what one can ship) and the *oracle* fork (best on test: an upper bound nobody can ship);
* ``merge-of-N``: one run of width N whose workers' proposals are merged, budget B.

Rules:

* **One fixed unit** (``metric_calls``, ``architect_calls`` or ``tokens``, the architect's) is
  enforced by every session; the other units are only capped (``metric_cap``) and are measured
  and printed as **confounds**. Spend is counted from the ledgers (the system of record) and must
  agree with the run records. **Equal allowed budget is the rule**: an arm whose spend, at any
  seed, is more than ``drift_tolerance`` (default 10%) below the largest arm's is reported as
  *stopped by itself* with the optimizer's reason ("serial stopped at 400 of 600 metric_calls:
  converged"), not as broken. **Broken** is for what the harness got wrong: a missing or failed
  run, a ledger that does not verify, a record that disagrees with its ledger, a run whose
  allowed budget is not the planned one or that spent over it, or a fixed unit no arm spent.
* **Separation**: the rule ``seed-paired-contrast`` of :mod:`heldout.protocols.decide`: seeds
  are the unit, the arms are paired by seed (they share seeds and random streams), at least 3
  seeds, Holm across the three comparisons printed. Never from seed ranges.
* **Mechanism evidence**: the ``optimizer_event`` entries of each arm's ledgers (how many merge
  rounds, unions built and accepted, conflicts). A merge arm whose artifact has one part
  (merging degenerates to selection) or whose unions never formed is flagged, and then no
  difference it shows is credited to merging.
* **Headroom** before spending: the seed candidate is scored on val (train when there is none)
  by the harness; little room to improve is a warning in the plan and the result.

Layout: ``RUN_DIR/arms.json`` (the experiment: spec, plan, headroom) and one study per arm,
``RUN_DIR/arm-<arm>/<task>/<method>/seed-<n>/``, with methods ``<optimizer>.serial``,
``<optimizer>.fork-<k>-of-<N>`` and ``<optimizer>.merge-of-<N>`` (distinct names, so a plain
``heldout report RUN_DIR`` reads every run).

Three rooms: :mod:`heldout.protocols.arms_plan` (the spec, its planned runs, headroom), this one
(validating, measuring headroom, running), :mod:`heldout.protocols.arms_comparison` (reading a run
dir back; :func:`~heldout.protocols.arms_comparison.arms_table` is the report's hook).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import asdict, replace
from pathlib import Path

from heldout.benchmarks.loading import load_task
from heldout.contracts import HeldoutError, json_safe
from heldout.files import read_user_json, write_text_atomically
from heldout.data_manifests import manifest_holding
from heldout.evaluators.policy import Usage
from heldout.evaluators.scoring import Scorer
from heldout.models import DEPLOYMENT
from heldout.optimizers import check_optimizer, is_reference_optimizer, resolve_optimizer
from heldout.protocols import decide
from heldout.protocols.arms_comparison import ArmsComparison, compare_arms
from heldout.protocols.arms_plan import (ARMS_FILE, MIN_SEEDS, RESULT_FILE, ArmsError, ArmsSpec, Headroom, PlannedRun,
                                         plan_arms)
from heldout.protocols.minimum_budgets import check_minimum_budgets
from heldout.protocols.preflight import check_infrastructure
from heldout.protocols.run import Executor, LocalExecutor, StudyConfig, run_study, study_client
from heldout.protocols.study_dir import claim_study_dir


def check_headroom(spec: ArmsSpec, config: StudyConfig) -> Headroom:
    """Score the seed candidate on val (train when the profile has no val) with the canonical
    scorer, outside any session budget (a harness measurement, like held-out scoring)."""
    task = load_task(spec.task, spec.profile, config.data_dir, config.allow_drift)
    split = "val" if task.splits.get("val") else "train"
    bench = task.benchmark
    worker = study_client(config.worker_model, config)  # the study's timeout and retries, as its cells'
    try:
        verdicts = Scorer(bench, worker, options=spec.options).score_all(
            bench.seed_candidate(), task.splits.get(split, []), DEPLOYMENT, Usage(), f"the seed's {split} headroom")
    finally:
        if worker is not None:
            worker.close()
    return Headroom(split, bench.aggregate(verdicts) if verdicts else 0.0, bench.score_ceiling, spec.min_headroom,
                    bench.metric_spec.higher_is_better)


# -- running ---------------------------------------------------------------------------------------
class ArmsInterrupted(ArmsError):
    """A stop request (SIGINT/SIGTERM) ended the comparison in one arm: the arms after it did not
    start and nothing was compared; every ledger is consistent, and re-running the same command
    continues it (the CLI exits 130, as an interrupted ``heldout run``)."""


def open_arms(spec: ArmsSpec, run_dir: str | Path) -> list[PlannedRun]:
    """The plan, after checking that ``run_dir`` holds this experiment or nothing (one run dir =
    one experiment; a different spec is an error naming what differs)."""
    path = Path(run_dir) / ARMS_FILE
    if path.exists():
        stored = read_user_json(path, "arms experiment", error=ArmsError)
        recorded = stored.get("spec")
        if not isinstance(recorded, dict):
            raise ArmsError(f"arms experiment {path} holds no spec: not written by `heldout compare arms`")
        wanted = spec.to_dict()
        differing = [f"{k}: {recorded.get(k)!r} -> {wanted[k]!r}" for k in wanted if recorded.get(k) != wanted[k]]
        if differing:
            raise ArmsError(f"{run_dir} holds another arms experiment ({'; '.join(differing)}); use a new run dir")
    return plan_arms(spec, run_dir)


def run_arms(spec: ArmsSpec, run_dir: str | Path, config: StudyConfig, executor: Executor | None = None,
             progress: bool = True, headroom: Headroom | None = None,
             resume_hint: str | None = None) -> ArmsComparison:
    """Check headroom, run every planned session (finished ones are skipped on a rerun), and
    compare. ``config`` holds the models and data dir; its run root and architect limits are set
    per arm here. The run dir is held by this process while it runs (one study process per run
    dir); a stop request ends the whole comparison (:class:`ArmsInterrupted`, ``resume_hint``: the
    command that continues it)."""
    plan = open_arms(spec, run_dir)
    check_infrastructure([r.cell for r in plan], config)  # no worker or a dead endpoint: one line, before any file
    headroom = headroom or check_headroom(spec, config)
    root = Path(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    claim_study_dir(root)
    plan = open_arms(spec, run_dir)  # again, now that no other process can write it
    path = root / ARMS_FILE
    if not path.exists():
        write_text_atomically(path, json.dumps({"spec": spec.to_dict(), "plan": [asdict(r) for r in plan],
                                                "headroom": asdict(headroom),
                                                "config": {k: v for k, v in asdict(config).items() if k != "run_root"}},
                                               indent=1))
    executor = executor or LocalExecutor(1)
    for arm in spec.arm_names:
        mine = [r for r in plan if r.arm == arm]
        # one study per arm: the per-run limits in the architect units are the arm's
        arm_config = replace(config, run_root=mine[0].arm_root, architect_tokens=mine[0].architect_tokens,
                             architect_calls=mine[0].architect_calls)
        results = run_study([r.cell for r in mine], arm_config, executor, progress=progress,
                            resume_hint=resume_hint or "the same command")
        stopped = [r for r in results if r["status"] in ("interrupted", "not started")]
        if stopped:  # the executor is stopped too: later arms would run nothing and compare a torn run dir
            later = spec.arm_names[spec.arm_names.index(arm) + 1:]
            raise ArmsInterrupted(f"stopped in arm {arm} before {len(stopped)} of its {len(mine)} run(s) finished"
                                  + (f", and before arms {', '.join(later)}" if later else "")
                                  + "; every ledger is consistent: re-run the same command to continue"
                                  + (f" ({resume_hint})" if resume_hint else ""))
        lost = [r for r in results if r["status"] == "incomplete"]
        if lost:  # the infrastructure's failure: no comparison of it (a "broken" one would blame the arms)
            raise ArmsError(f"{len(lost)} run(s) of arm {arm} incomplete (the infrastructure failed, not the optimizer: "
                            f"{lost[0].get('error')}); nothing was compared: re-run the same command to continue")
    comparison = compare_arms(run_dir)
    write_text_atomically(root / RESULT_FILE, json.dumps(json_safe(comparison.to_dict()), indent=1, default=str))
    return comparison


# -- validation before spending ---------------------------------------------------------------------
def validate_arms(spec: ArmsSpec) -> list[str]:
    """What would make the experiment unable to conclude, found before any budget is spent: an
    unknown optimizer, one without a width mode (for this task), too few seeds, a run below its
    method's minimum useful budget (:mod:`heldout.protocols.minimum_budgets`). Raises
    :class:`ArmsError` naming the first problem; returns notes on the design otherwise. User code
    is read, not run (:func:`~heldout.optimizers.check_optimizer`): only heldout's own optimizers
    are asked whether they support this task's width."""
    try:
        check_optimizer(f"{spec.optimizer}?width={spec.width}&stream=0")
    except HeldoutError as exc:
        raise ArmsError(f"the arms need an optimizer with a width mode and random streams: {exc}") from None
    own = is_reference_optimizer(spec.optimizer)
    supports = getattr(inspect.getmodule(resolve_optimizer(spec.optimizer)), "supports_width", None) if own else None
    if supports is not None and not supports(spec.task):
        raise ArmsError(f"{spec.optimizer} has no width mode for {spec.task}: the merge arm cannot run")
    if len(spec.seeds) < MIN_SEEDS:
        raise ArmsError(f"{len(spec.seeds)} seed(s): the arms are compared with the seed as the unit and need "
                        f">= {MIN_SEEDS} seeds (e.g. --seeds 0,1,2)")
    # a fork gets B/N: below its method's minimum it could only hand back the seed
    check_minimum_budgets([run.cell for run in plan_arms(spec, "")], "compare arms")
    n_test = int(manifest_holding(spec.task, spec.profile).sizes(spec.profile).get("test", 1))
    return [f"separation: {decide.RULES['seed-paired-contrast'].test}",
            "what it can detect: " + decide.describe_detectable(len(spec.seeds), family=3, n_examples=n_test)]


__all__ = ["ArmsInterrupted", "check_headroom", "open_arms", "run_arms", "validate_arms"]
