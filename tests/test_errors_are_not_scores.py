"""Errors are not scores: a failure of the infrastructure (a model endpoint that dies, answers 5xx or
stalls past the client's timeout, a wrong port, no sandbox) is never a candidate's 0.

The rule is one table (``contracts.INFRASTRUCTURE_ERROR_KINDS``). Fault injections run a real study
in-process against a real loopback endpoint (worker and architect) and break the endpoint mid-way,
during optimisation and during held-out scoring: the cell ends ``incomplete`` with no record, its
ledger verifies and names the failure, reports and the gate refuse to hide it, and ``--resume``
against a working endpoint ends with the same record as an uninterrupted run."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from heldout.contracts import INFRASTRUCTURE_ERROR_KINDS, Verdict, is_infrastructure_failure
from heldout.evaluators.ledger import LEDGER_FILE, Ledger, verify_ledger
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.models import BatchError, ModelError, model_failure_kind
from heldout.models.server import FaultPlan
from heldout.models.testserver import TestServer
from heldout.protocols.arms import ArmsError, check_headroom, run_arms
from heldout.protocols.arms_plan import ArmsSpec, Headroom
from heldout.protocols.run import Cell, Method, StudyConfig, run_study
from heldout.protocols.verifier_ablation import AblationError, plan_ablation, run_ablation
from heldout.protocols.study_dir import open_study
from heldout.reports.check import GateInputError, check_runs
from heldout.reports.render import build_report
from warm_cli import WarmCli

REPO = Path(__file__).resolve().parents[1]
TASK, PROFILE = "bbh/boolean_expressions", "cpu-demo"  # 16 train, 24 test: a small real prompt task
CELL = Cell(TASK, Method("reflective"), 0, 24, PROFILE)


# -- the rule --------------------------------------------------------------------------------------
CANDIDATE_KINDS = ["timeout", "memory", "crash", "bad_output", "forbidden", "output_too_large", "malformed_candidate",
                   "no_output", "wrong_values", "invalid", "model_refused", "judge_error", "some_plugin_kind"]


@pytest.mark.parametrize("kind", sorted(INFRASTRUCTURE_ERROR_KINDS))
def test_an_infrastructure_kind_is_never_a_score(kind):
    assert is_infrastructure_failure(Verdict.failure("q1", "endpoint gone", kind))


@pytest.mark.parametrize("kind", CANDIDATE_KINDS)
def test_a_candidate_kind_scores_zero(kind):
    assert not is_infrastructure_failure(Verdict.failure("q1", "the program failed", kind))


def test_a_valid_verdict_is_never_a_failure():
    assert not is_infrastructure_failure(Verdict("q1", 0.0, valid=True, error_kind="model_error"))


@pytest.mark.parametrize("error, kind", [
    (ModelError("refused", kind="connection"), "model_error"),
    (ModelError("slow", kind="timeout"), "model_error"),
    (ModelError("busy", kind="http_status", status=503), "model_error"),
    (ModelError("throttled", kind="http_status", status=429), "model_error"),
    (ModelError("no such model", kind="http_status", status=404), "model_error"),
    (ModelError("bad key", kind="http_status", status=401), "model_error"),
    (ModelError("garbage", kind="bad_response"), "model_error"),
    (ModelError("no endpoint", kind="config"), "model_error"),
    (ModelError("prompt longer than the context", kind="http_status", status=400), "model_refused"),
    (ModelError("body too large", kind="http_status", status=413), "model_refused"),
    (RuntimeError("a bug of the harness"), "evaluator_error"),
    # one request sent through a batch call (a task's worker.complete): whose failures they were
    (BatchError([ModelError("too long", kind="http_status", status=413)]), "model_refused"),
    (BatchError([ModelError("too long", kind="http_status", status=400),
                 ModelError("refused", kind="connection")]), "model_error"),
])
def test_who_failed_a_worker_call(error, kind):
    assert model_failure_kind(error) == kind


# -- fault injection ---------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def real_data(data_dir):
    """The task's real data (skipped with the reason where it is absent), for the CLI children too."""
    previous = os.environ.get("HELDOUT_DATA_DIR")
    os.environ["HELDOUT_DATA_DIR"] = str(data_dir)
    yield data_dir
    if previous is None:
        os.environ.pop("HELDOUT_DATA_DIR")
    else:
        os.environ["HELDOUT_DATA_DIR"] = previous


