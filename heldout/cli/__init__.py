# PYTHON_ARGCOMPLETE_OK  (tab completion: `heldout completion bash`)
"""The ``heldout`` command: a thin layer over the API.

Each sub-command is a function ``cmd_<name>(args) -> int`` with its argument wiring
``<name>_arguments(parser)`` beside it, both named once in :data:`COMMANDS`.
Errors heldout raises on purpose are printed as one clear line (exit 2)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from heldout import __version__
from heldout.cli import data
from heldout.cli import evaluate
from heldout.cli import ledger
from heldout.cli import results
from heldout.cli import study
from heldout.cli import leak
from heldout.cli.shared import (HeldoutParser, add_data_dir, add_local_model_arguments, command_line, local_backend,
                                number, print_json)
from heldout.contracts import HeldoutError
from heldout.files import check_folder

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


# -- runs (the results store) --------------------------------------------------------------------


# -- export ------------------------------------------------------------------------------------


# -- verify --------------------------------------------------------------------------------------


# -- report / check ------------------------------------------------------------------------------


# -- split / leak --------------------------------------------------------------------------------


# -- compare -------------------------------------------------------------------------------------


# -- protocol ------------------------------------------------------------------------------------


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
    Command(("run",), "run optimizers on tasks in protected sessions", study.run_arguments, study.cmd_run,
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
            leak.leak_scan_arguments, leak.cmd_leak_scan),
    Command(("leak", "ablate"), "score seed and final candidates on test / exact train / shared-topic probe",
            leak.leak_ablate_arguments, leak.cmd_leak_ablate, writes=("cache_dir",)),
    Command(("compare", "verifiers"), "optimise under each verifier variant, re-score with the canonical one",
            study.compare_verifiers_arguments, study.cmd_compare_verifiers, writes=("run_dir", "cache_dir")),
    Command(("compare", "arms"), "serial vs best-of-N fork vs merge-of-N at an equal budget",
            study.compare_arms_arguments, study.cmd_compare_arms, writes=("run_dir", "cache_dir")),
    Command(("protocol", "generalisation"), "split proof, multi-seed study, held-out comparison, topic-shared "
            "ablation, verifier ablation and prompt autopsy, in one report",
            study.protocol_generalisation_arguments, study.cmd_protocol_generalisation, writes=("run_dir", "cache_dir")),
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

