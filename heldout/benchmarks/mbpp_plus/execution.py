"""MBPP+ execution-based pass@1 with evalplus semantics, run in heldout's sandbox.

What is evalplus's (facts carried over; see evalplus 0.3.x ``evaluate.py`` / ``eval/__init__.py``):

* expected outputs come from running the canonical solution (prompt + canonical_solution) on the
  same inputs, which also gives each input's reference time ``t``;
* each test input has a time limit ``max(min_time_limit, factor * t)`` with evalplus's defaults
  ``min_time_limit = 1.0`` s and ``factor = 4.0``;
* inputs are deserialised per task (tuples, sets, complex ...: :mod:`._child`);
* comparison: ``out == expected``; special oracles for ``are_equivalent`` (Mbpp/164, anything
  passes), ``sum_div`` (Mbpp/295, 0 also passes), ``surface_Area`` (Mbpp/581) and
  ``digit_distance_nums`` (Mbpp/558) (a second accepted answer), set comparison for eight tasks,
  "not None" for three tasks whose outputs cannot be serialised; if the expected output is a float
  (or a non-empty list/tuple of floats) and the task's ``atol`` is 0, ``atol`` becomes 1e-6 for this
  and every later input of the suite; an inexact match then passes when the types (and lengths)
  agree and ``numpy.allclose(out, exp, rtol=1e-7, atol=atol)``;
* base and plus inputs are separate suites, each stopping at its first failure (evalplus's
  default ``fast_check``); pass@1 "base" = base suite passes, "plus" = base and plus both pass.

Where heldout differs, and why:

* the solution runs in :mod:`heldout.sandbox` (namespaces, rlimits, scrubbed env)
  instead of evalplus's in-process ``reliability_guard``;
* outputs cross back as typed plain data (tuple, set, dict, bytes, complex ... kept) and are
  compared **in the parent**, so expected outputs never enter the sandbox and an object with a
  tricky ``__eq__`` fails as ``bad_output`` instead of passing (evalplus compares inside the
  untrusted process, where such an object would pass);
* it scores one problem at a time (:func:`check_solution`), which the harness needs per example;
  expected outputs are computed once per problem and process and kept in the process's temp
  folder, not in its memory (evalplus pickles them per dataset; see :class:`_TruthFiles`);
* **time is CPU time** (issue 53): the reference time ``t`` is the canonical solution's CPU time
  on the input, and each input's limit ``max(1.0, 4.0 * t)`` is a limit on the candidate's CPU
  time on that input, measured by the sandbox's parent (every process and thread of the run), so
  a verdict does not depend on the machine's load: evalplus measures both in wall time, and
  beside 8 other sandboxed checks on 2 cores the canonical solution of Mbpp/599 failed its own
  plus suite that way. On an idle machine a single-threaded solution's CPU time is its wall
  time, so where a solution meets evalplus's limits the verdicts agree. Wall time is a backstop
  (:func:`heldout.sandbox.wall_backstop`: 4x + 2 s of a CPU limit), for a solution that sleeps,
  blocks or waits; it ends as a ``timeout`` there. The whole run's CPU limit is
  ``min(limits.cpu_seconds, sum(time limits)) + 2 s`` (evalplus's per-task cap, 60 s by default,
  in CPU time) and its wall backstop that of ``sum(time limits) + 2 s``;
* an output whose pickle exceeds 4 MiB (a handful of MBPP+ plus inputs produce hundreds of MB)
  crosses as a sha256 of its memo-free pickle and is compared exactly (types included, as its
  ``repr`` would be; both processes run with ``PYTHONHASHSEED=0``, so set/dict orders agree);
  ``atol`` does not apply to such outputs.

evalplus itself is optional (``pip install heldout[evalplus]``); nothing here imports it."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import pickle
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from heldout.contracts import DataError, RunLimits
from heldout.files import make_temp_dir, writer_temp_name
from heldout.benchmarks.mbpp_plus._child import BATCH_PREFIX, DEFERRED_KEY, DIGEST_KEY, NDARRAY_KEY
from heldout.benchmarks.mbpp_plus._frozen_heap import older_objects_frozen
from heldout.benchmarks.mbpp_plus._schedule import Schedule, WorkerProcesses
from heldout.sandbox import SandboxError, run_calls, STDLIB_PRELOAD, wall_backstop

MIN_TIME_LIMIT = 1.0
TIME_LIMIT_FACTOR = 4.0
FLOAT_ATOL = 1e-6
HELPER_NAME = "_heldout_mbpp"
HELPER_SOURCE = (Path(__file__).resolve().parent / "_child.py").read_text(encoding="utf-8")
TRUTH_MAX_BYTES = 512 * 1024 * 1024
DEFAULT_LIMITS = RunLimits(wall_seconds=60.0, cpu_seconds=60.0, memory_mb=4096)

# MBPP+ programs are plain Python (the 378 canonical solutions import only standard modules), so
# its fork server preloads those and not numpy: it starts in about 2/3 of the time (~95 vs ~135 ms)
# and forks a smaller image (1-2 ms less machine CPU per execution). A candidate may still import
# numpy; it pays the import in its own execution, before any test's timer starts.
PRELOAD = STDLIB_PRELOAD

# check_many computes expected outputs for up to this many problems per sandboxed run (a module per
# canonical solution); a problem whose calls take TRUTH_BUDGET_SECONDS there has the rest of its inputs
# dealt round-robin over the workers. In MBPP+ 363 of 378 problems take under 0.2 s for all their inputs
# (median 2.4 ms), a run costs ~15 ms of machine time, and Mbpp/599 alone computes for 20 s (2 cores).
TRUTH_BATCH_PROBLEMS = 20
TRUTH_BUDGET_SECONDS = 0.2
WORKER_PROCESSES = os.environ.get("HELDOUT_MBPP_WORKER_PROCESSES", "1") != "0"  # "0": check_many's runs in-process

SET_EQUAL_TASKS = frozenset({"similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly",
                             "larg_nnum", "intersection_array", "find_dissimilar", "Diff"})


# -- results ---------------------------------------------------------------------------------------
@dataclass
class SuiteResult:
    """One test suite (``base`` or ``plus``) of one problem. ``status`` is ``pass`` or ``fail``;
    ``failure`` describes the first failing test (reason: wrong_answer, timeout, crash, memory,
    bad_output, forbidden, output_too_large)."""

    name: str
    status: str
    passed: int
    total: int
    failure: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "pass"


@dataclass
class MbppResult:
    task_id: str
    base: SuiteResult
    plus: SuiteResult | None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def base_pass(self) -> bool:
        return self.base.ok

    @property
    def plus_pass(self) -> bool:
        """evalplus's "base + extra": both suites pass."""
        return self.base.ok and self.plus is not None and self.plus.ok

    def first_failure(self) -> dict[str, Any] | None:
        for suite in (self.base, self.plus):
            if suite is not None and suite.failure:
                return {"suite": suite.name, **suite.failure}
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- expected outputs --------------------------------------------------------------------------------
@dataclass
class GroundTruth:
    base: list[Any]
    plus: list[Any]
    base_time: list[float]
    plus_time: list[float]
    base_bytes: int = 0  # size of the encoded expected outputs: solutions may send about as much
    plus_bytes: int = 0


