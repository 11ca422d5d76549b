"""The VLIW kernel simulator and the ``vliw/takehome`` task (issue 7; ``../shared/specs/vliw.md``).

* :mod:`.reference` - the plain-Python machine: the executable specification;
* :mod:`.fast` - the same machine as decoded integer arrays, run by :mod:`.interpreter` (numba);
* :mod:`.compact_form`, :mod:`.marshal_form` - the streams a sandboxed builder sends, decoded
  as hostile input into those arrays (the marshal bytes by :mod:`.marshal_parser`, numba;
  :mod:`.build_runner` is the builder's side);
* :mod:`.machine` - the public API, ``simulate(program, memory, ...)``;
* :mod:`.benchmark` - the forest/hash benchmark, memory image and reference algorithm;
* :mod:`.task` - the registered task: builders run in the sandbox, hidden instances, cycles.
"""

from heldout.benchmarks.vliw.machine import (
    DEFAULT_CYCLE_CAP, DecodedProgram, Fault, InvalidInput, SimResult, decode, simulate, utilisation,
    words_sha256,
)
from heldout.benchmarks.registry import register
from heldout.benchmarks.vliw.task import TASK, VliwTakehome

register(TASK)

__all__ = ["DEFAULT_CYCLE_CAP", "DecodedProgram", "Fault", "InvalidInput", "SimResult", "decode", "simulate",
           "utilisation", "words_sha256", "TASK", "VliwTakehome"]
