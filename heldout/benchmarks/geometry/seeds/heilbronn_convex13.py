"""Seed: 13 points drawn uniformly from the unit square with seed 42."""
import numpy as np


def heilbronn_convex13():
    return np.random.default_rng(42).uniform(size=(13, 2))
