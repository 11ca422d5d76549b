"""The marshal form's parser: numba-compiled readers of ``marshal`` version 4 bytes, and
:func:`parse_stream`, which reads a whole stream with them straight into the compact form's
arrays. What it accepts and why is :mod:`heldout.benchmarks.vliw.marshal_form`'s docstring;
that module owns the workspace arrays and calls this parser.

Every reader checks the bytes it reads against what is there and returns a status (0, or an
index into :data:`REASONS`) instead of raising. The constants live beside the kernels that test
them because numba compiles module globals into its cached machine code.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# marshal's type bytes (CPython Python/marshal.c, version 4)
_FLAG_REF = 0x80
_NULL, _NONE, _FALSE, _TRUE = ord("0"), ord("N"), ord("F"), ord("T")
_INT, _LONG, _BINARY_FLOAT, _REF = ord("i"), ord("l"), ord("g"), ord("r")
_TUPLE, _SMALL_TUPLE, _LIST, _DICT, _SET, _FROZENSET = ord("("), ord(")"), ord("["), ord("{"), ord("<"), ord(">")
_UNICODE, _INTERNED, _ASCII, _ASCII_INTERNED = ord("u"), ord("t"), ord("a"), ord("A")
_SHORT_ASCII, _SHORT_ASCII_INTERNED = ord("z"), ord("Z")

# what a back-reference points at
_K_OTHER, _K_STR, _K_INT, _K_SLOT, _K_GROUP, _K_BUNDLE = 0, 1, 2, 3, 4, 5
_SKIP_DEPTH = 64

# why a parse stopped (status 0: parsed; the last ones: a workspace array is full, parse again)
REASONS = ("parsed", "truncated", "unexpected type", "bad reference", "integer beyond 2**62", "too large",
           "trailing bytes", "too deeply nested", "full: groups", "full: slot positions", "full: distinct slots",
           "full: operands", "full: strings", "full: references", "full: operands of one slot")
_TRUNCATED, _UNEXPECTED, _BAD_REF, _BIG_INT, _TOO_LARGE, _TRAILING, _TOO_DEEP = 1, 2, 3, 4, 5, 6, 7
FULL = 8  # FULL + k: workspace array k is full (named in REASONS[FULL + k]; marshal_form.Workspace reads them)


@njit(cache=True)
def _i32(blob, pos):
    v = (np.int64(blob[pos]) | (np.int64(blob[pos + 1]) << 8) | (np.int64(blob[pos + 2]) << 16)
         | (np.int64(blob[pos + 3]) << 24))
    return v - (np.int64(1) << 32) if v >= (np.int64(1) << 31) else v


@njit(cache=True)
def _stop(status, pos):
    return status, pos, 0, 0, 0, 0, 0, 0


@njit(cache=True)
def _header(blob, pos, n):
    """The type byte at ``pos``: (status, type, has FLAG_REF, new pos)."""
    if pos >= n:
        return _TRUNCATED, 0, False, pos
    return 0, np.int64(blob[pos]) & 0x7F, (np.int64(blob[pos]) & _FLAG_REF) != 0, pos + 1


@njit(cache=True)
def _count(blob, pos, n, t):
    """The item count of a list/tuple/set of type ``t`` (after its type byte): (status, count,
    new pos); each item takes at least one byte, so a count beyond the bytes left is truncation."""
    if t == _SMALL_TUPLE:
        if pos + 1 > n:
            return _TRUNCATED, 0, pos
        return 0, np.int64(blob[pos]), pos + 1
    if pos + 4 > n:
        return _TRUNCATED, 0, pos
    count = _i32(blob, pos)
    if count < 0 or count > n - pos - 4:
        return _TRUNCATED, 0, pos
    return 0, count, pos + 4


@njit(cache=True)
def _reference(blob, pos, n, n_refs):
    """A back-reference's index (after its type byte): (status, index, new pos)."""
    if pos + 4 > n:
        return _TRUNCATED, 0, pos
    r = _i32(blob, pos)
    if r < 0 or r >= n_refs:
        return _BAD_REF, 0, pos
    return 0, r, pos + 4


