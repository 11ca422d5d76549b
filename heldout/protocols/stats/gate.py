"""The regression gate's decision: did ``current`` get significantly worse than ``baseline``?

Pure function over paired score arrays; ``heldout check`` gathers the arrays from run records
(paired by task, example and seed) and prints :attr:`GateResult.evidence`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Hashable, Sequence

import numpy as np

from ._checks import StatsInputError, as_paired, check_alpha, check_n_boot
from .bootstrap import CHUNK_CELLS

EXACT_FLIP_LIMIT = 12
"""Up to this many clusters the sign-flip test enumerates all 2**K sign patterns (exact p);
above it, ``n_flips`` random patterns are drawn."""


@dataclass(frozen=True)
class GateResult:
    """Outcome of :func:`regression_check`. ``mean_change`` is current - baseline (negative is a
    drop); ``p_value`` is the one-sided sign-flip p for "current is worse"; ``upper_bound`` is
    the one-sided ``1 - alpha`` cluster-bootstrap upper confidence bound on the mean change.
    ``regressed`` iff ``p_value < alpha`` and ``-mean_change > min_effect``."""

    regressed: bool
    evidence: str
    n_pairs: int
    n_clusters: int
    mean_baseline: float
    mean_current: float
    mean_change: float
    upper_bound: float
    p_value: float
    p_method: str
    alpha: float
    min_effect: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _codes(labels: Sequence[Hashable] | None, n: int, name: str, *, default: np.ndarray) -> np.ndarray:
    """Labels as dense integer codes (first appearance order); ``default`` when not given."""
    if labels is None:
        return default
    labels = list(labels)
    if len(labels) != n:
        raise StatsInputError(f"{name} must give one label per paired score ({n}), got {len(labels)}")
    index: dict[Hashable, int] = {}
    try:
        return np.fromiter((index.setdefault(label, len(index)) for label in labels), dtype=np.int64, count=n)
    except TypeError as exc:
        raise StatsInputError(f"{name} labels must be hashable ({exc})") from None


def regression_check(
    baseline: Any,
    current: Any,
    *,
    alpha: float = 0.05,
    min_effect: float = 0.0,
    clusters: Sequence[Hashable] | None = None,
    strata: Sequence[Hashable] | None = None,
    n_flips: int = 10_000,
    n_boot: int = 10_000,
    seed: int = 0,
) -> GateResult:
    """Decide whether ``current`` regressed against ``baseline``.

    ``baseline[i]`` and ``current[i]`` score the same unit (task, example, seed). Pairs pooled
    from several seeds or tasks are not independent: ``clusters`` labels the units that must
    move together (e.g. ``(task, example_id)``, so one example's seeds stay together) and
    ``strata`` labels groups resampled separately so their weights stay fixed (e.g. the task);
    each cluster must lie in one stratum. Default: every pair is its own cluster, one stratum.
    ``min_effect`` is in score units (a drop of at most this much is tolerated).

    Significance comes from a one-sided sign-flip randomisation test on cluster sums of
    ``current - baseline``: under "no change" the two arms are exchangeable within each
    cluster, so flipping a cluster's sign is as likely as not and the test's type-I error is
    at most ``alpha`` at any sample size (exact up to ``EXACT_FLIP_LIMIT`` clusters, Monte Carlo
    above). The size of the change is bounded by a stratified cluster bootstrap."""
    base, cur = as_paired(baseline, current, ("baseline", "current"))
    alpha = check_alpha(alpha)
    if not math.isfinite(min_effect) or min_effect < 0:
        raise StatsInputError(f"min_effect must be a finite number >= 0, got {min_effect!r}")
    n_flips = check_n_boot(n_flips)
    n_boot = check_n_boot(n_boot)
    n = base.shape[0]
    diff = cur - base
    cluster_of = _codes(clusters, n, "clusters", default=np.arange(n))
    stratum_of = _codes(strata, n, "strata", default=np.zeros(n, dtype=np.int64))
    n_clusters = int(cluster_of.max()) + 1
    cluster_sum = np.bincount(cluster_of, weights=diff, minlength=n_clusters)
    cluster_size = np.bincount(cluster_of, minlength=n_clusters).astype(np.float64)
    cluster_stratum = np.full(n_clusters, -1)
    cluster_stratum[cluster_of] = stratum_of
    if np.any(cluster_stratum[cluster_of] != stratum_of):
        raise StatsInputError("every cluster must lie in a single stratum (a cluster's pairs carry different strata labels)")

    rng = np.random.default_rng(seed)
    p_value, p_method = _sign_flip_p(cluster_sum, n_flips, rng)
    upper = _cluster_bootstrap_upper(cluster_sum, cluster_size, cluster_stratum, n_boot, alpha, rng)
    mean_change = float(diff.mean())
    significant = p_value < alpha
    big_enough = -mean_change > min_effect
    regressed = bool(significant and big_enough)

    facts = (
        f"mean change {mean_change:+.4g} (baseline {base.mean():.4g} -> current {cur.mean():.4g}) over {n} paired "
        f"scores in {n_clusters} clusters; one-sided {p_method} p={p_value:.3g}; "
        f"{1 - alpha:.0%} upper bound on the change {upper:+.4g}"
    )
    if regressed:
        why = f"p < alpha={alpha:g} and the drop {-mean_change:.4g} exceeds min-effect {min_effect:g}"
        evidence = f"REGRESSION: {facts}; {why}"
    elif not significant:
        evidence = f"no regression: {facts}; not significant at alpha={alpha:g}"
    else:
        evidence = (
            f"no regression: {facts}; significant at alpha={alpha:g} but the drop {-mean_change:.4g} "
            f"does not exceed min-effect {min_effect:g}"
        )
    return GateResult(
        regressed=regressed,
        evidence=evidence,
        n_pairs=n,
        n_clusters=n_clusters,
        mean_baseline=float(base.mean()),
        mean_current=float(cur.mean()),
        mean_change=mean_change,
        upper_bound=upper,
        p_value=p_value,
        p_method=p_method,
        alpha=alpha,
        min_effect=float(min_effect),
    )


def _sign_flip_p(cluster_sum: np.ndarray, n_flips: int, rng: np.random.Generator) -> tuple[float, str]:
    """One-sided p for "the total change is negative": the share of sign patterns whose
    flipped total is at most the observed one."""
    k = cluster_sum.shape[0]
    observed = cluster_sum.sum()
    # Sums of the same values in another order differ by rounding; count those as ties.
    slack = 1e-9 * max(1.0, float(np.abs(cluster_sum).sum()))
    if k <= EXACT_FLIP_LIMIT:
        patterns = ((np.arange(2**k)[:, None] >> np.arange(k)) & 1) * 2 - 1
        totals = patterns @ cluster_sum
        return float(np.count_nonzero(totals <= observed + slack) / totals.shape[0]), "exact sign-flip"
    rows = max(1, CHUNK_CELLS // k)
    hits = 0
    for start in range(0, n_flips, rows):
        size = min(n_flips, start + rows) - start
        signs = rng.integers(0, 2, size=(size, k), dtype=np.int8) * 2 - 1
        hits += int(np.count_nonzero(signs @ cluster_sum <= observed + slack))
    # Counting the observed pattern itself keeps the Monte Carlo p valid (never 0).
    return float((hits + 1) / (n_flips + 1)), "sign-flip (Monte Carlo)"


def _cluster_bootstrap_upper(
    cluster_sum: np.ndarray,
    cluster_size: np.ndarray,
    cluster_stratum: np.ndarray,
    n_boot: int,
    alpha: float,
    rng: np.random.Generator,
) -> float:
    # Within each stratum draw as many clusters as it has, with replacement; the resampled
    # mean is (drawn sums) / (drawn sizes), so clusters of different sizes weigh correctly.
    totals = np.zeros(n_boot)
    sizes = np.zeros(n_boot)
    for stratum in np.unique(cluster_stratum):
        members = np.flatnonzero(cluster_stratum == stratum)
        sums_h, sizes_h = cluster_sum[members], cluster_size[members]
        k = members.shape[0]
        rows = max(1, CHUNK_CELLS // k)
        for start in range(0, n_boot, rows):
            size = min(n_boot, start + rows) - start
            drawn = rng.integers(0, k, size=(size, k))
            totals[start : start + size] += sums_h[drawn].sum(axis=1)
            sizes[start : start + size] += sizes_h[drawn].sum(axis=1)
    return float(np.quantile(totals / sizes, 1.0 - alpha))
