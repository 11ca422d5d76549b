"""Verifiers: a task's canonical scoring rule, and the variants an optimisation may run under.

A variant is named by a spec string and changes only what the optimizer is shown:

=================  ==================================================================================
``decomposed``     the canonical verifier: the task's verdict as it is (score, dimensions, feedback)
``scalar``         the score alone: no dimensions, no output, the feedback reduced to the number
``coarse:K``       the score rounded to the nearest of K evenly spaced levels in [0, score ceiling],
                   shown as ``scalar`` shows the score: feedback, dimensions and output dropped
                   (each states or determines the fine score, e.g. a geometry task's "objective
                   2.4975" or an output a train target grades; kept, they would undo the rounding)
``repeated:K``     the task scored K times, the mean shown (for stochastic scorers such as judges)
``noisy:SD``       Gaussian noise of standard deviation SD on the shown score, seeded per
                   (session seed, candidate, example) so a replay shows the same numbers; shown
                   as ``scalar`` shows it, for the same reason as ``coarse:K``
``tests:NAME``     a weaker (or other) test set the task declares in ``verifier_options``
                   (MBPP+ ``tests:base-only``, Lockpicking ``tests:count-only`` ...)
=================  ==================================================================================

Each variant changes one knob on every channel the optimizer sees (score, feedback, dimensions,
output), so a contrast between two variants is about that knob. A coarse or noisy score is never
recoverable from another field: a task's feedback, dimensions and output are its own and may state
the exact score, so ``coarse:K`` and ``noisy:SD`` show nothing but their score (``scalar`` with a
rounded or noisy number; contrast them with ``scalar`` for the rounding or the noise alone, with
``decomposed`` for rounding or noise *and* the loss of feedback). Knobs combine only when named
together with ``+`` (``coarse:3+noisy:0.1``, ``tests:base-only+noisy:0.1``).
``tests/test_variant_information.py`` checks, on a prompt and a program task, that no field the
optimizer sees predicts the canonical score better than the variant's score. Whatever the variant,
the harness scores held-out results with the canonical verifier (:data:`CANONICAL`)."""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from heldout.contracts import Example, HeldoutError, Verdict

CANONICAL = "decomposed"


class UnknownVerifier(HeldoutError):
    pass


@dataclass(frozen=True)
class Variant:
    """One parsed verifier spec. ``options`` are task options for optimisation scoring only;
    ``show`` turns the verdict(s) of one example into what the optimizer sees."""

    name: str
    repeats: int = 1
    coarse_levels: int | None = None
    scalar: bool = False
    noise_sd: float = 0.0
    options: Mapping[str, Any] = field(default_factory=dict)
    ceiling: float = 1.0

    @property
    def canonical(self) -> bool:
        return self.name == CANONICAL

    @property
    def hides_detail(self) -> bool:
        """Shows the score alone (no feedback, dimensions or output): ``scalar`` by its knob,
        ``coarse``/``noisy`` because every other field may state the exact score."""
        return self.scalar or bool(self.coarse_levels) or bool(self.noise_sd)

    def show(self, verdicts: Sequence[Verdict], example: Example, *, seed: int = 0,
             candidate_id: str = "") -> Verdict:
        """What the optimizer sees of ``verdicts`` (``repeats`` scorings of one example)."""
        first = verdicts[0]
        if self.canonical:
            return first
        shown = first
        if len(verdicts) > 1:
            valid = [v for v in verdicts if v.valid]
            score = sum(v.score for v in valid) / len(verdicts) if valid else 0.0
            dims: dict[str, float] = {}
            for key in first.dimensions:
                values = [v.dimensions.get(key, 0.0) for v in verdicts]
                dims[key] = sum(values) / len(values)
            shown = replace(first, score=score if valid else 0.0, valid=bool(valid), dimensions=dims,
                            feedback=f"mean of {len(verdicts)} scorings: {score:.4g}\n{first.feedback}")
        score = shown.score
        if self.noise_sd and shown.valid:
            score += _noise(self.noise_sd, seed, candidate_id, example.id)
        if self.coarse_levels and shown.valid:
            step = self.ceiling / (self.coarse_levels - 1)
            score = min(max(round(score / step) * step, 0.0), self.ceiling)
        if not self.hides_detail:
            return replace(shown, score=score if shown.valid else 0.0)
        return Verdict(example_id=shown.example_id, score=score if shown.valid else 0.0, valid=shown.valid,
                       dimensions={}, feedback=("" if shown.valid else (shown.error or "")) +
                       (f"score {score:.4g}" if shown.valid else ""),
                       # a valid verdict's error (e.g. MBPP+ "timeout: test 7 ...") is canonical
                       # feedback; only a failure to produce an output is shown as such
                       error=None if shown.valid else shown.error,
                       error_kind=None if shown.valid else shown.error_kind, output=None, usage=shown.usage)


def _noise(sd: float, seed: int, candidate_id: str, example_id: str) -> float:
    digest = hashlib.sha256(f"{seed}|{candidate_id}|{example_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big")).gauss(0.0, sd)


def parse_verifier(spec: str | None, task_options: Mapping[str, Mapping[str, Any]] | None = None,
                   ceiling: float = 1.0) -> Variant:
    """Parse a verifier spec (see the module docstring); ``task_options`` are the task's
    ``verifier_options`` (the test sets ``tests:NAME`` may name). Raises :class:`UnknownVerifier`."""
    spec = (spec or CANONICAL).strip()
    task_options = task_options or {}
    if spec == CANONICAL:
        return Variant(CANONICAL, ceiling=ceiling)
    values: dict[str, Any] = {"repeats": 1, "coarse_levels": None, "scalar": False, "noise_sd": 0.0,
                              "options": {}}
    for part in spec.split("+"):
        kind, _, arg = part.strip().partition(":")
        try:
            if kind == CANONICAL and not arg:
                continue
            if kind == "scalar" and not arg:
                values["scalar"] = True
            elif kind == "coarse":
                levels = int(arg)
                if levels < 2:
                    raise ValueError
                values["coarse_levels"] = levels
            elif kind == "repeated":
                repeats = int(arg)
                if repeats < 1:
                    raise ValueError
                values["repeats"] = repeats
            elif kind == "noisy":
                sd = float(arg)
                if not math.isfinite(sd) or sd <= 0:
                    raise ValueError
                values["noise_sd"] = sd
            elif kind == "tests":
                if arg not in task_options:
                    raise UnknownVerifier(f"verifier {part!r}: this task has no test set {arg!r}; it has: "
                                          f"{', '.join(task_options) or 'none'}")
                values["options"] = {**values["options"], **task_options[arg]}
            else:
                raise UnknownVerifier(f"unknown verifier {part!r}: use decomposed, scalar, coarse:K, repeated:K, "
                                      f"noisy:SD or tests:NAME (this task: {', '.join(task_options) or 'none'})")
        except ValueError:
            raise UnknownVerifier(f"verifier {part!r}: K must be an integer >= 2 for coarse, >= 1 for repeated; "
                                  "SD a positive number") from None
    return Variant(spec, ceiling=ceiling, **values)


def describe_variants() -> str:
    return ("decomposed (canonical), scalar, coarse:K, repeated:K, noisy:SD, tests:NAME; compose with +; "
            "scalar, coarse and noisy show the score alone (no feedback, dimensions or output)")


__all__ = ["CANONICAL", "UnknownVerifier", "Variant", "describe_variants", "parse_verifier"]
