# PYTHON_ARGCOMPLETE_OK  (tab completion: `heldout completion bash`)
"""The ``heldout`` command: a thin layer over the API.

Each sub-command is a function ``cmd_<name>(args) -> int`` with its argument wiring
``<name>_arguments(parser)`` beside it, both named once in :data:`COMMANDS`.
Errors heldout raises on purpose are printed as one clear line (exit 2)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from heldout import __version__
from heldout.cli import data
from heldout.cli import evaluate
from heldout.cli import ledger
from heldout.cli import results
from heldout.cli.shared import (HeldoutParser, add_data_dir, add_json, add_local_model_arguments,
                                add_optimizer_by_name, add_profile, add_session_environment, command_line,
                                local_backend, number, optimizer_trusted, print_json)
from heldout.contracts import HeldoutError
from heldout.files import check_folder, read_user_json

if TYPE_CHECKING:  # annotations only
    from heldout.protocols.study import Study


# Start-up time: only the standard library and the two light modules above load with this module.
# Each command imports its modules when it runs, and its `_arguments` function imports what its
# choices come from; main adds only the invoked command's arguments (see build_parser), so
# `heldout --help` and `--version` import no command's modules at all (perf/cli_start.py), and even
# the whole parser loads no numba, scipy, statsmodels, matplotlib or duckdb (tests/test_extension.py).
# The choices below are copies of heavier modules' constants; that test checks each equals its source.
FIXED_UNITS = ("metric_calls", "architect_calls", "tokens")  # heldout.protocols.arms

# The README's main job: seed vs the reference searches, 3 seeds each, on three embedded tasks with a
# matched budget per task (no model, no network; a minute or two on 2 cores).
DEMO_TASKS = {"lockpicking/six": 300, "circle_packing/square26": 20, "heilbronn/triangle11": 20}
DEMO_METHODS = ("seed", "local-search")
DEMO_SEEDS = (0, 1, 2, 3, 4)  # 5 per arm: the exact permutation test over runs, Holm over 3 tasks, can conclude
# `heldout demo --real-model`: the same study shape with a real (tiny) model as worker and architect
# on two prompt tasks, small enough for a laptop CPU: a 16/0/24 split profile, one reflective round.
REAL_MODEL_DEMO_TASKS = {"bbh/boolean_expressions": 16, "gsm_hard": 16}
REAL_MODEL_DEMO_SEEDS = (0, 1, 2)  # each seed costs ~12 min of one CPU core with the real model
REAL_MODEL_DEMO_PROFILE = "cpu-demo"
REAL_MODEL_DEMO_METHODS = ("seed", "reflective")
REAL_MODEL_DEMO_ANSWER_TOKENS = 80  # per worker answer
REAL_MODEL_DEMO_ARCHITECT_TOKENS = 256  # per architect answer (the server's cap)
# `heldout demo --protocol`: the generalisation-first protocol on a small topic-disjoint profile (one
# MMLU-Pro source per pool; HotpotQA's distractor prompts, ~2,200 tokens, overflow SmolLM2's context)
PROTOCOL_DEMO_TASK, PROTOCOL_DEMO_PROFILE = "mmlu_pro/business", "cpu-demo"
PROTOCOL_DEMO_OPTIMIZERS = ("reflective", "gepa")
PROTOCOL_DEMO_SEEDS = (0, 1, 2)
PROTOCOL_DEMO_BUDGET = 30  # metric calls per session: gepa's minimum on 16 train / 12 val (2 x 12 + 2 x 3): the
# seed and one child on the 12 val questions and one reflection minibatch (at 24 gepa could only return the seed)
PROTOCOL_DEMO_SLOTS = 2  # model copies answering at once, one per core


# -- argument wiring shared by several commands --------------------------------------------------


# -- tasks ---------------------------------------------------------------------------------------


# -- data ----------------------------------------------------------------------------------------


# -- eval ----------------------------------------------------------------------------------------


# -- ledger / run --------------------------------------------------------------------------------


# `heldout run` flags that say what the cells are; a study file says all of them itself
STUDY_FLAGS = ("task", "budget", "optimizer", "optimizer_cmd", "method_option", "profile", "seeds", "verifier", "policy",
               "prompt_format", "architect_tokens", "wall_seconds", "worker_model", "architect_model",
               "base_url", "cache_dir", "model_timeout", "tolerance", "data_dir", "allow_drift")


def _executor_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {"kind": args.executor, "jobs": args.jobs, "ray_address": args.ray_address, "cell_cpus": args.cell_cpus,
            "cell_memory_mb": args.cell_memory_mb}


def study_from_flags(args: argparse.Namespace) -> Study:
    """The study the ``heldout run`` flags say: each flag read in its own syntax, then made like a
    study file's (:func:`make_study`), so the same settings give the same cells either way."""
    from heldout.benchmarks.registry import expand_tasks
    from heldout.benchmarks.verifiers import CANONICAL
    from heldout.protocols.study import (DEFAULT_PROFILE, make_study, parse_budgets, parse_method_options,
                                         parse_methods, parse_seeds)
    if not args.task or not args.budget or not args.run_dir:
        raise HeldoutError("heldout run needs a STUDY.toml, or --task, --budget and --run-dir")
    tasks = expand_tasks(args.task)
    options = {} if args.tolerance is None else {"tolerance": args.tolerance}
    if args.prompt_format:
        options["prompt_format"] = args.prompt_format
    return make_study(
        run_dir=args.run_dir, tasks=tasks, budgets=parse_budgets(args.budget, tasks),
        methods=parse_method_options(parse_methods(args.optimizer or [], args.optimizer_cmd or []),
                                     args.method_option or []),
        profiles=[args.profile or DEFAULT_PROFILE], seeds=parse_seeds(args.seeds or "0"),
        verifiers=[args.verifier or CANONICAL], policy=args.policy or "standard", options=options,
        limits={k: v for k, v in (("architect_tokens", args.architect_tokens),
                                  ("wall_seconds", args.wall_seconds)) if v is not None},
        models={k: v for k, v in (("worker", args.worker_model), ("architect", args.architect_model),
                                  ("base_url", args.base_url), ("cache_dir", args.cache_dir),
                                  ("timeout", args.model_timeout)) if v is not None},
        executor={k: v for k, v in _executor_flags(args).items() if v is not None},
        data_dir=args.data_dir or None, allow_drift=bool(args.allow_drift),
        trusted_optimizer=optimizer_trusted(args), origin="heldout run")


