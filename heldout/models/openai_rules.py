"""What a request to heldout's model servers may be: the OpenAI API's own rules, field by field.

Both servers (the loopback test server and ``heldout serve-model``, one :class:`ChatServer`
each) read a body with :func:`parse_call`; a body the OpenAI API would refuse is refused here
too, as a :class:`RequestRefused` naming the field (answered 400, an OpenAI-style error whose
``param`` is that field), before any backend sees it:

* ``model`` a non-empty string; ``messages`` a non-empty list of ``{role, content}`` with a
  known role and text content (chat), or ``prompt`` a string (completions), never both;
* ``max_tokens`` / ``max_completion_tokens`` null or a whole number from 1 to
  :data:`MAX_TOKENS_CEILING` (beyond any model's context; a backend's own cap still applies);
* ``temperature`` 0 to 2, ``top_p`` 0 to 1, ``presence_penalty`` / ``frequency_penalty`` -2 to
  2, ``logit_bias`` values -100 to 100, every number finite; ``seed`` a 64-bit integer;
* ``n`` 1 to 128 and ``best_of`` 1 to 20 (completions only), as OpenAI bounds them; these
  servers answer one choice per request, so a valid ``n`` or ``best_of`` above 1 is refused as
  not served rather than answered with fewer choices than asked;
* ``stream`` a boolean, ``stream_options`` an object given only with ``stream: true``;
  ``stop`` a string or at most :data:`MAX_STOP_SEQUENCES` non-empty strings; ``user`` a string;
  ``logprobs`` / ``echo`` asked for are refused as not served.

Fields these rules do not name (vendor extensions such as ``top_k``) reach the backend as
``ChatCall.extra`` unchanged. :class:`StopScanner` is the API's rule for ``stop``: the answer ends
before the first stop sequence, also when it is streamed."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

# Body fields the server interprets itself; every other field reaches the backend as ``extra``.
PROTOCOL_FIELDS = ("messages", "prompt", "model", "temperature", "max_tokens", "max_completion_tokens", "stop")
STREAM_FIELDS = ("stream", "stream_options")
MAX_STOP_SEQUENCES = 4  # as the OpenAI API allows
MAX_TOKENS_CEILING = 1 << 20  # 1,048,576: more than any model's context
MAX_CHOICES = 128  # OpenAI's bound on n
MAX_BEST_OF = 20  # OpenAI's bound on best_of
ROLES = ("system", "user", "assistant")  # what the backends render
OPENAI_ONLY_ROLES = ("developer", "tool", "function")  # OpenAI's, not served here
INT64 = 1 << 63


@dataclass(frozen=True)
class ChatCall:
    """One validated request. A chat (``/v1/chat/completions``) has ``messages``, a non-empty
    list of ``{role, content: str}``, and ``prompt`` None; a completion (``/v1/completions``) has
    ``prompt``, the exact text to continue (no chat template, no system message), and no
    messages. ``max_tokens`` is None or a positive int; ``extra`` holds every other body field
    except the streaming switches (so a streamed request and a plain one are the same call)."""

    messages: list[dict[str, Any]]
    model: str
    temperature: float = 0.0
    max_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    stop: tuple[str, ...] = ()  # the answer ends before the first of these (finish_reason "stop")
    prompt: str | None = None  # set exactly for a completion

    @property
    def is_completion(self) -> bool:
        return self.prompt is not None


class StopScanner:
    """Cuts generated text at the first of the request's stop sequences, as the OpenAI API does:
    the answer ends before the stop sequence, which is not part of it. Fed piece by piece, it
    holds back only the tail that could still be the start of a stop sequence, so a streamed
    answer never shows text the whole answer would not have."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = tuple(s for s in stop if s)
        self._keep = max((len(s) for s in self.stop), default=1) - 1
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The text that may be shown now; after a stop sequence, nothing more."""
        if self.stopped:
            return ""
        text = self._held + piece
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return text[:min(hits)]
        if not self.stop:
            return text
        cut = max(0, len(text) - self._keep)
        self._held = text[cut:]
        return text[:cut]

    def flush(self) -> str:
        """What is still held back when the text ended without a stop sequence."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


