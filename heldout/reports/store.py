"""The results store: DuckDB tables over the verified runs of many studies, for analysis across
thousands of cells (``heldout runs query RUN_DIR "SQL"``) and Parquet exports
(``heldout runs export RUN_DIR --parquet OUT``).

Rule: the store holds only what :func:`~heldout.reports.collect.collect_runs` accepts. A run dir
whose ledger or record does not verify is a row of ``excluded`` (with the reason), never of
``runs``; ``verdicts`` come from the verified records; ``ledger`` holds each counted run's ledger
entries up to the head the record is anchored to (an entry appended later is not read).

Tables (one row per ...):

``runs``        run: ``run_id`` (its dir), ``label``, ``task``, ``profile``, ``method``, ``seed``,
                ``status`` (ok / failed), ``test_score``, ``val_score``, ``metric_calls``,
                ``metric_call_budget``, ``final_candidate_id``, ``ledger_entries``, ``ledger_head``,
                ``error``
``verdicts``    held-out (``split = 'test'``) or val verdict of a run's final candidate:
                ``run_id``, ``split``, ``example_id``, ``score``, ``valid``, ``error_kind``
``ledger``      ledger entry: ``run_id``, ``seq``, ``kind``, ``time``, ``split``, ``candidate_id``,
                ``example_id``, ``score``, ``data`` (the entry's JSON)
``excluded``    run dir left out: ``run_id``, ``reason``

The ledger table is filled one run at a time as each is verified, into a database file of the
store's own (its memory stays flat however many entries a study holds); ``runs query`` fills it
only when its SQL names it (:func:`reads_ledger`).

An export is one Parquet file per table; :meth:`ResultsStore.open` reads either run dirs or an
export dir, so queries over a frozen export need no re-verification."""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import duckdb
import pyarrow as pa

from heldout.files import process_temp_dir, writer_temp_name
from heldout.reports.collect import ReportError, Run, RunSet, collect_runs

TABLES = ("runs", "verdicts", "ledger", "excluded")

_RUNS = pa.schema([("run_id", pa.string()), ("label", pa.string()), ("task", pa.string()),
                   ("profile", pa.string()), ("method", pa.string()), ("seed", pa.int64()),
                   ("status", pa.string()), ("test_score", pa.float64()), ("val_score", pa.float64()),
                   ("metric_calls", pa.int64()), ("metric_call_budget", pa.int64()),
                   ("final_candidate_id", pa.string()), ("ledger_entries", pa.int64()),
                   ("ledger_head", pa.string()), ("error", pa.string())])
_VERDICTS = pa.schema([("run_id", pa.string()), ("split", pa.string()), ("example_id", pa.string()),
                       ("score", pa.float64()), ("valid", pa.bool_()), ("error_kind", pa.string())])
_EXCLUDED = pa.schema([("run_id", pa.string()), ("reason", pa.string())])
_LEDGER = pa.schema([("run_id", pa.string()), ("seq", pa.int64()), ("kind", pa.string()), ("time", pa.float64()),
                     ("split", pa.string()), ("candidate_id", pa.string()), ("example_id", pa.string()),
                     ("score", pa.float64()), ("data", pa.string())])


class StoreError(ReportError):
    """The store cannot be built or queried (nothing found, bad SQL, unreadable export)."""


@dataclass(frozen=True)
class QueryResult:
    """Column names and rows of one query."""

    columns: list[str]
    rows: list[tuple[Any, ...]]

    def to_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def format(self, max_width: int = 40) -> str:
        """An aligned plain-text table (cells cut at ``max_width`` characters)."""
        def cell(value: Any) -> str:
            text = "NULL" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)
            text = text.replace("\n", " ")
            return text if len(text) <= max_width else text[: max_width - 1] + "…"

        table = [list(self.columns)] + [[cell(v) for v in row] for row in self.rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(self.columns))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines) + f"\n({len(self.rows)} row{'s' if len(self.rows) != 1 else ''})"


