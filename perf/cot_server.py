"""A loopback model server whose answers are as long as a real model's chain of thought.

The deterministic test backend answers in about ten words; a real worker reasons for several
hundred tokens before "So the answer is X.", and the cost of a metric call (bytes over the wire,
JSON parsing, answer extraction, ledger bytes) grows with that. This server wraps the deterministic
backend (:class:`heldout.models.backends.deterministic.DeterministicBackend`, so accuracies still
depend on the instruction) and puts a reproducible reasoning of ``--min-tokens`` .. ``--max-tokens``
whitespace tokens before its answer. Architect requests (rewrites) are answered as before: the
rewritten instruction must stay parseable.

    python perf/cot_server.py --latency 0.05 [--min-tokens 200] [--max-tokens 600]

prints ``... listening on URL`` once ready and serves until SIGTERM, in its own process (so the
client measured and the server do not share one interpreter lock).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]  # this checkout's heldout

from heldout.models.backends.deterministic import DeterministicBackend, count_tokens  # noqa: E402
from heldout.models.server import ChatCall, ChatServer, Completion, unit_interval  # noqa: E402

# the reasoning's sentences: ordinary words, digits and punctuation, as a model's working reads
_SENTENCES = (
    "First, I will restate what the question asks and which facts it gives me.",
    "The question lists several items, and each of them has to be checked in turn.",
    "Looking at the first item, it matches the condition described in the premise.",
    "The second item needs more care, since 3 of its 7 parts point the other way.",
    "Let me write the intermediate result down so that I do not lose track of it.",
    "Comparing this with the options, two of them can be ruled out immediately.",
    "Now I reconsider the remaining candidates against every constraint stated above.",
    "If the rule applies in order, the result after step 4 is the one I computed.",
    "Checking once more: nothing in the question contradicts this line of reasoning.",
    "There is one subtle point about the wording, which I address before answering.",
)


class ChainOfThoughtBackend(DeterministicBackend):
    """The deterministic backend with a reproducible chain of thought before each worker answer."""

    def __init__(self, min_tokens: int, max_tokens: int) -> None:
        super().__init__()
        self.min_tokens, self.max_tokens = min_tokens, max_tokens

    def reasoning(self, call: ChatCall) -> str:
        draw = unit_interval("cot", call.messages or call.prompt)
        want = self.min_tokens + int(draw * (self.max_tokens - self.min_tokens + 1))
        words: list[str] = []
        k = int(draw * 1000)
        while len(words) < want:
            words.extend(_SENTENCES[k % len(_SENTENCES)].split())
            k += 3
        return " ".join(words[:want])

    def complete(self, call: ChatCall, on_text: Callable[[str], None] | None = None) -> Completion:
        done = super().complete(call, None)
        text, finish = done.text, done.finish_reason
        if "So the answer is" in text:  # a worker answer, not an architect's rewrite
            text = f"{self.reasoning(call)}\n{text}"
            if call.max_tokens is not None and count_tokens(text) > call.max_tokens:
                text, finish = " ".join(text.split()[:call.max_tokens]), "length"
        if on_text is not None:
            on_text(text)
        return Completion(text, done.prompt_tokens, count_tokens(text), finish)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per answer, from its arrival")
    parser.add_argument("--min-tokens", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=600)
    args = parser.parse_args(argv)
    server = ChatServer(ChainOfThoughtBackend(args.min_tokens, args.max_tokens), latency=args.latency,
                        name="chain-of-thought")
    server.serve_until_signalled("heldout chain-of-thought server listening on {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
