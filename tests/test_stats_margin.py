"""The gate's margin cannot pass a collapse, and ``Ksd`` holds its nominal error rate.

* whatever form ``--min-effect`` takes (absolute, ``P%``, ``P% headroom``, ``Ksd``), the tolerated
  drop is at most half the baseline's score: a current score of 0 never passes (``10% headroom``
  on Heilbronn, whose seed sits at ~1.5% of its ceiling, used to tolerate 6.5 times the score);
* ``heldout check`` on real Heilbronn runs says the margin was capped, and ``heldout plan`` warns
  when the drop it can detect exceeds the score itself;
* ``0.5sd`` is a standardised difference tested by the noncentral t: at a true drop of exactly
  0.5 SD its regression and pass rates are within binomial bounds of alpha (the SD-as-fixed-margin
  rule reached 0.067-0.079).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heldout.evaluators.session import Session
from heldout.optimizers import resolve_optimizer
from heldout.protocols.stats import TaskRuns, regression_check
from heldout.protocols.stats.gate import task_decision
from heldout.protocols.stats.margin import MAX_DROP_SHARE

REPO_ROOT = Path(__file__).resolve().parents[1]
HEILBRONN = "heilbronn/triangle11"
# 99.9% binomial bounds for a rate of 0.05 over 2000 draws
LOW, HIGH = 0.0345, 0.0665


@pytest.fixture
def heldout(warm_cli):
    """The real ``heldout`` command, each call a process of its own (forked warm: tests/warm_cli.py)."""
    return lambda *args: warm_cli.run(*args, cwd=REPO_ROOT)


def _single_instance(base: np.ndarray, cur: np.ndarray) -> TaskRuns:
    return TaskRuns(np.asarray(base, float)[:, None], np.asarray(cur, float)[:, None], paired=True)


@pytest.mark.parametrize("min_effect", ["10% headroom", "0.01", "90%", "0.5sd", "5%"])
def test_no_margin_form_passes_a_collapse_to_zero(min_effect):
    # Heilbronn's scale: a seed near 0.0015 under a ceiling of 0.1 (the seed at 1.5% of it)
    base = 0.0015 + np.random.default_rng(0).normal(0, 0.0002, 6)
    gate = regression_check({"heilbronn": _single_instance(base, np.zeros(6))}, min_effect=min_effect,
                            ceilings={"heilbronn": 0.1})
    task = gate.tasks[0]
    assert gate.outcome == "regression" and task.p_noninferior > 0.5
    assert task.margin <= MAX_DROP_SHARE * base.mean() * (1 + 1e-9)


def test_a_margin_wider_than_half_the_score_is_capped_and_the_evidence_says_so():
    base = np.array([0.0015, 0.0016, 0.0014, 0.0015, 0.0017, 0.0015])
    gate = regression_check({"heilbronn": _single_instance(base, 0.6 * base)}, min_effect="10% headroom",
                            ceilings={"heilbronn": 0.1})
    assert gate.tasks[0].capped == "10% headroom"
    assert "margin capped: --min-effect 10% headroom would tolerate losing more than 50%" in gate.evidence
    # a 40% drop is within the cap: it is not a regression (and not yet a pass at 6 seeds either)
    assert gate.outcome != "regression"


def test_a_margin_inside_the_cap_is_applied_as_given():
    base = np.array([0.60, 0.62, 0.58, 0.61, 0.59])
    gate = regression_check({"t": TaskRuns(np.tile(base[:, None], 4), np.tile(base[:, None], 4) - 0.001, paired=True)},
                            min_effect="5%")
    assert gate.tasks[0].capped == "" and gate.tasks[0].margin == pytest.approx(0.05 * base.mean())
    assert gate.outcome == "pass"


@pytest.mark.parametrize("paired", [False, True])
def test_an_sd_margin_holds_alpha_at_a_true_drop_of_exactly_that_many_sds(paired):
    # 5 runs per arm, runs ~ N(mu, 0.05), the current arm 0.5 SD lower: the margin's boundary
    rng = np.random.default_rng(54 + paired)
    draws, sd, seeds = 2000, 0.05, 5
    regressed = passed = 0
    for _ in range(draws):
        base = rng.normal(0.5, sd, (seeds, 1)).repeat(3, axis=1)
        cur = rng.normal(0.5 - 0.5 * sd, sd, (seeds, 1)).repeat(3, axis=1)
        d = task_decision("t", TaskRuns(base, cur, paired), alpha=0.05, min_effect="0.5sd")
        regressed += d.p_regression <= 0.05
        passed += d.p_noninferior <= 0.05
    assert LOW <= regressed / draws <= HIGH
    assert LOW <= passed / draws <= HIGH


@pytest.fixture(scope="module")
def heil(tmp_path_factory):
    root = tmp_path_factory.mktemp("margin")
    for method in ("seed", "geometry-search"):
        for seed in range(5):
            Session(HEILBRONN, budget=30, seed=seed, run_dir=root / method / f"seed-{seed}",
                    method=method).run(resolve_optimizer(method))
    return root


def test_check_with_a_headroom_margin_does_not_pass_an_80_percent_drop_on_heilbronn(heil, heldout):
    done = heldout("check", "--baseline", str(heil / "geometry-search"), "--current", str(heil / "seed"),
                   "--min-effect", "10% headroom")
    assert done.returncode != 0, done.stdout + done.stderr
    assert "margin capped: --min-effect 10% headroom" in done.stdout
    assert "(50.0% of the baseline's" in done.stdout


def test_plan_warns_when_the_detectable_drop_exceeds_the_score_itself(heil, heldout):
    done = heldout("plan", "--task", HEILBRONN, "--seeds", "5", "--pilot", str(heil / "geometry-search"),
                   "--min-effect", "10% headroom")
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stdout.splitlines() if line.startswith("WARNING:")]
    assert len(warning) == 1 and "the baseline score" in warning[0] and "collapse to 0" in warning[0]
    calm = heldout("plan", "--task", HEILBRONN, "--seeds", "10", "--p-base", "0.002", "--run-sd", "0.00001")
    assert calm.returncode == 0 and "WARNING" not in calm.stdout
