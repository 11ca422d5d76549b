"""SQL scorer candidates: validate (sqlglot, Snowflake dialect), transpile to DuckDB, execute.

A candidate is the body of a scalar function over one column ``PROGRAM`` (the paper's form), e.g.
``CASE WHEN NOT REGEXP_LIKE(PROGRAM,'^[0-9]{6}$') THEN '0' ELSE CAST(IFF(...)+... AS VARCHAR) END``.

Rules, in the order they are applied:

1. Size: at most :data:`MAX_SQL_BYTES` bytes (a 10 MB literal is refused before parsing).
2. One scalar expression, not a statement: anything that starts with a statement keyword
   (``SELECT``, ``COPY``, ``ATTACH``, ``INSTALL``, ``PRAGMA`` ...) or parses to more than one
   expression is refused.
3. Allow-list: every node of the parse tree is one of :data:`ALLOWED_NODES` (operators, ``CASE``,
   ``IFF``, casts, string and regex functions that cannot amplify their input), the only column
   is ``PROGRAM`` and the only free-form function is ``AI_COMPLETE``. Subqueries, tables, table
   functions (``read_csv``), ``REPEAT``/``LPAD``/``REPLACE`` (memory amplifiers) and every
   function not listed are refused by name.
4. Execution in a fresh in-memory DuckDB that has file system access, extension install/autoload
   and configuration changes switched off and a memory limit, **inside the sandbox**
   (:mod:`heldout.benchmarks.lockpicking.sql_child`): the sandbox's parent enforces the task's CPU
   limit (every DuckDB thread counted) and its wall backstop by killing the process, so a slow
   query always stops, and a query that computes within its CPU limit is never failed because
   the machine was busy. Only a body that calls ``AI_COMPLETE`` (which needs the harness's
   metered worker) runs in-process, under a timer that interrupts the query after the task's
   wall backstop of its *own* time: the time it waits on the worker is not counted
   (:class:`WaitClock`), so a slow or retrying endpoint (bounded by the client's timeouts, and
   whose failure is an infrastructure failure) never becomes the candidate's timeout.

The output of the expression must be an integer or a string holding one (``'3'``, ``' 3 '``);
anything else (NULL, ``'three'``, ``3.5``, ``true``) is an invalid output for that example.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
from pathlib import Path
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import duckdb
import numpy as np
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from heldout.benchmarks.lockpicking import sql_child
from heldout.contracts import RunLimits
from heldout.files import make_temp_dir
from heldout.models import model_failure_kind
from heldout.sandbox import SandboxError, run_function, PROGRAM_PRELOAD

if TYPE_CHECKING:
    from heldout.benchmarks.lockpicking.rules import RuleSystem

AiComplete = Callable[[str], str]
"""The worker hook behind ``AI_COMPLETE(model, prompt)``: prompt text in, completion text out."""

MAX_SQL_BYTES = 64 * 1024
MAX_DEPTH = 200
AI_FUNCTION = "AI_COMPLETE"
_AI_UDF = "heldout_ai_complete"  # the DuckDB name; not itself on the allow-list

STATEMENT_KEYWORDS = frozenset({
    "SELECT", "WITH", "FROM", "VALUES", "TABLE", "INSERT", "UPDATE", "DELETE", "MERGE", "CREATE",
    "DROP", "ALTER", "TRUNCATE", "COPY", "ATTACH", "DETACH", "INSTALL", "LOAD", "FORCE", "PRAGMA",
    "SET", "RESET", "USE", "CALL", "EXPORT", "IMPORT", "EXPLAIN", "DESCRIBE", "SHOW", "SUMMARIZE",
    "PUT", "GET", "LIST", "REMOVE", "GRANT", "REVOKE", "BEGIN", "COMMIT", "ROLLBACK", "EXECUTE",
    "PREPARE", "VACUUM", "CHECKPOINT", "UNDROP", "UNSET",
})

ALLOWED_NODES: frozenset[type[exp.Expression]] = frozenset({
    # values and structure
    exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.Tuple,
    exp.Case, exp.If, exp.DecodeCase, exp.Coalesce, exp.Nullif, exp.Cast, exp.TryCast,
    exp.DataType, exp.DataTypeParam,
    # logic and comparison
    exp.And, exp.Or, exp.Not, exp.Xor, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE,
    exp.NullSafeEQ, exp.NullSafeNEQ, exp.Is, exp.In, exp.Between, exp.Like, exp.ILike,
    # arithmetic
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg, exp.Abs, exp.Sign,
    exp.Floor, exp.Ceil, exp.Round, exp.Least, exp.Greatest, exp.ToNumber, exp.ToChar,
    # strings whose output is at most as long as their inputs together
    exp.Substring, exp.Left, exp.Right, exp.Length, exp.StrPosition, exp.Contains, exp.StartsWith,
    exp.EndsWith, exp.Upper, exp.Lower, exp.Trim, exp.Concat, exp.DPipe, exp.RegexpLike,
    exp.RegexpILike, exp.RegexpCount, exp.RegexpExtract, exp.Anonymous,
})
ANONYMOUS_ALLOWED = frozenset({AI_FUNCTION})
ALLOWED_TYPES = frozenset({
    exp.DataType.Type.VARCHAR, exp.DataType.Type.CHAR, exp.DataType.Type.TEXT, exp.DataType.Type.NCHAR,
    exp.DataType.Type.NVARCHAR, exp.DataType.Type.INT, exp.DataType.Type.BIGINT, exp.DataType.Type.SMALLINT,
    exp.DataType.Type.TINYINT, exp.DataType.Type.DECIMAL, exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT,
    exp.DataType.Type.BOOLEAN,
})
# Integer output: optional blanks, optional sign, at most 9 digits. One regex, used in DuckDB for
# SQL candidates so per-example and exhaustive runs parse identically.
_OUTPUT_RE = sql_child.OUTPUT_RE


class SqlRejected(Exception):
    """The candidate is not an acceptable scalar expression (``kind`` names why)."""

    def __init__(self, message: str, kind: str = "forbidden") -> None:
        super().__init__(message)
        self.kind = kind


class SqlExecutionError(Exception):
    def __init__(self, message: str, kind: str = "crash") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class CheckedSql:
    """A validated candidate: the original body, its DuckDB translation and what it calls.

    ``shared`` names the substrings-of-PROGRAM that occur more than once (``(column, DuckDB
    expression)``) and ``duckdb_sql_shared`` is the translation reading them from those columns:
    the exhaustive check computes each once per row instead of once per occurrence."""

    source: str
    duckdb_sql: str
    uses_ai: bool
    shared: tuple[tuple[str, str], ...] = ()
    duckdb_sql_shared: str | None = None


def _node_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return f"function {str(node.this).upper()}"
    if isinstance(node, exp.Func):
        return f"function {node.sql_name()}"
    return type(node).__name__


def check_sql(body: str) -> CheckedSql:
    """Validate a candidate body and translate it to DuckDB. Raises :class:`SqlRejected`."""
    if not isinstance(body, str):
        raise SqlRejected(f"the SQL body must be text, got {type(body).__name__}", "malformed_candidate")
    return _check_sql(body)


@lru_cache(maxsize=256)  # run() checks the same body once per example
def _check_sql(body: str) -> CheckedSql:
    if not isinstance(body, str):
        raise SqlRejected(f"the SQL body must be text, got {type(body).__name__}", "malformed_candidate")
    size = len(body.encode("utf-8"))
    if size > MAX_SQL_BYTES:
        raise SqlRejected(f"the SQL body is {size} bytes; the limit is {MAX_SQL_BYTES} bytes")
    text = body.strip().rstrip(";").strip()
    if not text:
        raise SqlRejected("the SQL body is empty", "malformed_candidate")
    first = re.match(r"[A-Za-z_]+", text)
    if first and first.group(0).upper() in STATEMENT_KEYWORDS:
        raise SqlRejected(f"statements are not allowed ({first.group(0).upper()} ...): the candidate must be "
                          "a scalar expression over PROGRAM")
    try:
        tokens = sqlglot.tokenize(text, read="snowflake")
    except SqlglotError as exc:
        raise SqlRejected(f"the SQL body does not tokenize: {str(exc).splitlines()[0]}", "malformed_candidate") from None
    if any(tok.token_type == TokenType.SEMICOLON for tok in tokens):
        raise SqlRejected("the SQL body holds several statements separated by ';': it must be one scalar "
                          "expression over PROGRAM")
    try:
        trees = [t for t in sqlglot.parse(text, read="snowflake") if t is not None]
    except SqlglotError as exc:
        raise SqlRejected(f"the SQL body does not parse (Snowflake dialect): {str(exc).splitlines()[0]}",
                          "malformed_candidate") from None
    except RecursionError:
        raise SqlRejected("the SQL body is nested too deeply to parse", "malformed_candidate") from None
    if len(trees) != 1:
        raise SqlRejected(f"the SQL body holds {len(trees)} statements; it must be one scalar expression")
    tree = trees[0]
    uses_ai = False
    for node in tree.walk():
        if node.depth > MAX_DEPTH:
            raise SqlRejected(f"the expression is nested deeper than {MAX_DEPTH} levels")
        if type(node) not in ALLOWED_NODES:
            raise SqlRejected(f"{_node_name(node)} is not allowed in a scorer expression (only scalar "
                              "operators, CASE/IFF, casts and string/regex functions over PROGRAM)")
        if isinstance(node, exp.Anonymous):
            name = str(node.this).upper()
            if name not in ANONYMOUS_ALLOWED:
                raise SqlRejected(f"function {name} is not allowed in a scorer expression")
            if name == AI_FUNCTION:
                uses_ai = True
                if len(node.expressions) not in (1, 2):
                    raise SqlRejected("AI_COMPLETE takes (model, prompt) or (prompt)", "malformed_candidate")
        elif isinstance(node, exp.Column):
            if node.table or node.name.upper() != "PROGRAM":
                raise SqlRejected(f"unknown column {node.sql('snowflake')!r}: the only column is PROGRAM")
        elif isinstance(node, exp.DataType) and node.this not in ALLOWED_TYPES:
            raise SqlRejected(f"cast to {node.sql('snowflake')} is not allowed")
    tree = tree.transform(_route_ai_complete)
    try:
        duck = tree.sql(dialect="duckdb")
        shared, duck_shared = _share_substrings(tree)
    except SqlglotError as exc:
        raise SqlRejected(f"the SQL body cannot be translated to DuckDB: {exc}", "malformed_candidate") from None
    return CheckedSql(source=body, duckdb_sql=duck, uses_ai=uses_ai, shared=shared, duckdb_sql_shared=duck_shared)


# Functions of PROGRAM and integer literals: deterministic, so computing one once per row and
# reading it wherever it occurs gives the same values (a run that raises falls back to the plain
# translation, so even an error inside an untaken branch cannot change a verdict).
_SHAREABLE = (exp.Substring, exp.Left, exp.Right, exp.Length, exp.Upper, exp.Lower)
_SHARED_PREFIX = "heldout_shared_"


def _is_int_literal(node: Any) -> bool:
    while isinstance(node, (exp.Paren, exp.Neg)):
        node = node.this
    return isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit()


def _shareable_sql(node: exp.Expression) -> str | None:
    if not isinstance(node, _SHAREABLE):
        return None
    this = node.args.get("this")
    if not (isinstance(this, exp.Column) and not this.table and this.name.upper() == "PROGRAM"):
        return None
    for key, value in node.args.items():
        if key == "this" or value is None or isinstance(value, bool):  # flags only steer the translation
            continue
        if not _is_int_literal(value):
            return None
    return node.sql(dialect="duckdb")


def _share_substrings(tree: exp.Expression) -> tuple[tuple[tuple[str, str], ...], str | None]:
    counts: dict[str, int] = {}
    for node in tree.walk():
        key = _shareable_sql(node)
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    repeated = [key for key, n in counts.items() if n > 1]
    if not repeated:
        return (), None
    names = {key: f"{_SHARED_PREFIX}{k}" for k, key in enumerate(repeated)}

    def swap(node: exp.Expression) -> exp.Expression:
        key = _shareable_sql(node)
        return exp.column(names[key]) if key in names else node

    rewritten = tree.copy().transform(swap)
    return tuple((name, key) for key, name in names.items()), rewritten.sql(dialect="duckdb")


def _route_ai_complete(node: exp.Expression) -> exp.Expression:
    # AI_COMPLETE(model, prompt): the worker is chosen by the evaluator, so only the prompt crosses.
    if isinstance(node, exp.Anonymous) and str(node.this).upper() == AI_FUNCTION:
        return exp.Anonymous(this=_AI_UDF, expressions=[node.expressions[-1].copy()])
    return node


@dataclass
class SqlRun:
    """Outputs of one execution, in input order: the raw text and the parsed integer (None when
    the output is not an integer)."""

    raw: list[str | None]
    parsed: list[int | None]
    seconds: float
    ai_errors: list[str] = field(default_factory=list)


_connect = sql_child.connect
SQL_HELPER_MODULE = "_heldout_lockpicking_sql"
_SQL_HELPER_SOURCE = Path(sql_child.__file__).read_text(encoding="utf-8")
SQL_PRELOAD = (*PROGRAM_PRELOAD, "duckdb")  # the fork server imports DuckDB once (~90 ms per run otherwise)
DUCKDB_HEADROOM_MB = 1024  # address space DuckDB (and numpy, for the exhaustive check) map beyond memory_limit


_six_digit_db_lock = threading.Lock()
_six_digit_db: list[Path] = []


def _new_lock_after_fork() -> None:
    """A child forked while another thread held ``_six_digit_db_lock`` (an MBPP+ worker process, a
    process-pool worker) would wait on it for ever: the child gets a lock of its own."""
    global _six_digit_db_lock
    _six_digit_db_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def _six_digit_db_file() -> Path:
    """The six-digit table as a DuckDB file (``sql_child.SIX_DIGIT_DB``), built once per process
    in a private temp dir, removed at exit; each exhaustive check's sandbox gets it linked in."""
    with _six_digit_db_lock:
        if not _six_digit_db:
            # removed with the process's temp folder, at exit or after a kill by the next process
            path = make_temp_dir("lockpicking-").resolve() / sql_child.SIX_DIGIT_DB
            sql_child.build_six_digit_db(str(path))
            _six_digit_db.append(path)
        return _six_digit_db[0]


