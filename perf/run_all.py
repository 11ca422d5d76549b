"""Every performance figure in one table: value, reference, ratio, target, pass/fail.

Each row is measured against a reference or ceiling taken in the same run and under the same load
(this machine's speed swings by up to 2x within minutes, so fixed figures from another day say
little): the VLIW per-candidate cost against its ceiling (the candidate's own build run bare plus
the frozen instances on heldout's fastest simulator) and against a stand-in for the original
harness (perf/vliw_candidate.py); the Lockpicking exhaustive check (perf/lockpicking_exhaustive.py);
the model endpoint against bare httpx at the same concurrency and against a rate-limited server
(perf/model_throughput.py); the protected path, a session evaluating batches of 50 against a
chain-of-thought loopback server at 0 and 50 ms latency, against the bare ``ModelClient`` sending the
same requests (perf/protected_path.py); a sandboxed execution through the fork server against a bare
``python -c pass`` at p50 and p95 (perf/sandbox_throughput.py); MBPP+ against evalplus on 30
problems, the median of 5 interleaved rounds (perf/mbpp_plus_run.py); a grid on Ray against serial and against a local pool
(perf/ray_grid.py, needs the [ray] extra); the results store's and ``heldout report``'s scaling
as a study grows (perf/store_build.py, perf/report_scaling.py); the CLI's start against a bare
interpreter (perf/cli_start.py); the published answer extractors on 100k-character adversarial
outputs against the official MMLU-Pro regexes on the same text (perf/extraction_speed.py); the local model's server against llama-cpp-python called
directly (perf/local_model_throughput.py, needs the [local-model] extra and is skipped with
``--no-local-model``); with ``--suite``, the test suite's wall time (perf/test_suite.py, ~12 min);
with ``--mbpp-full``, the full 378-problem MBPP+ run.

    python perf/run_all.py [--data-dir ../shared/data] [--repeat 3] [--suite] [--json out.json]

``--repeat 3`` runs every section three times, interleaved, and prints each row's median repeat
with the spread of its ratio; the footer gives a fixed loop's time beside the load average, so a
slow phase of the machine shows as one. The exit code is 0 when every row with a target passes;
rows marked INFO (a figure beside a target row, e.g. the VLIW speed-up over the original harness,
whose fixed target issue 38 replaced by the ceiling row) count for neither.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's heldout and the sibling scripts

import cli_start  # noqa: E402
import extraction_speed  # noqa: E402
import local_model_throughput  # noqa: E402
import lockpicking_exhaustive  # noqa: E402
import mbpp_plus_run  # noqa: E402
import model_throughput  # noqa: E402
import protected_path  # noqa: E402
import ray_grid  # noqa: E402
import report_scaling  # noqa: E402
import sandbox_throughput  # noqa: E402
import store_build  # noqa: E402
import test_suite  # noqa: E402
import vliw_candidate  # noqa: E402
from machine import fixed_loop_seconds, verdict  # noqa: E402


def median_rows(repeats: list[list[dict]]) -> list[dict]:
    """Per row name, the repeat whose ratio is the (lower) median, its note extended with the
    ratio's spread over the repeats; one repeat passes through unchanged."""
    if len(repeats) == 1:
        return repeats[0]
    by_name: dict[str, list[dict]] = {}
    for rows in repeats:
        for row in rows:
            by_name.setdefault(row["name"], []).append(row)
    out = []
    for name, seen in by_name.items():
        ordered = sorted(seen, key=lambda r: (math.isnan(r["ratio"]), r["ratio"]))
        middle = ordered[(len(ordered) - 1) // 2]
        ratios = [r["ratio"] for r in seen if not math.isnan(r["ratio"])]
        spread = f"ratio {min(ratios):.2f}-{max(ratios):.2f} over {len(seen)} repeats" if ratios else "no ratio"
        out.append({**middle, "note": f"{spread}; {middle['note']}"})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("HELDOUT_DATA_DIR", str(HERE.parent.parent / "shared" / "data")))
    parser.add_argument("--mbpp-full", action="store_true", help="also the full 378-problem MBPP+ run")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--suite", action="store_true",
                        help="also time the test suite (fast loop and whole suite: about 12 min on 2 idle cores)")
    parser.add_argument("--no-local-model", action="store_true",
                        help="skip the local-model rows (they need the [local-model] extra and its weights)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every section N times (interleaved); each row is the repeat of median ratio, "
                             "with the spread of the ratio over the N")
    args = parser.parse_args()
    started = time.perf_counter()
    load_before = os.getloadavg()
    sections = [("vliw", lambda: vliw_candidate.figures(repeat=3)),
                ("lockpicking", lambda: lockpicking_exhaustive.figures(repeat=5)),
                ("model endpoint", model_throughput.figures),
                ("protected path", lambda: protected_path.figures(args.data_dir)),
                ("sandbox", sandbox_throughput.figures),
                ("mbpp+ subset", lambda: mbpp_plus_run.figures(args.data_dir, limit=30)),
                ("ray grid", ray_grid.figures),
                ("results store", store_build.figures),
                ("reports", report_scaling.figures),
                ("cli start", cli_start.figures),
                ("extraction", extraction_speed.figures)]
    if not args.no_local_model:
        sections.append(("local model", local_model_throughput.figures))
    if args.suite:
        sections.append(("test suite", lambda: test_suite.figures(args.data_dir)))
    if args.mbpp_full:
        sections.append(("mbpp+ full", lambda: mbpp_plus_run.figures(args.data_dir, limit=None)))
    repeats: list[list[dict]] = []
    for k in range(max(1, args.repeat)):
        rows: list[dict] = []
        for label, measure in sections:
            t0 = time.perf_counter()
            try:
                got = measure()
            except (Exception, SystemExit) as exc:  # one failing section still leaves the others' figures
                got = [{"name": label, "value": math.nan, "unit": "", "ratio": math.nan, "target": "",
                        "passed": False, "note": f"could not measure: {type(exc).__name__}: {exc}"}]
            print(f"[{label}: {time.perf_counter() - t0:.0f} s, repeat {k + 1}]", file=sys.stderr, flush=True)
            rows.extend(got)
        repeats.append(rows)
    rows = median_rows(repeats)
    width = max(len(r["name"]) for r in rows)
    print(f"{'figure':<{width}}  {'value':>10}  {'ratio':>7}  {'target':<38} {'result':<6} note")
    for r in rows:
        value = f"{r['value']:.3f} {r['unit']}"
        print(f"{r['name']:<{width}}  {value:>10}  {r['ratio']:>7.2f}  {r['target']:<38} "
              f"{verdict(r['passed']):<6} {r['note']}")
    load_after = os.getloadavg()
    print(f"\nfixed loop {fixed_loop_seconds():.3f} s (a pure-Python loop: this machine's speed phase now); "
          f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}; {os.cpu_count()} cores; "
          f"total {time.perf_counter() - started:.0f} s. Each row's target names its reference; ratios are "
          "value / reference, except throughputs and speed-ups (reference / value or achieved / allowed), as the "
          "target says.")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    judged = [r for r in rows if r["passed"] is not None]
    print(f"{sum(r['passed'] for r in judged)} of {len(judged)} rows pass "
          f"({len(rows) - len(judged)} more reported beside them, INFO)")
    return 0 if all(r["passed"] for r in judged) else 1


if __name__ == "__main__":
    sys.exit(main())
