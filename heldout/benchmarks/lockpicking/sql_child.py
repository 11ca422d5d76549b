"""Trusted helper that runs a checked SQL scorer in DuckDB *inside the sandbox* (shipped there as
``_heldout_lockpicking_sql.py``; DuckDB and the standard library only).

The query text was validated and transpiled by the parent (:mod:`heldout.benchmarks.lockpicking.sql`);
here it meets the data in a fresh in-memory DuckDB with file access, extensions and
configuration changes off and one thread. Running it in the sandboxed child, not the harness,
means a slow query ends at the sandbox's wall limit (the parent kills the process; no
cooperation from DuckDB is needed) and a memory-hungry one at the run's memory limit.

Failures DuckDB reports come back as ``{"error", "kind"}`` so the parent can name them."""

import duckdb

OUTPUT_RE = r"^[ \t\r\n]*([+-]?[0-9]{1,9})[ \t\r\n]*$"


def connect(memory_mb):
    return duckdb.connect(":memory:", config={
        "enable_external_access": False, "autoinstall_known_extensions": False,
        "autoload_known_extensions": False, "allow_unsigned_extensions": False,
        "threads": 1, "memory_limit": f"{max(64, int(memory_mb))}MB",
    })


def load(con, programs, all_six_digit):
    # Rows are ordered by i: the 10^6 six-digit strings first (i = their value), then `programs`.
    con.execute("CREATE TABLE examples (i BIGINT, PROGRAM VARCHAR)")
    if all_six_digit:
        con.execute("INSERT INTO examples SELECT range, lpad(CAST(range AS VARCHAR), 6, '0') FROM range(1000000)")
    offset = 10**6 if all_six_digit else 0
    if programs:  # one statement for the whole list (executemany costs milliseconds per row)
        con.execute("INSERT INTO examples SELECT ? + k - 1, p FROM "
                    "(SELECT unnest(?::VARCHAR[]) AS p, generate_subscripts(?::VARCHAR[], 1) AS k)",
                    [offset, list(programs), list(programs)])
    con.execute("SET lock_configuration = true")


def query_for(expression):
    return (f"SELECT raw, TRY_CAST(regexp_extract(raw, '{OUTPUT_RE}', 1) AS INTEGER) AS y FROM "
            f"(SELECT i, CAST(({expression}) AS VARCHAR) AS raw FROM examples) ORDER BY i")


def _failure(exc):
    kind = "memory" if isinstance(exc, duckdb.OutOfMemoryException) else "crash"
    return {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__, "kind": kind}


def run_rows(expression, programs, memory_mb):
    """``{"rows": [[raw, y], ...]}`` in ``programs`` order, or ``{"error", "kind"}``."""
    con = connect(memory_mb)
    try:
        load(con, programs, all_six_digit=False)
        return {"rows": [list(r) for r in con.execute(query_for(expression)).fetchall()]}
    except duckdb.Error as exc:
        return _failure(exc)
    finally:
        con.close()


def run_codes(expression, malformed, memory_mb):
    """All 10^6 six-digit strings then ``malformed``, as one string: the output digit 0..9 per row,
    or 'x' when it is not an integer in 0..9. ``{"codes": str}`` or ``{"error", "kind"}``."""
    con = connect(memory_mb)
    try:
        load(con, malformed, all_six_digit=True)
        rows = con.execute(query_for(expression)).fetchall()
    except duckdb.Error as exc:
        return _failure(exc)
    finally:
        con.close()
    return {"codes": "".join(chr(48 + y) if y is not None and 0 <= y <= 9 else "x" for _, y in rows)}
