"""What an in-process (trusted) optimizer can reach by accident (containment family 8).

"Trusted" means the optimizer shares the harness's interpreter, and the record says so: a
determined one can load the data itself. Reaching the held-out examples through the harness is
made impossible anyway, because they are not in the process while the optimizer runs (the
session loads its test split only to score the final candidate): walking the object graph from
the view (every attribute, closure and container, as ``gc.get_referents`` sees them), from what
refers to the view (``gc.get_referrers``: the session, the frames that called the optimizer),
from every frame above the optimizer (``sys._getframe``), and scanning every object the
collector tracks (``gc.get_objects``) for a test target's text, finds none; the budget and the
metric-call counter cannot be assigned to."""

from __future__ import annotations

import gc
import re
import sys
import types

import pytest

import heldout
from heldout.contracts import Example, InfrastructureFailure, TaskView
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.view import SessionView
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient
from heldout.models.backends.deterministic import DeterministicBackend
from heldout.models.server import ChatServer
from heldout.models.testserver import TestServer
from heldout.protocols.leak_scan import scan_candidate

PROFILE = "generalise"  # lockpicking/six with train, val and test disjoint


def reachable(root: object, is_wanted, name: str = "view", skip: set[int] | None = None) -> tuple[list[str], int]:
    """Paths from ``root`` to objects ``is_wanted`` says yes to; modules and classes are not
    entered (importing them is the deliberate route, not an accident of the view), nor the
    objects in ``skip`` (the test's own)."""
    seen: set[int] = set(skip or ())
    stack = [(root, name)]
    hits = []
    while stack:
        obj, path = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if is_wanted(obj):
            hits.append(path)
            continue
        if isinstance(obj, (types.ModuleType, type, str, bytes, int, float)):
            continue
        stack += [(ref, f"{path} -> {type(ref).__name__}") for ref in gc.get_referents(obj)]
    return hits, len(seen)


def example_of(ids: frozenset[str]):
    """``is_wanted`` for an Example (or an example's dict) whose id is one of ``ids``."""
    def wanted(obj: object) -> bool:
        if isinstance(obj, Example):
            return obj.id in ids
        return isinstance(obj, dict) and obj.get("id") in ids and ("target" in obj or "input" in obj)
    return wanted


def split_ids(task: str, profile: str, split: str) -> frozenset[str]:
    """The ids of a split, read without keeping the task (whose examples would be found)."""
    return frozenset(ex.id for ex in heldout.load_task(task, profile=profile).split(split))


def test_no_test_example_is_reachable_from_the_in_process_view(tmp_path):
    test, train = split_ids("lockpicking/six", PROFILE, "test"), split_ids("lockpicking/six", PROFILE, "train")
    assert test and not test & train
    session = Session("lockpicking/six", profile=PROFILE, budget=Budget(5), seed=0, run_dir=tmp_path / "run")
    seen: dict[str, object] = {}

    def optimizer(view, seed):
        view.evaluate(view.seed_candidate, "train", [view.train[0]["id"]])  # a live session, mid-run
        seen["hits"], seen["walked"] = reachable(view, example_of(test))
        # control: the walk does find the train examples the view holds
        seen["train"], _ = reachable(view, example_of(train))
        return view.seed_candidate

    record = session.run(optimizer)
    assert record.status == "ok" and len(record.test_verdicts) == len(test)  # the test split was scored after
    assert seen["walked"] > 100 and seen["train"], seen  # the walk went deep and can find what is there
    assert seen["hits"] == []


def test_nothing_that_refers_to_the_view_nor_any_frame_above_the_optimizer_reaches_a_test_example(tmp_path):
    """The route the issue found: ``gc.get_referrers(view)`` is the session (its attributes), whose
    task held the test split; and every frame that called the optimizer holds the session."""
    test, train = split_ids("lockpicking/six", PROFILE, "test"), split_ids("lockpicking/six", PROFILE, "train")
    session = Session("lockpicking/six", profile=PROFILE, budget=Budget(5), seed=0, run_dir=tmp_path / "run")
    seen: dict[str, object] = {}

    def optimizer(view, seed):
        view.evaluate(view.seed_candidate, "train", [view.train[0]["id"]])
        here = sys._getframe()
        referrers = [r for r in gc.get_referrers(view) if r is not here]
        frames, frame = [], here.f_back
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        skip = {id(seen), id(referrers), id(frames), id(here)}
        seen["referrers"] = [type(r).__name__ for r in referrers]
        seen["hits"] = [hit for root in referrers + frames
                        for hit in reachable(root, example_of(test), type(root).__name__, skip)[0]]
        seen["train"] = [hit for root in referrers for hit in reachable(root, example_of(train), "referrer", skip)[0]]
        seen["session"] = any(f.f_locals.get("self") is session for f in frames)  # the walk passed the session
        return view.seed_candidate

    record = session.run(optimizer)
    assert record.status == "ok"
    assert "Session" in seen["referrers"] and seen["session"] and seen["train"], seen  # the session is found
    assert seen["hits"] == []


