"""Runs inside the sandbox (as ``_heldout_vliw_build.py``): import the candidate's entry module,
build the kernel from the four parameters only, and return the instruction stream.

Three forms cross the result channel, tried in this order:

* **marshal** (the default for plain programs): ``marshal.dumps(program, 4)``, zlib-compressed,
  as base64 text: passes in C. The parent never unmarshals it: ``marshal_form`` parses the bytes itself into the
  compact form's arrays, and asks for the JSON form when they hold anything else.
* **compact** (a stream whose marshal bytes exceed 40 MB): the stream serialised, not decoded, as
  a few little-endian integer arrays (base64 text) plus a string table. Each distinct slot is sent
  once; bundles refer to slots by number. The parent decodes and validates it
  (``compact_form.decode_compact``): nothing the child computes is trusted beyond "this is the stream".
* **json** text (bundle key order kept), the fallback for anything the compact forms do not
  express exactly: non-dict bundles, non-str engine keys, slots that are not ``(str, int...)``
  or hold an operand beyond 2**62. The parent reads it through the plain decoder, so odd
  programs fault exactly as before.

Standard library only."""

from __future__ import annotations

import base64
import gc
import importlib
import json
import marshal
import numbers
import sys
import zlib
from array import array
from itertools import chain, compress, repeat
from operator import sub
from typing import Any

COMPACT_FORMAT = "heldout-vliw-compact/1"
MARSHAL_FORMAT = "heldout-vliw-marshal/1"
MARSHAL_VERSION = 4
MAX_MARSHAL_BYTES = 40 * 1024 * 1024  # base64 of it stays under the builder's 64 MB output limit
OPERAND_BOUND = 1 << 62  # int64 arithmetic on operands (load_offset sums, relative jumps) stays exact
FULL_COLLECTION_EVERY = 100  # middle-generation collections per full one while building (default 10)


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


def _packed(values: list[int], signed: bool, below: int | None = None) -> dict[str, str]:
    """``values`` as the narrowest little-endian integer array that holds them, base64 text.
    ``below``: a bound the caller knows for unsigned values (ids in a table), so that no scan
    of the values is needed."""
    if below is not None and not signed:
        lo, hi = 0, below - 1
    else:
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


class _Strings(dict):
    """Engine and operation names -> their number in the string table, numbered as first seen."""

    def __missing__(self, name: str) -> int:
        number = self[name] = len(self)
        return number


class _SlotTable(dict):
    """Distinct slots -> their number. A lookup of a known slot stays in C (``dict`` subscript);
    only a new slot reaches :meth:`__missing__`, which checks its shape and records it."""

    def __init__(self, strings: _Strings) -> None:
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
        number = self[slot] = len(self.op)
        self.op.append(self.strings[slot[0]])
        self.n.append(len(operands))
        self.operands.extend(operands)
        return number


def compact(program: list | tuple) -> dict[str, Any] | None:
    """The compact form of ``program``, or None when it holds anything the form cannot express
    exactly (the caller then sends JSON). ``debug`` keys are dropped: they are inert and never
    checked, and a bundle's cycle charge is "has a non-debug key", which the groups still say.

    Every pass over the stream runs in C (``map``, ``chain``, ``set``), not a Python loop per
    bundle (10-15% faster on the baseline's 147,735 bundles). The type scans come first because
    equal values of other types (1 == True == 1.0) would share a slot's number."""
    if not set(map(type, program)) <= {dict}:
        return None
    engines = list(chain.from_iterable(program))
    if not set(map(type, engines)) <= {str}:
        return None
    groups = list(chain.from_iterable(map(dict.values, program)))  # aligned with engines
    n_groups = list(map(len, program))
    if "debug" in engines:  # dropped where they are: a mask over the groups, each bundle's count less one
        keep = list(map("debug".__ne__, engines))
        engines, groups = list(compress(engines, keep)), list(compress(groups, keep))
        n_groups = list(map(sub, n_groups, map(dict.__contains__, program, repeat("debug"))))
    if not set(map(type, groups)) <= {list, tuple}:
        return None
    every_slot = list(chain.from_iterable(groups))
    if not set(map(type, every_slot)) <= {tuple, list} \
            or not set(map(type, chain.from_iterable(every_slot))) <= {str, int}:
        return None
    strings = _Strings()
    g_engine = list(map(strings.__getitem__, engines))
    table = _SlotTable(strings)
    try:
        try:
            slot_ids = list(map(table.__getitem__, every_slot))
        except TypeError:  # list slots are unhashable: number them as tuples
            slot_ids = list(map(table.__getitem__, map(tuple, every_slot)))
    except _Inexpressible:
        return None
    return {"format": COMPACT_FORMAT, "strings": list(strings),
            "n_groups": _packed(n_groups, False),
            "group_engine": _packed(g_engine, False, below=len(strings)),
            "group_slots": _packed(list(map(len, groups)), False),
            "slot_ids": _packed(slot_ids, False, below=len(table.op)),
            "unique_op": _packed(table.op, False), "unique_n": _packed(table.n, False),
            "unique_operands": _packed(table.operands, True)}


def marshalled(program: list | tuple) -> dict[str, str] | None:
    """The stream as ``marshal`` bytes (compressed, base64 text), or None when marshal refuses it (an object
    of a type it does not write, subclasses included) or it is too large to send this way."""
    try:
        blob = marshal.dumps(program, MARSHAL_VERSION)
    except (ValueError, TypeError):  # e.g. a numpy integer, a str-valued Enum, a nest too deep
        return None
    if len(blob) > MAX_MARSHAL_BYTES:
        return None
    # zlib at level 1: 9 ms for the baseline's 5 MB, 42x smaller, which saves more than that in
    # base64, JSON and the pipe on both sides
    return {"format": MARSHAL_FORMAT, "data": base64.b64encode(zlib.compress(blob, 1)).decode("ascii")}


def build(entry_module: str, forest_height: int, n_nodes: int, batch_size: int, rounds: int,
          max_bundles: int, form: str = "json") -> str | dict[str, Any]:
    """Build the kernel; return it compact (``form="compact"``, when expressible) or as JSON text."""
    # A stream is one dict and one list per bundle, all kept to the end: with CPython's default
    # thresholds a full collection re-scans everything alive at every quarter of growth, which was
    # half of building the baseline in the sandbox (0.20 s against 0.10 s: 7 full collections, now
    # 1). Young garbage is still collected as often as before; older garbage cycles at least every
    # 700,000 net allocations (about 100 MB at most), not every 70,000.
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
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
        packed = marshalled(program)
        if packed is None:
            packed = compact(program)
        if packed is not None:
            return packed
    return as_json(program)
