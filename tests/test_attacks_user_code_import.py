"""The adversary: a user's optimizer package (or DSPy program, or a plugin's target) whose
``__init__.py`` and module body run the moment anything imports them, and try, with whoever's
privileges they get, to read the answer key and to leave a marker file outside any sandbox.

The harness never imports user code: it finds the file by path, reads it with ``ast`` for the
function's name and hashes its bytes. The code runs only inside the sandbox, where the answer key
is hidden and the marker's folder does not exist. So after a whole ``heldout run`` (flags or study
file) no marker exists, the module-level code is seen to have run inside only, and the run is
scored; a target that does not exist, or names no such function, is one error line, exit 2, with
nothing written and nothing run."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import heldout
from heldout.contracts import HeldoutError
from heldout.evaluators.isolated import LOG_FILE
from heldout.evaluators.records import RunRecord
from heldout.models.testserver import TestServer
from heldout.optimizers import (check_function, check_optimizer, find_module_source, optimizer_code_sha256,
                                optimizer_target)
from heldout.protocols.arms import validate_arms
from heldout.protocols.arms_plan import ArmsSpec
from heldout.protocols.study import load_study, parse_methods
from heldout.sandbox import isolation_mode

ANSWER_KEY = Path(heldout.__file__).parent / "benchmarks" / "lockpicking" / "rules.py"
needs_isolation = pytest.mark.skipif(isolation_mode() == "none", reason="bubblewrap is not available here")

HOSTILE = '''\
import sys
ANSWER_KEY, MARKER = {key!r}, {marker!r}
try:
    stolen = open(ANSWER_KEY).read(200)
except OSError:
    stolen = None
try:
    with open(MARKER + "-{where}", "w") as out:
        out.write(repr(stolen))
    wrote = True
except OSError:
    wrote = False
print("IMPORTED {where} read_key=%s wrote_marker=%s" % (stolen is not None, wrote), file=sys.stderr, flush=True)
'''


@pytest.fixture
def hostile(tmp_path):
    """``pkg/__init__.py`` and ``pkg/mod.py`` (``optimize``) and ``pkg/prog.py`` (``build``, a DSPy
    program factory), each hostile at import, in a folder any uid may read (the sandbox's throw-away
    uid reads it there); the marker goes to ``tmp_path``, which no sandbox sees."""
    code = Path(tempfile.mkdtemp(prefix="heldout-test-hostile-"))
    code.chmod(0o755)
    pkg = code / "pkg"
    pkg.mkdir(mode=0o755)
    marker = str(tmp_path / "marker")
    body = {"__init__": "", "mod": "def optimize(client, seed, width=1, stream=0):\n    return client.seed_candidate\n",
            "prog": "def build():\n    import dspy\n    return dspy.ChainOfThought('question -> answer')\n"}
    for name, tail in body.items():
        (pkg / f"{name}.py").write_text(HOSTILE.format(key=str(ANSWER_KEY), marker=marker, where=name) + tail)
        (pkg / f"{name}.py").chmod(0o644)
    yield code, tmp_path
    shutil.rmtree(code, ignore_errors=True)


def markers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.glob("marker*"))


def heldout_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`heldout ...` typed in ``cwd``, the user's code folder (found there by the cwd rule)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "heldout.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=900)


# -- checked, hashed, planned: nothing of the user's runs ----------------------------------------------
def test_checking_hashing_and_planning_a_user_optimizer_run_none_of_its_code(hostile, monkeypatch):
    pytest.importorskip("dspy", reason="dspy-gepa needs the [dspy] extra")
    code, tmp_path = hostile
    monkeypatch.syspath_prepend(str(code))
    (method,) = parse_methods(["x=pkg.mod:optimize"], [])
    check_optimizer("dspy-gepa?program=pkg.prog:build")
    described = method.describe()
    validate_arms(ArmsSpec(task="lockpicking/six", optimizer="pkg.mod:optimize", budget=8, width=2, seeds=(0, 1, 2),
                           profile="paper"))
    assert markers(tmp_path) == [] and not any(m == "pkg" or m.startswith("pkg.") for m in sys.modules)
    # the hash is of the file's bytes, as before: a record says which version of the code ran
    assert described["code_sha256"] == hashlib.sha256((code / "pkg" / "mod.py").read_bytes()).hexdigest()
    assert optimizer_code_sha256("dspy-gepa?program=pkg.prog:build") != optimizer_code_sha256("dspy-gepa")


def test_a_study_file_naming_user_code_is_read_without_running_it(hostile, monkeypatch):
    pytest.importorskip("dspy", reason="dspy-gepa needs the [dspy] extra")
    code, tmp_path = hostile
    monkeypatch.chdir(code)  # the cwd rule: the user's folder is where heldout looks first
    study = code / "study.toml"
    study.write_text(f'run_dir = "{tmp_path / "study"}"\ntasks = ["bbh/word_sorting"]\nbudget = 40\n'
                     'methods = [{ name = "mine", optimizer = "pkg.mod:optimize" },\n'
                     '           { name = "prog", optimizer = "dspy-gepa", options = { program = "pkg.prog:build" } }]\n')
    assert [c.method.name for c in load_study(study).cells()] == ["mine", "prog"]
    assert markers(tmp_path) == [] and "pkg" not in sys.modules


def test_a_dotted_module_is_found_as_its_file_and_its_top_level_package(hostile):
    code, _ = hostile
    found = find_module_source("pkg.mod", [str(code)])
    assert (found.file, found.top) == ((code / "pkg" / "mod.py").resolve(), (code / "pkg").resolve())
    assert find_module_source("pkg", [str(code)]).file.name == "__init__.py"
    # a regular package of the name in an earlier entry hides a later one, as it would from import
    later = Path(tempfile.mkdtemp(prefix="heldout-test-later-"))
    try:
        (later / "pkg").mkdir()
        (later / "pkg" / "other.py").write_text("def optimize(v, s): pass\n")
        with pytest.raises(HeldoutError, match="no pkg/other.py"):
            find_module_source("pkg.other", [str(code), str(later)])
    finally:
        shutil.rmtree(later)


@pytest.mark.parametrize("source, name, found", [
    ("def optimize(view, seed): pass\n", "optimize", True),
    ("async def optimize(view, seed): pass\n", "optimize", True),
    ("class optimize: pass\n", "optimize", True),
    ("optimize = lambda view, seed: None\n", "optimize", True),
    ("from somewhere import search as optimize\n", "optimize", True),
    ("try:\n    from fast import optimize\nexcept ImportError:\n    optimize = None\n", "optimize", True),
    ("from impl import *\n", "optimize", True),  # the sandbox's import decides
    ("def helper():\n    optimize = 1\n", "optimize", False),  # bound inside a function: its own
    ("class Box:\n    def optimize(self): pass\n", "optimize", False),
    ("[optimize for optimize in ()]\n", "optimize", False),
    ("def optimise(view, seed): pass\n", "optimize", False),
])
def test_the_function_must_be_bound_at_module_level(tmp_path, source, name, found):
    (tmp_path / "user_mod.py").write_text(source)
    target = f"user_mod:{name}"
    if found:
        assert check_function(target, "optimizer", search=[str(tmp_path)]).file.name == "user_mod.py"
    else:
        with pytest.raises(HeldoutError, match="defines no 'optimize' at module level"):
            check_function(target, "optimizer", search=[str(tmp_path)])


def test_options_must_be_keywords_of_a_top_level_def(tmp_path):
    (tmp_path / "opt.py").write_text("def optimize(view, seed, width=1): pass\ndef loose(view, seed, **kw): pass\n")
    check_function("opt:optimize", "optimizer", ["width"], search=[str(tmp_path)])
    check_function("opt:loose", "optimizer", ["width", "stream"], search=[str(tmp_path)])
    with pytest.raises(HeldoutError, match="takes no option stream"):
        check_function("opt:optimize", "optimizer", ["width", "stream"], search=[str(tmp_path)])


def test_source_that_does_not_parse_is_refused_without_running_it(tmp_path):
    (tmp_path / "broken.py").write_text("open('x', 'w')\ndef optimize(:\n")
    with pytest.raises(HeldoutError, match="cannot load optimizer 'broken:optimize': SyntaxError"):
        check_function("broken:optimize", "optimizer", search=[str(tmp_path)])
    assert not (tmp_path / "x").exists()


def test_heldouts_own_module_is_found_in_heldouts_package_not_on_the_users_path(tmp_path, monkeypatch):
    (tmp_path / "heldout").mkdir()
    (tmp_path / "heldout" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert find_module_source("heldout.optimizers.seed").file == Path(heldout.__file__).parent / "optimizers" / "seed.py"
    assert optimizer_target("seed") == "heldout.optimizers.seed:optimize"


# -- whole runs: the code runs, inside only ------------------------------------------------------------
def assert_ran_inside_only(run_dir: Path, tmp_path: Path, harness_output: str, modules: list[str]) -> None:
    assert markers(tmp_path) == [], "the user's module ran in the harness"
    assert "IMPORTED" not in harness_output
    log = (run_dir / LOG_FILE).read_text()
    for name in modules:  # it did run, in the sandbox, where the key is hidden and the marker's folder absent
        assert f"IMPORTED {name} read_key=False wrote_marker=False" in log, log[-2000:]
    record = RunRecord.load(run_dir)
    assert record.status == "ok", record.error
    assert record.isolation.startswith("isolated (bwrap") and record.test_verdicts


@needs_isolation
def test_a_hostile_optimizer_package_runs_only_in_the_sandbox_and_the_run_is_scored(hostile):
    code, tmp_path = hostile
    done = heldout_cli(code, "run", "--task", "lockpicking/six", "--profile", "paper", "--seeds", "0", "--budget", "4",
                   "--optimizer", "x=pkg.mod:optimize", "--run-dir", str(tmp_path / "study"))
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = [p.parent for p in (tmp_path / "study").rglob("run_record.json")]
    assert_ran_inside_only(run_dir, tmp_path, done.stdout + done.stderr, ["__init__", "mod"])


@needs_isolation
def test_a_study_files_hostile_dspy_program_runs_only_in_the_sandbox_and_the_run_is_scored(hostile, data_dir):
    pytest.importorskip("dspy", reason="the [dspy] extra is not installed (CI installs it)")
    code, tmp_path = hostile
    study = code / "study.toml"
    study.write_text(f'run_dir = "{tmp_path / "study"}"\ntasks = ["bbh/word_sorting"]\nbudget = 20\n'
                     f'data_dir = "{data_dir}"\n'
                     '[[methods]]\nname = "prog"\noptimizer = "dspy-gepa"\noptions = { program = "pkg.prog:build" }\n')
    with TestServer() as srv:
        with study.open("a") as out:
            out.write(f'[models]\nworker = "test"\narchitect = "test"\nbase_url = "{srv.base_url}"\n')
        done = heldout_cli(code, "run", str(study))
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = [p.parent for p in (tmp_path / "study").rglob("run_record.json")]
    assert_ran_inside_only(run_dir, tmp_path, done.stdout + done.stderr, ["__init__", "prog"])
    launch = [json.loads(line)["data"] for line in (run_dir / "ledger.jsonl").open()
              if json.loads(line)["kind"] == "optimizer_launch"]
    assert launch[0]["options"] == {"program": "pkg.prog:build"} and launch[0]["readable"] == ["/sandbox/user/pkg"]


@pytest.mark.parametrize("spec, says", [
    ("x=pkg.mod:optimise", "cannot load optimizer 'pkg.mod:optimise': mod.py of 'pkg.mod' defines no 'optimise'"),
    ("x=pkg.nope:optimize", "cannot load optimizer 'pkg.nope:optimize': no pkg/nope.py or pkg/nope/__init__.py"),
    ("dspy-gepa?program=pkg.prog:make", "cannot load the program option's code 'pkg.prog:make': prog.py of "
                                        "'pkg.prog' defines no 'make'"),
])
def test_a_missing_target_is_one_error_line_and_nothing_is_written_or_run(hostile, spec, says):
    code, tmp_path = hostile
    done = heldout_cli(code, "run", "--task", "lockpicking/six", "--profile", "paper", "--budget", "4",
                   "--optimizer", spec, "--run-dir", str(tmp_path / "study"))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("heldout: error: ") and says in done.stderr, done.stderr
    assert not (tmp_path / "study").exists() and markers(tmp_path) == []
