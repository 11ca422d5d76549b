"""Field conditions: one optimizer, in-process or isolated, must see the same view.

In the lab an optimizer is tried in-process (``SessionView``); in the field it runs isolated and
reaches its session through the view server (``TaskClient``). Whatever it is shown (results,
numbers, refusals) must be the same in both, or the isolated run of the same study silently takes
other decisions. Each test asks both views of two sessions of one task the same thing, through a
real loopback view server, and compares what comes back."""

from __future__ import annotations

import collections
import contextlib
from typing import Any, Callable, Iterator

import pytest

import heldout
from heldout.adapters.client import RequestRefused, TaskClient
from heldout.contracts import BudgetExceeded, MalformedCandidate, VisibilityError
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.view_server import ViewServer


@pytest.fixture(scope="module")
def lockpicking():
    return heldout.load_task("lockpicking/six")


@contextlib.contextmanager
def both_views(task, tmp_path, budget: int = 3) -> Iterator[tuple[Any, TaskClient]]:
    """The in-process view of one session and the isolated client of another, same task and seed."""
    local = Session(task, budget=Budget(budget), seed=0, run_dir=tmp_path / "in-process")
    served = Session(task, budget=Budget(budget), seed=0, run_dir=tmp_path / "isolated")
    with ViewServer(served, host="127.0.0.1") as server:
        yield local.view, TaskClient(server.token, url=server.url)


def first_train_id(view) -> str:
    return view.train[0]["id"]


class Text(str):
    """A str subclass: it could hash as one candidate and run as another (contracts.check_candidate)."""


REFUSALS: dict[str, tuple[Callable[[Any], Any], type[Exception]]] = {
    "a component that is not text": (lambda v: v.evaluate({"query.sql": 1}, "train", [first_train_id(v)]),
                                     MalformedCandidate),
    "an empty candidate": (lambda v: v.evaluate({}, "train", [first_train_id(v)]), MalformedCandidate),
    "a component that is a mapping": (lambda v: v.evaluate({"a": {"b": "c"}}, "train", [first_train_id(v)]),
                                          MalformedCandidate),
    "an OrderedDict": (lambda v: v.evaluate(collections.OrderedDict(v.seed_candidate), "train", [first_train_id(v)]),
                       MalformedCandidate),
    "a defaultdict": (lambda v: v.evaluate(collections.defaultdict(str, v.seed_candidate), "train",
                                           [first_train_id(v)]), MalformedCandidate),
    "a component text of a str subclass": (lambda v: v.evaluate({k: Text(t) for k, t in v.seed_candidate.items()},
                                                                "train", [first_train_id(v)]), MalformedCandidate),
    "a component name that is a number": (lambda v: v.evaluate({1: "x"}, "train", [first_train_id(v)]),
                                          MalformedCandidate),
    "the test split": (lambda v: v.evaluate(v.seed_candidate, "test", [first_train_id(v)]), VisibilityError),
    "a split that is not text": (lambda v: v.evaluate(v.seed_candidate, None, [first_train_id(v)]), VisibilityError),
    "a split in bytes": (lambda v: v.evaluate(v.seed_candidate, b"train", [first_train_id(v)]), VisibilityError),
    "an id that is a number": (lambda v: v.evaluate(v.seed_candidate, "train", [0]), VisibilityError),
    "an id of no example": (lambda v: v.evaluate(v.seed_candidate, "train", ["no-such-example"]), VisibilityError),
    "more examples than the budget": (lambda v: v.evaluate(v.seed_candidate, "train", [e["id"] for e in v.train[:5]]),
                                      BudgetExceeded),
}


@pytest.mark.parametrize("asked", sorted(REFUSALS))
def test_each_refusal_is_the_same_error_in_both_views(asked, lockpicking, tmp_path):
    """An optimizer that catches ``MalformedCandidate`` to skip a bad proposal skipped it
    in-process and crashed isolated (the client raised a bare ``RequestRefused`` for the 400); and
    a candidate the in-process view refuses (an OrderedDict, a str subclass, a number for a name)
    ran isolated, JSON having made it a plain dict of text on its way."""
    call, expected = REFUSALS[asked]
    with both_views(lockpicking, tmp_path) as (local, client):
        with pytest.raises(expected):
            call(local)
        with pytest.raises(expected) as isolated:
            call(client)
        assert isinstance(isolated.value, RequestRefused)  # and it still says the HTTP status
        assert client.remaining == local.remaining == 3  # nothing ran in either


def test_the_results_of_one_evaluation_are_equal_in_both_views(lockpicking, tmp_path):
    with both_views(lockpicking, tmp_path) as (local, client):
        ids = [ex["id"] for ex in client.train[:2]]
        shown = client.evaluate(client.seed_candidate, "train", ids)
        assert shown == local.evaluate(local.seed_candidate, "train", ids)
        assert client.train == local.train and client.val == local.val and client.metric == local.metric


def test_a_verdict_holding_an_infinity_shows_the_same_value_in_both_views(tmp_path):
    minmax = heldout.load_task("minmax/d3n14")
    coincident = {"program.py": "import numpy as np\n\ndef min_max_dist_dim3_14():\n"
                                "    p = np.random.default_rng(42).normal(size=(14, 3))\n"
                                "    p[1] = p[0]\n    return p\n"}
    with both_views(minmax, tmp_path) as (local, client):
        assert local.evaluate(coincident, "train") == client.evaluate(coincident, "train")
