"""The CLI starts light, and the parser's copied choices stay equal to their modules' constants."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("numba", "scipy", "statsmodels", "matplotlib", "datasets", "duckdb")


def _loaded_after(code: str) -> list[str]:
    probe = code + f"\nimport sys\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return [m for m in out.strip().split(",") if m]


def test_importing_the_cli_loads_no_heavy_module():
    assert _loaded_after("import heldout.cli") == []


def test_building_the_parser_for_help_loads_no_heavy_module():
    # `heldout --help` builds the whole parser: its choices must not pull the statistics or reports in
    assert _loaded_after("import heldout.cli as c\nc.build_parser().format_help()") == []


@pytest.mark.parametrize("name,module,attr", [
    ("FIXED_UNITS", "heldout.protocols.arms", "FIXED_UNITS"),
    ("DEFAULT_MARGIN", "heldout.protocols.stats.margin", "DEFAULT_MARGIN"),
    ("PAPER_FORMATS", "heldout.reports.paper", "FORMATS"),
    ("DESIGN_FIELDS", "heldout.reports.check", "DESIGN_FIELDS"),
    ("TABLES", "heldout.reports.store", "TABLES"),
])
def test_the_parsers_copied_choices_equal_their_source(name, module, attr):
    import importlib

    import heldout.cli as cli
    assert getattr(cli, name) == getattr(importlib.import_module(module), attr)
