"""HotpotQA, distractor setting: ``hotpotqa/distractor``.

Each example: the question with its 10 context paragraphs (2 gold + 8 distractors), type,
level; the target is the answer plus the supporting facts. ``group`` is the sorted pair of gold
article titles (the titles of the supporting facts), the topic key protocols split on.

Sources, in order of preference when a mirror dir is given: the full official dev file
``hotpotqa/hotpot_dev_distractor_v1.json`` if the user has it, else the two real subsets in
``../shared/data/hotpotqa`` (AFlow's 200-item validate fixture + the first 103 dev records; one
record is in both and identical, so 302 unique items; the shipped profiles use these). Without a
mirror: the hub's ``hotpotqa/hotpot_qa`` ``distractor`` validation split, whose dict-of-lists
schema is converted to the same records.

Quirk kept: four records of AFlow's validate fixture have integer ``_id`` values (37, 61, 79, 95)
instead of the dev set's hex ids; heldout uses their string form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heldout.benchmarks import extraction
from heldout.contracts import DataError, Example, RunContext, Source, Verdict
from heldout.benchmarks.prompt_task import PromptBenchmark, modes_scored, prompt_verdict
from heldout.benchmarks.registry import register
from heldout.benchmarks.sources import iter_hub_rows, read_json, read_jsonl

FULL_DEV = "hotpotqa/hotpot_dev_distractor_v1.json"
SUBSETS = ("hotpotqa/hotpotqa_validate.jsonl", "hotpotqa/hotpot_dev_distractor_v1_100.json")


def hub_row_to_record(row: dict[str, Any]) -> dict[str, Any]:
    """The hub's parquet layout -> the original release layout."""
    sf, ctx = row["supporting_facts"], row["context"]
    return {
        "_id": row["id"], "question": row["question"], "answer": row["answer"],
        "type": row["type"], "level": row["level"],
        "supporting_facts": [[t, int(i)] for t, i in zip(sf["title"], sf["sent_id"])],
        "context": [[t, list(s)] for t, s in zip(ctx["title"], ctx["sentences"])],
    }


class HotpotQADistractor(PromptBenchmark):
    name = "hotpotqa/distractor"
    family = "hotpotqa"
    metric = "exact match (published: official normalisation; token F1, strict, flexible alongside)"
    version = "1"
    description = "HotpotQA multi-hop QA, distractor setting (10 paragraphs)"
    source = Source(hub_id="hotpotqa/hotpot_qa", config="distractor", split="validation",
                    revision=None, mirror_files=SUBSETS)
    answer_format = "Finish with: So the answer is <short answer>."

    def read_mirror(self, data_dir: str) -> list[dict[str, Any]]:
        if (Path(data_dir) / FULL_DEV).is_file():
            return read_json(data_dir, FULL_DEV)
        records: dict[str, dict[str, Any]] = {}
        for rel in SUBSETS:
            rows = read_jsonl(data_dir, rel) if rel.endswith(".jsonl") else read_json(data_dir, rel)
            for row in rows:
                if row.get("_id") in records and records[row["_id"]] != row:
                    raise DataError(f"hotpotqa: record {row['_id']} differs between the two subset files")
                records.setdefault(row.get("_id"), row)
        return list(records.values())

    def read_hub(self) -> list[dict[str, Any]]:
        return [hub_row_to_record(row) for row in iter_hub_rows(self.source)]

    def to_examples(self, rows: list[dict[str, Any]]) -> list[Example]:
        out = []
        for row in rows:
            try:
                facts = [[str(t), int(i)] for t, i in row["supporting_facts"]]
                out.append(Example(
                    id=str(row["_id"]),  # 4 records of AFlow's fixture carry integer ids (37, 61, 79, 95)
                    input={"question": row["question"],
                           "context": [[str(t), list(s)] for t, s in row["context"]]},
                    target={"answer": row["answer"], "supporting_facts": facts},
                    group=" | ".join(sorted({t for t, _ in facts})),
                    meta={"type": row.get("type"), "level": row.get("level")},
                ))
            except (KeyError, TypeError, ValueError) as exc:
                raise DataError(f"hotpotqa: malformed record {row.get('_id')!r}: {exc}") from exc
        return out

    def format_input(self, example: Example) -> str:
        paragraphs = "\n\n".join(f"{title}: {''.join(sents)}" for title, sents in example.input["context"])
        return f"{paragraphs}\n\nQuestion: {example.input['question']}"

    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        """Exact match and token F1 / precision / recall in every mode; the score is published EM."""
        gold = example.target["answer"]
        return prompt_verdict(example.id, text, lambda clean: modes_scored(extraction.score_span(clean, gold), gold))


register(HotpotQADistractor())
