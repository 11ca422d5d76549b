"""The ``heldout`` command: a thin layer over the API.

Each sub-command is a small function ``cmd_<name>(args) -> int`` plus its argparse wiring in
:func:`build_parser`. Errors heldout raises on purpose are printed as one clear line (exit 2)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from heldout.sandbox import allow_unsafe_no_sandbox
from heldout.benchmarks.loading import load_task
from heldout.benchmarks.manifest_tools import freeze_profile, verify_tasks
from heldout.benchmarks.registry import all_tasks, expand_tasks, task_groups
from heldout.benchmarks.user_jsonl import ANSWER_FORMATS
from heldout.benchmarks.verifiers import CANONICAL, describe_variants
from heldout.benchmarks.vliw.conformance import load_cases, run_case
from heldout.contracts import HeldoutError
from heldout import __version__
from heldout.data_manifests import Manifest
from heldout.evaluators.ledger import verify_ledger
from heldout.evaluators.outputs import read_outputs, score_outputs
from heldout.evaluators.session import POLICIES
from heldout.models import ModelClient, ResponseCache
from heldout.models.backends.llama import LlamaBackend, resolve_model
from heldout.models.server import ChatServer
from heldout.protocols.arms import FIXED_UNITS, ArmsSpec, describe_plan, open_arms, run_arms
from heldout.protocols.executors import EXECUTORS, make_executor
from heldout.protocols.leakage import ablate, scan_candidate
from heldout.protocols.verifier_ablation import plan_ablation, run_ablation
from heldout.protocols.splits import SplitSizes, build_split, check_split
from heldout.protocols.run import LocalExecutor, StudyConfig, build_cells, parse_budgets, parse_methods, run_study
from heldout.reports import build_report, check_runs, write_report
from heldout.reports.check import DESIGN_FIELDS
from heldout.reports.plan import plan_study
from heldout.reports.store import TABLES, ResultsStore

def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` -> [0, 1, 2]; a clear one-line error for anything else, and for repeats."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise HeldoutError(f"--seeds takes comma-separated integers such as 0,1,2, got {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise HeldoutError(f"--seeds repeats a seed ({text}): each seed is one run")
    return seeds


# The README's main job: seed vs the reference searches, 3 seeds each, on three embedded tasks with a
# matched budget per task (no model, no network; a minute or two on 2 cores).
DEMO_TASKS = {"lockpicking/six": 300, "circle_packing/square26": 20, "heilbronn/triangle11": 20}
DEMO_METHODS = ("seed", "local-search")
DEMO_SEEDS = (0, 1, 2)
# `heldout demo --real-model`: the same study shape with a real (tiny) model as worker and architect
# on two prompt tasks, small enough for a laptop CPU: a 16/0/24 split profile, one reflective round.
REAL_MODEL_DEMO_TASKS = {"bbh/boolean_expressions": 16, "gsm_hard": 16}
REAL_MODEL_DEMO_PROFILE = "cpu-demo"
REAL_MODEL_DEMO_METHODS = ("seed", "reflective")
REAL_MODEL_DEMO_ANSWER_TOKENS = 80  # per worker answer
REAL_MODEL_DEMO_ARCHITECT_TOKENS = 256  # per architect answer (the server's cap)


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=None, default=str))


# -- tasks ---------------------------------------------------------------------------------------
def cmd_tasks_list(args: argparse.Namespace) -> int:
    rows = []
    for bench in all_tasks():
        try:
            manifest = Manifest.load(bench.name)
            profiles = {p: manifest.sizes(p) for p in manifest.profiles}
        except HeldoutError as exc:
            profiles = {"error": str(exc)}
        rows.append({**bench.describe(), "profiles": profiles})
    if args.json:
        _print_json(rows if not args.groups else task_groups())
        return 0
    print(f"{'task':<48} {'kind':<8} {'metric':<22} profiles (train/val/test)")
    for row in rows:
        profs = "  ".join(
            f"{p}:{'/'.join(str(s.get(k, 0)) for k in ('train', 'val', 'test'))}"
            for p, s in row["profiles"].items() if isinstance(s, dict)
        )
        print(f"{row['name']:<48} {row['kind']:<8} {row['metric']:<22} {profs}")
    print(f"{len(rows)} tasks")
    print("\ngroups (--task GROUP, or a glob such as 'mmlu_pro/*'):")
    for name, members in task_groups().items():
        print(f"  {name:<18} {len(members):>3} task(s)")
    return 0


# -- data ----------------------------------------------------------------------------------------
def cmd_data_verify(args: argparse.Namespace) -> int:
    rows = verify_tasks(args.tasks, data_dir=args.data_dir)
    if args.json:
        _print_json(rows)
    else:
        print(f"{'task':<48} {'status':<8} {'examples':>8}  profiles")
        for r in rows:
            print(f"{r['task']:<48} {'ok' if r['ok'] else 'FAILED':<8} {r['examples']:>8}  {','.join(r['profiles'])}")
            if r["problem"]:
                print("    " + r["problem"].replace("\n", "\n    "))
        bad = sum(not r["ok"] for r in rows)
        print(f"{len(rows) - bad} of {len(rows)} manifests verify" + (f"; {bad} FAILED" if bad else ""))
    return 0 if all(r["ok"] for r in rows) else 1


def cmd_data_freeze(args: argparse.Namespace) -> int:
    saved, sizes = freeze_profile(args.task, args.profile, out=args.out, jsonl=args.jsonl,
                                  data_dir=args.data_dir, sizes=args.sizes, by_group=args.by_group,
                                  seed=args.seed, answer_format=args.answer_format)
    print(f"froze profile {args.profile!r} of {args.task} ({sizes}) in {saved}")
    return 0


# -- eval ----------------------------------------------------------------------------------------
def cmd_eval(args: argparse.Namespace) -> int:
    task = load_task(args.task, profile=args.profile, data_dir=args.data_dir, allow_drift=args.allow_drift)
    bench = task.benchmark
    if bench.kind != "program":
        raise HeldoutError(f"{args.task} is a prompt task: it needs a worker model; use `heldout run`")
    candidate = bench.candidate_from_path(args.candidate) if args.candidate else bench.seed_candidate()
    options: dict[str, Any] = {}
    if args.tolerance is not None:
        options["tolerance"] = args.tolerance
    limits = bench.default_limits.replace(wall_seconds=args.wall_seconds)
    examples = task.split(args.split)
    context = bench.context(limits, **options)
    verdicts = [bench.run(candidate, ex, context) for ex in examples]
    summary = bench.summarize(candidate, verdicts, context)
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


def cmd_score(args: argparse.Namespace) -> int:
    task = load_task(args.task, profile=args.profile, data_dir=args.data_dir, allow_drift=args.allow_drift)
    verdicts, summary = score_outputs(task, read_outputs(args.outputs), args.split)
    if args.json:
        _print_json({**summary, "verdicts": [{"id": v.example_id, "score": v.score, "valid": v.valid,
                                              "dimensions": v.dimensions} for v in verdicts]})
    else:
        for key in ("task", "profile", "split", "n", "missing", "score", "dimensions"):
            print(f"{key:>12}: {summary[key]}")
    return 0


# -- ledger / run --------------------------------------------------------------------------------
def cmd_ledger_verify(args: argparse.Namespace) -> int:
    reports = [verify_ledger(run_dir) for run_dir in args.run_dirs]
    if args.json:
        _print_json([{"run_dir": str(d), "ok": r.ok, "problem": None if r.ok else r.describe()}
                     for d, r in zip(args.run_dirs, reports)])
    else:
        for report in reports:
            print(report.describe())
    return 0 if all(r.ok for r in reports) else 1


def cmd_run(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    methods = parse_methods(args.optimizer, args.optimizer_cmd)
    tasks = expand_tasks(args.task)
    budgets = parse_budgets(args.budget, tasks)
    options: dict[str, Any] = {"tolerance": args.tolerance} if args.tolerance is not None else {}
    if args.prompt_format:
        options["prompt_format"] = args.prompt_format
    cells = build_cells(tasks, methods, seeds, budgets, args.profile, options, [args.verifier])
    config = StudyConfig(run_root=args.run_dir, data_dir=args.data_dir, allow_drift=args.allow_drift,
                         policy=args.policy, architect_tokens=args.architect_tokens,
                         wall_seconds=args.wall_seconds, worker_model=args.worker_model,
                         architect_model=args.architect_model, base_url=args.base_url,
                         cache_dir=args.cache_dir, trusted_optimizer=args.trusted_optimizer)
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.run_dir) / "study.json").write_text(json.dumps(
        {"cells": [{**asdict(c), "method": asdict(c.method)} for c in cells], "config": asdict(config)}, indent=1))
    executor = make_executor(args.executor, args.run_dir, jobs=args.jobs, ray_address=args.ray_address,
                             cell_cpus=args.cell_cpus, cell_memory_mb=args.cell_memory_mb)
    try:
        results = run_study(cells, config, executor)
    finally:
        getattr(executor, "close", lambda: None)()
    if args.json:
        _print_json(results)
    else:
        for r in results:
            print(f"{r['task']:<28} {r['method']:<20} seed {r['seed']:<3} {r['status']:<7} "
                  f"test {r['test_score']}  {r['run_dir']}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


def cmd_compare_arms(args: argparse.Namespace) -> int:
    spec = ArmsSpec(task=args.task, optimizer=args.optimizer, budget=args.budget, width=args.width,
                    seeds=tuple(parse_seeds(args.seeds)), fixed=args.fixed, profile=args.profile,
                    metric_cap=args.metric_cap, drift_tolerance=args.drift_tolerance,
                    min_headroom=args.min_headroom)
    plan = open_arms(spec, args.run_dir)
    if args.plan:
        print(describe_plan(spec, plan))
        return 0
    config = StudyConfig(run_root=args.run_dir, data_dir=args.data_dir, worker_model=args.worker_model,
                         architect_model=args.architect_model, base_url=args.base_url, cache_dir=args.cache_dir)
    result = run_arms(spec, args.run_dir, config, LocalExecutor(args.jobs))
    if args.json:
        _print_json(result.to_dict())
    else:
        print(result.text())
    return 1 if result.broken else 0


# -- runs (the results store) --------------------------------------------------------------------
def cmd_runs_query(args: argparse.Namespace) -> int:
    result = ResultsStore.open([args.run_dir]).query(args.sql)
    if args.json:
        for row in result.to_dicts():
            _print_json(row)
    else:
        print(result.format())
    return 0


def cmd_runs_export(args: argparse.Namespace) -> int:
    store = ResultsStore.open([args.run_dir])
    for path in store.export_parquet(args.parquet):
        print(f"{path}  ({store.count(path.stem)} rows)")
    return 0


# -- report / check ------------------------------------------------------------------------------
def cmd_report(args: argparse.Namespace) -> int:
    checkpoints = [int(c) for c in args.checkpoints.split(",")] if args.checkpoints else None
    report = build_report(args.run_dirs, baseline=args.baseline_method, alpha=args.alpha, checkpoints=checkpoints,
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
    result = check_runs(args.baseline, args.current, alpha=args.alpha, min_effect=args.min_effect,
                        method=args.method, pair_seeds=args.pair_seeds, allow_mismatch=args.allow_mismatch)
    if args.json:
        _print_json(result.as_dict())
    else:
        print(result.evidence())
    return result.exit_code


def cmd_plan(args: argparse.Namespace) -> int:
    plan = plan_study(args.task, args.profile, args.seeds, pilot=args.pilot, p_base=args.p_base, run_sd=args.run_sd,
                      paired=args.pair_seeds == "id", alpha=args.alpha, power=args.power, target=args.effect)
    if args.json:
        _print_json(plan.as_dict())
    else:
        print(f"{args.task} [{args.profile}]")
        print(plan.describe())
    return 0


# -- split / leak --------------------------------------------------------------------------------
def cmd_split_build(args: argparse.Namespace) -> int:
    built = build_split(args.task, args.name, SplitSizes.parse(args.sizes), probe=args.probe, seed=args.seed,
                        out=args.out, data_dir=args.data_dir)
    if args.json:
        _print_json(asdict(built))
    else:
        print(f"froze profile {built.profile!r} of {built.task} in {built.path}")
        for pool, n in built.sizes.items():
            print(f"  {pool:<20} {n:>6} examples  {built.groups[pool]:>5} groups")
        print(f"load it with --profile {built.profile} and $HELDOUT_MANIFEST_PATH including {Path(built.path).parents[len(Path(built.task).parts) - 1]}")
    return 0


def cmd_split_check(args: argparse.Namespace) -> int:
    check = check_split(args.task, args.profile, data_dir=args.data_dir,
                        threshold=args.threshold, ngram=args.ngram, min_answer_words=args.min_answer_words)
    if args.json:
        _print_json(check.to_dict())
    else:
        print(check.describe())
    return 0 if check.ok else 1


def cmd_leak_scan(args: argparse.Namespace) -> int:
    task = load_task(args.task, args.profile, args.data_dir)
    scan = scan_candidate(task.benchmark.candidate_from_path(args.candidate), task)
    if args.json:
        _print_json(scan.to_dict())
    else:
        print(scan.describe())
    return 0


def cmd_leak_ablate(args: argparse.Namespace) -> int:
    study = Path(args.run_dir) / "study.json"
    config = json.loads(study.read_text()).get("config", {}) if study.is_file() else {}
    model = args.worker_model or config.get("worker_model")
    cache_dir = args.cache_dir or config.get("cache_dir")
    worker = (ModelClient(model, base_url=args.base_url or config.get("base_url"),
                          cache=ResponseCache(cache_dir) if cache_dir else None) if model else None)
    result = ablate(args.run_dir, baseline=args.baseline, worker=worker,
                    data_dir=args.data_dir or config.get("data_dir"), jobs=args.jobs)
    if args.json:
        _print_json(result.to_dict())
    else:
        print(result.describe())
    return 0


# -- compare -------------------------------------------------------------------------------------
def cmd_compare_verifiers(args: argparse.Namespace) -> int:
    (method,) = parse_methods([args.optimizer], [])
    options = {"tolerance": args.tolerance} if args.tolerance is not None else {}
    plan = plan_ablation(args.task, method, args.variants.split(","), parse_seeds(args.seeds), args.budget,
                         profile=args.profile, options=options, data_dir=args.data_dir, allow_drift=args.allow_drift)
    if args.plan:
        print(plan.describe(args.run_dir))
        return 0
    config = StudyConfig(run_root=args.run_dir, data_dir=args.data_dir, allow_drift=args.allow_drift,
                         policy=args.policy, worker_model=args.worker_model, architect_model=args.architect_model,
                         base_url=args.base_url, cache_dir=args.cache_dir, trusted_optimizer=args.trusted_optimizer)
    result = run_ablation(plan, config, LocalExecutor(args.jobs), progress=True)
    if args.json:
        _print_json(result.to_dict())
    else:
        print(result.describe())
    return 0


# -- vliw ----------------------------------------------------------------------------------------
def cmd_vliw_simulate(args: argparse.Namespace) -> int:
    for case in load_cases(args.cases):
        _print_json(run_case(case, engine=args.engine, cycle_cap=args.cycle_cap))
    return 0


# -- local model ---------------------------------------------------------------------------------
def _local_backend(args: argparse.Namespace, max_tokens_cap: int) -> LlamaBackend:
    return LlamaBackend(resolve_model(args.model, args.gguf), threads=args.threads, n_ctx=args.ctx,
                        max_tokens_cap=max_tokens_cap)


def cmd_serve_model(args: argparse.Namespace) -> int:
    backend = _local_backend(args, args.max_tokens)
    server = ChatServer(backend, api_key=args.api_key, port=args.port, name="local-model")
    try:
        stats = server.serve_until_signalled(
            f"heldout serve-model: {backend.model_id} ({backend.model_file.path.name}, {args.threads} thread(s), "
            f"context {args.ctx}) listening on {{url}}")
    except OSError as exc:
        raise HeldoutError(f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}") from None
    print(f"served {stats.ok} of {stats.calls} calls", file=sys.stderr, flush=True)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    started = time.monotonic()
    run_dir = args.run_dir or ("runs/demo-real-model" if args.real_model else "runs/demo")
    out = args.out or ("runs/demo-real-model-report" if args.real_model else "runs/demo-report")
    if args.real_model:
        backend = _local_backend(args, REAL_MODEL_DEMO_ARCHITECT_TOKENS)
        cells = build_cells(list(REAL_MODEL_DEMO_TASKS), parse_methods(REAL_MODEL_DEMO_METHODS, []),
                            list(DEMO_SEEDS), dict(REAL_MODEL_DEMO_TASKS), REAL_MODEL_DEMO_PROFILE,
                            {"max_tokens": REAL_MODEL_DEMO_ANSWER_TOKENS})
        with ChatServer(backend, name="local-model") as server:
            # One model answers one request at a time: two in flight keep it busy without queueing
            # requests into client timeouts. Identical requests (the seed arm's test answers in every
            # seed) are answered once, through the response cache.
            config = StudyConfig(run_root=run_dir, data_dir=args.data_dir, worker_model=backend.model_id,
                                 architect_model=backend.model_id, base_url=server.base_url,
                                 cache_dir=str(Path(run_dir) / "response-cache"), model_concurrency=2)
            results = run_study(cells, config, LocalExecutor(1))
        served = server.stats
        print(f"{backend.model_id} answered {served.ok} requests ({served.prompt_tokens} prompt + "
              f"{served.completion_tokens} completion tokens); the rest came from the response cache")
    else:
        cells = build_cells(list(DEMO_TASKS), parse_methods(DEMO_METHODS, []), list(DEMO_SEEDS),
                            dict(DEMO_TASKS), "default", {})
        results = run_study(cells, StudyConfig(run_root=run_dir), LocalExecutor(args.jobs))
    failed = [r for r in results if r["status"] != "ok"]
    report = build_report([run_dir], baseline="seed", data_dir=args.data_dir)
    if args.real_model:
        report.tables[0].notes.append(
            f"Every number here comes from one model, {backend.model_id} ({backend.model_file.path.name}), as "
            f"worker and architect, run by llama.cpp on the CPU with {args.threads} thread(s); worker answers at "
            f"temperature 0 capped at {REAL_MODEL_DEMO_ANSWER_TOKENS} tokens; split profile "
            f"{REAL_MODEL_DEMO_PROFILE} (16 train / 24 test examples per task).")
    for kind, path in write_report(report, out).items():
        print(f"{kind}: {path}")
    print(f"demo took {time.monotonic() - started:.0f} s")
    if failed:
        print(f"{len(failed)} cell(s) failed: " + "; ".join(
            f"{r['task']} {r['method']} s{r['seed']}: {r.get('error')}" for r in failed))
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="heldout", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"heldout {__version__}")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="run untrusted candidates without a sandbox when bubblewrap is unavailable "
                             "(recorded as isolation 'none'); never for code you did not write")
    sub = parser.add_subparsers(dest="command", required=True)

    tasks = sub.add_parser("tasks", help="list the registered tasks").add_subparsers(dest="action", required=True)
    p = tasks.add_parser("list", help="every task with kind, metric, split profiles and sizes")
    p.add_argument("--groups", action="store_true", help="with --json: print the task groups instead")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_tasks_list)

    data = sub.add_parser("data", help="verify or freeze data manifests").add_subparsers(dest="action", required=True)
    p = data.add_parser("verify", help="check manifests against the data")
    p.add_argument("tasks", nargs="*", help="task names or family prefixes (default: all)")
    p.add_argument("--data-dir", default=None, help="local data mirror laid out like ../shared/data (default $HELDOUT_DATA_DIR, else the hub)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_data_verify)
    p = data.add_parser("freeze", help="build a manifest (hashes + a profile) for data you hold")
    p.add_argument("--task", required=True, help="task name (registered, or new with --jsonl)")
    p.add_argument("--jsonl", default=None, help="your own examples: JSON lines with id, input, target[, group]")
    p.add_argument("--answer-format", choices=ANSWER_FORMATS, default="span",
                   help="how answers to your JSONL questions are scored (with --jsonl)")
    p.add_argument("--profile", required=True, help="name of the split profile to write")
    p.add_argument("--sizes", default=None, help="train/val/test sizes, e.g. 100/50/200 (seeded shuffle)")
    p.add_argument("--seed", type=int, default=0, help="salt of the hash order the profile is drawn in")
    p.add_argument("--by-group", action="store_true", help="topic-disjoint: no group spans two splits")
    p.add_argument("--data-dir", default=None, help="local data mirror laid out like ../shared/data (default $HELDOUT_DATA_DIR, else the hub)")
    p.add_argument("--out", default=None, help="manifest root (default: heldout/data_manifests)")
    p.set_defaults(func=cmd_data_freeze)

    p = sub.add_parser("eval", help="evaluate one candidate on a program task")
    p.add_argument("--task", required=True, help="task name (see `heldout tasks list`)")
    p.add_argument("--candidate", default=None, help="file or folder (default: the task's seed candidate)")
    p.add_argument("--profile", default="default", help="split profile (default: default)")
    p.add_argument("--split", default="test", choices=("train", "val", "test"), help="split to evaluate")
    p.add_argument("--tolerance", type=float, default=None, help="geometry tasks: constraint tolerance (default 0)")
    p.add_argument("--wall-seconds", type=float, default=None, help="wall seconds per sandboxed execution")
    p.add_argument("--data-dir", default=None, help="local data mirror laid out like ../shared/data (default $HELDOUT_DATA_DIR, else the hub)")
    p.add_argument("--allow-drift", action="store_true", help="load even if the data drifted from its manifest (stated in the record)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("score", help="score a JSONL of {id, output} rows with a prompt task's canonical verifier")
    p.add_argument("--task", required=True, help="prompt task name")
    p.add_argument("--outputs", required=True, help="JSONL file, one {\"id\": ..., \"output\": ...} per line")
    p.add_argument("--split", default="val", choices=("train", "val", "test"), help="split the ids belong to")
    p.add_argument("--profile", default="default", help="split profile (default: default)")
    p.add_argument("--data-dir", default=None, help="local data mirror laid out like ../shared/data (default $HELDOUT_DATA_DIR, else the hub)")
    p.add_argument("--allow-drift", action="store_true", help="load even if the data drifted from its manifest (stated in the record)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_score)

    ledger = sub.add_parser("ledger", help="check ledgers").add_subparsers(dest="action", required=True)
    p = ledger.add_parser("verify", help="detect any edited, dropped, inserted or reordered entry")
    p.add_argument("run_dirs", nargs="+", help="session dirs holding a ledger.jsonl")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_ledger_verify)

    p = sub.add_parser("run", help="run optimizers on tasks in protected sessions")
    p.add_argument("--task", action="append", required=True,
                   help="task, family (bbh), group (bbh/sepo, program), or glob ('mmlu_pro/*'); repeatable")
    p.add_argument("--profile", default="default", help="split profile (default: default)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2 (default 0)")
    p.add_argument("--budget", action="append", required=True,
                   help="metric calls per session: N, or TASK=N per task (repeatable)")
    p.add_argument("--architect-tokens", type=int, default=None, help="architect token budget per session")
    p.add_argument("--wall-seconds", type=float, default=None, help="wall-time budget per session, seconds")
    p.add_argument("--optimizer", action="append", default=[],
                   help="optimizer function module:function (runs isolated in the sandbox unless "
                        "--trusted-optimizer) or a reference name (repeatable)")
    p.add_argument("--trusted-optimizer", action="store_true",
                   help="run module:function optimizers in the harness's process (recorded as 'trusted, not isolated')")
    p.add_argument("--optimizer-cmd", action="append", default=[],
                   help="isolated optimizer command (repeatable); served the task view over HTTP")
    p.add_argument("--run-dir", required=True, help="study folder (one experiment; resumable)")
    p.add_argument("--jobs", type=int, default=1, help="sessions in parallel (process pool)")
    p.add_argument("--executor", default="local", choices=EXECUTORS,
                   help="local: a process pool (--jobs); ray: one Ray task per cell (pip install 'heldout[ray]')")
    p.add_argument("--ray-address", default=None,
                   help="Ray cluster address (default: $RAY_ADDRESS, else a new local instance); the run dir must be shared")
    p.add_argument("--cell-cpus", type=float, default=1.0, help="--executor ray: CPUs each cell asks for (default 1)")
    p.add_argument("--cell-memory-mb", type=int, default=None, help="--executor ray: memory each cell asks for, MB")
    p.add_argument("--policy", default="standard", choices=sorted(POLICIES),
                   help="visibility policy: what the optimizer sees per split")
    p.add_argument("--prompt-format", default=None,
                   help="prompt tasks: zero_shot (default), cot_3shot (BBH), cot_5shot (MMLU-Pro); see docs/scoring.md")
    p.add_argument("--verifier", default=CANONICAL,
                   help=f"verifier variant the optimizer sees: {describe_variants()}; held-out is always canonical")
    p.add_argument("--worker-model", default=None, help="model id of the worker (prompt tasks)")
    p.add_argument("--architect-model", default=None, help="model id of the metered architect")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)")
    p.add_argument("--cache-dir", default=None, help="response cache directory")
    p.add_argument("--tolerance", type=float, default=None, help="geometry tasks: constraint tolerance (default 0)")
    p.add_argument("--data-dir", default=None, help="local data mirror laid out like ../shared/data (default $HELDOUT_DATA_DIR, else the hub)")
    p.add_argument("--allow-drift", action="store_true", help="load even if the data drifted from its manifest (stated in the record)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_run)

    runs = sub.add_parser("runs", help="the results store: SQL over verified runs, Parquet exports").add_subparsers(
        dest="action", required=True)
    p = runs.add_parser("query", help=f"DuckDB SQL over the tables {', '.join(TABLES)} (see heldout/reports/store.py)")
    p.add_argument("run_dir", help="a study's run dir (verified now) or a Parquet export dir")
    p.add_argument("sql", help='e.g. "SELECT task, method, avg(test_score) FROM runs GROUP BY ALL"')
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.set_defaults(func=cmd_runs_query)
    p = runs.add_parser("export", help="write one Parquet file per table")
    p.add_argument("run_dir", help="a study's run dir")
    p.add_argument("--parquet", required=True, metavar="OUT", help="directory for runs.parquet, verdicts.parquet, ...")
    p.set_defaults(func=cmd_runs_export)

    p = sub.add_parser("demo", help="run the small study of the README and write its report")
    p.add_argument("--real-model", action="store_true",
                   help="seed vs reflective on two prompt tasks with a real local model (the [local-model] extra)")
    p.add_argument("--run-dir", default=None,
                   help="study folder (default runs/demo, runs/demo-real-model with --real-model)")
    p.add_argument("--out", default=None,
                   help="report folder (default runs/demo-report, runs/demo-real-model-report with --real-model)")
    p.add_argument("--jobs", type=int, default=2, help="sessions in parallel (the real-model demo runs one)")
    p.add_argument("--data-dir", default=None, help="dataset mirror for --real-model (default $HELDOUT_DATA_DIR)")
    _local_model_arguments(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("serve-model", help="an OpenAI-compatible endpoint on 127.0.0.1 for a local GGUF model")
    _local_model_arguments(p)
    p.add_argument("--port", type=int, default=8000, help="0: let the OS choose (printed)")
    p.add_argument("--max-tokens", type=int, default=512, help="the most tokens one answer may have")
    p.add_argument("--api-key", default=None, help="require this bearer token")
    p.set_defaults(func=cmd_serve_model)

    p = sub.add_parser("report", help="tables, figures, report.md/.html and results.json from run dirs")
    p.add_argument("run_dirs", nargs="+", help="run dirs (searched recursively for run records)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--baseline-method", default="seed", help="method every paired table compares against")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level")
    p.add_argument("--checkpoints", default=None, help="metric-call checkpoints, e.g. 500,1000,1500,2000")
    p.add_argument("--data-dir", default=None, help="for per-topic grouping of dataset tasks")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("check", help="CI regression gate: exit 0 pass, 1 regression, 2 inconclusive or invalid input")
    p.add_argument("--baseline", nargs="+", required=True, help="baseline run dirs")
    p.add_argument("--current", nargs="+", required=True, help="current run dirs")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of each one-sided test")
    p.add_argument("--min-effect", type=float, default=0.0,
                   help="largest drop you accept (score units); with 0 only a significant improvement passes")
    p.add_argument("--method", default=None, help="compare this method when a run set holds several")
    p.add_argument("--pair-seeds", choices=("id", "independent", "rank"), default="id",
                   help="pair seeds by id (default) or compare independent runs (fresh seeds; 'rank' = independent)")
    p.add_argument("--allow-mismatch", action="append", default=[], metavar="FIELD", choices=DESIGN_FIELDS,
                   help="compare runs that differ in FIELD (" + ", ".join(DESIGN_FIELDS) + "); stated in the "
                        "output (repeatable)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("plan", help="minimum detectable effect of a K-seed study (paired 0/1 data, run variance)")
    p.add_argument("--task", required=True, help="task name")
    p.add_argument("--profile", default="default", help="split profile (its test split is the design's examples)")
    p.add_argument("--seeds", type=int, required=True, help="runs per arm")
    p.add_argument("--pilot", default=None, help="pilot run dir: baseline score, run-to-run SD, seed headroom")
    p.add_argument("--p-base", type=float, default=None, help="baseline score (overrides the pilot's)")
    p.add_argument("--run-sd", type=float, default=None, help="SD of a run's mean score (overrides the pilot's)")
    p.add_argument("--effect", type=float, default=None, help="target effect: seeds/examples needed to detect it")
    p.add_argument("--pair-seeds", choices=("id", "independent"), default="id",
                   help="as the gate will pair them (id: assumes no correlation within a pair, conservative)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of the one-sided test")
    p.add_argument("--power", type=float, default=0.8, help="target power")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan)

    split = sub.add_parser("split", help="build and prove topic-disjoint split profiles").add_subparsers(
        dest="action", required=True)
    p = split.add_parser("build", help="whole groups to test, then val, then train (+ a shared-topic probe pool)")
    p.add_argument("--task", required=True)
    p.add_argument("--by", choices=("group",), default="group", help="the unit kept whole (topic groups)")
    p.add_argument("--sizes", required=True, help="target examples TRAIN/VAL/TEST, e.g. 60/40/120")
    p.add_argument("--probe", type=int, default=0, help="fresh items per train group for shared_topic_probe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", required=True, help="the new profile's name")
    p.add_argument("--out", default=None, help="user manifest root (default: first dir of $HELDOUT_MANIFEST_PATH)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_split_build)
    p = split.add_parser("check", help="prove zero group overlap (exit 1 otherwise) and scan for near-duplicates")
    p.add_argument("--task", required=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--threshold", type=float, default=0.5, help="near-duplicate Jaccard threshold")
    p.add_argument("--ngram", type=int, default=2, help="word n-gram size of the near-duplicate scan")
    p.add_argument("--min-answer-words", type=int, default=3)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_split_check)

    leak = sub.add_parser("leak", help="answer keys in candidates; the topic-shared leakage ablation").add_subparsers(
        dest="action", required=True)
    p = leak.add_parser("scan", help="training questions/answers found in a candidate's text")
    p.add_argument("candidate", help="candidate file or folder (a .json dict of components, or text)")
    p.add_argument("--task", required=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_leak_scan)
    p = leak.add_parser("ablate", help="score seed and final candidates on test / exact train / shared-topic probe")
    p.add_argument("run_dir", help="a study's run dir (searched recursively for run records)")
    p.add_argument("--baseline", default="seed", help="'seed' (the task's seed candidate) or a method name")
    p.add_argument("--worker-model", default=None, help="default: the study's (study.json)")
    p.add_argument("--base-url", default=None)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_leak_ablate)

    compare = sub.add_parser("compare", help="protocols that compare one optimizer under several conditions"
                             ).add_subparsers(dest="action", required=True)
    p = compare.add_parser("verifiers", help="optimise under each verifier variant, re-score with the canonical one")
    p.add_argument("--task", required=True, help="one task")
    p.add_argument("--optimizer", required=True, help="reference name or NAME=module:function (isolated unless "
                   "--trusted-optimizer)")
    p.add_argument("--trusted-optimizer", action="store_true",
                   help="run a module:function optimizer in the harness's process (recorded as 'trusted, not isolated')")
    p.add_argument("--variants", default="decomposed,scalar,coarse:3", help=f"comma-separated: {describe_variants()}")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    p.add_argument("--budget", type=int, required=True, help="metric calls per session")
    p.add_argument("--run-dir", required=True, help="ablation folder (resumable)")
    p.add_argument("--plan", action="store_true", help="print the sessions and budgets and exit")
    p.add_argument("--profile", default="default", help="split profile (default: default)")
    p.add_argument("--policy", default="standard", choices=sorted(POLICIES), help="visibility policy")
    p.add_argument("--jobs", type=int, default=1, help="sessions in parallel (process pool)")
    p.add_argument("--worker-model", default=None, help="model id of the worker (prompt tasks)")
    p.add_argument("--architect-model", default=None, help="model id of the metered architect")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)")
    p.add_argument("--cache-dir", default=None, help="response cache directory")
    p.add_argument("--tolerance", type=float, default=None, help="geometry tasks: constraint tolerance (default 0)")
    p.add_argument("--data-dir", default=None, help="local data mirror laid out like ../shared/data (default $HELDOUT_DATA_DIR, else the hub)")
    p.add_argument("--allow-drift", action="store_true", help="load even if the data drifted from its manifest")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_compare_verifiers)
    p = compare.add_parser("arms", help="serial vs best-of-N fork vs merge-of-N at an equal budget")
    p.add_argument("--task", required=True, help="one task name")
    p.add_argument("--optimizer", required=True, help="reference name or module:function taking width/stream")
    p.add_argument("--budget", type=int, required=True, help="budget B per seed and arm, in the --fixed unit")
    p.add_argument("--width", type=int, required=True, help="N: forks in the fork arm, workers in the merge arm")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (>= 3 to separate arms; default 0,1,2)")
    p.add_argument("--fixed", choices=FIXED_UNITS, default="metric_calls",
                   help="the unit held equal and enforced; the others are measured as confounds")
    p.add_argument("--metric-cap", type=int, default=None,
                   help="with --fixed architect_calls/tokens: metric calls per run of budget B")
    p.add_argument("--drift-tolerance", type=float, default=0.10,
                   help="an arm spending this fraction less of the fixed unit marks the comparison broken")
    p.add_argument("--min-headroom", type=float, default=0.10,
                   help="warn when the seed's val score is within this fraction of the ceiling")
    p.add_argument("--plan", action="store_true", help="print every run, its budget and the total; spend nothing")
    p.add_argument("--profile", default="default", help="split profile (default: default)")
    p.add_argument("--run-dir", required=True, help="the experiment's folder (one level per arm; resumable)")
    p.add_argument("--jobs", type=int, default=1, help="sessions in parallel (process pool)")
    p.add_argument("--worker-model", default=None, help="model id of the worker (prompt tasks)")
    p.add_argument("--architect-model", default=None, help="model id of the metered architect")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)")
    p.add_argument("--cache-dir", default=None, help="response cache directory")
    p.add_argument("--data-dir", default=None, help="local data mirror laid out like ../shared/data (default $HELDOUT_DATA_DIR, else the hub)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_compare_arms)

    vliw = sub.add_parser("vliw", help="the VLIW kernel simulator").add_subparsers(dest="action", required=True)
    p = vliw.add_parser("simulate", help="run conformance cases; one JSON line per case")
    p.add_argument("cases", help="CASES.json: a list of {name, program, mem[, scratch_init, enable_pause, runs]}")
    p.add_argument("--engine", choices=("fast", "reference"), default="fast", help="simulator engine")
    p.add_argument("--cycle-cap", type=int, default=10_000_000, help="stop a program after this many cycles")
    p.set_defaults(func=cmd_vliw_simulate)
    return parser


def _local_model_arguments(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", default=None, help="a bundled model (default: smollm2-135m-instruct)")
    which.add_argument("--gguf", default=None, help="any GGUF chat model file instead")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for the model")
    p.add_argument("--ctx", type=int, default=2048, help="context length in tokens")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.unsafe_no_sandbox:
        allow_unsafe_no_sandbox()
    try:
        return int(args.func(args) or 0)
    except HeldoutError as exc:
        print(f"heldout: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
