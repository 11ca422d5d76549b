"""A small OpenAI-compatible chat-completions server on 127.0.0.1, for tests and demos.

Answers are deterministic functions of the request body. A worker prompt gets an answer picked
from the options it offers ("(A) ...", "Options: - x - y", yes/no), or, for shapes the server can
solve (word sorting, boolean expressions, integer arithmetic), the right answer with a
probability set by the instruction (system message, else the first paragraph), so different
instructions reach different, reproducible accuracies. A request to rewrite or improve an
instruction (an architect call) gets a new instruction derived from the old one. Every reply ends
with "So the answer is X." and reports whitespace token counts as usage.

Fault injection (429, 500, stalls) is seeded and decided per (request body, how often that body
was seen), so the same test makes the same faults whatever order concurrent requests arrive in.

    with TestServer(latency=0.1, error_rate=0.0, rate_429=0.0, seed=0) as srv:
        client = ModelClient("test-model", base_url=srv.base_url)

    python -m heldout.models.testserver --port 8000 --latency 0.1
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import json
import operator
import re
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _unit(*parts: object) -> float:
    """A reproducible number in [0, 1) from the parts' text."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


# -- answers ---------------------------------------------------------------------------------------
_ARCHITECT = re.compile(r"\b(rewrite|improve|revise|propose|refine)\b.{0,120}\b(instruction|prompt)s?\b",
                        re.IGNORECASE | re.DOTALL)
_LETTER_OPTION = re.compile(r"^\s*\(([A-Z])\)\s*\S", re.MULTILINE)
_BULLETS_AFTER_OPTIONS = re.compile(r"Options:\s*\n((?:[ \t]*[-*][ \t]*.+\n?)+)", re.IGNORECASE)
_INLINE_OPTIONS = re.compile(r"Options:[ \t]*(\S[^\n]*)", re.IGNORECASE)
_YES_NO = re.compile(r"\byes\b[^\n]{0,40}\bno\b|^[^\n]*\b(?:is|are|was|were|do|does|did|can|could|will|"
                     r"would|should|has|have)\b[^\n]*\?[ \t]*$", re.IGNORECASE | re.MULTILINE)
_HOW_MANY = re.compile(r"\bhow many\b", re.IGNORECASE)
_WORD_LIST = re.compile(r"List:\s*([^\n]+)")
_BOOLEAN = re.compile(r"((?:\b(?:not|and|or|True|False)\b|[()]|[ \t])+)\bis\b")
_ARITHMETIC = re.compile(r"([-+*()\d \t]*\d[-+*()\d \t]*)=")
_STRATEGIES = (
    "Restate the question in your own words before answering.",
    "Work step by step and check each step.",
    "List the facts given, then derive the answer from them.",
    "Consider every option and rule out the wrong ones.",
    "Be concise: reason briefly, then answer.",
    "Double-check the final answer against the question.",
    "Identify what kind of problem this is first.",
    "Write intermediate results down explicitly.",
)
_ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def options_in(text: str) -> list[str]:
    """The answer options a prompt offers, in order ([] when it offers none)."""
    letters = _LETTER_OPTION.findall(text)
    if letters:
        return [f"({letter})" for letter in dict.fromkeys(letters)]
    bullets = _BULLETS_AFTER_OPTIONS.search(text)
    if bullets:
        return [line.strip().lstrip("-*").strip()
                for line in bullets.group(1).splitlines() if line.strip()]
    inline = _INLINE_OPTIONS.search(text)
    if inline:
        parts = [p.strip() for p in re.split(r",|\bor\b|/", inline.group(1)) if p.strip()]
        if len(parts) > 1:
            return parts
    if _HOW_MANY.search(text):
        return [str(n) for n in range(13)]
    if _YES_NO.search(text):
        return ["Yes", "No"]
    return []


