"""Running studies: ``heldout run`` (tasks x methods x seeds, from flags or a STUDY.toml), the
comparisons ``heldout compare verifiers`` and ``compare arms``, and ``heldout protocol
generalisation`` (the whole generalisation-first protocol as one command and one report)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from heldout.cli.shared import (add_json, add_optimizer_by_name, add_profile, add_session_environment, command_line,
                                number, optimizer_trusted, print_json)
from heldout.contracts import HeldoutError
from heldout.files import check_folder

if TYPE_CHECKING:  # annotations only
    from heldout.protocols.run import StudyConfig
    from heldout.protocols.study import Study

# Start-up time: each command imports its modules when it runs, and an `_arguments` function the
# modules its choices come from, so the parser loads none of them (heldout/cli/__init__.py). The
# choice below copies a heavier module's constant; tests/test_extension.py checks it equals it.
FIXED_UNITS = ("metric_calls", "architect_calls", "tokens")  # heldout.protocols.arms_plan


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
    from heldout.protocols.preflight import check_infrastructure
    from heldout.protocols.run import run_study
    from heldout.protocols.study_dir import open_study
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
    from heldout.protocols.arms import ArmsInterrupted, open_arms, run_arms, validate_arms
    from heldout.protocols.arms_plan import ArmsSpec, describe_plan
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
    try:
        result = run_arms(spec, args.run_dir, config, LocalExecutor(args.jobs), resume_hint=command_line(args))
    except ArmsInterrupted as exc:  # stopped, not broken: the exit code of an interrupted `heldout run`
        print(f"heldout: {exc}", file=sys.stderr)
        return 130
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.text())
    return 1 if result.broken else 0


def protocol_config(args: argparse.Namespace) -> "StudyConfig":
    """The study settings of compare verifiers and protocol generalisation, from their flags."""
    from heldout.protocols.run import StudyConfig
    return StudyConfig(run_root=args.run_dir, data_dir=args.data_dir, allow_drift=args.allow_drift,
                       policy=args.policy, worker_model=args.worker_model, architect_model=args.architect_model,
                       base_url=args.base_url, cache_dir=args.cache_dir, trusted_optimizer=optimizer_trusted(args))


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
    p.add_argument("--placebo-draws", type=number(int, 1, "--placebo-draws"), default=None,
                   help="on a prompt task, neutral re-wordings of the seed scored per seed and variant, the noise "
                   "floor of each gaming-gap verdict (default: as many as the exact test needs at the seed count)")
    add_profile(p)
    p.add_argument("--policy", default="standard", choices=sorted(POLICIES), help="visibility policy")
    p.add_argument("--jobs", type=int, default=1, help="sessions in parallel (process pool)")
    add_session_environment(p)
    add_json(p)


def cmd_compare_verifiers(args: argparse.Namespace) -> int:
    from heldout.protocols.run import LocalExecutor
    from heldout.protocols.study import parse_methods, parse_seeds
    from heldout.protocols.verifier_ablation import AblationInterrupted, plan_ablation, run_ablation
    (method,) = parse_methods([args.optimizer], [])
    options = {"tolerance": args.tolerance} if args.tolerance is not None else {}
    plan = plan_ablation(args.task, method, args.variants.split(","), parse_seeds(args.seeds), args.budget,
                         profile=args.profile, options=options, data_dir=args.data_dir, allow_drift=args.allow_drift,
                         placebo_draws=args.placebo_draws or 0)
    if args.plan:
        print(plan.describe(args.run_dir))
        return 0
    config = protocol_config(args)
    try:
        result = run_ablation(plan, config, LocalExecutor(args.jobs), progress=True, resume_hint=command_line(args))
    except AblationInterrupted as exc:  # stopped, not failed: the exit code of an interrupted `heldout run`
        print(f"heldout: {exc}", file=sys.stderr)
        return 130
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.describe())
    return 0


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
                   help="neutral re-wordings of the seed scored per seed (and per seed and variant in the verifier "
                   "ablation), the noise floor of the verdicts against the seed (default: as many as the exact test "
                   "needs at the seed count: 3 seeds x 7, 5 x 3, 10 x 1)")
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
    from heldout.protocols.generalisation import GeneralisationSpec
    from heldout.protocols.generalisation_file import load_generalisation_file
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
    from heldout.protocols.run import LocalExecutor
    from heldout.reports.generalisation import write_generalisation_report
    spec = generalisation_from_args(args)
    if args.study:  # the file's run_dir (a --run-dir flag was checked with every command's folders)
        check_folder(args.run_dir, "run_dir")
    plan = plan_generalisation(spec, data_dir=args.data_dir, allow_drift=args.allow_drift)
    if args.plan:
        print(plan.describe(args.run_dir))
        return 0
    config = protocol_config(args)
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
