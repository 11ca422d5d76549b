"""Attack suite, optimizers: the probes that escaped from in-process optimizers, run as isolated
optimizer *functions* (``module:function``, the default for user code), plus containment gaps of
the optimizer's own sandbox. Each probe records what it got; the test asserts it got nothing and
that the run's numbers are the harness's own. Trusted (in-process) mode is shown once, as
documented: it can reach what isolation hides, and the run says it was trusted."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import heldout
from heldout.evaluators.isolated import LOG_FILE, OptimizerLimits, run_isolated_function
from heldout.evaluators.ledger import LEDGER_FILE, verify_ledger
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.signing import SigningKey
from heldout.protocols.run import Cell, Method, StudyConfig, run_cell
from heldout.sandbox import isolation_mode
from heldout.sandbox.cgroups import limits_level

pytestmark = pytest.mark.skipif(isolation_mode() != "bwrap", reason="isolated optimizers need bubblewrap")
BUDGET = 12

PROBES = '''
import ctypes, json, os, signal, socket, struct

OUT = {}


def attempt(name, fn):
    try:
        got = fn()
    except BaseException as exc:
        OUT[name] = "blocked: %s: %s" % (type(exc).__name__, str(exc)[:160])
    else:
        OUT[name] = "LEAKED: %r" % (got,)


def walk(names):
    hits = [os.path.join(d, f) for d, _, fs in os.walk("/") for f in fs
            if f in names or os.path.join(d, f).endswith("lockpicking/rules.py")]
    if not hits:
        raise FileNotFoundError("nothing found")
    return hits[:3]


def signing_key_env():
    found = {k: v[:40] for k, v in os.environ.items() if "SIGNING" in k or "PRIVATE KEY" in v}
    if not found:
        raise KeyError("no signing key in the environment")
    return found


def import_rules():
    from heldout.benchmarks.lockpicking.rules import TRUTH
    return TRUTH


def import_session():
    import heldout.evaluators.session as s
    return s.__file__


def test_split(client):
    return client.evaluate(client.seed_candidate, "test")


def spaced_split(client):
    return client.evaluate(client.seed_candidate, "train ")


def non_str_candidate(client):
    return client.request("POST", "/evaluate", {"candidate": {"scorer.sql": 5}, "split": "train"})


def overspend(client):
    ids = [ex["id"] for ex in client.train]
    spent = 0
    for _ in range(20):
        client.evaluate(client.seed_candidate, "train", ids[:4])
        spent += 4
    return spent


def reset_budget(client):
    return client.request("POST", "/remaining", {"metric_calls": 10 ** 6})


def abstract_socket():
    s = socket.socket(socket.AF_UNIX)
    s.connect("\\0" + os.environ["PROBE_ABSTRACT"])
    return "connected"


def host_tmp():
    names = [n for n in os.listdir("/tmp") if n.startswith("heldout-")]
    if not names:
        raise FileNotFoundError("no host /tmp")
    return names


def host_sysv():
    libc = ctypes.CDLL(None, use_errno=True)
    r = libc.shmget(int(os.environ["PROBE_SHM"]), 0, 0)
    if r < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return r


def new_user_namespace():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return "unshared"


def optimize(client, seed):
    attempt("fs_ledgers", lambda: walk({"ledger.jsonl", "ledger.head", "run_record.json"}))
    attempt("fs_manifests_and_data", lambda: walk({"six.json", "square26.json", "SOURCES.md", "lockpicking.md"}))
    attempt("fs_answer_keys", lambda: walk({"lockpicking_champion.sql", "champion.sql", "ledger.key", "signing.key"}))
    attempt("signing_key_env", signing_key_env)
    attempt("import_rule_table", import_rules)
    attempt("import_session_internals", import_session)
    attempt("test_split", lambda: test_split(client))
    attempt("spaced_split_name", lambda: spaced_split(client))
    attempt("non_str_candidate", lambda: non_str_candidate(client))
    attempt("overspend_budget", lambda: overspend(client))
    attempt("reset_budget_route", lambda: reset_budget(client))
    attempt("abstract_socket", abstract_socket)
    attempt("host_tmp", host_tmp)
    attempt("host_sysv_ipc", host_sysv)
    attempt("new_user_namespace", new_user_namespace)
    OUT["remaining_at_end"] = client.remaining
    print("PROBES " + json.dumps(OUT), flush=True)
    return client.seed_candidate
'''


def _folders():
    root = Path(tempfile.mkdtemp(prefix="heldout-test-optattack-"))
    root.chmod(0o755)
    code = root / "code"
    code.mkdir(mode=0o755)
    yield root, code
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def folders():
    yield from _folders()


@pytest.fixture(scope="module")
def probe_folders():
    # the probed session is only read by the tests below: it runs once per module, not once per probe
    yield from _folders()


def write_module(code: Path, name: str, source: str) -> None:
    path = code / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    path.chmod(0o644)


def session_in(run_dir: Path, budget: int = BUDGET, wall: float = 300) -> Session:
    task = heldout.load_task("lockpicking/six", profile="paper")
    return Session(task, budget=Budget(budget, wall_seconds=wall), seed=1, run_dir=run_dir, method="attack")


@pytest.fixture(scope="module")
def probed(probe_folders):
    import ctypes
    import socket
    import uuid

    root, code = probe_folders
    write_module(code, "probes", PROBES)
    name = f"heldout-test-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind("\0" + name)
    listener.listen()
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x48E20000 + uuid.uuid4().int % 4096
    shm = libc.shmget(key, 4096, 0o1000 | 0o666)
    run_dir = root / "run"
    # the harness signs with a CI secret in its environment: the optimizer must not see it
    os.environ["HELDOUT_SIGNING_KEY"] = SigningKey(Ed25519PrivateKey.generate(), "probe").private_pem().decode()
    try:
        record = run_isolated_function(session_in(run_dir), "probes:optimize", search=[str(code)],
                                       env={"PROBE_ABSTRACT": name, "PROBE_SHM": str(key)})
    finally:
        del os.environ["HELDOUT_SIGNING_KEY"]
        listener.close()
        libc.shmctl(shm, 0, None)
    log = (run_dir / LOG_FILE).read_text()
    return record, json.loads(log.split("PROBES ", 1)[1].splitlines()[0]), run_dir


PROBE_NAMES = ["fs_ledgers", "fs_manifests_and_data", "fs_answer_keys", "import_rule_table",
               "import_session_internals", "test_split", "spaced_split_name", "non_str_candidate",
               "overspend_budget", "reset_budget_route", "abstract_socket", "host_tmp", "host_sysv_ipc",
               "new_user_namespace", "signing_key_env"]


@pytest.mark.parametrize("probe", PROBE_NAMES)
def test_an_isolated_optimizer_function_probe_is_blocked(probed, probe):
    record, outcomes, run_dir = probed
    assert outcomes[probe].startswith("blocked"), outcomes[probe]


def test_the_probed_run_is_still_scored_by_the_harness_within_its_budget(probed):
    record, outcomes, run_dir = probed
    assert record.status == "ok", record.error
    assert record.usage["metric_calls"] <= BUDGET and outcomes["remaining_at_end"] >= 0
    assert len(record.test_verdicts) == 50 and verify_ledger(run_dir).ok
    launch = [json.loads(line)["data"] for line in (run_dir / LEDGER_FILE).read_text().splitlines()
              if json.loads(line)["kind"] == "optimizer_launch"][0]
    assert launch["function"] == "probes:optimize" and launch["trusted"] is False
    assert launch["isolation"].startswith("bwrap+") and launch["wall_seconds"] > 0


def test_a_self_signalled_optimizer_is_reported_as_crashed_by_that_signal(folders):
    root, code = folders
    write_module(code, "selfkill", "import os, signal\ndef optimize(client, seed):\n"
                                   "    client.submit_final(client.seed_candidate)\n    os.kill(os.getpid(), signal.SIGSEGV)\n")
    record = run_isolated_function(session_in(root / "run"), "selfkill:optimize", search=[str(code)])
    assert record.status == "failed" and "killed by signal SIGSEGV" in record.error, record.error


def test_a_hanging_optimizer_stops_at_its_wall_limit_which_is_recorded(folders):
    root, code = folders
    write_module(code, "hang", "import time\ndef optimize(client, seed):\n    time.sleep(3600)\n")
    record = run_isolated_function(session_in(root / "run"), "hang:optimize", search=[str(code)],
                                   limits=OptimizerLimits(wall_seconds=2.0))
    assert record.status == "failed" and "wall-time limit (2 s)" in record.error


WHOLE_TREE_LIMITS = pytest.mark.skipif(limits_level() == "rlimit",
                                       reason="no writable memory cgroup on this machine: only per-process limits apply")


@WHOLE_TREE_LIMITS
def test_an_optimizer_memory_bomb_stops_at_the_whole_tree_limit(folders):
    root, code = folders
    write_module(code, "bomb", "import os\ndef optimize(client, seed):\n"
                               "    for _ in range(4):\n        if os.fork() == 0:\n            break\n"
                               "    hog = bytearray(200 << 20)\n    for i in range(0, len(hog), 4096):\n"
                               "        hog[i] = 1\n    return client.seed_candidate\n")
    record = run_isolated_function(session_in(root / "run"), "bomb:optimize", search=[str(code)],
                                   limits=OptimizerLimits(memory_mb=300))
    assert record.status == "failed" and "optimizer crashed" in record.error, record.error


@WHOLE_TREE_LIMITS
def test_an_optimizer_whose_helper_process_is_killed_for_memory_fails_even_if_it_goes_on(folders):
    """The memory limit is the whole tree's budget: a helper the kernel killed for it makes the run
    fail, although the main process waited for it and then submitted normally."""
    root, code = folders
    write_module(code, "helperbomb", "import os\ndef optimize(client, seed):\n"
                                     "    pid = os.fork()\n    if pid == 0:\n"
                                     "        hog = bytearray(600 << 20)\n        os._exit(0)\n"
                                     "    os.waitpid(pid, 0)\n    return client.seed_candidate\n")
    record = run_isolated_function(session_in(root / "run"), "helperbomb:optimize", search=[str(code)],
                                   limits=OptimizerLimits(memory_mb=300))
    assert record.status == "failed" and "whole-run memory limit" in record.error, record.error


def test_an_optimizer_package_that_holds_the_run_dir_is_refused(folders):
    """Only the module's file or top-level package dir is bound in; if that dir holds the
    session's run dir (its ledger), the run is refused instead of exposing it."""
    root, code = folders
    package = root / "mypkg"
    package.mkdir(mode=0o755)
    write_module(package, "__init__", "def optimize(client, seed):\n    return client.seed_candidate\n")
    with pytest.raises(heldout.HeldoutError, match="run dir"):
        run_isolated_function(session_in(package / "run"), "mypkg:optimize", search=[str(root)])