def run_arguments(p: argparse.ArgumentParser) -> None:
    from heldout.benchmarks.verifiers import describe_variants
    from heldout.evaluators.policy import POLICIES
    from heldout.protocols.executors import EXECUTORS
    p.add_argument("study", nargs="?", default=None,
                   help="STUDY.toml: the whole study in one file (see docs); or give the flags below")
    p.add_argument("--dry-run", action="store_true", help="print every cell and the total budget, run nothing")
    p.add_argument("--task", action="append", default=None,
                   help="task, family (bbh), group (bbh/sepo, program), or glob ('mmlu_pro/*'); repeatable")
    p.add_argument("--profile", default=None, help="split profile (default: default)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds, e.g. 0,1,2 (default 0)")
    p.add_argument("--budget", action="append", default=None,
                   help="metric calls per session: N, or TASK=N per task (repeatable)")
    p.add_argument("--architect-tokens", type=number(int, 1, "--architect-tokens"), default=None,
                   help="architect token budget per session")
    p.add_argument("--wall-seconds", type=number(float, 0, "--wall-seconds", strict=True), default=None,
                   help="wall-time budget per session, seconds (an isolated optimizer is stopped at it plus 10 s of "
                        "grace; without it, at the default of 6 hours, recorded in the ledger)")
    p.add_argument("--optimizer", action="append", default=None,
                   help="optimizer function module:function (runs isolated in the sandbox unless "
                        "--trusted-optimizer) or a reference name (repeatable)")
    p.add_argument("--trusted-optimizer", action="store_true",
                   help="run module:function optimizers in the harness's process (recorded as 'trusted, not isolated')")
    p.add_argument("--optimizer-cmd", action="append", default=None,
                   help="isolated optimizer command (repeatable); served the task view over HTTP")
    p.add_argument("--method-option", action="append", default=None, metavar="NAME.KEY=VALUE",
                   help="an option of method NAME (repeatable), e.g. gepa.use_merge=true, dspy-mipro.auto=light, "
                   "openevolve.num_islands=2: a field of the library adapter's settings (checked before anything "
                   "runs; recorded in each run record)")
    p.add_argument("--run-dir", default=None, help="study folder (one experiment; resumable); overrides the file's")
    p.add_argument("--resume", action="store_true",
                   help="continue the study in the run dir (only with exactly the settings it was started with)")
    p.add_argument("--jobs", type=number(int, 1, "--jobs"), default=None, help="sessions in parallel (process pool; default 1)")
    p.add_argument("--model-timeout", type=number(float, 0, "--model-timeout", strict=True), default=None,
                   help="seconds one model call may take before it is retried (default 60; a busy local CPU model may "
                        "need more); a call that still fails leaves its cell incomplete, never scored 0")
    p.add_argument("--executor", default=None, choices=EXECUTORS,
                   help="local: a process pool (--jobs); ray: one Ray task per cell (pip install 'heldout[ray]')")
    p.add_argument("--ray-address", default=None,
                   help="Ray cluster address (default: $RAY_ADDRESS, else a new local instance); the run dir must be shared")
    p.add_argument("--cell-cpus", type=float, default=None,
                   help="--executor ray: CPUs each cell asks for (default: what a cell uses, 1.4 for a program task, "
                   "0.25 for a prompt task)")
    p.add_argument("--cell-memory-mb", type=int, default=None, help="--executor ray: memory each cell asks for, MB")
    p.add_argument("--policy", default=None, choices=sorted(POLICIES),
                   help="visibility policy: what the optimizer sees per split")
    p.add_argument("--prompt-format", default=None,
                   help="prompt tasks: zero_shot (default), cot_3shot (BBH), cot_5shot (MMLU-Pro); see docs/scoring.md")
    p.add_argument("--verifier", default=None,
                   help=f"verifier variant the optimizer sees: {describe_variants()}; held-out is always canonical")
    add_session_environment(p)
    add_json(p)


