"""The statistics of the topic-shared ablation (:func:`heldout.protocols.leakage.ablate`), one
subset at a time: the paired gain ``final - baseline`` over seeds x examples (:func:`subset_gain`),
whose verdict is the seed-paired contrast of :mod:`heldout.protocols.decide` (or the placebo floor
when every seed has placebo draws) and whose intervals and example-level tests are description;
and one method's rows over every subset (:class:`MethodAblation`)."""

from __future__ import annotations

import functools
import itertools
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

from heldout.contracts import HeldoutError
from heldout.protocols.decide import Contrast, beyond_placebo, contrast
from heldout.protocols.stats import mean_interval, two_level_bootstrap
from heldout.protocols.stats.paired import wilcoxon_p


@dataclass
class SubsetGain:
    """Paired gain ``final - baseline`` on one subset, over seeds x examples.

    The verdict is ``seed_contrast`` (see :attr:`separable`); everything else is description.
    ``ci_*``: a percentile interval resampling seeds, then examples (two-level, shared examples
    when every seed has the same ones, nested when the subset differs by seed; one seed: examples
    only). ``sign_test_p``: exact binomial sign test over examples (per-example gain averaged over
    seeds). ``wilcoxon_p``: signed-rank over the same. ``seed_flip_p``: exact sign-flip test
    over the per-seed mean gains (None with one seed; with < 5 seeds it cannot go below 0.0625)."""

    subset: str
    n_examples: int
    n_seeds: int
    baseline: float | None = None
    final: float | None = None
    gain: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_method: str = ""
    sign_test_p: float | None = None
    wilcoxon_p: float | None = None
    seed_flip_p: float | None = None
    wins: int = 0
    losses: int = 0
    seed_contrast: Contrast | None = None
    """The verdict: :func:`heldout.protocols.decide.contrast` of the per-seed mean scores (final
    against baseline, paired by seed), Holm-adjusted over every row the ablation prints."""

    @property
    def separable(self) -> bool:
        """Decided by the seed-paired contrast (the unit is the seed), never by the example-level
        tests above, which are description only."""
        return self.seed_contrast is not None and self.seed_contrast.decided

    @property
    def sign(self) -> str:
        """"+" / "-" when the seed-paired contrast decides, else "0" (also with no examples)."""
        return self.seed_contrast.sign if self.seed_contrast is not None else "0"

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "seed_contrast"}
        return {**out, "separable": self.separable, "sign": self.sign,
                "seed_contrast": self.seed_contrast.as_dict() if self.seed_contrast is not None else None}


def subset_gain(subset: str, cells: Sequence[Mapping[str, tuple[float, float]]], *, n_boot: int = 4000,
                ci: float = 0.95, seed: int = 0, seeds: Sequence[int] | None = None,
                replayed: bool = False, floors: Sequence[Sequence[float]] | None = None) -> SubsetGain:
    """``cells[s]`` maps example id -> (baseline score, final score) for seed ``seeds[s]``
    (default: the position). The verdict is the seed-paired contrast of the per-seed means (a
    family of one here: :func:`ablate` Holm-adjusts every row it prints together); ``replayed``:
    every seed's baseline and final candidates are the same ones (see
    :func:`heldout.protocols.decide.replicates_nothing`). ``floors[s]``: the subset's mean score
    under each placebo draw of seed ``seeds[s]`` (neutral re-wordings of the seed); when every
    seed has some, the verdict is rule ``placebo-floor`` against them instead of the seed's one draw."""
    seed_ids = list(range(len(cells))) if seeds is None else [int(s) for s in seeds]
    if len(seed_ids) != len(cells):
        raise HeldoutError(f"subset_gain: {len(cells)} cells for {len(seed_ids)} seeds")
    kept = [(sid, c) for sid, c in zip(seed_ids, cells) if c]
    cells = [c for _, c in kept]
    if kept:
        columns = [_columns(c) for _, c in kept]  # one per kept seed, in order
        base_means = {sid: float(base.mean()) for (sid, _), (base, _) in zip(kept, columns)}
        final_means = {sid: float(final.mean()) for (sid, _), (_, final) in zip(kept, columns)}
        by_seed = dict(zip(seed_ids, floors)) if floors is not None else {}
        if by_seed and all(by_seed.get(sid) for sid, _ in kept):
            contrast_ = beyond_placebo({sid: by_seed[sid] for sid, _ in kept}, final_means,
                                       n_examples=min(len(c) for c in cells), labels=("placebo", "final"),
                                       label=subset, alpha=1 - ci, replayed=replayed)
        else:
            contrast_ = contrast(base_means, final_means, n_examples=min(len(c) for c in cells),
                                 labels=("baseline", "final"), label=subset, alpha=1 - ci, replayed=replayed,
                                 examples=dict(kept))
    else:
        contrast_ = None
    ids = sorted({i for c in cells for i in c})
    out = SubsetGain(subset=subset, n_examples=len(ids), n_seeds=len(cells), seed_contrast=contrast_)
    if not cells:
        return out
    base = np.concatenate([base for base, _ in columns])
    fin = np.concatenate([final for _, final in columns])
    out.baseline, out.final, out.gain = float(base.mean()), float(fin.mean()), float((fin - base).mean())
    shared = all(set(c) == set(ids) for c in cells)
    if shared:
        a = np.array([[c[i][0] for i in ids] for c in cells])
        b = np.array([[c[i][1] for i in ids] for c in cells])
        # one row per example, its seeds contiguous: a row's mean is summed as np.mean sums a list
        per_example = np.ascontiguousarray((b - a).T).mean(axis=1)
    else:
        per_example = np.array([np.mean([c[i][1] - c[i][0] for c in cells if i in c]) for i in ids])
    out.wins, out.losses = int((per_example > 0).sum()), int((per_example < 0).sum())
    untied = out.wins + out.losses
    out.sign_test_p = _sign_test_p(out.wins, untied) if untied else 1.0
    out.wilcoxon_p = wilcoxon_p(per_example)
    if len(cells) == 1:
        interval = mean_interval(per_example, n_boot=n_boot, ci=ci, seed=seed, method="percentile")
        out.ci_low, out.ci_high, out.ci_method = interval.low, interval.high, f"examples ({interval.method})"
    elif shared:
        two = two_level_bootstrap(a, b, n_boot=n_boot, ci=ci, seed=seed, examples="shared")
        out.ci_low, out.ci_high, out.ci_method = two.ci_low, two.ci_high, "seeds x shared examples"
    else:
        out.ci_low, out.ci_high = _nested_ragged([np.array([v[1] - v[0] for v in c.values()]) for c in cells],
                                                 n_boot, ci, seed)
        out.ci_method = "seeds, then examples within seed"
    if len(cells) >= 2:
        out.seed_flip_p = _sign_flip_p(np.array([(final - base).mean() for base, final in columns]))
    return out