def apply_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` cut before its first stop sequence, and whether one was found."""
    scanner = StopScanner(stop)
    out = scanner.feed(text)
    return (out, True) if scanner.stopped else (out + scanner.flush(), False)


class RequestRefused(ValueError):
    """A body the OpenAI API would refuse; ``param`` names the field (None: the body itself)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _in_range(body: dict, name: str, low: float, high: float, *, whole: bool = False) -> Any:
    """``body[name]`` when absent/null (None) or a (whole) finite number in [low, high]."""
    value = body.get(name)
    if value is None:
        return None
    if not (_whole(value) if whole else _number(value)) or not low <= value <= high:
        kind = "a whole number" if whole else "a number"
        shown = repr(value) if not _whole(value) or abs(value) < 10 ** 30 else f"a {len(str(abs(value)))}-digit number"
        raise RequestRefused(f"{name} must be {kind} from {low:g} to {high:g}, got {shown}", name)
    return value


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise RequestRefused("messages must be a non-empty list of {role, content}", "messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise RequestRefused(f"messages[{i}] must be an object {{role, content}}", f"messages[{i}]")
        role = message.get("role")
        if role not in ROLES:
            why = "is not served here" if role in OPENAI_ONLY_ROLES else "is not a role"
            raise RequestRefused(f"messages[{i}].role {role!r} {why}: use one of {', '.join(ROLES)}",
                                 f"messages[{i}].role")
        if not isinstance(message.get("content"), str):
            raise RequestRefused(f"messages[{i}].content must be a string", f"messages[{i}].content")
        if "name" in message and not isinstance(message["name"], str):
            raise RequestRefused(f"messages[{i}].name must be a string", f"messages[{i}].name")
    return value


def _max_tokens(body: dict) -> int | None:
    given = {name: _in_range(body, name, 1, MAX_TOKENS_CEILING, whole=True)
             for name in ("max_tokens", "max_completion_tokens")}
    values = {v for v in given.values() if v is not None}
    if len(values) > 1:
        raise RequestRefused("max_tokens and max_completion_tokens disagree; give one", "max_completion_tokens")
    return values.pop() if values else None


def _one_choice(body: dict, completion: bool) -> None:
    n = _in_range(body, "n", 1, MAX_CHOICES, whole=True)
    if n is not None and n > 1:
        raise RequestRefused(f"n={n} is not served here: this server answers one choice per request", "n")
    if "best_of" in body and not completion:
        raise RequestRefused("best_of is a /v1/completions field, not a chat one", "best_of")
    best_of = _in_range(body, "best_of", 1, MAX_BEST_OF, whole=True)
    if best_of is not None and best_of > 1:
        raise RequestRefused(f"best_of={best_of} is not served here: this server answers one choice", "best_of")


def _sampling(body: dict, completion: bool) -> float:
    temperature = _in_range(body, "temperature", 0, 2) or 0.0
    _in_range(body, "top_p", 0, 1)
    for name in ("presence_penalty", "frequency_penalty"):
        _in_range(body, name, -2, 2)
    _in_range(body, "seed", -INT64, INT64 - 1, whole=True)
    bias = body.get("logit_bias")
    if bias is not None and not (isinstance(bias, dict) and all(_number(v) and -100 <= v <= 100 for v in bias.values())):
        raise RequestRefused("logit_bias must map token ids to numbers from -100 to 100", "logit_bias")
    logprobs = body.get("logprobs")
    if completion:
        if _in_range(body, "logprobs", 0, 5, whole=True):
            raise RequestRefused("logprobs are not served here", "logprobs")
        if body.get("echo") not in (None, False):
            raise RequestRefused("echo is not served here" if body.get("echo") is True else "echo must be a boolean",
                                 "echo")
    else:
        if logprobs not in (None, False):
            raise RequestRefused("logprobs are not served here" if logprobs is True else "logprobs must be a boolean",
                                 "logprobs")
        _in_range(body, "top_logprobs", 0, 20, whole=True)
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise RequestRefused("user must be a string", "user")
    return float(temperature)


def _streaming(body: dict) -> None:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestRefused(f"stream must be a boolean, got {stream!r}", "stream")
    options = body.get("stream_options")
    if options is not None:
        if stream is not True:
            raise RequestRefused("stream_options is only allowed with stream: true", "stream_options")
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise RequestRefused("stream_options must be an object {include_usage: boolean}", "stream_options")


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    stop = (stop,) if isinstance(stop, str) else stop if stop is not None else ()
    if not (isinstance(stop, list | tuple) and len(stop) <= MAX_STOP_SEQUENCES
            and all(isinstance(x, str) and x for x in stop)):
        raise RequestRefused(f"stop must be a non-empty string or a list of at most {MAX_STOP_SEQUENCES} of them",
                             "stop")
    return tuple(stop)


def parse_call(raw: bytes, *, completion: bool) -> tuple[ChatCall, dict[str, Any]]:
    """The call a body asks for (a completion's for ``/v1/completions``) and the body itself, or
    :class:`RequestRefused` for the first rule it breaks."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RequestRefused(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestRefused("the body must be a JSON object")
    if "messages" in body and "prompt" in body:
        raise RequestRefused("give messages (POST /v1/chat/completions) or a prompt (POST /v1/completions), not both")
    messages, prompt = [], None
    if completion:
        prompt = body.get("prompt")
        if "prompt" not in body:
            raise RequestRefused("prompt is required: the text to continue (chat messages go to /v1/chat/completions)",
                                 "prompt")
        if not isinstance(prompt, str):
            raise RequestRefused("prompt must be a string (lists of prompts or of token ids are not served)", "prompt")
    else:
        if "messages" not in body:
            raise RequestRefused("messages is required (a prompt string goes to /v1/completions)", "messages")
        messages = _messages(body["messages"])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestRefused("model must be a string" + (" naming a model" if model == "" else ""), "model")
    max_tokens = _max_tokens(body)
    _one_choice(body, completion)
    temperature = _sampling(body, completion)
    _streaming(body)
    stop = _stop(body)
    extra = {k: v for k, v in body.items() if k not in PROTOCOL_FIELDS + STREAM_FIELDS}
    return ChatCall(messages, model, temperature, max_tokens, extra, stop, prompt), body
