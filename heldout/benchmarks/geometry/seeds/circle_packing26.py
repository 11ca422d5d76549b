"""Seed: a 5 x 5 grid of equal circles plus one zero-radius circle in a corner (sum of radii 2.4975)."""
import numpy as np


def circle_packing26():
    r = 0.0999  # a hair under 0.1 so that float rounding of the grid never makes neighbours overlap
    rows = [[0.1 + 0.2 * i, 0.1 + 0.2 * j, r] for i in range(5) for j in range(5)]
    rows.append([0.0, 0.0, 0.0])
    return np.array(rows)
