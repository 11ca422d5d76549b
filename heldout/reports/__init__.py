"""Reports: tables, figures, Markdown/HTML/JSON rendering, and the CI regression check, all
computed from verified run records (:mod:`heldout.reports.collect`)."""

from heldout.reports.check import CheckResult, check_runs
from heldout.reports.collect import Excluded, ReportError, Run, RunSet, collect_runs
from heldout.reports.render import Report, build_report, write_report

__all__ = ["CheckResult", "Excluded", "Report", "ReportError", "Run", "RunSet", "build_report",
           "check_runs", "collect_runs", "write_report"]
