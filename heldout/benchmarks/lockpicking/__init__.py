"""Lockpicking with interference (``lockpicking/six``): the rule engine (:mod:`.rules`), SQL
candidates (:mod:`.sql`), the fixed pool (:mod:`.pool`) and the task (:mod:`.task`)."""

from heldout.benchmarks.lockpicking.rules import MALFORMED, SEED_RULES, TRUTH, Edge, RuleSystem
from heldout.benchmarks.lockpicking.sql import SqlRejected, check_sql, rule_table_sql
from heldout.benchmarks.lockpicking.task import BENCHMARK, LockpickingBenchmark
from heldout.benchmarks.registry import register

register(BENCHMARK)

__all__ = ["BENCHMARK", "Edge", "LockpickingBenchmark", "MALFORMED", "RuleSystem", "SEED_RULES", "SqlRejected",
           "TRUTH", "check_sql", "rule_table_sql"]