class ResultsStore:
    """A DuckDB database holding the tables above (see the module docstring): in memory, or, when
    it holds the ledger table, in a file of its own scratch dir (removed with the store), so the
    entries of a study of any size are loaded one run at a time and live on disk, not in memory."""

    def __init__(self, con: duckdb.DuckDBPyConnection, scratch: tempfile.TemporaryDirectory | None = None) -> None:
        self.con = con
        self._scratch = scratch

    # -- building -----------------------------------------------------------------------------------
    @classmethod
    def open(cls, paths: Iterable[str | Path], with_ledger: bool = True) -> "ResultsStore":
        """Run dirs (verified now), or one Parquet export dir (as exported). ``with_ledger``: load
        every run's ledger entries into the ``ledger`` table (a query that reads no entry, see
        :func:`reads_ledger`, leaves it empty and the store's size follows the runs, not the entries)."""
        paths = [Path(p) for p in paths]
        if len(paths) == 1 and all((paths[0] / f"{t}.parquet").exists() for t in TABLES):
            return cls.from_parquet(paths[0])
        scratch = tempfile.TemporaryDirectory(prefix="store-", dir=process_temp_dir()) if with_ledger else None
        con = _connect(scratch)
        ledger = _LedgerTable(con)
        try:
            runset = collect_runs(paths, on_counted=ledger.add if with_ledger else None)
            ledger.flush()
        except BaseException:
            con.close()
            raise
        cls._load_runs(con, runset)
        return cls(con, scratch)

    @classmethod
    def from_runset(cls, runset: RunSet) -> "ResultsStore":
        """The store of already verified runs, collected with ``keep_ledgers=True``: the ledger
        table holds the entries as verified, never a later read of a file that may have changed."""
        unkept = [r.path for r in runset.runs + runset.failed if r.ledger is None]
        if unkept:
            raise StoreError(f"run {unkept[0]} carries no verified ledger entries: collect the runs with "
                             "collect_runs(paths, keep_ledgers=True)")
        con = _connect(None)
        ledger = _LedgerTable(con)
        for run in runset.runs + runset.failed:
            ledger.add(run, run.ledger or [])
        ledger.flush()
        cls._load_runs(con, runset)
        return cls(con)

    @staticmethod
    def _load_runs(con: duckdb.DuckDBPyConnection, runset: RunSet) -> None:
        """The runs, verdicts and excluded tables of ``runset``."""
        runs, verdicts = [], []
        for run in runset.runs + runset.failed:
            rec, run_id = run.record, str(run.path)
            runs.append({"run_id": run_id, "label": run.label, "task": rec.task, "profile": rec.profile,
                         "method": rec.method, "seed": rec.seed, "status": rec.status,
                         "test_score": rec.test_score, "val_score": rec.val_score,
                         "metric_calls": rec.usage.get("metric_calls"),
                         "metric_call_budget": rec.usage.get("metric_call_budget"),
                         "final_candidate_id": rec.final_candidate_id, "ledger_entries": rec.ledger_entries,
                         "ledger_head": rec.ledger_head, "error": rec.error})
            for split, held in (("test", rec.test_verdicts), ("val", rec.val_verdicts)):
                verdicts += [{"run_id": run_id, "split": split, "example_id": v["example_id"],
                              "score": float(v["score"]), "valid": bool(v.get("valid", True)),
                              "error_kind": v.get("error_kind")} for v in held]
        excluded = [{"run_id": str(e.path), "reason": e.reason} for e in runset.excluded]
        for name, rows, schema in (("runs", runs, _RUNS), ("verdicts", verdicts, _VERDICTS),
                                   ("excluded", excluded, _EXCLUDED)):
            arrow = pa.Table.from_pylist(rows, schema=schema)  # noqa: F841 (read by DuckDB by name)
            con.execute(f"CREATE TABLE {name} AS SELECT * FROM arrow")

    @classmethod
    def from_parquet(cls, export_dir: str | Path) -> "ResultsStore":
        con = duckdb.connect(":memory:")
        for name in TABLES:
            path = Path(export_dir) / f"{name}.parquet"
            try:
                con.execute(f"CREATE TABLE {name} AS SELECT * FROM read_parquet($path)", {"path": str(path)})
            except duckdb.Error as exc:
                raise StoreError(f"cannot read the export {path}: {exc}") from None
        return cls(con)

    # -- using ------------------------------------------------------------------------------------
    def query(self, sql: str, params: dict[str, Any] | None = None) -> QueryResult:
        try:
            relation = self.con.execute(sql, params or {})
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(f"query failed: {first}") from None
        if relation.description is None:
            return QueryResult([], [])
        return QueryResult([d[0] for d in relation.description], relation.fetchall())

    def count(self, table: str) -> int:
        if table not in TABLES:
            raise StoreError(f"no table {table!r}; tables: {', '.join(TABLES)}")
        return self.con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]

    def close(self) -> None:
        """Close the database and remove its scratch dir (also done when the store is let go)."""
        self.con.close()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def export_parquet(self, out_dir: str | Path) -> list[Path]:
        """One Parquet file per table in ``out_dir`` (created); returns the files written."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name in TABLES:  # each file whole or not at all: written under a temp name, then renamed
            path = out / f"{name}.parquet"
            tmp = Path(writer_temp_name(str(path)))
            try:
                self.con.execute(f"COPY (SELECT * FROM {name}) TO $path (FORMAT parquet)", {"path": str(tmp)})
                os.replace(tmp, path)
            except duckdb.IOException as exc:  # DuckDB's own class for the system's error: a full disk is one line
                if "No space left on device" in str(exc):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from None
                raise StoreError(f"cannot write {path}: {exc}") from None
            finally:
                tmp.unlink(missing_ok=True)
            written.append(path)
        return written


def reads_ledger(sql: str) -> bool:
    """Whether ``sql`` may read the ``ledger`` table: whether it names it at all, as a word (a
    parser would miss ``query_table('ledger')``; a query that names it without reading it only
    loads what it does not need)."""
    return _LEDGER_WORD.search(sql) is not None


_LEDGER_WORD = re.compile(r"(?<!\w)ledger(?!\w)", re.IGNORECASE)


# a store holding ledger entries keeps at most this much of them in memory (DuckDB's buffer pool;
# the rest lives in its file, and a query past it spills): at 10% of the paper study a 1 GB limit
# peaked at 475 MB, 128 MB at 453 MB, 64 MB at 395 MB (the rest is the imports and one ledger)
_MEMORY_LIMIT = "128MB"


def _connect(scratch: tempfile.TemporaryDirectory | None) -> duckdb.DuckDBPyConnection:
    if scratch is None:
        return duckdb.connect(":memory:")
    con = duckdb.connect(str(Path(scratch.name) / "store.duckdb"))
    con.execute(f"SET memory_limit = '{_MEMORY_LIMIT}'")
    con.execute("SET temp_directory = $dir", {"dir": str(Path(scratch.name) / "spill")})
    return con


class _LedgerTable:
    """The ``ledger`` table, filled as runs are counted: each counted run's entries as verified, cut
    at the entry count its record is anchored to (an entry appended later is not read). Entries
    wait in columns until :data:`FLUSH_ROWS` of them (or :meth:`flush`): an insert per run cost
    about 3x the CPU of the same rows in few inserts, and the columns held bound the memory."""

    FLUSH_ROWS = 20_000

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        empty = _LEDGER.empty_table()  # noqa: F841 (read by DuckDB by name): the columns of _LEDGER, typed once
        con.execute("CREATE TABLE ledger AS SELECT * EXCLUDE (data), data::JSON AS data FROM empty")
        self.columns: dict[str, list[Any]] = {name: [] for name in _LEDGER.names}

    def add(self, run: Run, entries: Sequence[dict[str, Any]]) -> None:
        run_id = str(run.path)
        columns = self.columns
        for entry in entries[:run.record.ledger_entries]:
            data = entry["data"]
            verdict = data.get("verdict") if isinstance(data, dict) else None
            score = verdict.get("score") if isinstance(verdict, dict) else None
            for name, value in (("run_id", run_id), ("seq", entry["seq"]), ("kind", entry["kind"]),
                                ("time", entry["time"]), ("split", data.get("split")),
                                ("candidate_id", data.get("candidate_id")),
                                ("example_id", data.get("example_id")),
                                ("score", float(score) if isinstance(score, (int, float)) else None),
                                ("data", json.dumps(data, sort_keys=True, ensure_ascii=False))):
                columns[name].append(value)
        if len(columns["seq"]) >= self.FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        """Insert the entries waiting (every caller flushes once all runs are counted)."""
        if not self.columns["seq"]:
            return
        arrow = pa.Table.from_pydict(self.columns, schema=_LEDGER)  # noqa: F841 (read by DuckDB by name)
        self.con.execute("INSERT INTO ledger SELECT * EXCLUDE (data), data::JSON AS data FROM arrow")
        self.columns = {name: [] for name in _LEDGER.names}
