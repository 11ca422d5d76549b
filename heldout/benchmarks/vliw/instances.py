"""Scored instances: the seeded memory image and its expected final batch values, drawn in bulk
and with the forest walk vectorised over the batch in numpy.

Test instances are drawn fresh at scoring time, so each held-out scoring builds them: the plain
path of :mod:`heldout.benchmarks.vliw.benchmark` (one ``randint`` per value, one Python hash per
element per round, ~10-30 ms an instance) was half of a dense kernel's evaluation. Same draws,
same arithmetic on uint32 lanes (``+`` and ``<<`` wrap at 32 bits, ``>>`` is logical); the
tests hold both paths equal on many seeds and shapes.
"""

from __future__ import annotations

import random

import numpy as np

from heldout.benchmarks.vliw.benchmark import HASH_STAGES, HEADER_WORDS, Input, Tree, build_mem_image, n_nodes_for

VALUE_RANGE = 2**30  # node and batch values are randint(0, 2**30 - 1)

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


def seeded_values(seed: int, count: int) -> list[int]:
    """The first ``count`` values ``random.Random(seed).randint(0, 2**30 - 1)`` gives, drawn in bulk.

    ``randint`` over 2**30 values takes the top 31 bits of one Mersenne Twister word per try and
    rejects tries >= 2**30; ``getrandbits(32 * m)`` returns the next ``m`` words, least
    significant first. Words past the last accepted one are drawn too: the generator is private
    to one instance and not used afterwards. (CPython's algorithm; the tests hold the result
    equal to ``randint``'s.)"""
    rng, out = random.Random(seed), np.empty(0, dtype=np.uint32)
    while out.size < count:
        words = max(64, 2 * (count - out.size) + 64)  # about half the tries are accepted
        raw = rng.getrandbits(32 * words).to_bytes(4 * words, "little")
        tries = np.frombuffer(raw, dtype="<u4") >> np.uint32(1)
        out = np.concatenate([out, tries[tries < VALUE_RANGE]])
    return out[:count].tolist()


def make_image(seed: int, forest_height: int = 10, batch_size: int = 256, rounds: int = 16) -> list[int]:
    """The seeded initial memory image; equal to :func:`heldout.benchmarks.vliw.benchmark.make_image`
    (node values, then batch values, from one generator)."""
    n_nodes = n_nodes_for(forest_height)
    values = seeded_values(seed, n_nodes + batch_size)
    return build_mem_image(Tree(forest_height, values[:n_nodes]), Input([0] * batch_size, values[n_nodes:], rounds))


def make_instance(seed: int, forest_height: int = 10, batch_size: int = 256,
                  rounds: int = 16) -> tuple[list[int], list[int]]:
    """(initial memory image, expected final batch values) of the seeded instance; equal to
    :func:`heldout.benchmarks.vliw.benchmark.make_instance`."""
    mem = make_image(seed, forest_height, batch_size, rounds)
    return mem, reference_values(mem)


__all__ = ["make_image", "make_instance", "reference_values", "seeded_values"]
