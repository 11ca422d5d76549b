"""The view server: what an isolated optimizer can ask over HTTP, and what is refused and recorded."""

from __future__ import annotations

import http.client
import json
import os
import stat
import tempfile
from pathlib import Path

import pytest

import heldout
from heldout.adapters.client import BudgetExceeded, RequestRefused, TaskClient, VisibilityError
from heldout.evaluators.ledger import verify_ledger
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.scoring import SessionModels
from heldout.evaluators.view_server import ViewServer, token_fingerprint
from heldout.models import ModelClient
from heldout.models.testserver import TestServer


@pytest.fixture(scope="module")
def lockpicking():
    return heldout.load_task("lockpicking/six", profile="paper")


@pytest.fixture
def session(lockpicking, tmp_path):
    return Session(lockpicking, budget=Budget(20), seed=3, run_dir=tmp_path / "run")


@pytest.fixture
def served(session):
    with ViewServer(session, host="127.0.0.1") as server:
        yield server


def client_for(server: ViewServer, token: str | None = None) -> TaskClient:
    return TaskClient(token or server.token, url=server.url)


def forbidden(session) -> list[dict]:
    return [e["data"] for e in session.ledger.entries("forbidden_attempt")]


def raw(server: ViewServer, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict]:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(method, path, body=body, headers={"Authorization": f"Bearer {server.token}", **(headers or {})})
    resp = conn.getresponse()
    data = json.loads(resp.read() or b"null")
    conn.close()
    return resp.status, data


def test_task_route_shows_train_with_targets_val_without_and_no_test(served, lockpicking):
    task = client_for(served).task
    assert task["task"] == "lockpicking/six" and task["kind"] == "program"
    assert task["seed_candidate"] == lockpicking.benchmark.seed_candidate()
    assert [ex["id"] for ex in task["train"]] == [ex.id for ex in lockpicking.split("train")]
    assert all(set(ex) == {"id", "input", "target"} for ex in task["train"])
    assert all(set(ex) == {"id", "input"} for ex in task["val"])
    assert "test" not in json.dumps(task["budget"]) and task["remaining"] == 20
    assert task["policy"]["name"] == "standard" and task["policy"]["test"] == []


def test_evaluate_spends_budget_and_returns_what_the_policy_shows(served, session):
    client = client_for(served)
    ids = [ex["id"] for ex in client.train[:4]]
    results = client.evaluate(client.seed_candidate, "train", ids)
    assert [r["id"] for r in results] == ids
    assert all({"score", "feedback", "target"} <= set(r) for r in results)
    assert client.remaining == 16 == session.view.remaining
    local = session.view.evaluate(client.seed_candidate, "train", ids)  # the same choke point
    assert [r["score"] for r in local] == [r["score"] for r in results]
    assert sum(1 for _ in session.ledger.entries("evaluation")) == 8


def test_budget_exceeded_is_402_and_nothing_runs(served, session):
    client = client_for(served)
    ids = [ex["id"] for ex in client.train[:21]]
    with pytest.raises(BudgetExceeded, match="20 of 20 metric calls left") as info:
        client.evaluate(client.seed_candidate, "train", ids)
    assert info.value.status == 402 and info.value.kind == "budget_exceeded"
    assert client.remaining == 20
    assert not list(session.ledger.entries("evaluation"))


def test_test_split_is_403_and_recorded_as_a_forbidden_attempt(served, session):
    client = client_for(served)
    with pytest.raises(VisibilityError, match="test") as info:
        client.evaluate(client.seed_candidate, "test")
    assert info.value.status == 403
    assert forbidden(session) == [{"reason": "not_visible", "method": "POST", "path": "/evaluate",
                                   "split": "test", "error": forbidden(session)[0]["error"]}]
    with pytest.raises(VisibilityError, match="not in split"):
        client.evaluate(client.seed_candidate, "train", ["not-a-train-id"])
    assert len(forbidden(session)) == 2 and client.remaining == 20


