"""The marshal form: the sandboxed builder sends its stream as ``marshal.dumps(program, 4)``
(one pass in C, ~25 ms for the baseline's 147,735 bundles, where the compact arrays' Python
pass took ~140 ms), and this module reads those bytes here, in a numba-compiled parser, straight
into the compact form's arrays (:func:`compact_form.decode_wire`). The parser's kernels are
:mod:`heldout.benchmarks.vliw.marshal_parser`; this module sizes their workspace and checks the
payload around the bytes.

``marshal.loads`` is not used: it is not safe on hostile bytes (a five-byte list header asks for
gigabytes), and it would rebuild the Python objects whose cost this form avoids. The parser reads
only a small vocabulary with a fixed shape, and checks every length and reference against what is
there:

* the program: a list or tuple of bundles; a bundle: a dict (or a reference to an earlier one);
* a key: a string; the ``debug`` group's value is skipped whatever plain data it holds (as the
  compact form drops it); any other value: a list or tuple of slots (or a reference to one);
* a slot: a non-empty list or tuple, a string then integers in (-2**62, 2**62).

Anything else (a bool or float where an integer stands, a code object, a cycle, a stream too large
to expand, bytes that are not marshal data) makes :func:`decode_marshal` return ``None``: the
caller builds again in the plain JSON form, whose decoder is the reference for odd programs. So a
hostile builder gains nothing here but a second build of its own time.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from typing import Any

import numpy as np

from heldout.benchmarks.vliw.build_runner import MARSHAL_FORMAT, MAX_MARSHAL_BYTES
from heldout.benchmarks.vliw.compact_form import MAX_COMPACT_STRINGS, CompactFormError, decode_wire
from heldout.benchmarks.vliw.fast import DecodedProgram
from heldout.benchmarks.vliw.marshal_parser import FULL, REASONS, parse_stream

MAX_EXPANDED_ITEMS = 1 << 25  # groups or slot positions after references are expanded


def _power_of_two(at_least: int) -> int:
    return 1 << max(4, (at_least - 1).bit_length())


class Workspace:
    """The parser's arrays, sized from the blob (each item takes a few bytes of it) and grown 4x
    when one fills, after which the parse starts again (expansion by references, one bundle
    object appended 10,000 times, is the usual way past the first guess). Each array has a cap,
    so forged bytes cannot make the parent allocate more than ~2 GB; past a cap the stream is
    declined (and built as JSON, under the builder's output limit)."""

    # in the order of the parser's "full: ..." statuses (FULL + the array's number)
    ARRAYS = tuple(reason.removeprefix("full: ") for reason in REASONS[FULL:])
    CAPS = {"groups": MAX_EXPANDED_ITEMS, "slot positions": MAX_EXPANDED_ITEMS, "distinct slots": 1 << 23,
            "operands": 1 << 25, "strings": MAX_COMPACT_STRINGS, "references": 1 << 22,
            "operands of one slot": 1 << 16}

    def __init__(self, n_bytes: int) -> None:
        first = {"groups": n_bytes // 4 + 64, "slot positions": n_bytes // 4 + 64,
                 "distinct slots": max(1024, n_bytes // 32), "operands": n_bytes // 5 + 64, "strings": 1024,
                 "references": n_bytes // 8 + 64, "operands of one slot": 64}
        self.size = {name: min(size, self.CAPS[name]) for name, size in first.items()}

    def grow(self, which: str) -> bool:
        """Four times the room for ``which``, up to its cap; False when it is at the cap."""
        if self.size[which] >= self.CAPS[which]:
            return False
        self.size[which] = min(4 * self.size[which], self.CAPS[which])
        return True

    def arrays(self) -> tuple:
        z = self.size
        return (np.empty(z["groups"], np.int64), np.empty(z["groups"], np.int64),
                np.empty(z["slot positions"], np.int64), np.empty(z["distinct slots"], np.int64),
                np.empty(z["distinct slots"], np.int64), np.empty(z["distinct slots"], np.int64),
                np.empty(z["operands"], np.int64), np.full(_power_of_two(2 * z["distinct slots"]), -1, np.int64),
                np.empty(z["strings"], np.int64), np.empty(z["strings"], np.int64),
                np.full(_power_of_two(2 * z["strings"]), -1, np.int64), np.empty((z["references"], 5), np.int64),
                np.empty(z["operands of one slot"], np.int64))


def parse(raw: bytes, max_bundles: int) -> tuple[int, int, tuple | None]:
    """(status, position, the compact form's arrays and string spans when status is 0)."""
    blob = np.frombuffer(raw, np.uint8)
    space = Workspace(len(raw))
    while True:
        ws = space.arrays()
        n_groups = np.zeros(len(raw), np.int64)  # a bundle takes a byte at least; calloc'd, touched as used
        status, position, n_b, n_g, n_s, n_u, n_operands, n_str = parse_stream(
            blob, max_bundles, MAX_EXPANDED_ITEMS, n_groups, *ws)
        if status < FULL or not space.grow(Workspace.ARRAYS[status - FULL]):
            break
    if status != 0:
        return status, position, None
    g_engine, g_slots, slot_ids, u_op, u_n, _, u_operands, _, s_start, s_len, _, _, _ = ws
    return 0, position, (n_groups[:n_b], g_engine[:n_g], g_slots[:n_g], slot_ids[:n_s], u_op[:n_u], u_n[:n_u],
                         u_operands[:n_operands], s_start[:n_str], s_len[:n_str])


def decode_marshal(payload: Any, max_bundles: int) -> DecodedProgram | None:
    """Decode the marshal form (``{"format": MARSHAL_FORMAT, "data": base64 of the zlib-compressed
    bytes}``) into exactly what
    :func:`fast.decode` gives for the stream itself, or ``None`` when the bytes hold anything
    outside the vocabulary above, or inflate beyond 40 MB (the caller then builds in the JSON form). Raises
    :class:`CompactFormError` for a payload that is not this form at all."""
    if not isinstance(payload, dict) or set(payload) != {"format", "data"} or payload["format"] != MARSHAL_FORMAT \
            or not isinstance(payload["data"], str):
        raise CompactFormError(f"not a {MARSHAL_FORMAT} payload")
    try:
        packed = base64.b64decode(payload["data"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CompactFormError(f"the marshal data is not base64: {exc}") from None
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(packed, MAX_MARSHAL_BYTES + 1)  # bounded: a zip bomb stops here
    except zlib.error:
        return None
    if len(raw) > MAX_MARSHAL_BYTES or not inflate.eof or inflate.unused_data:
        return None
    _, _, arrays = parse(raw, max_bundles)
    if arrays is None:
        return None
    n_groups, g_engine, g_slots, slot_ids, u_op, u_n, u_operands, s_start, s_len = arrays
    try:
        strings = [raw[s:s + k].decode("utf-8", "surrogatepass") for s, k in zip(s_start.tolist(), s_len.tolist())]
    except UnicodeDecodeError:
        return None
    return decode_wire(strings, n_groups, g_engine, g_slots, slot_ids, u_op, u_n, u_operands, max_bundles)
