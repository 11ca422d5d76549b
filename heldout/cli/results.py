"""What a study's runs say and whether they can be trusted: ``heldout report``, ``check`` (the CI
gate), ``plan`` (what a design can detect), ``verify`` (every number re-derived), ``runs query`` and
``runs export`` (the results store), ``export inspect`` and ``bundle`` (the reviewer's archive)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from heldout.cli.shared import (add_data_dir, add_json, add_trusted_signers, calling_on_stop, number, print_json,
                                require_run_dirs, trusted_signers)
from heldout.contracts import HeldoutError

if TYPE_CHECKING:  # annotations only
    from heldout.protocols.stats.margin import Margin

# Start-up time: each command imports its modules when it runs, so the parser loads none of them
# (heldout/cli/__init__.py); the choices below are copies of heavier modules' constants, and
# tests/test_extension.py checks each equals its source.
DEFAULT_MARGIN = "5%"  # heldout.protocols.stats.margin
PAPER_FORMATS = ("latex", "csv")  # heldout.reports.paper.FORMATS
DESIGN_FIELDS = ("profile", "budget", "policy", "limits", "options", "drift", "verifier", "models")  # heldout.reports.check
TABLES = ("runs", "verdicts", "ledger", "excluded")  # heldout.reports.store


def bundle_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", help="study or session dirs: every run in and below them")
    p.add_argument("--out", required=True, help="the archive to write (.tar.gz)")
    p.add_argument("--report", default=None, help="a report folder to include (heldout report --out)")


def cmd_bundle(args: argparse.Namespace) -> int:
    """Records, ledgers, manifests, report, environment and public keys in one archive; no secret."""
    from heldout.reports.bundle import write_bundle
    index = write_bundle(args.run_dirs, args.out, args.report)
    print(f"{args.out}: {len(index['runs'])} run(s), {len(index['files'])} file(s), signed by "
          f"{', '.join(index['signers']) or 'nobody'}; a reviewer checks it with "
          "heldout ledger verify DIR --trusted-signers FILE once unpacked")
    return 0


def runs_query_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a study's run dir (verified now) or a Parquet export dir")
    p.add_argument("sql", help='e.g. "SELECT task, method, avg(test_score) FROM runs GROUP BY ALL"')
    p.add_argument("--json", action="store_true", help="one JSON object per row")


def cmd_runs_query(args: argparse.Namespace) -> int:
    from heldout.reports.store import ResultsStore, reads_ledger
    # a query that reads no ledger entry loads none: its memory follows the runs, not the entries
    store = ResultsStore.open([args.run_dir], with_ledger=reads_ledger(args.sql))
    with calling_on_stop(store.con.interrupt):  # a long query stops at Ctrl-C, not when DuckDB next looks
        result = store.query(args.sql)
    if args.json:
        for row in result.to_dicts():
            print_json(row)
    else:
        print(result.format())
    return 0


def runs_export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a study's run dir")
    p.add_argument("--parquet", required=True, metavar="OUT", help="directory for runs.parquet, verdicts.parquet, ...")


def cmd_runs_export(args: argparse.Namespace) -> int:
    from heldout.reports.store import ResultsStore
    store = ResultsStore.open([args.run_dir])
    with calling_on_stop(store.con.interrupt):  # a large store's COPY stops at Ctrl-C (its temp file removed)
        written = store.export_parquet(args.parquet)
    for path in written:
        print(f"{path}  ({store.count(path.stem)} rows)")
    return 0


def export_inspect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a study's or a session's run dir (searched recursively for ledgers)")
    p.add_argument("--out", required=True, help="log dir to write the .eval files into")
    p.add_argument("--with-optimisation", action="store_true", help="also every evaluation the optimizer paid for")
    add_data_dir(p, "to render prompts and show targets of dataset tasks")


def cmd_export_inspect(args: argparse.Namespace) -> int:
    from heldout.reports.inspect_export import export_inspect
    result = export_inspect(args.run_dir, args.out, with_optimisation=args.with_optimisation, data_dir=args.data_dir)
    for note in result.notes if args.verbosity >= 0 else []:
        print(f"heldout export: note: {note}", file=sys.stderr)
    for path, reason in result.skipped:
        print(f"heldout export: SKIPPED {path}: {reason}", file=sys.stderr)
    print(f"wrote {len(result.written)} Inspect log(s) to {args.out}; view them with `inspect view --log-dir {args.out}`")
    return 1 if result.skipped else 0


def verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("study", help="a study dir, or a copy or bundle of one: every run record and results.json in it")
    p.add_argument("--report", action="append", default=[], metavar="PATH",
                   help="re-derive this results.json (or report dir) instead of those found in the study (repeatable)")
    add_trusted_signers(p)
    add_data_dir(p, "to rebuild report tables that need a dataset task's examples (answer keys, topics)")
    add_json(p)


def cmd_verify(args: argparse.Namespace) -> int:
    """Exit codes and the rule behind each verdict: heldout/reports/verify.py."""
    require_run_dirs([args.study])
    from heldout.reports.verify import verify_study
    found = verify_study(args.study, trusted_signers(args), reports=args.report, data_dir=args.data_dir)
    if args.json:
        print_json(found.as_dict())
    else:
        print("\n".join(found.lines()))
    return found.exit_code


def report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", help="run dirs (searched recursively for run records)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--baseline-method", default="seed", help="method every paired table compares against")
    p.add_argument("--alpha", type=number(float, 0, "--alpha", strict=True, high=1), default=0.05,
                   help="significance level")
    p.add_argument("--checkpoints", default=None, help="metric-call checkpoints, e.g. 500,1000,1500,2000")
    add_data_dir(p, "for per-topic grouping of dataset tasks")
    p.add_argument("--format", action="append", choices=PAPER_FORMATS, default=None,
                   help="also Table 1 and the paired table as booktabs LaTeX / CSV in OUT/paper, figures as PDF+SVG (repeatable)")


def cmd_report(args: argparse.Namespace) -> int:
    require_run_dirs(args.run_dirs)
    from heldout.reports import build_report, write_report
    from heldout.reports.paper import write_paper
    checkpoints = _parse_checkpoints(args.checkpoints) if args.checkpoints else None
    report = build_report(args.run_dirs, baseline=args.baseline_method, alpha=args.alpha, checkpoints=checkpoints,
                          data_dir=args.data_dir)
    runs = report.runs
    if runs.excluded and not runs.runs and not runs.failed and not runs.protocols:
        first = runs.excluded[0]
        more = f" (and {len(runs.excluded) - 1} more)" if len(runs.excluded) > 1 else ""
        raise HeldoutError(f"no run under {', '.join(args.run_dirs)} verifies, nothing to report: EXCLUDED "
                           f"{first.path}: {first.reason}{more}")
    for warning in report.warnings:
        print(f"heldout report: WARNING: {warning}", file=sys.stderr)
    paths = write_report(report, args.out)
    if args.format:
        paths.update(write_paper(report, args.out, args.format))
    print(f"{len(runs.runs)} run(s) used, {len(runs.failed)} failed, {len(runs.excluded)} excluded")
    for kind, path in paths.items():
        print(f"wrote {path}")
    return 0


def _margin(text: str) -> Margin:
    from heldout.protocols.stats.margin import Margin, MarginError
    try:
        return Margin.parse(text)
    except MarginError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parse_checkpoints(text: str) -> list[int]:
    try:
        points = [int(c) for c in text.split(",")]
    except ValueError:
        points = []
    if not points or any(p < 1 for p in points):
        raise HeldoutError(f"--checkpoints takes whole numbers >= 1 separated by commas (metric calls, "
                           f"e.g. 500,1000,1500), got {text!r}")
    return sorted(set(points))


def check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline", nargs="+", required=True, help="baseline run dirs")
    p.add_argument("--current", nargs="+", required=True, help="current run dirs")
    p.add_argument("--alpha", type=number(float, 0, "--alpha", strict=True, high=1), default=0.05,
                   help="significance level of each one-sided test")
    # read in cmd_check: parsing a margin loads the statistics, which a mistyped run dir should not wait for
    p.add_argument("--min-effect", default=DEFAULT_MARGIN,
                   help="largest drop you accept, per task on its own scale: 0.01 (score units), 5%% (of the "
                        "baseline's score; the default), 10%% headroom (of its distance to the ceiling) or 0.5sd "
                        "(baseline run-to-run SDs); with 0 only a significant improvement passes")
    p.add_argument("--method", default=None, help="compare this method when a run set holds several")
    p.add_argument("--pair-seeds", choices=("id", "independent", "rank"), default="id",
                   help="pair seeds by id (default) or compare independent runs (fresh seeds; 'rank' = independent)")
    p.add_argument("--allow-mismatch", action="append", default=[], metavar="FIELD", choices=DESIGN_FIELDS,
                   help="compare runs that differ in FIELD (" + ", ".join(DESIGN_FIELDS) + "); stated in the "
                        "output (repeatable)")
    add_trusted_signers(p)
    add_json(p)


def cmd_check(args: argparse.Namespace) -> int:
    require_run_dirs([*args.baseline, *args.current])
    try:
        margin = _margin(args.min_effect)
    except argparse.ArgumentTypeError as exc:
        raise HeldoutError(str(exc)) from None  # it names the option
    from heldout.reports import check_runs
    result = check_runs(args.baseline, args.current, alpha=args.alpha, min_effect=margin,
                        method=args.method, pair_seeds=args.pair_seeds, allow_mismatch=args.allow_mismatch,
                        trusted=trusted_signers(args))
    if args.json:
        print_json(result.as_dict())
    else:
        print(result.evidence())
    return result.exit_code


def plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, help="task name")
    p.add_argument("--profile", default="default", help="split profile (its test split is the design's examples)")
    p.add_argument("--seeds", type=int, required=True, help="runs per arm")
    p.add_argument("--pilot", default=None, help="pilot run dir: baseline score, run-to-run SD, seed headroom")
    p.add_argument("--method", default=None, help="plan from the pilot runs of this method only (default: the "
                   "pilot's one method; a pilot holding several needs --method)")
    p.add_argument("--p-base", type=float, default=None, help="baseline score (overrides the pilot's)")
    p.add_argument("--run-sd", type=float, default=None, help="SD of a run's mean score (overrides the pilot's)")
    p.add_argument("--effect", type=float, default=None, help="target effect: seeds/examples needed to detect it")
    p.add_argument("--pair-seeds", choices=("id", "independent"), default="id",
                   help="as the gate will pair them (id: assumes no correlation within a pair, conservative)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of the one-sided test")
    p.add_argument("--power", type=float, default=0.8, help="target power")
    p.add_argument("--min-effect", type=_margin, default=DEFAULT_MARGIN, help="the gate's margin, as for `heldout check` "
                   f"(default {DEFAULT_MARGIN}%)")
    p.add_argument("--tasks", type=int, default=1, help="tasks the gate will hold together (Holm over tasks for "
                   "a regression, every task for a pass; default 1)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def cmd_plan(args: argparse.Namespace) -> int:
    from heldout.reports.plan import plan_study
    plan = plan_study(args.task, args.profile, args.seeds, pilot=args.pilot, p_base=args.p_base, run_sd=args.run_sd,
                      paired=args.pair_seeds == "id", alpha=args.alpha, power=args.power, target=args.effect,
                      min_effect=args.min_effect, tasks=args.tasks, method=args.method)
    if args.json:
        print_json(plan.as_dict())
    else:
        print(f"{args.task} [{args.profile}]")
        print(plan.describe())
    return 0
