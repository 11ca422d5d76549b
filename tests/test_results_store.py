"""The results store: DuckDB over the verified runs of a 10,000-cell synthetic study (ledgers and
records written through the real Ledger and RunRecord), checked against a direct computation;
tampered runs are excluded, never counted; Parquet exports answer the same queries."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

from heldout.cli import main as cli_main
from heldout.evaluators.ledger import LEDGER_FILE, read_entries
from heldout.evaluators.records import RECORD_FILE
from heldout.reports.collect import collect_runs
from heldout.reports.store import TABLES, ResultsStore, StoreError
from synthetic_study import write_run, write_study

N_TASKS, N_METHODS, N_SEEDS = 25, 8, 50  # 10,000 cells
FAILED_EVERY = 97


@pytest.fixture(scope="module")
def study():
    """The synthetic study (on tmpfs when there is one: every ledger append is fsynced), with two
    runs tampered after the fact: a held-out score edited in a record, and an edited ledger entry."""
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="heldout-store-", dir=shm if shm.is_dir() else None))
    truth = write_study(root, N_TASKS, N_METHODS, N_SEEDS, failed_every=FAILED_EVERY)
    edited_record, edited_ledger = truth[10], truth[20]
    record = json.loads((edited_record.run_dir / RECORD_FILE).read_text())
    record["test_verdicts"][0]["score"] = 1.0
    (edited_record.run_dir / RECORD_FILE).write_text(json.dumps(record))
    ledger = edited_ledger.run_dir / LEDGER_FILE
    ledger.write_text(ledger.read_text().replace('"train-0", "score": 0.', '"train-0", "score": 1', 1))
    counted = [r for r in truth if r not in (edited_record, edited_ledger)]
    yield root, counted, {edited_record.run_dir, edited_ledger.run_dir}
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def store(study):
    return ResultsStore.open([study[0]])


def test_a_10000_cell_study_has_every_verified_run_and_excludes_the_tampered_ones(study, store):
    root, counted, tampered = study
    assert len(counted) + len(tampered) == N_TASKS * N_METHODS * N_SEEDS == 10_000
    assert store.count("runs") == len(counted)
    excluded = store.query("SELECT run_id, reason FROM excluded ORDER BY run_id").rows
    assert {Path(run_id) for run_id, _ in excluded} == tampered
    assert any("edited after the session wrote it" in reason for _, reason in excluded)
    assert any("ledger does not verify" in reason for _, reason in excluded)
    status = dict(store.query("SELECT status, count(*) FROM runs GROUP BY status").rows)
    assert status == {"ok": sum(r.status == "ok" for r in counted), "failed": sum(r.status == "failed" for r in counted)}
    assert status["failed"] > 0


def test_the_stores_means_match_a_direct_computation(study, store):
    _, counted, _ = study
    direct: dict[tuple[str, str], list[float]] = defaultdict(list)
    for run in counted:
        if run.status == "ok":
            direct[(run.task, run.method)].append(run.test_score)
    rows = store.query("SELECT task, method, count(*), avg(test_score) FROM runs WHERE status = 'ok' "
                       "GROUP BY ALL ORDER BY ALL").rows
    assert len(rows) == N_TASKS * N_METHODS
    for task, method, n, mean in rows:
        scores = direct[(task, method)]
        assert n == len(scores) and mean == pytest.approx(sum(scores) / len(scores), abs=1e-12)
    # per-example held-out means, from the verdicts table and from the ledger table: the same numbers
    by_example: dict[str, list[float]] = defaultdict(list)
    for run in counted:
        for example, score in run.test_scores.items():
            by_example[example].append(score)
    from_verdicts = dict(store.query("SELECT example_id, avg(score) FROM verdicts WHERE split = 'test' "
                                     "GROUP BY ALL").rows)
    from_ledger = dict(store.query("SELECT example_id, avg(score) FROM ledger WHERE kind = 'test_scoring' "
                                   "GROUP BY ALL").rows)
    assert from_verdicts.keys() == from_ledger.keys() == by_example.keys()
    for example, scores in by_example.items():
        assert from_verdicts[example] == pytest.approx(sum(scores) / len(scores), abs=1e-12)
        assert from_ledger[example] == pytest.approx(from_verdicts[example], abs=1e-12)
    calls = store.query("SELECT sum(metric_calls) FROM runs").rows[0][0]
    assert calls == sum(r.metric_calls for r in counted)


def test_a_parquet_export_answers_the_same_queries(study, store, tmp_path):
    written = store.export_parquet(tmp_path / "export")
    assert sorted(p.name for p in written) == sorted(f"{t}.parquet" for t in TABLES)
    frozen = ResultsStore.open([tmp_path / "export"])
    sql = "SELECT method, count(*), avg(test_score), sum(metric_calls) FROM runs GROUP BY ALL ORDER BY ALL"
    assert frozen.query(sql).rows == store.query(sql).rows
    for table in TABLES:
        assert frozen.count(table) == store.count(table)


def test_heldout_runs_query_and_export_on_the_cli(tmp_path, capsys):
    runs = [write_run(tmp_path / "study", "synthetic/a", m, s) for m in ("m1", "m2") for s in (0, 1)]
    assert cli_main(["runs", "query", str(tmp_path / "study"),
                     "SELECT method, avg(test_score) AS mean FROM runs GROUP BY ALL ORDER BY 1", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for row in rows:
        mine = [r.test_score for r in runs if r.method == row["method"]]
        assert row["mean"] == pytest.approx(sum(mine) / len(mine))
    assert [r["method"] for r in rows] == ["m1", "m2"]
    assert cli_main(["runs", "export", str(tmp_path / "study"), "--parquet", str(tmp_path / "out")]) == 0
    assert "runs.parquet  (4 rows)" in capsys.readouterr().out
    assert cli_main(["runs", "query", str(tmp_path / "out"), "SELECT nope FROM runs"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("heldout: error: query failed:") and "nope" in err and len(err.splitlines()) == 1


def test_a_missing_table_is_a_clear_error(tmp_path):
    write_run(tmp_path, "synthetic/a", "m", 0)
    with pytest.raises(StoreError, match="no table 'nope'"):
        ResultsStore.open([tmp_path]).count("nope")


def test_the_ledger_table_holds_the_entries_verified_not_a_later_read(tmp_path):
    """The adversary rewrites a ledger between verification and loading: the store keeps what
    was verified (one read per run), so the rewrite never reaches a query."""
    run = write_run(tmp_path, "synthetic/a", "m", 0)
    runset = collect_runs([tmp_path], keep_ledgers=True)
    ledger = run.run_dir / LEDGER_FILE
    ledger.write_text(ledger.read_text().replace('"train-0", "score": 0.', '"train-0", "score": 1', 1))
    assert not collect_runs([tmp_path]).runs  # the rewrite is caught by any later read ...
    store = ResultsStore.from_runset(runset)  # ... and the store built from the verified read has none of it
    (verified_score,) = store.query("SELECT score FROM ledger WHERE example_id = 'train-0'").rows[0]
    assert verified_score < 1
    assert store.count("ledger") == runset.runs[0].record.ledger_entries


def test_a_runset_collected_without_its_ledgers_is_a_clear_error(tmp_path):
    write_run(tmp_path, "synthetic/a", "m", 0)
    with pytest.raises(StoreError, match=r"no verified ledger entries.*keep_ledgers=True"):
        ResultsStore.from_runset(collect_runs([tmp_path]))


def test_a_store_loads_each_runs_ledger_as_it_is_verified_not_every_ledger_at_once(tmp_path, monkeypatch):
    """A paper-sized study's entries do not fit in memory at once: the store verifies a run, takes
    its entries as rows and lets the ledger go before it reads the next one; the rows wait for the
    database file in batches of at most ``FLUSH_ROWS`` (one insert per run cost 3x the CPU)."""
    import heldout.reports.collect as collect
    import heldout.reports.store as store_module
    for seed in range(3):
        write_run(tmp_path, "synthetic/a", "m", seed)
    events = []
    real_check, real_add, real_flush = collect.check_run, store_module._LedgerTable.add, store_module._LedgerTable.flush
    monkeypatch.setattr(collect, "check_run", lambda run_dir: (events.append("verify"), real_check(run_dir))[1])
    monkeypatch.setattr(store_module._LedgerTable, "add",
                        lambda self, run, entries: (events.append("load"), real_add(self, run, entries))[1])
    waiting = []
    monkeypatch.setattr(store_module._LedgerTable, "flush",
                        lambda self: (waiting.append(len(self.columns["seq"])), real_flush(self))[1])
    monkeypatch.setattr(store_module._LedgerTable, "FLUSH_ROWS", 10)
    store = ResultsStore.open([tmp_path])
    assert events == ["verify", "load"] * 3
    assert len(waiting) >= 2 and max(waiting) < 10 + max_entries_of_one_run(tmp_path)  # bounded by the batch
    kept = ResultsStore.from_runset(collect_runs([tmp_path], keep_ledgers=True))  # every ledger held at once
    every_entry = "SELECT * FROM ledger ORDER BY run_id, seq"
    assert store.query(every_entry).rows == kept.query(every_entry).rows and store.count("ledger") > 20
    scratch = Path(store._scratch.name)
    assert (scratch / "store.duckdb").is_file()
    store.close()
    assert not scratch.exists()


def max_entries_of_one_run(root: Path) -> int:
    return max(len(read_entries(p)[0]) for p in root.rglob(LEDGER_FILE))


def test_a_query_that_reads_no_ledger_entry_loads_none(tmp_path, monkeypatch, capsys):
    from heldout.reports.store import reads_ledger
    import heldout.reports.store as store_module
    assert not reads_ledger("SELECT task, avg(test_score) FROM runs WHERE ledger_entries > 0 GROUP BY ALL")
    assert reads_ledger("WITH e AS (SELECT * FROM Ledger) SELECT count(*) FROM e JOIN runs USING (run_id)")
    assert reads_ledger("SELECT count(*) FROM query_table('ledger')")  # named in a string: still read
    write_run(tmp_path, "synthetic/a", "m", 0)
    monkeypatch.setattr(store_module._LedgerTable, "add", lambda *a: pytest.fail("a ledger was loaded"))
    assert cli_main(["runs", "query", str(tmp_path), "SELECT count(*) AS n FROM runs"]) == 0
    assert "1" in capsys.readouterr().out
