"""The vocabulary every model module shares: requests, responses, errors, usage per channel.

A request (:class:`ChatRequest`) is a chat or a completion; its cache key is the rule for when two
requests are one. The client (:mod:`.client`), the response cache (:mod:`.cache`) and record/
replay (:mod:`.recording`) all speak these types, and none of them imports another for them.
:class:`ChatClient` is what a session asks of each of its models."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from heldout.contracts import HeldoutError, canonical_json, sha256_text

OPTIMISATION, DEPLOYMENT, ARCHITECT = "worker-optimisation", "worker-deployment", "architect"
JUDGE_CHANNEL = {OPTIMISATION: "judge-optimisation", DEPLOYMENT: "judge-deployment"}  # a judge's, per phase
CHANNELS = (OPTIMISATION, DEPLOYMENT, ARCHITECT, *JUDGE_CHANNEL.values())
"""Where a request's tokens are booked: worker calls made while optimising, worker calls made
when the harness scores the final candidate, the optimizer's architect model, and a separate
model judge's calls in the same two phases."""

ROLES = ("system", "user", "assistant")

# Request fields a caller may not smuggle in through ``extra`` (they are part of the key already).
_RESERVED_PARAMS = {"model", "messages", "prompt", "temperature", "max_tokens", "stream", "n"}