def cmd_run(args: argparse.Namespace) -> int:
    from heldout.protocols.executors import make_executor
    from heldout.protocols.run import check_infrastructure, open_study, run_study
    from heldout.protocols.study import load_study, save_resolved
    if args.study:
        given = [f"--{f.replace('_', '-')}" for f in STUDY_FLAGS if getattr(args, f) not in (None, [], False)]
        if given:
            raise HeldoutError(f"{args.study} is the whole study; drop {', '.join(given)} (edit the file instead)")
        study = load_study(args.study, run_dir=args.run_dir)
        # trust is the person's, never the file's (a file asking for it was refused)
        study.config.trusted_optimizer = optimizer_trusted(args)
        # how to run (not what): the execution flags override the file's [executor]
        study.executor.update({k: v for k, v in _executor_flags(args).items() if v is not None})
    else:
        study = study_from_flags(args)
    if args.dry_run:
        print("\n".join(study.plan()))
        return 0
    groups = study.groups()
    # everything that can refuse the study does so before any file of it exists: models and their
    # endpoints, the sandbox, the executor's flags, the cluster's nodes (a refused command writes nothing)
    for config, cells in groups:
        check_infrastructure(cells, config)
    executors = [make_executor(study.executor["kind"], config.run_root, jobs=study.executor["jobs"],
                               ray_address=study.executor.get("ray_address"), cell_cpus=study.executor["cell_cpus"],
                               cell_memory_mb=study.executor.get("cell_memory_mb")) for config, _ in groups]
    try:
        getattr(executors[0], "prepare", lambda *_: None)(study.cells(), study.config.data_dir)
        for config, cells in groups:  # one run dir = one experiment: checked before anything runs
            open_study(cells, config, resume=args.resume)
        saved = save_resolved(study)
    except BaseException:
        getattr(executors[0], "close", lambda: None)()
        raise
    if args.verbosity > 0:
        print(f"heldout run: study {saved}:\n{saved.read_text()}", file=sys.stderr)
    hint = command_line(args) + ("" if "--resume" in (args.argv or sys.argv[1:]) else " --resume")
    results = []
    for (config, cells), executor in zip(groups, executors):
        try:
            results += run_study(cells, config, executor, progress=args.verbosity >= 0, resume_hint=hint)
        finally:
            getattr(executor, "close", lambda: None)()
        if any(r["status"] in ("interrupted", "not started") for r in results):
            break  # a stop request ends the whole study, not only this profile's part
    if args.json:
        print_json(results)
    else:
        for r in results:
            outcome = f"test {r['test_score']}" if r["status"] == "ok" else (r.get("error") or "")
            print(f"{r['task']:<28} {r['method']:<20} seed {r['seed']:<3} {r['status']:<11} {outcome}  {r['run_dir']}")
    if any(r["status"] in ("interrupted", "not started") for r in results):
        return 130
    return 0 if all(r["status"] == "ok" for r in results) else 1


def compare_arms_arguments(p: argparse.ArgumentParser) -> None:
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
    add_profile(p)
    p.add_argument("--run-dir", required=True, help="the experiment's folder (one level per arm; resumable)")
    p.add_argument("--jobs", type=int, default=1, help="sessions in parallel (process pool)")
    add_session_environment(p, tolerance=False, drift=False)
    add_json(p)


def cmd_compare_arms(args: argparse.Namespace) -> int:
    from heldout.protocols.arms import ArmsSpec, describe_plan, open_arms, run_arms, validate_arms
    from heldout.protocols.run import LocalExecutor, StudyConfig
    from heldout.protocols.study import parse_seeds
    spec = ArmsSpec(task=args.task, optimizer=args.optimizer, budget=args.budget, width=args.width,
                    seeds=tuple(parse_seeds(args.seeds)), fixed=args.fixed, profile=args.profile,
                    metric_cap=args.metric_cap, drift_tolerance=args.drift_tolerance,
                    min_headroom=args.min_headroom)
    plan = open_arms(spec, args.run_dir)
    notes = validate_arms(spec)  # refuses, before spending, a design that cannot conclude
    if args.plan:
        print(describe_plan(spec, plan))
        for note in notes:
            print(f"  {note}")
        return 0
    config = StudyConfig(run_root=args.run_dir, data_dir=args.data_dir, worker_model=args.worker_model,
                         architect_model=args.architect_model, base_url=args.base_url, cache_dir=args.cache_dir)
    result = run_arms(spec, args.run_dir, config, LocalExecutor(args.jobs))
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.text())
    return 1 if result.broken else 0


# -- runs (the results store) --------------------------------------------------------------------


# -- export ------------------------------------------------------------------------------------


# -- verify --------------------------------------------------------------------------------------


# -- report / check ------------------------------------------------------------------------------


# -- split / leak --------------------------------------------------------------------------------


def leak_scan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("candidate", help="candidate file or folder (a .json dict of components, or text)")
    p.add_argument("--task", required=True, help="the task whose training split is searched for")
    p.add_argument("--profile", required=True, help="the split profile whose training examples are looked for")
    add_data_dir(p)
    add_json(p)


def cmd_leak_scan(args: argparse.Namespace) -> int:
    from heldout.benchmarks.loading import load_task
    from heldout.protocols.leakage import scan_candidate
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
    p.add_argument("--base-url", default=None, help="the worker model's OpenAI-compatible endpoint (default: the study's)")
    p.add_argument("--cache-dir", default=None, help="response cache folder (default: the study's)")
    p.add_argument("--jobs", type=int, default=2, help="examples scored at once")
    add_data_dir(p)
    add_json(p)


def cmd_leak_ablate(args: argparse.Namespace) -> int:
    from heldout.models import ModelClient, ResponseCache
    from heldout.protocols.leakage import ablate
    from heldout.protocols.reviewer_evidence import study_evidence
    from heldout.reports.evidence_tables import evidence_tables, tables_text
    study = Path(args.run_dir) / "study.json"
    config = read_user_json(study, "the study's record").get("config", {}) if os.path.lexists(study) else {}
    if not isinstance(config, dict):
        raise HeldoutError(f"the study's record {study}: config must be an object, got {type(config).__name__}")
    model = args.worker_model or config.get("worker_model")
    cache_dir = args.cache_dir or config.get("cache_dir")
    worker = (ModelClient(model, base_url=args.base_url or config.get("base_url"),
                          cache=ResponseCache(cache_dir) if cache_dir else None) if model else None)
    result = ablate(args.run_dir, baseline=args.baseline_method, worker=worker,
                    data_dir=args.data_dir or config.get("data_dir"), jobs=args.jobs)
    # what a reviewer asks beside the verdicts: per-item gains, lineage, key per component, recipe baseline
    evidence = study_evidence(args.run_dir, baseline=args.baseline_method, worker=worker,
                              data_dir=args.data_dir or config.get("data_dir"), jobs=args.jobs)
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


