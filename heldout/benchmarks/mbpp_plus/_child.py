"""Trusted helper shipped into the sandbox next to an MBPP+ solution (as ``_heldout_mbpp.py``).

It turns one evalplus test input (JSON) into the Python values the task expects (evalplus's
per-task input deserialisation: some arguments are tuples, sets, complex numbers ...), calls the
solution's entry point and hands the output back (typed-encoded by the sandbox). The comparison
with the expected output happens in the parent, so no expected output ever enters the sandbox.

Standard library only; importable by the parent as well (for tests)."""

import hashlib
import importlib
import os
import pickle
import sys
import time

# Entry points whose outputs cannot be serialised (e.g. re.Match): only "is it None" is compared,
# as in evalplus.
OUTPUT_NOT_NONE = ("check_str", "text_match_three", "text_starta_endb")


def _tup(x):
    return tuple(x)


def _each_arg_tuple(inp):
    return [tuple(a) for a in inp]


def _each_arg_list_of_tuples(inp):
    return [[tuple(x) for x in a] for a in inp]


def _deep_tuple(x):
    return tuple(_deep_tuple(i) for i in x) if isinstance(x, list) else x


# MBPP+ task number -> how its (JSON) arguments become Python values. The task numbers and the
# conversions are evalplus's (``mbpp_deserialize_inputs``); this table is heldout's own form.
CONVERSIONS = {}
for _n in (2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630, 726,
           740, 744, 809):
    CONVERSIONS[_n] = _each_arg_tuple
for _n in (63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780):
    CONVERSIONS[_n] = _each_arg_list_of_tuples
for _n in (75, 413, 444, 753):
    CONVERSIONS[_n] = lambda inp: [[tuple(x) for x in inp[0]], inp[1]]
for _n in (106, 750):
    CONVERSIONS[_n] = lambda inp: [inp[0], tuple(inp[1])]
CONVERSIONS[115] = lambda inp: [[set(x) if isinstance(x, list) and x else {} for x in inp[0]]]
CONVERSIONS[124] = lambda inp: (float(inp[0]), complex(inp[1]))
for _n in (250, 405, 446, 617, 720, 763, 808):
    CONVERSIONS[_n] = lambda inp: [tuple(inp[0]), inp[1]]  # evalplus keeps only the first two arguments
for _n in (259, 401, 445):
    CONVERSIONS[_n] = lambda inp: [tuple(tuple(x) for x in a) for a in inp]
CONVERSIONS[278] = lambda inp: [tuple(tuple(x) if isinstance(x, list) else x for x in inp[0])]
CONVERSIONS[307] = lambda inp: [tuple(inp[0]), inp[1], inp[2]]
CONVERSIONS[722] = lambda inp: [{k: tuple(v) for k, v in inp[0].items()}] + list(inp[1:])
CONVERSIONS[252] = lambda inp: [complex(inp[0])]
for _n in (580, 615, 791):
    CONVERSIONS[_n] = _deep_tuple


def deserialize(task_id, inp):
    """One test input as the task's function expects it."""
    convert = CONVERSIONS.get(int(str(task_id).rsplit("/", 1)[-1]))
    return convert(inp) if convert is not None else inp


# Outputs whose pickle is longer than this cross as a sha256 of that pickle (compared exactly): a
# few MBPP+ tasks return hundreds of MB, which no pipe-and-compare scheme handles in reasonable time.
# The pickle is streamed into the hash in "fast" mode (no memo), so it depends on the value and its
# types, not on which objects happen to be shared: equal outputs built differently hash alike. It is
# about 3x faster than building the output's repr, which is what this once hashed.
LARGE_OUTPUT_BYTES = 4 * 1024 * 1024
DIGEST_KEY = "__heldout_digest__"
# A numpy array crosses tagged, so the parent compares it as evalplus does (``out == exp`` on an
# array is elementwise: only a one-element array can pass), not as the list it converts to.
NDARRAY_KEY = "__heldout_ndarray__"


def tag_ndarray(out):
    np = sys.modules.get("numpy")
    if np is not None and isinstance(out, np.ndarray) and out.dtype.kind in "biuf":
        return {NDARRAY_KEY: out.tolist(), "dtype": out.dtype.str}
    return out


