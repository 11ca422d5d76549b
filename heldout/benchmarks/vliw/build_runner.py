"""Runs inside the sandbox (as ``_heldout_vliw_build.py``): import the candidate's entry module,
build the kernel from the four parameters only, and return the instruction stream.

Two forms cross the result channel:

* **compact** (the default for plain programs): the stream serialised, not decoded, as a few
  little-endian integer arrays (base64 text) plus a string table. Each distinct slot is sent
  once; bundles refer to slots by number. The parent decodes and validates it
  (``fast.decode_compact``): nothing the child computes is trusted beyond "this is the stream".
* **json** text (bundle key order kept), the fallback for anything the compact form does not
  express exactly: non-dict bundles, non-str engine keys, slots that are not ``(str, int...)``
  or hold an operand beyond 2**62. The parent reads it through the plain decoder, so odd
  programs fault exactly as before.

Standard library only."""

from __future__ import annotations

import base64
import importlib
import json
import numbers
import sys
from array import array
from typing import Any

COMPACT_FORMAT = "heldout-vliw-compact/1"
OPERAND_BOUND = 1 << 62  # int64 arithmetic on operands (load_offset sums, relative jumps) stays exact


class NotPlainData(Exception):
    pass


def _plain(value: Any, where: str) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float):
        return value  # the machine rejects it with a named fault, not the builder
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    raise NotPlainData(f"{where}: {type(value).__name__} is not plain data (ints, strings, lists)")


def _key(key: Any) -> str:
    # str subclasses (e.g. a str-valued Enum) keep their text; anything else becomes str() and
    # then faults as an unknown engine when the machine reaches it
    return str.__str__(key) if isinstance(key, str) else str(key)


def as_json(program: list | tuple) -> str:
    """The plain form: JSON text of the stream (tuples -> lists, integral numbers -> int)."""
    out = []
    for i, bundle in enumerate(program):
        if not isinstance(bundle, dict):
            raise NotPlainData(f"bundle {i} is a {type(bundle).__name__}, not a dict engine -> slots")
        # keys stay in insertion order; non-string keys become their str() and fault as unknown engines
        out.append({_key(k): _plain(v, f"bundle {i} engine {k!r}") for k, v in bundle.items()})
    return json.dumps(out, separators=(",", ":"))


def _packed(values: list[int], signed: bool) -> dict[str, str]:
    """``values`` as the narrowest little-endian integer array that holds them, base64 text."""
    lo = min(values, default=0)
    hi = max(values, default=0)
    if not signed and lo >= 0 and hi < 1 << 8:
        code, name = "B", "u1"
    elif not signed and lo >= 0 and hi < 1 << 16:
        code, name = "H", "u2"
    elif -(1 << 31) <= lo and hi < 1 << 31:
        code, name = "i", "i4"
    else:
        code, name = "q", "i8"
    arr = array(code, values)
    if arr.itemsize != int(name[1]):  # exotic C ABI: fall back to 8-byte words
        arr, name = array("q", values), "i8"
    if sys.byteorder == "big":
        arr.byteswap()
    return {"dtype": name, "data": base64.b64encode(arr.tobytes()).decode("ascii")}


def compact(program: list | tuple) -> dict[str, Any] | None:
    """The compact form of ``program``, or None when it holds anything the form cannot express
    exactly (the caller then sends JSON). ``debug`` keys are dropped: they are inert and never
    checked, and a bundle's cycle charge is "has a non-debug key", which the groups still say."""
    strings: dict[str, int] = {}
    uniques: dict[tuple, int] = {}
    u_op: list[int] = []
    u_n: list[int] = []
    u_operands: list[int] = []
    n_groups: list[int] = []
    g_engine: list[int] = []
    g_slots: list[int] = []
    slot_ids: list[int] = []
    add_slot = slot_ids.append
    bound = OPERAND_BOUND
    for bundle in program:
        if type(bundle) is not dict:
            return None
        groups = 0
        for engine, slots in bundle.items():
            if type(engine) is not str:
                return None
            if engine == "debug":
                continue
            if type(slots) is not list and type(slots) is not tuple:
                return None
            e = strings.get(engine)
            if e is None:
                e = strings[engine] = len(strings)
            g_engine.append(e)
            g_slots.append(len(slots))
            groups += 1
            for slot in slots:
                # the key carries every element's type: 1, True, 1.0 and np.int64(1) are equal
                # as dict keys but not as operands
                kind = type(slot)
                if kind is tuple:
                    key = (slot, *map(type, slot))
                elif kind is list:
                    key = (tuple(slot), *map(type, slot))
                else:
                    return None
                try:
                    i = uniques.get(key)
                except Exception:  # an element whose hash fails: the plain path reports it
                    return None
                if i is None:
                    if not slot or type(slot[0]) is not str:
                        return None
                    operands = slot[1:]
                    for v in operands:
                        if type(v) is not int or not -bound < v < bound:
                            return None
                    op = strings.get(slot[0])
                    if op is None:
                        op = strings[slot[0]] = len(strings)
                    i = uniques[key] = len(u_op)
                    u_op.append(op)
                    u_n.append(len(operands))
                    u_operands.extend(operands)
                add_slot(i)
        n_groups.append(groups)
    return {"format": COMPACT_FORMAT, "strings": list(strings),
            "n_groups": _packed(n_groups, False), "group_engine": _packed(g_engine, False),
            "group_slots": _packed(g_slots, False), "slot_ids": _packed(slot_ids, False),
            "unique_op": _packed(u_op, False), "unique_n": _packed(u_n, False),
            "unique_operands": _packed(u_operands, True)}


def build(entry_module: str, forest_height: int, n_nodes: int, batch_size: int, rounds: int,
          max_bundles: int, form: str = "json") -> str | dict[str, Any]:
    """Build the kernel; return it compact (``form="compact"``, when expressible) or as JSON text."""
    module = importlib.import_module(entry_module)
    builder_class = getattr(module, "KernelBuilder", None)
    if builder_class is None:
        raise RuntimeError(f"{entry_module}.py defines no KernelBuilder")
    builder = builder_class()
    builder.build_kernel(forest_height, n_nodes, batch_size, rounds)
    program = getattr(builder, "instrs", None)
    if not isinstance(program, (list, tuple)):
        raise RuntimeError(f"KernelBuilder.instrs must be a list of bundles, got {type(program).__name__}")
    if len(program) > max_bundles:
        raise RuntimeError(f"the program has {len(program)} bundles; the cap is {max_bundles}")
    if form == "compact":
        packed = compact(program)
        if packed is not None:
            return packed
    return as_json(program)
