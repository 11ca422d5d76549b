"""``geometry-search``: random-restart local search that only uses ``evaluate()``.

Candidates are programs returning a literal configuration (the public entry point of the task).
Circle packing: centres (from a jittered grid) are perturbed and radii re-derived so that the
packing stays valid at zero tolerance (each radius grown to its largest feasible value in turn); Heilbronn (triangle):
points perturbed and projected back into the triangle. Each evaluation is one metric call; the
best configuration seen is returned."""

from __future__ import annotations

import math

import numpy as np

from heldout.contracts import HeldoutError
from heldout.optimizers.evaluation import oriented_train_score

_MARGIN = 1e-12  # keep strictly inside the constraints so zero-tolerance checks pass in floats


def _radii(centers: np.ndarray) -> np.ndarray:
    """Feasible radii for fixed centres in the unit square: each circle in turn takes the largest
    radius the walls and the circles before it allow (so every pair satisfies r_i + r_j <= d_ij)."""
    wall = np.minimum.reduce([centers[:, 0], centers[:, 1], 1 - centers[:, 0], 1 - centers[:, 1]])
    dist = np.linalg.norm(centers[:, None] - centers[None], axis=-1)
    np.fill_diagonal(dist, np.inf)
    r = np.zeros(len(centers))
    for i in range(len(r)):
        r[i] = max(min(wall[i], float(np.min(dist[i] - r))) - _MARGIN, 0.0)
    return r


def _into_triangle(points: np.ndarray) -> np.ndarray:
    """Project into the triangle (0,0), (1,0), (1/2, sqrt(3)/2) by clipping barycentric weights."""
    h = math.sqrt(3) / 2
    b2 = points[:, 1] / h
    b1 = points[:, 0] - points[:, 1] / math.sqrt(3)
    b0 = 1 - b1 - b2
    bary = np.clip(np.stack([b0, b1, b2], axis=1), 1e-9, None)
    bary /= bary.sum(axis=1, keepdims=True)
    return np.stack([bary[:, 1] + bary[:, 2] / 2, bary[:, 2] * h], axis=1)


def _program(entry: str, rows: np.ndarray) -> str:
    literal = ",\n    ".join("[" + ", ".join(repr(float(v)) for v in row) + "]" for row in rows)
    return f"import numpy as np\n\n\ndef {entry}():\n    return np.array([\n    {literal}\n    ])\n"


SHAPES = {
    # task -> (entry point, initial configuration, perturb-and-repair)
    "circle_packing/square26": "circle_packing26",
    "heilbronn/triangle11": "heilbronn_triangle11",
}


def optimize(view, seed: int, restarts: int = 3):
    """Random-restart hill climbing. The seed drives every random choice: the jitter of each
    restart's start (the first one included) and the perturbations, so different seeds search
    differently."""
    entry = SHAPES.get(view.task_name)
    if entry is None:
        raise HeldoutError(f"geometry-search has no parameterisation for {view.task_name}; "
                           f"it knows {', '.join(SHAPES)}")
    rng = np.random.default_rng(seed)
    ids = [ex["id"] for ex in view.train]

    def make(state: np.ndarray) -> np.ndarray:
        if entry == "circle_packing26":
            return np.column_stack([state, _radii(state)])
        return state

    def fresh(restart: int) -> np.ndarray:
        if entry == "circle_packing26":  # a jittered 5x5 grid plus one circle in a gap
            grid = np.array([[0.1 + 0.2 * i, 0.1 + 0.2 * j] for i in range(5) for j in range(5)] + [[0.2, 0.2]])
            jitter = 0.0005 if restart == 0 else 0.005
            return np.clip(grid + rng.normal(0, jitter, size=grid.shape), 1e-6, 1 - 1e-6)
        return _into_triangle(rng.uniform(0, 1, size=(11, 2)) * [1, math.sqrt(3) / 2])

    def perturb(state: np.ndarray, sigma: float) -> np.ndarray:
        moved = state + rng.normal(0, sigma, size=state.shape)
        if entry == "circle_packing26":
            return np.clip(moved, 1e-6, 1 - 1e-6)
        return _into_triangle(moved)

    def score(state: np.ndarray) -> float | None:
        return oriented_train_score(view, {"program.py": _program(entry, make(state))}, ids)

    best_state, best = None, float("-inf")
    per_restart = max(1, view.remaining // max(1, len(ids)) // restarts)
    for restart in range(restarts):
        state = fresh(restart)
        current = score(state)
        if current is None:
            break
        sigma = 0.01 if entry == "circle_packing26" else 0.05
        for _ in range(per_restart - 1):
            trial = perturb(state, sigma)
            got = score(trial)
            if got is None:
                break
            if got >= current:
                state, current = trial, got
            else:
                sigma = max(sigma * 0.9, 1e-4)
        if current > best:
            best_state, best = state, current
    if best_state is None:
        return dict(view.seed_candidate)
    return {"program.py": _program(entry, make(best_state))}
