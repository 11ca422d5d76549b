"""The decision layer: every "separates", "regression", "leak" or reading heldout prints comes
from a rule named here.

Rules that hold for every verdict:

* **The unit is the seed.** A seed's score is one whole optimizer run's number (its mean
  held-out score, its gain over a baseline, its transfer under a verifier variant). Examples of
  one run share that run's candidate, so they are never the replicates of a verdict.
* **Paired by seed** where the two sides share seeds (arms, ablations, verifier variants: the
  same seed drives the same random stream), so run-to-run noise common to both sides cancels.
* **Exact randomisation tests over seeds, for every law** (:func:`heldout.protocols.stats.runs.choose_test`):
  an exact sign-flip over the 2**S sign patterns of the per-seed differences (paired), an exact
  permutation over the splits of the runs (independent). A seed's number is the score of the one
  candidate its run ended on, and which candidate that is follows the optimizer's law: skewed (a
  rare big win), two-valued (the trick was found or not), heavy-tailed, so a t's normal premise is
  not theirs; the randomisation tests are exact for any law when the sides are exchangeable
  (``tests/test_seed_laws.py``), and say how many seeds they need where they cannot reach alpha
  (6 seed pairs for a two-sided 0.05).
* **A fixed candidate is one draw** (rule ``placebo-floor``, :func:`beyond_placebo`). The seed
  prompt scored once carries the luck of its wording, shared by every seed pair. Against a fixed
  prompt candidate a method is compared with placebo draws (neutral re-wordings of the seed,
  :mod:`heldout.optimizers.placebo`, fresh ones per seed) by an exact stratified permutation:
  "beats the seed" means "beats what re-wording the seed does".
* **Holm across every comparison a command prints** (:func:`holm`): the chance that any printed
  verdict of one command is a false "separates" is at most alpha.
* **No verdict from ranges alone**, and none from example-level tests.
* **No verdict from seeds that replicate nothing**: when every seed ran the same candidates (a
  seed-blind optimizer) and every pair differs by exactly the same amount, the seeds re-scored
  one run, and a seed-level test would count it S times (:func:`replicates_nothing`).
* **Zero variance is not certainty, and questions are not replicates.** When every seed pair
  differs by the same non-zero amount from different candidates, the exact sign-flip still counts
  seeds (2/2**S at best), never the questions whose score changed: questions of one candidate move
  together (a cluster of 6-8 flipping with one wording), so a test over them decided 26% of null
  draws at 3 seeds. The changed-question counts (:func:`changed_examples`) are description.

Each verdict is a :class:`Contrast`: the rule's name, its inputs (per-seed values), the estimate
and interval, raw and Holm-adjusted p, the family size and the nominal error rate, and one
sentence built from those numbers only. Type-I error and power of each rule are shown by seeded
simulations of these functions (``tests/test_decide_calibration.py``; figures in
``docs/statistics.md``).

The gate's rule (``gate-margin``) is :func:`heldout.protocols.stats.regression_check`, with its
margin (:class:`~heldout.protocols.stats.margin.Margin`, re-exported here): a tolerated drop in
score units, as a fraction of the baseline's score or of its headroom to the ceiling, or in
run-to-run SDs, applied per task on that task's own scale.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

from heldout.contracts import HeldoutError
from heldout.protocols.stats import holm_adjust
from heldout.protocols.stats.margin import DEFAULT_MARGIN, Margin, MarginError
from heldout.protocols.stats.power import minimum_detectable_dz
from heldout.protocols.stats.floor import floor_law, smallest_p
from heldout.protocols.stats.runs import choose_test, compare_runs, min_seeds_permutation, min_seeds_sign_flip

DEFAULT_ALPHA = 0.05
MIN_SEEDS = 3
"""Fewer seeds than this on a side and no verdict is attempted: there is no spread to test."""


class DecisionError(HeldoutError, ValueError):
    """A decision rule was given input it cannot decide on."""


@dataclass(frozen=True)
class Rule:
    """A named decision rule: what its unit is, which test it runs and what error it controls."""

    name: str
    unit: str
    test: str
    error: str


RULES: dict[str, Rule] = {rule.name: rule for rule in (
    Rule("seed-paired-contrast", "seed (paired by seed id), or run (independent)",
         "exact sign-flip over the per-seed differences (paired) or exact permutation over runs (independent), "
         "two-sided, valid for any law of per-seed outcomes when the sides are exchangeable; Holm across the "
         "command's comparisons; seeds that ran the same candidates with zero variance decide nothing; where the "
         "seed count cannot reach alpha the verdict says how many seeds would",
         "family-wise type-I <= alpha across every comparison printed"),
    Rule("placebo-floor", "seed (a stratum: the method's run and its own placebo draws)",
         "exact stratified permutation of the method's value among its stratum's neutral re-wordings of the seed "
         "(mean over strata of method minus the stratum's placebo mean), two-sided; Holm with the command's other "
         "comparisons; a seed-blind method (one candidate in every seed) decides nothing",
         "family-wise type-I <= alpha under 'the method is a placebo', for any law and any correlation of "
         "questions within one candidate"),
    Rule("gate-margin", "seed (paired by id, or independent runs)",
         "one-sided exact sign-flip / permutation against a per-task margin; regression Holm over tasks, "
         "pass = every task non-inferior (intersection-union)",
         "P(regression | true drop <= margin) <= alpha family-wise; P(pass | true drop >= margin) <= alpha"),
)}


Sign = Literal["+", "-", "0"]
"""A decided positive difference, a decided negative one, or no decision."""


@dataclass(frozen=True)
class Contrast:
    """One verdict of ``b`` against ``a`` with the seed as the unit.

    ``estimate`` is mean over seeds of ``b - a`` (paired) or mean(b) - mean(a); ``low``/``high``
    its two-sided ``1 - alpha`` interval (unadjusted; infinite when the design cannot bound it);
    ``p`` the two-sided p and ``p_holm`` the Holm-adjusted one over ``family`` comparisons;
    ``decided`` is ``p_holm < alpha`` and the interval excludes 0. ``sentence`` says what was
    decided and why, from these numbers only."""

    rule: str
    label: str
    a_label: str
    b_label: str
    seeds: tuple[int, ...]
    a: tuple[float, ...]
    b: tuple[float, ...]
    paired: bool
    test: str
    n_examples: int
    estimate: float
    low: float
    high: float
    p: float
    p_holm: float
    family: int
    alpha: float
    min_seeds: int
    decided: bool
    sign: str
    sentence: str
    replayed: bool = False
    """Every seed of each side ran the same candidate (set by callers that know candidate ids)."""
    zero_variance: bool = False
    """Every seed pair differs by the same non-zero amount (the sign-flip's interval is then a point)."""
    changed: tuple[int, int] | None = None
    """For a replayed run (description): examples whose net score over the seeds went up, down."""
    placebo: tuple[tuple[float, ...], ...] | None = None
    """Rule ``placebo-floor``: per seed, that stratum's placebo draws (``a`` holds their means)."""

    @property
    def nominal_error(self) -> float:
        """The family-wise type-I error the rule controls."""
        return self.alpha

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seeds": list(self.seeds), "a": list(self.a), "b": list(self.b),
                "nominal_error": self.nominal_error}