def _nested_ragged(diffs: list[np.ndarray], n_boot: int, ci: float, seed: int) -> tuple[float, float]:
    """Percentile interval of the cell mean when seeds hold different examples: draw seeds with
    replacement, then examples with replacement within each drawn seed."""
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    for k in range(n_boot):
        picked = [diffs[s] for s in rng.integers(0, len(diffs), len(diffs))]
        total = sum(float(d[rng.integers(0, len(d), len(d))].sum()) for d in picked)
        means[k] = total / sum(len(d) for d in picked)
    tail = (1 - ci) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def _sign_flip_p(seed_means: np.ndarray) -> float:
    """Exact two-sided sign-flip p of the mean of per-seed gains (all 2^S flips)."""
    observed = abs(seed_means.mean())
    null = np.abs((_flips(len(seed_means)) * seed_means).mean(axis=1))
    return float((null >= observed - 1e-12).mean())


@functools.lru_cache(maxsize=None)
def _flips(n_seeds: int) -> np.ndarray:
    """Every sign pattern of ``n_seeds`` seeds, one per row (read-only: it is shared by every call)."""
    flips = np.array(list(itertools.product((1.0, -1.0), repeat=n_seeds)))
    flips.flags.writeable = False
    return flips


def _columns(cell: Mapping[str, tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """One seed's baseline and final scores, each a contiguous array in the cell's order (so its
    mean is summed exactly as ``np.mean`` of the list of them is: the ablation's null simulations
    call :func:`subset_gain` thousands of times, and a list converted per mean was a fifth of that)."""
    pairs = np.array([(v[0], v[1]) for v in cell.values()])
    return np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1])


@functools.lru_cache(maxsize=4096)
def _sign_test_p(wins: int, untied: int) -> float:
    """Exact two-sided binomial sign-test p of ``wins`` of ``untied`` (a pure function of the two
    counts, which repeat across subsets and seeds)."""
    return float(scipy_stats.binomtest(wins, untied, 0.5).pvalue)


@dataclass
class MethodAblation:
    task: str
    profile: str
    method: str
    seeds: list[int]
    rows: list[SubsetGain]
    val_gain: float | None
    key_share: list[float]  # per seed
    families_memorised: list[int]  # per seed
    red_flags: list[int]  # per seed
    reading: str = ""
    reading_rule: str = ""
    topic_disjoint: bool = True
    """False when ``split check`` does not prove the profile topic-disjoint (NOT PROVEN, or no
    topic groups to prove it with): the reading then says so and never calls a gain a rule."""
    split_check: str = ""

    def row(self, subset: str) -> SubsetGain:
        return next(r for r in self.rows if r.subset == subset)

    def to_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"},
                "rows": [r.to_dict() for r in self.rows]}


__all__ = ["MethodAblation", "SubsetGain", "subset_gain"]
