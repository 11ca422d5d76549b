"""An optimizer plugin installed the way docs/plug-an-optimizer.md says, ``pip install -e .``,
runs by its entry-point name: isolated by default, in-process under ``--trusted-optimizer``, and
with ``--method-option NAME.KEY=VALUE``.

A flat-layout editable install is an import hook (setuptools' ``__editable___*_finder``), not a
folder on ``sys.path``; the harness reads the hook's mapping as text and never imports it. The
plugin's code is taken from where its distribution put it, never from the working directory, even
when the working directory holds a package of the same name (the adversary here: a decoy
``rs_opt/`` that would write a marker and return a different candidate).

The install is real: a throw-away venv that sees this interpreter's packages (a ``.pth`` that adds
its site dir), and ``pip install --no-deps --no-build-isolation --no-index -e``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from doc_blocks import offline_venv
from heldout.sandbox import isolation_mode

REPO = Path(__file__).resolve().parents[1]
needs_isolation = pytest.mark.skipif(isolation_mode() == "none", reason="bubblewrap is not available here")

PYPROJECT = '''\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "rs-opt"
version = "0.1"

[project.entry-points."heldout.optimizers"]
rs-search = "rs_opt.search:optimize"

[tool.setuptools]
packages = ["rs_opt"]
'''
SEARCH = '''\
from rs_opt.helper import CHOSEN  # the plugin's own sibling module


def optimize(view, seed, width=1):
    candidate = dict(view.seed_candidate)
    view.record_event("plugin", chosen=CHOSEN, width=width)
    return candidate
'''
DECOY = '''\
import os
open(os.path.join({markers!r}, "decoy"), "w").close()
def optimize(view, seed, width=1):
    raise SystemExit("the decoy ran")
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(python, project)``: a venv holding ``rs-opt`` installed editable by pip."""
    root = tmp_path_factory.mktemp("editable")
    root.chmod(0o755)
    project = root / "rs-opt"
    (project / "rs_opt").mkdir(parents=True)
    (project / "pyproject.toml").write_text(PYPROJECT)
    (project / "rs_opt" / "__init__.py").write_text("")
    (project / "rs_opt" / "helper.py").write_text('CHOSEN = "installed"\n')
    (project / "rs_opt" / "search.py").write_text(SEARCH)
    for path in [project, *project.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    python = offline_venv(root / "venv") / "python"  # sees this interpreter's heldout, pip and setuptools
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    pip = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                          "--disable-pip-version-check", "-q", "-e", str(project)],
                         capture_output=True, text=True, timeout=600, cwd=root)
    assert pip.returncode == 0, pip.stderr[-3000:]
    finders = list(Path(site).glob("__editable___rs_opt*_finder.py"))
    assert finders, f"setuptools made no editable finder: {sorted(p.name for p in Path(site).iterdir())}"
    return python, project


@pytest.fixture
def decoy_cwd(tmp_path):
    """A working directory holding a package of the plugin's module name, and the marker folder."""
    markers = tmp_path / "markers"
    markers.mkdir()
    (tmp_path / "rs_opt").mkdir()
    (tmp_path / "rs_opt" / "__init__.py").write_text(DECOY.format(markers=str(markers)))
    (tmp_path / "rs_opt" / "search.py").write_text(DECOY.format(markers=str(markers)))
    return tmp_path, markers


