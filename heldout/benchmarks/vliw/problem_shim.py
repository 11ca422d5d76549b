"""``problem``: the module kernel builders written for the take-home import, as heldout ships it
into the sandbox (spec section 8). Same names, same meaning; ``Machine`` is a thin wrapper over
heldout's reference machine so that builders which simulate locally still work.

In the sandbox this file is ``problem.py`` next to ``_heldout_vliw_reference.py`` and
``_heldout_vliw_benchmark.py`` (copies of heldout's ``reference.py`` and ``benchmark.py``).
Debug ``compare`` slots are not checked here: heldout scores with debug disabled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from _heldout_vliw_benchmark import (  # noqa: F401  (re-exported names)
    HASH_STAGES, Input, Tree, build_mem_image, myhash, reference_kernel, reference_kernel2,
)
from _heldout_vliw_reference import (  # noqa: F401
    N_CORES, SCRATCH_SIZE, SLOT_LIMITS, VLEN, MachineFault, ReferenceMachine,
)

Engine = str
Instruction = dict
BASE_ADDR_TID = 100000


class CoreState(Enum):
    RUNNING = 1
    PAUSED = 2
    STOPPED = 3


@dataclass
class DebugInfo:
    scratch_map: dict = field(default_factory=dict)


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


class _CoreView:
    def __init__(self, machine: ReferenceMachine) -> None:
        self._m = machine
        self.id = 0

    @property
    def scratch(self) -> list[int]:
        return self._m.scratch

    @property
    def pc(self) -> int:
        return self._m.pc

    @property
    def state(self) -> CoreState:
        return CoreState[self._m.state]

    @property
    def trace_buf(self) -> list[int]:
        return self._m.trace_buf


class Machine:
    """``Machine(mem_dump, program, debug_info, n_cores=1, ...)`` with ``run()``, ``cycle``,
    ``mem``, ``cores``, ``enable_pause`` and ``enable_debug``, over the reference machine."""

    def __init__(self, mem_dump: list[int], program: list[Any], debug_info: Any = None, n_cores: int = 1,
                 scratch_size: int = SCRATCH_SIZE, trace: bool = False, value_trace: Any = None) -> None:
        if n_cores != 1:
            raise ValueError("heldout's machine has exactly one core")
        self._m = ReferenceMachine(program, mem_dump)
        self.enable_pause = True
        self.enable_debug = True
        self.cores = [_CoreView(self._m)]
        self.prints = False

    @property
    def mem(self) -> list[int]:
        return self._m.memory

    @property
    def cycle(self) -> int:
        return self._m.cycle

    def run(self) -> None:
        self._m.enable_pause = self.enable_pause
        self._m.run()
