"""The ``published`` extractors on 100,000-character adversarial outputs (target: under 50 ms
each), beside the official MMLU-Pro regexes applied directly to the same text.

The outputs (tests/adversarial_outputs.py) are one long line per family with the answer at the
end, built so that a direct regex reading is slow. The reference, measured in the same run, is
the official MMLU-Pro extractor (tests/reference_rules.py: its three regexes as
``evaluate_from_local.py`` applies them); it is quadratic on a long line, so it runs on the same output cut to
10,000 and 20,000 characters (at 100,000 it would take about a minute per output), and the ratio
is a speed-up: the reference's time over heldout's on the same 20,000 characters. The note gives the reference's
growth from 10k to 20k (4x is quadratic) and heldout's from 20k to 100k (5x is linear). The
unit tests guard that growth, not the time: tests/test_published_extractors.py checks that every
extractor's CPU time grows less than 24x from 50k to 400k characters (linear: about 8x; the
official regexes, quadratic, grow 64x over the same 8x in length).

    python perf/extraction_speed.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]

from adversarial_outputs import adversarial_outputs, published_reading  # noqa: E402
from heldout.benchmarks.extraction.text import forget_texts  # noqa: E402
from machine import verdict  # noqa: E402
from reference_rules import official_mmlu_pro  # noqa: E402

LENGTH = 100_000
REFERENCE_LENGTHS = (10_000, 20_000)  # the direct regexes are quadratic: 100k would take ~1 min each
TARGET_MS = 50.0


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        forget_texts()  # every repeat reads its text afresh, as a new output is
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def figures(repeat: int = 5) -> list[dict]:
    """Rows for perf/run_all.py: one per adversarial output, heldout's published extractor of its
    family at 100k characters; the ratio is its speed-up over the official MMLU-Pro regexes on the
    same text cut to 20k characters."""
    full = adversarial_outputs(LENGTH)
    cut = {n: adversarial_outputs(n) for n in REFERENCE_LENGTHS}
    rows = []
    for name, case in full.items():
        def heldout_on(text: str) -> float:
            return median_seconds(lambda: published_reading(case.family, text), repeat)
        ours = heldout_on(case.text)
        ours_20k = heldout_on(cut[REFERENCE_LENGTHS[-1]][name].text)
        official = [median_seconds(lambda t=cut[n][name].text: official_mmlu_pro(t), 1) for n in REFERENCE_LENGTHS]
        rows.append({
            "name": f"extraction: {name}", "value": ours * 1e3, "unit": "ms", "ratio": official[-1] / ours_20k,
            "target": f"< {TARGET_MS:g} ms at 100k; speed-up vs official regexes, 20k",
            "passed": ours * 1e3 < TARGET_MS and published_reading(case.family, case.text) == case.answer,
            "note": (f"official regexes {official[0] * 1e3:.0f} ms at 10k, {official[-1] * 1e3:.0f} ms at 20k "
                     f"({official[-1] / official[0]:.1f}x); heldout {ours_20k * 1e3:.2f} ms at 20k "
                     f"({ours / ours_20k:.1f}x to 100k)")})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of heldout's extractor per figure (median)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    rows = figures(args.repeat)
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['value']:7.2f} ms  speed-up {r['ratio']:,.0f}x  "
              f"{verdict(r['passed'])}  {r['note']}")


if __name__ == "__main__":
    main()
