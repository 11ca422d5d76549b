"""The fast path: a program decoded once into integer arrays, run by a numba-compiled interpreter.

Semantics are those of :mod:`heldout.benchmarks.vliw.reference` (the executable specification);
the tests run both on the same programs and require identical cycles, pc, state, memory, scratch,
fault and slot counts.

Why it is fast: everything that depends only on the instruction is settled at decode time.
Scratch operands are immediates, so their range checks, the slot-shape checks, slot limits and
unknown engines become either a valid integer row or a FAULT row placed exactly where the
reference would raise (control effects of earlier slots in the bundle still happen).
``load_offset`` folds into ``load``, ``coreid`` into ``const 0``, ``cond_jump_rel`` into an
absolute ``cond_jump``, ``trace_write`` of a valid address into a no-op. What remains at run time
is data: memory addresses, zero divisors, jump-target sign, the cycle cap and out-of-range write
commits (emulated in first-write order like the reference's dict of pending writes).

One representational limit: immediates are int64, so a scratch address or jump target beyond
2**40 is clamped to 2**40 (still out of range / past the end, so behaviour is the same; only the
reported ``pc`` after such a jump differs from the reference's exact big integer).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from numba import njit

from heldout.benchmarks.vliw.reference import (
    ALU_OPS, CHECKED_ENGINES, DEFAULT_CYCLE_CAP, FAULT_KINDS, MASK, PAUSED, RUNNING, SCRATCH_SIZE,
    SLOT_LIMITS, STOPPED, VLEN, Fault, SimResult,
)

# -- opcodes of the decoded form -------------------------------------------------------------
# 0..12: scalar ALU op ALU_OPS[i]; 16..28: lane-wise VALU op ALU_OPS[i - 16]
OP_VALU = 16
OP_VBROADCAST, OP_MULTIPLY_ADD = 30, 31
OP_LOAD, OP_VLOAD, OP_CONST = 40, 42, 43
OP_STORE, OP_VSTORE = 50, 51
OP_SELECT, OP_VSELECT, OP_ADD_IMM, OP_HALT, OP_PAUSE = 60, 61, 62, 63, 64
OP_COND_JUMP, OP_JUMP, OP_JUMP_INDIRECT, OP_NOP = 66, 67, 68, 70
OP_FAULT = 99

FAULT_CODES: tuple[str, ...] = tuple(FAULT_KINDS)  # code = index
_F = {kind: i for i, kind in enumerate(FAULT_CODES)}
F_ZERO, F_SCRATCH, F_MEMORY, F_JUMP, F_CAP = (_F["zero_division"], _F["scratch_range"], _F["memory_range"],
                                               _F["bad_jump"], _F["cycle_cap"])
NO_FAULT = -1

S_RUNNING, S_PAUSED, S_STOPPED = 0, 1, 2
STATE_NAMES = (RUNNING, PAUSED, STOPPED)

ENGINE_INDEX = {engine: i for i, engine in enumerate(CHECKED_ENGINES)}
_BIG = 1 << 40  # operands beyond this are out of every range; clamping keeps int64 arithmetic safe


def _clamp(value: int) -> int:
    return -_BIG if value < -_BIG else (_BIG if value > _BIG else value)


@dataclass(frozen=True)
class DecodedProgram:
    """A program as integer arrays: ``code[k] = (op, a, b, c, d)``; bundle ``i`` is rows
    ``start[i]:start[i+1]``; ``charged[i]`` = it has a non-debug key; ``counts[i, e]`` = slots of
    engine ``CHECKED_ENGINES[e]`` (for utilisation); ``messages`` explain FAULT rows."""

    code: np.ndarray
    start: np.ndarray
    charged: np.ndarray
    counts: np.ndarray
    messages: dict[int, str]

    @property
    def n_bundles(self) -> int:
        return len(self.charged)


class _Decoder:
    def __init__(self) -> None:
        self.messages: dict[int, str] = {}
        self.cache: dict[tuple, tuple] = {}

    def fault_row(self, kind: str, message: str) -> tuple:
        return (OP_FAULT, _F[kind], 0, 0, 0, message)

    def encode(self, engine: str, slot: Any, index: int) -> tuple:
        """One slot -> one row (op, a, b, c, d[, message for FAULT rows])."""
        if not isinstance(slot, (list, tuple)) or not slot or not isinstance(slot[0], str):
            return self.fault_row("bad_slot", f"{engine} slot {slot!r} is not (opcode, operands...)")
        op, ops = slot[0], slot[1:]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in ops):
            return self.fault_row("bad_slot", f"{engine} slot {list(slot)!r} has a non-integer operand")
        n = len(ops)
        reads: list[tuple[int, int]] = []  # (first scratch address, width) read by the slot
        row: tuple | None = None
        if engine == "alu":
            if n == 3 and op in ALU_OPS:
                row = (ALU_OPS.index(op), ops[0], ops[1], ops[2], 0)
                reads = [(ops[1], 1), (ops[2], 1)]
        elif engine == "valu":
            if op == "vbroadcast" and n == 2:
                row = (OP_VBROADCAST, ops[0], ops[1], 0, 0)
                reads = [(ops[1], 1)]
            elif op == "multiply_add" and n == 4:
                row = (OP_MULTIPLY_ADD, ops[0], ops[1], ops[2], ops[3])
                reads = [(ops[1], VLEN), (ops[2], VLEN), (ops[3], VLEN)]
            elif op in ALU_OPS and n == 3:
                row = (OP_VALU + ALU_OPS.index(op), ops[0], ops[1], ops[2], 0)
                reads = [(ops[1], VLEN), (ops[2], VLEN)]
        elif engine == "load":
            if op == "load" and n == 2:
                row = (OP_LOAD, ops[0], ops[1], 0, 0)
                reads = [(ops[1], 1)]
            elif op == "load_offset" and n == 3:
                row = (OP_LOAD, ops[0] + ops[2], ops[1] + ops[2], 0, 0)
                reads = [(ops[1] + ops[2], 1)]
            elif op == "vload" and n == 2:
                row = (OP_VLOAD, ops[0], ops[1], 0, 0)
                reads = [(ops[1], 1)]
            elif op == "const" and n == 2:
                row = (OP_CONST, ops[0], ops[1] & MASK, 0, 0)
        elif engine == "store":
            if op == "store" and n == 2:
                row = (OP_STORE, ops[0], ops[1], 0, 0)
                reads = [(ops[0], 1), (ops[1], 1)]
            elif op == "vstore" and n == 2:
                row = (OP_VSTORE, ops[0], ops[1], 0, 0)
                reads = [(ops[0], 1), (ops[1], VLEN)]
        elif engine == "flow":
            if op == "select" and n == 4:
                row = (OP_SELECT, *ops)
                reads = [(ops[1], 1), (ops[2], 1), (ops[3], 1)]
            elif op == "vselect" and n == 4:
                row = (OP_VSELECT, *ops)
                reads = [(ops[1], VLEN), (ops[2], VLEN), (ops[3], VLEN)]
            elif op == "add_imm" and n == 3:
                row = (OP_ADD_IMM, ops[0], ops[1], ops[2] & MASK, 0)
                reads = [(ops[1], 1)]
            elif op == "halt" and n == 0:
                row = (OP_HALT, 0, 0, 0, 0)
            elif op == "pause" and n == 0:
                row = (OP_PAUSE, 0, 0, 0, 0)
            elif op == "trace_write" and n == 1:
                row = (OP_NOP, 0, 0, 0, 0)  # no architectural effect beyond its read check
                reads = [(ops[0], 1)]
            elif op == "cond_jump" and n == 2:
                row = (OP_COND_JUMP, ops[0], ops[1], 0, 0)
                reads = [(ops[0], 1)]
            elif op == "cond_jump_rel" and n == 2:
                row = (OP_COND_JUMP, ops[0], index + 1 + ops[1], 0, 0)
                reads = [(ops[0], 1)]
            elif op == "jump" and n == 1:
                if ops[0] < 0:
                    return self.fault_row("bad_jump", f"jump to negative bundle index {ops[0]}")
                row = (OP_JUMP, ops[0], 0, 0, 0)
            elif op == "jump_indirect" and n == 1:
                row = (OP_JUMP_INDIRECT, ops[0], 0, 0, 0)
                reads = [(ops[0], 1)]
            elif op == "coreid" and n == 1:
                row = (OP_CONST, ops[0], 0, 0, 0)
        if row is None:
            return self.fault_row("bad_slot", f"{engine} slot ({op!r}, {n} operands) is not a "
                                              f"{engine.upper()} form")
        for first, width in reads:
            if first < 0 or first + width > SCRATCH_SIZE:
                return self.fault_row("scratch_range", f"scratch read at {first}")
        if row[0] == OP_CONST or row[0] == OP_ADD_IMM:
            return (row[0], _clamp(row[1]), row[2], row[3], 0)
        if -_BIG <= min(row) and max(row) <= _BIG:
            return row  # the common case, checked in C
        return tuple(_clamp(v) for v in row)

    def slot_row(self, engine: str, slot: Any, index: int) -> tuple:
        # Cache by exact content; the key carries the operand types so 1, True and 1.0 differ.
        try:
            key = (engine, *slot, *map(type, slot))
        except TypeError:
            return self.encode(engine, slot, index)
        if engine == "flow" and slot and slot[0] == "cond_jump_rel":
            return self.encode(engine, slot, index)  # depends on the bundle index
        try:
            row = self.cache.get(key)
        except TypeError:  # unhashable operand
            return self.encode(engine, slot, index)
        if row is None:
            row = self.cache[key] = self.encode(engine, slot, index)
        return row


def decode(program: Sequence[Any]) -> DecodedProgram:
    """Decode ``program`` (list of bundles: mapping engine -> list of slots) once. Never raises
    for a malformed program: what is wrong becomes a FAULT row where the reference would fault."""
    if not isinstance(program, (list, tuple)):
        raise TypeError(f"a program is a list of bundles, got {type(program).__name__}")
    dec = _Decoder()
    rows: list[tuple] = []
    append = rows.append
    start = [0]
    charged = bytearray(len(program))
    n_engines = len(CHECKED_ENGINES)
    counts = [0] * (len(program) * n_engines)
    messages: dict[int, str] = {}
    limits = SLOT_LIMITS
    engine_index = ENGINE_INDEX
    cache = dec.cache
    for index, bundle in enumerate(program):
        if type(bundle) is not dict and not isinstance(bundle, Mapping):
            messages[len(rows)] = f"bundle is a {type(bundle).__name__}, not a mapping"
            append((OP_FAULT, _F["bad_bundle"], 0, 0, 0))
            start.append(len(rows))
            continue
        for engine, slots in bundle.items():
            if engine == "debug":
                continue
            charged[index] = 1
            limit = limits.get(engine) if type(engine) is str else None
            if limit is None:
                row = dec.fault_row("unknown_engine", f"unknown engine {engine!r}")
            elif type(slots) is not list and not isinstance(slots, (list, tuple)):
                row = dec.fault_row("bad_bundle", f"engine {engine!r} maps to a {type(slots).__name__}, "
                                                  "not a list of slots")
            elif len(slots) > limit:
                row = dec.fault_row("slot_overflow", f"{len(slots)} {engine} slots, limit {limit}")
            else:
                counts[index * n_engines + engine_index[engine]] += len(slots)
                row = None
                for slot in slots:
                    # fast path: a cached slot (the key carries operand types: 1, True, 1.0 differ)
                    try:
                        r = cache.get((engine, *slot, *map(type, slot)))
                    except TypeError:
                        r = None
                    if r is None:
                        r = dec.slot_row(engine, slot, index)
                    if r[0] == OP_FAULT:
                        row = r
                        break
                    append(r)
            if row is not None:
                messages[len(rows)] = row[5]
                append(row[:5])
                break  # nothing after a fault executes
        start.append(len(rows))
    code = np.array(rows, dtype=np.int64).reshape(len(rows), 5)
    return DecodedProgram(code=code, start=np.array(start, dtype=np.int64),
                          charged=np.frombuffer(bytes(charged), dtype=np.uint8).copy(),
                          counts=np.array(counts, dtype=np.int64).reshape(len(program), n_engines),
                          messages=messages)


# -- the compact form (what the sandboxed builder sends) -----------------------------------------
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
    :func:`decode` gives for the stream itself: same rows, starts, charges, counts and fault
    messages. The payload comes from the candidate's process, so it is checked as hostile input
    (types, sizes, ranges, one group per engine per bundle, no ``debug`` group) and only the raw
    stream is taken from it: every row is decoded here, each distinct (engine, slot) once by
    the same encoder as :func:`decode`, and the bundles are assembled vectorised.
    Raises :class:`CompactFormError`."""
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
    operations by number) -> what :func:`decode` gives for the stream itself. Both wire forms end
    here (the compact arrays and the marshal bytes, ``marshal_form``); the arrays' sizes and
    ranges are checked again, since they describe a hostile builder's stream.
    Raises :class:`CompactFormError`."""
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

    # per string: the engine's slot limit (-1: not an engine), its counts column; debug is never sent
    limit_of = np.array([SLOT_LIMITS.get(t, -1) if t != "debug" else -2 for t in strings] or [0], np.int64)
    column_of = np.array([ENGINE_INDEX.get(t, -1) for t in strings] or [0], np.int64)
    if n_g and (limit_of[g_engine] == -2).any():
        raise CompactFormError("a debug group was sent (debug keys are dropped before sending)")
    g_bundle = np.repeat(np.arange(n_b, dtype=np.int64), n_groups)
    if n_g and n_groups.max() > 1:
        pair = g_bundle * n_str + g_engine
        if len(np.unique(pair)) != n_g:
            raise CompactFormError("a bundle names one engine twice")

    g_limit = limit_of[g_engine] if n_g else np.zeros(0, np.int64)
    g_unknown = g_limit < 0
    g_over = ~g_unknown & (g_slots > g_limit)
    g_fault = g_unknown | g_over
    # Items in stream order: each group's header, then its slots. A bundle stops at its first
    # faulting item: a bad group header (unknown engine, too many slots) or a bad slot.
    s_group = np.repeat(np.arange(n_g, dtype=np.int64), g_slots)
    g_first_slot = np.cumsum(g_slots) - g_slots
    g_item = g_first_slot + np.arange(n_g, dtype=np.int64)
    s_item = np.arange(n_s, dtype=np.int64) + s_group + 1
    s_bundle = g_bundle[s_group]
    s_examined = ~g_fault[s_group]

    # decode each distinct (engine, slot) of the groups that are examined, with the plain encoder
    s_pair = np.full(n_s, -1, np.int64)
    examined = np.flatnonzero(s_examined)
    keys = g_engine[s_group[examined]] * max(len(u_op), 1) + slot_ids[examined]
    pair_keys, s_pair[examined] = _unique_inverse(keys, n_str * max(len(u_op), 1))
    offsets = np.concatenate(([0], np.cumsum(u_n))).tolist()
    operands = u_operands.tolist()
    u_op_l, u_n_l = u_op.tolist(), u_n.tolist()
    dec = _Decoder()
    n_p = len(pair_keys)
    p_row_list: list[tuple] = []  # one numpy array at the end: a row assignment per pair costs ~1 us
    p_fault = np.zeros(n_p, bool)
    p_rel = np.zeros(n_p, bool)
    p_rel_offset = np.zeros(n_p, np.int64)
    p_message: list[str | None] = [None] * n_p
    width = max(len(u_op), 1)
    for p, key in enumerate(pair_keys.tolist()):
        engine, u = strings[key // width], key % width
        slot = (strings[u_op_l[u]], *operands[offsets[u]:offsets[u] + u_n_l[u]])
        row = dec.encode(engine, slot, 0)
        if row[0] == OP_FAULT:
            p_fault[p] = True
            p_message[p] = row[5]
            row = row[:5]
        elif engine == "flow" and slot[0] == "cond_jump_rel":
            p_rel[p] = True  # the target depends on the bundle: index + 1 + offset, clamped
            p_rel_offset[p] = slot[2]
        p_row_list.append(row)
    p_rows = np.array(p_row_list, np.int64).reshape(n_p, 5)

    # first faulting item of each bundle (items are laid out bundle after bundle, so sorting
    # the candidates by item sorts them by bundle too)
    s_fault = np.zeros(n_s, bool)
    s_fault[examined] = p_fault[s_pair[examined]]
    f_group = np.flatnonzero(g_fault)
    f_slot = np.flatnonzero(s_fault)
    f_item = np.concatenate((g_item[f_group], s_item[f_slot]))
    f_bundle = np.concatenate((g_bundle[f_group], s_bundle[f_slot]))
    f_is_slot = np.concatenate((np.zeros(len(f_group), bool), np.ones(len(f_slot), bool)))
    f_ref = np.concatenate((f_group, f_slot))
    order = np.argsort(f_item, kind="stable")
    f_item, f_bundle, f_is_slot, f_ref = f_item[order], f_bundle[order], f_is_slot[order], f_ref[order]
    _, first = np.unique(f_bundle, return_index=True)
    f_item, f_bundle, f_is_slot, f_ref = f_item[first], f_bundle[first], f_is_slot[first], f_ref[first]
    stop = np.full(n_b, np.iinfo(np.int64).max, np.int64)
    stop[f_bundle] = f_item

    emitted = np.flatnonzero(s_examined & (s_item < stop[s_bundle]))
    rows = np.take(p_rows, s_pair[emitted], axis=0)  # 4x faster than p_rows[...] for 150k rows
    rel = p_rel[s_pair[emitted]]
    if rel.any():
        at = np.flatnonzero(rel)
        target = s_bundle[emitted[at]] + 1 + p_rel_offset[s_pair[emitted[at]]]
        rows[at, 2] = np.clip(target, -_BIG, _BIG)
    fault_rows = np.zeros((len(f_item), 5), np.int64)
    fault_rows[:, 0] = OP_FAULT
    fault_messages: list[str] = []
    for k, (is_slot, ref) in enumerate(zip(f_is_slot.tolist(), f_ref.tolist())):
        if is_slot:
            p = int(s_pair[ref])
            kind_code, text = int(p_rows[p, 1]), p_message[p]
        else:
            engine = strings[int(g_engine[ref])]
            if g_unknown[ref]:
                kind_code, text = _F["unknown_engine"], f"unknown engine {engine!r}"
            else:
                kind_code = _F["slot_overflow"]
                text = f"{int(g_slots[ref])} {engine} slots, limit {int(g_limit[ref])}"
        fault_rows[k, 1] = kind_code
        fault_messages.append(text)

    per_bundle = np.bincount(s_bundle[emitted], minlength=n_b) + (stop < np.iinfo(np.int64).max)
    start = np.zeros(n_b + 1, np.int64)
    np.cumsum(per_bundle, out=start[1:])
    messages: dict[int, str] = {}
    if len(f_item):
        items = np.concatenate((s_item[emitted], f_item))
        order = np.argsort(items, kind="stable")
        code = np.concatenate((rows, fault_rows))[order]
        position = np.empty(len(order), np.int64)
        position[order] = np.arange(len(order))
        for k, pos in enumerate(position[len(emitted):].tolist()):
            messages[pos] = fault_messages[k]
    else:
        code = rows
    counted = np.flatnonzero(~g_fault & (g_item < stop[g_bundle]))
    counts = np.zeros((n_b, len(CHECKED_ENGINES)), np.int64)
    # one flat index: a (row, column) pair of index arrays took 3x as long for 150k groups
    counts.reshape(-1)[g_bundle[counted] * len(CHECKED_ENGINES) + column_of[g_engine[counted]]] = g_slots[counted]
    return DecodedProgram(code=np.ascontiguousarray(code, dtype=np.int64).reshape(len(code), 5), start=start,
                          charged=(n_groups > 0).astype(np.uint8), counts=counts, messages=messages)


# -- the interpreter -------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _alu(op, x, y):
    """One ALU op on two words (int64 holding values < 2**32); -1 means zero divisor."""
    if op == 0:
        return (x + y) & 0xFFFFFFFF
    elif op == 1:
        return (x - y) & 0xFFFFFFFF
    elif op == 2:
        return (x * y) & 0xFFFFFFFF  # int64 wraps; the low 32 bits are still exact
    elif op == 3:
        if y == 0:
            return -1
        return x // y
    elif op == 4:
        if y == 0:
            return -1
        return (x + y - 1) // y
    elif op == 5:
        if y == 0:
            return -1
        return x % y
    elif op == 6:
        return x ^ y
    elif op == 7:
        return x & y
    elif op == 8:
        return x | y
    elif op == 9:
        if y >= 32:
            return 0
        return (x << y) & 0xFFFFFFFF
    elif op == 10:
        if y >= 32:
            return 0
        return x >> y
    elif op == 11:
        return 1 if x < y else 0
    else:
        return 1 if x == y else 0


@njit(cache=True)
def _commit(ws_a, ws_v, ns, target, size):
    """Apply pending writes in order (last writer wins). If one address is out of range, apply
    -- like a dict of pending writes -- the final value of every address first written before it,
    and return the position of the bad write; else return -1 (nothing bad)."""
    bad = -1
    for i in range(ns):
        a = ws_a[i]
        if a < 0 or a >= size:
            bad = i
            break
    if bad < 0:
        for i in range(ns):
            target[ws_a[i]] = ws_v[i]
        return -1
    for j in range(bad):
        a = ws_a[j]
        for k in range(ns - 1, -1, -1):
            if ws_a[k] == a:
                target[a] = ws_v[k]
                break
    return bad


@njit(cache=True)
def _execute(code, start, charged, scratch, mem, pc, cycle, state, cycle_cap, enable_pause, runs,
             exec_count):
    """Run the decoded program; returns (pc, cycle, state, fault code, fault bundle, detail,
    bundles executed). ``exec_count[i]`` counts commits of bundle i (for utilisation)."""
    n = charged.shape[0]
    size_mem = mem.shape[0]
    ws_a = np.empty(160, np.int64)
    ws_v = np.empty(160, np.int64)
    wm_a = np.empty(40, np.int64)
    wm_v = np.empty(40, np.int64)
    fault = -1
    fbundle = -1
    detail = 0
    executed = 0
    for _ in range(runs):
        if state == 1:
            state = 0
        while state == 0:
            if pc >= n:
                state = 2
                break
            index = pc
            if charged[index] != 0 and cycle >= cycle_cap:
                fault = 8  # cycle_cap
                fbundle = index
                break
            pc = index + 1
            ns = 0
            nm = 0
            for k in range(start[index], start[index + 1]):
                op = code[k, 0]
                a = code[k, 1]
                b = code[k, 2]
                c = code[k, 3]
                if op < 13:
                    v = _alu(op, scratch[b], scratch[c])
                    if v < 0:
                        fault = 4
                        break
                    ws_a[ns] = a
                    ws_v[ns] = v
                    ns += 1
                elif op < 30:
                    sub = op - 16
                    for i in range(8):
                        v = _alu(sub, scratch[b + i], scratch[c + i])
                        if v < 0:
                            fault = 4
                            break
                        ws_a[ns] = a + i
                        ws_v[ns] = v
                        ns += 1
                    if fault >= 0:
                        break
                elif op == 31:  # multiply_add
                    d = code[k, 4]
                    for i in range(8):
                        ws_a[ns] = a + i
                        ws_v[ns] = (((scratch[b + i] * scratch[c + i]) & 0xFFFFFFFF) + scratch[d + i]) & 0xFFFFFFFF
                        ns += 1
                elif op == 30:  # vbroadcast
                    v = scratch[b]
                    for i in range(8):
                        ws_a[ns] = a + i
                        ws_v[ns] = v
                        ns += 1
                elif op == 40:  # load (and load_offset)
                    m = scratch[b]
                    if m >= size_mem:
                        fault = 6
                        detail = m
                        break
                    ws_a[ns] = a
                    ws_v[ns] = mem[m]
                    ns += 1
                elif op == 42:  # vload
                    m = scratch[b]
                    if m + 7 >= size_mem:
                        fault = 6
                        detail = m
                        break
                    for i in range(8):
                        ws_a[ns] = a + i
                        ws_v[ns] = mem[m + i]
                        ns += 1
                elif op == 43:  # const / coreid
                    ws_a[ns] = a
                    ws_v[ns] = b
                    ns += 1
                elif op == 50:  # store
                    wm_a[nm] = scratch[a]
                    wm_v[nm] = scratch[b]
                    nm += 1
                elif op == 51:  # vstore
                    m = scratch[a]
                    for i in range(8):
                        wm_a[nm] = m + i
                        wm_v[nm] = scratch[b + i]
                        nm += 1
                elif op == 60:  # select
                    ws_a[ns] = a
                    ws_v[ns] = scratch[c] if scratch[b] != 0 else scratch[code[k, 4]]
                    ns += 1
                elif op == 61:  # vselect
                    d = code[k, 4]
                    for i in range(8):
                        ws_a[ns] = a + i
                        ws_v[ns] = scratch[c + i] if scratch[b + i] != 0 else scratch[d + i]
                        ns += 1
                elif op == 62:  # add_imm
                    ws_a[ns] = a
                    ws_v[ns] = (scratch[b] + c) & 0xFFFFFFFF
                    ns += 1
                elif op == 63:  # halt
                    state = 2
                elif op == 64:  # pause
                    if enable_pause:
                        state = 1
                elif op == 66:  # cond_jump (cond_jump_rel decoded to absolute)
                    if scratch[a] != 0:
                        if b < 0:
                            fault = 7
                            detail = b
                            break
                        pc = b
                elif op == 67:  # jump
                    pc = a
                elif op == 68:  # jump_indirect
                    pc = scratch[a]
                elif op == 70:  # nop (trace_write)
                    pass
                else:  # FAULT row decided at decode time
                    fault = a
                    detail = k
                    break
            if fault >= 0:
                fbundle = index
                break
            bad = _commit(ws_a, ws_v, ns, scratch, scratch.shape[0])
            if bad != -1:
                fault = 5
                detail = ws_a[bad]
                fbundle = index
                break
            bad = _commit(wm_a, wm_v, nm, mem, size_mem)
            if bad != -1:
                fault = 6
                detail = wm_a[bad]
                fbundle = index
                break
            exec_count[index] += 1
            executed += 1
            if charged[index] != 0:
                cycle += 1
        if fault >= 0:
            break
    return pc, cycle, state, fault, fbundle, detail, executed


def _check_codes() -> None:
    # The interpreter hard-codes fault codes for speed; keep them tied to FAULT_KINDS.
    assert (F_ZERO, F_SCRATCH, F_MEMORY, F_JUMP, F_CAP) == (4, 5, 6, 7, 8), FAULT_CODES


_check_codes()


def run_decoded(decoded: DecodedProgram, memory: Sequence[int] | np.ndarray, *, enable_pause: bool = False,
                cycle_cap: int = DEFAULT_CYCLE_CAP, scratch_init: Mapping[int, int] | None = None,
                runs: int = 1) -> SimResult:
    """Run a decoded program on a copy of ``memory``; same contract as ``simulate_reference``."""
    mem = np.array(memory, dtype=np.int64)
    scratch = np.zeros(SCRATCH_SIZE, dtype=np.int64)
    for addr, value in (scratch_init or {}).items():
        scratch[int(addr)] = int(value) & MASK
    exec_count = np.zeros(decoded.n_bundles, dtype=np.int64)
    pc, cycle, state, fault, fbundle, detail, executed = _execute(
        decoded.code, decoded.start, decoded.charged, scratch, mem, 0, 0, S_RUNNING,
        int(min(cycle_cap, 1 << 62)), bool(enable_pause), int(runs), exec_count)
    fault_obj = None
    if fault >= 0:
        fault_obj = Fault(FAULT_CODES[fault], int(fbundle), _fault_message(decoded, fault, int(detail),
                                                                           cycle_cap, len(mem)))
    counts = exec_count @ decoded.counts if decoded.n_bundles else np.zeros(len(CHECKED_ENGINES), np.int64)
    return SimResult(cycles=int(cycle), pc=int(pc), state=STATE_NAMES[state], memory=mem.tolist(),
                     scratch=scratch.tolist(), fault=fault_obj,
                     slots={e: int(counts[i]) for i, e in enumerate(CHECKED_ENGINES)}, bundles=int(executed))


def _fault_message(decoded: DecodedProgram, fault: int, detail: int, cycle_cap: int, mem_len: int) -> str:
    kind = FAULT_CODES[fault]
    if kind == "zero_division":
        return "//, % or cdiv by zero"
    if kind == "memory_range":
        return f"memory access at {detail} (memory has {mem_len} words)"
    if kind == "scratch_range":
        return f"scratch write at {detail}"
    if kind == "bad_jump":
        return f"jump to negative bundle index {detail}"
    if kind == "cycle_cap":
        return f"still running after {cycle_cap} cycles"
    return decoded.messages.get(detail, FAULT_KINDS[kind])
