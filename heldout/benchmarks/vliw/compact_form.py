"""The compact form: the stream a sandboxed builder sends as integer arrays (see
``build_runner.compact``), and :func:`decode_wire`, where both wire forms end (the compact arrays
and the marshal bytes, :mod:`heldout.benchmarks.vliw.marshal_form`).

The arrays come from the candidate's process, so they are checked as hostile input (types, sizes,
ranges, one group per engine per bundle, no ``debug`` group) and only the raw stream is taken
from them: every row is decoded here, each distinct (engine, slot) once by the same encoder as
:func:`heldout.benchmarks.vliw.fast.decode`, and the bundles are assembled vectorised, into
exactly what ``decode`` gives for the stream itself (rows, starts, charges, counts, messages).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from heldout.benchmarks.vliw.fast import ENGINE_INDEX, IMMEDIATE_BOUND, DecodedProgram, encode_slot
from heldout.benchmarks.vliw.interpreter import FAULT_CODE, OP_FAULT
from heldout.benchmarks.vliw.reference import CHECKED_ENGINES, SLOT_LIMITS

COMPACT_FORMAT = "heldout-vliw-compact/1"
COMPACT_OPERAND_BOUND = 1 << 62
_WIRE_DTYPES = {"u1": np.dtype("u1"), "u2": np.dtype("<u2"), "i4": np.dtype("<i4"), "i8": np.dtype("<i8")}
_COMPACT_KEYS = {"format", "strings", "n_groups", "group_engine", "group_slots", "slot_ids", "unique_op",
                 "unique_n", "unique_operands"}
MAX_COMPACT_STRINGS = 1 << 20
MAX_COMPACT_COUNT = 1 << 26  # per group slots / per slot operands: keeps every sum far from int64 overflow


class CompactFormError(ValueError):
    """The compact payload is not a well-formed serialisation of some instruction stream."""


def _wire_array(payload: Mapping[str, Any], name: str, length: int | None, lo: int, hi: int) -> np.ndarray:
    """Field ``name``: ``{"dtype", "data": base64}`` -> int64 array, checked for length and range."""
    field = payload[name]
    if not isinstance(field, dict) or set(field) != {"dtype", "data"} or not isinstance(field["data"], str):
        raise CompactFormError(f"{name} is not {{dtype, data}}")
    dtype = _WIRE_DTYPES.get(field["dtype"]) if isinstance(field["dtype"], str) else None
    if dtype is None:
        raise CompactFormError(f"{name} has dtype {field['dtype']!r}, not one of {sorted(_WIRE_DTYPES)}")
    try:
        raw = base64.b64decode(field["data"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CompactFormError(f"{name} is not base64: {exc}") from None
    if len(raw) % dtype.itemsize:
        raise CompactFormError(f"{name} holds {len(raw)} bytes, not a whole number of {dtype} words")
    arr = np.frombuffer(raw, dtype=dtype).astype(np.int64)
    if length is not None and len(arr) != length:
        raise CompactFormError(f"{name} has {len(arr)} entries, expected {length}")
    if arr.size and (arr.min() < lo or arr.max() > hi):
        raise CompactFormError(f"{name} has entries outside [{lo}, {hi}]")
    return arr


def decode_compact(payload: Any, max_bundles: int) -> DecodedProgram:
    """Decode the compact form of a stream (see ``build_runner.compact``) into exactly what
    :func:`heldout.benchmarks.vliw.fast.decode` gives for the stream itself, checking the payload
    as hostile input (the module docstring says how). Raises :class:`CompactFormError`."""
    if not isinstance(payload, dict) or set(payload) != _COMPACT_KEYS or payload["format"] != COMPACT_FORMAT:
        raise CompactFormError(f"not a {COMPACT_FORMAT} payload")
    strings = payload["strings"]
    if not isinstance(strings, list) or len(strings) > MAX_COMPACT_STRINGS \
            or not all(type(t) is str for t in strings) or len(set(strings)) != len(strings):
        raise CompactFormError("strings must be a list of distinct str")
    n_str = len(strings)
    big = MAX_COMPACT_COUNT
    n_groups = _wire_array(payload, "n_groups", None, 0, n_str)
    n_b = len(n_groups)
    if n_b > max_bundles:
        raise CompactFormError(f"the program has {n_b} bundles; the cap is {max_bundles}")
    g_engine = _wire_array(payload, "group_engine", int(n_groups.sum()), 0, n_str - 1)
    g_slots = _wire_array(payload, "group_slots", len(g_engine), 0, big)
    u_op = _wire_array(payload, "unique_op", None, 0, n_str - 1)
    u_n = _wire_array(payload, "unique_n", len(u_op), 0, big)
    n_s = int(g_slots.sum()) if len(g_slots) else 0
    slot_ids = _wire_array(payload, "slot_ids", n_s, 0, len(u_op) - 1)
    u_operands = _wire_array(payload, "unique_operands", int(u_n.sum()) if len(u_n) else 0,
                             -COMPACT_OPERAND_BOUND + 1, COMPACT_OPERAND_BOUND - 1)
    return decode_wire(strings, n_groups, g_engine, g_slots, slot_ids, u_op, u_n, u_operands, max_bundles)


def _unique_inverse(keys: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` for keys in ``[0, bound)``: by a table when the
    bound is small next to the keys (a stream's engine and distinct-slot numbers: O(n), where
    sorting 150k keys took 4 ms), else by sorting."""
    if bound > 4 * len(keys) + (1 << 16):
        return np.unique(keys, return_inverse=True)
    seen = np.zeros(bound, bool)
    seen[keys] = True
    unique = np.flatnonzero(seen)
    number = np.empty(bound, np.int64)
    number[unique] = np.arange(len(unique), dtype=np.int64)
    return unique, number[keys]


