"""Seed: a 7 x 3 grid of equal circles; its bounding box has w + h = 1.9996 <= 2 (sum of radii 2.0979)."""
import numpy as np


def circle_packing21():
    r = 0.0999
    return np.array([[0.1 + 0.2 * i, 0.1 + 0.2 * j, r] for i in range(7) for j in range(3)])
