"""Validity and objective of the geometry constructions, recomputed from the raw numbers.

Rules (../shared/specs/geometry.md, "heldout's rule"): non-finite input is rejected before any
comparison; validity is checked at zero tolerance unless an explicit ``tolerance`` is given; every
quantity a program claims is recomputed here and only compared with the claim. Every function
takes plain data (lists, as they come out of the sandbox) and returns a :class:`Scored`; none of
them raises for bad input."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.spatial import ConvexHull, QhullError
from scipy.spatial.distance import pdist

AC2_MAX_STEPS = 2_000_000  # Einstein Arena's cap; FFT convolution keeps this O(N log N)
MAX_LISTED_VIOLATIONS = 10


@dataclass
class Scored:
    """One construction's verdict: ``objective`` is the recomputed raw value (0.0 when invalid)."""

    valid: bool
    objective: float = 0.0
    error: str | None = None
    error_kind: str | None = None  # "bad_output" (shape/type/non-finite) or "invalid" (geometry)
    violations: list[str] = field(default_factory=list)
    max_violation: float = 0.0  # largest amount by which a constraint is broken (<= tol if valid)
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def bad(cls, message: str) -> "Scored":
        return cls(valid=False, error=f"bad output: {message}", error_kind="bad_output")


def as_array(value: Any, shape: tuple[int | None, ...], what: str) -> np.ndarray | Scored:
    """``value`` as a finite float64 array of ``shape`` (None = any length), or a bad_output Scored."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        return Scored.bad(f"{what} is not an array of real numbers ({str(exc)[:120]})")
    if arr.ndim != len(shape) or any(s is not None and s != a for s, a in zip(shape, arr.shape)):
        want = "(" + ", ".join("N" if s is None else str(s) for s in shape) + ")"
        return Scored.bad(f"{what} has shape {arr.shape}, expected {want}")
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = np.argwhere(bad)[0].tolist()
        return Scored.bad(f"{what} holds a non-finite value ({arr[tuple(idx)]}) at index {idx}; "
                          f"{int(bad.sum())} non-finite entries in total")
    return arr


def _describe(items: list[tuple[str, float]]) -> list[str]:
    """Violations, worst first, at most MAX_LISTED_VIOLATIONS of them (plus a count of the rest)."""
    items.sort(key=lambda t: -t[1])
    out = [f"{label} by {amount:.3g}" for label, amount in items[:MAX_LISTED_VIOLATIONS]]
    if len(items) > MAX_LISTED_VIOLATIONS:
        out.append(f"... and {len(items) - MAX_LISTED_VIOLATIONS} more violations")
    return out


def _pair_overlaps(centers: np.ndarray, radii: np.ndarray, tol: float) -> tuple[list[tuple[str, float]], float]:
    i, j = np.triu_indices(len(radii), 1)
    dist = np.sqrt(((centers[i] - centers[j]) ** 2).sum(axis=1))
    excess = (radii[i] + radii[j]) - dist  # touching (excess 0) is allowed
    worst = float(excess.max()) if excess.size else -math.inf
    bad = np.nonzero(excess > tol)[0]
    return [(f"overlap: circles {i[k]} and {j[k]}", float(excess[k])) for k in bad], worst


def _check_radii(radii: np.ndarray) -> Scored | None:
    neg = np.nonzero(radii < 0)[0]
    if neg.size:
        return Scored(valid=False, error=f"invalid: {neg.size} negative radii (circle {int(neg[0])}: "
                      f"r = {radii[neg[0]]:.6g})", error_kind="invalid")
    return None


def _circles(value: Any, n: int) -> tuple[np.ndarray, np.ndarray] | Scored:
    arr = as_array(value, (n, 3), f"the packing (rows [x, y, r] of {n} circles)")
    if isinstance(arr, Scored):
        return arr
    return arr[:, :2], arr[:, 2]


def _centers_radii(centers: Any, radii: Any, n: int) -> tuple[np.ndarray, np.ndarray] | Scored:
    """The (n,2) centres and (n,) radii as finite arrays, or the Scored rejection."""
    c = as_array(centers, (n, 2), "centers")
    if isinstance(c, Scored):
        return c
    r = as_array(radii, (n,), "radii")
    if isinstance(r, Scored):
        return r
    return _check_radii(r) or (c, r)


def circles_in_square(centers: Any, radii: Any, *, n: int = 26, tol: float = 0.0) -> Scored:
    """n disjoint closed discs in the unit square; objective = Σr. Containment is
    ``r - tol <= x <= 1 - r + tol`` (same for y); non-overlap ``|ci - cj| >= ri + rj - tol``."""
    read = _centers_radii(centers, radii, n)
    if isinstance(read, Scored):
        return read
    c, r = read
    outside = np.stack([r - c[:, 0], c[:, 0] + r - 1.0, r - c[:, 1], c[:, 1] + r - 1.0], axis=1)
    sides = ("left", "right", "bottom", "top")
    items = [(f"containment: circle {k} leaves the square ({sides[s]} side)", float(outside[k, s]))
             for k, s in np.argwhere(outside > tol)]
    overlaps, worst_pair = _pair_overlaps(c, r, tol)
    violations = _describe(items + overlaps)
    worst = max(float(outside.max()), worst_pair)
    objective = float(np.sum(r))
    if violations:
        return Scored(valid=False, error=f"invalid at tolerance {tol:g}: {violations[0]}",
                      error_kind="invalid", violations=violations, max_violation=worst,
                      details={"sum_radii_if_valid": objective})
    return Scored(valid=True, objective=objective, max_violation=worst)


def circles_in_rectangle(centers: Any, radii: Any, *, n: int = 21, perimeter: float = 4.0,
                         tol: float = 0.0) -> Scored:
    """n disjoint discs in an axis-aligned rectangle of the given perimeter, aspect free: the
    rectangle is the circles' bounding box, which must satisfy ``w + h <= perimeter/2 + tol``."""
    read = _centers_radii(centers, radii, n)
    if isinstance(read, Scored):
        return read
    c, r = read
    width = float((c[:, 0] + r).max() - (c[:, 0] - r).min())
    height = float((c[:, 1] + r).max() - (c[:, 1] - r).min())
    box_excess = width + height - perimeter / 2
    items = []
    if box_excess > tol:
        items.append((f"bounding box: w + h = {width + height:.17g} exceeds {perimeter / 2:g}", box_excess))
    overlaps, worst_pair = _pair_overlaps(c, r, tol)
    violations = _describe(items + overlaps)
    objective = float(np.sum(r))
    details = {"width": width, "height": height}
    worst = max(box_excess, worst_pair)
    if violations:
        return Scored(valid=False, error=f"invalid at tolerance {tol:g}: {violations[0]}", error_kind="invalid",
                      violations=violations, max_violation=worst,
                      details={**details, "sum_radii_if_valid": objective})
    return Scored(valid=True, objective=objective, max_violation=worst, details=details)