def decode_wire(strings: list[str], n_groups: np.ndarray, g_engine: np.ndarray, g_slots: np.ndarray,
                slot_ids: np.ndarray, u_op: np.ndarray, u_n: np.ndarray, u_operands: np.ndarray,
                max_bundles: int) -> DecodedProgram:
    """The stream given as the compact form's arrays (int64; ``strings`` names engines and
    operations by number) -> what :func:`decode` gives for the stream itself. The arrays' sizes
    and ranges are checked again here, since they describe a hostile builder's stream.
    Raises :class:`CompactFormError`."""
    _check_wire(strings, n_groups, g_engine, g_slots, slot_ids, u_op, u_n, u_operands, max_bundles)
    items = _items(strings, n_groups, g_engine, g_slots)
    pairs = _decode_pairs(strings, items, slot_ids, u_op, u_n, u_operands)
    faults = _first_faults(items, pairs)
    return _assemble(strings, items, pairs, faults)


def _check_wire(strings: list[str], n_groups: np.ndarray, g_engine: np.ndarray, g_slots: np.ndarray,
                slot_ids: np.ndarray, u_op: np.ndarray, u_n: np.ndarray, u_operands: np.ndarray,
                max_bundles: int) -> None:
    """The arrays' sizes fit together and every entry is in its range."""
    if len(strings) > MAX_COMPACT_STRINGS or len(set(strings)) != len(strings):
        raise CompactFormError("strings must be distinct and at most 2**20")
    n_str, n_b, n_g, n_u = len(strings), len(n_groups), len(g_engine), len(u_op)
    if n_b > max_bundles:
        raise CompactFormError(f"the program has {n_b} bundles; the cap is {max_bundles}")
    n_s = int(g_slots.sum()) if n_g else 0
    consistent = (int(n_groups.sum()) == n_g and len(g_slots) == n_g and len(slot_ids) == n_s and len(u_n) == n_u
                  and (int(u_n.sum()) if n_u else 0) == len(u_operands))
    in_range = all(not len(a) or (a.min() >= lo and a.max() <= hi) for a, lo, hi in (
        (n_groups, 0, n_str), (g_engine, 0, n_str - 1), (g_slots, 0, MAX_COMPACT_COUNT),
        (u_op, 0, n_str - 1), (u_n, 0, MAX_COMPACT_COUNT), (slot_ids, 0, n_u - 1),
        (u_operands, -COMPACT_OPERAND_BOUND + 1, COMPACT_OPERAND_BOUND - 1)))
    if not (consistent and in_range):
        raise CompactFormError("the stream's arrays do not fit together")


@dataclass(frozen=True)
class _Items:
    """The stream's items in order: each group's header, then its slots (``g_*`` per group, ``s_*``
    per slot position; ``n_groups`` per bundle). A bundle stops at its first faulting item: a bad group header (unknown
    engine, too many slots: ``g_fault``) or a bad slot. ``examined``: the slot positions of the
    groups whose header is good."""

    n_groups: np.ndarray
    g_bundle: np.ndarray
    g_engine: np.ndarray
    g_slots: np.ndarray
    g_limit: np.ndarray
    g_unknown: np.ndarray
    g_fault: np.ndarray
    g_item: np.ndarray
    s_group: np.ndarray
    s_item: np.ndarray
    s_bundle: np.ndarray
    examined: np.ndarray


