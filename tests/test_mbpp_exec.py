"""MBPP+ execution: evalplus semantics, base and plus reported separately, wrong solutions fail for
the right reason, and (where evalplus is installed) the same verdicts as evalplus's own evaluator."""

from __future__ import annotations

import gc
import json
import math
import pickle

import pytest

from heldout.contracts import DataError, RunLimits
from heldout.benchmarks.mbpp_plus import _child as _mbpp_child
from heldout.benchmarks.mbpp_plus import execution as mbpp_execution
from heldout.benchmarks.mbpp_plus import scored_solution
from heldout.benchmarks.mbpp_plus.execution import check_many, check_solution, compare, load_problems

LIMITS = RunLimits(wall_seconds=60, cpu_seconds=60, memory_mb=4096)


@pytest.fixture(scope="module")
def problems(data_dir) -> dict[str, dict]:
    return {p["task_id"]: p for p in load_problems(data_dir / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl")}


def canonical(p: dict) -> str:
    return p["prompt"] + p["canonical_solution"]


def check(p: dict, code: str, **kw):
    return check_solution(p, code, limits=LIMITS, **kw)


def test_the_file_has_378_problems(problems):
    assert len(problems) == 378


@pytest.mark.parametrize("task_id", ["Mbpp/2", "Mbpp/3", "Mbpp/139", "Mbpp/722", "Mbpp/124", "Mbpp/580"])
def test_canonical_solutions_pass_base_and_plus(problems, task_id):
    r = check(problems[task_id], canonical(problems[task_id]))
    assert r.base_pass and r.plus_pass, r.first_failure()
    assert r.base.total == len(problems[task_id]["base_input"]) and r.plus.total == len(problems[task_id]["plus_input"])
    assert scored_solution(r, canonical(problems[task_id])).dimensions == {"base": 1.0, "plus": 1.0}


def test_expected_outputs_are_kept_out_of_the_processs_memory_and_computed_once(problems, monkeypatch):
    """A study checks one cell's test problems before the next cell's in-process optimizer runs:
    what the canonical solution returned is kept in the process's own temp folder, read back on
    the next check without running the canonical solution again, and no object in memory holds it."""
    monkeypatch.setattr(mbpp_execution, "_truth_cache", mbpp_execution._TruthFiles())
    problem = problems["Mbpp/2"]
    assert check(problem, canonical(problem)).plus_pass
    del problem
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, mbpp_execution.GroundTruth)]
    key = mbpp_execution._problem_key(problems["Mbpp/2"])
    kept = mbpp_execution._truth_cache.get(key)
    assert kept is not None and len(kept.plus) == len(problems["Mbpp/2"]["plus_input"])
    assert oct(mbpp_execution._truth_cache._path(key).parent.stat().st_mode & 0o777) == "0o700"

    def refuse(*_):
        raise AssertionError("the canonical solution ran again")
    monkeypatch.setattr(mbpp_execution, "_truth_shard", refuse)
    assert check(problems["Mbpp/2"], canonical(problems["Mbpp/2"])).plus_pass
    assert not check(problems["Mbpp/2"], "def similar_elements(a, b):\n    return ()\n").base_pass


def test_a_full_disk_keeps_no_expected_outputs_and_loses_no_check(problems, monkeypatch):
    kept = mbpp_execution._TruthFiles()
    monkeypatch.setattr(mbpp_execution, "_truth_cache", kept)
    real_write = mbpp_execution.Path.write_bytes

    def full_disk(self, data):
        if self.parent.name.startswith("mbpp-truths-"):
            raise OSError(28, "No space left on device")
        return real_write(self, data)
    monkeypatch.setattr(mbpp_execution.Path, "write_bytes", full_disk)
    assert check(problems["Mbpp/2"], canonical(problems["Mbpp/2"])).plus_pass
    key = mbpp_execution._problem_key(problems["Mbpp/2"])
    assert kept.get(key) is None and list(kept._path(key).parent.iterdir()) == []


