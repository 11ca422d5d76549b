"""Shared fixtures. Real-data tests find the files at $HELDOUT_DATA_DIR or ../shared/data (relative
to the repo root) and are skipped with a clear reason when neither exists; CI has them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


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
os.environ["HELDOUT_LEDGER_KEY"] = os.path.join(tempfile.mkdtemp(prefix="heldout-test-config-"), "ledger.key")


# `slow`: the measured list in slow_tests.txt (a test id, a test function with all its parameter sets, or
# a module whose shared fixture is the cost)
_SLOW = {line.strip() for line in (Path(__file__).parent / "slow_tests.txt").read_text().splitlines()
         if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if {item.nodeid, item.nodeid.split("[")[0], item.nodeid.split("::")[0]} & _SLOW:
            item.add_marker(pytest.mark.slow)