class _TruthFiles:
    """Expected outputs kept for the rest of the process as pickles in its own temp folder
    (:func:`heldout.files.make_temp_dir`: 0700, gone with the process, written by it only), not in
    its memory: a study checks one cell's test problems before the next cell's in-process optimizer
    runs, which may not find them. Read back on the next check (34 KB on average): a problem's
    canonical solution runs once per process."""

    def __init__(self) -> None:
        self._folder: Path | None = None

    def _path(self, key: str) -> Path:
        if self._folder is None or not self._folder.is_dir():
            self._folder = make_temp_dir("mbpp-truths-")
        return self._folder / f"{key}.pickle"

    def get(self, key: str) -> GroundTruth | None:
        try:
            return pickle.loads(self._path(key).read_bytes())
        except FileNotFoundError:
            return None

    def setdefault(self, key: str, truth: GroundTruth) -> GroundTruth:
        kept = self.get(key)
        if kept is not None:
            return kept
        path = self._path(key)
        temp = path.with_name(writer_temp_name(path.name))
        try:
            temp.write_bytes(pickle.dumps(truth, protocol=pickle.HIGHEST_PROTOCOL))
            os.replace(temp, path)
        except OSError:  # a full disk: the truth is computed again next time, and this check goes on
            temp.unlink(missing_ok=True)
        return truth