def _distinct_test_texts(task: str, data_dir) -> tuple[frozenset[str], frozenset[str]]:
    """A test example's unmistakable texts that no train, val or few-shot example has, not even
    inside a longer text: its questions and options (held as they are by whatever holds the
    example), and its targets when they are long strings (word_sorting's sorted lists; a model's
    output holds its answer inside a sentence)."""
    def texts(ex: Example) -> tuple[set[str], set[str]]:
        whole = {t for t in [ex.input.get("question"), *ex.input.get("options", ())] if isinstance(t, str) and len(t) > 20}
        return whole, {ex.target} if isinstance(ex.target, str) and len(ex.target) > 20 else set()
    loaded = heldout.load_task(task, data_dir=data_dir)
    elsewhere = "\n".join(t for s in ("train", "val", "fewshot") for ex in loaded.splits.get(s, [])
                          for kind in texts(ex) for t in kind)
    test = [texts(ex) for ex in loaded.split("test")]
    return tuple(frozenset(t for ex in test for t in ex[k] if t not in elsewhere) for k in (0, 1))


def _strings(referent: object):
    """The strings a referent is or holds where the collector does not look: a dict or tuple of
    plain values only is not tracked (``gc.get_objects`` leaves it out), so its strings are read
    here, through untracked containers nested in it."""
    if type(referent) is str:
        yield referent
    elif type(referent) in (dict, tuple) and not gc.is_tracked(referent):
        for item in ([*referent.keys(), *referent.values()] if type(referent) is dict else referent):
            yield from _strings(item)


def _holders(texts: tuple[frozenset[str], frozenset[str]], skip: set[int]) -> list[str]:
    """Every object the collector tracks (containers, instances with or without slots, frames)
    that refers to one of the ``whole`` texts, or to a string holding one of the ``inside`` ones,
    itself or through an untracked container."""
    whole, inside = texts
    skip = skip | {id(texts), id(whole), id(inside)}
    pattern = re.compile("|".join(map(re.escape, sorted(inside)))) if inside else None
    shortest = min(map(len, inside), default=0)
    holds: dict[int, bool] = {}  # a string's id -> whether it holds one (the strings live through the scan)

    def wanted(text: str) -> bool:
        if text in whole:
            return True
        if pattern is None or len(text) < shortest:
            return False
        if id(text) not in holds:
            holds[id(text)] = pattern.search(text) is not None
        return holds[id(text)]
    return [type(obj).__name__ for obj in gc.get_objects()
            if id(obj) not in skip and any(wanted(t) for r in gc.get_referents(obj) for t in _strings(r))]


# word_sorting: the deterministic model answers correctly, so the first session's outputs are the test
# targets (what the scorers' memos read); MMLU-Pro: questions and options (the loader, the option
# grammars)
@pytest.mark.parametrize("task", ["bbh/word_sorting", "mmlu_pro/history"])
def test_no_object_in_the_process_holds_a_test_example_while_the_optimizer_runs(tmp_path, data_dir, task):
    """A study runs its cells one after another in one process: the second session's optimizer
    runs after the first session scored its final candidate on the test split, and finds no test
    text in any object of the process."""
    texts = _distinct_test_texts(task, data_dir)
    assert sum(map(len, texts)) > 100
    with TestServer() as server:
        worker = ModelClient("test-worker", base_url=server.base_url)

        def session(name: str) -> Session:
            return Session(task, budget=Budget(4), seed=0, models=SessionModels(worker=worker),
                           run_dir=tmp_path / name, data_dir=str(data_dir))
        first = session("first").run(lambda view, seed: view.seed_candidate)
        assert first.status == "ok" and first.test_verdicts and first.test_score > 0, first.test_score
        del first
        seen: dict[str, object] = {}

        def optimizer(view, seed):
            view.evaluate(view.seed_candidate, "train", [ex["id"] for ex in view.train[:4]])
            gc.collect()
            seen["during"] = _holders(texts, {id(seen)})
            # control: the same scan finds the train examples the view holds
            train = frozenset(t for ex in view.train for t in (ex["target"], ex["input"].get("question"))
                              if isinstance(t, str) and len(t) > 20)
            seen["train"] = _holders((train, frozenset()), {id(seen)})
            return view.seed_candidate

        record = session("second").run(optimizer)
    assert record.status == "ok" and record.test_verdicts
    assert seen["train"] and seen["during"] == [], seen
    held = heldout.load_task(task, data_dir=data_dir)
    assert _holders(texts, {id(seen)}), "control: the scan finds a loaded task's test examples"
    del held


