"""Isolated optimizers end to end: a command reaches its task only through the view server, in a
sandbox that hides data, manifests, scoring rules and the ledger; what it tries is refused and
recorded, and its final candidate is still scored by the harness."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import heldout
from heldout.evaluators import isolated
from heldout.evaluators.isolated import LOG_FILE, OPTIMIZER_MODULES, OptimizerLimits, run_isolated
from heldout.evaluators.ledger import LEDGER_FILE, verify_ledger
from heldout.evaluators.records import RunRecord
from heldout.sandbox import isolation_mode
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.scoring import SessionModels
from heldout.evaluators.view_server import ViewServer, token_fingerprint
from heldout.models import ModelClient
from heldout.models.testserver import TestServer

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "isolated_random_search.py"
MODE = isolation_mode()
needs_isolation = pytest.mark.skipif(MODE == "none", reason="bubblewrap is not available here")


@pytest.fixture
def world_readable_dir():
    """A directory any uid may read, so only heldout's hiding (not file modes) protects what is
    in it, and so the child's throw-away uid can read optimizer scripts placed there."""
    path = Path(tempfile.mkdtemp(prefix="heldout-test-iso-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write_script(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    path.chmod(0o644)
    return path


def lockpicking_session(run_dir: Path, budget: int = 60, **kw) -> Session:
    run_dir.mkdir(mode=0o755, exist_ok=True)
    run_dir.chmod(0o755)
    task = heldout.load_task("lockpicking/six", profile="paper")
    return Session(task, budget=Budget(budget, wall_seconds=kw.pop("wall_seconds", 300)), seed=1,
                   run_dir=run_dir, method="isolated-test", **kw)


def test_example_random_search_runs_isolated_on_lockpicking(world_readable_dir):
    run_dir = world_readable_dir / "run"
    session = lockpicking_session(run_dir, budget=60)
    record = run_isolated(session, [sys.executable, str(EXAMPLE), "--minibatch", "5"])
    assert record.status == "ok", record.error
    assert len(record.test_verdicts) == 50 and record.test_score is not None
    assert 0 < record.usage["metric_calls"] <= 60
    assert verify_ledger(run_dir).ok
    kinds = [e["kind"] for e in map(json.loads, (run_dir / LEDGER_FILE).read_text().splitlines())]
    assert kinds.count("optimizer_launch") == 1 and kinds.count("optimizer_exit") == 1
    assert kinds.index("optimizer_exit") < kinds.index("final_candidate") < kinds.index("session_end")
    assert "done after" in (run_dir / LOG_FILE).read_text()
    # the candidate the optimizer submitted last is the one scored
    submitted = [json.loads(line)["data"]["candidate_id"] for line in (run_dir / LEDGER_FILE).read_text().splitlines()
                 if json.loads(line)["kind"] == "final_submitted"]
    assert record.final_candidate_id == submitted[-1]
    assert RunRecord.load(run_dir).ledger_head == verify_ledger(run_dir).head


def test_prompt_task_runs_isolated_against_the_test_server(data_dir, world_readable_dir):
    task = heldout.load_task("bbh/word_sorting", profile="sepo", data_dir=data_dir)
    run_dir = world_readable_dir / "bbh"
    with TestServer(latency=0.0, seed=0) as srv:
        worker = ModelClient("test-model", base_url=srv.base_url, api_key="k", concurrency=8)
        session = Session(task, budget=Budget(40, wall_seconds=300), seed=0, models=SessionModels(worker=worker), run_dir=run_dir)
        record = run_isolated(session, f"{sys.executable} {EXAMPLE} --minibatch 10")
        calls = srv.stats.calls
    assert record.status == "ok", record.error
    assert len(record.test_verdicts) == 200
    metric_calls = record.usage["metric_calls"]
    assert 0 < metric_calls <= 40
    # every optimisation metric call reached the endpoint once, plus 200 deployment calls on test
    assert calls == record.usage["endpoint_calls"]["worker-optimisation"] + 200
    assert record.usage["endpoint_calls"]["worker-deployment"] == 200
    assert verify_ledger(run_dir).ok


PROBE = """
import json, os, sys
from heldout.adapters.client import TaskClient

cfg = json.loads(sys.argv[1])
client = TaskClient.from_env()
outcomes = {}

def attempt(name, fn):
    try:
        got = fn()
    except BaseException as exc:
        outcomes[name] = "blocked: %s: %s" % (type(exc).__name__, str(exc)[:200])
    else:
        outcomes[name] = "LEAKED: %r" % (got,)

def read(path):
    with open(path, "rb") as fh:
        return fh.read(60)

def listing(path):
    names = os.listdir(path)
    if not names:
        raise FileNotFoundError("empty (hidden)")
    return names[:5]

def forge(path):
    with open(path, "a") as fh:
        fh.write(json.dumps({"seq": 999, "kind": "evaluation", "data": {"forged": True}}) + "\\n")
    return "appended"

def others_in_tmp():
    names = [n for n in os.listdir(cfg["tmp"]) if n.startswith("heldout-test-other-")]
    if not names:
        raise FileNotFoundError("no other session visible")
    return names

def import_manifests():
    import heldout.data_manifests
    return heldout.data_manifests.__file__

attempt("a_data_file", lambda: read(cfg["data_file"]))
attempt("a_data_listing", lambda: listing(cfg["data_dir"]))
attempt("b_manifest_file", lambda: read(cfg["manifest_file"]))
attempt("b_manifest_import", import_manifests)
attempt("b_rules_source", lambda: read(cfg["rules_file"]))
attempt("c_ledger", lambda: read(cfg["ledger"]))
attempt("d_test_split", lambda: client.evaluate(client.seed_candidate, "test"))
attempt("d_test_route", lambda: client.request("POST", "/score_test", {"candidate": client.seed_candidate}))
attempt("e_other_token_here", lambda: TaskClient(cfg["other_token"], socket_path=os.environ["HELDOUT_VIEW_SOCKET"]).remaining)
attempt("e_other_socket", lambda: TaskClient(cfg["other_token"], socket_path=cfg["other_socket"]).remaining)
attempt("e_other_tcp", lambda: TaskClient(cfg["other_token"], url=cfg["other_url"], timeout=5).remaining)
attempt("e_other_session_dirs", others_in_tmp)
attempt("f_forge_ledger", lambda: forge(cfg["ledger"]))
attempt("g_write_outside_scratch", lambda: forge(cfg["outside_file"]))
outcomes["env"] = sorted(os.environ)
outcomes["cwd_is_home"] = os.getcwd() == os.environ["HOME"]
print("PROBE " + json.dumps(outcomes), flush=True)
client.submit_final(client.seed_candidate)
"""


def run_probe(world_readable_dir: Path, data_dir: Path):
    run_dir = world_readable_dir / "probe-run"
    session = lockpicking_session(run_dir, budget=10)
    other = lockpicking_session(world_readable_dir / "other-run", budget=10)
    other_private = Path(tempfile.mkdtemp(prefix="heldout-test-other-"))  # 0700, like a real session's
    import heldout.benchmarks.lockpicking.rules as rules
    import heldout.data_manifests as manifests

    data_file = next(p for p in sorted(data_dir.rglob("*")) if p.is_file())
    manifest_file = next(p for p in sorted(Path(manifests.__file__).parent.rglob("*.json")))
    code_dir = world_readable_dir / "code"
    code_dir.mkdir(mode=0o755)
    probe = write_script(code_dir, "probe.py", PROBE)
    try:
        with ViewServer(other, socket_path=other_private / "view.sock", host="127.0.0.1") as other_server:
            cfg = {"data_file": str(data_file), "data_dir": str(data_dir), "manifest_file": str(manifest_file),
                   "rules_file": rules.__file__, "ledger": str(run_dir / LEDGER_FILE),
                   "other_token": other_server.token, "other_socket": other_server.socket_path,
                   "other_url": other_server.url, "outside_file": str(world_readable_dir / "planted.txt"),
                   "tmp": tempfile.gettempdir()}
            # control: every path the probe tries is real and readable by the harness
            for key in ("data_file", "manifest_file", "rules_file"):
                assert Path(cfg[key]).is_file(), key
            record = run_isolated(session, [sys.executable, str(probe), json.dumps(cfg)])
        other.ledger.close()
    finally:
        shutil.rmtree(other_private, ignore_errors=True)
    log = (run_dir / LOG_FILE).read_text()
    outcomes = json.loads(log.split("PROBE ", 1)[1].splitlines()[0])
    return record, outcomes, run_dir, other, other_server


@needs_isolation
def test_hostile_optimizer_is_contained_recorded_and_still_scored(data_dir, world_readable_dir):
    record, outcomes, run_dir, other, other_server = run_probe(world_readable_dir, data_dir)
    attempts = {k: v for k, v in outcomes.items() if k[1] == "_"}
    leaked = {k: v for k, v in attempts.items() if not v.startswith("blocked")}
    assert not leaked, leaked
    assert "HTTP 403" in outcomes["d_test_split"] and "HTTP 404" in outcomes["d_test_route"]
    assert "HTTP 401" in outcomes["e_other_token_here"]
    assert not (world_readable_dir / "planted.txt").exists()
    assert outcomes["env"] == sorted(["HELDOUT_SEED", "HELDOUT_VIEW_SOCKET", "HELDOUT_VIEW_TOKEN", "HOME", "LANG",
                                      "LC_ALL", "PATH", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH", "TMPDIR"])
    assert outcomes["cwd_is_home"]
    # (d) and (e) are on the record; the token itself is not
    ledger = [json.loads(line) for line in (run_dir / LEDGER_FILE).read_text().splitlines()]
    seen = {(e["data"]["reason"], e["data"]["path"]) for e in ledger if e["kind"] == "forbidden_attempt"}
    assert {("not_visible", "/evaluate"), ("unknown_route", "/score_test"), ("bad_token", "/remaining")} <= seen
    bad = [e["data"] for e in ledger if e["kind"] == "forbidden_attempt" and e["data"]["reason"] == "bad_token"]
    assert bad[0]["token_sha256"] == token_fingerprint(other_server.token)
    assert all(other_server.token not in json.dumps(e) for e in ledger if e["kind"] == "forbidden_attempt")
    # (f) the ledger was never touched behind the writer's back, and the other session saw nothing
    assert verify_ledger(run_dir).ok and not any(e["data"].get("forged") for e in ledger)
    assert not list(other.ledger.entries("forbidden_attempt"))
    assert other_server.forbidden_attempts == 0
    # the optimizer's final candidate is still scored by the harness, once
    assert record.status == "ok" and len(record.test_verdicts) == 50
    assert sum(1 for e in ledger if e["kind"] == "test_scoring") == 50


def test_an_isolated_optimizer_is_refused_without_a_sandbox(world_readable_dir, monkeypatch):
    monkeypatch.setenv("HELDOUT_SANDBOX_ISOLATION", "none")
    monkeypatch.setenv("HELDOUT_UNSAFE_NO_SANDBOX", "1")  # even then: isolation is the point
    session = lockpicking_session(world_readable_dir / "run", budget=5)
    with pytest.raises(heldout.HeldoutError, match="--trusted-optimizer"):
        run_isolated(session, [sys.executable, "-c", "pass"])


def test_the_heldout_code_an_isolated_optimizer_sees_is_the_client_contracts_and_optimizers(world_readable_dir):
    code_dir = world_readable_dir / "code"
    code_dir.mkdir(mode=0o755)
    record = optimizer_result(code_dir, """
        import os, sys
        from heldout.adapters.client import TaskClient
        seen = sorted(os.path.relpath(os.path.join(d, f), "/sandbox/code") for d, _, fs in os.walk("/sandbox/code")
                      for f in fs)
        print("SEEN " + " ".join(seen), flush=True)
        TaskClient.from_env().submit_final(TaskClient.from_env().seed_candidate)
    """, world_readable_dir / "run")
    assert record.status == "ok", record.error
    seen = (world_readable_dir / "run" / LOG_FILE).read_text().split("SEEN ", 1)[1].split()
    assert all(f.endswith(".py") for f in seen)
    assert all(f == "_heldout_optimizer_runner.py" or f == "heldout/__init__.py"
               or f.split("/")[1] in OPTIMIZER_MODULES for f in seen), seen
    assert not any("benchmarks" in f or "data_manifests" in f or "rules" in f for f in seen)


def optimizer_result(folder: Path, source: str, run_dir: Path, **kw) -> RunRecord:
    folder.mkdir(mode=0o755, exist_ok=True)
    script = write_script(folder, "opt.py", source)
    session = lockpicking_session(run_dir, budget=10, wall_seconds=kw.pop("wall_seconds", 300))
    return run_isolated(session, [sys.executable, str(script)], **kw)


def test_crashing_optimizer_fails_with_its_traceback_and_a_verifying_ledger(world_readable_dir):
    record = optimizer_result(world_readable_dir / "code", """
        from heldout.adapters.client import TaskClient
        client = TaskClient.from_env()
        client.evaluate(client.seed_candidate, "train", [client.train[0]["id"]])
        client.submit_final(client.seed_candidate)
        raise RuntimeError("optimizer bug after submitting")
    """, world_readable_dir / "run")
    assert record.status == "failed" and "exited with status 1" in record.error
    assert "optimizer bug after submitting" in record.error and record.test_verdicts == []
    assert record.usage["metric_calls"] == 1
    assert verify_ledger(world_readable_dir / "run").ok


def test_optimizer_that_submits_nothing_fails_clearly(world_readable_dir):
    record = optimizer_result(world_readable_dir / "code", "print('thinking hard')\n", world_readable_dir / "run")
    assert record.status == "failed" and "without submitting a final candidate" in record.error
    assert "thinking hard" in record.error


def running_commands() -> list[list[str]]:
    out = []
    for proc in Path("/proc").iterdir():
        try:
            out.append((proc / "cmdline").read_bytes().decode(errors="replace").split("\0"))
        except OSError:
            continue
    return out


@needs_isolation
def test_optimizer_over_its_wall_time_is_killed_with_everything_it_started(world_readable_dir):
    tag = f"600.{int.from_bytes(os.urandom(3), 'big')}"  # a sleep nobody else runs
    record = optimizer_result(world_readable_dir / "code", f"""
        import subprocess, time
        from heldout.adapters.client import TaskClient
        TaskClient.from_env().submit_final({{"scorer.sql": "'1'"}})
        subprocess.Popen(["sleep", "{tag}"], start_new_session=True)  # leaves the process group
        time.sleep(600)
    """, world_readable_dir / "run", wall_seconds=3.0, limits=OptimizerLimits(grace_seconds=0.5))
    # 3 s: the optimizer's start, its import of the client and its submit all come before the limit
    # on a loaded machine too (1 s left the submit to chance), and it sleeps far past it
    assert record.status == "failed" and "wall-time limit" in record.error
    exit_entry = [json.loads(line)["data"] for line in (world_readable_dir / "run" / LEDGER_FILE).read_text().splitlines()
                  if json.loads(line)["kind"] == "optimizer_exit"][0]
    assert exit_entry["killed_for"] == "wall_time" and exit_entry["final_submitted"]
    assert not [cmd for cmd in running_commands() if cmd[:2] == ["sleep", tag]]


@needs_isolation
def test_a_hung_optimizer_without_a_wall_budget_is_stopped_at_the_default_limit(world_readable_dir, monkeypatch):
    # containment family 5: no --wall-seconds used to mean "forever"; the default (6 h) is the same
    # code path, shortened here so the test ends
    monkeypatch.setattr(isolated, "DEFAULT_WALL_SECONDS", 2.0)
    folder = world_readable_dir / "code"
    folder.mkdir(mode=0o755, exist_ok=True)
    script = write_script(folder, "opt.py", "import time\ntime.sleep(600)\n")
    session = lockpicking_session(world_readable_dir / "run", budget=10, wall_seconds=None)
    assert session.budget.wall_seconds is None
    record = run_isolated(session, [sys.executable, str(script)])
    assert record.status == "failed" and "wall-time limit" in record.error
    entries = [json.loads(line) for line in (world_readable_dir / "run" / LEDGER_FILE).read_text().splitlines()]
    launch = next(e["data"] for e in entries if e["kind"] == "optimizer_launch")
    exit_entry = next(e["data"] for e in entries if e["kind"] == "optimizer_exit")
    assert launch["wall_seconds"] == 2.0 and exit_entry["killed_for"] == "wall_time"
    assert verify_ledger(world_readable_dir / "run").ok


def test_unknown_command_fails_clearly(world_readable_dir):
    session = lockpicking_session(world_readable_dir / "run", budget=5)
    record = run_isolated(session, "no-such-optimizer-binary --flag")
    assert record.status == "failed" and "cannot run the optimizer command" in record.error
    assert verify_ledger(world_readable_dir / "run").ok


def test_the_client_module_imports_without_the_rest_of_heldout(tmp_path):
    """The harness copies only heldout/adapters/client.py and heldout/contracts.py into the sandbox:
    together they must stand alone."""
    pkg = tmp_path / "heldout" / "adapters"
    pkg.mkdir(parents=True)
    (tmp_path / "heldout" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    shutil.copyfile(REPO / "heldout" / "adapters" / "client.py", pkg / "client.py")
    shutil.copyfile(REPO / "heldout" / "contracts.py", tmp_path / "heldout" / "contracts.py")
    code = ("import sys, heldout.adapters.client as c; "
            "assert not [m for m in sys.modules if m.startswith('heldout.') and m not in "
            "('heldout.adapters', 'heldout.adapters.client', 'heldout.contracts')], sorted(sys.modules); "
            "print(c.TaskClient)")
    done = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); {code}"],
                          capture_output=True, text=True, env={**os.environ})
    assert done.returncode == 0, done.stderr


def heldout_run(run_root: Path, task: str, *args: str) -> Path:
    """`heldout run ... --optimizer-cmd` from the repo root, as a user would type it."""
    cmd = [sys.executable, "-m", "heldout.cli", "run", "--task", task, "--seeds", "0", "--run-dir", str(run_root),
           "--optimizer-cmd", "python examples/isolated_random_search.py --minibatch 2", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = [p.parent for p in run_root.rglob("run_record.json")]
    return run_dir


@pytest.mark.parametrize("task,profile", [("lockpicking/six", "paper"), ("heilbronn/triangle11", "default")])
def test_cli_runs_program_tasks_with_an_isolated_optimizer(task, profile, tmp_path):
    run_dir = heldout_run(tmp_path / "study", task, "--profile", profile, "--budget", "6")
    record = RunRecord.load(run_dir)
    assert record.status == "ok" and record.test_verdicts and record.usage["metric_calls"] <= 6
    verify = subprocess.run([sys.executable, "-m", "heldout.cli", "ledger", "verify", str(run_dir)],
                            capture_output=True, text=True, cwd=REPO)
    assert verify.returncode == 0 and "chain intact" in verify.stdout
    assert any(json.loads(line)["kind"] == "optimizer_launch" for line in (run_dir / LEDGER_FILE).open())


def test_cli_runs_a_prompt_task_with_an_isolated_optimizer(data_dir, tmp_path):
    with TestServer(latency=0.0, seed=0) as srv:
        run_dir = heldout_run(tmp_path / "study", "bbh/word_sorting", "--profile", "sepo", "--budget", "10",
                              "--worker-model", "test-model", "--base-url", srv.base_url,
                              "--data-dir", str(data_dir))
    record = RunRecord.load(run_dir)
    assert record.status == "ok" and len(record.test_verdicts) == 200
    assert verify_ledger(run_dir).ok
