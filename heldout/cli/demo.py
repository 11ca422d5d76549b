"""``heldout demo``: the README's small study and its report (no model, no network), the same with
a real local model (``--real-model``), or the generalisation-first protocol (``--protocol``)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from heldout.cli.shared import add_data_dir, add_local_model_arguments, command_line, local_backend, number
from heldout.contracts import HeldoutError
from heldout.files import check_folder

# Start-up time: the command imports its modules when it runs, so the parser loads none of them
# (heldout/cli/__init__.py).

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
    from heldout.protocols.run import LocalExecutor, StudyConfig, build_cells, run_study
    from heldout.protocols.study_dir import open_study
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
    if any(r["status"] in ("interrupted", "not started") for r in results):
        return 130  # stopped (the summary said how to continue): no report of the cells that happened to finish
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