class _HashingSink:
    """A write-only file that hashes what it is given and counts the bytes."""

    def __init__(self):
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data):
        self.hash.update(data)
        self.size += len(data)
        return len(data)


# what a pickle of a str or an int adds to its payload (opcodes, length, frame), with room to spare
_PICKLE_SLACK = 1024


def _surely_small(out):
    """Whether ``out``'s pickle is surely within LARGE_OUTPUT_BYTES without making it: None, bools,
    floats, and ints and strs short enough (UTF-8 takes at most 4 bytes a character). Most outputs
    are scalars, and pickling one into a hash cost ~5 us a call. Exact types only: a subclass may
    pickle to anything, so it takes the pickle like every other value."""
    kind = type(out)
    if out is None or kind is bool or kind is float:
        return True
    if kind is int:
        return out.bit_length() // 8 + _PICKLE_SLACK <= LARGE_OUTPUT_BYTES
    return kind is str and 4 * len(out) + _PICKLE_SLACK <= LARGE_OUTPUT_BYTES


def shrink(out):
    """``out`` itself, or a digest of it when its pickle is over :data:`LARGE_OUTPUT_BYTES`. An
    output that cannot be pickled (cyclic, too deep, a generator ...) is returned as it is: the
    sandbox's typed encoding then sends it or reports why it cannot."""
    if _surely_small(out):
        return out
    sink = _HashingSink()
    pickler = pickle.Pickler(sink, protocol=4)
    pickler.fast = True  # no memo: shared and unshared equal objects pickle the same
    try:
        pickler.dump(out)
    except Exception:  # noqa: BLE001 - unpicklable: the sandbox's encoder handles (or reports) it
        return out
    if sink.size <= LARGE_OUTPUT_BYTES:
        return out
    return {DIGEST_KEY: sink.hash.hexdigest(), "type": type(out).__name__, "bytes": sink.size}


def load_solution():
    """Imported when the helper is imported (before any per-call timer starts), like evalplus
    executes the solution before its test loop. Only inside the sandbox."""
    try:
        return importlib.import_module("solution")
    except ModuleNotFoundError as exc:
        if exc.name != "solution":
            raise
        return None


# A batch of canonical solutions (trusted code only), one module per problem: ``truth_<k>.py``.
BATCH_PREFIX = "truth_"
DEFERRED_KEY = "__heldout_deferred__"


def load_batch():
    """Every canonical solution of a batch, imported with the helper as a single solution is
    (before any per-call timer starts), in one process as evalplus computes its expected outputs."""
    here = os.path.dirname(os.path.abspath(__file__))
    names = sorted(n[:-3] for n in os.listdir(here) if n.startswith(BATCH_PREFIX) and n.endswith(".py"))
    return {name: importlib.import_module(name) for name in names}


_solution = load_solution()
_batch = load_batch()
_spent = {}  # batch module -> CPU seconds its calls took so far in this run (stable under load)


def call(task_id, entry_point, inp, mode):
    """Run ``entry_point(*inp)``. ``mode`` is "truth" for the canonical solution (outputs of the
    not-None tasks become ``out is not None``) or "check" for a candidate (bools kept as they are,
    anything else becomes ``out is not None``), mirroring evalplus."""
    return _call(_solution, task_id, entry_point, inp, mode)


def call_in_batch(module, task_id, entry_point, inp, budget):
    """:func:`call` in "truth" mode for the batch's canonical solution ``module``, unless that
    problem's calls took ``budget`` seconds already: then a deferral marker (the parent runs the
    rest of that problem's inputs in runs of their own, dealt over its workers)."""
    if _spent.get(module, 0.0) >= budget:
        return {DEFERRED_KEY: True}
    start = time.process_time()
    try:
        return _call(_batch.get(module), task_id, entry_point, inp, "truth")
    finally:
        _spent[module] = _spent.get(module, 0.0) + time.process_time() - start


def _call(solution, task_id, entry_point, inp, mode):
    fn = getattr(solution, entry_point, None)
    if not callable(fn):
        raise NameError(f"the solution defines no function {entry_point!r}")
    out = fn(*deserialize(task_id, inp))
    if entry_point in OUTPUT_NOT_NONE:
        if mode == "truth" or not isinstance(out, bool):
            out = out is not None
    return shrink(tag_ndarray(out))
