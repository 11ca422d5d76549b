"""The public simulator API: :func:`simulate` and the helpers the task and the CLI share.

``simulate(program, memory, *, enable_pause=False, cycle_cap=DEFAULT_CYCLE_CAP)`` returns a
:class:`SimResult`: cycles, pc, state (``RUNNING``/``PAUSED``/``STOPPED``), final memory and
scratch, the fault (kind, bundle index, message) or None, and slots executed per engine.
``engine="fast"`` (default) decodes once and runs the numba interpreter; ``engine="reference"``
runs the plain-Python executable specification. Both give identical results.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

import numpy as np

from heldout.contracts import HeldoutError
from heldout.benchmarks.vliw.fast import DecodedProgram, decode, run_decoded
from heldout.benchmarks.vliw.reference import (
    CHECKED_ENGINES, DEFAULT_CYCLE_CAP, MASK, SCRATCH_SIZE, SLOT_LIMITS, Fault, SimResult,
    simulate_reference,
)

__all__ = ["simulate", "decode", "DecodedProgram", "SimResult", "Fault", "InvalidInput", "words_sha256",
           "utilisation", "check_memory", "DEFAULT_CYCLE_CAP"]


class InvalidInput(HeldoutError, ValueError):
    """The caller's memory image, scratch initialisation or options are not valid machine input
    (as opposed to a faulting program, which is a result, not an error)."""


def check_memory(memory: Sequence[Any]) -> list[int]:
    if isinstance(memory, np.ndarray):
        memory = memory.tolist()
    if not isinstance(memory, (list, tuple)):
        raise InvalidInput(f"memory must be a list of words, got {type(memory).__name__}")
    if not memory or (set(map(type, memory)) == {int} and min(memory) >= 0 and max(memory) <= MASK):
        return list(memory)  # the common case at C speed (exact ints only: bool is excluded)
    for i, v in enumerate(memory):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MASK:
            raise InvalidInput(f"memory word {i} is {v!r}: words are integers in [0, 2**32)")
    return list(memory)


def check_scratch_init(scratch_init: Mapping[Any, Any] | None) -> dict[int, int]:
    out: dict[int, int] = {}
    for key, value in (scratch_init or {}).items():
        try:
            addr = int(key)
        except (TypeError, ValueError):
            raise InvalidInput(f"scratch_init key {key!r} is not an address") from None
        if not 0 <= addr < SCRATCH_SIZE:
            raise InvalidInput(f"scratch_init address {addr} is outside [0, {SCRATCH_SIZE})")
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MASK:
            raise InvalidInput(f"scratch_init value {value!r} at {addr} is not a word in [0, 2**32)")
        out[addr] = value
    return out


def simulate(program: Sequence[Any] | DecodedProgram, memory: Sequence[int], *, enable_pause: bool = False,
             cycle_cap: int = DEFAULT_CYCLE_CAP, scratch_init: Mapping[Any, int] | None = None,
             runs: int = 1, engine: str = "fast") -> SimResult:
    """Run ``program`` (list of bundles, or a :class:`DecodedProgram` to reuse one decode across
    instances) on a copy of ``memory``. ``runs`` = number of ``run()`` calls (each resumes a
    paused core). Never raises for what the program does; raises :class:`InvalidInput` for bad
    memory, scratch_init or options."""
    mem = check_memory(memory)
    init = check_scratch_init(scratch_init)
    if not isinstance(runs, int) or runs < 1:
        raise InvalidInput(f"runs must be a positive integer, got {runs!r}")
    if not isinstance(cycle_cap, int) or cycle_cap < 0:
        raise InvalidInput(f"cycle_cap must be a non-negative integer, got {cycle_cap!r}")
    if engine == "reference":
        if isinstance(program, DecodedProgram):
            raise InvalidInput("the reference engine runs the program itself, not a decoded one")
        if not isinstance(program, (list, tuple)):
            raise InvalidInput(f"a program is a list of bundles, got {type(program).__name__}")
        return simulate_reference(program, mem, enable_pause=enable_pause, cycle_cap=cycle_cap,
                                  scratch_init=init, runs=runs)
    if engine != "fast":
        raise InvalidInput(f"engine must be 'fast' or 'reference', got {engine!r}")
    if not isinstance(program, DecodedProgram):
        if not isinstance(program, (list, tuple)):
            raise InvalidInput(f"a program is a list of bundles, got {type(program).__name__}")
        program = decode(program)
    return run_decoded(program, mem, enable_pause=enable_pause, cycle_cap=cycle_cap, scratch_init=init,
                       runs=runs)


def words_sha256(words: Sequence[int]) -> str:
    """sha256 hex of the words packed as little-endian uint32 (the conformance fingerprint)."""
    return hashlib.sha256(np.asarray(words, dtype="<u4").tobytes()).hexdigest()


def utilisation(result: SimResult) -> dict[str, float]:
    """Per engine: slots used / slots available over the run (limit x cycles)."""
    if result.cycles == 0:
        return {e: 0.0 for e in CHECKED_ENGINES}
    return {e: result.slots.get(e, 0) / (SLOT_LIMITS[e] * result.cycles) for e in CHECKED_ENGINES}


def load_program_json(text: str) -> list[Any]:
    """A JSON instruction stream: a list of bundles (objects engine -> list of slot arrays; key
    order is kept because it decides write conflicts). Raises :class:`InvalidInput`."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"instruction stream is not valid JSON: {exc}") from None
    if isinstance(data, dict) and "program" in data:
        data = data["program"]
    if not isinstance(data, list):
        raise InvalidInput(f"an instruction stream is a JSON list of bundles, got {type(data).__name__}")
    return data
