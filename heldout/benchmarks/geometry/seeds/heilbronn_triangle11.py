"""Seed: 11 points drawn uniformly (fixed seed) inside the triangle (0,0), (1,0), (1/2, sqrt(3)/2)."""
import numpy as np


def heilbronn_triangle11():
    rng = np.random.default_rng(0)
    u, v = rng.uniform(0.05, 0.95, size=(2, 11))
    flip = u + v > 1
    u[flip], v[flip] = 1 - u[flip], 1 - v[flip]
    a, b = np.array([1.0, 0.0]), np.array([0.5, np.sqrt(3) / 2])
    return u[:, None] * a + v[:, None] * b
