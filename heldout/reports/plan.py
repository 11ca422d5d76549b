"""``heldout plan``: what a study of K seeds on a task's test split can detect, read from the
manifest (test-set size) and, optionally, a pilot run set (baseline score, run-to-run SD, the
seed's val score for the headroom check). The arithmetic is
:func:`heldout.protocols.stats.plan_gate`; this module only gathers its inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from heldout.data_manifests import Manifest
from heldout.protocols.stats import GatePlan, plan_gate
from heldout.reports.collect import ReportError, collect_runs


def plan_study(task: str, profile: str, seeds: int, *, pilot: str | Path | None = None, p_base: float | None = None,
               run_sd: float | None = None, paired: bool = False, alpha: float = 0.05, power: float = 0.8,
               target: float | None = None) -> GatePlan:
    """Plan from the manifest and a pilot (runs of ``task`` under ``profile``). Values given
    explicitly override the pilot's."""
    sizes = Manifest.load(task).sizes(profile)
    n_examples = int(sizes.get("test", 0))
    if n_examples < 1:
        raise ReportError(f"{task} profile {profile!r} has no test examples to plan for")
    binary, pilot_n, headroom = True, None, None
    if pilot is not None:
        runs = [r for r in collect_runs([pilot]).runs if r.record.task == task and r.record.profile == profile]
        if not runs:
            raise ReportError(f"no verified pilot run of {task} under profile {profile!r} in {pilot}")
        scores = [list(r.test_scores().values()) for r in runs]
        flat = np.concatenate([np.asarray(s, dtype=float) for s in scores])
        binary = bool(np.all((flat == 0) | (flat == 1)))
        means = np.array([np.mean(s) for s in scores])
        p_base = float(means.mean()) if p_base is None else p_base
        if run_sd is None and means.shape[0] >= 2:
            run_sd, pilot_n = float(means.std(ddof=1)), int(np.mean([len(s) for s in scores]))
        vals = [r.record.val_score for r in runs if r.record.val_score is not None]
        if binary and vals:
            headroom = 1.0 - float(np.mean(vals))  # 0/1 scores: the ceiling is 1
    if p_base is None:
        raise ReportError("give --p-base (the baseline's expected score) or a --pilot run dir")
    return plan_gate(seeds=seeds, n_examples=n_examples, p_base=p_base, run_sd=run_sd, pilot_n_examples=pilot_n,
                     paired=paired, binary=binary, alpha=alpha, power=power, target=target, headroom=headroom)