# -- compare -------------------------------------------------------------------------------------
def compare_verifiers_arguments(p: argparse.ArgumentParser) -> None:
    from heldout.benchmarks.verifiers import describe_variants
    from heldout.evaluators.policy import POLICIES
    p.add_argument("--task", required=True, help="one task")
    add_optimizer_by_name(p)
    p.add_argument("--variants", default="decomposed,scalar,coarse:3", help=f"comma-separated: {describe_variants()}")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (>= 3 for a verdict; default 0,1,2)")
    p.add_argument("--budget", type=int, required=True, help="metric calls per session")
    p.add_argument("--run-dir", required=True, help="ablation folder (resumable)")
    p.add_argument("--plan", action="store_true", help="print the sessions and budgets and exit")
    add_profile(p)
    p.add_argument("--policy", default="standard", choices=sorted(POLICIES), help="visibility policy")
    p.add_argument("--jobs", type=int, default=1, help="sessions in parallel (process pool)")
    add_session_environment(p)
    add_json(p)


def cmd_compare_verifiers(args: argparse.Namespace) -> int:
    from heldout.protocols.run import LocalExecutor, StudyConfig
    from heldout.protocols.study import parse_methods, parse_seeds
    from heldout.protocols.verifier_ablation import plan_ablation, run_ablation
    (method,) = parse_methods([args.optimizer], [])
    options = {"tolerance": args.tolerance} if args.tolerance is not None else {}
    plan = plan_ablation(args.task, method, args.variants.split(","), parse_seeds(args.seeds), args.budget,
                         profile=args.profile, options=options, data_dir=args.data_dir, allow_drift=args.allow_drift)
    if args.plan:
        print(plan.describe(args.run_dir))
        return 0
    config = StudyConfig(run_root=args.run_dir, data_dir=args.data_dir, allow_drift=args.allow_drift,
                         policy=args.policy, worker_model=args.worker_model, architect_model=args.architect_model,
                         base_url=args.base_url, cache_dir=args.cache_dir, trusted_optimizer=optimizer_trusted(args))
    result = run_ablation(plan, config, LocalExecutor(args.jobs), progress=True)
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.describe())
    return 0


# -- protocol ------------------------------------------------------------------------------------
# The protocol's own flags: with --study they come from the file (a key per flag), never both.
GENERALISATION_DEFAULTS = {"profile": "topic-disjoint", "seeds": "0,1,2", "policy": "standard"}
GENERALISATION_FLAGS = ("task", "profile", "optimizer", "seeds", "budget", "variants", "allow_topic_shared", "placebo_draws",
                        "run_dir", "policy", "worker_model", "architect_model", "base_url",
                        "cache_dir", "tolerance", "data_dir", "allow_drift")


def protocol_generalisation_arguments(p: argparse.ArgumentParser) -> None:
    from heldout.benchmarks.verifiers import describe_variants
    from heldout.evaluators.policy import POLICIES
    p.add_argument("--study", default=None, metavar="PROTOCOL.toml",
                   help="the whole protocol in one file, a key per flag below (task, optimizer, seeds, budget, "
                   "variants, run_dir, [models], ...); then give none of those flags")
    p.add_argument("--task", default=None, help="one prompt task (required without --study)")
    p.add_argument("--profile", default=None, help="split profile (default: topic-disjoint)")
    add_optimizer_by_name(p, required=False)
    p.add_argument("--seeds", default=None, help="comma-separated seeds (>= 3 for a verdict; default 0,1,2)")
    p.add_argument("--budget", type=number(int, 1, "--budget"), default=None,
                   help="metric calls per session (required without --study)")
    p.add_argument("--variants", default=None,
                   help=f"verifier variants to ablate, comma-separated (default: none): {describe_variants()}")
    p.add_argument("--allow-topic-shared", action="store_true",
                   help="run on a profile not proven topic-disjoint (recorded; every reading then says NOT PROVEN)")
    p.add_argument("--placebo-draws", type=number(int, 1, "--placebo-draws"), default=None,
                   help="neutral re-wordings of the seed scored per seed, the noise floor of the verdicts against "
                   "the seed (default: as many as the exact test needs at the seed count: 3 seeds x 7, 5 x 3, 10 x 1)")
    p.add_argument("--run-dir", default=None, help="the protocol's folder (resumable: re-run the command to "
                   "continue; required without --study)")
    p.add_argument("--plan", action="store_true", help="print every session, the metric calls and what the design "
                   "can detect; spend and write nothing")
    p.add_argument("--policy", default=None, choices=sorted(POLICIES), help="visibility policy (default: standard)")
    p.add_argument("--jobs", type=number(int, 1, "--jobs"), default=1, help="sessions in parallel (process pool)")
    add_session_environment(p)
    add_json(p)


def generalisation_from_args(args: argparse.Namespace):
    """The protocol's spec and folder from ``--study`` or from the flags (one or the other), with
    ``args``' session settings (models, policy, data dir, ...) filled in from the file."""
    from heldout.protocols.generalisation import GeneralisationSpec, load_generalisation_file
    from heldout.protocols.study import parse_methods, parse_seeds
    if args.study:
        given = [f"--{f.replace('_', '-')}" for f in GENERALISATION_FLAGS if getattr(args, f) not in (None, False)]
        if given:
            raise HeldoutError(f"--study {args.study} holds the whole protocol; drop {', '.join(given)} "
                               "(or put them in the file)")
        loaded = load_generalisation_file(args.study)
        for key, value in {**loaded.settings, "run_dir": loaded.run_dir}.items():
            setattr(args, key, value)
    else:
        missing = [f"--{f.replace('_', '-')}" for f in ("task", "optimizer", "budget", "run_dir")
                   if getattr(args, f) is None]
        if missing:
            raise HeldoutError(f"heldout protocol generalisation needs --study PROTOCOL.toml, or {', '.join(missing)}")
    for key, value in GENERALISATION_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.study:
        return loaded.spec
    (method,) = parse_methods([args.optimizer], [])
    variants = tuple(v.strip() for v in (args.variants or "").split(",") if v.strip())
    return GeneralisationSpec(task=args.task, profile=args.profile, optimizer=method,
                              seeds=tuple(parse_seeds(args.seeds)), budget=args.budget, variants=variants,
                              allow_topic_shared=args.allow_topic_shared, placebo_draws=args.placebo_draws or 0,
                              options={"tolerance": args.tolerance} if args.tolerance is not None else {})