@njit(cache=True)
def _long(blob, pos, n):
    """A ``l`` integer (after its type byte): (status, value, new pos); beyond 2**62: _BIG_INT."""
    if pos + 4 > n:
        return _TRUNCATED, 0, pos
    size = _i32(blob, pos)
    pos += 4
    digits = -size if size < 0 else size
    if pos + 2 * digits > n:
        return _TRUNCATED, 0, pos
    if digits > 5:
        return _BIG_INT, 0, pos + 2 * digits
    value = np.int64(0)
    for k in range(digits):
        d = np.int64(blob[pos + 2 * k]) | (np.int64(blob[pos + 2 * k + 1]) << 8)
        if d > 0x7FFF or (k == 4 and d > 3):  # not a 15-bit digit / |value| >= 2**62
            return _BIG_INT, 0, pos + 2 * digits
        value |= d << (15 * k)
    return 0, -value if size < 0 else value, pos + 2 * digits


@njit(cache=True)
def _is_string(t):
    return (t == _UNICODE or t == _INTERNED or t == _ASCII or t == _ASCII_INTERNED or t == _SHORT_ASCII
            or t == _SHORT_ASCII_INTERNED)


@njit(cache=True)
def _string(blob, pos, n, t, s_start, s_len, s_table, n_str, debug_id):
    """A string of type ``t`` (after its type byte), numbered by content (new ones as first seen):
    (status, number, new pos, strings so far, the number of "debug")."""
    if t == _SHORT_ASCII or t == _SHORT_ASCII_INTERNED:
        if pos + 1 > n:
            return _TRUNCATED, 0, pos, n_str, debug_id
        length = np.int64(blob[pos])
        pos += 1
    else:
        if pos + 4 > n:
            return _TRUNCATED, 0, pos, n_str, debug_id
        length = _i32(blob, pos)
        pos += 4
        if length < 0 or length > n - pos:
            return _TRUNCATED, 0, pos, n_str, debug_id
    if pos + length > n:
        return _TRUNCATED, 0, pos, n_str, debug_id
    h = np.uint64(14695981039346656037)
    for k in range(length):
        h = (h ^ np.uint64(blob[pos + k])) * np.uint64(1099511628211)
    mask = np.uint64(len(s_table) - 1)
    probe = h & mask
    while s_table[probe] >= 0:
        c = s_table[probe]
        if s_len[c] == length:
            same = True
            for k in range(length):
                if blob[s_start[c] + k] != blob[pos + k]:
                    same = False
                    break
            if same:
                return 0, c, pos + length, n_str, debug_id
        probe = (probe + np.uint64(1)) & mask
    if n_str == len(s_start) or 2 * (n_str + 1) > len(s_table):
        return FULL + 4, 0, pos, n_str, debug_id
    s_start[n_str], s_len[n_str], s_table[probe] = pos, length, n_str
    if length == 5 and blob[pos] == 100 and blob[pos + 1] == 101 and blob[pos + 2] == 98 \
            and blob[pos + 3] == 117 and blob[pos + 4] == 103:  # b"debug"
        debug_id = n_str
    return 0, n_str, pos + length, n_str + 1, debug_id


@njit(cache=True)
def _string_ref(blob, pos, n, refs, n_r):
    """A back-reference to a string read before (after its type byte): (status, its number, new pos)."""
    status, r, pos = _reference(blob, pos, n, n_r)
    if status != 0 or refs[r, 0] != _K_STR:
        return _BAD_REF, 0, pos
    return 0, refs[r, 1], pos