def config(root: Path, server: "TestServer | ServerProcess", **extra) -> StudyConfig:
    return StudyConfig(run_root=str(root), worker_model="loopback", architect_model="loopback",
                       base_url=server.base_url, model_retries=1, data_dir=os.environ["HELDOUT_DATA_DIR"], **extra)


def study(root: Path, server: "TestServer | ServerProcess", resume: bool = False, **extra) -> dict:
    conf = config(root, server, **extra)
    open_study([CELL], conf, resume=resume)
    (summary,) = run_study([CELL], conf, progress=False)
    return summary


class FaultsAfter:
    """A fault plan that lets the next ``through`` requests pass, then gives every later one
    ``faults``' fault. It counts where the server decides each request's fault, so the break
    falls on that request however the threads are scheduled (a thread that watched the server's
    count and swapped the plan in could fall behind while the requests raced on, on a loaded
    machine past the end of the phase it was meant to break)."""

    def __init__(self, through: int, faults: FaultPlan) -> None:
        self.faults, self.left = faults, through
        self._lock = threading.Lock()

    def decide(self, raw: bytes) -> str | None:
        with self._lock:
            self.left -= 1
            passes = self.left >= 0
        return None if passes else self.faults.decide(raw)

    def __getattr__(self, name: str):  # stall_seconds, retry_after: the plan's
        return getattr(self.faults, name)


def break_after(server: TestServer, calls: int, faults: FaultPlan) -> None:
    """Once the endpoint has answered ``calls`` requests, it fails every later one with ``faults``."""
    server.faults = FaultsAfter(calls - server.stats.calls, faults)


DIES_AT = """
import os, signal, sys, threading
from heldout.models.testserver import TestServer


class DiesAt:
    # a fault plan that lets the first requests through and kills the whole process at the next
    def __init__(self, through):
        self.left, self.lock = through, threading.Lock()

    def decide(self, raw):
        with self.lock:
            self.left -= 1
            if self.left < 0:
                os.kill(os.getpid(), signal.SIGKILL)
        return None


server = TestServer(latency=float(sys.argv[1]))
server.faults = DiesAt(int(sys.argv[2]))
server.serve_until_signalled("heldout test server listening on {url}")
"""


