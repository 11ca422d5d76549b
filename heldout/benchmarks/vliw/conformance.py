"""Conformance cases: the input of ``heldout vliw simulate CASES.json``.

CASES.json is a list of ``{"name", "program": [bundle...], "mem": [int...], "scratch_init":
{"addr": v} (optional), "enable_pause": bool (optional), "runs": int (optional)}``; a bundle is
an object engine -> list of slot arrays (key order significant). Each case gives one line:
``{"name", "cycle", "pc", "state", "memory_sha256", "scratch_sha256", "error"}`` with the hashes
of the final words packed as little-endian uint32 and ``error`` null or the fault kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heldout.files import read_user_json
from heldout.benchmarks.vliw.machine import DEFAULT_CYCLE_CAP, InvalidInput, simulate, words_sha256

CASE_KEYS = {"name", "program", "mem", "scratch_init", "enable_pause", "runs"}


def run_case(case: Any, *, engine: str = "fast", cycle_cap: int = DEFAULT_CYCLE_CAP) -> dict[str, Any]:
    """One case -> its result line. Raises :class:`InvalidInput` for a malformed case."""
    if not isinstance(case, dict):
        raise InvalidInput(f"a case is a JSON object, got {type(case).__name__}")
    unknown = set(case) - CASE_KEYS
    if unknown:
        raise InvalidInput(f"case {case.get('name')!r}: unknown keys {sorted(unknown)}")
    for key in ("name", "program", "mem"):
        if key not in case:
            raise InvalidInput(f"case {case.get('name')!r}: missing {key!r}")
    enable_pause = case.get("enable_pause", False)
    if not isinstance(enable_pause, bool):
        raise InvalidInput(f"case {case['name']!r}: enable_pause must be true or false")
    result = simulate(case["program"], case["mem"], enable_pause=enable_pause, runs=case.get("runs", 1),
                      scratch_init=case.get("scratch_init"), cycle_cap=cycle_cap, engine=engine)
    return {"name": case["name"], "cycle": result.cycles, "pc": result.pc, "state": result.state,
            "memory_sha256": words_sha256(result.memory), "scratch_sha256": words_sha256(result.scratch),
            "error": None if result.fault is None else result.fault.kind}


def load_cases(path: str | Path) -> list[Any]:
    return read_user_json(path, "cases file", expect=list, error=InvalidInput)
