"""Trusted helper that runs inside the sandbox next to a Python candidate (``program.py`` with
``score(program: str) -> int``): it calls ``score`` on a whole batch in one process, so a batch
costs one process start, and reports per string either the integer or why there is none.

Copied into the sandbox as ``_heldout_lockpicking.py`` (a reserved name candidates cannot use)."""

import importlib
import numbers

MAX_ERROR_CHARS = 300


def _load_score():
    module = importlib.import_module("program")
    score = getattr(module, "score", None)
    if not callable(score):
        raise TypeError("program.py must define score(program: str) -> int")
    return score


def _one(score, program):
    """(value, error): value is the int when score returned an integer, else None."""
    try:
        value = score(program)
    except Exception as exc:  # the candidate's failure on one string is that string's verdict
        return None, f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None, f"score() returned {type(value).__name__} {value!r:.60}, not an int"
    return int(value), None


def score_batch(programs):
    """[[value or None, error or None], ...] in input order."""
    score = _load_score()
    return [list(_one(score, p)) for p in programs]


def score_exhaustive(malformed):
    """All 10^6 six-digit strings in order, then ``malformed``, as one compact string: the digit
    of each output 0..9, or 'x' when the output is not an integer in 0..9; plus the first error."""
    score = _load_score()
    codes = []
    first_error = None
    strings = [f"{k:06d}" for k in range(10**6)] + list(malformed)
    for program in strings:
        value, error = _one(score, program)
        if value is not None and 0 <= value <= 9:
            codes.append(chr(48 + value))
        else:
            codes.append("x")
            if first_error is None:
                first_error = f"on {program!r}: {error or f'output {value} is not a count 0..6'}"
    return {"codes": "".join(codes), "first_error": first_error}
