"""The regression gate's margin: the largest drop a task may show and still pass, on its own scale.

One absolute number cannot serve tasks of different scales: a margin of 0.01 is 1% of a
Lockpicking score near 1 and five times a whole Heilbronn score near 0.002 (a 76% collapse there
passed as "equivalent"). A :class:`Margin` is therefore given in one of four forms and applied per
task:

* ``absolute`` (``0.01``): score units, the same for every task;
* ``relative`` (``5%``): that fraction of the task's baseline score. Tested exactly, as a
  fraction-retention hypothesis: H0 ``mean(cur) <= (1 - r) * mean(base)`` is the ordinary test of
  ``cur`` against the baseline scaled by ``1 - r`` (per run, so pairing is kept): no estimated
  margin enters the test;
* ``headroom`` (``10% headroom``): that fraction of the baseline's distance to the task's ceiling
  ``C``: H0 ``mean(cur) <= mean(base) - h * (C - mean(base))``, again exact, against the
  per-run line ``(1 + h) * base - h * C``;
* ``sd`` (``0.5sd``): that many run-to-run SDs: a standardised difference, H0
  ``(mean(cur) - mean(base)) / sd <= -k``. The SD is estimated from the same runs, so it cannot be
  used as a fixed margin (an SD from 3 runs is often half the true one: the old rule called
  regressions 0.060-0.079 of the time at a true drop of 0.5 SD, nominal 0.05). It is tested
  exactly, under normal run scores of one SD, by the noncentral t of the two arms' runs with the
  pooled SD (:func:`sd_margin_p`); seed pairing is not used (the pair correlation would change
  what "one SD" means; correlated pairs make the test conservative).

**No margin tolerates a collapse** (:data:`MAX_DROP_SHARE`). Whatever the form, the tolerated
drop is at most half the baseline's score above 0 (every shipped task scores >= 0): a headroom
margin on a task whose seed sits at 1.5% of its ceiling (Heilbronn) would otherwise tolerate a
drop 6.5 times the whole score, and a collapse to 0 passed. Where the form would tolerate more,
the gate applies the ``50%`` relative margin instead (exact, as above) and says so; a current
mean of 0, or any drop larger than the baseline itself, can then never pass.

:meth:`Margin.lower_line` gives the per-run scores the current runs are tested against (the
baseline moved down by the margin); :meth:`Margin.upper_line` the baseline moved up (for
equivalence); :meth:`Margin.resolve` the margin in score units at the observed baseline mean, for
the evidence.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as scipy_stats

from ._checks import StatsInputError

MarginKind = Literal["absolute", "relative", "headroom", "sd"]

DEFAULT_MARGIN = "5%"
"""The gate's default tolerated drop: 5% of each task's baseline score, so a task whose scores are
~0.002 (Heilbronn) and one near 1 (Lockpicking) are held to the same standard."""

_FORM = re.compile(r"^\s*(?:(?P<pct>[0-9]*\.?[0-9]+)\s*%\s*(?P<of>(?:of\s+)?headroom)?"
                   r"|(?P<sd>[0-9]*\.?[0-9]+)\s*sd|(?P<abs>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?))\s*$",
                   re.IGNORECASE)


MAX_DROP_SHARE = 0.5
"""The largest share of the baseline's score (above 0) any margin may tolerate losing: a margin
that would tolerate more is replaced by the ``50%`` relative one, so a collapse never passes."""


class MarginError(StatsInputError):
    """A margin that cannot be read, or cannot be applied to a task (no ceiling, one run)."""


@dataclass(frozen=True)
class Margin:
    """A tolerated drop in one of the forms of the module docstring."""

    kind: MarginKind
    value: float

    def __post_init__(self) -> None:
        if self.kind not in ("absolute", "relative", "headroom", "sd"):
            raise MarginError(f"unknown margin kind {self.kind!r}")
        if not math.isfinite(self.value) or self.value < 0:
            raise MarginError(f"min_effect must be a finite number >= 0, got {self.value!r}")
        if self.kind in ("relative", "headroom") and self.value >= 1:
            raise MarginError(f"a {self.kind} margin is a fraction below 100%, got {self.value:.0%}")

    @classmethod
    def parse(cls, text: "str | float | Margin") -> "Margin":
        """``0.01``, ``5%``, ``10% headroom`` or ``0.5sd`` (a float is absolute)."""
        if isinstance(text, Margin):
            return text
        if isinstance(text, (int, float)) and not isinstance(text, bool):
            return cls("absolute", float(text))
        m = _FORM.match(str(text))
        if not m:
            raise MarginError(f"--min-effect must be a number (score units), 'P%' (of the baseline's score), "
                              f"'P% headroom' (of the baseline's distance to the ceiling) or 'Ksd' "
                              f"(run-to-run SDs of the baseline), got {text!r}")
        if m.group("pct") is not None:
            return cls("headroom" if m.group("of") else "relative", float(m.group("pct")) / 100.0)
        if m.group("sd") is not None:
            return cls("sd", float(m.group("sd")))
        return cls("absolute", float(m.group("abs")))

    def _sd(self, base: np.ndarray) -> float:
        if base.shape[-1] < 2:
            raise MarginError("an SD margin needs >= 2 baseline runs to measure their run-to-run SD")
        return float(np.std(base, ddof=1))

    def _ceiling(self, ceiling: float | None) -> float:
        if ceiling is None or not math.isfinite(ceiling):
            raise MarginError("a headroom margin needs the task's score ceiling, which this task does not "
                              "declare; give the margin as a number or a percentage of the baseline")
        return float(ceiling)

    def lower_line(self, base: np.ndarray, ceiling: float | None = None) -> np.ndarray:
        """Per-run scores the current runs must beat to be non-inferior: the baseline moved down
        by the margin (``base - m``, ``(1 - r) * base`` for a baseline >= 0, ...)."""
        base = np.asarray(base, dtype=np.float64)
        if self.kind == "absolute":
            return base - self.value
        if self.kind == "relative":
            return base - self.value * np.abs(base) if float(np.mean(base)) < 0 else (1 - self.value) * base
        if self.kind == "headroom":
            c = self._ceiling(ceiling)
            return (1 + self.value) * base - self.value * c
        return base - self.value * self._sd(base)  # description only: the test is sd_margin_p

    def capped(self, base: np.ndarray, ceiling: float | None = None) -> "Margin":
        """The margin the gate applies: this one, or the ``MAX_DROP_SHARE`` relative margin when
        this one, at the observed baseline mean, would tolerate losing more than that share of a
        positive baseline score (a baseline mean <= 0 has no score left to protect)."""
        base = np.asarray(base, dtype=np.float64)
        mean = float(np.mean(base))
        if mean <= 0 or self.resolve(base, ceiling) <= MAX_DROP_SHARE * mean * (1 + 1e-12):
            return self
        return Margin("relative", MAX_DROP_SHARE)

    def upper_line(self, base: np.ndarray, ceiling: float | None = None) -> np.ndarray:
        """The baseline moved up by the margin (the equivalence test's other side)."""
        base = np.asarray(base, dtype=np.float64)
        return 2 * base - self.lower_line(base, ceiling)

    def resolve(self, base: np.ndarray, ceiling: float | None = None) -> float:
        """The margin in score units at the observed baseline mean (for the evidence)."""
        base = np.asarray(base, dtype=np.float64)
        return float(np.mean(base) - np.mean(self.lower_line(base, ceiling)))

    def resolve_runs(self, base: np.ndarray, cur: np.ndarray, ceiling: float | None = None) -> float:
        """The margin in score units for the evidence; an SD margin uses the pooled SD of both
        arms' runs, the SD its test standardises by."""
        if self.kind == "sd":
            return self.value * pooled_sd(np.asarray(base, dtype=np.float64), np.asarray(cur, dtype=np.float64))
        return self.resolve(base, ceiling)

    def __str__(self) -> str:
        return {"absolute": f"{self.value:g}", "relative": f"{self.value * 100:g}%",
                "headroom": f"{self.value * 100:g}% headroom", "sd": f"{self.value:g}sd"}[self.kind]

    def describe(self) -> str:
        return {"absolute": f"{self.value:g} in score units",
                "relative": f"{self.value:.0%} of the baseline's score",
                "headroom": f"{self.value:.0%} of the baseline's headroom to the ceiling",
                "sd": f"{self.value:g} pooled run-to-run SD (a standardised difference, noncentral t)"}[self.kind]


def pooled_sd(base: np.ndarray, cur: np.ndarray) -> float:
    """The two arms' pooled run-to-run SD (``nb + nc - 2`` degrees of freedom)."""
    nb, nc = base.shape[-1], cur.shape[-1]
    if nb < 2:
        raise MarginError("an SD margin needs >= 2 baseline runs to measure their run-to-run SD")
    ss = float(np.sum((base - base.mean()) ** 2) + np.sum((cur - cur.mean()) ** 2))
    return math.sqrt(ss / (nb + nc - 2))


def sd_margin_p(base: np.ndarray, cur: np.ndarray, k: float, side: str) -> float:
    """One-sided p of H1 ``(mean(cur) - mean(base)) / sd < -k`` (``side="less"``) or ``> -k``
    (``"greater"``); with ``k`` negated, the equivalence test's upper side. The statistic is the
    pooled two-sample t, whose law at the boundary is the noncentral t with ``nb + nc - 2`` df and
    noncentrality ``-k / sqrt(1/nb + 1/nc)``: exact for normal runs of one SD, whatever that SD is
    (an SD plugged in as a fixed margin is not). Zero spread is decided by the point."""
    base = np.asarray(base, dtype=np.float64)
    cur = np.asarray(cur, dtype=np.float64)
    nb, nc = base.shape[-1], cur.shape[-1]
    sp = pooled_sd(base, cur)
    change = float(cur.mean() - base.mean())
    if sp == 0.0:
        return 0.0 if (change < 0 if side == "less" else change > 0) else 1.0
    scale = math.sqrt(1.0 / nb + 1.0 / nc)
    t, nc_ = change / (sp * scale), -k / scale
    df = nb + nc - 2
    return float(scipy_stats.nct.cdf(t, df, nc_) if side == "less" else scipy_stats.nct.sf(t, df, nc_))
