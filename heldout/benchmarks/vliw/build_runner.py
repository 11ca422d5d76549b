"""Runs inside the sandbox (as ``_heldout_vliw_build.py``): import the candidate's entry module,
build the kernel from the four parameters only, and return the instruction stream as JSON text.

The text keeps each bundle's key order (it decides write conflicts). Standard library only."""

from __future__ import annotations

import importlib
import json
import numbers
from typing import Any


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


def build(entry_module: str, forest_height: int, n_nodes: int, batch_size: int, rounds: int,
          max_bundles: int) -> str:
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
    out = []
    for i, bundle in enumerate(program):
        if not isinstance(bundle, dict):
            raise NotPlainData(f"bundle {i} is a {type(bundle).__name__}, not a dict engine -> slots")
        # keys stay in insertion order; non-string keys become their str() and fault as unknown engines
        out.append({_key(k): _plain(v, f"bundle {i} engine {k!r}") for k, v in bundle.items()})
    return json.dumps(out, separators=(",", ":"))