def _triangle_areas(p: np.ndarray) -> np.ndarray:
    i, j, k = (np.array(t) for t in zip(*_triples(len(p))))
    a, b, c = p[i], p[j], p[k]
    return 0.5 * np.abs((b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (c[:, 0] - a[:, 0]) * (b[:, 1] - a[:, 1]))


def _triples(n: int) -> list[tuple[int, int, int]]:
    return [(i, j, k) for i in range(n) for j in range(i + 1, n) for k in range(j + 1, n)]


SQRT3 = math.sqrt(3.0)
UNIT_TRIANGLE_AREA = SQRT3 / 4


def heilbronn_triangle(points: Any, *, n: int = 11, tol: float = 0.0) -> Scored:
    """n points in the triangle (0,0), (1,0), (1/2, √3/2); objective = min triangle area / host
    area. Containment: ``y >= -tol``, ``√3 x <= √3 - y + tol``, ``y <= √3 x + tol``."""
    p = as_array(points, (n, 2), "points")
    if isinstance(p, Scored):
        return p
    x, y = p[:, 0], p[:, 1]
    excess = np.stack([-y, SQRT3 * x - (SQRT3 - y), y - SQRT3 * x], axis=1)
    edges = ("below the base", "beyond the right edge", "beyond the left edge")
    items = [(f"containment: point {k} lies {edges[s]}", float(excess[k, s])) for k, s in np.argwhere(excess > tol)]
    violations = _describe(items)
    worst = float(excess.max())
    if violations:
        return Scored(valid=False, error=f"invalid at tolerance {tol:g}: {violations[0]}", error_kind="invalid",
                      violations=violations, max_violation=worst)
    areas = _triangle_areas(p)
    smallest = float(areas.min())
    return Scored(valid=True, objective=smallest / UNIT_TRIANGLE_AREA, max_violation=worst,
                  details={"min_triangle_area": smallest, "host_area": UNIT_TRIANGLE_AREA})


def heilbronn_convex(points: Any, *, n: int = 13, tol: float = 0.0) -> Scored:
    """n points free in the plane; objective = min triangle area / area of their convex hull
    (affine invariant). No containment, so ``tol`` has no effect."""
    p = as_array(points, (n, 2), "points")
    if isinstance(p, Scored):
        return p
    try:
        hull = ConvexHull(p)
    except (QhullError, ValueError) as exc:
        return Scored(valid=False, error=f"invalid: the points have no 2-D convex hull ({str(exc).splitlines()[0]})",
                      error_kind="invalid")
    hull_area = float(hull.volume)
    if not hull_area > 0:
        return Scored(valid=False, error="invalid: the convex hull has zero area", error_kind="invalid")
    smallest = float(_triangle_areas(p).min())
    return Scored(valid=True, objective=smallest / hull_area,
                  details={"min_triangle_area": smallest, "hull_area": hull_area,
                           "hull_vertices": int(len(hull.vertices))})


def min_max_distance(points: Any, *, n: int = 14, d: int = 3, tol: float = 0.0) -> Scored:
    """n points in R^d; objective = (min pairwise distance / max pairwise distance)², maximised.
    Coincident points give objective 0 (valid, worthless). ``tol`` has no effect."""
    p = as_array(points, (n, d), "points")
    if isinstance(p, Scored):
        return p
    dist = pdist(p)
    dmax = float(dist.max())
    if not dmax > 0:
        return Scored(valid=False, error="invalid: all points coincide", error_kind="invalid")
    dmin = float(dist.min())
    return Scored(valid=True, objective=(dmin / dmax) ** 2,
                  details={"dmin": dmin, "dmax": dmax, "dmax_over_dmin_squared": (dmax / dmin) ** 2 if dmin else math.inf})


def autocorrelation_c2(heights: Any, *, tol: float = 0.0, max_steps: int = AC2_MAX_STEPS) -> Scored:
    """C₂ lower bound ``‖f*f‖₂² / (‖f*f‖₁ ‖f*f‖∞)`` of the step function with these heights.

    Heights must be real, finite and ``>= -tol`` (then clipped at 0), at most ``max_steps`` of
    them, not all zero. f is scaled by its maximum (so tiny values cannot underflow the ratio);
    the autoconvolution is an FFT overlap-add (O(N log N)); f*f is piecewise linear with knots
    at its samples, so the norms below are exact for the step function up to rounding."""
    if isinstance(heights, list) and len(heights) > max_steps:
        return Scored.bad(f"{len(heights)} heights exceed the cap of {max_steps}")
    h = as_array(heights, (None,), "heights")
    if isinstance(h, Scored):
        return h
    if h.size == 0:
        return Scored.bad("no heights")
    if h.size > max_steps:
        return Scored.bad(f"{h.size} heights exceed the cap of {max_steps}")
    negative = np.nonzero(h < -tol)[0]
    if negative.size:
        return Scored(valid=False, error=f"invalid at tolerance {tol:g}: {negative.size} negative heights "
                      f"(step {int(negative[0])}: {h[negative[0]]:.3g})", error_kind="invalid",
                      max_violation=float(-h.min()))
    h = np.clip(h, 0.0, None)
    top = h.max()
    if not top > 0:
        return Scored(valid=False, error="invalid: every height is zero", error_kind="invalid")
    f = h / top
    if f.size > 64:
        # imported here: scipy.signal costs about 0.9 CPU-s to import, which every process that
        # loads a geometry task paid, most of them never scoring a long step function
        from scipy.signal import oaconvolve
        conv = oaconvolve(f, f)
    else:
        conv = np.convolve(f, f)
    conv = np.clip(conv, 0.0, None)  # FFT round-off can dip below 0; the true values cannot
    y = np.concatenate(([0.0], conv, [0.0]))
    step = 1.0 / (2 * f.size)  # 2N+1 knots spanning a unit interval (the ratio is scale-free)
    l2_sq = (step / 3.0) * float(np.sum(y[:-1] ** 2 + y[:-1] * y[1:] + y[1:] ** 2))
    l1 = step * float(np.sum(conv))
    linf = float(conv.max())
    return Scored(valid=True, objective=l2_sq / (l1 * linf), details={"n_steps": int(f.size)})


__all__ = ["Scored", "as_array", "circles_in_square", "circles_in_rectangle", "heilbronn_triangle",
           "heilbronn_convex", "min_max_distance", "autocorrelation_c2", "AC2_MAX_STEPS"]
