"""While MBPP+ checks run, what the process held before them stays out of the garbage
collector's full passes (one walked ~51,000 objects with every monitor stopped), and afterwards
the process's collector is as it was: older cyclic garbage is collected again, and a freeze the
process made itself is left alone."""

from __future__ import annotations

import gc
import weakref

from heldout.contracts import RunLimits
from heldout.benchmarks.mbpp_plus import execution as mbpp_execution
from heldout.benchmarks.mbpp_plus._frozen_heap import older_objects_frozen


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_older_cyclic_garbage_waits_for_the_end_and_is_collected_then():
    old = Node()
    gone = weakref.ref(old)
    with older_objects_frozen():
        assert gc.get_freeze_count() > 0
        del old
        gc.collect()
        assert gone() is not None  # frozen: a full pass does not walk it
        new = Node()
        made_inside = weakref.ref(new)
        del new
        gc.collect()
        assert made_inside() is None  # made during the check: collected as usual
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None


def test_nested_and_overlapping_checks_share_one_freeze():
    with older_objects_frozen():
        assert gc.get_freeze_count() > 0
        with older_objects_frozen():
            pass
        # the inner end did not unfreeze the outer check (unfrozen, the count is 0; frozen objects
        # freed meanwhile make it smaller, never 0)
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_a_freeze_the_process_made_itself_is_left_as_it_is():
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with older_objects_frozen():
            pass
        # not unfrozen (the count would be 0) and nothing added: frozen objects freed meanwhile (the
        # test's own frames) may make it a little smaller, never larger
        assert 0.99 * before <= gc.get_freeze_count() <= before
    finally:
        gc.unfreeze()


def test_check_many_runs_its_schedule_inside_the_freeze(data_dir, monkeypatch):
    seen = []
    run = mbpp_execution.Schedule.run

    def recording(self):
        seen.append(gc.get_freeze_count())
        return run(self)

    monkeypatch.setattr(mbpp_execution.Schedule, "run", recording)
    monkeypatch.setattr(mbpp_execution, "_truth_cache", {})
    problem = mbpp_execution.load_problems(data_dir / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl")[1]
    problem = {**problem, "plus_input": problem["plus_input"][:3]}
    results = mbpp_execution.check_many([(problem, problem["prompt"] + problem["canonical_solution"])],
                                        limits=RunLimits(wall_seconds=60, cpu_seconds=60, memory_mb=4096))
    assert results[0].plus_pass
    assert len(seen) == 1 and seen[0] > 0
    assert gc.get_freeze_count() == 0
