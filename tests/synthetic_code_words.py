"""A synthetic prompt task with planted families, for the split and leakage tests.

``synthetic/code_words``: 24 families of 6 questions "Family fNN: what is the code of '<word>'?";
the code of a word is the word spelled backwards. The loopback test server answers such a
question right only when the prompt holds an answer key entry for it or states the rule, so a
memorising candidate and a rule-following candidate are told apart by construction."""

from __future__ import annotations

import hashlib
from typing import Any

from heldout.benchmarks import answers
from heldout.benchmarks.prompt_task import PromptBenchmark, mode_verdict
from heldout.benchmarks.registry import register
from heldout.contracts import Example, Source, Verdict

FAMILIES = 24
PER_FAMILY = 6
RULE = "Rule: the code of a word is the word spelled backwards."
_SYLLABLES = ("ka", "lo", "mi", "nu", "pe", "ra", "so", "ti", "vu", "we", "xo", "zi", "bo", "de", "fu", "ge")


def word_for(family: int, item: int) -> str:
    digest = hashlib.sha256(f"{family}|{item}".encode()).digest()
    word = "".join(_SYLLABLES[b % len(_SYLLABLES)] for b in digest[:4]) + "n"  # ends in n: never a palindrome
    return word


class CodeWords(PromptBenchmark):
    name = "synthetic/code_words"
    family = "synthetic"
    metric = "exact match"
    version = "1"
    description = "synthetic code-word questions in planted families (tests only)"
    source = Source(embedded=True)
    answer_format = "Finish with: So the answer is <short answer>."

    def load_raw(self, data_dir: str | None) -> list[Example]:
        out = []
        for f in range(FAMILIES):
            for k in range(PER_FAMILY):
                word = word_for(f, k)
                out.append(Example(id=f"f{f:02d}-{k}", input={"question": f"Family f{f:02d}: what is the code of '{word}'?"},
                                   target=word[::-1], group=f"f{f:02d}"))
        return out

    def format_input(self, example: Example) -> str:
        return f"Question: {example.input['question']}"

    def score_text(self, text: str, example: Example) -> Verdict:
        return mode_verdict(example, answers.score_span(text or "", example.target), text=text)


TASK = register(CodeWords())


def key_line(example: dict[str, Any]) -> str:
    """One answer-key entry as a memorising optimizer would paste it."""
    return f"Q: {example['input']['question']} A: {example['target']}"
