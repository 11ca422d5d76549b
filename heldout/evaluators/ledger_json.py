"""What a ledger entry may hold, as JSON: any model output made recordable (UTF-8, plain data),
checked in one C pass when it already is, rebuilt value by value only when it is not."""

from __future__ import annotations

import json
import re
from typing import Any

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def plain_json(value: Any) -> bool:
    """Whether ``value`` is already what :func:`encodable` makes of it, as JSON: it serialises
    without help and as UTF-8 (no bytes, numpy values or lone surrogates). One pass in C, where
    :func:`encodable` walks every value in Python: a model's output is checked, not rebuilt."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError):
        return False
    return True


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


def json_default(value: Any) -> Any:
    """``json.dumps``'s fallback for a ledger entry: numpy values as plain data, nothing else."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"ledger entries hold plain data only, got {type(value).__name__}")


__all__ = ["encodable", "json_default", "plain_json"]