def cmd_protocol_generalisation(args: argparse.Namespace) -> int:
    from heldout.protocols.generalisation import GeneralisationInterrupted, plan_generalisation, run_generalisation
    from heldout.protocols.run import LocalExecutor, StudyConfig
    from heldout.reports.generalisation import write_generalisation_report
    spec = generalisation_from_args(args)
    if args.study:  # the file's run_dir (a --run-dir flag was checked with every command's folders)
        check_folder(args.run_dir, "run_dir")
    plan = plan_generalisation(spec, data_dir=args.data_dir, allow_drift=args.allow_drift)
    if args.plan:
        print(plan.describe(args.run_dir))
        return 0
    config = StudyConfig(run_root=args.run_dir, data_dir=args.data_dir, allow_drift=args.allow_drift,
                         policy=args.policy, worker_model=args.worker_model, architect_model=args.architect_model,
                         base_url=args.base_url, cache_dir=args.cache_dir, trusted_optimizer=optimizer_trusted(args))
    hint = command_line(args)
    try:
        result = run_generalisation(plan, args.run_dir, config, executor=LocalExecutor(args.jobs),
                                    progress=args.verbosity >= 0, resume_hint=hint)
    except GeneralisationInterrupted as exc:  # stopped, not failed: the exit code of an interrupted `heldout run`
        print(f"heldout: {exc}", file=sys.stderr)
        return 130
    written = write_generalisation_report(result, args.run_dir)
    if args.json:
        print_json(result.as_dict())
    else:
        for sentence in result.reading:
            print(f"- {sentence.text}  [{sentence.source}]")
        for kind in ("md", "html", "json", "generalisation.json"):
            print(f"{kind}: {written[kind]}")
    return 0


# -- vliw ----------------------------------------------------------------------------------------
def vliw_simulate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("cases", help="CASES.json: a list of {name, program, mem[, scratch_init, enable_pause, runs]}")
    p.add_argument("--engine", choices=("fast", "reference"), default="fast", help="simulator engine")
    p.add_argument("--cycle-cap", type=int, default=10_000_000, help="stop a program after this many cycles")


def cmd_vliw_simulate(args: argparse.Namespace) -> int:
    from heldout.benchmarks.vliw.conformance import load_cases, run_case
    for case in load_cases(args.cases):
        print_json(run_case(case, engine=args.engine, cycle_cap=args.cycle_cap))
    return 0


# -- local model ---------------------------------------------------------------------------------


def serve_model_arguments(p: argparse.ArgumentParser) -> None:
    add_local_model_arguments(p)
    p.add_argument("--port", type=int, default=8000, help="0: let the OS choose (printed)")
    p.add_argument("--max-tokens", type=int, default=512, help="the most tokens one answer may have")
    p.add_argument("--api-key", default=None, help="require this bearer token")
    p.add_argument("--slots", type=number(int, 1, "--slots"), default=1,
                   help="requests answered at once, each by its own model copy (SmolLM2-135M measured: VmRSS 219 MB "
                        "with 1 slot, 356 MB with 2); give each slot a core: slots x threads <= cores")


def cmd_serve_model(args: argparse.Namespace) -> int:
    # Each slot is its own llama.cpp context over the same memory-mapped weights: N slots answer N
    # requests at once, and which slot answers never changes the text (see SlotPool).
    from heldout.models.backends.pool import SlotPool
    from heldout.models.server import ChatServer
    pool = SlotPool([local_backend(args, args.max_tokens) for _ in range(args.slots)])
    first = pool.copies[0]
    server = ChatServer(pool, api_key=args.api_key, port=args.port, name="local-model")
    try:
        stats = server.serve_until_signalled(
            f"heldout serve-model: {pool.model_id} ({first.model_file.path.name}, {args.slots} slot(s) of "
            f"{args.threads} thread(s), context {args.ctx}) listening on {{url}}")
    except OSError as exc:
        raise HeldoutError(f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}") from None
    per_slot = ", ".join(str(n) for n in pool.answered)
    print(f"served {stats.ok} of {stats.calls} calls (per slot: {per_slot})", file=sys.stderr, flush=True)
    return 0


def demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--real-model", action="store_true",
                   help="seed vs reflective on two prompt tasks with a real local model (the [local-model] extra)")
    p.add_argument("--run-dir", default=None,
                   help="study folder (default runs/demo, runs/demo-real-model with --real-model)")
    p.add_argument("--out", default=None,
                   help="report folder (default runs/demo-report, runs/demo-real-model-report with --real-model)")
    p.add_argument("--jobs", type=number(int, 1, "--jobs"), default=2, help="sessions in parallel (the real-model demo runs one)")
    p.add_argument("--protocol", action="store_true",
                   help="the generalisation-first protocol (reflective and gepa, 3 seeds) on mmlu_pro/business "
                        "[cpu-demo] with a real local model as worker and architect (the [local-model] extra)")
    p.add_argument("--base-url", default=None,
                   help="with --protocol: this OpenAI-compatible endpoint instead of the bundled model")
    p.add_argument("--worker-model", default=None, help="with --base-url: the model id to ask for")
    add_data_dir(p, "dataset mirror for --real-model and --protocol (default $HELDOUT_DATA_DIR)")
    add_local_model_arguments(p)


