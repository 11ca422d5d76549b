"""MMLU-Pro: the 14 categories as ``mmlu_pro/<category>`` (spaces become underscores).

Source: ``TIGER-Lab/MMLU-Pro`` @ b189ec765aa7ed75c8acfea42df31fdae71f97be (the current hub
revision; mirror ``mmlu_pro_main/{test,validation}-00000-of-00001.parquet``). Example ids are the
``question_id``; the 5 validation rows of a category (the chain-of-thought demonstrations) are
examples ``v<question_id>`` kept in a separate ``fewshot`` pool of every profile, never in
train/val/test. ``group`` is the row's ``src`` (the original source subject), the topic key.

An older 2024 snapshot of the same files exists (``../shared/data/mmlu_pro/``): loading it
against these manifests is reported as drift (about 205 answers differ)."""

from __future__ import annotations

from typing import Any

from heldout.benchmarks import answers
from heldout.contracts import DataError, Example, RunContext, Source, Verdict
from heldout.benchmarks.prompt_task import PromptBenchmark, mode_verdict
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

# Reading 12k rows per category load would repeat the same parquet decode 14 times.
_ROWS_CACHE: dict[tuple[str, str], list[dict[str, Any]]] = {}


class MMLUProTask(PromptBenchmark):
    family = "mmlu_pro"
    metric = "accuracy (flexible letter; strict alongside)"
    version = "1"

    def __init__(self, category: str) -> None:
        self.category = category
        self.name = f"mmlu_pro/{category.replace(' ', '_')}"
        self.description = f"MMLU-Pro {category}: 10-option multiple choice"
        self.source = Source(hub_id=HUB_ID, config="default", split="test", revision=REVISION,
                             mirror_files=tuple(FILES.values()))

    def read_mirror(self, data_dir: str) -> list[dict[str, Any]]:
        rows = []
        for split, rel in FILES.items():
            key = (data_dir, rel)
            if key not in _ROWS_CACHE:
                _ROWS_CACHE[key] = read_parquet(data_dir, rel)
            rows += [{**r, "_split": split} for r in _ROWS_CACHE[key] if r.get("category") == self.category]
        return rows

    def read_hub(self) -> list[dict[str, Any]]:
        rows = []
        for split in FILES:
            rows += [{**r, "_split": split} for r in iter_hub_rows(self.source, split=split)
                     if r["category"] == self.category]
        return rows

    def to_examples(self, rows: list[dict[str, Any]]) -> list[Example]:
        out = []
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
                          "cot_content": row.get("cot_content") or ""},
                ))
            except (KeyError, TypeError, ValueError) as exc:
                raise DataError(f"{self.name}: malformed row {row.get('question_id')!r}: {exc}") from exc
        return out

    def format_input(self, example: Example) -> str:
        options = "\n".join(f"({LETTERS[i]}) {opt}" for i, opt in enumerate(example.input["options"]))
        return f"Question: {example.input['question']}\n\nOptions:\n{options}"

    answer_format = "Finish with: So the answer is (X), where X is the letter of the correct option."

    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        try:
            scored = answers.score_choice(text or "", example.target, len(example.input["options"]))
        except Exception as exc:
            return Verdict.failure(example.id, f"scoring failed: {exc}", "scoring_error")
        return mode_verdict(example, scored, text=text)


for _category in CATEGORIES:
    register(MMLUProTask(_category))