def _values(side: Mapping[int, float] | Sequence[float]) -> dict[int, float]:
    if isinstance(side, Mapping):
        return {int(k): float(v) for k, v in side.items()}
    return {i: float(v) for i, v in enumerate(side)}


def changed_examples(examples: Mapping[int, Mapping[str, tuple[float, float]]],
                     seeds: Sequence[int]) -> tuple[float, int, int]:
    """The exact two-sided sign test over examples: each example once, its change ``b - a``
    summed over the ``seeds`` it appears in (``examples[seed][id] = (a score, b score)``);
    returns (p, examples up, examples down). Under no effect an example's net change is as likely
    up as down, whatever the seeds share, so the test is exact given the changed count."""
    net: dict[str, float] = {}
    for seed in seeds:
        for ex, (a_score, b_score) in examples.get(seed, {}).items():
            net[ex] = net.get(ex, 0.0) + float(b_score) - float(a_score)
    up = sum(1 for d in net.values() if d > 1e-12)
    down = sum(1 for d in net.values() if d < -1e-12)
    p = float(scipy_stats.binomtest(up, up + down, 0.5).pvalue) if up + down else 1.0
    return p, up, down


def contrast(a: Mapping[int, float] | Sequence[float], b: Mapping[int, float] | Sequence[float], *,
             n_examples: int, paired: bool = True, alpha: float = DEFAULT_ALPHA,
             labels: tuple[str, str] = ("a", "b"), label: str | None = None, replayed: bool = False,
             examples: Mapping[int, Mapping[str, tuple[float, float]]] | None = None) -> Contrast:
    """``b`` against ``a``, one value per seed (a mapping seed -> value, or a sequence whose
    position is the seed). Paired designs use the seeds both sides have; a seed on one side only
    is left out and the sentence names how many pairs remain. ``replayed``: every seed of each
    side ran the same candidate (see :func:`replicates_nothing`). ``examples``: per seed, example
    id -> (a score, b score), the per-example scores the seed values average; used only to describe
    a replayed run's changed questions, never as a verdict. A family of one: call :func:`holm` on every
    contrast a command prints."""
    a_vals, b_vals = _values(a), _values(b)
    if paired:
        seeds = tuple(sorted(set(a_vals) & set(b_vals)))
        av = np.array([a_vals[s] for s in seeds])
        bv = np.array([b_vals[s] for s in seeds])
    else:
        seeds = tuple(sorted(set(a_vals) | set(b_vals)))
        av = np.array([a_vals[s] for s in sorted(a_vals)])
        bv = np.array([b_vals[s] for s in sorted(b_vals)])
    a_name, b_name = labels
    name = label or f"{b_name} vs {a_name}"
    test = choose_test(int(n_examples), paired)
    n = min(len(av), len(bv))
    floor = max(MIN_SEEDS, min_seeds_sign_flip(alpha / 2) if paired else min_seeds_permutation(alpha / 2))
    base = dict(rule="seed-paired-contrast", label=name, a_label=a_name, b_label=b_name, seeds=seeds,
                a=tuple(map(float, av)), b=tuple(map(float, bv)), paired=paired, test=test,
                n_examples=int(n_examples), family=1, alpha=alpha, min_seeds=floor, replayed=replayed)
    if n < MIN_SEEDS:
        est = float(bv.mean() - av.mean()) if n else math.nan
        return Contrast(**base, estimate=est, low=-math.inf, high=math.inf, p=1.0, p_holm=1.0, decided=False,
                        sign="0", sentence=f"{name}: cannot separate: {n} seed{'s' if n != 1 else ''} "
                                           f"{'paired' if paired else 'per side'}; a verdict needs >= {MIN_SEEDS}")
    comp = compare_runs(av, bv, paired=paired, n_examples=int(n_examples), alpha=alpha, two_sided=True)
    p = min(1.0, 2.0 * min(comp.p_value(av, bv, 0.0, "less"), comp.p_value(av, bv, 0.0, "greater")))
    differences = bv - av if paired else None
    if differences is not None and replayed and float(np.ptp(differences)) <= 1e-12:
        # one run re-scored S times: a seed-level test has no error to measure here; keep the one
        # run's per-question evidence instead (it decides nothing)
        p = 1.0
        if examples is not None:
            p, up, down = changed_examples(examples, seeds)
            base.update(test="exact sign test", changed=(up, down))
    elif differences is not None and float(np.ptp(differences)) <= 1e-12 \
            and abs(float(differences.mean())) > 1e-12:
        # every pair differs by the same amount from different candidates: the sign-flip counts
        # the seeds (2 / 2**S at best), never the questions that moved together inside them
        base.update(zero_variance=True)
    return _finish(Contrast(**base, estimate=comp.change, low=comp.low, high=comp.high, p=p, p_holm=p,
                            decided=False, sign="0", sentence=""))


