"""Trusted helper that runs a checked SQL scorer in DuckDB *inside the sandbox* (shipped there as
``_heldout_lockpicking_sql.py``; DuckDB, numpy and the standard library only). The parent imports it too,
for the connection settings and the table layout, so both sides build the same database.

The query text was validated, transpiled and assembled by the parent
(:mod:`heldout.benchmarks.lockpicking.sql`); here it meets the data in a fresh in-memory DuckDB
with file access, extensions and configuration changes off. Running it in the sandboxed child,
not the harness, means a slow query ends at the sandbox's wall limit (the parent kills the
process; no cooperation from DuckDB is needed) and a memory-hungry one at the run's memory limit.

DuckDB's own failures come back as ``{"error", "kind"}`` so the parent can name them."""

import os
import time

import duckdb

OUTPUT_RE = r"^[ \t\r\n]*([+-]?[0-9]{1,9})[ \t\r\n]*$"
EXHAUSTIVE_DTYPES = ("<i1", "<i2", "<i4", "<i8")
# 10^6 + k printed without its leading 1 is k with six digits: 25 ms faster than lpad on 10^6 rows
ALL_SIX_DIGIT = "SELECT range AS i, substr(CAST(range + 1000000 AS VARCHAR), 2) AS PROGRAM FROM range(1000000)"


SIX_DIGIT_DB = "_heldout_lockpicking_six.duckdb"  # the six-digit table, built once by the parent


def connect(memory_mb, threads=1, database=":memory:"):
    con = duckdb.connect(database, read_only=database != ":memory:", config={
        "enable_external_access": False, "autoinstall_known_extensions": False,
        "autoload_known_extensions": False, "allow_unsigned_extensions": False,
        "threads": threads, "memory_limit": f"{max(64, int(memory_mb))}MB",
    })
    con.execute("SET enable_progress_bar = false")  # a long exhaustive query would draw one on stdout
    return con


def build_six_digit_db(path):
    """The file :data:`SIX_DIGIT_DB`: a table ``six`` of the 10^6 six-digit strings (i = their
    value). Reading it is faster than generating them: 0.02 s against 0.1 s per exhaustive check."""
    con = duckdb.connect(path)
    try:
        con.execute(f"CREATE TABLE six AS {ALL_SIX_DIGIT}")
        con.execute("CHECKPOINT")
    finally:
        con.close()


def load(con, programs, all_six_digit):
    """The table (or view) ``examples (i, PROGRAM)``: with ``all_six_digit`` (``con`` opened on
    :data:`SIX_DIGIT_DB`) the 10^6 six-digit strings first (i = their value), then ``programs``."""
    table = "given" if all_six_digit else "examples"
    con.execute(f"CREATE TEMP TABLE {table} (i BIGINT, PROGRAM VARCHAR)")
    if programs:  # one statement for the whole list (executemany costs milliseconds per row)
        con.execute(f"INSERT INTO {table} SELECT ? + k - 1, p FROM "
                    "(SELECT unnest(?::VARCHAR[]) AS p, generate_subscripts(?::VARCHAR[], 1) AS k)",
                    [10**6 if all_six_digit else 0, list(programs), list(programs)])
    if all_six_digit:
        con.execute("CREATE TEMP VIEW examples AS SELECT i, PROGRAM FROM six UNION ALL SELECT i, PROGRAM FROM given")
    con.execute("SET lock_configuration = true")


def _failure(exc):
    kind = "memory" if isinstance(exc, duckdb.OutOfMemoryException) else "crash"
    return {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__, "kind": kind}


def run_rows(query, programs, memory_mb):
    """``{"rows": [[raw, y], ...]}`` for ``programs`` (the query orders them), or ``{"error", "kind"}``."""
    con = connect(memory_mb)
    try:
        load(con, programs, all_six_digit=False)
        return {"rows": [list(r) for r in con.execute(query).fetchall()]}
    except duckdb.Error as exc:
        return _failure(exc)
    finally:
        con.close()


def run_outputs(query, malformed, memory_mb, threads):
    """The exhaustive check: ``query`` yields ``(i, y)`` for the 10^6 six-digit strings (i = their
    value) and then ``malformed`` (i from 10^6). The answer, placed by i: ``{"values": base64 of
    the narrowest little-endian integer type of EXHAUSTIVE_DTYPES that holds them, "dtype",
    "missing": base64 of one bit per row, numpy's packbits (1 = not an integer), "seconds": this
    function's own wall time (perf/ sets the harness's share against it)}``, or ``{"error", "kind"}``."""
    import base64

    import numpy as np  # only here: its import maps address space the row queries do not need

    started = time.perf_counter()
    con = connect(memory_mb, threads=threads, database=os.path.join(os.path.dirname(__file__), SIX_DIGIT_DB))
    try:
        load(con, malformed, all_six_digit=True)
        cols = con.execute(query).fetchnumpy()  # no ORDER BY: placing rows by i is cheaper than sorting
    except duckdb.Error as exc:
        return _failure(exc)
    finally:
        con.close()
    n = 10**6 + len(malformed)
    order = np.asarray(cols["i"], dtype=np.int64)
    if order.size != n or np.ma.getmaskarray(cols["i"]).any() or order.min() < 0 or order.max() >= n:
        return {"error": f"the exhaustive query returned {order.size} rows, expected {n}", "kind": "crash"}
    values, missing = np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
    values[order] = np.ma.getdata(cols["y"]).astype(np.int64)
    missing[order] = np.ma.getmaskarray(cols["y"])
    low, high = int(values.min()), int(values.max())
    dtype = next(t for t in EXHAUSTIVE_DTYPES if np.iinfo(t).min <= low and high <= np.iinfo(t).max)
    return {"values": base64.b64encode(values.astype(dtype).tobytes()).decode(), "dtype": dtype,
            "missing": base64.b64encode(np.packbits(missing).tobytes()).decode(),
            "seconds": time.perf_counter() - started}
