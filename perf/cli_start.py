"""CLI start-up: wall time of `heldout --help` and `heldout --version` beside `python -c pass`.

Median of 5 runs each, in fresh interpreters (nothing cached in-process). The target (issue 39) is
under 0.5 s on an idle machine; the ratio to a bare interpreter says how much heldout itself adds.
Run: python perf/cli_start.py   (prints the load average too, since a busy machine inflates all three)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

RUNS = 5
CLI = "import sys; from heldout.cli import main; sys.exit(main(sys.argv[1:]))"


def median_wall(argv: list[str]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    base = median_wall([sys.executable, "-c", "pass"])
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; median of {RUNS}")
    print(f"{'python -c pass':<20} {base:7.3f} s")
    for flag in ("--help", "--version"):
        t = median_wall([sys.executable, "-c", CLI, flag])
        print(f"{'heldout ' + flag:<20} {t:7.3f} s   {t / base:5.1f}x python -c pass")


if __name__ == "__main__":
    main()
