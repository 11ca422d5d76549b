"""MMLU-Pro: the 14 categories as ``mmlu_pro/<category>`` (spaces become underscores).

Source: ``TIGER-Lab/MMLU-Pro`` @ b189ec765aa7ed75c8acfea42df31fdae71f97be (the current hub
revision; mirror ``mmlu_pro_main/{test,validation}-00000-of-00001.parquet``). Example ids are the
``question_id``; the 5 validation rows of a category (the chain-of-thought demonstrations) are
examples ``v<question_id>`` kept in a separate ``fewshot`` pool of every profile, never in
train/val/test. ``group`` is the row's ``src`` (the original source subject), the topic key.

An older 2024 snapshot of the same files exists (``../shared/data/mmlu_pro/``): loading it
against these manifests is reported as drift (about 205 answers differ).

Options: the official code drops the "N/A" filler options (21 validation rows end with them);
heldout keeps the source rows as they are (their hashes are frozen) and drops the fillers when it
renders and scores (:func:`shown_options`).

Prompt formats: ``zero_shot`` (default) and ``cot_5shot``, the published MMLU-Pro setting as
TIGER-Lab's ``evaluate_from_local.py`` builds and sends it (``generate_cot_prompt``: one prompt
string, given to vLLM's ``generate``, so a completion; ``evaluate_from_api.py`` words its header
and questions differently and is not this setting): ``cot_prompt_lib/initial_prompt.txt`` with
the category for ``{$}`` (it ends in three newlines) and one more newline, the category's 5
validation questions with their chains of thought ("A: Let's think step by step." becomes
"Answer: ..."), then the question ending "Answer: Let's think step by step.", rendered by
:func:`cot_5shot_prompt`."""

from __future__ import annotations

from typing import Any

from heldout.benchmarks import extraction
from heldout.contracts import DataError, Example, RunContext, Source, Verdict
from heldout.benchmarks.prompt_task import (COMPLETION, ZERO_SHOT, PromptBenchmark, PromptSetting,
                                           modes_scored, prompt_verdict)
from heldout.benchmarks.registry import register
from heldout.benchmarks.sources import iter_hub_rows, read_parquet

HUB_ID = "TIGER-Lab/MMLU-Pro"
REVISION = "b189ec765aa7ed75c8acfea42df31fdae71f97be"
MIRROR_DIR = "mmlu_pro_main"
FILES = {"test": f"{MIRROR_DIR}/test-00000-of-00001.parquet",
         "validation": f"{MIRROR_DIR}/validation-00000-of-00001.parquet"}
CATEGORIES = (
    "biology", "business", "chemistry", "computer science", "economics", "engineering", "health",
    "history", "law", "math", "other", "philosophy", "physics", "psychology",
)
LETTERS = "ABCDEFGHIJ"
FILLER = "N/A"
COT_5SHOT = "cot_5shot"
N_SHOTS = 5
COT_5SHOT_SETTING = PromptSetting(
    COT_5SHOT, "TIGER-Lab MMLU-Pro 5-shot chain of thought as evaluate_from_local.py runs it (one prompt string "
               "to vLLM generate: a completion; greedy, stop at Question:, max_new_tokens 2048)", 5,
    "cot_prompt_lib/initial_prompt.txt for the category and a newline, its 5 validation questions with their "
    "chains of thought, the question", COMPLETION, stop=("Question:",), max_tokens=2048, temperature=0.0)
INITIAL_PROMPT = ("The following are multiple choice questions (with answers) about {category}. Think step by "
                  "step and then finish your answer with \"the answer is (X)\" where X is the correct letter "
                  "choice.\n\n\n")
"""``cot_prompt_lib/initial_prompt.txt`` (``{$}`` there), three newlines and all."""


def shown_options(options: list[str]) -> list[str]:
    """The options a model sees: the official preprocessing drops every "N/A" filler."""
    return [opt for opt in options if opt != FILLER]


def official_question(question: str, options: list[str], cot_content: str | None = None) -> str:
    """One question as the official ``format_cot_example`` writes it: with its worked answer
    (a demonstration) or ending "Answer: Let's think step by step." (the question asked)."""
    text = f"Question:\n{question}\nOptions:\n"
    text += "".join(f"{LETTERS[i]}. {opt}\n" for i, opt in enumerate(shown_options(options)))
    if cot_content is None:
        return text + "Answer: Let's think step by step."
    return text + cot_content.replace("A: Let's think step by step.", "Answer: Let's think step by step.") + "\n\n"


