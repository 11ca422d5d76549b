"""The command table: one :class:`Command` per sub-command, naming the group module that holds its
argument wiring and its body (``study.run_arguments`` and ``study.cmd_run`` for ``heldout run``),
and :func:`build_parser`, a loop over the table."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Sequence

from heldout import __version__
from heldout.cli import completion, data, demo, evaluate, leak, ledger, model_server, results, study, vliw
from heldout.cli.shared import HeldoutParser

DESCRIPTION = "The ``heldout`` command: a thin layer over the API."


@dataclass(frozen=True)
class Command:
    """One sub-command: the words that name it (``("ledger", "verify")``; a first word shared by
    several commands is a group, whose help is in :data:`GROUPS`), its help line, the function that
    adds its arguments and the one that runs it. A new command is a new entry here and nothing else.
    ``writes`` names the options (by dest) that name folders the command creates or writes into:
    :func:`heldout.cli.dispatch.run_command_line` checks each given one (:func:`check_folder`) before the command
    runs, so a folder that cannot be made is one line and exit 2 with nothing written, for every command alike."""

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
            completion.completion_arguments, completion.cmd_completion),
    Command(("tasks", "list"), "every task with kind, metric, split profiles and sizes",
            data.tasks_list_arguments, data.cmd_tasks_list),
    Command(("data", "verify"), "check manifests against the data",
            data.data_verify_arguments, data.cmd_data_verify),
    Command(("data", "freeze"), "build a manifest (hashes + a profile) for data you hold",
            data.data_freeze_arguments, data.cmd_data_freeze, writes=("out",)),
    Command(("eval",), "evaluate one candidate on a task split (outside any session)",
            evaluate.eval_arguments, evaluate.cmd_eval),
    Command(("score",), "score a JSONL of {id, output} rows with a prompt task's canonical verifier",
            evaluate.score_arguments, evaluate.cmd_score),
    Command(("ledger", "verify"), "authentic (by whom), tampered, unsigned or signed by an untrusted key: "
            "exit 0/1/3/4", ledger.ledger_verify_arguments, ledger.cmd_ledger_verify),
    Command(("ledger", "sign"), "sign runs written before signatures (verified by this machine's ledger key)",
            ledger.ledger_sign_arguments, ledger.cmd_ledger_sign),
    Command(("key", "show"), "this user's public signing key, as a trusted-signers line",
            ledger.key_show_arguments, ledger.cmd_key_show),
    Command(("key", "generate"), "a new signing key in a file (for a CI secret)",
            ledger.key_generate_arguments, ledger.cmd_key_generate, writes=()),
    Command(("bundle",), "one archive a reviewer needs: records, ledgers, manifests, report, environment, "
            "public keys; nothing secret", results.bundle_arguments, results.cmd_bundle),
    Command(("run",), "run optimizers on tasks in protected sessions", study.run_arguments, study.cmd_run,
            writes=("run_dir", "cache_dir")),
    Command(("runs", "query"),
            f"DuckDB SQL over the tables {', '.join(results.TABLES)} (see heldout/reports/store.py)",
            results.runs_query_arguments, results.cmd_runs_query),
    Command(("runs", "export"), "write one Parquet file per table",
            results.runs_export_arguments, results.cmd_runs_export, writes=("parquet",)),
    Command(("export", "inspect"),
            "Inspect eval logs (held-out scoring, optionally optimisation) for `inspect view`",
            results.export_inspect_arguments, results.cmd_export_inspect, writes=("out",)),
    Command(("demo",), "run the small study of the README and write its report",
            demo.demo_arguments, demo.cmd_demo, writes=("run_dir", "out")),
    Command(("serve-model",), "an OpenAI-compatible endpoint on 127.0.0.1 for a local GGUF model",
            model_server.serve_model_arguments, model_server.cmd_serve_model),
    Command(("report",), "tables, figures, report.md/.html and results.json from run dirs",
            results.report_arguments, results.cmd_report, writes=("out",)),
    Command(("verify",), "re-derive every number of a study (or a copy) from its ledgers: exit 0 verified, "
            "1 a number differs, 3 unsigned, 4 untrusted signer, 5 tampered, 2 unusable",
            results.verify_arguments, results.cmd_verify),
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
            study.protocol_generalisation_arguments, study.cmd_protocol_generalisation,
            writes=("run_dir", "cache_dir")),
    Command(("vliw", "simulate"), "run conformance cases; one JSON line per case",
            vliw.vliw_simulate_arguments, vliw.cmd_vliw_simulate),
)


def build_parser(only: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The global options, then one sub-parser per :data:`COMMANDS` entry (grouped by first word).

    Every command is listed with its help line; its arguments are added for every command when
    ``only`` is None (tests, docs, shell completion), else only for the command whose words ``only``
    starts with (main passes the leading words of argv): some commands' choices import modules."""
    parser = HeldoutParser(prog="heldout", description=DESCRIPTION)
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


def command_words(argv: Sequence[str]) -> tuple[str, ...]:
    """The words that may name the invoked command: argv's first two arguments after the global
    options (none of which takes a value), e.g. ``("ledger", "verify")`` or ``("run", "study.toml")``."""
    words: list[str] = []
    for arg in argv:
        if arg == "--" or len(words) == 2 or (words and arg.startswith("-")):
            break
        if not arg.startswith("-"):
            words.append(arg)
    return tuple(words)