def cmd_demo(args: argparse.Namespace) -> int:
    from heldout.models.server import ChatServer
    from heldout.protocols.run import LocalExecutor, StudyConfig, build_cells, open_study, run_study
    from heldout.protocols.study import parse_methods
    from heldout.reports import build_report, write_report
    started = time.monotonic()
    hint = command_line(args)
    if args.protocol:
        return _demo_protocol(args, started, hint)
    if args.base_url or args.worker_model:
        raise HeldoutError("--base-url and --worker-model go with --protocol")
    run_dir = check_folder(args.run_dir or ("runs/demo-real-model" if args.real_model else "runs/demo"), "--run-dir")
    out = check_folder(args.out or ("runs/demo-real-model-report" if args.real_model else "runs/demo-report"), "--out")
    if args.real_model:
        backend = local_backend(args, REAL_MODEL_DEMO_ARCHITECT_TOKENS)
        cells = build_cells(list(REAL_MODEL_DEMO_TASKS), parse_methods(REAL_MODEL_DEMO_METHODS, []),
                            list(REAL_MODEL_DEMO_SEEDS), dict(REAL_MODEL_DEMO_TASKS), REAL_MODEL_DEMO_PROFILE,
                            {"max_tokens": REAL_MODEL_DEMO_ANSWER_TOKENS})
        with ChatServer(backend, name="local-model") as server:
            # One model answers one request at a time: two in flight keep it busy without queueing
            # requests into client timeouts. Identical requests (the seed arm's test answers in every
            # seed) are answered once, through the response cache.
            config = StudyConfig(run_root=run_dir, data_dir=args.data_dir, worker_model=backend.model_id,
                                 architect_model=backend.model_id, base_url=server.base_url,
                                 cache_dir=str(Path(run_dir) / "response-cache"), model_concurrency=2)
            open_study(cells, config, resume=None)  # the demo's settings never change: re-running continues it
            results = run_study(cells, config, LocalExecutor(1), resume_hint=hint)
        served = server.stats
        print(f"{backend.model_id} answered {served.ok} requests ({served.prompt_tokens} prompt + "
              f"{served.completion_tokens} completion tokens); the rest came from the response cache")
    else:
        cells = build_cells(list(DEMO_TASKS), parse_methods(DEMO_METHODS, []), list(DEMO_SEEDS),
                            dict(DEMO_TASKS), "default", {})
        config = StudyConfig(run_root=run_dir)
        open_study(cells, config, resume=None)
        results = run_study(cells, config, LocalExecutor(args.jobs), resume_hint=hint)
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


def _demo_protocol(args: argparse.Namespace, started: float, hint: str) -> int:
    """`heldout demo --protocol`: one generalisation protocol per optimizer under RUN_DIR/<optimizer>,
    the bundled model in-process (PROTOCOL_DEMO_SLOTS copies) unless --base-url names an endpoint."""
    from heldout.protocols.generalisation import (GeneralisationInterrupted, GeneralisationSpec, plan_generalisation,
                                                  run_generalisation)
    from heldout.models.backends.pool import SlotPool
    from heldout.models.server import ChatServer
    from heldout.protocols.run import StudyConfig
    from heldout.protocols.study import parse_methods
    from heldout.reports.generalisation import write_generalisation_report
    if args.real_model:
        raise HeldoutError("--protocol and --real-model are two demos; choose one")
    if bool(args.base_url) != bool(args.worker_model):
        raise HeldoutError("--base-url and --worker-model go together")
    root = Path(check_folder(args.run_dir or "runs/demo-protocol", "--run-dir"))
    plans = []
    for name in PROTOCOL_DEMO_OPTIMIZERS:
        (method,) = parse_methods([name], [])
        spec = GeneralisationSpec(task=PROTOCOL_DEMO_TASK, profile=PROTOCOL_DEMO_PROFILE, optimizer=method,
                                  seeds=PROTOCOL_DEMO_SEEDS, budget=PROTOCOL_DEMO_BUDGET,
                                  options={"max_tokens": REAL_MODEL_DEMO_ANSWER_TOKENS})
        plans.append(plan_generalisation(spec, data_dir=args.data_dir))
    with contextlib.ExitStack() as stack:
        if args.base_url:
            base_url, model_id, described = args.base_url, args.worker_model, f"{args.worker_model} at {args.base_url}"
        else:
            pool = SlotPool([local_backend(args, REAL_MODEL_DEMO_ARCHITECT_TOKENS) for _ in range(PROTOCOL_DEMO_SLOTS)])
            server = stack.enter_context(ChatServer(pool, name="local-model"))
            base_url, model_id = server.base_url, pool.model_id
            described = (f"{pool.model_id} ({pool.copies[0].model_file.path.name}) run by llama.cpp on the CPU, "
                         f"{PROTOCOL_DEMO_SLOTS} copies of {args.threads} thread(s)")
        for plan in plans:
            name = plan.spec.optimizer.name
            config = StudyConfig(run_root=str(root / name), data_dir=args.data_dir, worker_model=model_id,
                                 architect_model=model_id, base_url=base_url,
                                 cache_dir=str(root / "response-cache"), model_concurrency=PROTOCOL_DEMO_SLOTS)
            try:
                result = run_generalisation(plan, root / name, config, progress=args.verbosity >= 0,
                                            resume_hint=hint)
            except GeneralisationInterrupted as exc:
                print(f"heldout: {exc}", file=sys.stderr)
                return 130
            written = write_generalisation_report(result, root / name)
            seed_test = [g.seed_test for g in result.comparison.per_seed]
            print(f"{name}: {result.reading[-1].text}")
            print(f"  report: {written['md']}  (html: {written['html']})")
            print(f"  what a model this small can show: the seed prompt scores {min(seed_test):.3f}-"
                  f"{max(seed_test):.3f} on the {plan.sizes.get('test', 0)} held-out questions (chance with 10 "
                  f"options: 0.100); {plan.detectable()[0]}. It shows the protocol end to end (split proof, seeds, "
                  f"ablation, autopsy, ledgers), not whether {name} generalises on a model that can answer.")
    print(f"worker and architect: {described}; demo took {time.monotonic() - started:.0f} s")
    return 0


