"""Readings say exactly what was measured (issue 54).

* a seed-blind optimizer (the same candidate in every seed) replicates nothing: its reading says
  the numbers are one run's, never "not separated" beside a seed-level p of 0, and never "earns
  nothing" beside a key that gained on every question it encodes;
* "only" never stands beside an undecided gain on another subset (tests/test_leakage.py);
* on a profile not proven topic-disjoint the held-out row is not called "held-out topics";
* ``plan --pilot`` plans from one method's runs (``--method``), never from an average of several.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from heldout.evaluators.session import Session
from heldout.optimizers import resolve_optimizer
from heldout.protocols import decide
from heldout.protocols.leak_readings import SEED_BLIND
from heldout.protocols.leak_statistics import MethodAblation, subset_gain
from heldout.protocols.leakage import decide_rows
from heldout.reports.plan import plan_study
from heldout.reports.collect import ReportError

REPO_ROOT = Path(__file__).resolve().parents[1]


def _blind_key_ablation() -> MethodAblation:
    """3 seeds that all ended on one keyed candidate: +1 on each of its 17 encoded questions,
    nothing on fresh or held-out ones."""
    def row(subset, n, before, after):
        cells = [{f"{subset}-{k}": (before, after) for k in range(n)} for _ in range(3)]
        return subset_gain(subset, cells, n_boot=200, seeds=[0, 1, 2], replayed=True)

    rows = [row("test", 24, 0.5, 0.5), row("train", 40, 0.4, 0.8), row("train_encoded", 17, 0.0, 1.0),
            row("probe_memorised", 8, 0.5, 0.5), row("probe_other", 8, 0.5, 0.5)]
    m = MethodAblation("t", "p", "blind", [0, 1, 2], rows, val_gain=0.3, key_share=[0.6] * 3,
                       families_memorised=[4] * 3, red_flags=[0] * 3)
    decide_rows([m])
    return m


def test_a_seed_blind_key_is_read_as_one_run_not_as_earning_nothing():
    m = _blind_key_ablation()
    assert m.reading_rule == "seed-blind" and m.reading.startswith(SEED_BLIND)
    assert "earns nothing" not in m.reading and "No subset separates" not in m.reading
    assert "Holm p 0" not in m.reading  # a seed-level p from seeds that replay one run is not printed
    # the per-question evidence of the one run is stated, and what it does not show
    assert "17 up / 0 down" in m.reading
    assert "key gains +1.000 in this one run (17 up, 0 down, per-question p 1.53e-05)" in m.reading
    assert "untested for the method" in m.reading
    encoded = m.row("train_encoded").seed_contrast
    assert not encoded.decided and encoded.p > 0 and "one run's number" in encoded.sentence


def test_the_same_gain_from_different_candidates_is_still_decided():
    m = _blind_key_ablation()
    cells = [{f"e-{k}": (0.0, 1.0) for k in range(17)} for _ in range(3)]
    floors = [[0.0, 0.0, 0.06, 0.0, 0.12, 0.0, 0.0]] * 3  # each seed's placebo draws: re-wording gains little
    replicated = subset_gain("train_encoded", cells, n_boot=200, floors=floors)  # three candidates, each +1
    assert replicated.separable and not m.row("train_encoded").separable


def test_a_replayed_contrast_states_its_per_question_evidence_without_deciding():
    examples = {s: {f"q{k}": (0.0, 1.0) for k in range(12)} for s in range(3)}
    c = decide.holm([decide.contrast([0.0] * 3, [1.0] * 3, n_examples=12, replayed=True, examples=examples)])[0]
    assert not c.decided and c.sign == "0" and c.changed == (12, 0)
    assert "one run's number" in c.sentence and "per-question evidence is overwhelming" in c.sentence
    assert "not a seed-level verdict" in c.sentence


def test_a_topic_shared_profile_never_names_its_held_out_row_held_out_topics():
    cells = lambda g: [{f"e{k}": (0.4, 0.4 + g + 0.01 * s) for k in range(20)} for s in range(3)]  # noqa: E731
    floors = [[0.4 + d / 100 for d in range(-4, 5)]] * 3  # each seed's 9 placebo draws
    rows = [subset_gain(s, cells(0.2 if s == "test" else 0.0), n_boot=200, floors=floors)
            for s in ("test", "train", "train_encoded", "probe_memorised", "probe_other")]
    m = MethodAblation("t", "shared", "opt", [0, 1, 2], rows, val_gain=0.2, key_share=[0.0] * 3,
                       families_memorised=[0] * 3, red_flags=[0] * 3, topic_disjoint=False)
    decide_rows([m])
    assert m.row("test").sign == "+"
    assert m.reading.startswith("NOT PROVEN topic-disjoint")
    assert "held-out topics" not in m.reading.lower()
    assert "the held-out split (topics not proven disjoint) +0.210" in m.reading


@pytest.fixture(scope="module")
def pilot(tmp_path_factory):
    root = tmp_path_factory.mktemp("pilot")
    for method in ("seed", "geometry-search"):
        for seed in range(3):
            Session("heilbronn/triangle11", budget=30, seed=seed, run_dir=root / method / f"seed-{seed}",
                    method=method).run(resolve_optimizer(method))
    return root


def test_plan_from_a_pilot_of_several_methods_needs_method_and_uses_only_its_runs(pilot, warm_cli):
    with pytest.raises(ReportError, match="several methods .*geometry-search, seed.*--method"):
        plan_study("heilbronn/triangle11", "default", 5, pilot=pilot)
    seed = plan_study("heilbronn/triangle11", "default", 5, pilot=pilot, method="seed")
    search = plan_study("heilbronn/triangle11", "default", 5, pilot=pilot, method="geometry-search")
    alone = plan_study("heilbronn/triangle11", "default", 5, pilot=pilot / "seed")
    assert seed.p_base == alone.p_base and seed.p_base < search.p_base
    done = warm_cli.run("plan", "--task", "heilbronn/triangle11", "--seeds", "5", "--pilot", str(pilot), "--method",
                        "geometry-search", cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert f"baseline score {search.p_base:.4g}" in done.stdout
    helped = warm_cli.run("plan", "--help", cwd=REPO_ROOT)
    assert "--method" in helped.stdout and "a pilot holding several needs --method" in " ".join(helped.stdout.split())
