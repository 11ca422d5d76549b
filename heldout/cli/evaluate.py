"""Scoring outside any session (nothing is ledgered): ``heldout eval`` runs one candidate on one
split, ``heldout score`` scores outputs made elsewhere with a prompt task's canonical verifier."""

from __future__ import annotations

import argparse
from typing import Any

from heldout.cli.shared import add_allow_drift, add_data_dir, add_json, add_profile, number, print_json
from heldout.contracts import HeldoutError

# Start-up time: each command imports its modules when it runs, so the parser loads none of them
# (heldout/cli/__init__.py).


def eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, help="task name (see `heldout tasks list`)")
    p.add_argument("--candidate", default=None, help="file or folder (default: the task's seed candidate)")
    add_profile(p)
    p.add_argument("--split", default=None, choices=("train", "val", "test"),
                   help="split to evaluate (default val, or train when the profile has none; test only when asked, "
                        "its targets only with --show-targets)")
    p.add_argument("--show-targets", action="store_true", help="with --split test: print feedback and targets")
    p.add_argument("--worker-model", default=None, help="prompt tasks: model id of the worker")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)")
    p.add_argument("--tolerance", type=float, default=None, help="geometry tasks: constraint tolerance (default 0)")
    p.add_argument("--cpu-seconds", type=number(float, 0, "--cpu-seconds", strict=True), default=None,
                   help="program tasks: CPU seconds per sandboxed execution (default the task's); the wall clock "
                        "stops only a program that waits, at 4x + 2 s")
    add_data_dir(p)
    add_allow_drift(p)
    add_json(p)


def cmd_eval(args: argparse.Namespace) -> int:
    """Score one candidate on one split, outside any session (nothing is ledgered). The default
    split is ``val``; the test split only when asked, and its targets only with --show-targets."""
    from heldout.benchmarks.loading import load_task
    from heldout.evaluators.policy import Usage
    from heldout.evaluators.scoring import Scorer
    from heldout.models import DEPLOYMENT, ModelClient
    from heldout.models.probe import check_endpoint
    from heldout.sandbox import wall_backstop
    task = load_task(args.task, profile=args.profile, data_dir=args.data_dir, allow_drift=args.allow_drift)
    bench = task.benchmark
    worker = None
    if bench.kind != "program":
        if not args.worker_model:
            raise HeldoutError(f"{args.task} is a prompt task: pass --worker-model (and --base-url or "
                               "$OPENAI_BASE_URL) to evaluate it")
        # a dead or mistyped --base-url: one line in seconds, not each example's retries for minutes
        check_endpoint("worker", args.worker_model, args.base_url)
        worker = ModelClient(args.worker_model, base_url=args.base_url)
    candidate = bench.candidate_from_path(args.candidate) if args.candidate else bench.seed_candidate()
    options: dict[str, Any] = {}
    if args.tolerance is not None:
        options["tolerance"] = args.tolerance
    limits = bench.default_limits
    if args.cpu_seconds is not None:  # CPU time, so the verdict does not depend on this machine's load
        limits = limits.replace(cpu_seconds=args.cpu_seconds, wall_seconds=wall_backstop(args.cpu_seconds))
    if args.split is None:  # never test unless asked: val, or train when the profile has no val
        args.split = "val" if task.splits.get("val") else "train"
    examples = task.split(args.split)
    if not examples:
        raise HeldoutError(f"{args.task} profile {task.profile!r} has an empty {args.split} split")
    scorer = Scorer(bench, worker, limits, options)
    usage = Usage()
    verdicts = scorer.score_all(candidate, examples, DEPLOYMENT, usage, args.split)  # a failing endpoint is no score
    summary = bench.summarize(candidate, verdicts, scorer.context(DEPLOYMENT, usage))
    summary.setdefault("profile", task.profile)
    summary.setdefault("split", args.split)
    summary.setdefault("limits", limits.__dict__)
    if worker is not None:
        summary.setdefault("worker", {"model": worker.model, "base_url": worker.base_url})
    if task.drift is not None:
        summary["drift"] = task.drift.to_dict()
    hide_targets = args.split == "test" and not args.show_targets
    if hide_targets:
        summary = _without_targets(summary)
    if args.json:
        print_json(summary)
    else:
        for key, value in summary.items():
            if key not in ("verdicts",):
                print(f"{key:>22}: {value}")
        for v in verdicts:
            if v.feedback and not hide_targets:
                print(f"--- {v.example_id}\n{v.feedback}")
        if hide_targets:
            print("(test split: per-example feedback and targets are not printed; pass --show-targets to see them)")
    return 0 if summary.get("error") is None else 1


def _without_targets(value: Any) -> Any:
    """Drop per-example targets (and feedback, which may quote them) from a summary."""
    if isinstance(value, dict):
        return {k: _without_targets(v) for k, v in value.items() if k not in ("target", "targets", "feedback")}
    if isinstance(value, list):
        return [_without_targets(v) for v in value]
    return value


def score_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, help="prompt task name")
    p.add_argument("--outputs", required=True, help="JSONL file, one {\"id\": ..., \"output\": ...} per line")
    p.add_argument("--split", default="val", choices=("train", "val", "test"), help="split the ids belong to")
    add_profile(p)
    add_data_dir(p)
    add_allow_drift(p)
    add_json(p)


def cmd_score(args: argparse.Namespace) -> int:
    from heldout.benchmarks.loading import load_task
    from heldout.evaluators.outputs import read_outputs, score_outputs
    task = load_task(args.task, profile=args.profile, data_dir=args.data_dir, allow_drift=args.allow_drift)
    verdicts, summary = score_outputs(task, read_outputs(args.outputs), args.split)
    if args.json:
        print_json({**summary, "verdicts": [{"id": v.example_id, "score": v.score, "valid": v.valid,
                                              "dimensions": v.dimensions} for v in verdicts]})
    else:
        for key in ("task", "profile", "split", "n", "missing", "score", "dimensions"):
            print(f"{key:>12}: {summary[key]}")
    return 0
