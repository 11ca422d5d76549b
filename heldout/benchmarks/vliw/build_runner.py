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
from itertools import chain
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


class _Inexpressible(Exception):
    """The stream holds something the compact form cannot express exactly."""


class _SlotTable(dict):
    """Distinct slots -> their number. A lookup of a known slot stays in C (``dict`` subscript);
    only a new slot reaches :meth:`__missing__`, which checks its shape and records it."""

    def __init__(self, strings: dict[str, int]) -> None:
        super().__init__()
        self.strings = strings
        self.op: list[int] = []
        self.n: list[int] = []
        self.operands: list[int] = []

    def __missing__(self, slot: tuple) -> int:
        if type(slot) is not tuple or not slot or type(slot[0]) is not str:
            raise _Inexpressible
        operands = slot[1:]
        for v in operands:
            if type(v) is not int or not -OPERAND_BOUND < v < OPERAND_BOUND:
                raise _Inexpressible
        op = self.strings.get(slot[0])
        if op is None:
            op = self.strings[slot[0]] = len(self.strings)
        number = self[slot] = len(self.op)
        self.op.append(op)
        self.n.append(len(operands))
        self.operands.extend(operands)
        return number


def compact(program: list | tuple) -> dict[str, Any] | None:
    """The compact form of ``program``, or None when it holds anything the form cannot express
    exactly (the caller then sends JSON). ``debug`` keys are dropped: they are inert and never
    checked, and a bundle's cycle charge is "has a non-debug key", which the groups still say."""
    strings: dict[str, int] = {}
    table = _SlotTable(strings)
    number = table.__getitem__
    n_groups: list[int] = []
    g_engine: list[int] = []
    g_slots: list[int] = []
    slot_ids: list[int] = []
    every_slot: list[Any] = []
    try:
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
                every_slot.extend(slots)
                mark = len(slot_ids)
                try:
                    slot_ids.extend(map(number, slots))
                except TypeError:  # list slots are unhashable: number them as tuples
                    del slot_ids[mark:]
                    slot_ids.extend(map(number, map(tuple, slots)))
            n_groups.append(groups)
    except (_Inexpressible, TypeError, ValueError):
        return None
    # Equal slots share a number, and 1 == True == 1.0 as dict keys: only exact (str, int...)
    # tuples and lists may be numbered by equality. Both scans run in C.
    if not {type(s) for s in every_slot} <= {tuple, list} \
            or not set(map(type, chain.from_iterable(every_slot))) <= {str, int}:
        return None
    return {"format": COMPACT_FORMAT, "strings": list(strings),
            "n_groups": _packed(n_groups, False), "group_engine": _packed(g_engine, False),
            "group_slots": _packed(g_slots, False), "slot_ids": _packed(slot_ids, False),
            "unique_op": _packed(table.op, False), "unique_n": _packed(table.n, False),
            "unique_operands": _packed(table.operands, True)}


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
