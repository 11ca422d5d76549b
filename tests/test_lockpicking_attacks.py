"""Hostile SQL candidates: rejected before execution with a clear error, or stopped by the
execution limits; either way every example scores 0 and the diagnostic names the cause."""

from __future__ import annotations

from pathlib import Path
import duckdb
import pytest

from heldout.contracts import Example, RunLimits
from heldout.benchmarks.lockpicking import sql as sqlmod
from heldout.benchmarks.lockpicking.task import BENCHMARK, LockpickingBenchmark
from heldout.sandbox import wall_backstop

# the CoCoEvolve champion (the full rule set as SQL): a test fixture, never shipped in the package
CHAMPION = {"scorer.sql": (Path(__file__).resolve().parent / "fixtures" / "lockpicking_champion.sql").read_text(encoding="utf-8")}

EXAMPLE = Example("six-p01", {"program": "429405"}, 4)
MANIFEST = "heldout/data_manifests/lockpicking/six.json"

ATTACKS = {
    "read_csv": ("read_csv('../shared/data/SOURCES.md')", "READ_CSV"),
    "read_csv in a subquery": ("(SELECT COUNT(*) FROM read_csv('/etc/passwd'))", "not allowed"),
    "read the manifest": (f"LENGTH(READ_TEXT('{MANIFEST}'))", "READ_TEXT"),
    "read the manifest as json": (f"(SELECT COUNT(*) FROM read_json('{MANIFEST}'))", "not allowed"),
    "copy to": ("COPY (SELECT 1) TO 'owned.csv'", "statements are not allowed"),
    "copy into": ("COPY INTO @stage FROM (SELECT PROGRAM)", "statements are not allowed"),
    "attach": ("ATTACH 'owned.db' AS owned", "statements are not allowed"),
    "install": ("INSTALL httpfs", "statements are not allowed"),
    "load": ("LOAD httpfs", "statements are not allowed"),
    "pragma": ("PRAGMA database_list", "statements are not allowed"),
    "set": ("SET enable_external_access = true", "statements are not allowed"),
    "stacked statements": ("1; DROP TABLE examples", "several statements"),
    "trailing statement": ("IFF(PROGRAM = '1', 1, 0); ATTACH 'x.db'", "several statements"),
    "never-ending cross join (Snowflake)": (
        "(SELECT COUNT(*) FROM TABLE(GENERATOR(ROWCOUNT => 1000000000)) a, "
        "TABLE(GENERATOR(ROWCOUNT => 1000000000)) b)", "not allowed"),
    "never-ending cross join (DuckDB)": ("(SELECT count(*) FROM range(1000000000) a, range(1000000000) b)",
                                         "not allowed"),
    "scalar subquery over the examples": ("(SELECT MAX(PROGRAM) FROM examples)", "not allowed"),
    "other column": ("IFF(i > 3, 1, 0)", "unknown column"),
    "qualified column": ("LENGTH(examples.PROGRAM)", "unknown column"),
    "memory amplifier": ("LENGTH(REPEAT(PROGRAM, 1000000000))", "REPEAT"),
    "padding amplifier": ("LENGTH(LPAD(PROGRAM, 2000000000, 'x'))", "not allowed"),
    "environment": ("LENGTH(GETENV('HOME'))", "GETENV"),
    "unknown function": ("MY_UDF(PROGRAM)", "MY_UDF"),
    "the internal worker UDF": ("heldout_ai_complete(PROGRAM)", "HELDOUT_AI_COMPLETE"),
    "Cortex namespace": ("SNOWFLAKE.CORTEX.COMPLETE('m', PROGRAM)", "not allowed"),
    "random": ("UNIFORM(0, 6, RANDOM())", "not allowed"),
    "10 MB literal": ("'" + "1" * (10 * 1024 * 1024) + "'", "limit is 65536 bytes"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_is_rejected_before_execution(name, monkeypatch):
    body, message = ATTACKS[name]
    executed = []
    monkeypatch.setattr(sqlmod, "execute", lambda *a, **k: executed.append(a))
    verdict = LockpickingBenchmark().run({"scorer.sql": body}, EXAMPLE)
    assert verdict.score == 0 and not verdict.valid
    assert verdict.error_kind in ("forbidden", "malformed_candidate")
    assert message.lower() in verdict.error.lower(), verdict.error
    assert verdict.error.startswith("SQL candidate rejected:")
    assert executed == []


def test_rejected_candidate_summary_names_the_error_and_skips_the_exhaustive_check():
    candidate = {"scorer.sql": ATTACKS["install"][0]}
    verdicts = [BENCHMARK.run(candidate, EXAMPLE)]
    summary = BENCHMARK.summarize(candidate, verdicts)
    assert summary["score"] == 0 and summary["correct"] == 0
    assert "statements are not allowed" in summary["error"] and summary["exhaustive_accuracy"] is None


def test_a_query_that_never_ends_is_stopped_by_the_wall_clock_limit():
    con = sqlmod._connect(256)
    with pytest.raises(sqlmod.SqlExecutionError) as err:
        sqlmod.run_query(con, "SELECT count(*) FROM range(1000000000) a, range(1000000000) b", 0.5)
    assert err.value.kind == "timeout" and "timeout after 0.5 s wall" in str(err.value)


def test_the_default_limits_are_cpu_time_with_the_wall_clock_only_a_backstop():
    # A loaded machine (the CI run that found this: two workers and a Ray cluster on two cores)
    # stretched a pool batch past the old 30 s wall limit, and the candidate scored 0 on those
    # examples: a verdict that depended on the machine, and an infrastructure failure as a score.
    limits = LockpickingBenchmark.default_limits
    assert limits.wall_seconds == wall_backstop(limits.cpu_seconds)


def test_an_accepted_candidate_over_its_time_limit_scores_zero_with_a_timeout():
    limits = RunLimits(cpu_seconds=60, wall_seconds=0.05)  # the sandbox stops it at its wall backstop
    result = LockpickingBenchmark().exhaustive(CHAMPION, limits)
    assert result["exhaustive_accuracy"] is None and "timeout after 0.05 s wall" in result["exhaustive_error"]


@pytest.mark.parametrize("query", [
    "SELECT * FROM read_csv('{dir}/secret.csv')",
    "COPY (SELECT 1) TO '{dir}/owned.csv'",
    "ATTACH '{dir}/owned.db' AS owned",
    "INSTALL httpfs",
    "SET enable_external_access = true",
])
def test_the_execution_connection_is_locked_down_even_for_sql_that_got_past_validation(query, tmp_path):
    # Defence in depth: the DuckDB the candidate runs in has no file system, no extension
    # installs and a locked configuration, so even an allow-list hole could not read or write.
    (tmp_path / "secret.csv").write_text("a\n1\n")
    con = sqlmod._connect(256)
    sqlmod._load(con, ["729405"], all_six_digit=False)
    with pytest.raises(sqlmod.SqlExecutionError, match="execution failed"):
        sqlmod.run_query(con, query.format(dir=tmp_path), 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.csv"]


def test_the_memory_and_thread_limits_are_applied_and_locked():
    con = sqlmod._connect(64)
    sqlmod._load(con, ["729405"], all_six_digit=False)
    assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0].startswith(("64", "61"))
    assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
    with pytest.raises(duckdb.Error, match="lock"):
        con.execute("SET memory_limit = '10GB'")