class ServerProcess:
    """The loopback endpoint in a process of its own, so that it can die as a real one does: every
    connection reset at once, the port refusing from then on. It kills itself when request
    ``dies_after`` + 1 arrives: at that request however the threads are scheduled (a thread that
    watched the ledger and killed it could fall behind while the requests raced on)."""

    def __init__(self, latency: float, dies_after: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", DIES_AT, str(latency), str(dies_after)],
                                     env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        banner = self.proc.stdout.readline()
        self.base_url = banner.split()[-1]
        assert self.base_url.startswith("http://127.0.0.1:"), banner

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted study, and how many endpoint calls its optimisation made."""
    root = tmp_path_factory.mktemp("reference")
    with TestServer() as server:
        assert study(root, server)["status"] == "ok"
        record = RunRecord.load(CELL.run_dir(root))
        optimisation = server.stats.calls - len(record.test_verdicts) - 1  # less held-out and the start check
    return record, optimisation


def outcome(record: RunRecord) -> dict:
    return {"final": record.final_candidate, "test": record.test_score,
            "verdicts": [(v["example_id"], v["score"], v["output"]) for v in record.test_verdicts],
            "metric_calls": record.usage["metric_calls"]}


FAULTS = {
    "answers 5xx": FaultPlan(error_rate=1.0),
    "stalls past the client timeout": FaultPlan(stall_rate=1.0, stall_seconds=3.0),
}


def run_until_the_endpoint_fails(root: Path, fault: str, phase: str, optimisation: int) -> dict:
    # the request the endpoint fails from: half-way through the optimisation, or the sixth held-out one
    at = optimisation // 2 if phase == "optimisation" else optimisation + 1 + 5
    if fault == "dies":  # killed: every connection reset, the port refusing
        with ServerProcess(latency=0.05, dies_after=at) as server:
            summary = study(root, server, model_timeout=1.0)
            assert server.proc.wait(timeout=10) == -signal.SIGKILL  # it died at that request
        return summary
    with TestServer() as server:
        break_after(server, at, FAULTS[fault])
        return study(root, server, model_timeout=1.0)


@pytest.mark.parametrize("phase", ["optimisation", "held-out scoring"])
@pytest.mark.parametrize("fault", ["dies", *sorted(FAULTS)])
def test_a_failing_endpoint_leaves_the_cell_incomplete_and_resume_equals_an_uninterrupted_run(
        tmp_path, reference, phase, fault):
    record, optimisation = reference
    summary = run_until_the_endpoint_fails(tmp_path, fault, phase, optimisation)
    run_dir = CELL.run_dir(tmp_path)
    assert summary["status"] == "incomplete", summary
    assert not (run_dir / RECORD_FILE).exists()
    assert verify_ledger(run_dir).ok
    entries = list(Ledger.open(run_dir).entries())
    kinds = Counter(e["kind"] for e in entries)
    assert kinds["session_incomplete"] == 1 and kinds["session_end"] == 0
    assert entries[-1]["data"]["phase"] == phase
    # no verdict in the ledger scores a failure of the infrastructure
    assert not [e for e in entries if e["kind"] in ("evaluation", "test_scoring", "val_scoring")
                and is_infrastructure_failure(Verdict.from_dict(e["data"]["verdict"]))]
    if phase == "optimisation":
        (failure,) = [e["data"] for e in entries if e["kind"] == "infrastructure_failure"]
        if failure.get("channel") != "architect":  # a failed evaluation: its metric calls are not spent
            assert failure["refunded"] == len(failure["examples"]) > 0
    else:
        assert "test:" in summary["error"] and "not scored" in summary["error"]
    with TestServer() as back:  # the endpoint is back, on another address
        assert study(tmp_path, back, resume=True)["status"] == "ok"
    assert verify_ledger(run_dir).ok
    assert outcome(RunRecord.load(run_dir)) == outcome(record)
    assert RunRecord.load(run_dir).experiment["infrastructure_failures_tolerated"] == 0  # the error budget, stated
    if phase == "held-out scoring":  # what was scored before the failure is kept, the rest scored once
        test_entries = [e for e in Ledger.open(run_dir).entries("test_scoring")]
        assert len(test_entries) == len(record.test_verdicts)


@pytest.fixture(scope="module")
def incomplete_study(tmp_path_factory):
    """Seed 0 of the method finished, seed 1 lost its endpoint during held-out scoring."""
    root = tmp_path_factory.mktemp("incomplete")
    cells = [CELL, Cell(TASK, Method("reflective"), 1, 24, PROFILE), Cell(TASK, Method("seed"), 0, 24, PROFILE),
             Cell(TASK, Method("seed"), 1, 24, PROFILE)]
    with TestServer() as server:
        conf = config(root, server)
        open_study(cells, conf)
        run_study(cells[:1] + cells[2:], conf, progress=False)
        calls = server.stats.calls
        break_after(server, calls + 20, FaultPlan(error_rate=1.0))
        (lost,) = run_study(cells[1:2], conf, progress=False)
    assert lost["status"] == "incomplete"
    return root


def test_a_report_over_an_incomplete_study_says_so_first_and_marks_the_row(incomplete_study):
    report = build_report([incomplete_study], n_boot=200)
    assert report.warnings[0].startswith("INCOMPLETE STUDY: 1 run(s) have no score")
    assert any("INCOMPLETE, no score" in w and "resume" in w for w in report.warnings)
    row = next(r for r in report.table("results").rows if r[0].text == TASK)
    reflective = report.table("results").columns.index("reflective")
    assert "‡ 1 seed(s) without a score" in row[reflective].text


def test_the_gate_refuses_an_incomplete_study_with_the_reason(incomplete_study):
    with pytest.raises(GateInputError, match="INCOMPLETE, no score: the infrastructure failed during held-out"):
        check_runs([incomplete_study], [incomplete_study], method="reflective")


# -- through the CLI ---------------------------------------------------------------------------------
def cli(warm: WarmCli, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real command in a process of its own (forked from the session's warm server: the
    sandbox's isolation is read when a command runs, not when heldout is imported)."""
    return warm.run(*args, cwd=REPO, env={**os.environ, **(env or {})}, timeout=120)


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses every connection while the block runs: bound, never listening
    (a port merely closed again could be taken by another process's server meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_a_mistyped_port_is_one_line_before_anything_is_written(warm_cli, tmp_path):
    run_dir = tmp_path / "study"
    with refused_port() as port:
        res = cli(warm_cli, "run", "--task", TASK, "--profile", PROFILE, "--optimizer", "seed", "--budget", "10",
                  "--worker-model", "m", "--base-url", f"http://127.0.0.1:{port}/v1", "--run-dir", str(run_dir))
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "does not answer" in res.stderr
    assert not run_dir.exists()


def test_no_sandbox_is_one_line_before_anything_is_written(warm_cli, tmp_path):
    run_dir = tmp_path / "study"
    res = cli(warm_cli, "run", "--task", "lockpicking/six", "--profile", "paper", "--optimizer", "seed", "--budget", "10", "--run-dir", str(run_dir),
              env={"HELDOUT_SANDBOX_ISOLATION": "none", "HELDOUT_UNSAFE_NO_SANDBOX": ""})
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "bubblewrap" in res.stderr
    assert not run_dir.exists()


def test_sigint_during_held_out_scoring_stops_promptly_with_the_resume_command(tmp_path):
    run_dir = tmp_path / "study"
    with TestServer(latency=15.0) as server:  # each held-out answer takes 15 s: the stop must not wait for them
        proc = subprocess.Popen(
            [sys.executable, "-m", "heldout.cli", "run", "--task", TASK, "--profile", PROFILE, "--optimizer", "seed",
             "--budget", "10", "--worker-model", "loopback", "--base-url", server.base_url, "--run-dir", str(run_dir)],
            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        give_up = time.monotonic() + 120
        while server.stats.calls < 3 and time.monotonic() < give_up:  # the start check, then held-out calls
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)  # well before any answer arrives
    assert proc.returncode == 130, err
    assert "resume with: heldout run" in err and "--resume" in err
    assert not (CELL.run_dir(run_dir).parent.parent / "seed" / "seed-0" / RECORD_FILE).exists()
    assert verify_ledger(next(p.parent for p in run_dir.rglob(LEDGER_FILE))).ok


def test_held_out_scoring_reports_its_progress_and_the_failures_it_retries(tmp_path, capsys):
    cell = Cell(TASK, Method("seed"), 0, 24, PROFILE)
    with TestServer() as server:
        conf = config(tmp_path, server)
        open_study([cell], conf)
        break_after(server, 2, FaultPlan(error_rate=1.0))  # the start check and one held-out answer
        (summary,) = run_study([cell], conf, progress=True)
    err = capsys.readouterr().err
    assert summary["status"] == "incomplete"
    # (which held-out answer is the one let through depends on the threads' order; retries add failures)
    assert re.search(r"held-out test 24/24 scored, [1-9]\d* infrastructure failure\(s\)", err), err
    assert "INCOMPLETE" in err and "resume with: the same command plus --resume" in err


def test_a_study_whose_endpoint_dies_starts_no_further_cell_and_resumes(tmp_path, capsys):
    """A cell lost the endpoint: one probe, and the cells after it are incomplete without starting
    (each would have retried the dead endpoint to the same end, minutes each in the field)."""
    cells = [Cell(TASK, Method("seed"), seed, 24, PROFILE) for seed in (0, 1, 2)]
    with TestServer() as server:
        conf = config(tmp_path, server)
        open_study(cells, conf)
        run_study(cells[:1], conf, progress=False)
        break_after(server, server.stats.calls, FaultPlan(error_rate=1.0))
        results = run_study(cells, conf, progress=True)
    assert [r["status"] for r in results] == ["ok", "incomplete", "incomplete"]
    assert "not started:" in results[2]["error"] and "does not answer" in results[2]["error"]
    assert server.base_url in results[2]["error"] and "no further cell was started" in results[2]["error"]
    assert (cells[1].run_dir(tmp_path) / LEDGER_FILE).exists() and not cells[2].run_dir(tmp_path).exists()
    assert "2 of 3 cell(s) INCOMPLETE" in capsys.readouterr().err
    with TestServer() as back:  # the endpoint is back, on another address: only what is missing runs
        again = run_study(cells, config(tmp_path, back), progress=False)
    assert [r["status"] for r in again] == ["ok", "ok", "ok"] and again[0]["skipped"]


def test_compare_arms_whose_endpoint_dies_compares_nothing_and_says_how_to_continue(tmp_path):
    """The endpoint dies in the first arm: the later arms do not start (each would lose a run's
    retries), no comparison is written (a broken one would blame the arms), the command says how
    to continue."""
    spec = ArmsSpec(TASK, "reflective", 48, 2, (0, 1, 2), profile=PROFILE)
    headroom = Headroom("train", 0.5, 1.0, spec.min_headroom)  # as measured before the endpoint died
    with TestServer() as server:
        break_after(server, 1, FaultPlan(error_rate=1.0))  # the probe before anything, then nothing
        lost = r"3 run\(s\) of arm serial incomplete .*infrastructure failed.*re-run the same command"
        with pytest.raises(ArmsError, match=lost):
            run_arms(spec, tmp_path, config(tmp_path, server), progress=False, headroom=headroom)
    assert not (tmp_path / "arms_result.json").exists() and len(list(tmp_path.rglob(LEDGER_FILE))) == 1


def test_a_verifier_ablation_whose_endpoint_dies_names_the_infrastructure_not_failed_sessions(tmp_path):
    """``compare verifiers`` said "N session(s) failed" of sessions its endpoint left incomplete:
    the leading word blamed the sessions for the infrastructure's failure."""
    plan = plan_ablation(TASK, Method(name="reflective"), ["decomposed"], [0], 16, profile=PROFILE,
                         data_dir=os.environ["HELDOUT_DATA_DIR"])
    with TestServer() as server:
        break_after(server, 1, FaultPlan(error_rate=1.0))  # the check before anything, then nothing
        with pytest.raises(AblationError) as refused:
            run_ablation(plan, config(tmp_path, server))
    said = str(refused.value)
    assert "incomplete, the infrastructure failed" in said and "re-run the same command" in said
    assert "session(s) failed" not in said


def test_the_arms_headroom_check_asks_a_failing_endpoint_as_often_as_the_study_allows(tmp_path):
    """compare arms measures the seed's headroom before its arms, with a client of its own that
    took the client's default six retries, not the study's ``model_retries``: 56 s of retries
    against an endpoint that failed after the probe, where the study's cells give up after one."""
    spec = ArmsSpec(TASK, "reflective", 48, 2, (0, 1, 2), profile=PROFILE)
    with TestServer() as server:
        server.faults = FaultPlan(error_rate=1.0)
        with pytest.raises(Exception, match="infrastructure|failed"):
            check_headroom(spec, config(tmp_path, server))
        examples = 16  # the profile's train split (it has no val)
        # an infrastructure failure is scored once more, each time with model_retries=1: 2 x 2 requests an
        # example (the client's default, 6 retries, made it 2 x 7)
        assert server.stats.calls <= 4 * examples, server.stats.calls