def _eval_arithmetic(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _eval_arithmetic(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval_arithmetic(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
        return _ARITH_OPS[type(node.op)](_eval_arithmetic(node.left), _eval_arithmetic(node.right))
    raise ValueError("not integer arithmetic")


def _eval_boolean(expr: str) -> bool:
    # Only the words and brackets the pattern admits reach here; map them onto Python's grammar
    # through ast so nothing but boolean logic is ever evaluated.
    def walk(node: ast.AST) -> bool:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not walk(node.operand)
        if isinstance(node, ast.BoolOp):
            values = [walk(v) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        raise ValueError("not a boolean expression")
    return walk(ast.parse(expr.strip(), mode="eval"))


def solve(text: str) -> tuple[str, str] | None:
    """(right answer, a wrong one) for prompt shapes the server can solve, else None."""
    text = text.strip()
    match = _WORD_LIST.search(text)
    if match and "sort" in text.lower():
        words = match.group(1).split()
        right = " ".join(sorted(words))
        wrong = " ".join(sorted(words, reverse=True)) if len(set(words)) > 1 else right + " " + right
        return right, wrong
    for match in _BOOLEAN.finditer(text):
        if re.search(r"True|False", match.group(1)):
            try:
                value = _eval_boolean(match.group(1))
            except (SyntaxError, ValueError, RecursionError):
                continue
            return str(value), str(not value)
    for match in _ARITHMETIC.finditer(text):
        try:
            value = _eval_arithmetic(ast.parse(match.group(1).strip(), mode="eval"))
        except (SyntaxError, ValueError, RecursionError):
            continue
        return str(value), str(value + 1)
    return None


def instruction_of(messages: list[dict]) -> str:
    """What the server treats as the instruction: the system messages, else the first paragraph
    of the first user message."""
    system = "\n".join(m["content"] for m in messages if m.get("role") == "system")
    if system:
        return system
    first_user = next((m["content"] for m in messages if m.get("role") == "user"), "")
    return first_user.strip().split("\n\n", 1)[0]


def skill_of(instruction: str) -> float:
    """How often (0.2 .. 0.95) an instruction makes the server solve what it can solve."""
    return 0.2 + 0.75 * _unit("skill", instruction)


def _rewrite_instruction(request_text: str) -> str:
    fenced = re.findall(r"```(?:[a-z]*\n)?(.*?)```", request_text, re.DOTALL)
    old = fenced[0].strip() if fenced else ""
    # Keep the base instruction and replace any strategy an earlier rewrite appended, so
    # instructions stay short over many rounds.
    base = "\n".join(line for line in old.splitlines() if line.strip() not in _STRATEGIES).strip()
    pick = int(_unit("rewrite", request_text) * len(_STRATEGIES))
    base = base or "Answer the question."
    return f"{base}\n{_STRATEGIES[pick]}"


# -- requests shaped by optimizer libraries (GEPA, DSPy, OpenEvolve) -----------------------------
# Kept apart from the generic rules above: each branch recognises one library's request format and
# answers in the shape that library parses, so the adapters' tests drive the real libraries.
_GEPA_REFLECTION = re.compile(r"write a new instruction", re.IGNORECASE)
_DSPY_OUTPUTS = re.compile(r"Your output fields are:\s*\n(.*?)(?:\n\s*\n|All interactions)", re.DOTALL)
_DSPY_FIELD = re.compile(r"^\s*\d+\.\s*`(\w+)`", re.MULTILINE)
_DSPY_INPUT = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\n\[\[ ## |\Z)", re.DOTALL)
_CURRENT_PROGRAM = re.compile(r"# Current Program\s*\n```[a-z]*\n(.*?)```", re.DOTALL)
_FLOAT_LITERAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")


def _nudged_program(program: str, request_text: str) -> tuple[str, str] | None:
    """(line, the line with one float literal nudged by up to 2 %), chosen from the request's
    hash; None when the program holds no float literal."""
    lines = [line for line in program.splitlines() if _FLOAT_LITERAL.search(line)]
    if not lines:
        return None
    line = lines[int(_unit("oe-line", request_text) * len(lines))]
    literals = list(_FLOAT_LITERAL.finditer(line))
    match = literals[int(_unit("oe-literal", request_text) * len(literals))]
    value = float(match.group(0)) * (1.0 + 0.04 * (_unit("oe-step", request_text) - 0.5))
    return line, line[:match.start()] + f"{value:.6g}" + line[match.end():]


def library_reply(messages: list[dict]) -> str | None:
    """The reply to a GEPA reflection, a DSPy-structured request or an OpenEvolve program request;
    None for anything else."""
    system = "\n".join(m["content"] for m in messages if m.get("role") == "system")
    users = [m["content"] for m in messages if m.get("role") == "user"]
    last = users[-1] if users else ""
    program = _CURRENT_PROGRAM.search(last)
    if program:  # OpenEvolve: a SEARCH/REPLACE diff, or the whole program when asked to rewrite
        nudged = _nudged_program(program.group(1), last)
        if nudged is None:
            return "I cannot see a constant worth tuning."
        old, new = nudged
        if "SEARCH" in last:
            return f"Tuning one constant.\n\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n"
        return "Tuning one constant.\n```python\n" + program.group(1).replace(old, new, 1) + "```\n"
    outputs = _DSPY_OUTPUTS.search(system)
    if outputs:  # DSPy's chat adapter: every output field, then the completion marker
        given = dict(_DSPY_INPUT.findall(last))
        old = next((given[k] for k in ("basic_instruction", "current_instruction", "current_instruction_doc")
                    if k in given), "").strip()
        values = {name: (_rewrite_instruction(f"```\n{old}\n```\n{last}") if "instruction" in name
                         else f"A short {name.replace('_', ' ')}.")
                  for name in _DSPY_FIELD.findall(outputs.group(1))}
        if "JSON object" in last:  # DSPy's JSON adapter
            return json.dumps(values)
        parts = [f"[[ ## {name} ## ]]\n{value}" for name, value in values.items()]
        return "\n\n".join(parts + ["[[ ## completed ## ]]"])
    if _GEPA_REFLECTION.search(last):
        return "Here is the new instruction:\n```\n" + _rewrite_instruction(last) + "\n```"
    return None


def reply_for(messages: list[dict], temperature: float = 0.0, extra: Any = None) -> str:
    """The server's deterministic reply to a chat (see the module docstring)."""
    library = library_reply(messages)
    if library is not None:
        return library
    users = [m["content"] for m in messages if m.get("role") == "user"]
    last = users[-1] if users else ""
    if _ARCHITECT.search(last):
        return ("Here is an improved instruction:\n```\n" + _rewrite_instruction(last) + "\n```")
    whole = json.dumps([messages, float(temperature), extra or {}], sort_keys=True)
    draw = _unit("answer", whole)
    solved = solve(last)
    if solved is not None:
        right, wrong = solved
        answer = right if draw < skill_of(instruction_of(messages)) else wrong
    else:
        options = options_in(last)
        if options:
            answer = options[int(draw * len(options))]
        else:  # nothing to go on: echo a reproducible word of the question
            words = re.findall(r"[A-Za-z0-9]+", last) or ["unknown"]
            answer = words[int(draw * len(words))]
    steps = ("Let me read the question carefully.", "I will reason step by step.",
             "Checking the details once more.")
    return f"{steps[int(_unit('steps', whole) * len(steps))]} So the answer is {answer}."


def count_tokens(text: str) -> int:
    return len(text.split())


# -- server ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerStats:
    """What the server saw. ``calls`` counts every chat-completions request; ``ok`` those
    answered 200; ``max_in_flight`` the most requests it held at once."""

    calls: int = 0
    ok: int = 0
    http_429: int = 0
    http_500: int = 0
    stalls: int = 0
    bad_requests: int = 0
    unauthorized: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    max_in_flight: int = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so a client's connection pool is reused
    disable_nagle_algorithm = True  # else small header/body writes wait ~40 ms for delayed ACKs
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read srv.stats
        pass

    def _send(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (e.g. its timeout): nothing to answer

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [{"id": "heldout-test", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        owner = self.server.owner
        with owner._in_flight_slot():
            status, body, headers = owner._answer(raw, self.headers.get("Authorization"))
            self._send(status, body, headers)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    owner: "TestServer"


class TestServer:
    """The test double for a model endpoint. ``base_url`` ends in ``/v1``; the port is chosen by
    the OS unless given. Faults: ``rate_429`` and ``error_rate`` (500) answer at once;
    ``stall_rate`` holds the request ``stall_seconds`` before answering (to exercise client
    timeouts). ``latency`` delays every successful answer."""

    __test__ = False  # not a pytest test class

    def __init__(self, latency: float = 0.0, error_rate: float = 0.0, rate_429: float = 0.0,
                 seed: int = 0, *, stall_rate: float = 0.0, stall_seconds: float = 5.0,
                 retry_after: float | None = None, api_key: str | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        if host not in LOOPBACK_HOSTS:
            raise ValueError(f"the test server listens on loopback only, not {host!r}")
        for name, rate in (("error_rate", error_rate), ("rate_429", rate_429), ("stall_rate", stall_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {rate}")
        if error_rate + rate_429 + stall_rate > 1.0:
            raise ValueError("error_rate + rate_429 + stall_rate must not exceed 1")
        self.latency, self.error_rate, self.rate_429, self.seed = latency, error_rate, rate_429, seed
        self.stall_rate, self.stall_seconds, self.retry_after = stall_rate, stall_seconds, retry_after
        self.api_key = api_key
        self.host, self.port = host, port
        self._lock = threading.Lock()
        self._stats: dict[str, int] = asdict(ServerStats())
        self._in_flight = 0
        self._seen: dict[str, int] = {}
        self._stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "TestServer":
        if self._httpd is not None:
            return self
        self._httpd = _Server((self.host, self.port), _Handler)
        self._httpd.owner = self
        self.port = self._httpd.server_address[1]
        self._stopping.clear()
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"heldout-testserver-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._stopping.set()  # wakes stalled handlers
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> "TestServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def stats(self) -> ServerStats:
        with self._lock:
            return ServerStats(**self._stats)

    def reset_stats(self) -> None:
        """Zero the counters (the fault schedule keeps its memory of bodies already seen)."""
        with self._lock:
            self._stats = asdict(ServerStats())

    # -- request handling --------------------------------------------------------------------
    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._stats[name] += delta

    @contextlib.contextmanager
    def _in_flight_slot(self) -> Iterator[None]:
        with self._lock:
            self._in_flight += 1
            self._stats["calls"] += 1
            self._stats["max_in_flight"] = max(self._stats["max_in_flight"], self._in_flight)
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1

    def _fault(self, raw: bytes) -> str | None:
        body_hash = hashlib.sha256(raw).hexdigest()
        with self._lock:
            nth = self._seen.get(body_hash, 0)
            self._seen[body_hash] = nth + 1
        u = _unit("fault", self.seed, body_hash, nth)
        if u < self.rate_429:
            return "429"
        if u < self.rate_429 + self.error_rate:
            return "500"
        if u < self.rate_429 + self.error_rate + self.stall_rate:
            return "stall"
        return None

    def _answer(self, raw: bytes, authorization: str | None) -> tuple[int, dict, dict]:
        if self.api_key is not None and authorization != f"Bearer {self.api_key}":
            self._count(unauthorized=1)
            return 401, {"error": {"message": "invalid API key", "type": "invalid_request_error"}}, {}
        try:
            body = json.loads(raw.decode("utf-8"))
            messages = body["messages"]
            model = body["model"]
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
                raise ValueError("messages must be a non-empty list of {role, content}")
        except (ValueError, KeyError, TypeError) as exc:
            self._count(bad_requests=1)
            return 400, {"error": {"message": f"bad request: {exc}", "type": "invalid_request_error"}}, {}
        fault = self._fault(raw)
        if fault == "429":
            self._count(http_429=1)
            headers = {} if self.retry_after is None else {"Retry-After": f"{self.retry_after:g}"}
            return 429, {"error": {"message": "rate limited (injected)", "type": "rate_limit"}}, headers
        if fault == "500":
            self._count(http_500=1)
            return 500, {"error": {"message": "server error (injected)", "type": "server_error"}}, {}
        if fault == "stall":
            self._count(stalls=1)
            self._stopping.wait(self.stall_seconds)
        if self.latency > 0:
            time.sleep(self.latency)
        extra = {k: v for k, v in body.items() if k not in ("messages", "model", "temperature", "max_tokens")}
        text = reply_for(messages, float(body.get("temperature") or 0.0), extra)
        finish = "stop"
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, int) and max_tokens > 0 and count_tokens(text) > max_tokens:
            text, finish = " ".join(text.split()[:max_tokens]), "length"
        prompt_tokens = sum(count_tokens(m["content"]) for m in messages)
        completion_tokens = count_tokens(text)
        self._count(ok=1, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        return 200, {
            "id": "chatcmpl-" + hashlib.sha256(raw).hexdigest()[:24], "object": "chat.completion",
            "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }, {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m heldout.models.testserver",
                                     description="OpenAI-compatible test double on loopback.")
    parser.add_argument("--host", default="127.0.0.1", choices=LOOPBACK_HOSTS)
    parser.add_argument("--port", type=int, default=0, help="0: let the OS choose (printed)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per answer")
    parser.add_argument("--error-rate", type=float, default=0.0, help="share of injected 500s")
    parser.add_argument("--rate-429", type=float, default=0.0, help="share of injected 429s")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    parser.add_argument("--api-key", default=None, help="require this bearer token")
    args = parser.parse_args(argv)
    server = TestServer(latency=args.latency, error_rate=args.error_rate, rate_429=args.rate_429,
                        seed=args.seed, api_key=args.api_key, host=args.host, port=args.port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        print(f"heldout test server listening on {server.base_url}", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    stats = server.stats
    print(f"served {stats.ok} of {stats.calls} calls", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