_truth_cache: _TruthFiles | dict[str, GroundTruth] = _TruthFiles()  # tests put a dict of their own here
_truth_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    """A child forked while another thread held ``_truth_lock`` (an MBPP+ worker process, a
    process-pool worker) would wait on it for ever: the child gets a lock of its own."""
    global _truth_lock
    _truth_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def _problem_key(problem: dict[str, Any]) -> str:
    parts = {k: problem.get(k) for k in ("task_id", "prompt", "canonical_solution", "entry_point", "base_input",
                                         "plus_input")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _inputs(problem: dict[str, Any]) -> list[Any]:
    return list(problem["base_input"]) + list(problem["plus_input"])


def _truth_shard(problem: dict[str, Any], inputs: Sequence[Any], limits: RunLimits) -> list[dict[str, Any]]:
    """The canonical solution's call results on ``inputs`` (one sandboxed run, nothing deferred).
    Raises :class:`DataError` if it fails."""
    return _truth_batch([(problem, inputs)], limits, math.inf)[0]


def _truth_batch(parts: Sequence[tuple[dict[str, Any], Sequence[Any]]], limits: RunLimits,
                 budget: float) -> list[list[dict[str, Any] | None]]:
    """Per ``(problem, inputs)`` part, the canonical solution's call result on each of those
    inputs, all computed in one sandboxed run (a module per problem); None for the inputs left
    after that problem's calls took ``budget`` seconds. Raises :class:`DataError` (naming the
    problem) if one fails."""
    files, calls, owner = {}, [], []
    for k, (problem, inputs) in enumerate(parts):
        module = f"{BATCH_PREFIX}{k}"
        files[f"{module}.py"] = problem["prompt"] + problem["canonical_solution"]
        calls += [([module, problem["task_id"], problem["entry_point"], inp, budget], {}) for inp in inputs]
        owner += [k] * len(inputs)
    if not calls:
        return [[] for _ in parts]
    # the CPU limit is the one that counts; the wall limit only stops a hung run, so it must not
    # end one that a loaded machine merely slowed (Mbpp/599's shard: 11 s of CPU, over 120 s wall
    # at a load of 12-25 on 2 cores)
    trusted = limits.replace(max_output_bytes=max(limits.max_output_bytes, TRUTH_MAX_BYTES),
                             wall_seconds=max(limits.wall_seconds, wall_backstop(limits.cpu_seconds)))
    # the canonical solutions are trusted: their inputs go in at once and run back to back
    result = run_calls(files, HELPER_NAME, "call_in_batch", calls, limits=trusted, encoding="typed",
                       setup_files={f"{HELPER_NAME}.py": HELPER_SOURCE}, preload=PRELOAD, inputs_up_front=True)
    if not result.ok:
        failed = next((c for c in result.calls if not c.get("ok")), None)
        names = parts[owner[failed["call"]]][0]["task_id"] if failed else ", ".join(p["task_id"] for p, _ in parts)
        raise DataError(f"{names}: the canonical solution failed ({result.error_kind}): {str(result.error)[-500:]}")
    out: list[list[dict[str, Any] | None]] = [[] for _ in parts]
    for call in result.calls:  # in call order
        out[owner[call["call"]]].append(None if _is_deferred(call.get("value")) else call)
    return out


def _is_deferred(value: Any) -> bool:
    """The helper's deferral marker (no canonical solution returns it)."""
    return isinstance(value, dict) and len(value) == 1 and value.get(DEFERRED_KEY) is True


def _deal(indices: Sequence[int], shards: int) -> list[list[int]]:
    """``indices`` dealt round-robin into at most ``shards`` runs (inputs tend to grow along a
    suite, so consecutive cuts would leave the last run with most of the work)."""
    shards = max(1, min(shards, len(indices)))
    return [list(indices[k::shards]) for k in range(shards)]


def _assemble_truth(problem: dict[str, Any], calls: Sequence[dict[str, Any]]) -> GroundTruth:
    """The expected outputs from the canonical solution's call results, in input order."""
    outs = [c["value"] for c in calls]
    # CPU time (the child's own clock: the canonical solution is trusted), stable under load
    times = [float(c.get("cpu_seconds", c.get("seconds", 0.0))) for c in calls]
    sizes = [int(c["bytes"]) for c in calls]
    nb = len(problem["base_input"])
    return GroundTruth(outs[:nb], outs[nb:], times[:nb], times[nb:], sum(sizes[:nb]), sum(sizes[nb:]))


def new_schedule(workers: int, processes: WorkerProcesses | None = None) -> Schedule:
    """A schedule of ``workers`` threads whose calls name this module's functions."""
    return Schedule(workers, processes, sys.modules[__name__])


def _plan_truths(schedule: Schedule, problems: Sequence[dict[str, Any]], limits: RunLimits,
                 on_truth: Callable[[int, GroundTruth], None]) -> None:
    """Add to ``schedule`` the runs that compute the expected outputs of ``problems``: up to
    :data:`TRUTH_BATCH_PROBLEMS` problems per run (first, rank 0; see :func:`_batch_bounds`),
    then the inputs a slow problem left there dealt over the schedule's workers (rank 1, slowest
    problem first). ``on_truth(k, truth)`` is called as problem ``k``'s outputs are complete. The canonical solutions are
    trusted code that computes each output from its input alone (evalplus runs them all in its
    own process, one after another), so where an input ran changes no output; the full-data test
    checks it: every canonical solution, checked in a process of its own, matches them."""
    lock = threading.Lock()
    runs_left: dict[int, int] = {}

    def batch(first: int, part: Sequence[dict[str, Any]]) -> None:
        parts = [(p, _inputs(p)) for p in part]
        for k, calls in enumerate(schedule.call("_truth_batch", parts, limits, TRUTH_BUDGET_SECONDS), first):
            left = [i for i, c in enumerate(calls) if c is None]
            if not left:
                on_truth(k, _assemble_truth(problems[k], calls))
                continue
            spent = sum(c.get("cpu_seconds", c["seconds"]) for c in calls if c is not None)
            runs = _deal(left, schedule.workers)
            with lock:
                runs_left[k] = len(runs)
            for run in runs:
                schedule.add((1, -spent), functools.partial(rest, k, calls, run))

    def rest(k: int, calls: list[dict[str, Any] | None], run: list[int]) -> None:
        inputs = _inputs(problems[k])
        for i, call in zip(run, schedule.call("_truth_shard", problems[k], [inputs[i] for i in run], limits)):
            calls[i] = call
        with lock:
            runs_left[k] -= 1
            complete = runs_left[k] == 0
        if complete:
            on_truth(k, _assemble_truth(problems[k], calls))

    for first, last in _batch_bounds(len(problems), schedule.workers):
        schedule.add((0, first), functools.partial(batch, first, problems[first:last]))


def _batch_bounds(n: int, workers: int) -> list[tuple[int, int]]:
    """``(first, last)`` of each run of expected outputs for ``n`` problems: at most
    :data:`TRUTH_BATCH_PROBLEMS` each, at least one per worker while there are problems, and of
    near-equal sizes (30 problems on 2 workers: 15 and 15, not 20 and 10, whose larger run both
    workers would otherwise wait for before the last checks)."""
    if n <= 0:
        return []
    runs = max(math.ceil(n / TRUTH_BATCH_PROBLEMS), min(n, max(1, workers)))
    size, extra = divmod(n, runs)
    bounds, first = [], 0
    for k in range(runs):
        last = first + size + (1 if k < extra else 0)
        bounds.append((first, last))
        first = last
    return bounds


def _cached_truth(key: str) -> GroundTruth | None:
    with _truth_lock:
        return _truth_cache.get(key)


def _remember_truth(key: str, truth: GroundTruth) -> GroundTruth:
    with _truth_lock:
        return _truth_cache.setdefault(key, truth)


def ground_truth(problem: dict[str, Any], *, limits: RunLimits = DEFAULT_LIMITS) -> GroundTruth:
    """Expected outputs and reference runtimes: the canonical solution, run in the sandbox on every
    base and plus input (cached per problem content). Raises :class:`DataError` if it fails."""
    key = _problem_key(problem)
    cached = _cached_truth(key)
    if cached is not None:
        return cached
    return _remember_truth(key, _assemble_truth(problem, _truth_shard(problem, _inputs(problem), limits)))


# -- comparison ----------------------------------------------------------------------------------------
def is_floats(x: Any) -> bool:
    """A float, or a non-empty list/tuple of floats (evalplus's rule for switching atol on)."""
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False


def _oracle_surface_area(base_edge: float, height: float) -> int:
    slant = math.sqrt((base_edge / 2) ** 2 + height ** 2)
    return round(base_edge ** 2 + 4 * (base_edge * slant) / 2)


def _oracle_digit_distance(a: int, b: int) -> int:
    sa, sb = str(a), str(b)
    width = max(len(sa), len(sb))
    return sum(abs(int(x) - int(y)) for x, y in zip(sa.zfill(width), sb.zfill(width)))


def _is_digest(x: Any) -> bool:
    return isinstance(x, dict) and DIGEST_KEY in x


def _untag_ndarray(x: Any) -> Any:
    """A numpy array the child tagged, rebuilt (numeric dtypes only); anything else unchanged."""
    if isinstance(x, dict) and NDARRAY_KEY in x and set(x) == {NDARRAY_KEY, "dtype"}:
        try:
            return np.asarray(x[NDARRAY_KEY], dtype=np.dtype(str(x["dtype"])))
        except (TypeError, ValueError, OverflowError):
            return x
    return x


def compare(entry_point: str, out: Any, exp: Any, inp: Any, atol: float) -> tuple[bool, float, str]:
    """(passed, atol for the next input, reason text). Never raises. A numpy array is compared
    as evalplus compares it: ``out == exp`` is elementwise, so a multi-element array fails on
    the ambiguous truth value and a one-element array passes when its element matches."""
    out, exp = _untag_ndarray(out), _untag_ndarray(exp)
    if _is_digest(out) or _is_digest(exp):
        same = _is_digest(out) and _is_digest(exp) and out[DIGEST_KEY] == exp[DIGEST_KEY]
        return same, atol, "" if same else "output differs (large output, compared exactly by digest)"
    try:
        exact = out == exp
        if entry_point == "are_equivalent":
            exact = True
        elif entry_point == "sum_div":
            exact = exact or out == 0
        elif entry_point == "surface_Area":
            exact = exact or abs(out - _oracle_surface_area(*inp)) <= atol
        elif entry_point == "digit_distance_nums":
            exact = exact or out == _oracle_digit_distance(*inp)
        elif entry_point in SET_EQUAL_TASKS:
            exact = set(out) == set(exp)
        if atol == 0 and is_floats(exp):
            atol = FLOAT_ATOL
        if not exact and atol != 0:
            if type(out) is not type(exp):
                return False, atol, f"expected a {type(exp).__name__}, got a {type(out).__name__}"
            if isinstance(exp, (list, tuple)) and len(out) != len(exp):
                return False, atol, f"expected {len(exp)} items, got {len(out)}"
            ok = bool(np.allclose(out, exp, rtol=1e-07, atol=atol))
            return ok, atol, "" if ok else f"not within atol={atol:g}"
        return bool(exact), atol, "" if exact else "output differs"
    except Exception as exc:  # noqa: BLE001 - a comparison that blows up is a failed test
        return False, atol, f"comparison failed: {type(exc).__name__}: {exc}"


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


# -- running a solution ------------------------------------------------------------------------------
def _suite_from_calls(problem: dict[str, Any], which: str, calls: list[dict[str, Any]], expected: Sequence[Any],
                      seconds: float, process_error: tuple[str | None, str | None]) -> SuiteResult:
    inputs = list(problem[f"{which}_input"])
    atol = float(problem.get("atol") or 0)
    passed = 0
    for i, call in enumerate(calls):
        if not call.get("ok"):
            return SuiteResult(which, "fail", passed, len(inputs), {
                "index": i, "reason": call.get("error_kind") or "crash", "input": _short(inputs[i]),
                "message": str(call.get("error"))[-1500:]}, seconds)
        out = call.get("value")
        ok, atol, why = compare(problem["entry_point"], out, expected[i], inputs[i], atol)
        if not ok:
            return SuiteResult(which, "fail", passed, len(inputs), {
                "index": i, "reason": "wrong_answer", "input": _short(inputs[i]), "expected": _short(expected[i]),
                "got": _short(out), "message": f"{why}: expected {_short(expected[i], 80)}, got {_short(out, 80)}"},
                seconds)
        passed += 1
    if passed < len(inputs):
        # the process died before every test of the suite ran (wall limit, memory, forbidden ...)
        kind, error = process_error
        return SuiteResult(which, "fail", passed, len(inputs), {
            "index": passed, "reason": kind or "crash", "input": _short(inputs[passed]),
            "message": str(error or "the program stopped before this test")[-1500:]}, seconds)
    return SuiteResult(which, "pass", passed, len(inputs), None, seconds)


def run_suites(problem: dict[str, Any], code: str, truth: GroundTruth, which: Sequence[str], *, limits: RunLimits,
               min_time_limit: float = MIN_TIME_LIMIT, factor: float = TIME_LIMIT_FACTOR) -> dict[str, SuiteResult]:
    """Both suites in one sandboxed process; each suite stops at its own first failure."""
    plan = [(name, list(problem[f"{name}_input"]), getattr(truth, name), getattr(truth, f"{name}_time"))
            for name in which]
    calls, per_call, groups = [], [], []
    for name, inputs, _, ref in plan:
        calls += [([problem["task_id"], problem["entry_point"], inp, "check"], {}) for inp in inputs]
        per_call += [max(min_time_limit, factor * t) for t in ref]
        groups += [name] * len(inputs)
    expected_bytes = sum(getattr(truth, f"{name}_bytes") for name in which)
    # the suites' CPU limits bound the whole run's CPU (up to evalplus's per-task cap); its wall
    # limit is only their backstop; a correct solution sends about as much as the canonical one
    lim = limits.replace(wall_seconds=wall_backstop(sum(per_call) + 2.0),
                         cpu_seconds=min(limits.cpu_seconds, sum(per_call)) + 2.0,
                         max_output_bytes=max(limits.max_output_bytes, 2 * expected_bytes + (1 << 20)))
    out: dict[str, SuiteResult] = {}
    if not calls:
        return {name: SuiteResult(name, "pass", 0, 0) for name in which}
    try:
        res = run_calls({"solution.py": code}, HELPER_NAME, "call", calls, limits=lim, encoding="typed",
                        per_call_seconds=per_call, stop_on_error=True, groups=groups,
                        setup_files={f"{HELPER_NAME}.py": HELPER_SOURCE}, preload=PRELOAD)
    except SandboxError as exc:
        return {name: SuiteResult(name, "fail", 0, len(inputs), {"index": 0, "reason": "malformed_candidate",
                                                                "input": "", "message": str(exc)})
                for name, inputs, _, _ in plan}
    offset = 0
    for name, inputs, expected, _ in plan:
        mine = sorted((c for c in res.calls if offset <= c["call"] < offset + len(inputs)), key=lambda c: c["call"])
        out[name] = _suite_from_calls(problem, name, mine, expected, res.seconds, (res.error_kind, res.error))
        offset += len(inputs)
    return out


def check_solution(problem: dict[str, Any], solution_code: str, *, which: Iterable[str] = ("base", "plus"),
                   limits: RunLimits | None = None, min_time_limit: float = MIN_TIME_LIMIT,
                   factor: float = TIME_LIMIT_FACTOR) -> MbppResult:
    """Run ``solution_code`` on one evalplus MBPP+ record (``task_id``, ``prompt``, ``entry_point``,
    ``canonical_solution``, ``base_input``, ``plus_input``, ``atol``) and report base and plus
    separately. Never raises for a bad solution; raises :class:`DataError` if the record's own
    canonical solution cannot produce expected outputs."""
    limits = limits or DEFAULT_LIMITS
    start = time.perf_counter()
    truth = ground_truth(problem, limits=limits)
    return _check_against(problem, solution_code, truth, which, limits, min_time_limit, factor, start)


def _check_against(problem: dict[str, Any], solution_code: str, truth: GroundTruth, which: Iterable[str],
                   limits: RunLimits, min_time_limit: float, factor: float, start: float) -> MbppResult:
    names = ["base"] + (["plus"] if "plus" in tuple(which) else [])
    suites = run_suites(problem, solution_code, truth, names, limits=limits, min_time_limit=min_time_limit,
                        factor=factor)
    return MbppResult(problem["task_id"], suites["base"], suites.get("plus"), time.perf_counter() - start)


def check_many(items: Sequence[tuple[dict[str, Any], str]], *, workers: int = 2,
               which: Iterable[str] = ("base", "plus"), limits: RunLimits | None = None,
               min_time_limit: float = MIN_TIME_LIMIT, factor: float = TIME_LIMIT_FACTOR) -> list[MbppResult]:
    """:func:`check_solution` over many (problem, code) pairs, at most ``workers`` sandboxed
    processes at a time; results in the order of ``items``. Raises :class:`DataError` as
    :func:`check_solution` does.

    One schedule, so that no worker waits while there is work: the expected outputs of every
    problem not cached yet come first (see :func:`_plan_truths`), and a problem's checks are
    ready as soon as its outputs are, the largest reference time first. A check runs a
    candidate's suites in one process of its own, as evalplus runs them, so it is never dealt
    out nor shares a process with another problem's."""
    limits = limits or DEFAULT_LIMITS
    which = tuple(which)
    keys = [_problem_key(problem) for problem, _ in items]
    items_of: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        items_of.setdefault(key, []).append(i)
    results: dict[int, MbppResult] = {}
    # two or more workers: each in a process of its own, on a core of its own (see _schedule)
    processes = None
    if workers > 1 and len(items) > 1 and WORKER_PROCESSES:
        try:
            processes = WorkerProcesses(workers)
        except OSError:
            processes = None  # no process to fork (a process limit): the runs go in-process
    schedule = new_schedule(workers, processes)

    def check(i: int, truth: GroundTruth) -> None:
        problem, code = items[i]
        results[i] = schedule.call("_check_against", problem, code, truth, which, limits, min_time_limit, factor,
                                   time.perf_counter())

    def ready(key: str, truth: GroundTruth) -> None:
        for i in items_of[key]:
            schedule.add((2, -sum(truth.base_time + truth.plus_time)), functools.partial(check, i, truth))

    todo = []
    for key in items_of:
        cached = _cached_truth(key)
        if cached is None:
            todo.append(key)
        else:
            ready(key, cached)
    _plan_truths(schedule, [items[items_of[key][0]][0] for key in todo], limits,
                 lambda k, truth: ready(todo[k], _remember_truth(todo[k], truth)))
    try:
        with older_objects_frozen():  # no full collection stops every worker's monitor meanwhile
            schedule.run()
    finally:
        if processes is not None:
            processes.close()
    return [results[i] for i in range(len(items))]


def load_problems(path: str | Path) -> list[dict[str, Any]]:
    """evalplus MBPP+ records from a JSON-lines file (parsed with ``json``: some inputs are huge ints)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
    return rows


__all__ = ["check_solution", "check_many", "ground_truth", "compare", "MbppResult", "SuiteResult", "load_problems",
           "MIN_TIME_LIMIT", "TIME_LIMIT_FACTOR"]