def heldout(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HELDOUT_TRUSTED_OPTIMIZER")}
    return subprocess.run([python, "-m", "heldout", *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=600)


def ledger_events(run_dir: Path, kind: str) -> list[dict]:
    events = [json.loads(line) for line in (run_dir / "ledger.jsonl").open()]
    return [e["data"] for e in events if e["kind"] == kind]


def only_run(root: Path) -> tuple[Path, dict]:
    (path,) = root.rglob("run_record.json")
    return path.parent, json.loads(path.read_text())


def test_the_editable_plugin_is_found_through_the_finders_mapping_not_the_working_directory(installed, decoy_cwd):
    python, project = installed
    cwd, markers = decoy_cwd
    code = ("from heldout.optimizers import locate_target, optimizer_code_sha256\n"
            "found = locate_target('rs-search')\nprint(found.file)\nprint(optimizer_code_sha256('rs-search'))\n")
    done = subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    file, digest = done.stdout.split()
    assert Path(file) == project / "rs_opt" / "search.py"
    assert digest == hashlib.sha256((project / "rs_opt" / "search.py").read_bytes()).hexdigest()
    assert list(markers.iterdir()) == []


@needs_isolation
def test_an_editable_plugin_runs_isolated_by_its_name_with_its_method_option(installed, decoy_cwd):
    python, project = installed
    cwd, markers = decoy_cwd
    done = heldout(python, cwd, "run", "--task", "lockpicking/six", "--profile", "paper", "--seeds", "0",
                   "--budget", "4", "--optimizer", "rs-search", "--optimizer", "seed",
                   "--method-option", "rs-search.width=3", "--run-dir", str(cwd / "study"))
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir, record = only_run(cwd / "study" / "lockpicking__six" / "rs-search")
    assert record["status"] == "ok", record.get("error")
    assert record["isolation"].startswith("isolated (bwrap")
    assert record["experiment"]["optimizer"]["target"] == "rs_opt.search:optimize"
    assert record["experiment"]["optimizer"]["options"] == {"width": 3}
    assert record["experiment"]["optimizer"]["code_sha256"] == \
        hashlib.sha256((project / "rs_opt" / "search.py").read_bytes()).hexdigest()
    assert ledger_events(run_dir, "optimizer_launch")[0]["readable"] == ["/sandbox/user/rs_opt"]
    assert list(markers.iterdir()) == []


def test_an_editable_plugin_runs_in_process_when_the_person_trusts_it(installed, decoy_cwd):
    python, project = installed
    cwd, markers = decoy_cwd
    done = heldout(python, cwd, "run", "--task", "lockpicking/six", "--profile", "paper", "--seeds", "0",
                   "--budget", "4", "--optimizer", "rs-search", "--trusted-optimizer",
                   "--method-option", "rs-search.width=2", "--run-dir", str(cwd / "study"))
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir, record = only_run(cwd / "study")
    assert record["status"] == "ok" and record["isolation"] == "in-process (trusted)", record.get("error")
    told = [e["data"] for e in ledger_events(run_dir, "optimizer_event") if e["kind"] == "plugin"]
    assert told == [{"chosen": "installed", "width": 2}]  # the installed code, its sibling, the flag's option
    assert list(markers.iterdir()) == []


def test_a_method_option_the_plugin_does_not_take_is_one_line_in_the_flags_words(installed, decoy_cwd):
    python, _ = installed
    cwd, _ = decoy_cwd
    done = heldout(python, cwd, "run", "--task", "lockpicking/six", "--profile", "paper", "--budget", "4",
                   "--optimizer", "rs-search", "--method-option", "rs-search.stream=1", "--run-dir", str(cwd / "study"))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "takes no option stream" in done.stderr and "methods[" not in done.stderr
    assert "trusted_optimizer" not in done.stderr and not (cwd / "study").exists()


def test_a_src_layout_editable_plugin_is_found_in_its_src_folder(installed, decoy_cwd, tmp_path):
    # a src layout: setuptools installs it editable as a .pth naming src/ (or a finder); both are read as text
    python, _ = installed
    cwd, markers = decoy_cwd
    project = tmp_path / "rs-src"
    (project / "src" / "rs_src").mkdir(parents=True)
    (project / "pyproject.toml").write_text(PYPROJECT.replace('name = "rs-opt"', 'name = "rs-src"')
                                            .replace('rs-search = "rs_opt.search:optimize"',
                                                     'rs-src-search = "rs_src.search:optimize"')
                                            .replace('packages = ["rs_opt"]',
                                                     'packages = ["rs_src"]\npackage-dir = {"" = "src"}'))
    (project / "src" / "rs_src" / "__init__.py").write_text("")
    (project / "src" / "rs_src" / "search.py").write_text("def optimize(view, seed):\n    return view.seed_candidate\n")
    pip = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                          "--disable-pip-version-check", "-q", "-e", str(project)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert pip.returncode == 0, pip.stderr[-3000:]
    code = "from heldout.optimizers import locate_target\nprint(locate_target('rs-src-search').file)\n"
    done = subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.strip()) == project / "src" / "rs_src" / "search.py"
    assert list(markers.iterdir()) == []