def test_wrong_token_is_401_recorded_with_a_fingerprint_only(served, session):
    other = "another-sessions-token"
    with pytest.raises(RequestRefused) as info:
        client_for(served, token=other).evaluate({"scorer.sql": "'1'"}, "train")
    assert info.value.status == 401
    (attempt,) = forbidden(session)
    assert attempt["reason"] == "bad_token" and attempt["token_sha256"] == token_fingerprint(other)
    assert other not in (Path(session.run_dir) / "ledger.jsonl").read_text()
    status, _ = raw(served, "GET", "/task", headers={"Authorization": "Basic xyz"})
    assert status == 401 and len(forbidden(session)) == 2


@pytest.mark.parametrize("method,path,status", [("GET", "/test", 404), ("POST", "/score_test", 404),
                                                ("GET", "/task?split=test", 404), ("GET", "/evaluate", 405),
                                                ("DELETE", "/final", 405)])
def test_unknown_routes_and_methods_are_refused_and_recorded(served, session, method, path, status):
    got, body = raw(served, method, path, body=b"{}" if method == "POST" else None)
    assert got == status and body["kind"] in ("unknown_route", "wrong_method")
    assert [(a["method"], a["path"]) for a in forbidden(session)] == [(method, path)]


@pytest.mark.parametrize("path,token,status", [("/score_test", None, 404), ("/task", None, 405),
                                               ("/evaluate", "wrong", 401)])
def test_a_refused_request_with_a_body_gets_its_answer_not_a_reset(served, path, token, status):
    # The server answers these before reading the body; unread bytes at close reset the connection,
    # and a client then saw "Broken pipe" instead of the 404 (seen on CI for a probe's /score_test).
    body = json.dumps({"candidate": {"a": "x" * (7 * 1024 * 1024)}}).encode()
    host, port = served.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", path, body=body, headers={"Authorization": f"Bearer {token or served.token}"})
    resp = conn.getresponse()
    assert resp.status == status and json.loads(resp.read())["kind"]
    conn.close()


@pytest.mark.parametrize("body,match", [
    (b"not json", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"candidate": {"scorer.sql": 3}}).encode(), "must map a plain str name"),
    (json.dumps({"candidate": {}}).encode(), "non-empty plain dict"),
    (json.dumps({"candidate": {"a": "b"}, "ids": "six-p00"}).encode(), "list of example id"),
    (json.dumps({"candidate": {"a": "b"}, "budget": 10 ** 6}).encode(), "unknown field"),
    (json.dumps({"split": "train"}).encode(), "missing field"),
])
def test_malformed_requests_are_400_and_cost_nothing(served, session, body, match):
    status, data = raw(served, "POST", "/evaluate", body=body, headers={"Content-Type": "application/json"})
    assert status == 400 and match in data["error"]
    assert session.view.remaining == 20 and not forbidden(session)


def test_request_bodies_are_capped(session):
    with ViewServer(session, host="127.0.0.1", max_body_bytes=1000) as server:
        big = json.dumps({"candidate": {"scorer.sql": "x" * 2000}}).encode()
        status, data = raw(server, "POST", "/evaluate", body=big)
        assert status == 413 and "exceeds the cap of 1000 bytes" in data["error"]
        host, port = server.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.putrequest("POST", "/evaluate")
        conn.putheader("Authorization", f"Bearer {server.token}")
        conn.endheaders()
        assert conn.getresponse().status == 411
        conn.close()
    assert session.view.remaining == 20


def test_final_is_validated_and_the_last_submission_wins(served, session):
    client = client_for(served)
    with pytest.raises(RequestRefused, match="must map a plain str name") as info:
        client.submit_final({"scorer.sql": ["not", "text"]})
    assert info.value.status == 400 and served.final is None
    first = client.submit_final(client.seed_candidate)
    second = client.submit_final({"scorer.sql": "'1'"})
    assert first != second and served.final == {"scorer.sql": "'1'"}
    assert [e["data"]["candidate_id"] for e in session.ledger.entries("final_submitted")] == [first, second]


