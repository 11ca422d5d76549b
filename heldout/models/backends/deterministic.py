"""The deterministic backend: answers are reproducible functions of the request body.

A worker prompt gets an answer picked from the options it offers ("(A) ...", "Options: - x - y",
yes/no), or, for shapes it can solve (word sorting, boolean expressions, integer arithmetic), the
right answer with a probability set by the instruction (system message, else the first
paragraph), so different instructions reach different, reproducible accuracies. Two instruction
effects exist for leakage tests: an *answer key* in the system message (lines ``Q: <question> A:
<answer>``) makes it give the keyed answer to a question containing a keyed question, and a
*stated rule* (``Rule: the code of a word is the word spelled backwards`` / ``... in capitals``)
makes it answer every "code of '<word>'" question by that rule; without them those questions get
the echo below, which is never the code. A request to rewrite or improve an instruction (an architect call) gets a new instruction derived from the old
one; requests in the shapes GEPA, DSPy and OpenEvolve send get answers those libraries parse
(:func:`library_reply`; a DSPy-structured system message over a user message that marks no
DSPy input field is a worker prompt). Every reply ends with "So the answer is X." and usage counts whitespace tokens; ``max_tokens``
keeps the first N of them (``finish_reason`` "length").

Two rules for verifier tests, checked before everything else and kept apart at the end of this
module:

* **Code blocks keyed by function name.** When the instruction (system message) holds fenced
  ````` ```python ````` blocks and the user message asks for a function by name (MBPP+'s "Name the
  function `NAME`."), the reply is the block that defines ``NAME`` (``def NAME(``), fenced, and
  nothing else; with no such block the usual rules apply. So a prompt candidate can carry code,
  and MBPP+ prompt optimisation can be tested without a code-writing model.
* **Judge verdicts.** A request whose system message carries the judge marker line
  (:data:`JUDGE_MARKER`, written by :mod:`heldout.benchmarks.judge`) is answered with the strict
  JSON verdict that module parses: ``{"scores": {<dimension>: {"score": <int>, "reason": ...}}}``
  for every dimension listed as ``- <name>: <description>`` under "Dimensions:", on the scale
  "Scale: 0 to <max>" given. A dimension scores the maximum when the reference answer (the block
  after "Reference answer:") occurs in the answer under judgement (the block after "Answer to
  judge:", both compared as lower-cased words), else a reproducible value below it. An answer
  containing :data:`JUDGE_MALFORMED_TRIGGER` gets a reply that is not JSON (the malformed-reply
  test; also what a prompt injection against a judge can cause).
"""

from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any, Callable

from heldout.models.server import ChatCall, Completion, apply_stop, unit_interval as _unit

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
_KEY_ENTRY = re.compile(r"^[ \t]*Q:[ \t]*(.+?)[ \t]*(?:\n[ \t]*)?A:[ \t]*(.+?)[ \t]*$", re.MULTILINE)
_CODE_QUESTION = re.compile(r"\bcode of '([^'\n]+)'")
_CODE_RULES = {"spelled backwards": lambda w: w[::-1], "in capitals": str.upper}
_CODE_RULE = re.compile(r"\bRule: the code of a word is the word (" + "|".join(_CODE_RULES) + ")")
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