def beyond_placebo(placebo: Mapping[int, Sequence[float]], method: Mapping[int, float], *, n_examples: int,
                   alpha: float = DEFAULT_ALPHA, labels: tuple[str, str] = ("placebo", "method"),
                   label: str | None = None, replayed: bool = False) -> Contrast:
    """Rule ``placebo-floor``: ``method`` (seed -> value) against the placebo draws of the same
    seed (seed -> that stratum's draws), by the exact stratified permutation of
    :mod:`heldout.protocols.stats.floor`. Seeds without draws are left out. ``replayed``: the
    method ended on the same candidate in every seed, which is one draw repeated, not S
    independent ones: nothing is decided. A family of one: call :func:`holm`."""
    seeds = tuple(sorted(s for s in method if placebo.get(s)))
    draws = tuple(tuple(float(x) for x in placebo[s]) for s in seeds)
    mv = np.array([float(method[s]) for s in seeds])
    a_name, b_name = labels
    name = label or f"{b_name} vs {a_name}"
    test = "exact stratified permutation"
    need = MIN_SEEDS
    if draws:
        k = min(len(d) for d in draws)
        while smallest_p([k] * need) >= alpha:
            need += 1
    base = dict(rule="placebo-floor", label=name, a_label=a_name, b_label=b_name, seeds=seeds,
                a=tuple(float(np.mean(d)) for d in draws), b=tuple(map(float, mv)), paired=True, test=test,
                n_examples=int(n_examples), family=1, alpha=alpha, min_seeds=need, replayed=replayed,
                placebo=draws)
    if len(seeds) < MIN_SEEDS:
        est = floor_law(mv, draws).gain if seeds else math.nan
        return _finish(Contrast(**base, estimate=est, low=-math.inf, high=math.inf, p=1.0, p_holm=1.0,
                                decided=False, sign="0", sentence=""))
    law = floor_law(mv, draws)  # enumerated once: the p and both bounds read the same arrangements
    tail = alpha / 2
    p = 1.0 if replayed else min(1.0, 2.0 * min(law.p(0.0, "less"), law.p(0.0, "greater")))
    return _finish(Contrast(**base, estimate=law.gain, low=law.bound(tail, "greater"), high=law.bound(tail, "less"),
                            p=p, p_holm=p, decided=False, sign="0", sentence=""))


