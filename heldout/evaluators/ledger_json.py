"""What a ledger entry may hold, as JSON: any model output made recordable (UTF-8, plain data;
the writer rebuilds an entry value by value only when its one encoding fails); and how a model
output is stored packed (:func:`pack_outputs`, :func:`unpack_outputs`).

**Packed outputs.** A model output is most of an evaluation's bytes (a chain of thought is
kilobytes, the rest of the entry a few hundred). In a stored line, every string of at least
:data:`PACK_MIN_CHARS` characters inside ``data["verdict"]["output"]`` is either compressed
(zlib, then base64, when that is shorter) or, when this writer already stored the same string, a
reference to where it first was (a memo hit records its verdict again: the output is stored
once). The line then carries ``"packed": [[path, form], ...]``: ``path`` the keys from ``data``
to the value, ``form`` ``"z"`` (the value is base64 of zlib of its UTF-8) or ``[line, path]``
(the same string as at ``path`` of that earlier line's data, as read). Everything else of the
entry stays plain JSON. The hash is of the entry as recorded (unpacked), so the chain, the head
and every anchor are the same whichever way the line is stored, and a line written before
packing reads as it always did. A packed value that does not inflate, inflates past
:data:`MAX_UNPACKED_CHARS`, or refers to nothing is :class:`UnpackError`: the reader names the
entry (tampering); one that inflates to other content fails the entry's hash."""

from __future__ import annotations

import base64
import binascii
import math
import re
import zlib
from typing import Any

from heldout.contracts import json_safe

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def encodable(value: Any) -> Any:
    """``value`` with every text UTF-8 encodable, so any model output can be recorded: a lone
    surrogate becomes U+FFFD, ``bytes`` are decoded as UTF-8 (bad bytes -> U+FFFD), numpy values
    become plain data, a NaN or an infinity what :func:`~heldout.contracts.json_safe` makes of it
    (strict JSON: a ledger is read by parsers that refuse ``Infinity``). Control characters are
    kept (JSON escapes them losslessly)."""
    if isinstance(value, float) and not math.isfinite(value):
        return json_safe(float(value))
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


_CONTAINERS = (dict, list, tuple)


def keys_are_text(value: Any) -> bool:
    """Whether every dict key inside ``value`` is text, as JSON reads every key back: a key that
    is not (``{2: .., 10: ..}``) would be hashed in an order no reader reproduces."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if type(key) is not str:
                    return False
                if isinstance(inner, _CONTAINERS):
                    stack.append(inner)
        elif isinstance(item, _CONTAINERS):
            stack.extend(inner for inner in item if isinstance(inner, _CONTAINERS))
    return True


PACK_MIN_CHARS = 512
# what a reader inflates from one ledger at most (a hostile line could hold a small value that
# inflates to gigabytes): far above a real session's outputs, far below a machine's memory
MAX_UNPACKED_CHARS = 1 << 30
_ZLIB_LEVEL = 1  # on a 2.5 KB chain of thought: 3% more bytes than level 6 for 20% less CPU (the hot path)


class UnpackError(ValueError):
    """A packed value that cannot be read back (see the module docstring)."""


def pack_outputs(data: dict[str, Any], line: int, stored: dict[str, tuple[int, list[Any]]]) -> tuple[Any, list[Any]]:
    """``(data as stored, packed)`` for the entry on ``line`` (see the module docstring); ``data``
    is left as it is. Paths are as a reader of the line finds them: a tuple is read as a list, and
    a dict with a key that is not text (read back as text) is left unpacked. ``stored`` maps each
    long string this writer has stored to its first line and path, and gains this entry's."""
    verdict = data.get("verdict")
    if not isinstance(verdict, dict) or "output" not in verdict:
        return data, []
    packed: list[Any] = []
    output = _pack_value(verdict["output"], ["verdict", "output"], line, stored, packed)
    if not packed:
        return data, []
    return {**data, "verdict": {**verdict, "output": output}}, packed