# -- trusted mode, as documented ---------------------------------------------------------------------
def test_a_trusted_in_process_optimizer_can_reach_the_rules_and_the_run_says_it_was_trusted(folders, monkeypatch):
    """``--trusted-optimizer``: the optimizer shares the harness's interpreter, so it *can* import
    the rule table (isolation is what prevents that); the ledger labels the run."""
    root, code = folders
    write_module(code, "peek", "def optimize(view, seed):\n"
                               "    from heldout.benchmarks.lockpicking.rules import TRUTH\n"
                               "    assert TRUTH.edges\n    return view.seed_candidate\n")
    monkeypatch.syspath_prepend(str(code))
    cell = Cell("lockpicking/six", Method(name="peek", target="peek:optimize"), 0, 4, "paper", {})
    summary = run_cell(cell, StudyConfig(run_root=str(root / "study"), trusted_optimizer=True))
    assert summary["status"] == "ok"
    entries = [json.loads(line) for line in (Path(summary["run_dir"]) / LEDGER_FILE).read_text().splitlines()]
    trust = [e["data"] for e in entries if e["kind"] == "optimizer_trust"]
    assert trust == [{"optimizer": "peek:optimize", "trusted": True, "isolation": "trusted, not isolated"}]
    # the same function, isolated (the default), cannot import the rules
    summary = run_cell(Cell("lockpicking/six", Method(name="peek2", target="peek:optimize"), 0, 4, "paper", {}),
                       StudyConfig(run_root=str(root / "study")))
    assert summary["status"] == "failed" and "No module named 'heldout.benchmarks'" in summary["error"]
