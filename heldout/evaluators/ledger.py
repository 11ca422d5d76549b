"""The ledger: an append-only, hash-chained record of every evaluation and budget event of a
session, the system of record every report is derived from.

Each line is one JSON entry ``{"seq", "prev", "kind", "time", "data", "hash"}`` where ``hash`` is
the sha256 of the canonical JSON of the other fields and ``prev`` is the previous entry's hash
(the first entry's ``prev`` is 64 zeros). An entry is written, flushed and fsynced before the
result it records is returned. A sidecar ``ledger.head`` holds the count and last hash, so a
dropped *tail* is caught too. This is tamper-evident, not tamper-proof: someone who rewrites the
whole chain and the head can forge it; the run record keeps the head hash as a further anchor.

A torn last line (the process was killed mid-write) is not tampering: :meth:`Ledger.open`
truncates it and records a ``torn_tail_repaired`` entry, so nothing that was acknowledged is lost."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from heldout.contracts import HeldoutError, canonical_json, sha256_text

GENESIS = "0" * 64
LEDGER_FILE = "ledger.jsonl"
HEAD_FILE = "ledger.head"


class LedgerError(HeldoutError):
    pass


def entry_hash(entry: dict[str, Any]) -> str:
    return sha256_text(canonical_json({k: entry[k] for k in ("seq", "prev", "kind", "time", "data")}))


@dataclass
class LedgerReport:
    path: str
    entries: int = 0
    problems: list[str] = field(default_factory=list)
    head: str = GENESIS

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        if self.ok:
            return f"{self.path}: {self.entries} entries, chain intact, head {self.head[:16]}"
        return f"{self.path}: LEDGER INVALID\n  " + "\n  ".join(self.problems)


def read_entries(path: Path) -> tuple[list[dict[str, Any]], bytes]:
    """All complete entries, plus the bytes of a torn (unterminated) last line, if any."""
    raw = path.read_bytes() if path.exists() else b""
    torn = b""
    if raw and not raw.endswith(b"\n"):
        cut = raw.rfind(b"\n") + 1
        raw, torn = raw[:cut], raw[cut:]
    entries = []
    for lineno, line in enumerate(raw.splitlines(), 1):
        try:
            entries.append(json.loads(line))
        except ValueError as exc:
            raise LedgerError(f"{path} line {lineno} is not JSON: {exc}") from exc
    return entries, torn


def verify_ledger(run_dir: str | Path) -> LedgerReport:
    """Check the chain: every hash, every link, the sequence numbers and the head file. Detects
    an edited, dropped, inserted or reordered entry."""
    run_dir = Path(run_dir)
    path = run_dir / LEDGER_FILE
    report = LedgerReport(path=str(path))
    if not path.exists():
        report.problems.append("no ledger file")
        return report
    try:
        entries, torn = read_entries(path)
    except LedgerError as exc:
        report.problems.append(str(exc))
        return report
    if torn:
        report.problems.append(f"torn last line ({len(torn)} bytes): the writer was interrupted; "
                               "re-opening the session repairs it")
    prev = GENESIS
    for index, entry in enumerate(entries):
        where = f"entry {index}"
        if not isinstance(entry, dict) or not {"seq", "prev", "kind", "time", "data", "hash"} <= set(entry):
            report.problems.append(f"{where}: missing fields")
            break
        if entry["seq"] != index:
            report.problems.append(f"{where}: sequence number {entry['seq']} (an entry was dropped, "
                                   "inserted or reordered)")
        if entry["prev"] != prev:
            report.problems.append(f"{where} (seq {entry['seq']}): does not link to the previous entry")
        if entry_hash(entry) != entry["hash"]:
            report.problems.append(f"{where} (seq {entry['seq']}, {entry['kind']}): content was edited")
        prev = entry["hash"]
    report.entries = len(entries)
    report.head = prev
    head_path = run_dir / HEAD_FILE
    if head_path.exists():
        try:
            head = json.loads(head_path.read_text())
            if head.get("count") != len(entries) or head.get("hash") != prev:
                report.problems.append(f"head file says {head.get('count')} entries ending "
                                       f"{str(head.get('hash'))[:16]}, ledger has {len(entries)} ending "
                                       f"{prev[:16]} (entries dropped or appended behind the writer's back)")
        except ValueError:
            report.problems.append("head file is not JSON")
    elif entries:
        report.problems.append("head file is missing")
    return report


class Ledger:
    """Append-only writer. One per session; thread-safe; every append is durable on return."""

    def __init__(self, run_dir: Path, entries: list[dict[str, Any]]) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LEDGER_FILE
        self._entries = entries
        self._lock = threading.Lock()
        self._fh = open(self.path, "ab")

    @classmethod
    def open(cls, run_dir: str | Path) -> "Ledger":
        """Open (or create) the ledger of ``run_dir``. An existing ledger must verify (a torn last
        line is repaired and the repair recorded); anything else is refused."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LEDGER_FILE
        entries, torn = read_entries(path)
        if torn:
            with open(path, "r+b") as fh:
                fh.truncate(path.stat().st_size - len(torn))
        if not path.exists():
            return cls(run_dir, [])
        report = verify_ledger(run_dir)
        if _head_lags_by_one(run_dir, entries):
            # killed after the entry was durable but before the head was updated: benign
            report.problems = [p for p in report.problems if not p.startswith("head file says")]
        if not report.ok:
            raise LedgerError("refusing to resume on a ledger that does not verify:\n" + report.describe())
        ledger = cls(run_dir, entries)
        if torn:
            ledger.append("torn_tail_repaired", {"bytes_dropped": len(torn)})
        return ledger

    @property
    def head(self) -> str:
        return self._entries[-1]["hash"] if self._entries else GENESIS

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self, kind: str | None = None) -> Iterator[dict[str, Any]]:
        return (e for e in list(self._entries) if kind is None or e["kind"] == kind)

    def append(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            entry = {"seq": len(self._entries), "prev": self.head, "kind": kind,
                     "time": round(time.time(), 6), "data": encodable(data)}
            entry["hash"] = entry_hash(entry)
            line = json.dumps(entry, sort_keys=True, ensure_ascii=False, default=_json_default) + "\n"
            self._fh.write(line.encode("utf-8"))
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._entries.append(json.loads(line))
            head = self.run_dir / HEAD_FILE
            tmp = head.with_suffix(".tmp")
            tmp.write_text(json.dumps({"count": len(self._entries), "hash": entry["hash"]}))
            os.replace(tmp, head)
            return entry

    def close(self) -> None:
        self._fh.close()


def _head_lags_by_one(run_dir: Path, entries: list[dict[str, Any]]) -> bool:
    try:
        head = json.loads((run_dir / HEAD_FILE).read_text())
    except (OSError, ValueError):
        return False
    previous = entries[-2]["hash"] if len(entries) >= 2 else GENESIS
    return bool(entries) and head.get("count") == len(entries) - 1 and head.get("hash") == previous


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def encodable(value: Any) -> Any:
    """``value`` with every text UTF-8 encodable, so any model output can be recorded: a lone
    surrogate becomes U+FFFD, ``bytes`` are decoded as UTF-8 (bad bytes -> U+FFFD), numpy values
    become plain data. Control characters are kept (JSON escapes them losslessly)."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, dict):
        return {encodable(k) if isinstance(k, (str, bytes)) else k: encodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encodable(v) for v in value]
    if hasattr(value, "tolist"):
        return encodable(value.tolist())
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"ledger entries hold plain data only, got {type(value).__name__}")