@njit(cache=True)
def _name(blob, pos, n, t, flagged, refs, n_r, s_start, s_len, s_table, n_str, debug_id):
    """An engine's or operation's name written out, of type ``t`` (after its type byte): a string,
    numbered (and numbered as a back-reference too when flagged). Returns (status, number, new pos,
    references so far, strings so far, the number of "debug"). A reference to a name read before
    is :func:`_string_ref`: callers test for it first, since this call costs ~60 ns more (numba
    reference-counts the four arrays it takes), twice per bundle, 40% of the whole parse."""
    if not _is_string(t):
        return _UNEXPECTED, 0, pos - 1, n_r, n_str, debug_id
    status, number, pos, n_str, debug_id = _string(blob, pos, n, t, s_start, s_len, s_table, n_str, debug_id)
    if status != 0 or not flagged:
        return status, number, pos, n_r, n_str, debug_id
    if n_r == len(refs):
        return FULL + 5, 0, pos, n_r, n_str, debug_id
    refs[n_r, 0], refs[n_r, 1] = _K_STR, number
    return 0, number, pos, n_r + 1, n_str, debug_id


@njit(cache=True)
def _skip(blob, pos, n, refs, n_r, s_start, s_len, s_table, n_str, debug_id):
    """Read past one object of plain data (the debug group's value), whatever it holds; what it
    defines is still numbered, since later back-references may use it. Returns (status, new pos,
    references so far, strings so far, the number of "debug")."""
    stack_left, stack_dict = np.empty(_SKIP_DEPTH, np.int64), np.empty(_SKIP_DEPTH, np.bool_)
    stack_left[0], stack_dict[0], depth = 1, False, 0
    while depth >= 0:
        if not stack_dict[depth] and stack_left[depth] == 0:
            depth -= 1
            continue
        status, t, flagged, pos = _header(blob, pos, n)
        if status != 0:
            return status, pos, n_r, n_str, debug_id
        if stack_dict[depth] and t == _NULL:
            depth -= 1
            continue
        if not stack_dict[depth]:
            stack_left[depth] -= 1
        kind, value, count, opens_dict = _K_OTHER, np.int64(0), np.int64(-1), False
        if t == _NONE or t == _TRUE or t == _FALSE:
            pass
        elif t == _INT:
            if pos + 4 > n:
                return _TRUNCATED, pos, n_r, n_str, debug_id
            kind, value = _K_INT, _i32(blob, pos)
            pos += 4
        elif t == _LONG:
            status, value, pos = _long(blob, pos, n)
            if status == _TRUNCATED:
                return status, pos, n_r, n_str, debug_id
            kind = _K_INT if status == 0 else _K_OTHER
        elif t == _BINARY_FLOAT:
            if pos + 8 > n:
                return _TRUNCATED, pos, n_r, n_str, debug_id
            pos += 8
        elif _is_string(t):
            status, value, pos, n_str, debug_id = _string(blob, pos, n, t, s_start, s_len, s_table, n_str, debug_id)
            if status != 0:
                return status, pos, n_r, n_str, debug_id
            kind = _K_STR
        elif t == _REF:
            status, r, pos = _reference(blob, pos, n, n_r)
            if status != 0:
                return status, pos, n_r, n_str, debug_id
            continue  # nothing new to number
        elif t == _TUPLE or t == _SMALL_TUPLE or t == _LIST or t == _SET or t == _FROZENSET:
            status, count, pos = _count(blob, pos, n, t)
            if status != 0:
                return status, pos, n_r, n_str, debug_id
        elif t == _DICT:
            opens_dict = True
        else:
            return _UNEXPECTED, pos - 1, n_r, n_str, debug_id
        if flagged:
            if n_r == len(refs):
                return FULL + 5, pos, n_r, n_str, debug_id
            refs[n_r, 0], refs[n_r, 1] = kind, value
            n_r += 1
        if count >= 0 or opens_dict:
            depth += 1
            if depth >= _SKIP_DEPTH:
                return _TOO_DEEP, pos, n_r, n_str, debug_id
            stack_left[depth], stack_dict[depth] = max(count, np.int64(0)), opens_dict
    return 0, pos, n_r, n_str, debug_id


