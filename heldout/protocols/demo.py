"""The README's main job: a real small study on the embedded tasks, then the held-out report.

`seed` (the unoptimised baseline) vs `local-search` (the reference searches), 3 seeds each, on
Lockpicking (SQL candidates, paper profile), Circle Packing 26 and Heilbronn triangle 11, with
a matched budget per task. No model and no network are needed; on a 2-core machine it takes a
minute or two."""

from __future__ import annotations

import argparse
from pathlib import Path

from heldout.protocols.run import LocalExecutor, StudyConfig, build_cells, parse_methods, run_study

DEMO_TASKS = {"lockpicking/six": 300, "circle_packing/square26": 20, "heilbronn/triangle11": 20}
DEMO_METHODS = ("seed", "local-search")
DEMO_SEEDS = (0, 1, 2)


def demo_command(args: argparse.Namespace) -> int:
    from heldout.reports.render import build_report, write_report

    cells = build_cells(list(DEMO_TASKS), parse_methods(DEMO_METHODS, []), list(DEMO_SEEDS),
                        dict(DEMO_TASKS), "default", {})
    results = run_study(cells, StudyConfig(run_root=args.run_dir), LocalExecutor(args.jobs))
    failed = [r for r in results if r["status"] != "ok"]
    report = build_report([args.run_dir], baseline="seed")
    written = write_report(report, args.out)
    for kind, path in written.items():
        print(f"{kind}: {path}")
    if failed:
        print(f"{len(failed)} cell(s) failed: " + "; ".join(f"{r['task']} {r['method']} s{r['seed']}: {r.get('error')}"
                                                      for r in failed))
    return 1 if failed else 0
