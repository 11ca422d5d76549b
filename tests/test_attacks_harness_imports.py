"""The adversary: an optimizer's repository that ships modules named like the harness's own lazy
imports (``typing_extensions.py``, ``sniffio.py``, ``gepa.py``, a ``numpy/`` package, a
``sitecustomize.py``), each of which would run its body in the harness's process (as the user,
with the ledger key readable) the moment the harness imported it from the working directory. The
docs have the user type ``heldout run`` in that folder.

The harness never puts the working directory on its import path and never imports from a user's
folder: user code is found by path and runs isolated, or, under the person's own
``--trusted-optimizer`` (or ``HELDOUT_TRUSTED_OPTIMIZER=1``), is loaded from its file under a name
of its own. So no marker appears, however heldout is started (``python -m heldout``, the console
script, ``PYTHONPATH=.``), with or without reference baselines beside the method. A control shows
the markers do appear when the folder really is on the harness's path, so these tests can fail.
And a file never grants trust: a study file that asks for it is refused in one line naming the flag.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from heldout.evaluators.records import RunRecord
from heldout.sandbox import isolation_mode

REPO = Path(__file__).resolve().parents[1]
needs_isolation = pytest.mark.skipif(isolation_mode() == "none", reason="bubblewrap is not available here")

SHADOW = '''\
import os
try:  # in the harness the marker's folder exists; in a sandbox it does not
    open(os.path.join({markers!r}, {name!r} + "--" + __name__), "w").close()
except OSError:
    pass
'''
SHADOWS = ("typing.py", "typing_extensions.py", "sniffio.py", "gepa.py", "numpy/__init__.py", "httpx.py", "sitecustomize.py",
           "usercustomize.py", "heldout_shadow.pth")

OPTIMIZER = '''\
def optimize(view, seed):
    from myopt import helper  # a sibling of the user's own package: still importable to it
    import typing_extensions  # the real one, never the folder's
    assert helper.VALUE == 7 and hasattr(typing_extensions, "Protocol")
    return dict(view.seed_candidate)
'''


@pytest.fixture
def shadowed(tmp_path):
    """A code folder (readable by the sandbox's uid) holding the shadow modules and the user's
    optimizer package ``myopt``; the markers go to ``tmp_path/markers``, which no sandbox sees."""
    code = Path(tempfile.mkdtemp(prefix="heldout-test-shadow-"))
    code.chmod(0o755)
    markers = tmp_path / "markers"
    markers.mkdir()
    for name in SHADOWS:
        path = code / name
        path.parent.mkdir(exist_ok=True)
        text = SHADOW.format(markers=str(markers), name=name.split("/")[0].removesuffix(".py"))
        if name.endswith(".pth"):  # a .pth is read only in a site dir: never from the working directory
            text = f"import os; open(os.path.join({str(markers)!r}, 'pth'), 'w').close()\n"
        path.write_text(text)
    (code / "myopt").mkdir()
    (code / "myopt" / "__init__.py").write_text("")
    (code / "myopt" / "helper.py").write_text("VALUE = 7\n")
    (code / "myopt" / "search.py").write_text(OPTIMIZER)
    for path in [code, *code.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield code, markers
    shutil.rmtree(code, ignore_errors=True)


def heldout(code: Path, launcher: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``heldout ARGS`` typed in the user's folder ``code``, started the way ``launcher`` says."""
    given, env = env or {}, dict(os.environ)
    env.pop("HELDOUT_TRUSTED_OPTIMIZER", None)  # trust only when a test grants it
    env.update(given)
    if launcher == "module":  # python -m heldout: -m puts the working directory first on sys.path
        argv, env["PYTHONPATH"] = [sys.executable, "-m", "heldout"], str(REPO)
    elif launcher == "script":  # the console script, as installed
        argv = [str(Path(sys.executable).with_name("heldout"))]
    else:  # the console script with PYTHONPATH=. (what the docs once said)
        argv, env["PYTHONPATH"] = [str(Path(sys.executable).with_name("heldout"))], "."
    if launcher != "module" and not Path(argv[0]).exists():
        pytest.skip("the heldout console script is not installed beside this interpreter")
    return subprocess.run([*argv, *args], cwd=code, capture_output=True, text=True, env=env, timeout=600)


def records(root: Path) -> dict[str, RunRecord]:
    return {p.parent.parent.name: RunRecord.load(p.parent) for p in root.rglob("run_record.json")}


LOCKPICKING = ("--task", "lockpicking/six", "--profile", "paper", "--seeds", "0")


@needs_isolation
@pytest.mark.parametrize("launcher", ["module", "script", "script-with-pythonpath-dot"])
def test_an_isolated_optimizer_beside_the_seed_baseline_imports_nothing_from_its_folder(shadowed, tmp_path, launcher):
    code, markers = shadowed
    done = heldout(code, launcher, "run", *LOCKPICKING, "--budget", "4", "--optimizer", "mine=myopt.search:optimize",
                   "--optimizer", "seed", "--run-dir", str(tmp_path / "study"))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = sorted(p.name for p in markers.iterdir())
    if launcher == "script-with-pythonpath-dot":  # Python itself runs the folder's start-up hooks then,
        seen = [m for m in seen if not m.startswith(("sitecustomize--", "usercustomize--"))]  # before heldout
    assert seen == []
    found = records(tmp_path / "study")
    assert found["mine"].status == found["seed"].status == "ok", found["mine"].error
    assert found["mine"].isolation.startswith("isolated (bwrap")


@pytest.mark.parametrize("grant", ["flag", "environment"])
def test_a_trusted_optimizer_is_loaded_under_its_own_name_and_its_folder_shadows_nothing(shadowed, tmp_path, grant):
    code, markers = shadowed
    trust = ["--trusted-optimizer"] if grant == "flag" else []
    env = {"HELDOUT_TRUSTED_OPTIMIZER": "1"} if grant == "environment" else {}
    done = heldout(code, "module", "run", *LOCKPICKING, "--budget", "24", *trust,
                   "--optimizer", "mine=myopt.search:optimize", "--optimizer", "seed", "--optimizer", "local-search",
                   "--run-dir", str(tmp_path / "study"), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in markers.iterdir()) == []
    found = records(tmp_path / "study")
    assert {m: r.status for m, r in found.items()} == {"mine": "ok", "seed": "ok", "local-search": "ok"}, \
        found["mine"].error
    assert found["mine"].isolation == "in-process (trusted)"


@needs_isolation
def test_the_users_module_named_like_a_harness_import_runs_isolated_and_the_real_one_serves_the_harness(
        shadowed, tmp_path):
    # the user's optimizer is itself gepa.py: found by path, run in the sandbox (where the marker's
    # folder is absent), never imported by the harness
    pytest.importorskip("gepa", reason="the [gepa] extra is not installed (CI installs it)")
    code, markers = shadowed
    (code / "gepa.py").write_text((code / "gepa.py").read_text() + "def optimize(client, seed):\n"
                                  "    return client.seed_candidate\n")
    done = heldout(code, "module", "run", *LOCKPICKING, "--budget", "4", "--optimizer", "mine=gepa:optimize",
                   "--optimizer", "seed", "--run-dir", str(tmp_path / "study"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in markers.iterdir()) == []  # not in the harness; inside, the marker dir is absent
    assert records(tmp_path / "study")["mine"].status == "ok"


def test_control_the_markers_do_appear_when_the_folder_is_on_the_harness_path(shadowed, tmp_path):
    # what the tests above would see if the harness imported from the user's folder: the lazy
    # imports of a run (here: the seed baseline) take the folder's modules
    code, markers = shadowed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), str(REPO)])}
    done = subprocess.run([sys.executable, "-m", "heldout", "run", *LOCKPICKING, "--budget", "4", "--optimizer",
                           "seed", "--run-dir", str(tmp_path / "study")], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=600)
    assert any(p.name.startswith(("typing_extensions--", "sitecustomize--")) for p in markers.iterdir())