@njit(cache=True, inline="always")
def _bundle_again(refs, r, max_items, g_engine, g_slots, n_g, slot_ids, n_s):
    """The bundle object of reference ``r`` again: its groups and their slots once more.
    Returns (status, groups, slot positions so far)."""
    groups, first_group, slots, first_slot = refs[r, 2], refs[r, 1], refs[r, 4], refs[r, 3]
    if n_g + groups > max_items or n_s + slots > max_items:
        return _TOO_LARGE, n_g, n_s
    if n_g + groups > len(g_engine):
        return FULL + 0, n_g, n_s
    if n_s + slots > len(slot_ids):
        return FULL + 1, n_g, n_s
    g_engine[n_g:n_g + groups] = g_engine[first_group:first_group + groups]
    g_slots[n_g:n_g + groups] = g_slots[first_group:first_group + groups]
    slot_ids[n_s:n_s + slots] = slot_ids[first_slot:first_slot + slots]
    return 0, n_g + groups, n_s + slots


@njit(cache=True, inline="always")
def _group_again(refs, r, max_items, slot_ids, n_s):
    """The slots of the group object of reference ``r`` once more. Returns (status, slot
    positions so far)."""
    slots, first_slot = refs[r, 2], refs[r, 1]
    if n_s + slots > max_items:
        return _TOO_LARGE, n_s
    if n_s + slots > len(slot_ids):
        return FULL + 1, n_s
    slot_ids[n_s:n_s + slots] = slot_ids[first_slot:first_slot + slots]
    return 0, n_s + slots


