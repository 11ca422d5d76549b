"""Leakage: ``heldout leak scan`` (training questions and answers found in a candidate's text) and
``leak ablate`` (seed and final candidates scored on test, exact train and a shared-topic probe)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from heldout.cli.shared import add_data_dir, add_json, print_json
from heldout.contracts import HeldoutError
from heldout.files import read_user_json

# Start-up time: each command imports its modules when it runs, so the parser loads none of them
# (heldout/cli/__init__.py).


def leak_scan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("candidate", help="candidate file or folder (a .json dict of components, or text)")
    p.add_argument("--task", required=True, help="the task whose training split is searched for")
    p.add_argument("--profile", required=True, help="the split profile whose training examples are looked for")
    add_data_dir(p)
    add_json(p)


def cmd_leak_scan(args: argparse.Namespace) -> int:
    from heldout.benchmarks.loading import load_task
    from heldout.protocols.leak_scan import scan_candidate
    task = load_task(args.task, args.profile, args.data_dir)
    scan = scan_candidate(task.benchmark.candidate_from_path(args.candidate), task)
    if args.json:
        print_json(scan.to_dict())
    else:
        print(scan.describe())
    return 1 if scan.red_flags else 0  # a red flag is data the optimizer never saw: fail the command


def leak_ablate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a study's run dir (searched recursively for run records)")
    # --baseline-method, as in `report`: `--baseline` names run dirs (in `check`), never a method
    p.add_argument("--baseline-method", default="seed", help="'seed' (the task's seed candidate) or a method name")
    p.add_argument("--worker-model", default=None, help="default: the study's (study.json)")
    p.add_argument("--base-url", default=None, help="the worker model's OpenAI-compatible endpoint (a study does not "
                   "record where its endpoint was: give the one it ran against)")
    p.add_argument("--cache-dir", default=None, help="response cache folder (none unless given; not recorded in the "
                   "study)")
    p.add_argument("--jobs", type=int, default=2, help="examples scored at once")
    add_data_dir(p)
    add_json(p)


def cmd_leak_ablate(args: argparse.Namespace) -> int:
    from heldout.models import ModelClient, ResponseCache
    from heldout.protocols.leakage import ablate
    from heldout.models.probe import check_endpoint
    from heldout.protocols.reviewer_evidence import study_evidence
    from heldout.reports.evidence_tables import evidence_tables, tables_text
    study = Path(args.run_dir) / "study.json"
    # study.json keeps the experiment's settings flat ("config.worker_model"); where the endpoint,
    # data and cache live is no part of the experiment and is not recorded (flags, or the defaults)
    recorded = read_user_json(study, "the study's record") if os.path.lexists(study) else {}
    model = args.worker_model or recorded.get("config.worker_model")
    if model is not None and type(model) is not str:
        raise HeldoutError(f"the study's record {study}: config.worker_model must be a model name, got {model!r}")
    if model:  # a dead endpoint: one line in seconds, before the ablation's ledger, not minutes of retries
        check_endpoint("worker", model, args.base_url)
    worker = (ModelClient(model, base_url=args.base_url,
                          cache=ResponseCache(args.cache_dir) if args.cache_dir else None) if model else None)
    result = ablate(args.run_dir, baseline=args.baseline_method, worker=worker, data_dir=args.data_dir, jobs=args.jobs)
    # what a reviewer asks beside the verdicts: per-item gains, lineage, key per component, recipe baseline
    evidence = study_evidence(args.run_dir, baseline=args.baseline_method, worker=worker, data_dir=args.data_dir,
                              jobs=args.jobs)
    if args.json:
        print_json({**result.to_dict(), "evidence": [e.as_dict() for e in evidence]})
    else:
        print(result.describe())
        for e in evidence:
            print(f"\nevidence for {e.method} on {e.task} [{e.profile}] against {args.baseline_method}"
                  + (f": {e.missing}" if e.evidence is None else ""))
            if e.evidence is not None:
                print(tables_text(evidence_tables(e.evidence)))
    return 0