def _items(strings: list[str], n_groups: np.ndarray, g_engine: np.ndarray, g_slots: np.ndarray) -> _Items:
    n_b, n_g, n_str = len(n_groups), len(g_engine), len(strings)
    # per string: the engine's slot limit (-1: not an engine); debug is never sent
    limit_of = np.array([SLOT_LIMITS.get(t, -1) if t != "debug" else -2 for t in strings] or [0], np.int64)
    if n_g and (limit_of[g_engine] == -2).any():
        raise CompactFormError("a debug group was sent (debug keys are dropped before sending)")
    g_bundle = np.repeat(np.arange(n_b, dtype=np.int64), n_groups)
    if n_g and n_groups.max() > 1:
        pair = g_bundle * n_str + g_engine
        if len(np.unique(pair)) != n_g:
            raise CompactFormError("a bundle names one engine twice")
    g_limit = limit_of[g_engine] if n_g else np.zeros(0, np.int64)
    g_unknown = g_limit < 0
    g_fault = g_unknown | (~g_unknown & (g_slots > g_limit))
    s_group = np.repeat(np.arange(n_g, dtype=np.int64), g_slots)
    g_first_slot = np.cumsum(g_slots) - g_slots
    return _Items(n_groups=n_groups, g_bundle=g_bundle, g_engine=g_engine, g_slots=g_slots, g_limit=g_limit,
                  g_unknown=g_unknown, g_fault=g_fault, g_item=g_first_slot + np.arange(n_g, dtype=np.int64),
                  s_group=s_group, s_item=np.arange(len(s_group), dtype=np.int64) + s_group + 1,
                  s_bundle=g_bundle[s_group], examined=np.flatnonzero(~g_fault[s_group]))


@dataclass(frozen=True)
class _Pairs:
    """Each distinct (engine, slot) of the examined slot positions, decoded once: ``s_pair`` numbers
    the pair of each slot position (-1: not examined); ``rows`` are the encoder's rows (a FAULT
    row's message in ``message``); a ``rel`` pair is a ``cond_jump_rel``, whose target is the
    bundle index + 1 + ``rel_offset``."""

    s_pair: np.ndarray
    rows: np.ndarray
    fault: np.ndarray
    rel: np.ndarray
    rel_offset: np.ndarray
    message: list[str | None]