def cot_5shot_prompt(category: str, demos: list[dict[str, Any]], question: str, options: list[str]) -> str:
    """The official 5-shot chain-of-thought prompt, as ``generate_cot_prompt`` builds it: the
    initial prompt and one more newline (four in all before the first question), the
    demonstrations, the question."""
    prompt = INITIAL_PROMPT.format(category=category) + "\n"
    prompt += "".join(official_question(d["question"], d["options"], d["cot_content"]) for d in demos)
    return prompt + official_question(question, options)


class MMLUProTask(PromptBenchmark):
    family = "mmlu_pro"
    metric = "accuracy (published: the official three-stage extractor; strict and flexible alongside)"
    version = "1"
    prompt_formats = (ZERO_SHOT, COT_5SHOT)

    def __init__(self, category: str) -> None:
        self.category = category
        self.name = f"mmlu_pro/{category.replace(' ', '_')}"
        self.description = f"MMLU-Pro {category}: 10-option multiple choice"
        self.source = Source(hub_id=HUB_ID, config="default", split="test", revision=REVISION,
                             mirror_files=tuple(FILES.values()))

    def read_mirror(self, data_dir: str) -> list[dict[str, Any]]:
        # One category's rows only, and nothing kept for the next load: a process-wide cache of the
        # whole file held every category's test questions and answers while an in-process
        # optimizer ran (tests/test_in_process_reach.py)
        return [{**r, "_split": split} for split, rel in FILES.items()
                for r in read_parquet(data_dir, rel, where=("category", self.category))]

    def read_hub(self) -> list[dict[str, Any]]:
        rows = []
        for split in FILES:
            rows += [{**r, "_split": split} for r in iter_hub_rows(self.source, split=split)
                     if r["category"] == self.category]
        return rows

    def to_examples(self, rows: list[dict[str, Any]]) -> list[Example]:
        out = []
        demos = [{"question": r["question"], "options": list(r["options"]), "cot_content": r.get("cot_content") or ""}
                 for r in sorted((r for r in rows if r["_split"] == "validation"), key=lambda r: int(r["question_id"]))]
        demos = demos[:N_SHOTS]  # one shared list: the category's demonstrations, in the official order
        for row in rows:
            try:
                options = list(row["options"])
                prefix = "v" if row["_split"] == "validation" else ""
                out.append(Example(
                    id=f"{prefix}{int(row['question_id'])}",
                    input={"question": row["question"], "options": options},
                    target=row["answer"],
                    group=row.get("src"),
                    meta={"answer_index": int(row["answer_index"]), "source_split": row["_split"],
                          "cot_content": row.get("cot_content") or "", "demonstrations": demos},
                ))
            except (KeyError, TypeError, ValueError) as exc:
                raise DataError(f"{self.name}: malformed row {row.get('question_id')!r}: {exc}") from exc
        return out

    def format_input(self, example: Example) -> str:
        options = "\n".join(f"({LETTERS[i]}) {opt}" for i, opt in enumerate(shown_options(example.input["options"])))
        return f"Question: {example.input['question']}\n\nOptions:\n{options}"

    answer_format = "Finish with: So the answer is (X), where X is the letter of the correct option."

    def prompt_setting(self, prompt_format: str | None = None) -> PromptSetting:
        if self.check_prompt_format(prompt_format) == COT_5SHOT:
            return COT_5SHOT_SETTING
        return super().prompt_setting(prompt_format)

    def user_message(self, example: Example, prompt_format: str) -> str:
        if prompt_format == COT_5SHOT:
            demos = example.meta.get("demonstrations") or []
            if len(demos) < N_SHOTS:
                raise DataError(f"{self.name}: the {COT_5SHOT} prompt format needs {N_SHOTS} validation "
                                f"questions of the category, found {len(demos)}")
            if example.meta.get("source_split") == "validation":
                raise DataError(f"{self.name}: example {example.id} is one of the {COT_5SHOT} demonstrations")
            return cot_5shot_prompt(self.category, demos, example.input["question"], example.input["options"])
        return super().user_message(example, prompt_format)

    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        options = shown_options(example.input["options"])
        return prompt_verdict(example.id, text, lambda clean: modes_scored(
            extraction.score_choice(clean, example.target, len(options), options=options), example.target))


for _category in CATEGORIES:
    register(MMLUProTask(_category))
