"""Record and replay model traffic as JSONL, one request/response pair a line.

A :class:`Recorder` appends every answered request (whatever served it) and flushes each line,
so a process killed mid-write leaves a file that is readable up to its last full line. A
:class:`Replay` answers from such a file with zero endpoint calls; a request the recording does
not hold is a clear :class:`ReplayMiss`, never a silent call to a model.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heldout.contracts import canonical_json
from heldout.models.types import ChatRequest, ChatResponse, ModelError

RECORD_VERSION = 1


class ReplayError(ModelError):
    """A recording that cannot be replayed (missing, edited, or corrupt before its last line)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="replay_error")


class ReplayMiss(ModelError):
    """A request that is not in the recording being replayed."""

    def __init__(self, message: str, request_key: str) -> None:
        super().__init__(message, kind="replay_miss", request_key=request_key)


def _repair_torn_tail(path: Path) -> None:
    """Drop a partial last line (a write interrupted by a crash) so appends start on a fresh line."""
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "rb+") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return
        # Scan back in blocks for the last newline; everything after it is the torn line.
        pos, keep = size, 0
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step)
            cut = block.rfind(b"\n")
            if cut >= 0:
                keep = pos + cut + 1
                break
        fh.seek(keep)
        tail = fh.read()
        try:
            json.loads(tail.decode("utf-8"))
        except ValueError:
            fh.truncate(keep)  # an interrupted write: drop it
        else:
            fh.write(b"\n")  # a whole line that only lost its newline: keep it


class Recorder:
    """``Recorder(path)`` appends to ``path`` (created if missing; a torn last line is dropped)."""

    def __init__(self, path: str | Path, *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            _repair_torn_tail(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._fsync = fsync
        self._lock = threading.Lock()
        self.lines = 0

    def write(self, request: ChatRequest, response: ChatResponse) -> None:
        line = canonical_json({
            "v": RECORD_VERSION, "key": response.request_key, "request": request.to_dict(),
            "response": {"text": response.text, "prompt_tokens": response.prompt_tokens,
                         "completion_tokens": response.completion_tokens},
            "source": response.source,
        })
        with self._lock:
            # One write call per line keeps lines whole as far as the OS allows.
            self._fh.write(line + "\n")
            self._fh.flush()
            if self._fsync:
                os.fsync(self._fh.fileno())
            self.lines += 1

    def close(self) -> None:
        with self._lock:
            self._fh.close()

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class RecordedResponse:
    text: str
    prompt_tokens: int
    completion_tokens: int


def read_recording(path: str | Path) -> list[dict[str, Any]]:
    """Every full line of a recording, checked. A torn last line (no newline, not JSON) is
    skipped; a bad line anywhere else, or a line whose key does not match its request, is a
    :class:`ReplayError` naming the line."""
    path = Path(path)
    if not path.is_file():
        raise ReplayError(f"no recording at {path}: record the run first (Recorder) or fix the path")
    with open(path, "rb") as fh:
        raw = fh.read()
    lines = raw.split(b"\n")
    torn_tail = not raw.endswith(b"\n")  # then the last piece is an interrupted write
    entries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = number == len(lines)
        try:
            entry = json.loads(line.decode("utf-8"))
            request = ChatRequest.from_dict(entry["request"])
            response = entry["response"]
            recorded = RecordedResponse(str(response["text"]), int(response["prompt_tokens"]),
                                        int(response["completion_tokens"]))
        except (ValueError, KeyError, TypeError) as exc:
            if last and torn_tail:
                break
            raise ReplayError(f"{path} line {number} is not a recorded model call "
                              f"({type(exc).__name__}: {exc}); the recording is corrupt") from None
        if entry.get("key") != request.cache_key():
            raise ReplayError(f"{path} line {number}: recorded key does not match its request; "
                              "the recording was edited")
        entries.append({"key": entry["key"], "request": request, "response": recorded,
                        "source": entry.get("source")})
    return entries


class Replay:
    """Answers requests from a recording; never calls an endpoint."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._responses: dict[str, RecordedResponse] = {}
        for entry in read_recording(self.path):
            # A key answered twice (e.g. recorded from cache later) keeps its first answer.
            self._responses.setdefault(entry["key"], entry["response"])
        self._lock = threading.Lock()
        self.served = 0

    def __len__(self) -> int:
        return len(self._responses)

    def __contains__(self, request: ChatRequest) -> bool:
        return request.cache_key() in self._responses

    def lookup(self, request: ChatRequest) -> RecordedResponse:
        key = request.cache_key()
        found = self._responses.get(key)
        if found is None:
            first = request.last_text
            snippet = first[:80] + ("..." if len(first) > 80 else "")
            quoted = "prompt" if request.is_completion else "last message"
            raise ReplayMiss(
                f"request not in recording {self.path} (model={request.model!r}, "
                f"temperature={request.temperature:g}, replicate={request.replicate}, "
                f"key={key[:12]}, {quoted} {snippet!r}); replay makes no endpoint calls, so "
                "a changed run must be recorded again", request_key=key)
        with self._lock:
            self.served += 1
        return found