def test_check_many_returns_each_items_own_verdict_in_the_order_given(problems):
    square = problems["Mbpp/17"]
    items = [(problems["Mbpp/2"], canonical(problems["Mbpp/2"])),
             (square, "def square_perimeter(a):\n    return 4 * a + 1\n"),  # the same problem twice:
             (problems["Mbpp/3"], canonical(problems["Mbpp/3"])),
             (square, canonical(square))]  # one expected-output run, two checks
    results = check_many(items, workers=2, limits=LIMITS)
    assert [r.task_id for r in results] == ["Mbpp/2", "Mbpp/17", "Mbpp/3", "Mbpp/17"]
    assert [(r.base_pass, r.plus_pass) for r in results] == [(True, True), (False, False), (True, True), (True, True)]
    assert check_many([], limits=LIMITS) == []


def test_check_many_raises_when_a_canonical_solution_cannot_run(problems):
    broken = {**problems["Mbpp/3"], "task_id": "Mbpp/3-broken", "canonical_solution": "    raise RuntimeError('no')\n"}
    with pytest.raises(DataError, match="Mbpp/3-broken"):
        check_many([(problems["Mbpp/2"], canonical(problems["Mbpp/2"])), (broken, "def f():\n    pass\n")],
                   workers=2, limits=LIMITS)


def test_off_by_one_fails_as_a_wrong_answer(problems):
    r = check(problems["Mbpp/17"], "def square_perimeter(a):\n    return 4 * a + 1\n")
    assert not r.base_pass and not r.plus_pass
    fail = r.first_failure()
    assert fail["suite"] == "base" and fail["index"] == 0 and fail["reason"] == "wrong_answer"
    assert "expected 40, got 41" in fail["message"]
    scored = scored_solution(r, "def square_perimeter(a): ...")
    assert scored.dimensions["plus"] == 0.0 and "base: fail (0/" in scored.detail


def test_wrong_type_fails_even_when_the_values_agree(problems):
    # Mbpp/4 expects a list; a tuple with the same numbers is a different output for ==
    code = "import heapq\ndef heap_queue_largest(nums, n):\n    return tuple(heapq.nlargest(n, nums))\n"
    r = check(problems["Mbpp/4"], code)
    assert not r.base_pass and r.first_failure()["reason"] == "wrong_answer"


def test_printing_instead_of_returning_fails(problems):
    r = check(problems["Mbpp/17"], "def square_perimeter(a):\n    print(4 * a)\n")
    fail = r.first_failure()
    assert fail["reason"] == "wrong_answer" and "got None" in fail["message"]


def test_too_slow_fails_on_the_per_test_time_limit(problems):
    # 5 s of CPU work per test: the limit counts the solution's CPU time, at least 1 s
    code = ("import time\ndef square_perimeter(a):\n    t = time.process_time()\n"
            "    while time.process_time() - t < 5:\n        pass\n    return 4 * a\n")
    r = check(problems["Mbpp/17"], code, which=("base",))
    fail = r.first_failure()
    assert fail["reason"] == "timeout" and "cpu" in fail["message"] and "per-call" in fail["message"]
    # stopped by the 1 s floor, not by the end of its work: said in CPU seconds (its wall time,
    # 1.5 s here, was 3.2 s with the core shared three ways)
    assert " 1 s cpu" in fail["message"], fail["message"]


def test_a_solution_that_sleeps_fails_at_the_wall_backstop_of_its_time_limit(problems):
    # sleeping is no work: the CPU limit never comes, the wall backstop (4 x 1 s + 2 s) ends it
    code = "import time\ndef square_perimeter(a):\n    time.sleep(30)\n    return 4 * a\n"
    r = check(problems["Mbpp/17"], code, which=("base",))
    fail = r.first_failure()
    assert fail["reason"] == "timeout" and "wall" in fail["message"] and "per-call" in fail["message"]
    assert r.base.seconds < 30


