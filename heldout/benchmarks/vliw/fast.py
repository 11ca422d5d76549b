"""The fast path: a program decoded once into integer arrays, run by the numba-compiled
interpreter (:mod:`heldout.benchmarks.vliw.interpreter`).

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

The streams a sandboxed builder sends are decoded to the same arrays by
:mod:`heldout.benchmarks.vliw.compact_form` (and :mod:`heldout.benchmarks.vliw.marshal_form`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from heldout.benchmarks.vliw.interpreter import (
    FAULT_CODE, FAULT_CODES, OP_ADD_IMM, OP_COND_JUMP, OP_CONST, OP_FAULT, OP_HALT, OP_JUMP, OP_JUMP_INDIRECT,
    OP_LOAD, OP_MULTIPLY_ADD, OP_NOP, OP_PAUSE, OP_SELECT, OP_STORE, OP_VALU, OP_VBROADCAST, OP_VLOAD,
    OP_VSELECT, OP_VSTORE, S_RUNNING, execute,
)
from heldout.benchmarks.vliw.reference import (
    ALU_OPS, CHECKED_ENGINES, DEFAULT_CYCLE_CAP, FAULT_KINDS, MASK, PAUSED, RUNNING, SCRATCH_SIZE,
    SLOT_LIMITS, STOPPED, VLEN, Fault, SimResult,
)

STATE_NAMES = (RUNNING, PAUSED, STOPPED)  # by the interpreter's state code
ENGINE_INDEX = {engine: i for i, engine in enumerate(CHECKED_ENGINES)}
IMMEDIATE_BOUND = 1 << 40  # operands beyond this are out of every range; clamping keeps int64 arithmetic safe


def _clamp(value: int) -> int:
    return -IMMEDIATE_BOUND if value < -IMMEDIATE_BOUND else (IMMEDIATE_BOUND if value > IMMEDIATE_BOUND else value)


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


Row = tuple  # (op, a, b, c, d), or (OP_FAULT, fault code, 0, 0, 0, message)
Reads = tuple[tuple[int, int], ...]  # (first scratch address, width) of each scratch read of a slot
SlotForm = tuple[int, Callable[[Sequence[int], int], tuple[Row, Reads]]]


def _slot_forms() -> dict[tuple[str, str], SlotForm]:
    """(engine, opcode) -> (operand count, operands and bundle index -> (row, scratch reads))."""
    forms: dict[tuple[str, str], SlotForm] = {}
    for code, name in enumerate(ALU_OPS):
        forms["alu", name] = (3, lambda o, i, code=code: ((code, o[0], o[1], o[2], 0), ((o[1], 1), (o[2], 1))))
        forms["valu", name] = (3, lambda o, i, code=code: ((OP_VALU + code, o[0], o[1], o[2], 0),
                                                            ((o[1], VLEN), (o[2], VLEN))))
    forms.update({
        ("valu", "vbroadcast"): (2, lambda o, i: ((OP_VBROADCAST, o[0], o[1], 0, 0), ((o[1], 1),))),
        ("valu", "multiply_add"): (4, lambda o, i: ((OP_MULTIPLY_ADD, o[0], o[1], o[2], o[3]),
                                                    ((o[1], VLEN), (o[2], VLEN), (o[3], VLEN)))),
        ("load", "load"): (2, lambda o, i: ((OP_LOAD, o[0], o[1], 0, 0), ((o[1], 1),))),
        ("load", "load_offset"): (3, lambda o, i: ((OP_LOAD, o[0] + o[2], o[1] + o[2], 0, 0), ((o[1] + o[2], 1),))),
        ("load", "vload"): (2, lambda o, i: ((OP_VLOAD, o[0], o[1], 0, 0), ((o[1], 1),))),
        ("load", "const"): (2, lambda o, i: ((OP_CONST, o[0], o[1] & MASK, 0, 0), ())),
        ("store", "store"): (2, lambda o, i: ((OP_STORE, o[0], o[1], 0, 0), ((o[0], 1), (o[1], 1)))),
        ("store", "vstore"): (2, lambda o, i: ((OP_VSTORE, o[0], o[1], 0, 0), ((o[0], 1), (o[1], VLEN)))),
        ("flow", "select"): (4, lambda o, i: ((OP_SELECT, o[0], o[1], o[2], o[3]), ((o[1], 1), (o[2], 1), (o[3], 1)))),
        ("flow", "vselect"): (4, lambda o, i: ((OP_VSELECT, o[0], o[1], o[2], o[3]),
                                               ((o[1], VLEN), (o[2], VLEN), (o[3], VLEN)))),
        ("flow", "add_imm"): (3, lambda o, i: ((OP_ADD_IMM, o[0], o[1], o[2] & MASK, 0), ((o[1], 1),))),
        ("flow", "halt"): (0, lambda o, i: ((OP_HALT, 0, 0, 0, 0), ())),
        ("flow", "pause"): (0, lambda o, i: ((OP_PAUSE, 0, 0, 0, 0), ())),
        # no architectural effect beyond its read check
        ("flow", "trace_write"): (1, lambda o, i: ((OP_NOP, 0, 0, 0, 0), ((o[0], 1),))),
        ("flow", "cond_jump"): (2, lambda o, i: ((OP_COND_JUMP, o[0], o[1], 0, 0), ((o[0], 1),))),
        ("flow", "cond_jump_rel"): (2, lambda o, i: ((OP_COND_JUMP, o[0], i + 1 + o[1], 0, 0), ((o[0], 1),))),
        ("flow", "jump"): (1, lambda o, i: ((OP_JUMP, o[0], 0, 0, 0), ())),
        ("flow", "jump_indirect"): (1, lambda o, i: ((OP_JUMP_INDIRECT, o[0], 0, 0, 0), ((o[0], 1),))),
        ("flow", "coreid"): (1, lambda o, i: ((OP_CONST, o[0], 0, 0, 0), ())),
    })
    return forms


SLOT_FORMS = _slot_forms()


def fault_row(kind: str, message: str) -> Row:
    return (OP_FAULT, FAULT_CODE[kind], 0, 0, 0, message)


def encode_slot(engine: str, slot: Any, index: int) -> Row:
    """One slot of bundle ``index`` -> one row (op, a, b, c, d), or a FAULT row with its message
    where the reference would fault on the slot."""
    if not isinstance(slot, (list, tuple)) or not slot or not isinstance(slot[0], str):
        return fault_row("bad_slot", f"{engine} slot {slot!r} is not (opcode, operands...)")
    op, ops = slot[0], slot[1:]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ops):
        return fault_row("bad_slot", f"{engine} slot {list(slot)!r} has a non-integer operand")
    form = SLOT_FORMS.get((engine, op))
    if form is None or form[0] != len(ops):
        return fault_row("bad_slot", f"{engine} slot ({op!r}, {len(ops)} operands) is not a {engine.upper()} form")
    if engine == "flow" and op == "jump" and ops[0] < 0:  # a fixed target: known bad now
        return fault_row("bad_jump", f"jump to negative bundle index {ops[0]}")
    row, reads = form[1](ops, index)
    for first, width in reads:
        if first < 0 or first + width > SCRATCH_SIZE:
            return fault_row("scratch_range", f"scratch read at {first}")
    if row[0] == OP_CONST or row[0] == OP_ADD_IMM:
        return (row[0], _clamp(row[1]), row[2], row[3], 0)
    if -IMMEDIATE_BOUND <= min(row) and max(row) <= IMMEDIATE_BOUND:
        return row  # the common case, checked in C
    return tuple(_clamp(v) for v in row)


class _SlotCache:
    """Each distinct slot encoded once per program."""

    def __init__(self) -> None:
        self.rows: dict[tuple, Row] = {}

    def row(self, engine: str, slot: Any, index: int) -> Row:
        # Cache by exact content; the key carries the operand types so 1, True and 1.0 differ.
        try:
            key = (engine, *slot, *map(type, slot))
        except TypeError:
            return encode_slot(engine, slot, index)
        if engine == "flow" and slot and slot[0] == "cond_jump_rel":
            return encode_slot(engine, slot, index)  # depends on the bundle index
        try:
            row = self.rows.get(key)
        except TypeError:  # unhashable operand
            return encode_slot(engine, slot, index)
        if row is None:
            row = self.rows[key] = encode_slot(engine, slot, index)
        return row


def decode(program: Sequence[Any]) -> DecodedProgram:
    """Decode ``program`` (list of bundles: mapping engine -> list of slots) once. Never raises
    for a malformed program: what is wrong becomes a FAULT row where the reference would fault."""
    if not isinstance(program, (list, tuple)):
        raise TypeError(f"a program is a list of bundles, got {type(program).__name__}")
    slot_cache = _SlotCache()
    rows: list[tuple] = []
    append = rows.append
    start = [0]
    charged = bytearray(len(program))
    n_engines = len(CHECKED_ENGINES)
    counts = [0] * (len(program) * n_engines)
    messages: dict[int, str] = {}
    limits = SLOT_LIMITS
    engine_index = ENGINE_INDEX
    cache = slot_cache.rows
    for index, bundle in enumerate(program):
        if type(bundle) is not dict and not isinstance(bundle, Mapping):
            messages[len(rows)] = f"bundle is a {type(bundle).__name__}, not a mapping"
            append((OP_FAULT, FAULT_CODE["bad_bundle"], 0, 0, 0))
            start.append(len(rows))
            continue
        for engine, slots in bundle.items():
            if engine == "debug":
                continue
            charged[index] = 1
            limit = limits.get(engine) if type(engine) is str else None
            if limit is None:
                row = fault_row("unknown_engine", f"unknown engine {engine!r}")
            elif type(slots) is not list and not isinstance(slots, (list, tuple)):
                row = fault_row("bad_bundle", f"engine {engine!r} maps to a {type(slots).__name__}, "
                                              "not a list of slots")
            elif len(slots) > limit:
                row = fault_row("slot_overflow", f"{len(slots)} {engine} slots, limit {limit}")
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
                        r = slot_cache.row(engine, slot, index)
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


def run_decoded(decoded: DecodedProgram, memory: Sequence[int] | np.ndarray, *, enable_pause: bool = False,
                cycle_cap: int = DEFAULT_CYCLE_CAP, scratch_init: Mapping[int, int] | None = None,
                runs: int = 1) -> SimResult:
    """Run a decoded program on a copy of ``memory``; same contract as ``simulate_reference``."""
    mem = np.array(memory, dtype=np.int64)
    scratch = np.zeros(SCRATCH_SIZE, dtype=np.int64)
    for addr, value in (scratch_init or {}).items():
        scratch[int(addr)] = int(value) & MASK
    exec_count = np.zeros(decoded.n_bundles, dtype=np.int64)
    pc, cycle, state, fault, fbundle, detail, executed = execute(
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
