"""Scoring a candidate on examples, and what it costs.

:class:`Scorer` runs a candidate: a worker call + ``score_text`` for prompt tasks (sent as the
task's prompt setting says), a sandboxed execution for program tasks. :class:`MeteredWorker` is
the worker a task's ``RunContext`` offers, booking its calls on the session's meter
(:class:`~heldout.evaluators.policy.Usage`). :class:`SessionModels` and
:class:`Execution` are what a session is given to score with. The session (:mod:`.session`)
decides *whether* to score; this module only scores."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Mapping, Sequence

from heldout.benchmarks.prompt_task import ZERO_SHOT_SETTING
from heldout.contracts import (Candidate, Completion, Example, HeldoutError, InfrastructureFailure, Message,
                               RunContext, RunLimits, Verdict, is_infrastructure_failure)
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.policy import Usage
from heldout.models import JUDGE_CHANNEL, ChatClient, ChatRequest, check_chat_client, model_failure_kind



@dataclass(frozen=True)
class SessionModels:
    """The models a session talks to, each a :class:`~heldout.models.ChatClient` or None. Checked
    here: a model that cannot answer is one configuration error when the session is made, never an
    optimizer's failure later.

    * ``worker`` executes prompt candidates while the optimizer runs (``worker-optimisation``);
    * ``architect`` is the model the optimizer proposes with (``view.architect``);
    * ``judge`` is a separate model judge (``judge-*``; None: a judged task asks the worker);
    * ``deployment_worker`` scores the final candidate (``worker-deployment``; None: ``worker``)."""

    worker: ChatClient | None = None
    architect: ChatClient | None = None
    judge: ChatClient | None = None
    deployment_worker: ChatClient | None = None

    def __post_init__(self) -> None:
        for role, client in (("worker", self.worker), ("architect", self.architect), ("judge", self.judge),
                             ("deployment worker", self.deployment_worker)):
            if client is not None:
                check_chat_client(client, role)


DECODING_OPTIONS = ("temperature", "max_tokens", "judge_temperature", "judge_max_tokens")
"""The options of an experiment that say how its models decode, not what its task does."""


@dataclass(frozen=True)
class Decoding:
    """How a session's models decode, kept apart from the task options a task's
    :class:`RunContext` carries: the worker's ``temperature`` and ``max_tokens`` (None: the task's
    prompt setting's, else 0.0 and no cap) and the judge's (0.0 and no cap unless set)."""

    temperature: float | None = None
    max_tokens: int | None = None
    judge_temperature: float = 0.0
    judge_max_tokens: int | None = None

    def __post_init__(self) -> None:  # refused when the session is made, not once per request later
        for name in ("temperature", "judge_temperature"):
            value = getattr(self, name)
            if value is not None and (type(value) not in (int, float) or not 0.0 <= value <= 2.0):
                raise HeldoutError(f"decoding {name} must be a number in [0, 2], got {value!r}")
        for name in ("max_tokens", "judge_max_tokens"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise HeldoutError(f"decoding {name} must be a positive int, got {value!r}")

    @classmethod
    def split(cls, options: Mapping[str, Any]) -> tuple["Decoding", dict[str, Any]]:
        """An experiment's options as a study states them, in one mapping: (its decoding, its task
        options)."""
        return cls(**{k: options[k] for k in DECODING_OPTIONS if k in options}), without_decoding(options)


def without_decoding(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` less any decoding setting: the task options."""
    return {k: v for k, v in options.items() if k not in DECODING_OPTIONS}


def refuse_decoding_among(options: Mapping[str, Any], owner: str) -> None:
    """Decoding has one typed place (``decoding=``): a decoding setting among ``owner``'s task
    options is refused, naming it, where a study's combined table was not split first."""
    stated = sorted(set(options) & set(DECODING_OPTIONS))
    if stated:
        raise HeldoutError(f"{owner} {', '.join(stated)} are decoding settings, not task options: pass them as "
                           f"decoding=Decoding({', '.join(f'{k}=...' for k in stated)})")