def test_unix_socket_transport_and_from_env(session):
    private = Path(tempfile.mkdtemp(prefix="heldout-test-view-"))
    try:
        with ViewServer(session, socket_path=private / "view.sock") as server:
            env = server.child_env()
            assert set(env) == {"HELDOUT_VIEW_TOKEN", "HELDOUT_VIEW_SOCKET"}
            assert stat.S_ISSOCK(os.stat(env["HELDOUT_VIEW_SOCKET"]).st_mode)
            client = TaskClient.from_env(env)
            assert client.remaining == 20
            assert client.evaluate(client.seed_candidate, "train", [client.train[0]["id"]])[0]["id"] == "six-p00"
        assert not (private / "view.sock").exists()
    finally:
        private.rmdir()
    with pytest.raises(RuntimeError, match="not started by heldout"):
        TaskClient.from_env({})


def test_architect_is_metered_and_refused_when_absent(tmp_path, lockpicking):
    with TestServer(latency=0.0, seed=0) as srv:
        architect = ModelClient("test-model", base_url=srv.base_url, api_key="k")
        session = Session(lockpicking, budget=Budget(5, architect_tokens=10_000), run_dir=tmp_path / "a",
                          models=SessionModels(architect=architect))
        with ViewServer(session, host="127.0.0.1") as server:
            client = client_for(server)
            text = client.architect([{"role": "user", "content": "Rewrite this instruction: sort words."}])
            assert text and srv.stats.calls == 1
            assert client.request("GET", "/remaining")["architect_tokens_used"] > 0
            with pytest.raises(RequestRefused, match="non-empty list"):
                client.architect([])
        assert len(list(session.ledger.entries("architect_call"))) == 1
    bare = Session(lockpicking, budget=5, run_dir=tmp_path / "b")
    with ViewServer(bare, host="127.0.0.1") as server:
        with pytest.raises(RequestRefused, match="no architect model") as info:
            client_for(server).architect([{"role": "user", "content": "hi"}])
        assert info.value.status == 409


def test_flood_of_forbidden_attempts_is_counted_not_written(session):
    with ViewServer(session, host="127.0.0.1", max_recorded_attempts=3) as server:
        for _ in range(10):
            assert raw(server, "GET", "/nope")[0] == 404
    assert len(forbidden(session)) == 3 and server.forbidden_attempts == 10
    (summary,) = [e["data"] for e in session.ledger.entries("forbidden_attempts_suppressed")]
    assert summary == {"count": 7}
    session.ledger.close()
    assert verify_ledger(session.run_dir).ok


def test_only_loopback_hosts_are_accepted(session):
    with pytest.raises(ValueError, match="loopback"):
        ViewServer(session, host="0.0.0.0")


def test_feedback_holding_an_infinity_reaches_the_optimizer_as_strict_json(tmp_path):
    """JSON has no NaN or Infinity; Python's json.dumps writes them and parsers in other languages
    (and jq) refuse the whole answer. A MinMax candidate with two coincident points is valid, worth
    0, and its feedback's distance ratio is infinite: the answer must still be strict JSON."""
    minmax = heldout.load_task("minmax/d3n14")
    session = Session(minmax, budget=Budget(2), seed=0, run_dir=tmp_path / "run")
    coincident = {"program.py": "import numpy as np\n\ndef min_max_dist_dim3_14():\n"
                                "    p = np.random.default_rng(42).normal(size=(14, 3))\n    p[1] = p[0]\n    return p\n"}
    with ViewServer(session, host="127.0.0.1") as server:
        host, port = server.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/evaluate", body=json.dumps({"candidate": coincident, "split": "train"}),
                     headers={"Authorization": f"Bearer {server.token}"})
        resp = conn.getresponse()
        body = resp.read()
        conn.close()

    def refuse(constant: str) -> None:
        raise AssertionError(f"the answer holds {constant}, which is not JSON")

    assert resp.status == 200
    results = json.loads(body, parse_constant=refuse)["results"]
    assert results[0]["score"] == 0.0 and results[0]["valid"] is True
    assert "inf" in json.dumps(results[0])  # the infinite ratio is said, as a string