def _in_sandbox(function: str, args: list, *, limits: RunLimits, six_digit_db: bool = False) -> dict:
    """Run a function of :mod:`sql_child` in the sandbox (with the six-digit table's file, for
    ``six_digit_db``) under the task's CPU limit and wall backstop; its answer, or
    SqlExecutionError."""
    limits = limits.replace(memory_mb=limits.memory_mb + DUCKDB_HEADROOM_MB, max_output_bytes=64 * 1024 * 1024)
    setup: dict[str, str | Path] = {f"{SQL_HELPER_MODULE}.py": _SQL_HELPER_SOURCE}
    if six_digit_db:
        setup[sql_child.SIX_DIGIT_DB] = _six_digit_db_file()
    try:
        result = run_function({}, SQL_HELPER_MODULE, function, [*args], limits=limits, setup_files=setup,
                              preload=SQL_PRELOAD)
    except SandboxError as exc:
        raise SqlExecutionError(f"cannot run the query: {exc}", "sandbox_error") from None
    if not result.ok:
        raise SqlExecutionError(str(result.error)[:500], result.error_kind or "crash")
    value = result.value if isinstance(result.value, dict) else {}
    if "error" in value:
        prefix = "out of memory" if value.get("kind") == "memory" else "execution failed"
        raise SqlExecutionError(f"{prefix}: {value['error']}", value.get("kind", "crash"))
    return value


