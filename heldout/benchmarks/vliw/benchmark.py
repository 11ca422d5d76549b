"""The take-home benchmark: a forest of hashed node values walked by a batch of elements
(``../shared/specs/vliw.md`` section 5), written from that description.

Standard library only: this file is also shipped into the sandbox as a helper of the ``problem``
module, where kernel builders import ``Tree``, ``Input``, ``build_mem_image``,
``reference_kernel`` ... from it.

Memory image (``HEADER_WORDS`` = 7): ``[rounds, n_nodes, batch_size, forest_height,
forest_values_p, inp_indices_p, inp_values_p]``, then the node values, the batch indices (all 0)
and the batch values. Nothing follows the values array: any access past it faults.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator

MASK = 0xFFFFFFFF
HEADER_WORDS = 7
BASELINE_CYCLES = 147_734
SCORED_SHAPE = {"forest_height": 10, "batch_size": 256, "rounds": 16}

# Jenkins' 6-stage 32-bit integer hash: stage k does a = op2(op1(a, C), op3(a, s)).
HASH_STAGES: list[tuple[str, int, str, str, int]] = [
    ("+", 0x7ED55D16, "+", "<<", 12),
    ("^", 0xC761C23C, "^", ">>", 19),
    ("+", 0x165667B1, "+", "<<", 5),
    ("+", 0xD3A2646C, "^", "<<", 9),
    ("+", 0xFD7046C5, "+", "<<", 3),
    ("^", 0xB55A4F09, "^", ">>", 16),
]


def _op(op: str, x: int, y: int) -> int:
    if op == "+":
        return (x + y) & MASK
    if op == "^":
        return x ^ y
    if op == "<<":
        return (x << y) & MASK
    if op == ">>":
        return x >> y
    raise ValueError(f"hash op {op!r}")


def myhash(a: int) -> int:
    """The 6-stage hash of one word."""
    for op1, const, op2, op3, shift in HASH_STAGES:
        a = _op(op2, _op(op1, a, const), _op(op3, a, shift))
    return a


def n_nodes_for(height: int) -> int:
    return 2 ** (height + 1) - 1


@dataclass
class Tree:
    """A perfect binary tree in heap layout (children of k: 2k+1, 2k+2) of random 30-bit values."""

    height: int
    values: list[int]

    @staticmethod
    def generate(height: int, rng: random.Random | None = None) -> "Tree":
        draw = (rng or random).randint
        return Tree(height, [draw(0, 2**30 - 1) for _ in range(n_nodes_for(height))])


@dataclass
class Input:
    """A batch: every element starts at node 0 with a random 30-bit value."""

    indices: list[int]
    values: list[int]
    rounds: int

    @staticmethod
    def generate(forest: Tree, batch_size: int, rounds: int, rng: random.Random | None = None) -> "Input":
        draw = (rng or random).randint
        return Input([0] * batch_size, [draw(0, 2**30 - 1) for _ in range(batch_size)], rounds)


def step(idx: int, value: int, node_value: int, n_nodes: int) -> tuple[int, int]:
    """One element, one round: hash with the node value, go left on even, right on odd, wrap."""
    value = myhash(value ^ node_value)
    idx = 2 * idx + (1 if value % 2 == 0 else 2)
    return (0 if idx >= n_nodes else idx), value


def reference_kernel(tree: Tree, inp: Input) -> None:
    """The algorithm on the list form; updates ``inp`` in place."""
    for _ in range(inp.rounds):
        for i in range(len(inp.indices)):
            inp.indices[i], inp.values[i] = step(inp.indices[i], inp.values[i],
                                                  tree.values[inp.indices[i]], len(tree.values))


def build_mem_image(tree: Tree, inp: Input) -> list[int]:
    n_nodes, batch = len(tree.values), len(inp.indices)
    forest_p = HEADER_WORDS
    indices_p = forest_p + n_nodes
    values_p = indices_p + batch
    header = [inp.rounds, n_nodes, batch, tree.height, forest_p, indices_p, values_p]
    return header + list(tree.values) + list(inp.indices) + list(inp.values)


def values_region(mem: list[int]) -> tuple[int, int]:
    """(start, end) of the batch values in a memory image: the only words that are scored."""
    return mem[6], mem[6] + mem[2]


def run_reference_on_image(mem: list[int]) -> None:
    """The algorithm on the memory form (reads its parameters from the header); in place."""
    rounds, n_nodes, batch, _height, forest_p, indices_p, values_p = mem[:HEADER_WORDS]
    for _ in range(rounds):
        for i in range(batch):
            idx = mem[indices_p + i]
            mem[indices_p + i], mem[values_p + i] = step(idx, mem[values_p + i], mem[forest_p + idx], n_nodes)


def reference_kernel2(mem: list[int], trace: dict | None = None) -> Iterator[list[int]]:
    """Generator form used by local harnesses: yields the image before any work and at the end
    (a kernel that pauses twice is compared after each ``run()``). ``trace`` is accepted for
    compatibility and left untouched."""
    yield mem
    run_reference_on_image(mem)
    yield mem


def make_image(seed: int, forest_height: int = 10, batch_size: int = 256, rounds: int = 16) -> list[int]:
    """A seeded instance's initial memory image. Draw order is the original's (all node values,
    then all batch values), with a private ``random.Random(seed)``."""
    rng = random.Random(seed)
    tree = Tree.generate(forest_height, rng)
    inp = Input.generate(tree, batch_size, rounds, rng)
    return build_mem_image(tree, inp)


def make_instance(seed: int, forest_height: int = 10, batch_size: int = 256,
                  rounds: int = 16) -> tuple[list[int], list[int]]:
    """A seeded instance: (initial memory image, expected final batch values), by the plain
    reference walk (the harness uses the vectorised one in ``fast``; tests hold them equal)."""
    mem = make_image(seed, forest_height, batch_size, rounds)
    final = list(mem)
    run_reference_on_image(final)
    start, end = values_region(final)
    return mem, final[start:end]