# -- completion ----------------------------------------------------------------------------------
COMPLETION_SHELLS = ("bash", "zsh", "fish")


def completion_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=COMPLETION_SHELLS, help="e.g. `eval \"$(heldout completion bash)\"` in ~/.bashrc")


def cmd_completion(args: argparse.Namespace) -> int:
    try:
        import argcomplete
    except ImportError:  # the optional extra heldout[completion]
        raise HeldoutError("shell completion needs argcomplete: pip install 'heldout[completion]'") from None
    print(argcomplete.shellcode(["heldout"], shell=args.shell))
    return 0


# -- the parser: one entry per command -----------------------------------------------------------
@dataclass(frozen=True)
class Command:
    """One sub-command: the words that name it (``("ledger", "verify")``; a first word shared by
    several commands is a group, whose help is in :data:`GROUPS`), its help line, the function that
    adds its arguments and the one that runs it. A new command is a new entry here and nothing else.
    ``writes`` names the options (by dest) that name folders the command creates or writes into:
    :func:`main` checks each given one (:func:`check_folder`) before the command runs, so a folder
    that cannot be made is one line and exit 2 with nothing written, for every command alike."""

    words: tuple[str, ...]
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    writes: tuple[str, ...] = ()


GROUPS = {
    "tasks": "list the registered tasks",
    "data": "verify or freeze data manifests",
    "ledger": "check and sign ledgers",
    "key": "the signing key that makes runs verifiable by anyone with its public key",
    "runs": "the results store: SQL over verified runs, Parquet exports",
    "export": "sessions in other tools' formats",
    "split": "build and prove topic-disjoint split profiles",
    "leak": "answer keys in candidates; the topic-shared leakage ablation",
    "compare": "protocols that compare one optimizer under several conditions",
    "protocol": "whole evaluation protocols as one command and one report",
    "vliw": "the VLIW kernel simulator",
}

# in the order `heldout --help` lists them
COMMANDS = (
    Command(("completion",), "print a shell completion script (needs argcomplete: heldout[completion])",
            completion_arguments, cmd_completion),
    Command(("tasks", "list"), "every task with kind, metric, split profiles and sizes",
            data.tasks_list_arguments, data.cmd_tasks_list),
    Command(("data", "verify"), "check manifests against the data", data.data_verify_arguments, data.cmd_data_verify),
    Command(("data", "freeze"), "build a manifest (hashes + a profile) for data you hold",
            data.data_freeze_arguments, data.cmd_data_freeze, writes=("out",)),
    Command(("eval",), "evaluate one candidate on a task split (outside any session)", evaluate.eval_arguments, evaluate.cmd_eval),
    Command(("score",), "score a JSONL of {id, output} rows with a prompt task's canonical verifier",
            evaluate.score_arguments, evaluate.cmd_score),
    Command(("ledger", "verify"), "authentic (by whom), tampered, unsigned or signed by an untrusted key: "
            "exit 0/1/3/4", ledger.ledger_verify_arguments, ledger.cmd_ledger_verify),
    Command(("ledger", "sign"), "sign runs written before signatures (verified by this machine's ledger key)",
            ledger.ledger_sign_arguments, ledger.cmd_ledger_sign),
    Command(("key", "show"), "this user's public signing key, as a trusted-signers line", ledger.key_show_arguments,
            ledger.cmd_key_show),
    Command(("key", "generate"), "a new signing key in a file (for a CI secret)", ledger.key_generate_arguments,
            ledger.cmd_key_generate, writes=()),
    Command(("bundle",), "one archive a reviewer needs: records, ledgers, manifests, report, environment, "
            "public keys; nothing secret", results.bundle_arguments, results.cmd_bundle),
    Command(("run",), "run optimizers on tasks in protected sessions", run_arguments, cmd_run,
            writes=("run_dir", "cache_dir")),
    Command(("runs", "query"), f"DuckDB SQL over the tables {', '.join(results.TABLES)} (see heldout/reports/store.py)",
            results.runs_query_arguments, results.cmd_runs_query),
    Command(("runs", "export"), "write one Parquet file per table", results.runs_export_arguments, results.cmd_runs_export,
            writes=("parquet",)),
    Command(("export", "inspect"),
            "Inspect eval logs (held-out scoring, optionally optimisation) for `inspect view`",
            results.export_inspect_arguments, results.cmd_export_inspect, writes=("out",)),
    Command(("demo",), "run the small study of the README and write its report", demo_arguments, cmd_demo,
            writes=("run_dir", "out")),
    Command(("serve-model",), "an OpenAI-compatible endpoint on 127.0.0.1 for a local GGUF model",
            serve_model_arguments, cmd_serve_model),
    Command(("report",), "tables, figures, report.md/.html and results.json from run dirs",
            results.report_arguments, results.cmd_report, writes=("out",)),
    Command(("verify",), "re-derive every number of a study (or a copy) from its ledgers: exit 0 verified, "
            "1 a number differs, 3 unsigned, 4 untrusted signer, 5 tampered, 2 unusable", results.verify_arguments, results.cmd_verify),
    Command(("check",), "CI regression gate: exit 0 pass, 1 regression, 2 inconclusive or invalid input",
            results.check_arguments, results.cmd_check),
    Command(("plan",), "what a K-seed study can detect under the gate's own test and margin",
            results.plan_arguments, results.cmd_plan),
    Command(("split", "build"), "whole groups to test, then val, then train (+ a shared-topic probe pool)",
            data.split_build_arguments, data.cmd_split_build, writes=("out",)),
    Command(("split", "check"), "prove zero group overlap (exit 1 otherwise) and scan for near-duplicates",
            data.split_check_arguments, data.cmd_split_check),
    Command(("leak", "scan"), "training questions/answers found in a candidate's text",
            leak_scan_arguments, cmd_leak_scan),
    Command(("leak", "ablate"), "score seed and final candidates on test / exact train / shared-topic probe",
            leak_ablate_arguments, cmd_leak_ablate, writes=("cache_dir",)),
    Command(("compare", "verifiers"), "optimise under each verifier variant, re-score with the canonical one",
            compare_verifiers_arguments, cmd_compare_verifiers, writes=("run_dir", "cache_dir")),
    Command(("compare", "arms"), "serial vs best-of-N fork vs merge-of-N at an equal budget",
            compare_arms_arguments, cmd_compare_arms, writes=("run_dir", "cache_dir")),
    Command(("protocol", "generalisation"), "split proof, multi-seed study, held-out comparison, topic-shared "
            "ablation, verifier ablation and prompt autopsy, in one report",
            protocol_generalisation_arguments, cmd_protocol_generalisation, writes=("run_dir", "cache_dir")),
    Command(("vliw", "simulate"), "run conformance cases; one JSON line per case",
            vliw_simulate_arguments, cmd_vliw_simulate),
)


