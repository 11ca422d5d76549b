"""Seed: 14 points drawn from a standard normal in 3-D with seed 42."""
import numpy as np


def min_max_dist_dim3_14():
    return np.random.default_rng(42).normal(size=(14, 3))