def _pack_value(value: Any, path: list[Any], line: int, stored: dict[str, tuple[int, list[Any]]],
                packed: list[Any]) -> Any:
    if isinstance(value, str):
        if len(value) < PACK_MIN_CHARS:
            return value
        first = stored.get(value)
        if first is not None and first[0] < line:  # a reader resolves only lines before this one
            packed.append([path, [first[0], first[1]]])
            return ""
        stored.setdefault(value, (line, path))
        raw = value.encode("utf-8")
        small = base64.b64encode(_deflate(raw)).decode("ascii")
        if len(small) >= len(raw):  # incompressible: plain is smaller
            return value
        packed.append([path, "z"])
        return small
    if isinstance(value, dict):
        if not all(type(k) is str for k in value):
            return value
        out = {k: _pack_value(v, path + [k], line, stored, packed) for k, v in value.items()}
        return out if any(out[k] is not value[k] for k in value) else value
    if isinstance(value, (list, tuple)):
        items = [_pack_value(v, path + [i], line, stored, packed) for i, v in enumerate(value)]
        return items if any(a is not b for a, b in zip(items, value)) else value
    return value


def _deflate(raw: bytes) -> bytes:
    """zlib of ``raw`` with a window just large enough for it (any reader inflates any window):
    zlib.compress prepares a 32 KB window and its hash table for every value, most of its time on
    a 2.4 KB chain of thought; this is a quarter of that CPU for the same bytes."""
    wbits = min(15, max(9, (len(raw) - 1).bit_length()))
    deflater = zlib.compressobj(_ZLIB_LEVEL, zlib.DEFLATED, wbits, max(1, wbits - 8))
    return deflater.compress(raw) + deflater.flush()


def unpack_outputs(data: Any, packed: Any, earlier: list[dict[str, Any]], budget: list[int]) -> None:
    """Put back, in ``data`` (as read from a line), every value ``packed`` names; ``earlier``: the
    entries read before it (unpacked), ``budget``: ``[characters the reader may still inflate]``.
    Raises :class:`UnpackError` naming what is wrong."""
    if not isinstance(packed, list):
        raise UnpackError("its packed list is not a list")
    for item in packed:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list) and item[0]):
            raise UnpackError(f"packed item {str(item)[:80]} is not [path, form]")
        path, form = item
        holder, key = _slot(data, path)
        if form == "z":
            holder[key] = _inflate(holder[key], budget)
        elif isinstance(form, list) and len(form) == 2 and type(form[0]) is int and 0 <= form[0] < len(earlier):
            holder2, key2 = _slot(earlier[form[0]].get("data"), form[1])
            if not isinstance(holder2[key2], str):
                raise UnpackError(f"packed value at {path} refers to line {form[0]}, which holds no text there")
            holder[key] = holder2[key2]
        else:
            raise UnpackError(f"packed value at {path} has form {str(form)[:80]}, neither \"z\" nor an earlier line")


def _slot(data: Any, path: Any) -> tuple[Any, Any]:
    """The container and key ``path`` ends at, in ``data``."""
    if not isinstance(path, list) or not path:
        raise UnpackError(f"packed path {str(path)[:80]} is not a list of keys")
    holder = data
    for key in path[:-1]:
        try:
            holder = holder[key]
        except (KeyError, IndexError, TypeError):
            raise UnpackError(f"packed path {path} is not in the entry") from None
    key = path[-1]
    if not ((isinstance(holder, dict) and isinstance(key, str) and key in holder)
            or (isinstance(holder, list) and type(key) is int and 0 <= key < len(holder))):
        raise UnpackError(f"packed path {path} is not in the entry")
    return holder, key


def _inflate(value: Any, budget: list[int]) -> str:
    if not isinstance(value, str):
        raise UnpackError("a compressed value is not text")
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(base64.b64decode(value, validate=True), budget[0] + 1)
        text = raw.decode("utf-8")
    except (binascii.Error, zlib.error, UnicodeDecodeError) as exc:
        raise UnpackError(f"a compressed value does not inflate ({exc})") from None
    if len(raw) > budget[0]:
        raise UnpackError(f"compressed values inflate past the {MAX_UNPACKED_CHARS} bytes a reader takes")
    if not inflater.eof or inflater.unused_data:
        raise UnpackError("a compressed value is cut short or has bytes after its end")
    budget[0] -= len(raw)
    return text


__all__ = ["MAX_UNPACKED_CHARS", "PACK_MIN_CHARS", "UnpackError", "encodable", "keys_are_text", "pack_outputs",
           "unpack_outputs"]