class ModelError(HeldoutError):
    """A model request that could not be answered. ``kind`` names the class of failure:
    ``config``, ``http_status``, ``timeout``, ``connection``, ``bad_response``, ``replay_miss``."""

    def __init__(self, message: str, *, kind: str, request_key: str | None = None,
                 status: int | None = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.request_key = request_key
        self.status = status
        self.attempts = attempts


class BatchError(ModelError):
    """Some requests of a :meth:`ModelClient.complete_many` batch failed after retries.

    Nothing is lost: ``results`` holds, in input order, a :class:`ChatResponse` for every request
    that succeeded (already cached and recorded) and the :class:`ModelError` of every one that
    did not."""

    def __init__(self, results: list["ChatResponse | ModelError"]) -> None:
        self.results = results
        failed = [(i, r) for i, r in enumerate(results) if isinstance(r, ModelError)]
        shown = "; ".join(f"request {i}: {err}" for i, err in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        super().__init__(
            f"{len(failed)} of {len(results)} model requests failed ({shown}{more}); the "
            f"{len(results) - len(failed)} that succeeded are in .results",
            kind=failed[0][1].kind if failed else "http_status")
        self.failures = dict(failed)


#: statuses by which an endpoint refuses the request itself (a prompt longer than the context, a
#: body too large): the candidate's prompt caused them, so they score 0 like any other bad output
PROMPT_REFUSED_STATUSES = frozenset({400, 413, 422})


def model_failure_kind(exc: BaseException) -> str:
    """The verdict ``error_kind`` of a model call that raised, the one rule for every caller (the
    scorer, a task calling its worker or judge in ``run``, the view; see
    :data:`heldout.contracts.INFRASTRUCTURE_ERROR_KINDS`): ``model_refused`` when the endpoint
    refused the candidate's request as invalid, ``model_error`` when the endpoint failed (the
    infrastructure's), ``evaluator_error`` for anything else (the harness's own bug)."""
    if isinstance(exc, BatchError):  # one request through a batch call: whose failures they were
        kinds = {model_failure_kind(failure) for failure in exc.failures.values()}
        return "model_refused" if kinds == {"model_refused"} else "model_error"
    if isinstance(exc, ModelError):
        if exc.kind == "http_status" and exc.status in PROMPT_REFUSED_STATUSES:
            return "model_refused"
        return "model_error"
    return "evaluator_error"


def _normalise_messages(messages: Any) -> tuple[dict[str, str], ...]:
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise ValueError("ChatRequest.messages must be a sequence of {'role', 'content'} messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):  # heldout.benchmarks.base.Message and the like
            msg = {"role": getattr(msg, "role", None), "content": getattr(msg, "content", None)}
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES:
            raise ValueError(f"message {i}: role must be one of {ROLES}, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"message {i}: content must be a str, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    if not out:
        raise ValueError("ChatRequest.messages is empty")
    return tuple(out)


def _normalise_extra(extra: Any) -> tuple[tuple[str, Any], ...]:
    pairs = list(extra.items()) if isinstance(extra, Mapping) else [tuple(p) for p in extra]
    for pair in pairs:
        if len(pair) != 2 or not isinstance(pair[0], str):
            raise ValueError(f"ChatRequest.extra must hold (name, value) pairs, got {pair!r}")
        if pair[0] in _RESERVED_PARAMS:
            raise ValueError(f"ChatRequest.extra may not set {pair[0]!r}: it is a field of its own")
        canonical_json(pair[1])  # must be JSON, or the cache key would not be stable
    names = [p[0] for p in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"ChatRequest.extra names a parameter twice: {sorted(names)}")
    return tuple(sorted(pairs))


@dataclass(frozen=True)
class ChatRequest:
    """One model request: a chat (``messages``, sent to ``/chat/completions``) or a completion
    (``prompt``, the exact text to continue, sent to ``/completions``); exactly one of the two.
    Rule: two requests share a cache entry exactly when model, decoding parameters, messages or
    prompt, and replicate index agree; ``channel`` only says where the tokens are booked, so it
    is not part of the key. A chat's key is what it was before completions existed, so caches
    and recordings stay valid. Messages are copied on construction."""

    messages: tuple[dict, ...] = ()  # [{"role": "system"|"user"|"assistant", "content": str}]
    model: str = ""
    temperature: float = 0.0
    max_tokens: int | None = None
    replicate: int = 0  # distinct samples of the same request stay distinct in the cache
    channel: str = "worker-optimisation"
    extra: tuple = ()  # other decoding params, sorted (name, value) pairs
    prompt: str | None = None  # a completion's text; None for a chat

    def __post_init__(self) -> None:
        # Frozen: normalise once, here, so equal requests are equal field by field.
        if self.prompt is None:
            object.__setattr__(self, "messages", _normalise_messages(self.messages))
        elif not isinstance(self.prompt, str):
            raise ValueError(f"ChatRequest.prompt must be a str, got {type(self.prompt).__name__}")
        elif self.messages:
            raise ValueError("a ChatRequest has messages (a chat) or a prompt (a completion), not both")
        else:
            object.__setattr__(self, "messages", ())
        object.__setattr__(self, "extra", _normalise_extra(self.extra))
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("ChatRequest.model must be a non-empty model name")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"ChatRequest.temperature must be in [0, 2], got {self.temperature!r}")
        object.__setattr__(self, "temperature", float(self.temperature))  # 0 and 0.0: one key
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise ValueError(f"ChatRequest.max_tokens must be a positive int or None, got {self.max_tokens!r}")
        if not isinstance(self.replicate, int) or isinstance(self.replicate, bool) or self.replicate < 0:
            raise ValueError(f"ChatRequest.replicate must be an int >= 0, got {self.replicate!r}")
        if self.channel not in CHANNELS:
            raise ValueError(f"ChatRequest.channel must be one of {CHANNELS}, got {self.channel!r}")

    def __hash__(self) -> int:  # messages are dicts, so the generated hash would fail
        return hash((self.cache_key(), self.channel))

    @property
    def is_completion(self) -> bool:
        return self.prompt is not None

    @property
    def endpoint(self) -> str:
        """The path under the base URL this request is sent to."""
        return "completions" if self.is_completion else "chat/completions"

    @property
    def last_text(self) -> str:
        """The prompt, or the last message's content (what error messages quote)."""
        return self.prompt if self.prompt is not None else self.messages[-1]["content"]

    def _sent(self) -> dict[str, Any]:
        return {"prompt": self.prompt} if self.is_completion else {"messages": list(self.messages)}

    def cache_key(self) -> str:
        """sha256 over model, decoding parameters, messages or prompt, and replicate index."""
        return sha256_text(canonical_json({
            "model": self.model, "temperature": self.temperature, "max_tokens": self.max_tokens,
            "extra": [list(p) for p in self.extra], **self._sent(), "replicate": self.replicate,
        }))

    def payload(self) -> dict[str, Any]:
        """The JSON body sent to :attr:`endpoint` (the replicate index stays local)."""
        body: dict[str, Any] = {"model": self.model, **self._sent(), "temperature": self.temperature}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(dict(self.extra))
        return body

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["messages"], data["extra"] = list(self.messages), [list(p) for p in self.extra]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ChatRequest":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass
class ChatResponse:
    """The answer to one request. ``cached`` is True when no endpoint call was made for it
    (``source`` says whether a cache or a replay served it); token counts are those the endpoint
    reported when the text was first produced."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool
    seconds: float
    request_key: str
    source: str = "endpoint"  # "endpoint" | "cache" | "replay"
    retries: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class ChannelUsage:
    """Usage of one channel. Rule: ``prompt_tokens``/``completion_tokens`` count each successful
    endpoint call exactly once; responses served without an endpoint call add to the
    ``served_*`` counters instead; failed attempts that were retried count in ``retries`` only."""

    requests: int = 0          # requests answered (any source)
    endpoint_calls: int = 0    # successful endpoint calls (billed)
    cache_hits: int = 0
    replay_hits: int = 0
    http_attempts: int = 0     # every HTTP request sent, including failed ones
    retries: int = 0           # failed attempts that were followed by another attempt
    failures: int = 0          # requests that still failed after retries
    prompt_tokens: int = 0
    completion_tokens: int = 0
    served_prompt_tokens: int = 0      # tokens of responses served from cache or replay
    served_completion_tokens: int = 0
    seconds: float = 0.0       # wall time spent on endpoint calls (overlapping calls add up)

    @property
    def tokens(self) -> int:
        """Billed tokens: what the endpoint charged for."""
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: "ChannelUsage") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": self.tokens}


class UsageMeter:
    """Tokens and calls per channel; safe to update from several threads. The one counter of model
    usage: a client meters every request it answers here, and a session meters its worker and
    architect calls in one too (``heldout.evaluators.policy.Usage``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, ChannelUsage] = {}

    def add(self, channel: str, **deltas: float) -> None:
        """Add ``deltas`` (ChannelUsage field -> amount) to one channel."""
        with self._lock:
            usage = self._channels.setdefault(channel, ChannelUsage())
            for name, delta in deltas.items():
                setattr(usage, name, getattr(usage, name) + delta)

    def record(self, channel: str, response: ChatResponse) -> None:
        """Count one answered request by its source (the :class:`ChannelUsage` rule): an endpoint
        call adds its tokens and seconds; a cache or replay hit adds to the ``served_*`` tokens."""
        if response.cached:
            self.add(channel, requests=1, **{"replay_hits" if response.source == "replay" else "cache_hits": 1},
                     served_prompt_tokens=response.prompt_tokens,
                     served_completion_tokens=response.completion_tokens)
        else:
            self.add(channel, requests=1, endpoint_calls=1, prompt_tokens=response.prompt_tokens,
                     completion_tokens=response.completion_tokens, seconds=response.seconds)

    def channels(self) -> dict[str, ChannelUsage]:
        """A copy of every used channel's usage, in the order the channels were first used."""
        with self._lock:
            return {name: ChannelUsage(**asdict(usage)) for name, usage in self._channels.items()}

    def channel(self, name: str) -> ChannelUsage:
        """A copy of one channel's usage (zeros when it was never used)."""
        with self._lock:
            return ChannelUsage(**asdict(self._channels.get(name, ChannelUsage())))

    def total(self) -> ChannelUsage:
        out = ChannelUsage()
        with self._lock:
            for usage in self._channels.values():
                out.add(usage)
        return out

    def by_channel(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {name: usage.to_dict() for name, usage in sorted(self._channels.items())}


@runtime_checkable
class ChatClient(Protocol):
    """What a session asks of each of its models (worker, judge, architect): the ``model`` name
    its requests carry, and ``complete_many``, which answers requests in input order and, with
    ``return_exceptions=True``, returns each failure (a :class:`ModelError`) in its place.
    :class:`heldout.models.ModelClient` meets it over HTTP, :class:`heldout.models.workers.FunctionWorker`
    with a local function."""

    model: str

    def complete_many(self, requests: Sequence[ChatRequest], *,
                      return_exceptions: bool = False) -> list[ChatResponse | ModelError]: ...


def check_chat_client(client: object, role: str) -> None:
    """Refuse, as one configuration error naming what is missing, a model that is not a
    :class:`ChatClient` (checked when a session is made: a model that cannot answer is the
    harness's configuration, never the optimizer's failure)."""
    model = getattr(client, "model", None)
    missing = [] if isinstance(model, str) and model else ["a `model` name (a non-empty str)"]
    if not callable(getattr(client, "complete_many", None)):
        missing.append("a `complete_many(requests, *, return_exceptions=False)` method")
    if missing:
        raise ModelError(f"the {role} model ({type(client).__name__}) lacks {' and '.join(missing)}: a session's "
                         "models are chat clients (heldout.models.ChatClient), such as ModelClient or "
                         "FunctionWorker", kind="config")