def _decode_pairs(strings: list[str], items: _Items, slot_ids: np.ndarray, u_op: np.ndarray, u_n: np.ndarray,
                  u_operands: np.ndarray) -> _Pairs:
    width = max(len(u_op), 1)
    s_pair = np.full(len(items.s_group), -1, np.int64)
    examined = items.examined
    keys = items.g_engine[items.s_group[examined]] * width + slot_ids[examined]
    pair_keys, s_pair[examined] = _unique_inverse(keys, len(strings) * width)
    offsets = np.concatenate(([0], np.cumsum(u_n))).tolist()
    operands = u_operands.tolist()
    u_op_l, u_n_l = u_op.tolist(), u_n.tolist()
    n_p = len(pair_keys)
    row_list: list[tuple] = []  # one numpy array at the end: a row assignment per pair costs ~1 us
    fault, rel = np.zeros(n_p, bool), np.zeros(n_p, bool)
    rel_offset = np.zeros(n_p, np.int64)
    message: list[str | None] = [None] * n_p
    for p, key in enumerate(pair_keys.tolist()):
        engine, u = strings[key // width], key % width
        slot = (strings[u_op_l[u]], *operands[offsets[u]:offsets[u] + u_n_l[u]])
        row = encode_slot(engine, slot, 0)
        if row[0] == OP_FAULT:
            fault[p] = True
            message[p] = row[5]
            row = row[:5]
        elif engine == "flow" and slot[0] == "cond_jump_rel":
            rel[p] = True  # the target depends on the bundle: index + 1 + offset, clamped
            rel_offset[p] = slot[2]
        row_list.append(row)
    return _Pairs(s_pair=s_pair, rows=np.array(row_list, np.int64).reshape(n_p, 5), fault=fault, rel=rel,
                  rel_offset=rel_offset, message=message)


@dataclass(frozen=True)
class _FirstFaults:
    """The first faulting item of each bundle that has one: its item number, bundle, whether it
    is a slot (else a group header) and which (slot position or group). ``stop[b]``: bundle b's
    first faulting item (int64 max when none)."""

    item: np.ndarray
    bundle: np.ndarray
    is_slot: np.ndarray
    ref: np.ndarray
    stop: np.ndarray


def _first_faults(items: _Items, pairs: _Pairs) -> _FirstFaults:
    s_fault = np.zeros(len(items.s_group), bool)
    s_fault[items.examined] = pairs.fault[pairs.s_pair[items.examined]]
    f_group = np.flatnonzero(items.g_fault)
    f_slot = np.flatnonzero(s_fault)
    f_item = np.concatenate((items.g_item[f_group], items.s_item[f_slot]))
    f_bundle = np.concatenate((items.g_bundle[f_group], items.s_bundle[f_slot]))
    f_is_slot = np.concatenate((np.zeros(len(f_group), bool), np.ones(len(f_slot), bool)))
    f_ref = np.concatenate((f_group, f_slot))
    # items are laid out bundle after bundle, so sorting the candidates by item sorts them by bundle too
    order = np.argsort(f_item, kind="stable")
    f_item, f_bundle, f_is_slot, f_ref = f_item[order], f_bundle[order], f_is_slot[order], f_ref[order]
    _, first = np.unique(f_bundle, return_index=True)
    stop = np.full(len(items.n_groups), np.iinfo(np.int64).max, np.int64)
    stop[f_bundle[first]] = f_item[first]
    return _FirstFaults(item=f_item[first], bundle=f_bundle[first], is_slot=f_is_slot[first], ref=f_ref[first],
                        stop=stop)


def _fault_rows(strings: list[str], items: _Items, pairs: _Pairs, faults: _FirstFaults) -> tuple[np.ndarray, list[str]]:
    """The FAULT row (and its message) that ends each faulting bundle."""
    rows = np.zeros((len(faults.item), 5), np.int64)
    rows[:, 0] = OP_FAULT
    messages: list[str] = []
    for k, (is_slot, ref) in enumerate(zip(faults.is_slot.tolist(), faults.ref.tolist())):
        if is_slot:
            p = int(pairs.s_pair[ref])
            kind_code, text = int(pairs.rows[p, 1]), pairs.message[p]
        else:
            engine = strings[int(items.g_engine[ref])]
            if items.g_unknown[ref]:
                kind_code, text = FAULT_CODE["unknown_engine"], f"unknown engine {engine!r}"
            else:
                kind_code = FAULT_CODE["slot_overflow"]
                text = f"{int(items.g_slots[ref])} {engine} slots, limit {int(items.g_limit[ref])}"
        rows[k, 1] = kind_code
        messages.append(text)
    return rows, messages


def _assemble(strings: list[str], items: _Items, pairs: _Pairs, faults: _FirstFaults) -> DecodedProgram:
    """The emitted rows (the examined slots before their bundle's stop) and the fault rows, in
    stream order; starts, charges and per-engine counts as :func:`decode` gives them."""
    n_b, stop = len(items.n_groups), faults.stop
    emitted = items.examined[items.s_item[items.examined] < stop[items.s_bundle[items.examined]]]
    rows = np.take(pairs.rows, pairs.s_pair[emitted], axis=0)  # 4x faster than rows[...] for 150k rows
    rel = pairs.rel[pairs.s_pair[emitted]]
    if rel.any():
        at = np.flatnonzero(rel)
        target = items.s_bundle[emitted[at]] + 1 + pairs.rel_offset[pairs.s_pair[emitted[at]]]
        rows[at, 2] = np.clip(target, -IMMEDIATE_BOUND, IMMEDIATE_BOUND)
    fault_rows, fault_messages = _fault_rows(strings, items, pairs, faults)
    per_bundle = np.bincount(items.s_bundle[emitted], minlength=n_b) + (stop < np.iinfo(np.int64).max)
    start = np.zeros(n_b + 1, np.int64)
    np.cumsum(per_bundle, out=start[1:])
    messages: dict[int, str] = {}
    if len(faults.item):
        order = np.argsort(np.concatenate((items.s_item[emitted], faults.item)), kind="stable")
        code = np.concatenate((rows, fault_rows))[order]
        position = np.empty(len(order), np.int64)
        position[order] = np.arange(len(order))
        for k, pos in enumerate(position[len(emitted):].tolist()):
            messages[pos] = fault_messages[k]
    else:
        code = rows
    counted = np.flatnonzero(~items.g_fault & (items.g_item < stop[items.g_bundle]))
    column_of = np.array([ENGINE_INDEX.get(t, -1) for t in strings] or [0], np.int64)
    counts = np.zeros((n_b, len(CHECKED_ENGINES)), np.int64)
    # one flat index: a (row, column) pair of index arrays took 3x as long for 150k groups
    counts.reshape(-1)[items.g_bundle[counted] * len(CHECKED_ENGINES) + column_of[items.g_engine[counted]]] = \
        items.g_slots[counted]
    return DecodedProgram(code=np.ascontiguousarray(code, dtype=np.int64).reshape(len(code), 5), start=start,
                          charged=(items.n_groups > 0).astype(np.uint8), counts=counts, messages=messages)
