"""The ``published`` mode: each family's reference rule, reproduced exactly (no folding, no
run-on cut, no hedge or negation rule: the references have none). Every rule runs in time linear
in the output's length.

* BBH (Suzgun et al. 2022; the rule that reproduces the published code-davinci-002 numbers from
  the outputs shipped with BBH): the text after the last ``the answer is`` (case-sensitive),
  stripped, minus one trailing period, equals the target string. The answer must start on the
  cue's own line, after a space: lm-evaluation-harness's ``bbh_cot_fewshot`` filter
  (``lm_eval/tasks/bbh/cot_fewshot/_cot_fewshot_template_yaml``, a look-behind on
  ``the answer is`` plus a space, then a capture that does not cross a line break) finds no
  answer in ``the answer is`` followed by a line break, so neither does heldout.
* MMLU-Pro (TIGER-AI-Lab/MMLU-Pro ``evaluate_from_local.py`` at commit 2a7ec7e4, the script
  whose prompt heldout's ``cot_5shot`` sends byte for byte, so prompt and extraction follow one
  reference; ``evaluate_from_api.py``'s ``single_request`` also deletes every ``**`` from a chat
  model's response first, which the local script does not: on ``Answer: **B**`` followed by a
  stray ``A`` the API script reads B and the local script, and heldout, A): three stages, the
  first that matches wins: the *first* ``answer is \\(?([A-J])\\)?`` (case-sensitive); else
  the ``[aA]nswer:\\s*([A-J])`` that the script's ``.*[aA]nswer:\\s*([A-J])`` finds (the last one
  that starts on the first line holding one); else the last standalone capital ``A``..``J``
  anywhere (the script's ``\\b[A-J]\\b(?!.*\\b[A-J]\\b)`` under DOTALL). The script's own regexes
  are quadratic on a long line (seconds per 10k-character output); :func:`mmlu_pro_answer` finds
  the same matches in one pass each. The script then credits a *random* guess when all three
  fail; heldout scores that 0 (deterministic), so on outputs with no letter at all heldout's
  published accuracy is below the script's by (miss rate) / (option count).
* GSM-Hard (reasoning-machines/pal): PAL's comparison, ``abs(answer - target) < 1e-3`` (strictly
  less; ``scripts/gsm_eval.py`` on a program's return value, ``check_corr`` on a text answer):
  :func:`pal_match`. The headline applies it to the number the final answer cue introduces
  (:func:`heldout.benchmarks.extraction.score_number`). PAL's text rule is kept as its own
  dimension (``pal_text``): ``scripts/gsm_zero_shot.py``'s ``evaluate_text_prompt`` splits the
  stripped output at ``The answer is `` (case-sensitive, with its space) and takes the last
  piece, stripped; it is right when it equals the target's string, or when Python's ``float`` of
  it is within ``1e-3`` of the target (``float`` failing scores 0): ``So the answer is 72`` and
  ``The answer is 1,234.`` score 0 there.
"""

from __future__ import annotations

import re
from typing import Any

PAL_ABS_TOL = 1e-3

# ---------------------------------------------------------------------------------------------
# BBH
# ---------------------------------------------------------------------------------------------

_BBH_CUE = "the answer is"


def bbh_answer(text: str) -> str | None:
    """What the BBH rule compares with the target (see the module doc); None when there is no
    ``the answer is``, or when the last one is not followed by a space and an answer on its line."""
    if _BBH_CUE not in text:
        return None
    tail = text.rsplit(_BBH_CUE, 1)[1]
    if not tail.startswith(" ") or not tail.split("\n", 1)[0].strip():
        return None
    answer = tail.strip()
    return answer[:-1] if answer.endswith(".") else answer


# ---------------------------------------------------------------------------------------------
# MMLU-Pro
# ---------------------------------------------------------------------------------------------

_MMLU_ANSWER_IS = re.compile(r"answer is \(?([A-J])\)?")
_MMLU_ANSWER_COLON = re.compile(r"(?=[aA]nswer:\s*([A-J]))")  # zero-width: every start, overlapping ones too
_MMLU_LONE_LETTER = re.compile(r"\b[A-J]\b")


def mmlu_pro_answer(text: str) -> str | None:
    """The official three-stage MMLU-Pro extractor as ``evaluate_from_local.py`` runs it (no ``**``
    deletion, no random guess; see the module doc). Linear time."""
    first = _MMLU_ANSWER_IS.search(text)
    if first:
        return first.group(1)
    return mmlu_pro_answer_colon(text) or mmlu_pro_last_letter(text)


def mmlu_pro_answer_colon(text: str) -> str | None:
    """Stage 2: the letter of the last ``[aA]nswer:\\s*[A-J]`` starting on the first line that has
    one. That is what ``re.search(r".*[aA]nswer:\\s*([A-J])", text)`` returns: the search succeeds
    at the first line holding a start (``.`` stops at ``\\n``) and the greedy ``.*`` backs off to
    the last start on that line (``\\s*`` may run past the line's end to reach the letter)."""
    letter, line_end = None, -1
    for m in _MMLU_ANSWER_COLON.finditer(text):
        if letter is None:
            line_end = text.find("\n", m.start())
        elif 0 <= line_end < m.start():
            break
        letter = m.group(1)
    return letter


def mmlu_pro_last_letter(text: str) -> str | None:
    """Stage 3: the last standalone ``A``..``J`` (``\\b`` on both sides), which is what the
    script's search for a letter with no standalone letter after it returns."""
    last = None
    for last in _MMLU_LONE_LETTER.finditer(text):
        pass
    return last.group(0) if last else None


# ---------------------------------------------------------------------------------------------
# GSM-Hard
# ---------------------------------------------------------------------------------------------

PAL_TEXT_CUE = "The answer is "


def pal_text_answer(text: str) -> str:
    """PAL's text answer: the last piece of the stripped output split at ``The answer is ``,
    stripped (the whole stripped output when it has no cue)."""
    return text.strip().split(PAL_TEXT_CUE)[-1].strip()


def pal_text_value(answer: str) -> float | None:
    """Python's ``float`` of PAL's text answer, or None where ``float`` refuses it."""
    try:
        return float(answer)
    except (TypeError, ValueError, OverflowError):
        return None


def pal_text_correct(answer: str, target: Any) -> bool:
    """PAL's ``check_corr``: the answer equals the target's string, or its float is within
    ``1e-3`` of the target's."""
    if answer.strip() == str(target).strip():
        return True
    value, goal = pal_text_value(answer), pal_text_value(str(target))
    return value is not None and goal is not None and abs(value - goal) < PAL_ABS_TOL


def pal_match(answer: Any, target: float) -> bool:
    """PAL's program comparison: ``abs(float(answer) - target) < 1e-3`` (False when float() fails)."""
    try:
        return abs(float(answer) - float(target)) < PAL_ABS_TOL
    except (TypeError, ValueError, OverflowError):
        return False
