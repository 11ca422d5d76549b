"""Field conditions: every command that talks to a model endpoint, against an endpoint that is not
one: nothing listening on the port, a server that accepts and never answers, one that answers 503
to everything, and one that answers 200 with a login page.

In the lab the endpoint is up. In the field the server is not started yet, hangs under load, sits
behind a gateway that is down or that answers with its own page. Each command probes the endpoint
once (:func:`heldout.protocols.preflight.check_endpoint`) before it writes anything: one line
naming the URL and what went wrong, exit 2, within the probe's 30 s, nothing written. Before,
``leak ablate`` did not probe (every example's request retried with backoff for minutes, an
ablation session opened in the study's ledger), and the probe of ``run`` and ``eval`` waited 60 s
twice on a silent server (two minutes of silence)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import heldout
from heldout.data_manifests import MANIFEST_PATH_ENV
from heldout.contracts import InfrastructureFailure
from heldout.evaluators.ledger import Ledger, verify_ledger
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient
from heldout.models.server import FaultPlan
from heldout.models.testserver import TestServer
from heldout.protocols.folders import LEAK_ABLATION_DIR, LEAK_RESULT_FILE
from heldout.protocols.leakage import ablate
from heldout.protocols.splits import SplitSizes, build_split

import synthetic_code_words as synthetic
from socket_server import ScriptedSocketServer, read_request

TASK = "user/code_words_dead_endpoint"
PROFILE = "leak-probe"
#: the probe's 30 s, and the interpreter's start beside other tests' load; the old code took minutes
WITHIN = 60


class DeadEndpoint(ScriptedSocketServer):
    """Answers every request with ``answer``, or reads it and never answers (``answer`` None)."""

    def __init__(self, answer: bytes | None) -> None:
        self.answer = answer
        self.requests = 0
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            while read_request(reader) is not None:
                self.requests += 1
                if self.answer is None:
                    reader.read(1)  # until the client hangs up
                    return
                conn.sendall(self.answer)


def _http(status: bytes, body: bytes, kind: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (status, kind, len(body), body)


ENDPOINTS = {
    "nothing listening": None,
    "accepts and never answers": DeadEndpoint,
    "503 to everything": _http(b"503 Service Unavailable", b'{"error": "overloaded"}'),
    "200 with a login page": _http(b"200 OK", b"<html><body>Sign in</body></html>", b"text/html"),
}
#: what the one line says went wrong, per endpoint
SAYS = {"nothing listening": "Connect", "accepts and never answers": "timed out after 30 s",
        "503 to everything": "503", "200 with a login page": "not a"}


def _serve(name: str):
    """(name, base_url) of one kind of dead endpoint, for the test's lifetime."""
    kind = ENDPOINTS[name]
    if kind is None:
        with socket.socket() as port:  # bound, then released: nothing listens
            port.bind(("127.0.0.1", 0))
            yield name, f"http://127.0.0.1:{port.getsockname()[1]}/v1"
        return
    with DeadEndpoint(None if kind is DeadEndpoint else kind) as server:
        yield name, server.base_url


@pytest.fixture(params=sorted(ENDPOINTS))
def endpoint(request):
    yield from _serve(request.param)


#: the silent endpoint costs the probe's whole timeout: asked of one command (the probe is the same
#: function in every command; the others show they ask it with the kinds that fail at once)
@pytest.fixture(params=sorted(set(ENDPOINTS) - {"accepts and never answers"}))
def failing_at_once(request):
    yield from _serve(request.param)


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    """A study dir with one finished run of a prompt task (as `heldout run` lays it out), made
    against a live test server, and the manifest root its task is frozen in."""
    manifests = tmp_path_factory.mktemp("manifests")
    mp = pytest.MonkeyPatch()
    mp.setenv(MANIFEST_PATH_ENV, str(manifests))
    synthetic.freeze_task(TASK, manifests)
    build_split(TASK, PROFILE, SplitSizes(16, 8, 16), probe=2, seed=0)
    root = tmp_path_factory.mktemp("study")
    with TestServer(seed=0) as server:
        task = heldout.load_task(TASK, PROFILE)
        worker = ModelClient("test-model", base_url=server.base_url, api_key="k")
        record = Session(task, budget=Budget(0), seed=0, models=SessionModels(worker=worker),
                         run_dir=root / "user__code_words_dead_endpoint" / "ruled" / "seed-0", method="ruled"
                         ).run(lambda view, seed: {"instruction": view.seed_candidate["instruction"] + synthetic.RULE})
    assert record.status == "ok"
    yield root, manifests
    mp.undo()


def _heldout(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "heldout", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=WITHIN)  # the old code's minutes of retries fail it here
    return done, time.monotonic() - started


def _one_line_naming(done: subprocess.CompletedProcess, name: str, url: str) -> None:
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines[-5:]
    assert url in lines[0] and "does not answer" in lines[0] and SAYS[name] in lines[0], lines[0]
    assert "nothing was run or written" in lines[0] and done.stdout == ""


def test_leak_ablate_probes_the_endpoint_before_its_ledger(failing_at_once, finished_study, tmp_path):
    name, url = failing_at_once
    study, manifests = finished_study
    done, _ = _heldout(["leak", "ablate", str(study), "--worker-model", "test-model", "--base-url", url], tmp_path,
                       {**os.environ, MANIFEST_PATH_ENV: str(manifests)})
    _one_line_naming(done, name, url)
    assert not (study / LEAK_ABLATION_DIR).exists()  # no ablation session opened in the study's ledger


def test_a_study_probes_the_endpoint_once_and_writes_nothing(endpoint, tmp_path):
    name, url = endpoint
    done, _ = _heldout(["run", "--task", "bbh/boolean_expressions", "--optimizer", "seed", "--seeds", "0", "--budget", "4",
                        "--worker-model", "test-model", "--base-url", url, "--run-dir", "study"], tmp_path)
    _one_line_naming(done, name, url)
    assert list(tmp_path.iterdir()) == []


def test_eval_probes_the_endpoint_once(failing_at_once, tmp_path):
    name, url = failing_at_once
    done, _ = _heldout(["eval", "--task", "bbh/boolean_expressions", "--worker-model", "test-model",
                        "--base-url", url], tmp_path)
    _one_line_naming(done, name, url)


def test_an_ablation_whose_endpoint_dies_ends_incomplete_and_a_rerun_is_a_session_of_its_own(finished_study, tmp_path):
    """The endpoint answered the probe, then fails every request: the ablation's session in the
    ledger ends ``incomplete`` (no result file, nothing scored), and a re-run is a finished session
    beside it, never mistaken for the stopped one's scorings."""
    study = tmp_path / "study"
    shutil.copytree(finished_study[0], study)
    with TestServer(seed=0) as server:
        server.faults = FaultPlan(error_rate=1.0)
        with pytest.raises(InfrastructureFailure):
            ablate(study, worker=ModelClient("test-model", base_url=server.base_url, max_retries=0), n_boot=200)
        server.faults = FaultPlan()
        again = ablate(study, worker=ModelClient("test-model", base_url=server.base_url), n_boot=200)
    ledger = study / LEAK_ABLATION_DIR
    assert verify_ledger(ledger).ok and (ledger / LEAK_RESULT_FILE).is_file()
    ends = [e["data"] for e in Ledger.open(ledger).entries("ablation_end")]
    assert [e["status"] for e in ends] == ["incomplete", "ok"] and ends[1]["metric_calls"] == again.metric_calls
    scorings = list(Ledger.open(ledger).entries("ablation_scoring"))
    assert len(scorings) == again.metric_calls  # the failed session booked no verdict
