"""Both cores taken by other work, for tests and perf/ scripts that compare verdicts idle and
loaded: sandboxed executions computing back to back (each in its own cgroup, as other checks of a
study are) and plain CPU-bound processes, until :meth:`MachineLoad.close` (never past
``LOAD_SECONDS`` each: a crashed caller leaves nothing spinning for long)."""

from __future__ import annotations

import subprocess
import sys
import threading

from heldout.contracts import RunLimits
from heldout.sandbox import run_function, wall_backstop

LOAD_SECONDS = 900
_SPIN = f"import time\nend = time.monotonic() + {LOAD_SECONDS}\nwhile time.monotonic() < end:\n    pass\n"
_COMPUTE = ("import time\ndef f():\n    t = time.process_time()\n"
            "    while time.process_time() - t < 2:\n        pass\n")


class MachineLoad:
    def __init__(self, sandboxed: int, plain: int) -> None:
        self.stop = threading.Event()
        self.executions = 0
        self.threads = [threading.Thread(target=self._sandboxed, daemon=True) for _ in range(sandboxed)]
        self.plain = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(plain)]
        for thread in self.threads:
            thread.start()

    def _sandboxed(self) -> None:
        limits = RunLimits(wall_seconds=wall_backstop(5.0), cpu_seconds=5.0, memory_mb=256)
        while not self.stop.is_set():
            run_function({"prog.py": _COMPUTE}, "prog", "f", limits=limits)
            self.executions += 1

    def running(self) -> bool:
        return all(p.poll() is None for p in self.plain) and all(t.is_alive() for t in self.threads)

    def close(self) -> None:
        self.stop.set()
        for proc in self.plain:
            proc.kill()
            proc.wait()
        for thread in self.threads:
            thread.join()
