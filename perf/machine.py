"""What the perf scripts print about the machine beside their figures: a fixed loop's time (this
VM has slow phases about 2x the calm ones) and the load average."""

from __future__ import annotations

import time


def fixed_loop_seconds() -> float:
    """The time of one fixed pure-Python loop: printed beside the load, so a reader can tell a
    slow phase of the machine from a slow heldout."""
    start = time.perf_counter()
    total = 0
    for i in range(3_000_000):
        total += i & 7
    return time.perf_counter() - start


def verdict(passed: bool | None) -> str:
    """A row's result column: PASS or FAIL against its target, or INFO for a figure reported
    beside a target row (``passed`` None), which counts for neither."""
    return "INFO" if passed is None else "PASS" if passed else "FAIL"
