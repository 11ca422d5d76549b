"""Shared fixtures. Real-data tests find the files at $HELDOUT_DATA_DIR or ../shared/data (relative
to the repo root) and are skipped with a clear reason when neither exists; CI has them."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from warm_cli import WarmCli

REPO_ROOT = Path(__file__).resolve().parents[1]


def keep_compiled_modules() -> None:
    """Where writing bytecode is off (PYTHONDONTWRITEBYTECODE=1, as on the shared dev machine),
    every pytest process compiled every test module's assertion rewrite and heldout's modules again
    on every run: about 6 of the 15.8 CPU-s a pytest process spent collecting the suite. Each keeps
    them in a bytecode folder of this user's own under the temp dir instead (never beside the
    sources, never in a test's folder), read only if no one else can write it, as the MBPP+ truths
    are (a planted .pyc would run code); the interpreters the tests start share it."""
    if not sys.dont_write_bytecode:
        return  # bytecode is kept beside the sources as usual
    base = Path(tempfile.gettempdir()) / f"heldout-tests-{os.getuid()}"
    prefix = base / "pycache"
    try:
        prefix.mkdir(mode=0o700, parents=True, exist_ok=True)
        private = all(p.lstat().st_uid == os.getuid() and not p.lstat().st_mode & (stat.S_IWGRP | stat.S_IWOTH)
                      and not stat.S_ISLNK(p.lstat().st_mode) for p in (base, prefix))
    except OSError:
        return
    if private:
        sys.pycache_prefix, sys.dont_write_bytecode = str(prefix), False
        # ... and so does every interpreter a test starts with this environment (a heldout command,
        # the warm CLI server, a Ray worker, a docs block's shell): each compiled heldout's modules
        # again, 0.2 (tasks list) to 0.6 (the warm server's imports) of its 1-3 CPU-s start. A
        # sandboxed or isolated process gets an environment of its own, without either variable.
        os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


keep_compiled_modules()


def find_data_dir() -> Path | None:
    env = os.environ.get("HELDOUT_DATA_DIR")
    for candidate in ([Path(env)] if env else []) + [REPO_ROOT.parent / "shared" / "data"]:
        if candidate.is_dir():
            return candidate.resolve()
    return None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    found = find_data_dir()
    if found is None:
        pytest.skip("real data not found: set HELDOUT_DATA_DIR or place it at ../shared/data")
    return found


@pytest.fixture(scope="session")
def shared_dir(data_dir: Path) -> Path:
    """../shared (specs, constructions) next to the data dir."""
    return data_dir.parent


# Ledger heads are anchored with a key in the user's config dir; the tests use a key of their own
# (set at import, so module-level environments built for CLI subprocesses inherit it too).
_TEST_CONFIG = tempfile.mkdtemp(prefix="heldout-test-config-")
os.environ["HELDOUT_LEDGER_KEY"] = os.path.join(_TEST_CONFIG, "ledger.key")
# ... and sign them with a signing key of their own (never the user's ~/.config/heldout/signing.key)
os.environ["HELDOUT_SIGNING_KEY_FILE"] = os.path.join(_TEST_CONFIG, "signing.key")
os.environ.pop("HELDOUT_SIGNING_KEY", None)


@pytest.fixture(scope="session")
def warm_cli():
    """The real ``heldout`` command for tests about what a command answers, not how the interpreter
    starts: each call a process of its own, forked from one server (per pytest worker) that imported
    heldout once (tests/warm_cli.py says what it cannot show). Stateless between calls."""
    warm = WarmCli()
    yield warm
    warm.close()


# `slow`: the measured list in slow_tests.txt (a test id, a test function with all its parameter sets, or
# a module whose shared fixture is the cost)
_SLOW = {line.strip() for line in (Path(__file__).parent / "slow_tests.txt").read_text().splitlines()
         if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if {item.nodeid, item.nodeid.split("[")[0], item.nodeid.split("::")[0]} & _SLOW:
            item.add_marker(pytest.mark.slow)


# Modules whose module-scoped fixtures are costly (a 10,000-cell study, finished studies, Ray
# clusters, the gate's run sets) run whole on one pytest-xdist worker, so each fixture is built once
# rather than once per worker; every other test is scheduled on its own. The two Ray modules are one
# unit: two Ray clusters at once on a 2-core machine starve each other (a cell's Ray worker died with
# OwnerDiedError). pytest-xdist's own `xdist_group` mark does this by renaming node ids, which
# pytest 9.2 no longer lets a plugin do (the mark was silently ignored), so the scheduler groups here.
ONE_WORKER_MODULES = ("arms", "attacks_optimizers", "bundle", "demo_protocol", "extension", "generalisation_protocol",
                      "hostile_inputs", "inspect_export", "leak_readings", "leakage", "metric_direction",
                      "optimizer_direction", "paper_and_drilldown", "plugin_editable_install", "ray_cluster",
                      "ray_executor", "recipe_baseline", "report_bounds_and_latex", "reports", "results_store",
                      "resume_kill", "signatures", "stats_check", "stats_margin", "verify")
SHARED_UNIT = {"ray_cluster": "ray", "ray_executor": "ray"}
ONE_WORKER_UNITS = {f"tests/test_{name}.py": SHARED_UNIT.get(name, name) for name in ONE_WORKER_MODULES}


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadgroup":
        return None  # another --dist mode asked for: xdist's own scheduler
    from xdist.scheduler import LoadScopeScheduling  # only under xdist, which calls this hook

    class UnitOrTestScheduling(LoadScopeScheduling):
        """A listed module is (part of) one unit of work, any other test its own; units with more
        tests go first (xdist's default order for scopes), so the large ones do not end the run."""

        def _split_scope(self, nodeid: str) -> str:
            return ONE_WORKER_UNITS.get(nodeid.split("::", 1)[0], nodeid)

    return UnitOrTestScheduling(config, log)
