"""What an in-process (trusted) optimizer can reach by accident (containment family 8).

"Trusted" means the optimizer shares the harness's interpreter, and the record says so: a
determined one can import anything. Accidental misuse is made hard anyway: walking the object
graph from the view (every attribute, closure and container, as ``gc.get_referents`` sees them)
reaches no test example, and the budget and the metric-call counter cannot be assigned to."""

from __future__ import annotations

import gc
import types

import pytest

from heldout.evaluators.session import Budget, Session

PROFILE = "generalise"  # lockpicking/six with train, val and test disjoint


def reachable(root: object, wanted: set[int]) -> tuple[list[str], int]:
    """Paths from ``root`` to objects whose id is in ``wanted``; modules and classes are not
    entered (importing them is the deliberate route, not an accident of the view)."""
    seen: set[int] = set()
    stack = [(root, "view")]
    hits = []
    while stack:
        obj, path = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if id(obj) in wanted:
            hits.append(path)
            continue
        if isinstance(obj, (types.ModuleType, type, str, bytes, int, float)):
            continue
        stack += [(ref, f"{path} -> {type(ref).__name__}") for ref in gc.get_referents(obj)]
    return hits, len(seen)


def test_no_test_example_is_reachable_from_the_in_process_view(tmp_path):
    session = Session("lockpicking/six", profile=PROFILE, budget=Budget(5), seed=0, run_dir=tmp_path / "run")
    test = session.task.splits["test"]
    assert test and not {ex.id for ex in test} & {ex.id for s in ("train", "val") for ex in session.task.splits[s]}
    seen: dict[str, object] = {}

    def optimizer(view, seed):
        view.evaluate(view.seed_candidate, "train", [view.train[0]["id"]])  # a live session, mid-run
        seen["hits"], seen["walked"] = reachable(view, {id(ex) for ex in test})
        # control: the walk does find the train examples the view holds
        seen["train"], _ = reachable(view, {id(ex) for ex in session.task.splits["train"]})
        return view.seed_candidate

    record = session.run(optimizer)
    assert record.status == "ok"
    assert seen["walked"] > 100 and seen["train"], seen  # the walk went deep and can find what is there
    assert seen["hits"] == []


def test_the_budget_and_the_metric_call_counter_cannot_be_assigned_to(tmp_path):
    session = Session("lockpicking/six", profile=PROFILE, budget=Budget(3), seed=0, run_dir=tmp_path / "run")
    attempts: dict[str, str] = {}

    def optimizer(view, seed):
        service = view._service  # noqa: SLF001 - the accident under test
        for name, act in (("budget", lambda: setattr(service, "budget", Budget(10 ** 6))),
                          ("counter", lambda: setattr(service.usage, "metric_calls", 0)),
                          ("view budget", lambda: setattr(view, "budget", Budget(10 ** 6)))):
            try:
                act()
            except AttributeError as exc:
                attempts[name] = f"refused: {exc}"
            else:
                attempts[name] = "ASSIGNED"
        view.evaluate(view.seed_candidate, "train", [ex["id"] for ex in view.train[:3]])
        return view.seed_candidate

    record = session.run(optimizer)
    assert all(v.startswith("refused") for v in attempts.values()), attempts
    assert record.usage["metric_calls"] == 3 and session.service.remaining == 0
    with pytest.raises(ValueError, match="only ever added"):
        session.service.usage.charge(-1)