def test_a_crash_and_a_syntax_error_fail_with_their_reason(problems):
    r = check(problems["Mbpp/17"], "def square_perimeter(a):\n    return a / 0\n")
    assert r.first_failure()["reason"] == "crash" and "ZeroDivisionError" in r.first_failure()["message"]
    r = check(problems["Mbpp/17"], "def square_perimeter(a:\n")
    assert r.first_failure()["reason"] == "crash" and "SyntaxError" in r.first_failure()["message"]
    r = check(problems["Mbpp/17"], "def perimeter(a):\n    return 4 * a\n")
    assert "square_perimeter" in r.first_failure()["message"]


def test_an_object_with_tricky_eq_is_bad_output_not_a_pass(problems):
    code = "class Any:\n    def __eq__(self, other):\n        return True\ndef square_perimeter(a):\n    return Any()\n"
    r = check(problems["Mbpp/17"], code)
    assert not r.base_pass and r.first_failure()["reason"] == "bad_output"


def test_weak_and_strong_verifier_disagree_on_a_solution_that_only_handles_base(problems):
    p = problems["Mbpp/17"]
    cases = " ".join(f"{json.dumps(i[0])}: {4 * i[0]}," for i in p["base_input"])
    code = f"def square_perimeter(a):\n    return {{{cases}}}.get(a, -1)\n"
    r = check(p, code)
    assert r.base_pass and not r.plus_pass
    assert scored_solution(r, code).dimensions == {"base": 1.0, "plus": 0.0}


def test_float_outputs_use_atol(problems):
    p = problems["Mbpp/139"]  # atol 1e-4
    r = check(p, "import math\ndef circle_circumference(r):\n    return 2 * math.pi * r + 1e-7\n")
    assert r.base_pass and r.plus_pass
    r = check(p, "import math\ndef circle_circumference(r):\n    return 2 * math.pi * r + 1e-2\n")
    assert not r.base_pass and "atol" in r.first_failure()["message"]


def _big_output_problem() -> dict:
    """A made-up record whose outputs are far over the digest threshold (pickles of many MB)."""
    return {"task_id": "Mbpp/9001", "prompt": "", "entry_point": "pairs", "atol": 0,
            "canonical_solution": "def pairs(n, word):\n    return [(word, i) for i in range(n)]\n",
            "base_input": [[600_000, "ab"]], "plus_input": [[300_000, "xyz"], [5, "ab"]]}


def test_a_large_output_crosses_as_a_digest_of_its_value_not_of_its_objects():
    out = [("ab", i) for i in range(600_000)]
    rebuilt = [("".join(["a", "b"]), int(str(i))) for i in range(600_000)]  # equal, nothing shared
    digest = _mbpp_child.shrink(out)
    assert set(digest) == {_mbpp_child.DIGEST_KEY, "type", "bytes"}
    assert digest["bytes"] > _mbpp_child.LARGE_OUTPUT_BYTES
    assert _mbpp_child.shrink(rebuilt) == digest
    assert _mbpp_child.shrink(out[:-1] + [("ab", -1)]) != digest
    assert _mbpp_child.shrink([(b"ab", i) for i in range(600_000)]) != digest  # types count, as in repr
    small = [("ab", 1)]
    assert _mbpp_child.shrink(small) is small
    cyclic: list = []
    cyclic.append(cyclic)
    assert _mbpp_child.shrink(cyclic) is cyclic  # unpicklable: left to the sandbox's encoder


class Loud(int):
    """An int subclass: it takes the pickle, whatever its size (a subclass may pickle to anything)."""


