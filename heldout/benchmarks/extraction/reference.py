"""The ``published`` mode: each family's reference rule, reproduced exactly (no folding, no
run-on cut, no hedge or negation rule: the reference has none).

* BBH (Suzgun et al. 2022; the rule used to score the code-davinci-002 outputs shipped with BBH):
  the text after the last ``the answer is`` (case-sensitive), stripped, minus one trailing
  period, equals the target string. No ``the answer is``: no answer.
* MMLU-Pro (TIGER-Lab, ``evaluate_from_api.py`` / ``evaluate_from_local.py``): three stages, the
  first that matches wins: ``answer is \\(?([A-J])\\)?`` (the *first* match, case-sensitive),
  else ``.*[aA]nswer:\\s*([A-J])`` (the last "Answer:" on the first line that has one), else the
  last standalone capital ``A``..``J`` anywhere. The official script then credits a *random*
  guess when all three fail; heldout scores that 0 (deterministic), so on outputs with no letter
  at all heldout's published accuracy is below the script's by (miss rate) / (option count).
* GSM-Hard (PAL, ``scripts/gsm_eval.py``): ``abs(float(answer) - target) < 1e-3``. PAL executes a
  program and compares its return value; for model text the answer is the number the final
  answer cue introduces (PAL's chain-of-thought prompts end ``The answer is X.``).
* HotpotQA (the official ``hotpot_evaluate_v1.py``): exact match and token F1 after its
  ``normalize_answer``; the prediction is the rest of the line after the last ``answer is``
  (minus one trailing period), or the whole output when it has none (a bare answer).
"""

from __future__ import annotations

import re
from typing import Any

_BBH_CUE = "the answer is"
_MMLU_STAGE1 = re.compile(r"answer is \(?([A-J])\)?")
_MMLU_STAGE2 = re.compile(r".*[aA]nswer:\s*([A-J])")
_MMLU_STAGE3 = re.compile(r"\b[A-J]\b(?!.*\b[A-J]\b)", re.DOTALL)
PAL_ABS_TOL = 1e-3


def bbh_answer(text: str) -> str | None:
    """What the BBH rule compares with the target."""
    if _BBH_CUE not in text:
        return None
    answer = text.rsplit(_BBH_CUE, 1)[1].strip()
    return answer[:-1] if answer.endswith(".") else answer


def mmlu_pro_answer(text: str) -> str | None:
    """The official three-stage MMLU-Pro extractor (without its random guess)."""
    for pattern in (_MMLU_STAGE1, _MMLU_STAGE2):
        m = pattern.search(text)
        if m:
            return m.group(1)
    m = _MMLU_STAGE3.search(text)
    return m.group(0) if m else None


def pal_match(answer: Any, target: float) -> bool:
    """PAL's comparison: ``abs(float(answer) - target) < 1e-3`` (False when float() fails)."""
    try:
        return abs(float(answer) - float(target)) < PAL_ABS_TOL
    except (TypeError, ValueError, OverflowError):
        return False


_SPAN_CUE = re.compile(r"answer is", re.IGNORECASE)


def hotpot_answer(text: str) -> str | None:
    """The prediction string the official HotpotQA metric is given (see module doc)."""
    ends = [m.end() for m in _SPAN_CUE.finditer(text)]
    if ends:
        line = text[ends[-1]:].split("\n", 1)[0].strip()
    else:
        line = text.strip()
    line = line[:-1] if line.endswith(".") else line
    return line or None
