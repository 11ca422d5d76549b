"""Scored instances: the seeded memory image and its expected final batch values, with the
forest walk vectorised over the batch in numpy.

Test instances are drawn fresh at scoring time, so their expected values are computed on every
held-out scoring: the plain walk of :mod:`heldout.benchmarks.vliw.benchmark` (one Python hash per
element per round, ~30 ms an instance) was half of a dense kernel's evaluation. Same draws, same
arithmetic on uint32 lanes (``+`` and ``<<`` wrap at 32 bits, ``>>`` is logical); the tests hold
both walks equal on many seeds and shapes.
"""

from __future__ import annotations

import numpy as np

from heldout.benchmarks.vliw.benchmark import HASH_STAGES, HEADER_WORDS, make_image

_OPS = {"+": np.add, "^": np.bitwise_xor, "<<": np.left_shift, ">>": np.right_shift}


def reference_values(mem: list[int]) -> list[int]:
    """The batch values the algorithm leaves in memory image ``mem`` (which is not changed)."""
    rounds, n_nodes, batch, _height, forest_p, indices_p, values_p = mem[:HEADER_WORDS]
    forest = np.array(mem[forest_p:forest_p + n_nodes], dtype=np.uint32)
    index = np.array(mem[indices_p:indices_p + batch], dtype=np.int64)
    value = np.array(mem[values_p:values_p + batch], dtype=np.uint32)
    stages = [(_OPS[op1], np.uint32(const), _OPS[op2], _OPS[op3], np.uint32(shift))
              for op1, const, op2, op3, shift in HASH_STAGES]
    for _ in range(rounds):
        a = value ^ forest[index]
        for op1, const, op2, op3, shift in stages:
            a = op2(op1(a, const), op3(a, shift))
        value = a
        index = 2 * index + np.where(value % 2 == 0, 1, 2)
        index[index >= n_nodes] = 0
    return [int(v) for v in value]


def make_instance(seed: int, forest_height: int = 10, batch_size: int = 256,
                  rounds: int = 16) -> tuple[list[int], list[int]]:
    """(initial memory image, expected final batch values) of the seeded instance; equal to
    :func:`heldout.benchmarks.vliw.benchmark.make_instance`."""
    mem = make_image(seed, forest_height, batch_size, rounds)
    return mem, reference_values(mem)


__all__ = ["make_instance", "reference_values"]
