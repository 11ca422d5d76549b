"""The fast exhaustive check (issue 19): repeated substrings of PROGRAM computed once per row,
every string read from one filled table, a lone digit read without the regex, the outputs sent in
the narrowest integer type that holds them. Every candidate must get the
same outputs (value and validity, string by string) as the plain translation, and the plain
translation the same as the per-example path."""

from __future__ import annotations

import base64
import random
from pathlib import Path

import numpy as np
import pytest

from heldout.benchmarks.lockpicking import sql as sqlmod
from heldout.contracts import RunLimits
from heldout.benchmarks.lockpicking import sql_child
from heldout.benchmarks.lockpicking.rules import MALFORMED, SEED_RULES, TRUTH
from heldout.benchmarks.lockpicking.task import BENCHMARK

CANDIDATES = {
    "champion": (Path(__file__).resolve().parent / "fixtures" / "lockpicking_champion.sql").read_text(encoding="utf-8"),
    "seed rules": sqlmod.rule_table_sql(SEED_RULES),
    "truth rules": sqlmod.rule_table_sql(TRUTH),
    # Snowflake SUBSTR edge positions (0 is 1, negative counts from the end, past the end is '')
    "edge positions": "CAST((SUBSTR(PROGRAM, 0, 1) = SUBSTR(PROGRAM, 0, 1)) AS INT) + LENGTH(SUBSTR(PROGRAM, -2, 5))"
                      " + LENGTH(SUBSTR(PROGRAM, -2, 5)) + LENGTH(SUBSTR(PROGRAM, 9, 1)) + LENGTH(SUBSTR(PROGRAM, 9, 1))",
    "left right upper": "IFF(LEFT(PROGRAM, 2) = '12' OR LEFT(PROGRAM, 2) = '34', 1, 0) + IFF(RIGHT(PROGRAM, 1) IN"
                        " ('5', '7'), 2, 0) + IFF(RIGHT(PROGRAM, 1) = '9', 3, 0) + LENGTH(UPPER(PROGRAM))"
                        " - LENGTH(UPPER(PROGRAM))",
    "odd outputs": "CASE WHEN SUBSTR(PROGRAM, 1, 1) = '1' THEN ' 12 ' WHEN SUBSTR(PROGRAM, 1, 1) = '2' THEN 'x'"
                   " WHEN SUBSTR(PROGRAM, 1, 1) = '3' THEN '3.5' WHEN SUBSTR(PROGRAM, 1, 1) = '4' THEN NULL"
                   " WHEN SUBSTR(PROGRAM, 1, 1) = '5' THEN '1234567890' WHEN SUBSTR(PROGRAM, 1, 1) = '6' THEN '+7'"
                   " WHEN SUBSTR(PROGRAM, 1, 1) = '7' THEN '07' ELSE SUBSTR(PROGRAM, 6, 1) END",
    "nothing repeated": "LENGTH(PROGRAM)",
    # outputs that need a wide integer type (and negative ones) on the way out of the sandbox
    "wide outputs": "IFF(SUBSTR(PROGRAM, 1, 1) = '9', 123456789, LENGTH(PROGRAM) * 100000 - 700000)",
}


def outputs(body: str, shared: bool) -> np.ma.MaskedArray:
    checked = sqlmod.check_sql(body)
    return sqlmod.exhaustive_outputs(checked, MALFORMED, limits=RunLimits(cpu_seconds=120, memory_mb=1024), shared=shared)


def assert_same(got: np.ma.MaskedArray, want: np.ma.MaskedArray) -> None:
    assert np.array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(want))
    valid = ~np.ma.getmaskarray(want)
    assert np.array_equal(np.ma.getdata(got)[valid], np.ma.getdata(want)[valid])


@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_shared_substrings_give_the_plain_outputs_on_every_string(name):
    assert_same(outputs(CANDIDATES[name], shared=True), outputs(CANDIDATES[name], shared=False))


def test_only_repeated_substring_calls_on_program_with_literal_arguments_are_shared():
    assert sqlmod.check_sql(CANDIDATES["nothing repeated"]).shared == ()
    assert len(sqlmod.check_sql(CANDIDATES["champion"]).shared) == 6
    mixed = sqlmod.check_sql("IFF(SUBSTR(PROGRAM, LENGTH(PROGRAM), 1) = SUBSTR(PROGRAM, LENGTH(PROGRAM), 1), 1, 0)")
    # the substrings have a column argument: only LENGTH(PROGRAM) (in its DuckDB spelling) is shared
    assert len(mixed.shared) == 1 and "LENGTH(" in mixed.shared[0][1] and "SUBSTRING" not in mixed.shared[0][1]


def test_the_stored_table_holds_every_six_digit_string_at_its_value_then_the_malformed_ones():
    con = sql_child.connect(512, database=str(sqlmod._six_digit_db_file()))
    try:
        sql_child.load(con, list(MALFORMED), all_six_digit=True)
        rows = con.execute("SELECT i, PROGRAM FROM examples ORDER BY i").fetchall()
    finally:
        con.close()
    assert rows == [(k, f"{k:06d}") for k in range(10**6)] + [(10**6 + j, m) for j, m in enumerate(MALFORMED)]


def test_the_exhaustive_outputs_equal_the_per_example_outputs():
    rng = random.Random(5)
    sample = [f"{k:06d}" for k in rng.sample(range(10**6), 3000)]
    for body in (CANDIDATES["champion"], CANDIDATES["odd outputs"], CANDIDATES["edge positions"],
                 CANDIDATES["wide outputs"]):
        checked = sqlmod.check_sql(body)
        per_example = sqlmod.execute(checked, sample + list(MALFORMED), limits=RunLimits(cpu_seconds=60, memory_mb=512)).parsed
        exhaustive = outputs(body, shared=True)
        index = [int(s) for s in sample] + list(range(10**6, 10**6 + len(MALFORMED)))
        got = [None if exhaustive.mask[i] else int(exhaustive.data[i]) for i in index]
        assert got == per_example


@pytest.mark.parametrize("forged", [
    {"dtype": "<f8"}, {"dtype": ">i8"}, {"dtype": "object"}, {"dtype": None},  # only the listed integer types
    {"values": "AAAA"},  # too few rows
    {"missing": "AA=="},  # too few validity bits
    {"values": "not base64!"},
    {"missing": None},
])
def test_a_malformed_exhaustive_answer_is_an_error_not_outputs(monkeypatch, forged):
    n = 10**6 + len(MALFORMED)
    good = {"values": base64.b64encode(np.zeros(n, dtype="<i1").tobytes()).decode(), "dtype": "<i1",
            "missing": base64.b64encode(np.packbits(np.zeros(n, dtype=bool)).tobytes()).decode()}
    monkeypatch.setattr(sqlmod, "_in_sandbox", lambda *a, **k: {**good, **forged})
    with pytest.raises(sqlmod.SqlExecutionError, match="exhaustive query returned"):
        outputs("LENGTH(PROGRAM)", shared=True)
    monkeypatch.setattr(sqlmod, "_in_sandbox", lambda *a, **k: good)  # the well-formed answer is read
    assert not outputs("LENGTH(PROGRAM)", shared=True).mask.any()


def test_the_champion_still_recovers_the_rules_exactly():
    summary = BENCHMARK.exhaustive({"scorer.sql": CANDIDATES["champion"]})
    assert summary["exhaustive_accuracy"] == 1.0 and summary["exhaustive_n"] == 10**6 + len(MALFORMED)
