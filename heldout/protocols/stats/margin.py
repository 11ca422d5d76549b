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
* ``sd`` (``0.5sd``): that many run-to-run SDs of the baseline's per-run scores. The SD is
  estimated from the same runs, so this form is approximate (documented; prefer the others).

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

from ._checks import StatsInputError

MarginKind = Literal["absolute", "relative", "headroom", "sd"]

DEFAULT_MARGIN = "5%"
"""The gate's default tolerated drop: 5% of each task's baseline score, so a task whose scores are
~0.002 (Heilbronn) and one near 1 (Lockpicking) are held to the same standard."""

_FORM = re.compile(r"^\s*(?:(?P<pct>[0-9]*\.?[0-9]+)\s*%\s*(?P<of>(?:of\s+)?headroom)?"
                   r"|(?P<sd>[0-9]*\.?[0-9]+)\s*sd|(?P<abs>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?))\s*$",
                   re.IGNORECASE)


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
        return base - self.value * self._sd(base)

    def upper_line(self, base: np.ndarray, ceiling: float | None = None) -> np.ndarray:
        """The baseline moved up by the margin (the equivalence test's other side)."""
        base = np.asarray(base, dtype=np.float64)
        return 2 * base - self.lower_line(base, ceiling)

    def resolve(self, base: np.ndarray, ceiling: float | None = None) -> float:
        """The margin in score units at the observed baseline mean (for the evidence)."""
        base = np.asarray(base, dtype=np.float64)
        return float(np.mean(base) - np.mean(self.lower_line(base, ceiling)))

    def __str__(self) -> str:
        return {"absolute": f"{self.value:g}", "relative": f"{self.value * 100:g}%",
                "headroom": f"{self.value * 100:g}% headroom", "sd": f"{self.value:g}sd"}[self.kind]

    def describe(self) -> str:
        return {"absolute": f"{self.value:g} in score units",
                "relative": f"{self.value:.0%} of the baseline's score",
                "headroom": f"{self.value:.0%} of the baseline's headroom to the ceiling",
                "sd": f"{self.value:g} run-to-run SD of the baseline (estimated: approximate)"}[self.kind]