@dataclass(frozen=True)
class Execution:
    """How a session runs candidates: ``limits`` for each sandboxed execution (None: the task's
    own defaults) and ``jobs``, how many executions run at once."""

    limits: RunLimits | None = None
    jobs: int = 2

    def __post_init__(self) -> None:
        if type(self.jobs) is not int or self.jobs < 1:
            raise HeldoutError(f"jobs is how many executions run at once, an int >= 1; got {self.jobs!r}")


class MeteredWorker:
    """The worker as a task's ``RunContext`` offers it (e.g. Lockpicking's ``AI_COMPLETE``): each
    call goes through the session's client, its tokens are counted on the session's channel and it
    is appended to the ledger as a ``worker_call``. The metric call it belongs to was already
    counted by the session when the evaluation was admitted."""

    def __init__(self, client: ChatClient, usage: Usage, channel: str, ledger: Ledger | None,
                 temperature: float, max_tokens: int | None) -> None:
        self._client = client
        self._usage = usage
        self._channel = channel
        self._ledger = ledger
        self._temperature, self._max_tokens = temperature, max_tokens
        self.model = client.model

    def complete(self, messages: Sequence[Message]) -> Completion:
        request = ChatRequest(messages=tuple({"role": m.role, "content": m.content} for m in messages),
                              model=self._client.model, temperature=self._temperature,
                              max_tokens=self._max_tokens, channel=self._channel)
        response = self._client.complete_many([request])[0]
        self._usage.record(self._channel, response)
        if self._ledger is not None:
            self._ledger.append_entry("worker_call", {"channel": self._channel, "request_key": response.request_key,
                                                      "prompt_tokens": response.prompt_tokens,
                                                      "completion_tokens": response.completion_tokens,
                                                      "cached": response.cached})
        return Completion(text=response.text, prompt_tokens=response.prompt_tokens,
                          completion_tokens=response.completion_tokens, seconds=response.seconds,
                          cached=response.cached)


@dataclass(frozen=True)
class Arrivals:
    """What a caller of :meth:`Scorer.score` does while the verdicts come in: ``waiting`` wraps
    each wait for the next answer and its scoring (a judged task's calls to its judge), or for a
    batch of program executions, so a stop may interrupt them at once; ``scored(k, verdict)`` is
    called in the caller's thread, outside ``waiting`` (no stop lands in what it writes), as soon
    as the verdict of ``examples[k]`` is made (a session's evaluation records it then, while the
    other answers are in flight)."""

    waiting: Callable[[], ContextManager[Any]] = contextlib.nullcontext
    scored: Callable[[int, Verdict], None] | None = None


NO_ARRIVALS = Arrivals()


class InOrder:
    """``record(k, verdict)`` for each verdict of a scoring as soon as it and every one before it
    are in (answers arrive in any order; a ledger keeps the order asked for), fed by
    :attr:`Arrivals.scored`: an infrastructure failure waits for its second scoring, and
    :meth:`finish` (with :meth:`Scorer.score_retrying`'s verdicts) records what is left, in order,
    without the examples that failed twice (they get no entry)."""

    def __init__(self, count: int, record: Callable[[int, Verdict], None]) -> None:
        self._verdicts: list[Verdict | None] = [None] * count
        self._record = record
        self._next = 0

    def scored(self, k: int, verdict: Verdict) -> None:
        self._verdicts[k] = verdict
        pending = self._verdicts
        while self._next < len(pending) and pending[self._next] is not None \
                and not is_infrastructure_failure(pending[self._next]):
            self._record(self._next, pending[self._next])
            self._next += 1

    def finish(self, verdicts: list[Verdict]) -> None:
        for k in range(self._next, len(verdicts)):
            if not is_infrastructure_failure(verdicts[k]):
                self._record(k, verdicts[k])
        self._next = len(verdicts)


