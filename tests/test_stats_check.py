"""``heldout check`` and ``heldout plan`` on run dirs made by real sessions.

* heilbronn/triangle11 (one held-out instance): the ``seed`` candidate against
  ``geometry-search`` (30 metric calls) on 5 seeds is a ~80% drop in area on every seed; the
  gate must exit 1 (the old gate exited 0 on such a drop);
* a crashed current run, or a current study under another split profile, exits 2 with a clear
  error (a profile mismatch is compared only with ``--allow-mismatch profile``, and then said).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from heldout.cli import main
from heldout.evaluators.session import Session
from heldout.optimizers import resolve_optimizer
from heldout.reports import check_runs
from heldout.reports.check import GateInputError

REPO_ROOT = Path(__file__).resolve().parents[1]
HEILBRONN, LOCKS = "heilbronn/triangle11", "lockpicking/six"


def crashing_optimizer(view, seed):
    raise RuntimeError("the optimizer fell over")


def seed_optimizer(view, seed):
    return view.seed_candidate


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    for method in ("seed", "geometry-search"):
        for seed in range(5):
            Session(HEILBRONN, budget=30, seed=seed, run_dir=root / "heil" / method / f"seed-{seed}",
                    method=method).run(resolve_optimizer(method))
    for profile in ("paper", "default"):
        for seed in range(3):
            Session(LOCKS, profile=profile, budget=10, seed=seed, run_dir=root / "locks" / profile / f"seed-{seed}",
                    method="seed").run(seed_optimizer)
    crashed = root / "locks" / "crashed"
    for seed in range(3):
        optimizer = crashing_optimizer if seed == 1 else seed_optimizer
        Session(LOCKS, profile="paper", budget=10, seed=seed, run_dir=crashed / f"seed-{seed}",
                method="seed").run(optimizer)
    return root


@pytest.fixture
def heldout(warm_cli):
    """The real ``heldout`` command, each call a process of its own (forked warm: tests/warm_cli.py)."""
    return lambda *args: warm_cli.run(*args, cwd=REPO_ROOT)


def test_an_88_percent_single_instance_drop_over_5_seeds_exits_1(runs, heldout):
    result = check_runs([runs / "heil" / "geometry-search"], [runs / "heil" / "seed"])
    task = result.gate.tasks[0]
    assert task.comparison.test == "exact sign-flip" and task.comparison.n_base == 5
    assert task.comparison.change / task.comparison.mean_base < -0.75  # a drop of ~80% of the area
    done = heldout("check", "--baseline", str(runs / "heil" / "geometry-search"), "--current", str(runs / "heil" / "seed"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("REGRESSION:") and "exact sign-flip over 5 seed pairs" in done.stdout


def test_a_crashed_current_run_exits_2_and_names_it(runs, capsys):
    code = main(["check", "--baseline", str(runs / "locks" / "paper"), "--current", str(runs / "locks" / "crashed")])
    err = capsys.readouterr().err
    assert code == 2
    assert "incomplete study" in err and "FAILED" in err and "seed-1" in err and "fell over" in err


def test_a_profile_mismatch_exits_2_unless_allowed_and_then_it_is_stated(runs, capsys):
    base, cur = str(runs / "locks" / "paper"), str(runs / "locks" / "default")
    assert main(["check", "--baseline", base, "--current", cur]) == 2
    err = capsys.readouterr().err
    assert "runs differ in profile" in err and "--allow-mismatch profile" in err
    code = main(["check", "--baseline", base, "--current", cur, "--allow-mismatch", "profile", "--min-effect", "0.05"])
    out = capsys.readouterr().out
    assert code == 0  # the same seed candidate: identical scores on the shared test ids
    assert "NOTE: lockpicking/six: compared despite different profile" in out


def test_the_same_runs_pass_as_identical_and_an_unknown_mismatch_field_is_refused(runs, capsys):
    paper = str(runs / "locks" / "paper")
    assert main(["check", "--baseline", paper, "--current", paper]) == 0
    assert "identical" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["check", "--baseline", paper, "--current", paper, "--allow-mismatch", "colour"])
    assert refused.value.code == 2 and "invalid choice: 'colour'" in capsys.readouterr().err
    with pytest.raises(GateInputError, match="--allow-mismatch knows"):
        check_runs([paper], [paper], allow_mismatch=["colour"])


def test_plan_prints_the_minimum_detectable_effect_from_a_pilot(runs, heldout):
    done = heldout("plan", "--task", HEILBRONN, "--seeds", "5", "--pilot", str(runs / "heil" / "geometry-search"))
    assert done.returncode == 0, done.stderr
    assert "exact sign-flip (the gate's test)" in done.stdout and "regression: a true drop of margin +" in done.stdout
    assert "from the pilot" in done.stdout
    # the margin is the gate's default, on Heilbronn's own scale (scores ~0.002), not a 0/1 one
    margin = next(line for line in done.stdout.splitlines() if line.startswith("margin --min-effect 5%: "))
    assert float(margin.split(": ")[1].split()[0]) < 0.001
    no_spread = heldout("plan", "--task", HEILBRONN, "--seeds", "5", "--p-base", "0.002")
    assert no_spread.returncode == 2 and "scores on a scale of its own" in no_spread.stderr
    too_few = heldout("plan", "--task", HEILBRONN, "--seeds", "3", "--pilot", str(runs / "heil" / "geometry-search"))
    assert "cannot reach alpha=0.05: need >= 5" in too_few.stdout


def test_plan_for_zero_one_scores_answers_how_many_seeds_a_target_needs(capsys):
    assert main(["plan", "--task", LOCKS, "--profile", "generalise", "--seeds", "3", "--p-base", "0.6",
                 "--run-sd", "0.05", "--effect", "0.05", "--pair-seeds", "independent"]) == 0
    out = capsys.readouterr().out
    assert "3 runs per arm x 300 held-out example(s)" in out
    assert "to detect 0.05:" in out and "runs per arm at 300 examples" in out
    assert main(["plan", "--task", LOCKS, "--profile", "generalise", "--seeds", "3"]) == 2
    assert "give --p-base" in capsys.readouterr().err
