"""Reading candidates from files, the same way for every task."""

from __future__ import annotations

import json
from pathlib import Path

from heldout.contracts import Candidate, MalformedCandidate, check_candidate
from heldout.files import read_user_text, regular_files

MAX_CANDIDATE_BYTES = 8 * 1024 * 1024


def read_candidate(path: str | Path, default_component: str) -> Candidate:
    """A ``.json`` object of str -> str is a candidate as is; any other file becomes
    ``{default_component: text}``; a folder becomes one component per (relative) file path.
    What is read goes into a sandbox, so it is regular files from inside the folder only: a
    symbolic link (the candidate file itself, or anything in the folder) or a FIFO, device or
    socket is one :class:`MalformedCandidate` (:func:`~heldout.files.regular_files`)."""
    p = Path(path)
    if p.is_dir() and not p.is_symlink():
        files = regular_files(p, "candidate folder", error=MalformedCandidate)
        if not files:
            raise MalformedCandidate(f"candidate folder {p} holds no files")
        return {name: _read_text(p / name) for name in files}
    text = _read_text(p)
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise MalformedCandidate(f"{p}: not valid JSON: {exc}") from exc
        if not (isinstance(data, dict) and data and all(isinstance(v, str) for v in data.values())):
            raise MalformedCandidate(f"{p}: a .json candidate is an object of component name -> text, e.g. "
                                     f'{{"{default_component}": "..."}}; got {_json_kind(data)}')
        return check_candidate(data)
    return {default_component: text}


def _json_kind(data: object) -> str:
    if isinstance(data, dict):
        return "an empty object" if not data else "an object with a value that is not text"
    return f"JSON {type(data).__name__}"


def _read_text(p: Path) -> str:
    text = read_user_text(p, "candidate file", max_bytes=MAX_CANDIDATE_BYTES, error=MalformedCandidate,
                          follow_symlinks=False)
    if not text.strip():
        raise MalformedCandidate(f"candidate file {p} is empty")
    return text