class Scorer:
    """Runs a candidate on examples: a worker call + ``score_text`` for prompt tasks, a sandboxed
    execution (``Benchmark.run``) for program tasks, each with a :class:`RunContext` built here.
    ``decoding`` goes to the models' requests, ``options``, the task options (canonical scoring), to
    the task's context; an evaluation may add a verifier variant's options on top. Without
    ``decoding``, ``options`` may hold both, as a study states them, and are split
    (:meth:`Decoding.split`). Never raises for a bad candidate."""

    def __init__(self, benchmark, worker: ChatClient | None = None, limits: RunLimits | None = None,
                 options: Mapping[str, Any] | None = None, jobs: int = 2, ledger: Ledger | None = None,
                 judge: ChatClient | None = None, decoding: Decoding | None = None) -> None:
        self.benchmark = benchmark
        self.worker = worker
        self.judge = judge  # a separate judge model, metered on the ``judge-*`` channels
        self.limits = limits or benchmark.default_limits
        if decoding is None:
            decoding, options = Decoding.split(options or {})
        self.decoding, self.options = decoding, dict(options or {})  # self.options: the task options
        self.jobs = max(1, jobs)
        self.ledger = ledger

    def context(self, channel: str, usage: Usage, extra: Mapping[str, Any] | None = None) -> RunContext:
        decoding = self.decoding
        worker = None if self.worker is None else MeteredWorker(
            self.worker, usage, channel, self.ledger, 0.0 if decoding.temperature is None else decoding.temperature,
            decoding.max_tokens)
        judge = None if self.judge is None else MeteredWorker(
            self.judge, usage, JUDGE_CHANNEL[channel], self.ledger, decoding.judge_temperature, decoding.judge_max_tokens)
        return RunContext(limits=self.limits, worker=worker, options={**self.options, **(extra or {})}, judge=judge)

    def score(self, candidate: Candidate, examples: Sequence[Example], channel: str,
              usage: Usage, extra_options: Mapping[str, Any] | None = None, replicate: int = 0,
              arrivals: Arrivals = NO_ARRIVALS) -> list[Verdict]:
        """The verdict of each example, in order (see :class:`Arrivals` for ``arrivals``)."""
        if not examples:
            return []
        context = self.context(channel, usage, extra_options)
        if self.benchmark.kind != "program":
            return self._score_prompt(candidate, examples, channel, usage, context, replicate, arrivals)

        def run_one(ex: Example) -> Verdict:
            try:
                return self.benchmark.run(candidate, ex, context)
            except Exception as exc:  # the benchmark's own rule is never to raise; belt and braces
                return Verdict.failure(ex.id, f"evaluator error: {type(exc).__name__}: {exc}", "evaluator_error")
        with arrivals.waiting(), ThreadPoolExecutor(max_workers=min(self.jobs, len(examples))) as pool:
            verdicts = list(pool.map(run_one, examples))
        if arrivals.scored is not None:
            for k, verdict in enumerate(verdicts):
                arrivals.scored(k, verdict)
        return verdicts

    def score_retrying(self, candidate: Candidate, examples: Sequence[Example], channel: str, usage: Usage,
                       extra_options: Mapping[str, Any] | None = None, replicate: int = 0,
                       arrivals: Arrivals = NO_ARRIVALS) -> list[Verdict]:
        """:meth:`score`, then every example whose verdict is an infrastructure failure scored once
        more (a dropped connection, a restarted endpoint or a sandbox that failed to start often
        succeeds the second time; the model client has already retried each request). What still
        fails is returned as it is: the caller decides (see :func:`infrastructure_failures`).
        ``arrivals.scored`` hears of an example again when it is scored again."""
        verdicts = self.score(candidate, examples, channel, usage, extra_options, replicate, arrivals)
        again = [i for i, v in enumerate(verdicts) if is_infrastructure_failure(v)]
        if again:
            scored = arrivals.scored
            renumbered = Arrivals(arrivals.waiting, None if scored is None else lambda j, v: scored(again[j], v))
            retried = self.score(candidate, [examples[i] for i in again], channel, usage, extra_options, replicate,
                                 renumbered)
            for i, verdict in zip(again, retried):
                verdicts[i] = verdict
        return verdicts

    def score_all(self, candidate: Candidate, examples: Sequence[Example], channel: str, usage: Usage,
                  what: str, extra_options: Mapping[str, Any] | None = None, replicate: int = 0) -> list[Verdict]:
        """Every example scored, or :class:`InfrastructureFailure` naming how many of ``what``
        could not be (never a verdict that scores a failure of the infrastructure as 0)."""
        verdicts = self.score_retrying(candidate, examples, channel, usage, extra_options, replicate)
        problem = infrastructure_failures(what, verdicts)
        if problem:
            raise InfrastructureFailure(problem)
        return verdicts

    def _score_prompt(self, candidate: Candidate, examples: Sequence[Example], channel: str,
                      usage: Usage, context: RunContext, replicate: int, arrivals: Arrivals) -> list[Verdict]:
        if self.worker is None:
            raise HeldoutError(f"{self.benchmark.name} is a prompt task: the session needs a worker model "
                               "(pass worker=ModelClient(...) or --worker-model/--base-url)")
        # the prompt format's setting decides chat or completion, stop sequences and default decoding
        # (published settings are sent as published); the run's own options win where they are set
        setting = getattr(self.benchmark, "prompt_setting", None)
        setting = setting(context.option("prompt_format") if context is not None else None) if setting else None
        stop = (("stop", list(setting.stop)),) if setting is not None and setting.stop else ()
        temperature = self.decoding.temperature
        if temperature is None:
            temperature = setting.temperature if setting is not None else 0.0
        max_tokens = self.decoding.max_tokens
        if max_tokens is None:
            max_tokens = setting.max_tokens if setting is not None else None
        sent = (setting or ZERO_SHOT_SETTING).request_fields  # a task that names no setting is sent as a chat
        requests = [ChatRequest(**sent(self.benchmark.render(candidate, ex, context)),
                                model=self.worker.model, temperature=temperature, max_tokens=max_tokens,
                                channel=channel, replicate=replicate, extra=stop)
                    for ex in examples]
        # each output is scored as it arrives, while the others are in flight, when the client can say
        complete_each = getattr(self.worker, "complete_each", None)
        with arrivals.waiting():
            answers = complete_each(requests) if callable(complete_each) else \
                enumerate(self.worker.complete_many(requests, return_exceptions=True))
        verdicts: list[Verdict | None] = [None] * len(examples)
        try:
            while True:
                with arrivals.waiting():  # the answer's scoring too: a judged task waits for its judge there
                    arrived = next(answers, None)
                    if arrived is None:
                        break
                    i, resp = arrived
                    verdicts[i] = self._verdict(examples[i], resp, channel, usage, context)
                if arrivals.scored is not None:
                    arrivals.scored(i, verdicts[i])
        finally:  # interrupted (a stop request) while scoring: the requests still in flight end now
            getattr(answers, "close", lambda: None)()
        return [v if v is not None else Verdict.failure(ex.id, "the worker returned no answer for it", "model_error")
                for ex, v in zip(examples, verdicts)]

    def _verdict(self, ex: Example, resp: Any, channel: str, usage: Usage, context: RunContext) -> Verdict:
        if isinstance(resp, BaseException):
            return Verdict.failure(ex.id, f"worker call failed: {resp}", model_failure_kind(resp))
        usage.record(channel, resp)
        verdict = self.benchmark.score_text(resp.text, ex, context)
        verdict.usage = {"prompt_tokens": resp.prompt_tokens, "completion_tokens": resp.completion_tokens,
                         "seconds": resp.seconds, "cached": float(resp.cached)}
        return verdict


def infrastructure_failures(what: str, verdicts: Sequence[Verdict]) -> str | None:
    """One line naming how many of ``verdicts`` are infrastructure failures, of which kinds, with
    the first error; None when there are none."""
    failed = [v for v in verdicts if is_infrastructure_failure(v)]
    if not failed:
        return None
    kinds = sorted({v.error_kind or "?" for v in failed})
    first = " ".join(str(failed[0].error).split())[:300]
    return (f"{what}: {len(failed)} of {len(verdicts)} example(s) not scored: the infrastructure failed, not the "
            f"candidate ({', '.join(kinds)}; first: {first})")
