"""Seed: a constant step function on 50 steps. `run()` returns (heights, claimed C2, loss, n_points);
the evaluator recomputes C2 from the heights and only compares the claim."""
import numpy as np


def c2(heights):
    conv = np.convolve(heights, heights)
    y = np.concatenate(([0.0], conv, [0.0]))
    h = 1.0 / (2 * len(heights))
    l2_sq = h / 3 * np.sum(y[:-1] ** 2 + y[:-1] * y[1:] + y[1:] ** 2)
    return l2_sq / (h * np.sum(conv) * np.max(conv))


def run():
    heights = np.ones(50)
    value = float(c2(heights))
    return heights, value, -value, len(heights)