# One function on purpose (issue 59 allows a longer numba kernel where splitting costs speed): split
# into inlined helpers per level (bundle, group, slot, operands) the baseline stream's parse took
# 78 ms instead of 13 ms, and even the slot-numbering hash table alone as an inlined helper cost
# ~12 ns a slot (the packed kernel's stream: 0.42 -> 0.57 ms): numba reference-counts the arrays
# handed to a helper on every call. Only the rare paths (a bundle or group object repeated) are helpers.
# Measured 2026-12-07 with a fresh numba cache.
@njit(cache=True)
def parse_stream(blob, max_bundles, max_items, n_groups, g_engine, g_slots, slot_ids, u_op, u_n, u_off, u_operands,
                 u_table, s_start, s_len, s_table, refs, scratch):  # noqa: C901 (one pass over one state)
    """The stream in ``blob`` as the compact form's arrays, written into the workspace arrays
    (never reallocated here: a numba function that rebinds arrays in its loop pays reference
    counting on every pass, 4x this parse's time). ``n_groups`` (zeros, one per byte of ``blob``)
    receives the groups of each bundle. Returns (status, position, n bundles, n groups, n slot
    positions, n distinct slots, n operands, n strings); status 0 when parsed, else an index into
    ``REASONS``."""
    n = len(blob)
    n_g = n_s = n_u = n_operands = n_str = n_r = 0
    debug_id = -1

    status, t, flagged, pos = _header(blob, 0, n)
    if status != 0:
        return _stop(status, pos)
    if flagged:  # the program itself: a reference to it is a cycle
        refs[0, 0], n_r = _K_OTHER, 1
    if t != _LIST and t != _TUPLE and t != _SMALL_TUPLE:
        return _stop(_UNEXPECTED, pos - 1)
    status, n_b, pos = _count(blob, pos, n, t)
    if status != 0:
        return _stop(status, pos)
    if n_b > max_bundles:
        return _stop(_TOO_LARGE, pos)

    for b in range(n_b):
        status, t, flagged, pos = _header(blob, pos, n)
        if status != 0:
            return _stop(status, pos)
        g0, s0 = n_g, n_s
        if t == _REF:  # the same bundle object again: its groups and their slots once more
            status, r, pos = _reference(blob, pos, n, n_r)
            if status != 0 or refs[r, 0] != _K_BUNDLE:
                return _stop(_BAD_REF, pos)
            status, n_g, n_s = _bundle_again(refs, r, max_items, g_engine, g_slots, n_g, slot_ids, n_s)
            if status != 0:
                return _stop(status, pos)
            n_groups[b] = refs[r, 2]
            continue
        if t != _DICT:
            return _stop(_UNEXPECTED, pos - 1)
        bundle_ref = -1
        if flagged:
            if n_r == len(refs):
                return _stop(FULL + 5, pos)
            refs[n_r, 0], bundle_ref = _K_OTHER, n_r  # until complete: a reference to it now is a cycle
            n_r += 1
        while True:
            # -- the key: a string (or a reference to one), or NULL at the end of the dict
            status, t, flagged, pos = _header(blob, pos, n)
            if status != 0:
                return _stop(status, pos)
            if t == _NULL:
                break
            if t == _REF:
                status, engine, pos = _string_ref(blob, pos, n, refs, n_r)
            else:
                status, engine, pos, n_r, n_str, debug_id = _name(blob, pos, n, t, flagged, refs, n_r, s_start,
                                                                  s_len, s_table, n_str, debug_id)
            if status != 0:
                return _stop(status, pos)

            if engine == debug_id:  # the debug group: inert, dropped (it never counts as a group)
                status, pos, n_r, n_str, debug_id = _skip(blob, pos, n, refs, n_r, s_start, s_len, s_table, n_str,
                                                          debug_id)
                if status != 0:
                    return _stop(status, pos)
                continue

            # -- a group: a list or tuple of slots, or a reference to one read before
            status, t, flagged, pos = _header(blob, pos, n)
            if status != 0:
                return _stop(status, pos)
            first_slot = n_s
            if t == _REF:
                status, r, pos = _reference(blob, pos, n, n_r)
                if status != 0 or refs[r, 0] != _K_GROUP:
                    return _stop(_BAD_REF, pos)
                status, n_s = _group_again(refs, r, max_items, slot_ids, n_s)
                if status != 0:
                    return _stop(status, pos)
            elif t == _LIST or t == _TUPLE or t == _SMALL_TUPLE:
                status, count, pos = _count(blob, pos, n, t)
                if status != 0:
                    return _stop(status, pos)
                group_ref = -1
                if flagged:
                    if n_r == len(refs):
                        return _stop(FULL + 5, pos)
                    refs[n_r, 0], group_ref = _K_OTHER, n_r
                    n_r += 1
                if n_s + count > max_items:
                    return _stop(_TOO_LARGE, pos)
                if n_s + count > len(slot_ids):
                    return _stop(FULL + 1, pos)
                for _ in range(count):
                    # -- a slot: a reference to one read before, or a list/tuple (str, int, ...)
                    status, t, flagged, pos = _header(blob, pos, n)
                    if status != 0:
                        return _stop(status, pos)
                    if t == _REF:
                        status, r, pos = _reference(blob, pos, n, n_r)
                        if status != 0 or refs[r, 0] != _K_SLOT:
                            return _stop(_BAD_REF, pos)
                        slot_ids[n_s] = refs[r, 1]
                        n_s += 1
                        continue
                    if t != _LIST and t != _TUPLE and t != _SMALL_TUPLE:
                        return _stop(_UNEXPECTED, pos - 1)
                    status, width, pos = _count(blob, pos, n, t)
                    if status != 0:
                        return _stop(status, pos)
                    if width == 0:
                        return _stop(_UNEXPECTED, pos)
                    if width - 1 > len(scratch):
                        return _stop(FULL + 6, pos)
                    slot_ref = -1
                    if flagged:
                        if n_r == len(refs):
                            return _stop(FULL + 5, pos)
                        refs[n_r, 0], slot_ref = _K_OTHER, n_r
                        n_r += 1
                    # the operation's name
                    status, t, flagged, pos = _header(blob, pos, n)
                    if status != 0:
                        return _stop(status, pos)
                    if t == _REF:
                        status, op, pos = _string_ref(blob, pos, n, refs, n_r)
                    else:
                        status, op, pos, n_r, n_str, debug_id = _name(blob, pos, n, t, flagged, refs, n_r, s_start,
                                                                      s_len, s_table, n_str, debug_id)
                    if status != 0:
                        return _stop(status, pos)
                    # the operands: integers in (-2**62, 2**62)
                    m = width - 1
                    for k in range(m):
                        status, t, flagged, pos = _header(blob, pos, n)
                        if status != 0:
                            return _stop(status, pos)
                        if t == _INT:
                            if pos + 4 > n:
                                return _stop(_TRUNCATED, pos)
                            value = _i32(blob, pos)
                            pos += 4
                        elif t == _LONG:
                            status, value, pos = _long(blob, pos, n)
                            if status != 0:
                                return _stop(status, pos)
                        elif t == _REF:
                            status, r, pos = _reference(blob, pos, n, n_r)
                            if status != 0 or refs[r, 0] != _K_INT:
                                return _stop(_BAD_REF, pos)
                            value, flagged = refs[r, 1], False
                        else:
                            return _stop(_UNEXPECTED, pos - 1)
                        if flagged:
                            if n_r == len(refs):
                                return _stop(FULL + 5, pos)
                            refs[n_r, 0], refs[n_r, 1] = _K_INT, value
                            n_r += 1
                        scratch[k] = value
                    # the slot's number: each distinct (name, operands) once
                    h = np.uint64(1469598103934665603) ^ np.uint64(op) ^ (np.uint64(m) << np.uint64(40))
                    for k in range(m):
                        h = (h ^ np.uint64(scratch[k] & 0x7FFFFFFFFFFFFFFF)) * np.uint64(1099511628211)
                        h ^= h >> np.uint64(29)
                    mask = np.uint64(len(u_table) - 1)
                    probe = h & mask
                    u = -1
                    while u_table[probe] >= 0:
                        c = u_table[probe]
                        if u_op[c] == op and u_n[c] == m:
                            same = True
                            for k in range(m):
                                if u_operands[u_off[c] + k] != scratch[k]:
                                    same = False
                                    break
                            if same:
                                u = c
                                break
                        probe = (probe + np.uint64(1)) & mask
                    if u < 0:
                        if n_u == len(u_op) or 2 * (n_u + 1) > len(u_table):
                            return _stop(FULL + 2, pos)
                        if n_operands + m > len(u_operands):
                            return _stop(FULL + 3, pos)
                        u = n_u
                        u_op[u], u_n[u], u_off[u], u_table[probe] = op, m, n_operands, u
                        u_operands[n_operands:n_operands + m] = scratch[:m]
                        n_operands += m
                        n_u += 1
                    if slot_ref >= 0:
                        refs[slot_ref, 0], refs[slot_ref, 1] = _K_SLOT, u
                    slot_ids[n_s] = u
                    n_s += 1
                if group_ref >= 0:
                    refs[group_ref, 0], refs[group_ref, 1], refs[group_ref, 2] = _K_GROUP, first_slot, n_s - first_slot
            else:
                return _stop(_UNEXPECTED, pos - 1)
            if n_g + 1 > max_items:
                return _stop(_TOO_LARGE, pos)
            if n_g == len(g_engine):
                return _stop(FULL + 0, pos)
            g_engine[n_g], g_slots[n_g] = engine, n_s - first_slot
            n_g += 1
            n_groups[b] += 1
        if bundle_ref >= 0:
            refs[bundle_ref, 0], refs[bundle_ref, 1], refs[bundle_ref, 2] = _K_BUNDLE, g0, n_g - g0
            refs[bundle_ref, 3], refs[bundle_ref, 4] = s0, n_s - s0
    if pos != n:
        return _stop(_TRAILING, pos)
    return 0, pos, n_b, n_g, n_s, n_u, n_operands, n_str
