"""Deterministic rules that *drew* the shipped split profiles (they are then frozen as id lists;
loading never re-runs them, so a change here can never silently reshuffle a split).

The order is a hash order: examples sorted by ``sha256("<task>|<salt>|<id>")``. It depends on
nothing but the ids (no RNG library version, no source order), so anyone can redraw and check."""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

from heldout.contracts import DataError, Example

PROBE_POOL = "shared_topic_probe"
"""Fresh questions of training families, for the topic-shared leakage ablation."""


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
    asked = {"train": train > 0, "val": val > 0, "test": test is None or test > 0}
    _refuse_empty(task, "sized", out, asked)
    return out


def _refuse_empty(task: str, rule: str, splits: dict[str, list[str]], asked: dict[str, bool]) -> None:
    """A split the rule was asked to fill must not come out empty (a profile with an empty test
    split scores nothing; an empty train split gives the optimizer nothing to learn from)."""
    empty = [s for s, wanted in asked.items() if wanted and not splits.get(s)]
    if empty:
        sizes = "/".join(str(len(splits.get(s, []))) for s in ("train", "val", "test"))
        raise DataError(f"{task}: the {rule} profile rule leaves the {', '.join(empty)} split(s) empty "
                        f"(train/val/test = {sizes}); choose other sizes or groups")


def default_profile(task: str, ids: Sequence[str]) -> dict[str, list[str]]:
    """The ``default`` rule for every task: hash order, 20% train, 20% val, the rest test."""
    n = len(ids)
    return sized_profile(task, ids, train=n // 5, val=n // 5, test=None, salt="default")


def group_disjoint_profile(task: str, examples: Sequence[Example], fractions=(0.2, 0.2, 0.6),
                           salt: str = "topic-disjoint") -> dict[str, list[str]]:
    """Topic-disjoint: whole groups go to one split (groups in hash order, filling train, then
    val, then test to the target fractions of examples). Examples without a group are their own
    group.

    Every split with a non-zero fraction gets at least one group: a group never skips a split
    that is still empty, and when no more groups are left than empty splits, the next group goes
    to an empty split. (Both guards only act where plain filling would leave a split empty, so
    profiles that were fine before are drawn exactly as before.) Fewer groups than splits is an
    error."""
    groups: dict[str, list[str]] = {}
    for ex in examples:
        groups.setdefault(ex.group if ex.group is not None else f"__id__{ex.id}", []).append(ex.id)
    total = len(examples)
    goals = [fractions[0] * total, (fractions[0] + fractions[1]) * total]
    names = ("train", "val", "test")
    splits: dict[str, list[str]] = {name: [] for name in names}
    wanted = [name for name, fraction in zip(names, fractions) if fraction > 0]
    order = hash_order(task, groups, salt)
    filled = 0
    for position, key in enumerate(order):
        split = "train" if filled < goals[0] else "val" if filled < goals[1] else "test"
        empty = [name for name in wanted if not splits[name] and name != split]
        left_after = len(order) - position - 1
        if any(names.index(name) < names.index(split) for name in empty) or len(empty) > left_after:
            split = empty[0]
        splits[split].extend(groups[key])
        filled += len(groups[key])
    _refuse_empty(task, "topic-disjoint", splits, {name: name in wanted for name in names})
    return splits


def group_sample_profile(task: str, examples: Sequence[Example], train: int, val: int, test: int, probe: int = 0,
                         salt: str = "") -> dict[str, list[str]]:
    """A small topic-disjoint draw from a task whose groups are large (MMLU-Pro's sources hold
    37-560 questions each, so whole groups cannot make a 16-question split): one group per pool,
    test, then val, then train, each the first free group in hash order with enough items, and of
    it the first items in hash order (train: ``train + probe``, the first ``probe`` going to the
    probe pool). No group is in two pools, so the draw is topic-disjoint; the rest of each group
    stays out."""
    if min(train, val, test, probe) < 0:
        raise DataError(f"{task}: sizes must not be negative, got {train}/{val}/{test} probe {probe}")
    groups: dict[str, list[str]] = {}
    for ex in examples:
        groups.setdefault(ex.group if ex.group is not None else f"__id__{ex.id}", []).append(ex.id)
    free = hash_order(task, groups, salt)
    out: dict[str, list[str]] = {}
    for split, need in (("test", test), ("val", val), ("train", train + probe)):
        if need == 0:
            out[split] = []
            continue
        key = next((k for k in free if len(groups[k]) >= need), None)
        if key is None:
            raise DataError(f"{task}: no free group holds the {need} items {split} needs")
        free.remove(key)
        out[split] = hash_order(task, groups[key], f"{salt}|{split}")[:need]
    profile = {"train": out["train"][probe:], "val": out["val"], "test": out["test"]}
    if probe:
        profile[PROBE_POOL] = out["train"][:probe]
    return profile
