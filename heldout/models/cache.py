"""Persistent response cache: one sqlite file in a directory, safe across threads and processes.

Rule: an entry is written once and never changed (first writer wins), so every process that
shares a cache directory sees the same answer for the same :meth:`ChatRequest.cache_key`.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from heldout.contracts import HeldoutError, canonical_json

from heldout.models.types import ChatRequest, ChatResponse

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    request TEXT NOT NULL,
    text TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    created REAL NOT NULL
)
"""


class CacheError(HeldoutError):
    """The cache file exists but cannot be used (not sqlite, or another schema)."""


@dataclass(frozen=True)
class CachedResponse:
    text: str
    prompt_tokens: int
    completion_tokens: int


class ResponseCache:
    """``ResponseCache(directory)`` keeps responses in ``directory/responses.sqlite3``."""

    FILENAME = "responses.sqlite3"

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / self.FILENAME
        self._lock = threading.Lock()
        # One connection shared by this object's threads (under the lock); other processes use
        # their own, and sqlite's file locking (WAL, busy timeout) keeps them consistent.
        self._db = sqlite3.connect(self.path, timeout=60.0, check_same_thread=False,
                                   isolation_level=None)
        try:
            self._db.execute("PRAGMA busy_timeout = 60000")
            self._set_wal()
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._db.execute(_SCHEMA)
            self._db.execute("SELECT key, model, request, text, prompt_tokens, completion_tokens,"
                             " created FROM responses LIMIT 0")
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise CacheError(f"{self.path} is not a usable response cache ({exc}); move it away "
                             "or point the cache at another directory") from exc

    def _set_wal(self, patience: float = 60.0) -> None:
        # Switching a new file to WAL takes an exclusive lock and sqlite answers "database is
        # locked" at once, without its busy handler, while another process opens the same new
        # file: wait for it like the busy timeout would.
        deadline = time.monotonic() + patience
        while True:
            try:
                self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def get(self, key: str) -> CachedResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT text, prompt_tokens, completion_tokens FROM responses WHERE key = ?",
                (key,)).fetchone()
        return CachedResponse(*row) if row else None

    def put(self, key: str, request: ChatRequest, response: ChatResponse) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, request.model, canonical_json(request.to_dict()), response.text,
                 response.prompt_tokens, response.completion_tokens, time.time()))

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "ResponseCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.directory)!r})"
