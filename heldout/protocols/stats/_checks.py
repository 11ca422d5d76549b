"""Input checks shared by every statistic: scores are finite floats, paired arrays line up."""

from __future__ import annotations

from typing import Any

import numpy as np

from heldout.contracts import HeldoutError


class StatsInputError(HeldoutError, ValueError):
    """Scores a statistic cannot use (NaN/inf, wrong shape, mismatched pairing, empty); the
    message names the argument and what is wrong with it."""


def as_scores(values: Any, name: str, *, ndim: int = 1, min_size: int = 1) -> np.ndarray:
    """``values`` as a float64 array of exactly ``ndim`` dimensions, every entry finite.

    A NaN is refused rather than dropped: a missing score means a missing example, and
    silently pairing the rest would change which examples the comparison is about."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise StatsInputError(f"{name}: scores must be numbers ({exc})") from None
    if array.ndim != ndim:
        raise StatsInputError(f"{name}: expected a {ndim}-d array of scores, got shape {array.shape}")
    if array.size < min_size:
        raise StatsInputError(f"{name}: needs at least {min_size} score(s), got {array.size}")
    bad = ~np.isfinite(array)
    if bad.any():
        where = [tuple(int(i) for i in idx) if ndim > 1 else int(idx[0]) for idx in np.argwhere(bad)[:5]]
        raise StatsInputError(
            f"{name}: {int(bad.sum())} score(s) are NaN or infinite (first at index {where}); "
            "re-score or drop those examples from both arms explicitly"
        )
    return array


def as_paired(a: Any, b: Any, names: tuple[str, str] = ("a", "b"), *, ndim: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Two score arrays that pair element by element (same shape, all finite)."""
    left = as_scores(a, names[0], ndim=ndim)
    right = as_scores(b, names[1], ndim=ndim)
    if left.shape != right.shape:
        raise StatsInputError(
            f"{names[0]} and {names[1]} must be paired element by element, got shapes {left.shape} and {right.shape}"
        )
    return left, right


def check_level(ci: float) -> float:
    if not 0.0 < ci < 1.0:
        raise StatsInputError(f"ci must be a confidence level strictly between 0 and 1, got {ci!r}")
    return float(ci)


def check_alpha(alpha: float) -> float:
    if not 0.0 < alpha < 1.0:
        raise StatsInputError(f"alpha must be strictly between 0 and 1, got {alpha!r}")
    return float(alpha)


def check_n_boot(n_boot: int) -> int:
    if int(n_boot) != n_boot or n_boot < 100:
        raise StatsInputError(f"n_boot must be an integer >= 100, got {n_boot!r}")
    return int(n_boot)
