"""Verdicts against the noise floor, under the laws optimizers produce: seeded simulations of the real functions.

Three kinds of noise that a normal-theory seed test ignores, each simulated through the function
the commands call (``decide.contrast`` / ``decide.family`` as ``compare arms`` and the verifier
ablation call them, ``decide.beyond_placebo`` + ``decide.holm`` as ``compare_heldout`` calls them):

* **Per-seed outcomes are not normal**: skewed (a rare big win), two-valued (the trick was found
  or not), heavy-tailed. Both sides draw from the same law (identical optimizers), so any decided
  verdict is a false one.
* **The seed prompt is one draw**: on a worker whose answers to prompt-sensitive questions are
  re-drawn by any change of wording, an optimizer that makes one meaningless edit has the law of
  a placebo edit. Its three verdicts (held-out, validation, the gap) against the placebo floor,
  Holm together, must fire at most alpha of the time, at every share of prompt-sensitive questions,
  test size and seed count.
* **Questions move together**: a candidate flips a cluster of questions at once.

Type-I must stay under the upper binomial bound of alpha (99.9%: a correct rule fails about once
in a thousand seeds of this file); where a design cannot reach alpha the rate is 0 and the verdict
says how many seeds would. Power at a stated real effect is printed and held to a floor. Figures
are quoted in docs/statistics.md.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from heldout.protocols import decide
from heldout.protocols.placebo import draws_for
from heldout.protocols.stats.floor import draws_needed
from heldout.protocols.verifier_ablation import VariantResult, decide_variants

ALPHA = 0.05
SIMS = 400


def upper(rate: float = ALPHA, n: int = SIMS) -> float:
    return float(scipy_stats.binom.ppf(0.9995, n, rate) / n)


def skewed(rng, size):
    """A rare big win: mostly a small loss, sometimes a large gain (lognormal, sigma 1.2)."""
    return rng.lognormal(0.0, 1.2, size) * 0.02


def two_valued(rng, size):
    """The trick was found (p 0.3) or not, plus a little test-set noise."""
    return np.where(rng.random(size) < 0.3, 0.15, 0.0) + rng.normal(0, 0.003, size)


def heavy_tailed(rng, size):
    return scipy_stats.t.rvs(1.5, size=size, random_state=rng) * 0.02


LAWS = {"skewed": skewed, "two-valued": two_valued, "heavy-tailed": heavy_tailed}


@pytest.mark.parametrize("law", sorted(LAWS))
@pytest.mark.parametrize("seeds", [3, 5, 10])
def test_identical_optimizers_are_not_separated_whatever_the_law_of_their_outcomes(law, seeds):
    # seeded by the law's place and the seed count: hash() of a str differs per process (PYTHONHASHSEED)
    rng = np.random.default_rng([sorted(LAWS).index(law), seeds])
    draw = LAWS[law]
    paired = unpaired = t_hits = 0
    two_sample = SIMS if seeds < 10 else SIMS // 2  # 10 + 10 runs: 184,756 splits a test, enumerated
    for i in range(SIMS):
        a, b = 0.5 + draw(rng, seeds), 0.5 + draw(rng, seeds)
        paired += decide.contrast(a, b, n_examples=100).decided
        if i < two_sample:
            unpaired += decide.contrast(a, b, n_examples=100, paired=False).decided
        t_hits += scipy_stats.ttest_rel(b, a).pvalue < ALPHA
    print(f"\n{law}, {seeds} seeds: sign-flip {paired / SIMS:.3f}, permutation {unpaired / two_sample:.3f}, "
          f"paired t would give {t_hits / SIMS:.3f} (bound {upper():.3f})")
    assert paired / SIMS <= upper() and unpaired / two_sample <= upper(n=two_sample)


@pytest.mark.parametrize("seeds", [3, 5, 10])
def test_three_identical_two_valued_arms_get_no_false_separates(seeds):
    # what `compare arms` prints: three contrasts, Holm together
    rng = np.random.default_rng(7 + seeds)
    hits = 0
    for _ in range(SIMS):
        arms = {name: dict(enumerate(0.5 + two_valued(rng, seeds))) for name in ("serial", "fork", "merge")}
        pairs = [("serial", "fork"), ("serial", "merge"), ("fork", "merge")]
        out = decide.family([(x, y, arms[x], arms[y]) for x, y in pairs], n_examples=100)
        hits += any(c.decided for c in out)
    print(f"\nthree identical two-valued arms, {seeds} seeds: any false separates {hits / SIMS:.3f}")
    assert hits / SIMS <= upper()


def test_below_the_seed_floor_the_verdict_says_how_many_seeds_would():
    c = decide.contrast([0.5, 0.5, 0.5], [0.7, 0.72, 0.69], n_examples=100)
    assert not c.decided and ">= 6 seeds would" in c.sentence and "any law" in c.sentence


def sensitive_tasks(rng, *, n_test: int, n_val: int, share: float) -> dict:
    """Per split: its size, the chance of each prompt-sensitive question, and how many of the
    fixed questions are right."""
    tasks = {}
    for split, n in (("test", n_test), ("val", n_val)):
        k = int(round(share * n))
        tasks[split] = (n, rng.uniform(0.2, 0.8, k), rng.binomial(n - k, 0.6))
    return tasks


def prompt_sensitive_study(rng, *, seeds: int, draws: int, n_test: int, n_val: int, share: float,
                           effect: float = 0.0, tasks: dict | None = None):
    """One study under "edits only re-draw prompt-sensitive items": a share of the questions is
    answered right with its own probability, re-drawn by every wording; the rest is fixed. Every
    candidate (placebo draws, the method's final) is one wording; the method adds ``effect`` to
    the chance on its sensitive questions. Returns per seed: (method test, val), draws' (test, val)."""
    def score(n, p_sensitive, fixed, boost):
        sensitive = rng.random(p_sensitive.size) < np.clip(p_sensitive + boost, 0, 1)
        return (sensitive.sum() + fixed) / n

    tasks = tasks or sensitive_tasks(rng, n_test=n_test, n_val=n_val, share=share)
    method, floor = {}, {}
    for s in range(seeds):
        method[s] = {split: score(n, p, fixed, effect) for split, (n, p, fixed) in tasks.items()}
        floor[s] = [{split: score(n, p, fixed, 0.0) for split, (n, p, fixed) in tasks.items()} for _ in range(draws)]
    return method, floor


def three_verdicts(method, floor):
    """The three verdicts of compare_heldout, as it calls the decision layer."""
    test = decide.beyond_placebo({s: [d["test"] for d in f] for s, f in floor.items()},
                                 {s: m["test"] for s, m in method.items()}, n_examples=100, label="held-out")
    val = decide.beyond_placebo({s: [d["val"] for d in f] for s, f in floor.items()},
                                {s: m["val"] for s, m in method.items()}, n_examples=100, label="validation")
    gap = decide.beyond_placebo({s: [d["val"] - d["test"] for d in f] for s, f in floor.items()},
                                {s: m["val"] - m["test"] for s, m in method.items()}, n_examples=100, label="gap")
    return decide.holm([test, val, gap])


@pytest.mark.parametrize("share,seeds,n_test", [(0.3, 3, 48), (0.6, 3, 500), (0.1, 5, 200), (0.6, 5, 48),
                                                (0.3, 10, 500), (0.1, 10, 48)])
def test_one_meaningless_edit_gets_no_verdict_against_the_placebo_floor(share, seeds, n_test):
    rng = np.random.default_rng(int(share * 100) * 1000 + seeds * 10 + n_test)
    draws = draws_needed(seeds, ALPHA, family=3)
    sims = SIMS
    any_hits = 0
    for _ in range(sims):
        method, floor = prompt_sensitive_study(rng, seeds=seeds, draws=draws, n_test=n_test, n_val=n_test // 2,
                                               share=share)
        any_hits += any(c.decided for c in three_verdicts(method, floor))
    rate = any_hits / sims
    print(f"\nmeaningless edit, share {share}, {seeds} seeds x {draws} draws, {n_test} test: any verdict {rate:.3f}")
    assert rate <= upper(ALPHA, sims)


def ablation_rows(method_by_variant, floor_by_variant):
    """The verifier ablation's rows for a prompt task, its own verifier showing the val score."""
    rows = []
    for variant, method in method_by_variant.items():
        floor = floor_by_variant[variant]
        seeds = sorted(method)
        mean = {s: (np.mean([d["val"] for d in floor[s]]), np.mean([d["test"] for d in floor[s]])) for s in seeds}
        gain = [method[s]["val"] - mean[s][0] for s in seeds]
        transfer = [method[s]["test"] - mean[s][1] for s in seeds]
        rows.append(VariantResult(
            variant=variant, seeds=seeds, val_gain=gain, transfer=transfer,
            gap=[g - t for g, t in zip(gain, transfer)], final_test=[method[s]["test"] for s in seeds],
            seed_test=[floor[s][0]["test"] for s in seeds], final_own=[method[s]["val"] for s in seeds],
            seed_own=[floor[s][0]["val"] for s in seeds], final_candidates=[f"{variant}-{s}" for s in seeds],
            metric_calls=[0] * len(seeds), floor_test={s: [d["test"] for d in floor[s]] for s in seeds},
            floor_gap={s: [d["val"] - d["test"] for d in floor[s]] for s in seeds}))
    return rows


@pytest.mark.parametrize("share,seeds,n_test", [(0.3, 3, 48), (0.6, 5, 200), (0.3, 10, 500)])
def test_a_meaningless_edit_shows_no_gaming_gap_in_the_verifier_ablation(share, seeds, n_test):
    # compare verifiers as summarise calls it: a gap per variant against that variant's placebo
    # draws, and the variant's transfer against the canonical one's, Holm together
    rng = np.random.default_rng(700 + seeds)
    variants = ("decomposed", "scalar")
    draws = draws_for(seeds, family=3)
    hits = 0
    for _ in range(SIMS):
        tasks = sensitive_tasks(rng, n_test=n_test, n_val=n_test // 2, share=share)
        studies = {v: prompt_sensitive_study(rng, seeds=seeds, draws=draws, n_test=n_test, n_val=n_test // 2,
                                             share=share, tasks=tasks) for v in variants}
        family = decide_variants(ablation_rows({v: m for v, (m, _) in studies.items()},
                                               {v: f for v, (_, f) in studies.items()}),
                                 n_selection=n_test // 2, n_test=n_test)
        assert len(family) == 3 and family[0].rule == "placebo-floor"
        hits += any(c.decided for c in family)
    rate = hits / SIMS
    print(f"\nverifier ablation, meaningless edit, share {share}, {seeds} seeds x {draws} draws: any verdict {rate:.3f}")
    assert rate <= upper(ALPHA, SIMS)


def test_against_the_seeds_one_draw_the_same_edit_would_be_decided_often():
    # the failure the floor removes: the seed scored once, every seed pair sharing its luck
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(200):
        method, floor = prompt_sensitive_study(rng, seeds=10, draws=1, n_test=200, n_val=100, share=0.3)
        seed = floor[0][0]  # one wording of the seed, shared by every seed pair
        c = decide.contrast({s: seed["test"] for s in method}, {s: m["test"] for s, m in method.items()},
                            n_examples=200)
        hits += c.decided
    print(f"\none draw of the seed as the baseline, 10 seeds: false verdicts {hits / 200:.3f}")
    assert hits / 200 > 0.3


@pytest.mark.parametrize("seeds", [3, 5, 10])
def test_a_real_gain_is_found_beyond_the_floor(seeds):
    rng = np.random.default_rng(300 + seeds)
    draws = draws_needed(seeds, ALPHA, family=3)
    found = 0
    for _ in range(200):
        method, floor = prompt_sensitive_study(rng, seeds=seeds, draws=draws, n_test=200, n_val=100, share=0.3,
                                               effect=0.5)
        found += three_verdicts(method, floor)[0].sign == "+"
    print(f"\nreal gain (+0.5 chance on the prompt-sensitive 30%, about +0.15 accuracy), {seeds} seeds x {draws} "
          f"draws: power {found / 200:.2f}")
    assert found / 200 >= 0.8


def test_a_cluster_of_questions_moving_together_is_counted_once_per_seed():
    # each candidate flips a cluster of 8 questions together (one coin per cluster, not per question)
    rng = np.random.default_rng(5)
    hits = 0
    for _ in range(SIMS):
        def candidate_score():
            clusters = rng.random(6) < 0.5
            return (np.repeat(clusters, 8).sum() + 20) / 68
        a = {s: candidate_score() for s in range(3)}
        b = {s: candidate_score() for s in range(3)}
        hits += decide.contrast(a, b, n_examples=68).decided
    assert hits / SIMS <= upper()


def test_a_seed_blind_method_decides_nothing_against_fresh_draws():
    rng = np.random.default_rng(1)
    floor = {s: list(0.5 + rng.normal(0, 0.02, 7)) for s in range(3)}
    c = decide.beyond_placebo(floor, {s: 0.9 for s in range(3)}, n_examples=100, replayed=True)
    assert not c.decided and "one draw repeated" in c.sentence