# -- trust comes from the person, never from a file ----------------------------------------------------
def test_a_study_file_that_grants_itself_trust_is_refused_naming_the_flag(shadowed, tmp_path):
    code, markers = shadowed
    study = code / "study.toml"
    study.write_text(f'run_dir = "{tmp_path / "study"}"\ntasks = ["lockpicking/six"]\nprofiles = ["paper"]\n'
                     'budget = 4\ntrusted_optimizer = true\n'
                     'methods = [{ name = "mine", optimizer = "myopt.search:optimize" }]\n')
    for extra in ([], ["--trusted-optimizer"]):  # the person's flag does not make the file's request acceptable
        done = heldout(code, "module", "run", str(study), *extra)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert "trusted_optimizer = true is refused" in done.stderr and "--trusted-optimizer" in done.stderr
        assert "HELDOUT_TRUSTED_OPTIMIZER=1" in done.stderr
    assert not (tmp_path / "study").exists() and sorted(p.name for p in markers.iterdir()) == []


def test_the_person_grants_trust_to_a_study_file_with_the_flag(shadowed, tmp_path):
    code, markers = shadowed
    study = code / "study.toml"
    study.write_text(f'run_dir = "{tmp_path / "study"}"\ntasks = ["lockpicking/six"]\nprofiles = ["paper"]\n'
                     'budget = 4\nmethods = [{ name = "mine", optimizer = "myopt.search:optimize" }]\n')
    done = heldout(code, "module", "run", str(study), "--trusted-optimizer")
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = records(tmp_path / "study").values()
    assert record.status == "ok" and record.isolation == "in-process (trusted)"
    saved = (tmp_path / "study" / "study.toml").read_text()
    assert "trusted_optimizer" not in saved  # the resolved file, rerun, asks for nothing
    assert sorted(p.name for p in markers.iterdir()) == []


