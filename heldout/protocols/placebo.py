"""The placebo arm: neutral re-wordings of the seed, run as cells of the study, read as the noise floor.

A prompt task's seed candidate scored once is one draw of its wording's luck (see
:mod:`heldout.protocols.stats.floor`). Wherever a verdict compares a method with the seed, the
study also runs method ``placebo`` (:mod:`heldout.optimizers.placebo`: no metric call, one
neutral edit drawn from its seed number) ``K`` times per seed, and the verdict is rule
``placebo-floor`` (:func:`heldout.protocols.decide.beyond_placebo`).

Layout: the placebo draws of seed ``s`` are the cells of method ``placebo`` with seeds
``s * STRIDE + k`` for ``k < K``, so they are ordinary cells (ledgered, recorded, resumable) and
the stratum of a placebo run is ``seed // STRIDE``. Draws are fresh per seed, which keeps the
strata independent, as the exact stratified test needs.

How many: the fewest ``K`` whose smallest two-sided p is below a quarter of the strictest Holm
level of the command (:func:`heldout.protocols.stats.floor.draws_needed`): 3 seeds x 7 draws,
5 x 3, 10 x 1 for a family of three verdicts. Program tasks get no placebo arm: their
evaluators are deterministic and a neutral edit moves nothing, so the seed's one score is exact.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from heldout.contracts import HeldoutError
from heldout.evaluators.records import RunRecord
from heldout.protocols.stats.floor import draws_needed

SEED_METHOD = "seed"
"""The method whose one score the placebo draws stand in for: the task's seed candidate."""
PLACEBO_METHOD = "placebo"
STRIDE = 1000
"""Placebo seed = seed * STRIDE + draw: at most STRIDE draws per seed."""
MAX_DRAWS = 99


class PlaceboError(HeldoutError, ValueError):
    """A placebo design that cannot be run (the message says why, in one line)."""


def draws_for(n_seeds: int, *, family: int, alpha: float = 0.05) -> int:
    """Placebo draws per seed for a command printing ``family`` verdicts against the seed (fewer
    than 3 seeds decide nothing anyway: they get the draws 3 seeds would)."""
    return min(MAX_DRAWS, draws_needed(max(3, n_seeds), alpha, family=family))


def placebo_seeds(seeds: Iterable[int], draws: int) -> list[int]:
    """The placebo runs' seeds: ``draws`` fresh ones per seed of the study."""
    if not 1 <= draws <= MAX_DRAWS:
        raise PlaceboError(f"placebo draws per seed must be 1..{MAX_DRAWS}, got {draws}")
    return [s * STRIDE + k for s in seeds for k in range(draws)]


def stratum(seed: int) -> int:
    """The study seed a placebo run's seed belongs to."""
    return seed // STRIDE


def floor_values(records: Sequence[RunRecord], value: Callable[[RunRecord], float | None],
                 seeds: Iterable[int] | None = None) -> dict[int, list[float]]:
    """Per study seed, ``value`` of each finished placebo run of that seed (missing values left out)."""
    wanted = None if seeds is None else set(seeds)
    out: dict[int, list[float]] = {}
    for r in sorted(records, key=lambda r: r.seed):
        if r.method != PLACEBO_METHOD or r.status != "ok":
            continue
        s = stratum(r.seed)
        v = value(r)
        if v is None or (wanted is not None and s not in wanted):
            continue
        out.setdefault(s, []).append(float(v))
    return out


__all__ = ["MAX_DRAWS", "PLACEBO_METHOD", "SEED_METHOD", "STRIDE", "PlaceboError", "draws_for", "floor_values",
           "placebo_seeds", "stratum"]
