"""The ``heldout`` command: a thin layer over the API.

Each sub-command is a small function ``cmd_<name>(args) -> int`` plus its argparse wiring in
:func:`build_parser`. Errors heldout raises on purpose are printed as one clear line (exit 2)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from heldout.benchmarks.base import HeldoutError


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=None, default=str))


# -- tasks ---------------------------------------------------------------------------------------
def cmd_tasks_list(args: argparse.Namespace) -> int:
    from heldout.benchmarks.registry import all_tasks
    from heldout.data_manifests import Manifest

    rows = []
    for bench in all_tasks():
        try:
            manifest = Manifest.load(bench.name)
            profiles = {p: manifest.sizes(p) for p in manifest.profiles}
        except HeldoutError as exc:
            profiles = {"error": str(exc)}
        rows.append({**bench.describe(), "profiles": profiles})
    if args.json:
        _print_json(rows)
        return 0
    print(f"{'task':<48} {'kind':<8} {'metric':<22} profiles (train/val/test)")
    for row in rows:
        profs = "  ".join(
            f"{p}:{'/'.join(str(s.get(k, 0)) for k in ('train', 'val', 'test'))}"
            for p, s in row["profiles"].items() if isinstance(s, dict)
        )
        print(f"{row['name']:<48} {row['kind']:<8} {row['metric']:<22} {profs}")
    print(f"{len(rows)} tasks")
    return 0


# -- data ----------------------------------------------------------------------------------------
def cmd_data_verify(args: argparse.Namespace) -> int:
    from heldout.data_manifests.verify import verify_tasks

    return verify_tasks(args.tasks, data_dir=args.data_dir, as_json=args.json)


def cmd_data_freeze(args: argparse.Namespace) -> int:
    from heldout.data_manifests.verify import freeze_command

    return freeze_command(args)


# -- eval ----------------------------------------------------------------------------------------
def cmd_eval(args: argparse.Namespace) -> int:
    from heldout.benchmarks.loading import load_task

    task = load_task(args.task, profile=args.profile, data_dir=args.data_dir, allow_drift=args.allow_drift)
    bench = task.benchmark
    if bench.kind != "program":
        raise HeldoutError(f"{args.task} is a prompt task: it needs a worker model; use `heldout run`")
    candidate = bench.candidate_from_path(args.candidate) if args.candidate else bench.seed_candidate()
    options: dict[str, Any] = {}
    if args.tolerance is not None:
        options["tolerance"] = args.tolerance
    limits = bench.default_limits.replace(wall_seconds=args.timeout)
    examples = task.split(args.split)
    verdicts = [bench.run(candidate, ex, limits, **options) for ex in examples]
    summary = bench.summarize(candidate, verdicts, limits=limits, **options)
    summary.setdefault("profile", task.profile)
    summary.setdefault("split", args.split)
    summary.setdefault("limits", limits.__dict__)
    if task.drift is not None:
        summary["drift"] = task.drift.to_dict()
    if args.json:
        _print_json(summary)
    else:
        for key, value in summary.items():
            if key not in ("verdicts",):
                print(f"{key:>22}: {value}")
        for v in verdicts:
            if v.feedback:
                print(f"--- {v.example_id}\n{v.feedback}")
    return 0 if summary.get("error") is None else 1


# -- ledger / run --------------------------------------------------------------------------------
def cmd_ledger_verify(args: argparse.Namespace) -> int:
    from heldout.evaluators.ledger import verify_ledger

    worst = 0
    for run_dir in args.run_dirs:
        report = verify_ledger(run_dir)
        print(report.describe())
        worst = max(worst, 0 if report.ok else 1)
    return worst


def cmd_run(args: argparse.Namespace) -> int:
    from heldout.protocols.run import run_command

    return run_command(args)


# -- report / check ------------------------------------------------------------------------------
def cmd_report(args: argparse.Namespace) -> int:
    from heldout.reports import build_report, write_report

    checkpoints = [int(c) for c in args.checkpoints.split(",")] if args.checkpoints else None
    report = build_report(args.run_dirs, baseline=args.baseline, alpha=args.alpha, checkpoints=checkpoints,
                          data_dir=args.data_dir)
    for warning in report.warnings:
        print(f"heldout report: WARNING: {warning}", file=sys.stderr)
    paths = write_report(report, args.out)
    runs = report.runs
    print(f"{len(runs.runs)} run(s) used, {len(runs.failed)} failed, {len(runs.excluded)} excluded")
    for kind, path in paths.items():
        print(f"wrote {path}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from heldout.reports import check_runs

    result = check_runs(args.baseline, args.current, alpha=args.alpha, min_effect=args.min_effect,
                        method=args.method, pair_seeds=args.pair_seeds, allow_mismatch=args.allow_mismatch)
    if args.json:
        _print_json(result.as_dict())
    else:
        print(result.evidence())
    return result.exit_code


def cmd_plan(args: argparse.Namespace) -> int:
    from heldout.reports.plan import plan_study

    plan = plan_study(args.task, args.profile, args.seeds, pilot=args.pilot, p_base=args.p_base, run_sd=args.run_sd,
                      paired=args.pair_seeds == "id", alpha=args.alpha, power=args.power, target=args.effect)
    if args.json:
        _print_json(plan.as_dict())
    else:
        print(f"{args.task} [{args.profile}]")
        print(plan.describe())
    return 0


# -- vliw ----------------------------------------------------------------------------------------
def cmd_vliw_simulate(args: argparse.Namespace) -> int:
    from heldout.benchmarks.vliw.conformance import load_cases, run_case

    for case in load_cases(args.cases):
        _print_json(run_case(case, engine=args.engine, cycle_cap=args.cycle_cap))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from heldout.protocols.demo import demo_command

    return demo_command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="heldout", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    tasks = sub.add_parser("tasks", help="list the registered tasks").add_subparsers(dest="action", required=True)
    p = tasks.add_parser("list", help="every task with kind, metric, split profiles and sizes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tasks_list)

    data = sub.add_parser("data", help="verify or freeze data manifests").add_subparsers(dest="action", required=True)
    p = data.add_parser("verify", help="check manifests against the data")
    p.add_argument("tasks", nargs="*", help="task names or family prefixes (default: all)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_data_verify)
    p = data.add_parser("freeze", help="build a manifest (hashes + a profile) for data you hold")
    p.add_argument("--task", required=True, help="task name (registered, or new with --jsonl)")
    p.add_argument("--jsonl", default=None, help="your own examples: JSON lines with id, input, target[, group]")
    p.add_argument("--profile", required=True)
    p.add_argument("--sizes", default=None, help="train/val/test sizes, e.g. 100/50/200 (seeded shuffle)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--by-group", action="store_true", help="topic-disjoint: no group spans two splits")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None, help="manifest root (default: heldout/data_manifests)")
    p.set_defaults(func=cmd_data_freeze)

    p = sub.add_parser("eval", help="evaluate one candidate on a program task")
    p.add_argument("--task", required=True)
    p.add_argument("--candidate", default=None, help="file or folder (default: the task's seed candidate)")
    p.add_argument("--profile", default="default")
    p.add_argument("--split", default="test")
    p.add_argument("--tolerance", type=float, default=None)
    p.add_argument("--timeout", type=float, default=None, help="wall seconds per execution")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--allow-drift", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)

    ledger = sub.add_parser("ledger", help="check ledgers").add_subparsers(dest="action", required=True)
    p = ledger.add_parser("verify", help="detect any edited, dropped, inserted or reordered entry")
    p.add_argument("run_dirs", nargs="+")
    p.set_defaults(func=cmd_ledger_verify)

    p = sub.add_parser("run", help="run optimizers on tasks in protected sessions")
    p.add_argument("--task", action="append", required=True, help="repeatable")
    p.add_argument("--profile", default="default")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--seeds", default=None, help="comma-separated, e.g. 0,1,2")
    p.add_argument("--budget", action="append", required=True,
                   help="metric calls per session: N, or TASK=N per task (repeatable)")
    p.add_argument("--architect-tokens", type=int, default=None)
    p.add_argument("--wall-seconds", type=float, default=None)
    p.add_argument("--optimizer", action="append", default=[],
                   help="in-process optimizer: module:function or a reference name (repeatable)")
    p.add_argument("--optimizer-cmd", action="append", default=[],
                   help="isolated optimizer command (repeatable); served the task view over HTTP")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--jobs", type=int, default=1, help="sessions in parallel (process pool)")
    p.add_argument("--policy", default="standard")
    p.add_argument("--worker-model", default=None)
    p.add_argument("--architect-model", default=None)
    p.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)")
    p.add_argument("--cache-dir", default=None, help="response cache directory")
    p.add_argument("--tolerance", type=float, default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--allow-drift", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="run the small study of the README and write its report")
    p.add_argument("--run-dir", default="runs/demo")
    p.add_argument("--out", default="runs/demo-report")
    p.add_argument("--jobs", type=int, default=2)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("report", help="tables, figures, report.md/.html and results.json from run dirs")
    p.add_argument("run_dirs", nargs="+", help="run dirs (searched recursively for run records)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--baseline", default="seed", help="method every paired table compares against")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--checkpoints", default=None, help="metric-call checkpoints, e.g. 500,1000,1500,2000")
    p.add_argument("--data-dir", default=None, help="for per-topic grouping of dataset tasks")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("check", help="CI regression gate: exit 0 pass, 1 regression, 2 inconclusive or invalid input")
    p.add_argument("--baseline", nargs="+", required=True, help="baseline run dirs")
    p.add_argument("--current", nargs="+", required=True, help="current run dirs")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--min-effect", type=float, default=0.0,
                   help="largest drop you accept (score units); with 0 only a significant improvement passes")
    p.add_argument("--method", default=None, help="compare this method when a run set holds several")
    p.add_argument("--pair-seeds", choices=("id", "independent", "rank"), default="id",
                   help="pair seeds by id (default) or compare independent runs (fresh seeds; 'rank' = independent)")
    p.add_argument("--allow-mismatch", action="append", default=[], metavar="FIELD",
                   help="compare runs that differ in FIELD (profile, budget, policy, limits, options, drift, "
                        "verifier, models); stated in the output (repeatable)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("plan", help="minimum detectable effect of a K-seed study (paired 0/1 data, run variance)")
    p.add_argument("--task", required=True)
    p.add_argument("--profile", default="default")
    p.add_argument("--seeds", type=int, required=True, help="runs per arm")
    p.add_argument("--pilot", default=None, help="pilot run dir: baseline score, run-to-run SD, seed headroom")
    p.add_argument("--p-base", type=float, default=None, help="baseline score (overrides the pilot's)")
    p.add_argument("--run-sd", type=float, default=None, help="SD of a run's mean score (overrides the pilot's)")
    p.add_argument("--effect", type=float, default=None, help="target effect: seeds/examples needed to detect it")
    p.add_argument("--pair-seeds", choices=("id", "independent"), default="id",
                   help="as the gate will pair them (id: assumes no correlation within a pair, conservative)")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--power", type=float, default=0.8)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    vliw = sub.add_parser("vliw", help="the VLIW kernel simulator").add_subparsers(dest="action", required=True)
    p = vliw.add_parser("simulate", help="run conformance cases; one JSON line per case")
    p.add_argument("cases", help="CASES.json: a list of {name, program, mem[, scratch_init, enable_pause, runs]}")
    p.add_argument("--engine", choices=("fast", "reference"), default="fast")
    p.add_argument("--cycle-cap", type=int, default=10_000_000)
    p.set_defaults(func=cmd_vliw_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HeldoutError as exc:
        print(f"heldout: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
