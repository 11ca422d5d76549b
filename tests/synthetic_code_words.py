"""A synthetic prompt task with planted families, for the split and leakage tests, frozen as a
user JSONL task exactly as a user would (``heldout data freeze --jsonl``).

24 families of 6 questions "Family fNN: what is the code of '<word>'?"; the code of a word is the
word spelled backwards. The loopback test server answers such a question right only when the
prompt holds an answer-key entry for it or states the rule, so a memorising candidate and a
rule-following candidate are told apart by construction."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from heldout import cli

FAMILIES = 24
PER_FAMILY = 6
RULE = "Rule: the code of a word is the word spelled backwards."
_SYLLABLES = ("ka", "lo", "mi", "nu", "pe", "ra", "so", "ti", "vu", "we", "xo", "zi", "bo", "de", "fu", "ge")


def word_for(family: int, item: int) -> str:
    digest = hashlib.sha256(f"{family}|{item}".encode()).digest()
    return "".join(_SYLLABLES[b % len(_SYLLABLES)] for b in digest[:4]) + "n"  # ends in n: never a palindrome


def rows() -> list[dict[str, Any]]:
    return [{"id": f"f{f:02d}-{k}", "input": f"Family f{f:02d}: what is the code of '{word_for(f, k)}'?",
             "target": word_for(f, k)[::-1], "group": f"f{f:02d}"}
            for f in range(FAMILIES) for k in range(PER_FAMILY)]


def freeze_task(name: str, root: Path) -> str:
    """Write the JSONL and freeze it as user task ``name`` under manifest root ``root``."""
    source = root.parent / f"{name.replace('/', '_')}.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    code = cli.main(["data", "freeze", "--jsonl", str(source), "--task", name, "--answer-format", "span",
                     "--profile", "default", "--out", str(root)])
    assert code == 0
    return name


def key_line(example: dict[str, Any]) -> str:
    """One answer-key entry as a memorising optimizer would paste it."""
    return f"Q: {example['input']['question']} A: {example['target']}"
