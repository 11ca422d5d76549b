"""The VLIW SIMD machine, written to be obviously correct: the executable specification.

This module is the plain-Python reading of ``../shared/specs/vliw.md`` sections 2-4 and 8. The
fast path (:mod:`heldout.benchmarks.vliw.fast`) must agree with it on every program, and the tests
check that they do. It is deliberately slow and deliberately simple: one dict of pending writes per
bundle, one ``if`` per opcode.

It imports nothing but the standard library, because the same file is also shipped into the
sandbox (as a helper of the ``problem`` module) so that kernel builders can simulate locally.

Rules (each one is a test):

* a word is an unsigned 32-bit integer; every produced value is reduced modulo 2**32;
* a bundle is a mapping engine -> list of slots; keys are visited in mapping order, slots in list
  order; every read sees the state from before the bundle; writes are pending until the end of
  the bundle, the last writer (key order, then slot order) wins; pending scratch writes are
  applied before pending memory writes, in first-write order;
* a bundle costs one cycle iff it has a key other than ``debug`` (key presence, not slot count);
* ``pc`` is incremented before the bundle executes; ``cond_jump_rel`` is relative to the next
  bundle; a jump at or past the end stops the core;
* faults are explicit (heldout's decisions, section 8): slot overflow, unknown engine, unknown
  opcode or wrong slot shape, zero divisor, scratch or memory address out of range (negative ones
  included), a negative jump target, and the cycle cap. A fault while slots are evaluated discards
  the bundle's pending writes; an out-of-range *write* faults at commit time, after the pending
  writes committed before it (this mirrors the original machine exactly). A faulting bundle is
  not charged, and control effects of slots evaluated before the fault remain.
* ``debug`` slots are inert (the scoring configuration disables debug) and never slot-checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Sequence

VLEN = 8
SCRATCH_SIZE = 1536
N_CORES = 1
SLOT_LIMITS: dict[str, int] = {"alu": 12, "valu": 6, "load": 2, "store": 2, "flow": 1, "debug": 64}
ENGINES: tuple[str, ...] = ("alu", "valu", "load", "store", "flow", "debug")
CHECKED_ENGINES: tuple[str, ...] = ("alu", "valu", "load", "store", "flow")
MASK = 0xFFFFFFFF
DEFAULT_CYCLE_CAP = 10_000_000  # ~68x the 147,734-cycle baseline

RUNNING, PAUSED, STOPPED = "RUNNING", "PAUSED", "STOPPED"

ALU_OPS: tuple[str, ...] = ("+", "-", "*", "//", "cdiv", "%", "^", "&", "|", "<<", ">>", "<", "==")

FAULT_KINDS: dict[str, str] = {
    "slot_overflow": "more slots than the engine's limit",
    "unknown_engine": "an engine name the machine does not have",
    "bad_bundle": "a bundle that is not a mapping of engine -> list of slots",
    "bad_slot": "unknown opcode, wrong slot shape or a non-integer operand",
    "zero_division": "//, % or cdiv with a zero divisor (scalar or any lane)",
    "scratch_range": "scratch address outside [0, 1536) (negative included)",
    "memory_range": "memory address outside the memory image",
    "bad_jump": "negative jump target",
    "cycle_cap": "the cycle cap was reached before the program stopped",
}


@dataclass(frozen=True)
class Fault:
    """Why a run stopped abnormally: ``kind`` (a key of FAULT_KINDS), the index of the bundle
    that faulted, and a message for humans."""

    kind: str
    bundle: int
    message: str

    def describe(self) -> str:
        return f"{self.kind} at bundle {self.bundle}: {self.message}"


@dataclass
class SimResult:
    """The outcome of :func:`simulate`: cycles charged, final pc and state, final memory and
    scratch, the fault (None when the program stopped or paused normally) and the number of
    slots executed per engine in charged bundles (for utilisation)."""

    cycles: int
    pc: int
    state: str
    memory: list[int]
    scratch: list[int]
    fault: Fault | None = None
    slots: dict[str, int] = field(default_factory=dict)
    bundles: int = 0  # bundles executed, debug-only ones included

    @property
    def ok(self) -> bool:
        return self.fault is None


class MachineFault(Exception):
    def __init__(self, kind: str, message: str, bundle: int = -1) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.bundle = bundle


def is_word_operand(value: Any) -> bool:
    """Operands are Python ints; bools are refused (they would silently mean 0/1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def all_word_operands(values: Sequence[Any]) -> bool:
    """``is_word_operand`` for each value (plain ints, the common case, checked in one pass)."""
    return all(type(v) is int for v in values) or all(is_word_operand(v) for v in values)


def alu(op: str, x: int, y: int) -> int:
    """One scalar ALU operation on two words (also each lane of a VALU op)."""
    if op == "+":
        return (x + y) & MASK
    if op == "-":
        return (x - y) & MASK
    if op == "*":
        return (x * y) & MASK
    if op == "//":
        if y == 0:
            raise MachineFault("zero_division", "// by zero")
        return x // y
    if op == "cdiv":
        if y == 0:
            raise MachineFault("zero_division", "cdiv by zero")
        return (x + y - 1) // y
    if op == "%":
        if y == 0:
            raise MachineFault("zero_division", "% by zero")
        return x % y
    if op == "^":
        return x ^ y
    if op == "&":
        return x & y
    if op == "|":
        return x | y
    if op == "<<":
        return (x << y) & MASK if y < 32 else 0
    if op == ">>":
        return x >> y if y < 32 else 0
    if op == "<":
        return 1 if x < y else 0
    if op == "==":
        return 1 if x == y else 0
    raise MachineFault("bad_slot", f"unknown ALU op {op!r}")


class ReferenceMachine:
    """One core, one memory image, one program. ``run()`` may be called again after a pause."""

    def __init__(self, program: Sequence[Any], memory: Sequence[int], *, enable_pause: bool = False,
                 cycle_cap: int = DEFAULT_CYCLE_CAP,
                 scratch_init: Mapping[int, int] | None = None) -> None:
        self.program = program
        self.memory = [int(v) for v in memory]
        self.scratch = [0] * SCRATCH_SIZE
        for addr, value in (scratch_init or {}).items():
            self.scratch[int(addr)] = int(value) & MASK
        self.enable_pause = enable_pause
        self.cycle_cap = cycle_cap
        self.pc = 0
        self.state = RUNNING
        self.cycle = 0
        self.bundles = 0
        self.trace_buf: list[int] = []
        self.slots = {engine: 0 for engine in CHECKED_ENGINES}
        self.fault: Fault | None = None
        self.engines = {"alu": self._alu, "valu": self._valu, "load": self._load, "store": self._store,
                        "flow": self._flow}

    # -- state access with explicit range checks (the original wraps negative indices) ---------
    def read_scratch(self, addr: int) -> int:
        if not 0 <= addr < SCRATCH_SIZE:
            raise MachineFault("scratch_range", f"scratch read at {addr}")
        return self.scratch[addr]

    def read_memory(self, addr: int) -> int:
        if not 0 <= addr < len(self.memory):
            raise MachineFault("memory_range", f"memory read at {addr} (memory has {len(self.memory)} words)")
        return self.memory[addr]

    # -- the run loop -------------------------------------------------------------------------
    def run(self) -> None:
        """One ``run()`` of the original: resume a paused core, execute until no core runs.
        Raises :class:`MachineFault` (also recorded in ``self.fault``)."""
        if self.fault is not None:
            return
        if self.state == PAUSED:
            self.state = RUNNING
        try:
            while self.state == RUNNING:
                if self.pc >= len(self.program):
                    self.state = STOPPED
                    break
                index = self.pc
                bundle = self.program[index]
                if type(bundle) is not dict and not isinstance(bundle, Mapping):
                    self.pc = index + 1
                    raise MachineFault("bad_bundle", f"bundle is a {type(bundle).__name__}, not a mapping",
                                       index)
                charged = len(bundle) > ("debug" in bundle)  # a key other than debug
                if charged and self.cycle >= self.cycle_cap:
                    raise MachineFault("cycle_cap", f"still running after {self.cycle_cap} cycles", index)
                self.pc = index + 1
                self.execute(bundle, index)
                self.bundles += 1
                if charged:
                    self.cycle += 1
        except MachineFault as fault:
            self.fault = Fault(fault.kind, fault.bundle, fault.message)
            raise

    def execute(self, bundle: Mapping[str, Any], index: int) -> None:
        pending_scratch: dict[int, int] = {}
        pending_memory: dict[int, int] = {}
        counts = dict.fromkeys(CHECKED_ENGINES, 0)
        try:
            for engine, slots in bundle.items():
                if engine == "debug":
                    continue  # inert: debug is disabled in the scoring configuration
                if engine not in SLOT_LIMITS:
                    raise MachineFault("unknown_engine", f"unknown engine {engine!r}")
                if not isinstance(slots, (list, tuple)):
                    raise MachineFault("bad_bundle", f"engine {engine!r} maps to a {type(slots).__name__}, "
                                                     "not a list of slots")
                if len(slots) > SLOT_LIMITS[engine]:
                    raise MachineFault("slot_overflow", f"{len(slots)} {engine} slots, limit "
                                                        f"{SLOT_LIMITS[engine]}")
                for slot in slots:
                    if not isinstance(slot, (list, tuple)) or not slot or not isinstance(slot[0], str):
                        raise MachineFault("bad_slot", f"{engine} slot {slot!r} is not (opcode, operands...)")
                    operands = slot[1:]
                    if not all_word_operands(operands):
                        raise MachineFault("bad_slot", f"{engine} slot {list(slot)!r} has a non-integer operand")
                    self.engines[engine](slot[0], operands, pending_scratch, pending_memory, index)
                counts[engine] += len(slots)
        except MachineFault as fault:
            fault.bundle = index
            raise
        # Commit: scratch first, then memory, each in first-write order; an out-of-range write
        # faults here, after the writes committed before it (as the original does).
        for addr, value in pending_scratch.items():
            if not 0 <= addr < SCRATCH_SIZE:
                raise MachineFault("scratch_range", f"scratch write at {addr}", index)
            self.scratch[addr] = value
        for addr, value in pending_memory.items():
            if not 0 <= addr < len(self.memory):
                raise MachineFault("memory_range", f"memory write at {addr} (memory has "
                                                   f"{len(self.memory)} words)", index)
            self.memory[addr] = value
        for engine, n in counts.items():
            self.slots[engine] += n

    # -- engines: each reads pre-bundle state and writes into the pending maps -----------------
    def _alu(self, op: str, ops: Sequence[int], ps: dict, pm: dict, index: int) -> None:
        if len(ops) != 3 or op not in ALU_OPS:
            raise MachineFault("bad_slot", f"alu slot ({op!r}, {len(ops)} operands) is not (op, d, a, b)")
        d, a, b = ops
        ps[d] = alu(op, self.read_scratch(a), self.read_scratch(b))

    def _valu(self, op: str, ops: Sequence[int], ps: dict, pm: dict, index: int) -> None:
        if op == "vbroadcast" and len(ops) == 2:
            d, a = ops
            value = self.read_scratch(a)
            for i in range(VLEN):
                ps[d + i] = value
        elif op == "multiply_add" and len(ops) == 4:
            d, a, b, c = ops
            lanes = [(self.read_scratch(a + i), self.read_scratch(b + i), self.read_scratch(c + i))
                     for i in range(VLEN)]
            for i, (x, y, z) in enumerate(lanes):
                ps[d + i] = (((x * y) & MASK) + z) & MASK
        elif op in ALU_OPS and len(ops) == 3:
            d, a, b = ops
            lanes = [(self.read_scratch(a + i), self.read_scratch(b + i)) for i in range(VLEN)]
            for i, (x, y) in enumerate(lanes):
                ps[d + i] = alu(op, x, y)
        else:
            raise MachineFault("bad_slot", f"valu slot ({op!r}, {len(ops)} operands) is not a VALU form")

    def _load(self, op: str, ops: Sequence[int], ps: dict, pm: dict, index: int) -> None:
        if op == "load" and len(ops) == 2:
            d, addr = ops
            ps[d] = self.read_memory(self.read_scratch(addr))
        elif op == "load_offset" and len(ops) == 3:
            d, addr, off = ops
            ps[d + off] = self.read_memory(self.read_scratch(addr + off))
        elif op == "vload" and len(ops) == 2:
            d, addr = ops
            base = self.read_scratch(addr)
            for i in range(VLEN):
                ps[d + i] = self.read_memory(base + i)
        elif op == "const" and len(ops) == 2:
            d, imm = ops
            ps[d] = imm & MASK
        else:
            raise MachineFault("bad_slot", f"load slot ({op!r}, {len(ops)} operands) is not a LOAD form")

    def _store(self, op: str, ops: Sequence[int], ps: dict, pm: dict, index: int) -> None:
        if op == "store" and len(ops) == 2:
            addr, src = ops
            pm[self.read_scratch(addr)] = self.read_scratch(src)
        elif op == "vstore" and len(ops) == 2:
            addr, src = ops
            base = self.read_scratch(addr)
            for i in range(VLEN):
                pm[base + i] = self.read_scratch(src + i)
        else:
            raise MachineFault("bad_slot", f"store slot ({op!r}, {len(ops)} operands) is not a STORE form")

    def _flow(self, op: str, ops: Sequence[int], ps: dict, pm: dict, index: int) -> None:
        n = len(ops)
        if op == "select" and n == 4:
            d, cond, a, b = ops
            c, x, y = self.read_scratch(cond), self.read_scratch(a), self.read_scratch(b)
            ps[d] = x if c != 0 else y
        elif op == "vselect" and n == 4:
            d, cond, a, b = ops
            lanes = [(self.read_scratch(cond + i), self.read_scratch(a + i), self.read_scratch(b + i))
                     for i in range(VLEN)]
            for i, (c, x, y) in enumerate(lanes):
                ps[d + i] = x if c != 0 else y
        elif op == "add_imm" and n == 3:
            d, a, imm = ops
            ps[d] = (self.read_scratch(a) + imm) & MASK
        elif op == "halt" and n == 0:
            self.state = STOPPED
        elif op == "pause" and n == 0:
            if self.enable_pause:
                self.state = PAUSED
        elif op == "trace_write" and n == 1:
            self.trace_buf.append(self.read_scratch(ops[0]))
        elif op == "cond_jump" and n == 2:
            cond, target = ops
            if self.read_scratch(cond) != 0:
                self._jump(target)
        elif op == "cond_jump_rel" and n == 2:
            cond, offset = ops
            if self.read_scratch(cond) != 0:
                self._jump(index + 1 + offset)
        elif op == "jump" and n == 1:
            self._jump(ops[0])
        elif op == "jump_indirect" and n == 1:
            self._jump(self.read_scratch(ops[0]))
        elif op == "coreid" and n == 1:
            ps[ops[0]] = 0
        else:
            raise MachineFault("bad_slot", f"flow slot ({op!r}, {n} operands) is not a FLOW form")

    def _jump(self, target: int) -> None:
        if target < 0:
            raise MachineFault("bad_jump", f"jump to negative bundle index {target}")
        self.pc = target

    def result(self) -> SimResult:
        return SimResult(cycles=self.cycle, pc=self.pc, state=self.state, memory=list(self.memory),
                         scratch=list(self.scratch), fault=self.fault, slots=dict(self.slots),
                         bundles=self.bundles)


def simulate_reference(program: Sequence[Any], memory: Sequence[int], *, enable_pause: bool = False,
                       cycle_cap: int = DEFAULT_CYCLE_CAP, scratch_init: Mapping[int, int] | None = None,
                       runs: int = 1) -> SimResult:
    """Run ``program`` on a copy of ``memory`` with the reference machine, calling ``run()``
    ``runs`` times (each call resumes a paused core). Never raises for what the program does:
    a fault is returned in ``SimResult.fault``."""
    machine = ReferenceMachine(program, memory, enable_pause=enable_pause, cycle_cap=cycle_cap,
                               scratch_init=scratch_init)
    for _ in range(runs):
        try:
            machine.run()
        except MachineFault:
            break
    return machine.result()
