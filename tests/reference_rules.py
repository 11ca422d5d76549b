"""The reference rules behind each family's ``published`` mode, written from the references' own
statements (not from heldout's code), so the tests can hold heldout's linear extractors to them.

* BBH (the rule that reproduces the published code-davinci-002 numbers, with lm-evaluation-harness
  ``bbh_cot_fewshot``'s line condition): the text after the last ``the answer is``, which must go
  on, after a space, to something on the cue's own line; stripped, minus one trailing period.
* MMLU-Pro (TIGER-AI-Lab ``evaluate_from_local.py``, the script whose prompt ``cot_5shot`` sends):
  the three regexes in order, applied directly (quadratic on long lines: use short texts).
  ``evaluate_from_api.py`` deletes every ``**`` first (:func:`api_script_mmlu_pro`).
* GSM-Hard (reasoning-machines/pal ``scripts/gsm_zero_shot.py``): the stripped output after its
  last ``The answer is `` (the whole stripped output without one), stripped; right when it equals
  the target's string or its ``float`` is within 1e-3 of the target.
* HotpotQA (``hotpot_evaluate_v1.py``): lower-case, drop punctuation, drop a/an/the, collapse
  whitespace; exact match, and token F1 where yes / no / noanswer must match exactly.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter


def bbh_reference(text: str) -> str | None:
    """What the BBH rule compares with the target, or None when it reads nothing."""
    m = re.search(r"the answer is(?!.*the answer is)(.*)", text, re.DOTALL)  # the last cue
    if m is None or not re.match(r" [^\n]*\S", m.group(1)):
        return None
    answer = m.group(1).strip()
    return answer[:-1] if answer.endswith(".") else answer


def official_mmlu_pro(text: str) -> str | None:
    """The official rule of ``evaluate_from_local.py`` stated directly: the three regexes in order."""
    for pattern in (r"answer is \(?([A-J])\)?", r".*[aA]nswer:\s*([A-J])"):
        m = re.search(pattern, text)
        if m:
            return m.group(1)
    m = re.search(r"\b[A-J]\b(?!.*\b[A-J]\b)", text, re.DOTALL)
    return m.group(0) if m else None


def api_script_mmlu_pro(text: str) -> str | None:
    """``evaluate_from_api.py``'s reading: every ``**`` deleted, then the same three regexes."""
    return official_mmlu_pro(text.replace("**", ""))


def pal_text_rule(text: str, target: float) -> tuple[float | None, int]:
    """(the finite float PAL's text rule reads, or None; its score)."""
    body = text.strip()
    at = body.rfind("The answer is ")
    answer = (body[at + len("The answer is "):] if at >= 0 else body).strip()
    try:
        value = float(answer)
    except ValueError:
        return None, int(answer == str(target))
    if not math.isfinite(value):
        return None, int(answer == str(target))
    return value, int(answer == str(target) or abs(value - target) < 1e-3)


def official_normalize(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def official_em(prediction: str | None, gold: str) -> int:
    return int(prediction is not None and official_normalize(prediction) == official_normalize(gold))


def official_f1(prediction: str | None, gold: str) -> float:
    if prediction is None:
        return 0.0
    pred, ref = official_normalize(prediction), official_normalize(gold)
    if (pred in ("yes", "no", "noanswer") or ref in ("yes", "no", "noanswer")) and pred != ref:
        return 0.0
    same = sum((Counter(pred.split()) & Counter(ref.split())).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred.split()), same / len(ref.split())
    return 2 * precision * recall / (precision + recall)
