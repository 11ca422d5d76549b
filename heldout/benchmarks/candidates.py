"""Reading candidates from files, the same way for every task."""

from __future__ import annotations

import json
from pathlib import Path

from heldout.contracts import Candidate, MalformedCandidate, check_candidate, read_user_text

MAX_CANDIDATE_BYTES = 8 * 1024 * 1024


def read_candidate(path: str | Path, default_component: str) -> Candidate:
    """A ``.json`` object of str -> str is a candidate as is; any other file becomes
    ``{default_component: text}``; a folder becomes one component per (relative) file path."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
        if not files:
            raise MalformedCandidate(f"candidate folder {p} holds no files")
        return {str(f.relative_to(p)): _read_text(f) for f in files}
    text = _read_text(p)
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise MalformedCandidate(f"{p}: not valid JSON: {exc}") from exc
        if isinstance(data, dict) and data and all(isinstance(v, str) for v in data.values()):
            check_candidate(data)
            return data
    return {default_component: text}


def _read_text(p: Path) -> str:
    if not p.exists():
        raise MalformedCandidate(f"candidate file {p} does not exist")
    return read_user_text(p, "candidate file", max_bytes=MAX_CANDIDATE_BYTES, error=MalformedCandidate)