def _squash(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def keyed_answer(system: str, question: str) -> str | None:
    """The answer an answer key in ``system`` gives for ``question`` (None when no key entry's
    question occurs in it). Keys are read from system messages only, so a few-shot user prompt's
    "Q: ... A: ..." demonstrations never act as a key."""
    asked = _squash(question)
    for key_question, answer in _KEY_ENTRY.findall(system):
        if _squash(key_question) and _squash(key_question) in asked:
            return answer
    return None


def ruled_answer(instruction: str, question: str) -> str | None:
    """The code of the quoted word when the instruction states a code rule, else None."""
    rule, word = _CODE_RULE.search(instruction), _CODE_QUESTION.search(question)
    return _CODE_RULES[rule.group(1)](word.group(1)) if rule and word else None


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
    given = dict(_DSPY_INPUT.findall(last))
    # DSPy's chat adapter: every output field, then the completion marker. Only DSPy's own
    # requests mark their inputs; a task's prompt under a DSPy-rendered system message is a worker call
    if outputs and given:
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
    system = "\n".join(m["content"] for m in messages if m.get("role") == "system")
    special = judge_reply(system, last) or keyed_code_reply(system, last)
    if special is not None:
        return special
    if _ARCHITECT.search(last):
        return ("Here is an improved instruction:\n```\n" + _rewrite_instruction(last) + "\n```")
    whole = json.dumps([messages, float(temperature), extra or {}], sort_keys=True)
    draw = _unit("answer", whole)
    told = keyed_answer(system, last) or ruled_answer(instruction_of(messages), last)
    solved = solve(last)
    if told is not None:
        answer = told
    elif solved is not None:
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


# -- rules for verifier tests (see the module docstring) ------------------------------------------
JUDGE_MARKER = "Protocol: heldout-judge/1"
JUDGE_MALFORMED_TRIGGER = "<<judge: reply malformed>>"
_PYTHON_BLOCK = re.compile(r"```python[ \t]*\n(.*?)```", re.DOTALL)
_ASKED_FUNCTION = re.compile(r"Name the function `([A-Za-z_][A-Za-z0-9_]*)`")
_JUDGE_DIMENSION = re.compile(r"^- ([A-Za-z_][A-Za-z0-9_]*): ", re.MULTILINE)
_JUDGE_SCALE = re.compile(r"Scale: 0 to (\d+)")


def keyed_code_reply(instruction: str, question: str) -> str | None:
    """The instruction's ```python block defining the function the question asks for, fenced."""
    asked = _ASKED_FUNCTION.search(question)
    if not asked:
        return None
    for block in _PYTHON_BLOCK.findall(instruction):
        if re.search(rf"^def {re.escape(asked.group(1))}\(", block, re.MULTILINE):
            return f"```python\n{block}```"
    return None


def _section(text: str, title: str) -> str:
    """The text after a ``title`` line up to the next blank-line-separated ``Xxx:`` heading."""
    match = re.search(rf"^{re.escape(title)}\n(.*?)(?=\n\n[A-Z][A-Za-z ]+:\n|\Z)", text, re.DOTALL | re.MULTILINE)
    return match.group(1).strip() if match else ""


def judge_reply(system: str, request: str) -> str | None:
    """The judge verdict for a judge request (None for any other request)."""
    if JUDGE_MARKER not in system:
        return None
    answer = _section(request, "Answer to judge:")
    if JUDGE_MALFORMED_TRIGGER in answer:
        return "I think this answer is quite good overall, maybe a 4."
    scale = _JUDGE_SCALE.search(system)
    top = int(scale.group(1)) if scale else 5
    reference = _squash(_section(request, "Reference answer:"))
    found = bool(reference) and f" {reference} " in f" {_squash(answer)} "
    scores = {}
    for name in dict.fromkeys(_JUDGE_DIMENSION.findall(system)):
        if found:
            scores[name] = {"score": top, "reason": "the answer states the reference answer"}
        else:
            points = int(_unit("judge", name, answer) * top)  # 0 .. top-1
            scores[name] = {"score": points, "reason": "the answer does not state the reference answer"}
    return json.dumps({"scores": scores})


def count_tokens(text: str) -> int:
    return len(text.split())


class DeterministicBackend:
    """The test double's model: :func:`reply_for` with whitespace tokens (a completion's prompt is
    read as one user message). Answers name the model the request asked for; ``/v1/models``
    lists ``heldout-test``. ``run_on``, when given, is written after every reply, as a base model
    runs on into a question of its own; the request's stop sequences then end the answer where
    they fall in the whole text, as they would a real model's."""

    model_id = "heldout-test"

    def __init__(self, run_on: str = "") -> None:
        self.run_on = run_on

    def reported_model(self, requested: str) -> str:
        return requested

    def complete(self, call: ChatCall, on_text: Callable[[str], None] | None = None) -> Completion:
        # a completion's prompt is answered as a chat whose one user message is that prompt
        messages = [{"role": "user", "content": call.prompt}] if call.is_completion else call.messages
        text, _ = apply_stop(reply_for(messages, call.temperature, call.extra) + self.run_on, call.stop)
        finish = "stop"
        if call.max_tokens is not None and count_tokens(text) > call.max_tokens:
            text, finish = " ".join(text.split()[:call.max_tokens]), "length"
        if on_text is not None:
            on_text(text)
        prompt_tokens = sum(count_tokens(m["content"]) for m in messages)
        return Completion(text, prompt_tokens, count_tokens(text), finish)
