"""Reports: tables, figures, Markdown/HTML/JSON rendering, and the CI regression check, all
computed from verified run records (:mod:`heldout.reports.collect`).

The names below are loaded when first asked for (PEP 562): a command that reads one module of
the package (``runs query``'s store, ``export``) does not pay for the statistics and plotting
libraries the regression check and the renderer import (about 2 CPU-s a cold process)."""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {"CheckResult": "check", "check_runs": "check", "Excluded": "collect", "ReportError": "collect",
         "Run": "collect", "RunSet": "collect", "collect_runs": "collect", "Report": "render",
         "build_report": "render", "write_report": "render"}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'heldout.reports' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"heldout.reports.{module}"), name)
    globals()[name] = value
    return value


__all__ = sorted(_HOME)