def replicates_nothing(c: Contrast) -> bool:
    """Every seed ran the same candidates (the caller said so: ``contrast(..., replayed=True)``)
    and the seeds show zero variance: every paired difference is the same number (paired), or
    each side is one number repeated (unpaired). Then the seeds re-scored one run instead of
    replicating it, and a seed-level test would read that one draw as S independent ones (paired
    t: p = 0). Identical differences from different candidates (a key that scores 1 on every
    seed's own subset) are a replicated effect and stay decidable."""
    n = len(c.seeds) if c.paired else min(len(c.a), len(c.b))
    if not c.replayed or n < 2:
        return False
    if c.placebo is not None:  # the method's one candidate against fresh draws: one draw, repeated
        return True
    if c.paired:
        return float(np.ptp(np.subtract(c.b, c.a))) <= 1e-12
    return float(np.ptp(c.a)) <= 1e-12 and float(np.ptp(c.b)) <= 1e-12


def _finish(c: Contrast) -> Contrast:
    """Decide ``c`` from its adjusted p and interval and write its sentence. Seeds that replicate
    nothing (:func:`replicates_nothing`) decide nothing, whatever p says."""
    excludes = c.low > 0.0 or c.high < 0.0
    constant = replicates_nothing(c)
    decided = bool(c.p_holm < c.alpha and excludes and not constant)
    sign = ("+" if c.estimate > 0 else "-") if decided else "0"
    level = f"{1 - c.alpha:.0%}"
    unit = f"{len(c.seeds)} seed pairs" if c.paired else f"{len(c.a)} / {len(c.b)} seeds"
    if c.placebo is not None:
        per = sorted({len(d) for d in c.placebo})
        unit = (f"{len(c.seeds)} seeds x {'/'.join(map(str, per)) or 0} placebo draws (neutral re-wordings of the "
                "seed, fresh per seed)")
    if c.changed is not None:
        changed = sum(c.changed)
        unit = (f"the {changed} example{'s' if changed != 1 else ''} whose score changed ({c.changed[0]} up, "
                f"{c.changed[1]} down, each once over {len(c.seeds)} seed pairs)")
        if constant:
            unit = (f"one run's {changed} changed question{'s' if changed != 1 else ''} ({c.changed[0]} up, "
                    f"{c.changed[1]} down; the {len(c.seeds)} seeds replay it)")
    p = f"p = {c.p:.3g}" + (f", Holm p = {c.p_holm:.3g} over {c.family} comparisons" if c.family > 1 else "")
    if constant:
        p = f"per-question p = {c.p:.3g} (one run: not a seed-level verdict)" if c.changed is not None else \
            "no p: one run"
    facts = f"mean difference {c.estimate:+.4g}, {level} CI [{c.low:+.4g}, {c.high:+.4g}], {c.test} over {unit}, {p}"
    if decided:
        word = "higher" if sign == "+" else "lower"
        beyond = " beyond the seed's re-wording noise" if c.placebo is not None else ""
        sentence = f"{c.label}: separates{beyond} ({c.b_label} {word}): {facts}"
    else:
        n = len(c.seeds) if c.paired else min(len(c.a), len(c.b))
        if n < MIN_SEEDS:
            why = f"{n} seed{'s' if n != 1 else ''} {'paired' if c.paired else 'per side'}; a verdict needs >= {MIN_SEEDS}"
        elif constant and c.placebo is not None:
            why = ("the method ended on the same candidate in every seed: one draw repeated, not independent "
                   "ones, so against fresh placebo draws this is one run's number; make the seed drive the run "
                   "(the optimizer's own randomness, its data order)")
        elif constant and c.estimate != 0.0:
            what = "pair differs by the same amount" if c.paired else "side repeats one value"
            why = (f"every seed ran the same candidates and every {what} (zero variance): the seeds "
                   "re-scored one run instead of replicating it, so this is one run's number and a seed-level "
                   "test has no error to measure; make the seed drive the run (the optimizer's own randomness, "
                   "its data order)")
            if c.changed is not None and c.p < c.alpha:
                why += ("; within that one run the per-question evidence is overwhelming, which says the run "
                        "differs, not that the method does")
        elif n < c.min_seeds:
            what = ("placebo draws per seed" if c.placebo is not None else
                    "per-seed outcomes of any law (skewed, two-valued); a t test would assume them normal")
            why = (f"{c.test.split(' over ')[0]} cannot reach alpha = {c.alpha:g} two-sided with {n} seeds "
                   f"(smallest p {_smallest(c):.3g}); >= {c.min_seeds} seeds would, valid for {what}")
        elif c.zero_variance:
            why = ("every seed pair differs by the same amount (zero variance): the exact sign-flip counts seeds, "
                   f"not the questions inside them, and its p is not below {c.alpha:g}"
                   + (" after Holm" if c.family > 1 else ""))
        elif excludes:
            why = f"the interval excludes 0 but the Holm-adjusted p is not below {c.alpha:g}"
        else:
            why = "the interval includes 0"
        sentence = f"{c.label}: cannot separate: {why} ({facts})"
    return replace(c, decided=decided, sign=sign, sentence=sentence)


