"""``heldout plan``: what a study of K seeds on a task's test split can detect, read from the
manifest (test-set size), the task (its score scale and direction) and, optionally, a pilot run set (baseline
score, run-to-run SD, the seed's val score for the headroom check). The arithmetic is
:func:`heldout.protocols.stats.plan_gate`, with the gate's own test and margin; this module only
gathers its inputs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from heldout.benchmarks.registry import get_benchmark
from heldout.data_manifests import manifest_holding
from heldout.protocols.stats import GatePlan, plan_gate
from heldout.protocols.stats.margin import DEFAULT_MARGIN, Margin
from heldout.reports.collect import ReportError, collect_runs


def plan_study(task: str, profile: str, seeds: int, *, pilot: str | Path | None = None, p_base: float | None = None,
               run_sd: float | None = None, paired: bool = False, alpha: float = 0.05, power: float = 0.8,
               target: float | None = None, min_effect: "str | Margin" = DEFAULT_MARGIN, tasks: int = 1,
               method: str | None = None) -> GatePlan:
    """Plan from the manifest and a pilot (runs of ``task`` under ``profile``; of ``method`` only
    when given, else the pilot must hold one method: averaging several methods' runs would plan
    for a baseline nobody runs, with their difference counted as run-to-run spread). Values given
    explicitly override the pilot's. Without a pilot, a prompt task's scores in [0, 1] use the
    binomial bound on the per-example spread; a program task's scores have no such bound, so it
    needs ``run_sd`` (or a pilot)."""
    sizes = manifest_holding(task, profile).sizes(profile)
    n_examples = int(sizes.get("test", 0))
    if n_examples < 1:
        raise ReportError(f"{task} profile {profile!r} has no test examples to plan for")
    bench = get_benchmark(task)
    ceiling, metric = float(bench.score_ceiling), bench.metric_spec
    # scores in [0, 1] have per-example variance <= p (1 - p): the binomial bound holds for them
    bounded = bench.kind != "program" and ceiling == 1.0 and metric.higher_is_better
    binary, pilot_n, headroom = bounded, None, None
    if pilot is not None:
        runs = [r for r in collect_runs([pilot]).runs if r.record.task == task and r.record.profile == profile]
        methods = sorted({r.record.method for r in runs})
        if method is not None:
            runs = [r for r in runs if r.record.method == method]
        elif len(methods) > 1:
            raise ReportError(f"the pilot {pilot} holds several methods for {task} ({', '.join(methods)}); pass "
                              "--method NAME to plan from that method's runs")
        if not runs:
            raise ReportError(f"no verified pilot run of {task} under profile {profile!r}"
                              + (f" by method {method!r}" if method else "") + f" in {pilot}"
                              + (f" (it holds: {', '.join(methods)})" if methods else ""))
        scores = [list(r.test_scores().values()) for r in runs]
        flat = np.concatenate([np.asarray(s, dtype=float) for s in scores])
        binary = metric.higher_is_better and bool(np.all((flat == 0) | (flat == 1)))
        means = np.array([np.mean(s) for s in scores])
        p_base = float(means.mean()) if p_base is None else p_base
        if run_sd is None and means.shape[0] >= 2:
            run_sd, pilot_n = float(means.std(ddof=1)), int(np.mean([len(s) for s in scores]))
        vals = [r.record.val_score for r in runs if r.record.val_score is not None]
        if vals:
            headroom = metric.sign * (ceiling - float(np.mean(vals)))  # the room left to improve
    if p_base is None:
        raise ReportError("give --p-base (the baseline's expected score) or a --pilot run dir")
    if not binary and run_sd is None:
        raise ReportError(f"{task} scores on a scale of its own (ceiling {ceiling:g}, not 0/1): give --run-sd "
                          "(the SD of a run's mean score) or a --pilot run dir with >= 2 runs")
    # the gate reads a lower-is-better metric negated (heldout check), so its plan does too
    plan = plan_gate(seeds=seeds, n_examples=n_examples, p_base=metric.sign * p_base, run_sd=run_sd,
                     pilot_n_examples=pilot_n, paired=paired, binary=binary, alpha=alpha, power=power, target=target,
                     headroom=headroom, min_effect=min_effect, ceiling=metric.sign * ceiling, tasks=tasks)
    if metric.higher_is_better:
        return plan
    return replace(plan, notes=plan.notes + (f"{metric.name} is lower-is-better: the gate reads minus the score, so "
                                             "the baseline is shown negated and a 'drop' is a rise in it",))
