"""Deterministic rules that *drew* the shipped split profiles (they are then frozen as id lists;
loading never re-runs them, so a change here can never silently reshuffle a split).

The order is a hash order: examples sorted by ``sha256("<task>|<salt>|<id>")``. It depends on
nothing but the ids (no RNG library version, no source order), so anyone can redraw and check."""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

from heldout.contracts import DataError, Example


def hash_order(task: str, ids: Iterable[str], salt: str = "") -> list[str]:
    return sorted(ids, key=lambda i: hashlib.sha256(f"{task}|{salt}|{i}".encode()).hexdigest())


def sized_profile(task: str, ids: Sequence[str], train: int, val: int, test: int | None,
                  salt: str = "") -> dict[str, list[str]]:
    """First ``train`` ids of the hash order, then ``val``, then ``test`` (None: all the rest;
    a number larger than what is left takes what is left: 'the rest up to N')."""
    order = hash_order(task, ids, salt)
    if train + val > len(order):
        raise DataError(f"{task}: {len(order)} examples cannot hold train {train} + val {val}")
    rest = order[train + val:]
    out = {"train": order[:train], "val": order[train:train + val],
           "test": rest if test is None else rest[:test]}
    return out


def default_profile(task: str, ids: Sequence[str]) -> dict[str, list[str]]:
    """The ``default`` rule for every task: hash order, 20% train, 20% val, the rest test."""
    n = len(ids)
    return sized_profile(task, ids, train=n // 5, val=n // 5, test=None, salt="default")


def group_disjoint_profile(task: str, examples: Sequence[Example], fractions=(0.2, 0.2, 0.6),
                           salt: str = "topic-disjoint") -> dict[str, list[str]]:
    """Topic-disjoint: whole groups go to one split (groups in hash order, filling train, then
    val, then test to the target fractions of examples). Examples without a group are their own
    group."""
    groups: dict[str, list[str]] = {}
    for ex in examples:
        groups.setdefault(ex.group if ex.group is not None else f"__id__{ex.id}", []).append(ex.id)
    total = len(examples)
    goals = [fractions[0] * total, (fractions[0] + fractions[1]) * total]
    splits: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    filled = 0
    for key in hash_order(task, groups, salt):
        split = "train" if filled < goals[0] else "val" if filled < goals[1] else "test"
        splits[split].extend(groups[key])
        filled += len(groups[key])
    return splits