class WaitClock:
    """The wall time a query spent waiting on something outside it (``AI_COMPLETE``'s calls on
    the worker), so that its time limit counts only its own work: a slow or retrying endpoint is
    the endpoint's, bounded by the client's own timeouts, never the candidate's timeout. Waits
    may overlap (a call from each of several threads): time with any wait open counts once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._opened_at = 0.0
        self._closed_total = 0.0

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        with self._lock:
            if self._open == 0:
                self._opened_at = time.monotonic()
            self._open += 1
        try:
            yield
        finally:
            with self._lock:
                self._open -= 1
                if self._open == 0:
                    self._closed_total += time.monotonic() - self._opened_at

    def waited(self, now: float) -> float:
        with self._lock:
            return self._closed_total + (now - self._opened_at if self._open else 0.0)


class _Watchdog:
    """Interrupts the connection's running query once it has run ``seconds`` of wall time, not
    counting the time ``waits`` recorded."""

    def __init__(self, con: duckdb.DuckDBPyConnection, seconds: float, waits: WaitClock | None) -> None:
        self.fired = False
        self._con = con
        self._seconds = seconds
        self._waits = waits or WaitClock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lockpicking-sql-watchdog", daemon=True)

    def _left(self) -> float:
        now = time.monotonic()
        return self._seconds - (now - self._started - self._waits.waited(now))

    def _watch(self) -> None:
        while not self._done.wait(max(self._left(), 0.01)):
            if self._left() <= 0:
                self.fired = True
                self._con.interrupt()
                return

    def __enter__(self) -> "_Watchdog":
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()


def run_query(con: duckdb.DuckDBPyConnection, query: str, wall_seconds: float, *, numpy: bool = False,
              waits: WaitClock | None = None):
    """Run one trusted query under a wall-clock limit on its own time (``waits`` not counted) and
    fetch its rows (or numpy columns). Raises :class:`SqlExecutionError` naming the kind of failure."""
    with _Watchdog(con, wall_seconds, waits) as dog:
        try:
            result = con.execute(query)
            return result.fetchnumpy() if numpy else result.fetchall()
        except duckdb.Error as exc:
            if dog.fired or isinstance(exc, duckdb.InterruptException):
                spent = "of its own time (waits on the worker not counted)" if waits is not None else "wall"
                raise SqlExecutionError(f"timeout after {wall_seconds:g} s {spent} (limit)", "timeout") from None
            if isinstance(exc, duckdb.OutOfMemoryException):
                raise SqlExecutionError(f"out of memory: {str(exc).splitlines()[0]}", "memory") from None
            raise SqlExecutionError(f"execution failed: {str(exc).splitlines()[0]}") from None


_load = sql_child.load


# A lone digit is by far the commonest output; reading it directly skips the regex for it (same value).
_PARSE_OUTPUT = (f"CASE WHEN raw IN ({', '.join(repr(str(d)) for d in range(10))}) THEN CAST(raw AS INTEGER) "
                 f"ELSE TRY_CAST(regexp_extract(raw, '{_OUTPUT_RE}', 1) AS INTEGER) END")


# The exhaustive check reads every string from a stored table, and may use both cores: it is
# one trusted query over 10^6 rows. (A table scan runs in parallel; the generating range() of
# the six-digit strings does not. Filling a table first was faster, 0.25 s against 0.35 s;
# reading the table from a file built once is faster still, see sql_child.build_six_digit_db.)
_EXHAUSTIVE_SOURCE = "examples"
EXHAUSTIVE_THREADS = max(1, min(2, os.cpu_count() or 1))
EXHAUSTIVE_DTYPES = sql_child.EXHAUSTIVE_DTYPES  # the narrowest that holds every output is sent


def _query(checked: CheckedSql) -> str:
    return (f"SELECT raw, {_PARSE_OUTPUT} AS y FROM "
            f"(SELECT i, CAST(({checked.duckdb_sql}) AS VARCHAR) AS raw FROM examples) ORDER BY i")


def _exhaustive_query(checked: CheckedSql, shared: bool) -> str:
    """Row number and parsed output only (the raw text is not needed); with ``shared``, the
    repeated substrings come from an inner projection computed once per row."""
    if shared and checked.duckdb_sql_shared is not None:
        inner = ", ".join(f"{sql} AS {name}" for name, sql in checked.shared)
        source = f"(SELECT i, PROGRAM, {inner} FROM {_EXHAUSTIVE_SOURCE})"
        expr = checked.duckdb_sql_shared
    else:
        source, expr = _EXHAUSTIVE_SOURCE, checked.duckdb_sql
    return f"SELECT i, {_PARSE_OUTPUT} AS y FROM (SELECT i, CAST(({expr}) AS VARCHAR) AS raw FROM {source})"


def execute(checked: CheckedSql, programs: Sequence[str], *, limits: RunLimits,
            ai_complete: AiComplete | None = None) -> SqlRun:
    """Evaluate the candidate on ``programs`` in a fresh locked-down DuckDB, one query for all,
    under ``limits`` (CPU time and its wall backstop in the sandbox; for a body that calls
    ``AI_COMPLETE``, in this process, the backstop on the query's own wall time: its waits on the
    worker are the endpoint's, see :class:`WaitClock`)."""
    if checked.uses_ai and ai_complete is None:
        raise SqlExecutionError("the candidate calls AI_COMPLETE but no worker model is configured: register "
                                "a session with a worker model (--worker-model/--base-url)",
                                "model_error")
    started = time.perf_counter()
    if not checked.uses_ai:
        rows = _in_sandbox("run_rows", [_query(checked), list(programs), limits.memory_mb], limits=limits).get("rows")
        if not isinstance(rows, list) or len(rows) != len(programs):
            raise SqlExecutionError("the query returned a malformed result")
        return SqlRun(raw=[r[0] for r in rows], parsed=[r[1] for r in rows], seconds=time.perf_counter() - started)
    failures: list[Exception] = []
    waits = WaitClock()
    con = _connect(limits.memory_mb)
    try:
        def hook(prompt: str | None) -> str | None:
            try:
                with waits.waiting():
                    return None if prompt is None else str(ai_complete(prompt))
            except Exception as exc:  # noqa: BLE001 - sorted out below: whose failure it was
                failures.append(exc)
                return None
        con.create_function(_AI_UDF, hook, ["VARCHAR"], "VARCHAR", side_effects=True, null_handling="special")
        _load(con, programs, all_six_digit=False)
        rows = run_query(con, _query(checked), limits.wall_seconds, waits=waits)
    finally:
        con.close()
    # An endpoint that refused the candidate's prompt (too long, invalid) is that row's invalid
    # output; an endpoint that failed (after the client's retries) is no output of the candidate
    # at all: the whole batch is the infrastructure's failure, never a score
    endpoint = next((exc for exc in failures if model_failure_kind(exc) != "model_refused"), None)
    if endpoint is not None:
        raise SqlExecutionError(f"AI_COMPLETE failed: {type(endpoint).__name__}: {endpoint}",
                                model_failure_kind(endpoint))
    return SqlRun(raw=[r[0] for r in rows], parsed=[r[1] for r in rows], seconds=time.perf_counter() - started,
                  ai_errors=[f"{type(exc).__name__}: {exc}" for exc in failures])


def exhaustive_outputs(checked: CheckedSql, malformed: Sequence[str], *, limits: RunLimits,
                       shared: bool = True) -> "np.ma.MaskedArray":
    """The candidate's parsed outputs on all 10^6 six-digit strings (index = value) followed by
    ``malformed``; masked where the output is not an integer. Deterministic candidates only.
    ``shared=False`` evaluates the plain translation (each substring at each occurrence)."""
    if checked.uses_ai:
        raise SqlExecutionError("the exhaustive check is for deterministic candidates; this one calls AI_COMPLETE",
                                "not_deterministic")

    def outputs_for(query: str) -> dict:
        return _in_sandbox("run_outputs", [query, list(malformed), limits.memory_mb, EXHAUSTIVE_THREADS],
                           limits=limits, six_digit_db=True)

    try:
        got = outputs_for(_exhaustive_query(checked, shared=shared))
    except SqlExecutionError as exc:
        if exc.kind != "crash" or not shared or checked.duckdb_sql_shared is None:
            raise
        # a shared substring raised where the plain expression might not evaluate it: ask the plain
        # one, with a limit of its own (sharing is the harness's shortcut, not the candidate's)
        got = outputs_for(_exhaustive_query(checked, shared=False))
    n = 10**6 + len(malformed)
    try:
        dtype = got["dtype"]
        if dtype not in EXHAUSTIVE_DTYPES:
            raise ValueError(f"integer type {dtype!r} is not one of {EXHAUSTIVE_DTYPES}")
        values = np.frombuffer(base64.b64decode(got["values"], validate=True), dtype=dtype).astype(np.int64)
        missing_bits = np.frombuffer(base64.b64decode(got["missing"], validate=True), dtype=np.uint8)
    except (KeyError, TypeError, ValueError) as exc:
        raise SqlExecutionError(f"the exhaustive query returned a malformed result ({exc})") from None
    if values.size != n or missing_bits.size != (n + 7) // 8:
        raise SqlExecutionError(f"the exhaustive query returned {values.size} rows, expected {n}")
    missing = np.unpackbits(missing_bits, count=n).astype(bool)
    return np.ma.masked_array(values, mask=missing)


def rule_table_sql(system: "RuleSystem") -> str:
    """A rule table written as a candidate body in the champion's shape (Snowflake dialect): one
    ``IFF`` per position, valid when its digit is in the candidate set and no killer matches."""
    terms = []
    for pos in range(1, len(system.candidate_sets) + 1):
        digits = ", ".join(f"'{d}'" for d in sorted(system.candidate_sets[pos - 1]))
        conds = [f"SUBSTR(PROGRAM, {pos}, 1) IN ({digits})"]
        conds += [f"SUBSTR(PROGRAM, {t}, 1) <> '{d}'" for t, d in system.killers[pos]]
        terms.append(f"IFF({' AND '.join(conds)}, 1, 0)")
    body = "\n  + ".join(terms)
    return f"CASE WHEN NOT REGEXP_LIKE(PROGRAM, '^[0-9]{{6}}$') THEN '0' ELSE CAST(\n    {body}\n  AS VARCHAR) END\n"