def test_the_resolved_study_json_records_who_granted_trust_as_a_setting(shadowed, tmp_path):
    code, _ = shadowed
    done = heldout(code, "module", "run", *LOCKPICKING, "--budget", "4", "--trusted-optimizer", "--optimizer",
                   "mine=myopt.search:optimize", "--run-dir", str(tmp_path / "study"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "study" / "study.json").read_text())["config.trusted_optimizer"] is True


# -- in-process: the trusted loader's rules ----------------------------------------------------------
def test_a_trusted_modules_sibling_serves_its_own_imports_only_never_the_harness(tmp_path):
    """The user's folder holds ``zz_optional_dep.py``, a name nothing installed provides (like an
    optional dependency the harness probes with ``try: import``). The trusted module imports it as
    its sibling; the harness's own import of that name still fails, and the module never takes
    the place of ``json``."""
    import importlib

    from heldout.optimizers.user_modules import UserModule, load_trusted_function
    folder = tmp_path / "trusted"
    folder.mkdir()
    (folder / "zz_optional_dep.py").write_text("WHO = 'sibling'\n")
    (folder / "json.py").write_text("raise SystemExit('the folder json ran')\n")
    (folder / "zz_trusted_opt.py").write_text(
        "import json\nimport zz_optional_dep\n\ndef optimize(view, seed):\n    return zz_optional_dep.WHO, json.dumps(1)\n")
    found = UserModule("zz_trusted_opt", folder / "zz_trusted_opt.py", folder / "zz_trusted_opt.py")
    optimize = load_trusted_function(found, "optimize", "optimizer")
    assert optimize(None, 0) == ("sibling", "1")
    assert optimize.__module__.startswith("heldout_user_") and "zz_trusted_opt" not in sys.modules
    sys.modules.pop("zz_optional_dep", None)
    with pytest.raises(ImportError):
        importlib.import_module("zz_optional_dep")  # asked by code outside the user's folder