def test_the_view_is_the_contracts_protocol_with_every_documented_attribute(tmp_path):
    """``heldout.TaskView`` is the Protocol of docs/plug-an-optimizer.md's table, met by the
    in-process view (a class of another name) and the HTTP client alike."""
    documented = ("task_name", "description", "kind", "seed_candidate", "train", "val", "evaluate", "remaining",
                  "metric_calls_budget", "architect", "architect_tokens_used", "record_event", "policy", "verifier")
    assert heldout.TaskView is TaskView and SessionView is not TaskView
    members = set(TaskView.__annotations__) | {n for n in vars(TaskView) if not n.startswith("_")}
    assert set(documented) <= members, set(documented) - members
    session = Session("lockpicking/six", profile=PROFILE, budget=Budget(2), seed=0, run_dir=tmp_path / "run")
    assert isinstance(session.view, TaskView) and all(hasattr(session.view, n) for n in documented)
    with pytest.raises(heldout.DataError, match="held back"):
        session.task.split("test")


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


def test_what_scoring_and_scanning_outside_a_session_leave_is_gone_when_an_optimizer_runs(tmp_path, data_dir):
    """A leak ablation or a recipe scores the test split and scans candidates against it, outside
    any session's held-out scoring; the next session's optimizer still finds no test text."""
    texts = _distinct_test_texts("bbh/word_sorting", data_dir)
    task = heldout.load_task("bbh/word_sorting", data_dir=data_dir)
    for ex in task.split("test"):  # correct answers: the outputs hold the targets
        task.benchmark.score_text(f"Let me sort them. So the answer is {ex.target}.", ex)
    scan_candidate(task.benchmark.seed_candidate(), task)
    del task, ex
    gc.collect()
    assert _holders(texts, set()), "control: the scorers' memos and the scan's index hold test texts"
    seen: dict[str, list[str]] = {}

    def optimizer(view, seed):
        gc.collect()
        seen["during"] = _holders(texts, {id(seen)})
        return view.seed_candidate

    session = Session("bbh/word_sorting", budget=Budget(2), seed=0, run_dir=tmp_path / "run", data_dir=str(data_dir))
    assert session.optimise(optimizer).final is not None
    assert seen["during"] == [], seen


class _FailingFromNowOn(DeterministicBackend):
    """The test model, until ``failing`` is set: then every request fails (the endpoint is down)."""

    failing = False

    def complete(self, call, on_text=None):
        if self.failing:
            raise RuntimeError("the endpoint is down")
        return super().complete(call, on_text)


def test_a_session_resumed_after_its_test_scoring_was_cut_holds_no_test_result_while_its_optimizer_runs_again(
        tmp_path, data_dir):
    """The endpoint fails a third of the way through the test split: the session ends incomplete,
    its ledger holding the test verdicts scored so far (outputs, targets in their feedback). The
    resumed session runs its in-process optimizer again before it scores the rest: the ledger
    keeps those entries on disk, not in memory, and reads them back only to score the rest."""
    texts = _distinct_test_texts("bbh/word_sorting", data_dir)
    backend = _FailingFromNowOn()

    def cut_when_the_test_split_starts(split, done, total, failed):
        backend.failing = split == "test" and done > 0

    with ChatServer(backend) as server:
        worker = ModelClient("test-worker", base_url=server.base_url, max_retries=0)
        first = Session("bbh/word_sorting", budget=Budget(2), seed=0, models=SessionModels(worker=worker),
                        run_dir=tmp_path / "run", data_dir=str(data_dir))
        first.heldout_progress = cut_when_the_test_split_starts
        with pytest.raises(InfrastructureFailure, match="test: .* not scored"):
            first.run(lambda view, seed: view.seed_candidate)
        worker.close()
    del first
    scored_before = sum(1 for line in (tmp_path / "run" / "ledger.jsonl").open() if '"test_scoring"' in line)
    assert 0 < scored_before < 150
    seen: dict[str, list[str]] = {}

    def optimizer(view, seed):
        gc.collect()
        seen["during"] = _holders(texts, {id(seen)})
        return view.seed_candidate

    with TestServer() as server:
        worker = ModelClient("test-worker", base_url=server.base_url)
        resumed = Session("bbh/word_sorting", budget=Budget(2), seed=0, models=SessionModels(worker=worker),
                          run_dir=tmp_path / "run", data_dir=str(data_dir))
        record = resumed.run(optimizer)
    assert seen["during"] == [], seen
    assert record.status == "ok" and len(record.test_verdicts) == 150
    scored = sum(1 for line in (tmp_path / "run" / "ledger.jsonl").open() if '"test_scoring"' in line)
    assert scored == 150  # the verdicts kept on disk were read back: only the rest were scored
