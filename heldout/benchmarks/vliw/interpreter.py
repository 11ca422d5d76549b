"""The decoded form's instruction set and the numba-compiled interpreter that runs it.

A decoded program (:mod:`heldout.benchmarks.vliw.fast` builds it) is a table of integer rows
``(op, a, b, c, d)``; everything that depends only on the instruction was settled when it was
decoded, so what this interpreter checks is data: memory addresses, zero divisors, the sign of a
jump target, the cycle cap and out-of-range write commits.

The opcodes and fault codes are defined here, beside the kernels that test them, because numba
compiles module globals into its cached machine code: a constant changed in another module would
leave a stale cache behind.

:func:`execute` is one function on purpose; see the comment above it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from heldout.benchmarks.vliw.reference import FAULT_KINDS, MASK, VLEN

# -- opcodes of the decoded form -------------------------------------------------------------
# 0..12: scalar ALU op ALU_OPS[i]; 16..28: lane-wise VALU op ALU_OPS[i - 16]
OP_VALU = 16
OP_VBROADCAST, OP_MULTIPLY_ADD = 30, 31
OP_LOAD, OP_VLOAD, OP_CONST = 40, 42, 43
OP_STORE, OP_VSTORE = 50, 51
OP_SELECT, OP_VSELECT, OP_ADD_IMM, OP_HALT, OP_PAUSE = 60, 61, 62, 63, 64
OP_COND_JUMP, OP_JUMP, OP_JUMP_INDIRECT, OP_NOP = 66, 67, 68, 70
OP_FAULT = 99

# -- fault codes: the index of the kind in FAULT_KINDS ---------------------------------------
FAULT_CODES: tuple[str, ...] = tuple(FAULT_KINDS)
FAULT_CODE: dict[str, int] = {kind: code for code, kind in enumerate(FAULT_CODES)}
F_ZERO, F_SCRATCH, F_MEMORY, F_JUMP, F_CAP = 4, 5, 6, 7, 8
NO_FAULT = -1

# -- run states ------------------------------------------------------------------------------
S_RUNNING, S_PAUSED, S_STOPPED = 0, 1, 2

WORD, LANES = 0xFFFFFFFF, 8
if (WORD, LANES) != (MASK, VLEN) \
        or FAULT_CODES[F_ZERO:F_CAP + 1] != ("zero_division", "scratch_range", "memory_range", "bad_jump", "cycle_cap"):
    raise RuntimeError(f"the interpreter's constants no longer match the reference machine's: {FAULT_CODES}")
# the most writes one bundle can queue: 12 ALU + 6 VALU x 8 + 2 vload x 8 + 1 vselect x 8 = 84
# scratch writes, 2 vstore x 8 = 16 memory writes (with room to spare)
MAX_SCRATCH_WRITES, MAX_MEMORY_WRITES = 160, 40


@njit(cache=True, inline="always")
def _alu(op, x, y):
    """One ALU op on two words (int64 holding values < 2**32); -1 means zero divisor."""
    if op == 0:
        return (x + y) & WORD
    elif op == 1:
        return (x - y) & WORD
    elif op == 2:
        return (x * y) & WORD  # int64 wraps; the low 32 bits are still exact
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
        return (x << y) & WORD
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


# One function on purpose (issue 59 allows a longer numba kernel where splitting costs speed): the
# same kernel split into helpers ran the baseline stream (147,734 bundles) 3-8x slower, 3.2 ms ->
# 10 ms with one helper for a bundle's rows and 26 ms with one per engine (inlined or not): numba
# 0.68 reference-counts every array handed to a helper on every call (31 increfs and 133 decrefs
# compiled in, against 6 and 31 here). Measured 2026-12-07 with a fresh numba cache.
@njit(cache=True)
def execute(code, start, charged, scratch, mem, pc, cycle, state, cycle_cap, enable_pause, runs, exec_count):
    """Run the decoded program ``runs`` times (a pause ends a run); returns (pc, cycle, state,
    fault code, fault bundle, detail, bundles executed). ``exec_count[i]`` counts commits of
    bundle i (for utilisation). A bundle's reads all see the state from before it; its writes
    are queued (``ws_*`` scratch, ``wm_*`` memory) and committed after its last row."""
    n = charged.shape[0]
    size_mem = mem.shape[0]
    ws_a = np.empty(MAX_SCRATCH_WRITES, np.int64)
    ws_v = np.empty(MAX_SCRATCH_WRITES, np.int64)
    wm_a = np.empty(MAX_MEMORY_WRITES, np.int64)
    wm_v = np.empty(MAX_MEMORY_WRITES, np.int64)
    fault = NO_FAULT
    fbundle = -1
    detail = 0
    executed = 0
    for _ in range(runs):
        if state == S_PAUSED:
            state = S_RUNNING
        while state == S_RUNNING:
            if pc >= n:
                state = S_STOPPED
                break
            index = pc
            if charged[index] != 0 and cycle >= cycle_cap:
                fault = F_CAP
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
                if op < 13:  # scalar ALU
                    v = _alu(op, scratch[b], scratch[c])
                    if v < 0:
                        fault = F_ZERO
                        break
                    ws_a[ns] = a
                    ws_v[ns] = v
                    ns += 1
                elif op < OP_VBROADCAST:  # VALU
                    sub = op - OP_VALU
                    for i in range(LANES):
                        v = _alu(sub, scratch[b + i], scratch[c + i])
                        if v < 0:
                            fault = F_ZERO
                            break
                        ws_a[ns] = a + i
                        ws_v[ns] = v
                        ns += 1
                    if fault >= 0:
                        break
                elif op == OP_MULTIPLY_ADD:
                    d = code[k, 4]
                    for i in range(LANES):
                        ws_a[ns] = a + i
                        ws_v[ns] = (((scratch[b + i] * scratch[c + i]) & WORD) + scratch[d + i]) & WORD
                        ns += 1
                elif op == OP_VBROADCAST:
                    v = scratch[b]
                    for i in range(LANES):
                        ws_a[ns] = a + i
                        ws_v[ns] = v
                        ns += 1
                elif op == OP_LOAD:  # load and load_offset
                    m = scratch[b]
                    if m >= size_mem:
                        fault = F_MEMORY
                        detail = m
                        break
                    ws_a[ns] = a
                    ws_v[ns] = mem[m]
                    ns += 1
                elif op == OP_VLOAD:
                    m = scratch[b]
                    if m + LANES - 1 >= size_mem:
                        fault = F_MEMORY
                        detail = m
                        break
                    for i in range(LANES):
                        ws_a[ns] = a + i
                        ws_v[ns] = mem[m + i]
                        ns += 1
                elif op == OP_CONST:  # const and coreid
                    ws_a[ns] = a
                    ws_v[ns] = b
                    ns += 1
                elif op == OP_STORE:
                    wm_a[nm] = scratch[a]
                    wm_v[nm] = scratch[b]
                    nm += 1
                elif op == OP_VSTORE:
                    m = scratch[a]
                    for i in range(LANES):
                        wm_a[nm] = m + i
                        wm_v[nm] = scratch[b + i]
                        nm += 1
                elif op == OP_SELECT:
                    ws_a[ns] = a
                    ws_v[ns] = scratch[c] if scratch[b] != 0 else scratch[code[k, 4]]
                    ns += 1
                elif op == OP_VSELECT:
                    d = code[k, 4]
                    for i in range(LANES):
                        ws_a[ns] = a + i
                        ws_v[ns] = scratch[c + i] if scratch[b + i] != 0 else scratch[d + i]
                        ns += 1
                elif op == OP_ADD_IMM:
                    ws_a[ns] = a
                    ws_v[ns] = (scratch[b] + c) & WORD
                    ns += 1
                elif op == OP_HALT:
                    state = S_STOPPED
                elif op == OP_PAUSE:
                    if enable_pause:
                        state = S_PAUSED
                elif op == OP_COND_JUMP:  # cond_jump_rel was decoded to an absolute target
                    if scratch[a] != 0:
                        if b < 0:
                            fault = F_JUMP
                            detail = b
                            break
                        pc = b
                elif op == OP_JUMP:
                    pc = a
                elif op == OP_JUMP_INDIRECT:
                    pc = scratch[a]
                elif op == OP_NOP:  # trace_write
                    pass
                else:  # a FAULT row decided at decode time: its kind, and the row (which holds the message)
                    fault = a
                    detail = k
                    break
            if fault >= 0:
                fbundle = index
                break
            bad = _commit(ws_a, ws_v, ns, scratch, scratch.shape[0])
            if bad != -1:
                fault = F_SCRATCH
                detail = ws_a[bad]
                fbundle = index
                break
            bad = _commit(wm_a, wm_v, nm, mem, size_mem)
            if bad != -1:
                fault = F_MEMORY
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