def build_parser(only: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The global options, then one sub-parser per :data:`COMMANDS` entry (grouped by first word).

    Every command is listed with its help line; its arguments are added for every command when
    ``only`` is None (tests, docs, shell completion), else only for the command whose words ``only``
    starts with (main passes the leading words of argv): some commands' choices import modules."""
    parser = HeldoutParser(prog="heldout", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"heldout {__version__}")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="run untrusted candidates without a sandbox when bubblewrap is unavailable "
                             "(recorded as isolation 'none'); never for code you did not write")
    talk = parser.add_mutually_exclusive_group()
    talk.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1, default=0,
                      help="no progress lines or notes on stderr (warnings and errors still print)")
    talk.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1,
                      help="more on stderr: the resolved study before a run, a traceback with an error")
    sub = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for command in COMMANDS:
        *group, name = command.words
        where = sub
        if group:
            (word,) = group
            if word not in groups:
                groups[word] = sub.add_parser(word, help=GROUPS[word]).add_subparsers(dest="action", required=True)
            where = groups[word]
        p = where.add_parser(name, help=command.help)
        if only is None or tuple(only[:len(command.words)]) == command.words:
            command.add_arguments(p)
        p.set_defaults(func=command.run, writes=command.writes)
    return parser


def _command_words(argv: Sequence[str]) -> tuple[str, ...]:
    """The words that may name the invoked command: argv's first two arguments after the global
    options (none of which takes a value), e.g. ``("ledger", "verify")`` or ``("run", "study.toml")``."""
    words: list[str] = []
    for arg in argv:
        if arg == "--" or len(words) == 2 or (words and arg.startswith("-")):
            break
        if not arg.startswith("-"):
            words.append(arg)
    return tuple(words)


@contextlib.contextmanager
def _working_directory_off_the_path():
    """The command runs with the working directory off ``sys.path`` (``PYTHONPATH=.`` or ``""``
    put it there): the modules the harness imports lazily (a library's ``typing_extensions``,
    ``sniffio``, ``gepa``) must never come from the user's folder. User code is found there by
    path (:func:`heldout.optimizers.user_modules.search_path`), never imported from it."""
    saved = list(sys.path)
    cwd = os.path.realpath(os.getcwd())
    sys.path[:] = [entry for entry in saved if entry != "" and os.path.realpath(entry) != cwd]
    try:
        yield
    finally:
        sys.path[:] = saved


def main(argv: Sequence[str] | None = None) -> int:
    with _working_directory_off_the_path():
        return _main(argv)


def _main(argv: Sequence[str] | None = None) -> int:
    given = list(argv) if argv is not None else sys.argv[1:]
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions, which need every command's arguments
        parser = build_parser()
        try:
            import argcomplete
        except ImportError:  # the optional extra heldout[completion]: parse as if no shell asked
            pass
        else:
            argcomplete.autocomplete(parser)  # answers the shell's completion request and exits
    else:
        parser = build_parser(_command_words(given))
    args = parser.parse_args(argv)
    args.argv = given
    if args.unsafe_no_sandbox:
        from heldout.sandbox import allow_unsafe_no_sandbox
        allow_unsafe_no_sandbox()
    try:
        for dest in args.writes:
            if getattr(args, dest, None) is not None:
                check_folder(getattr(args, dest), f"--{dest.replace('_', '-')}")
        return int(args.func(args) or 0)
    except HeldoutError as exc:
        if args.verbosity > 0:
            import traceback  # only here: 3 ms of every start otherwise
            traceback.print_exc(file=sys.stderr)
        print(f"heldout: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a full disk outside the ledger (a run record, a study file): one line too
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            if not exc.filename:
                raise
            # a path the checks before the command could not foresee (it changed meanwhile, or a
            # pseudo file system): still one line, never a traceback (-v prints it)
            if args.verbosity > 0:
                import traceback
                traceback.print_exc(file=sys.stderr)
            print(f"heldout: error: cannot use {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        where = f" (writing {exc.filename})" if exc.filename else ""
        print(f"heldout: error: no space left on device{where}: free space, then rerun the same command (with "
              "--resume once the study has started)", file=sys.stderr)
        return 2