def _smallest(c: Contrast) -> float:
    """The smallest two-sided p ``c``'s exact test can print at its seed count."""
    n = len(c.seeds) if c.paired else min(len(c.a), len(c.b))
    if c.placebo is not None:
        return smallest_p([len(d) for d in c.placebo])
    if c.paired:
        return min(1.0, 2.0 / 2 ** n)
    return min(1.0, 2.0 / math.comb(len(c.a) + len(c.b), len(c.b))) if c.a and c.b else 1.0


def holm(contrasts: Sequence[Contrast], alpha: float | None = None) -> list[Contrast]:
    """The same contrasts with ``p_holm`` adjusted over all of them (Holm step-down) and
    decided again: the family is every comparison one command prints."""
    if not contrasts:
        return []
    adjusted = holm_adjust(np.array([c.p for c in contrasts]))
    out = []
    for c, p in zip(contrasts, adjusted):
        c = replace(c, p_holm=float(p), family=len(contrasts), alpha=c.alpha if alpha is None else alpha)
        out.append(_finish(c))
    return out


def describe_detectable(n_seeds: int, *, family: int = 1, n_examples: int = 2, alpha: float = DEFAULT_ALPHA,
                        power: float = 0.8, placebo_draws: int = 0) -> str:
    """What a design of ``n_seeds`` can detect, in one sentence, at the first Holm step
    (``alpha / family``, the strictest): whether its exact test can reach that level at all (and
    how many seeds would), and the smallest true mean difference, in SDs of the per-seed
    difference (Cohen's dz), it separates with probability ``power`` when per-seed outcomes are
    near normal (a t approximation of the exact test's power; skewed or two-valued outcomes need
    more). ``placebo_draws``: draws per seed of a ``placebo-floor`` design (0: sign-flip over
    seed pairs). ``n_examples`` is kept for callers that state it; it does not pick the test."""
    del n_examples
    level = alpha / max(1, family)
    over = f"at alpha {alpha:g} / {family} comparisons" if family > 1 else f"at alpha {alpha:g}"
    if n_seeds < MIN_SEEDS:
        return (f"{n_seeds} seed(s): no verdict is attempted (>= {MIN_SEEDS} needed); "
                "this design cannot separate anything")
    if placebo_draws:
        name, smallest = f"placebo floor ({placebo_draws} draw(s) per seed)", smallest_p([placebo_draws] * n_seeds)
        need = next(s for s in range(n_seeds, 200) if smallest_p([placebo_draws] * s) < level)
    else:
        name, smallest = "exact sign-flip", 2.0 / 2 ** n_seeds
        need = next(s for s in range(n_seeds, 64) if 2.0 / 2 ** s < level)
    if smallest >= level:
        return (f"{name} over {n_seeds} seeds: the smallest two-sided p is {smallest:.3g}, not below {level:.3g} "
                f"({over}); this design cannot separate anything: use >= {need} seeds")
    dz = minimum_detectable_dz(n_seeds, alpha=level, power=power, alternative="two-sided")
    return (f"{name} over {n_seeds} seeds ({over}; smallest p {smallest:.3g}) separates a true mean difference of "
            f"about {dz:.2f} SDs of the per-seed difference with probability {power:.0%} when per-seed outcomes are "
            "near normal; skewed or two-valued outcomes need more seeds")


def family(pairs: Sequence[tuple[str, str, Mapping[int, float], Mapping[int, float]]], *, n_examples: int,
           paired: bool = True, alpha: float = DEFAULT_ALPHA) -> list[Contrast]:
    """Contrasts of ``(a_label, b_label, a, b)`` pairs, Holm-adjusted together."""
    return holm([contrast(a, b, n_examples=n_examples, paired=paired, alpha=alpha, labels=(al, bl))
                 for al, bl, a, b in pairs], alpha)


__all__ = ["Contrast", "DEFAULT_ALPHA", "DEFAULT_MARGIN", "DecisionError", "MIN_SEEDS", "Margin", "MarginError",
           "RULES", "Rule", "Sign", "beyond_placebo", "changed_examples", "contrast", "describe_detectable", "family", "holm", "replicates_nothing"]