def test_scalars_skip_the_pickle_only_where_the_pickle_would_have_kept_them():
    limit = _mbpp_child.LARGE_OUTPUT_BYTES

    def by_pickle(out):  # the rule itself: the pickle's size decides
        return len(pickle.dumps(out, protocol=4)) <= limit

    cases = [None, True, 2.5, float("nan"), 7, -(1 << 64), "", "ab" * 1000, "\U0001f600" * 1000,
             1 << (8 * limit - 8 * 2048), 1 << (8 * limit), "x" * (limit // 4 - 300), "x" * (limit + 1),
             "\U0001f600" * (limit // 4), Loud(3)]
    for out in cases:
        if _mbpp_child._surely_small(out):
            assert by_pickle(out) and _mbpp_child.shrink(out) is out
        assert (_mbpp_child.shrink(out) is out) == by_pickle(out)
    assert not _mbpp_child._surely_small(Loud(3)) and _mbpp_child.shrink(Loud(3)) == 3
    assert set(_mbpp_child.shrink(1 << (8 * limit))) == {_mbpp_child.DIGEST_KEY, "type", "bytes"}


def test_large_outputs_pass_when_equal_and_fail_when_one_item_differs():
    p = _big_output_problem()
    rebuilt = ("def pairs(n, word):\n    out = []\n    for i in range(n):\n        out.append((word[:], i))\n"
               "    return out\n")
    assert check(p, rebuilt).plus_pass
    wrong = "def pairs(n, word):\n    out = [(word, i) for i in range(n)]\n    out[-1] = (word, 0)\n    return out\n"
    r = check(p, wrong)
    assert not r.base_pass and "digest" in r.first_failure()["message"]


def test_expected_outputs_computed_in_batches_and_dealt_runs_equal_one_run_per_problem(problems, monkeypatch):
    """Several canonical solutions per run, and a slow problem's inputs dealt over runs of their
    own, give each problem the outputs of a run of its own (and every input its time)."""
    chosen = [problems[t] for t in ("Mbpp/2", "Mbpp/139", "Mbpp/580", "Mbpp/583", "Mbpp/3")]
    alone = [mbpp_execution.ground_truth(p, limits=LIMITS) for p in chosen]
    dealt_runs = []
    shard = mbpp_execution._truth_shard
    monkeypatch.setattr(mbpp_execution, "_truth_shard",
                        lambda p, inputs, limits: dealt_runs.append(p["task_id"]) or shard(p, inputs, limits))
    for budget in (60.0, 0.0, 0.01):  # nothing deferred; everything; the slow one (0.85 s in all)
        monkeypatch.setattr(mbpp_execution, "TRUTH_BUDGET_SECONDS", budget)
        monkeypatch.setattr(mbpp_execution, "TRUTH_BATCH_PROBLEMS", 3)
        dealt_runs.clear()
        batched: list = [None] * len(chosen)
        schedule = mbpp_execution.new_schedule(3)
        mbpp_execution._plan_truths(schedule, chosen, LIMITS, batched.__setitem__)
        schedule.run()
        for p, mine, theirs in zip(chosen, batched, alone):
            assert (mine.base, mine.plus) == (theirs.base, theirs.plus), (budget, p["task_id"])
            assert len(mine.base_time) == len(p["base_input"]) and len(mine.plus_time) == len(p["plus_input"])
        if budget == 60.0:
            assert dealt_runs == []  # two runs for five problems
        else:
            assert dealt_runs.count("Mbpp/583") == 3  # its inputs dealt over three runs
    assert mbpp_execution._deal(list(range(10)), 3) == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_expected_output_runs_hold_at_most_the_batch_size_and_split_evenly_over_the_workers(monkeypatch):
    monkeypatch.setattr(mbpp_execution, "TRUTH_BATCH_PROBLEMS", 20)
    bounds = mbpp_execution._batch_bounds
    assert bounds(30, 2) == [(0, 15), (15, 30)]  # not 20 + 10: both workers finish together
    assert bounds(5, 2) == [(0, 3), (3, 5)]
    assert bounds(1, 4) == [(0, 1)] and bounds(0, 2) == []
    full = bounds(378, 2)
    assert len(full) == 19 and max(b - a for a, b in full) == 20 and min(b - a for a, b in full) == 19
    for n, workers in ((378, 2), (41, 3), (7, 8)):
        covered = [i for a, b in bounds(n, workers) for i in range(a, b)]
        assert covered == list(range(n))  # every problem once, in order


def test_the_schedule_runs_the_lowest_ranked_ready_job_first_and_a_job_may_add_jobs():
    order = []
    schedule = mbpp_execution.new_schedule(1)
    schedule.add((2, 0), lambda: order.append("check"))
    schedule.add((0, 1), lambda: order.append("second batch"))
    schedule.add((0, 0), lambda: (order.append("first batch"), schedule.add((1, 0), lambda: order.append("its rest"))))
    schedule.run()
    assert order == ["first batch", "second batch", "its rest", "check"]


def test_the_schedule_raises_the_first_error_and_starts_nothing_after_it():
    order = []
    schedule = mbpp_execution.new_schedule(2)

    def fails():
        raise DataError("Mbpp/0: the canonical solution failed")

    schedule.add((0, 0), fails)
    schedule.add((1, 0), lambda: order.append("after"))
    with pytest.raises(DataError, match="Mbpp/0"):
        schedule.run()
    assert order in ([], ["after"])  # the second worker may have taken it before the error
    one = mbpp_execution.new_schedule(1)
    one.add((0, 0), fails)
    one.add((1, 0), lambda: order.append("never"))
    with pytest.raises(DataError):
        one.run()
    assert "never" not in order


def test_a_batch_names_the_problem_whose_canonical_solution_fails(problems):
    broken = {**problems["Mbpp/3"], "task_id": "Mbpp/3-broken", "canonical_solution": "    raise RuntimeError('no')\n"}
    with pytest.raises(DataError, match="Mbpp/3-broken"):
        mbpp_execution._truth_batch([(p, p["base_input"] + p["plus_input"]) for p in (problems["Mbpp/2"], broken,
                                                                                   problems["Mbpp/4"])], LIMITS, 60.0)


def test_compare_follows_evalplus_rules():
    assert compare("f", 1.0000001, 1.0, (), 0) == (True, 1e-6, "")  # atol switched on for floats
    ok, atol, _ = compare("f", 3, 3, (), 0)
    assert ok and atol == 0
    assert not compare("f", (1, 2), [1, 2], (), 0)[0]
    assert not compare("f", [1.0, 2.0], (1.0, 2.0), (), 0)[0]  # inexact float match needs equal types
    assert compare("similar_elements", (5, 4), (4, 5), (), 0)[0]  # set comparison task
    assert compare("are_equivalent", False, True, (), 0)[0]  # Mbpp/164 accepts anything
    assert compare("sum_div", 0, 7, (), 0)[0]  # Mbpp/295 also accepts 0
    assert compare("digit_distance_nums", 7, 0, (123, 256), 0)[0]  # |1-2|+|2-5|+|3-6|
    assert not compare("f", math.nan, math.nan, (), 0)[0]
    assert not compare("f", object(), [1], (), 0)[0]


def test_input_deserialisation_gives_the_task_its_types(problems):
    inp = _mbpp_child.deserialize("Mbpp/2", problems["Mbpp/2"]["base_input"][0])
    assert all(type(a) is tuple for a in inp)
    inp = _mbpp_child.deserialize("Mbpp/124", problems["Mbpp/124"]["base_input"][0])
    assert type(inp[0]) is float and type(inp[1]) is complex
    inp = _mbpp_child.deserialize("Mbpp/580", problems["Mbpp/580"]["base_input"][0])
    assert type(inp) is tuple and type(inp[0]) is tuple


# -- the same answers as evalplus, where evalplus is installed -----------------------------------
def test_deserialisation_equals_evalplus_on_every_input(problems):
    mbpp = pytest.importorskip("evalplus.data.mbpp")
    for tid, p in problems.items():
        for key in ("base_input", "plus_input"):
            theirs = mbpp.mbpp_deserialize_inputs(tid, json.loads(json.dumps(p[key])))
            mine = [_mbpp_child.deserialize(tid, inp) for inp in json.loads(json.dumps(p[key]))]
            assert mine == (list(theirs) if not theirs else theirs), tid  # == tells a list from a tuple everywhere


def _variants(p: dict) -> dict[str, str]:
    entry = p["entry_point"]
    return {
        "canonical": canonical(p),
        "returns_none": f"def {entry}(*args):\n    return None\n",
        "crashes": f"def {entry}(*args):\n    raise ValueError('no')\n",
        "numpy_array": "import numpy as _np\n" + canonical(p).replace(f"def {entry}(", f"def _np_{entry}(") +
        f"\ndef {entry}(*args):\n    out = _np_{entry}(*args)\n"
        "    return _np.array(out) if isinstance(out, list) and out and all(type(x) in (int, float) for x in out) else out\n",
        "base_only": canonical(p).replace(f"def {entry}(", f"def _real_{entry}(") +
        f"\n_seen = {{json_key}}\ndef {entry}(*args):\n    return _real_{entry}(*args) if repr(args) in _seen else None\n"
        .replace("{json_key}", repr({repr(tuple(_mbpp_child.deserialize(p['task_id'], i))) for i in p["base_input"]})),
    }


@pytest.mark.parametrize("task_id", ["Mbpp/2", "Mbpp/4", "Mbpp/17", "Mbpp/139", "Mbpp/124", "Mbpp/722", "Mbpp/58", "Mbpp/580"])
def test_verdicts_equal_evalplus_on_the_same_samples(problems, task_id):
    ev = pytest.importorskip("evalplus.evaluate")
    mbpp = pytest.importorskip("evalplus.data.mbpp")
    from evalplus.gen.util import trusted_exec

    raw = problems[task_id]
    p = dict(raw)
    p["base_input"] = mbpp.mbpp_deserialize_inputs(task_id, json.loads(json.dumps(raw["base_input"])))
    p["plus_input"] = mbpp.mbpp_deserialize_inputs(task_id, json.loads(json.dumps(raw["plus_input"])))
    not_none = raw["entry_point"] in _mbpp_child.OUTPUT_NOT_NONE
    expected = {}
    for which in ("base", "plus"):
        expected[which], expected[f"{which}_time"] = trusted_exec(
            canonical(raw), p[f"{which}_input"], raw["entry_point"], record_time=True, output_not_none=not_none)
    for name, code in _variants(raw).items():
        theirs = ev.check_correctness("mbpp", 0, p, code, expected, fast_check=True)
        mine = check(raw, code)
        assert (theirs["base"][0] == "pass", theirs["plus"][0] == "pass") == (mine.base_pass, mine.base.ok and mine.plus.ok), \
            (task_id, name, theirs["base"][0], theirs["plus"][0], mine.first_failure())


def test_the_mbpp_plus_task_scores_model_text_through_this_path(data_dir, problems):
    from heldout.benchmarks.registry import get_benchmark

    bench = get_benchmark("mbpp_plus")
    example = next(ex for ex in bench.load_raw(str(data_dir)) if ex.id == "Mbpp/17")
    good = bench.score_text("Here it is:\n```python\ndef square_perimeter(a):\n    return 4 * a\n```\n", example)
    assert good.score == 1.0 and good.dimensions == {"base": 1.0, "plus": 1.0}
    bad = bench.score_text("```python\ndef square_perimeter(a):\n    return 4 * a + 1\n```", example)
    assert bad.valid and bad.score == 0.0 and bad.output["failure_reason"] == "wrong_answer"
    assert "first failure (base test 0): wrong_answer" in bad.feedback
