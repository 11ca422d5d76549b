"""The reference prompt constructions, written from the references' own rules (not from heldout's
code), for byte-for-byte tests of the published prompt settings.

* BBH ``cot_3shot``: lm-evaluation-harness ``bbh_cot_fewshot``. Its per-task YAML (generated from
  Suzgun et al.'s ``cot-prompts/<task>.txt``) has ``description`` = the file's text before its
  first ``\\n\\nQ:`` plus ``\\n\\n``, and ``doc_to_text`` = the demonstrations from that ``Q:`` on,
  then ``\\n\\nQ: {{input}}\\nA: Let's think step by step.\\n``; the context sent
  (``output_type: generate_until``, a completion) is ``description + doc_to_text``.
* MMLU-Pro ``cot_5shot``: TIGER-Lab ``evaluate_from_local.py``, ``generate_cot_prompt``: the lines
  of ``cot_prompt_lib/initial_prompt.txt`` with ``{$}`` replaced by the category, then ``"\\n"``,
  then ``format_cot_example`` of the category's first k validation rows (with answer) and of the
  question (without); options "N/A" are dropped first (``preprocess``). The prompt string goes to
  vLLM's ``generate`` (a completion).
"""

from __future__ import annotations

from typing import Any, Sequence

LM_EVAL_BOOLEAN_EXPRESSIONS_SHA256 = "b69f58c1c2a3082d67cad08b08d1fefddd5cf8d0ae76a09aadea32285f2df052"
"""sha256 of ``description + doc_to_text`` (``{{input}}`` unfilled) of lm-evaluation-harness's
``lm_eval/tasks/bbh/cot_fewshot/boolean_expressions.yaml`` at commit fb9f352b (the YAMLs that
carry the whole prompt in ``doc_to_text``), read from the harness's file."""

INITIAL_PROMPT_TXT = ('The following are multiple choice questions (with answers) about {$}. Think step by step '
                      'and then finish your answer with "the answer is (X)" where X is the correct letter choice.'
                      "\n\n\n")
"""The text of MMLU-Pro's ``cot_prompt_lib/initial_prompt.txt``: it ends in three newlines, and
``generate_cot_prompt`` adds a fourth."""


def lm_eval_bbh_template(prompt_file: bytes) -> str:
    """``description + doc_to_text`` of the harness's YAML for one task, ``{{input}}`` unfilled."""
    body = prompt_file.decode("utf-8").split("\n-----\n")[-1]
    description, *shots = body.split("\n\nQ:")
    doc_to_text = "\n\nQ:".join(["", *shots])[2:] + "\n\nQ: {{input}}\nA: Let's think step by step.\n"
    return description + "\n\n" + doc_to_text


def lm_eval_bbh_context(prompt_file: bytes, question: str) -> bytes:
    """The context the harness sends for ``question``: the template with the input filled in."""
    return lm_eval_bbh_template(prompt_file).replace("{{input}}", question).encode("utf-8")


def mmlu_pro_format_cot_example(row: dict[str, Any], including_answer: bool) -> str:
    prompt = "Question:\n" + row["question"] + "\n" + "Options:\n"
    for i, opt in enumerate(o for o in row["options"] if o != "N/A"):
        prompt += "{}. {}\n".format("ABCDEFGHIJKLMNOP"[i], opt)
    if including_answer:
        return prompt + row["cot_content"].replace("A: Let's think step by step.",
                                                   "Answer: Let's think step by step.") + "\n\n"
    return prompt + "Answer: Let's think step by step."


def mmlu_pro_generate_cot_prompt(validation: Sequence[dict[str, Any]], current: dict[str, Any], k: int = 5) -> str:
    """``generate_cot_prompt(val_df, curr, k)``: ``validation`` in the file's order (the script
    keeps it), filtered to the question's category."""
    subject = current["category"]
    prompt = INITIAL_PROMPT_TXT.replace("{$}", subject) + "\n"
    for row in [r for r in validation if r["category"] == subject][:k]:
        prompt += mmlu_pro_format_cot_example(row, including_answer=True)
    return prompt + mmlu_pro_format_cot_example(current, including_answer=False)
