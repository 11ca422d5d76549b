"""BIG-Bench Hard: all 27 tasks as ``bbh/<task>``.

Source: suzgunmirac/BIG-Bench-Hard @ 9ee07bd (mirror ``bbh/<task>.json``); hub equivalent
``lukaemon/bbh`` (script-based, so read through its ``refs/convert/parquet`` branch).
Example ids are the row index in the source file (``"32"`` is ``causal_judgement[32]``).

Known quirks, kept as they are (tests pin them): causal_judgement has two pairs of identical
inputs with opposite targets (32/119, 36/104), so no prompt can score 1.0 on both members of a pair;
movie_recommendation[163] ("Monsters, Inc"), ruin_names[99] and ruin_names[144] have a target that
is an option's text instead of a letter. Their ``meta["quirk"]`` says so.

Prompt formats: ``zero_shot`` (default) and ``cot_3shot``, the published BBH chain-of-thought
setting (Suzgun et al. 2022) as lm-evaluation-harness's ``bbh_cot_fewshot`` sends it, byte for
byte: the task's ``cot-prompts/<task>.txt`` after its canary header, each demonstration's answer on
the line after "A: Let's think step by step." (:func:`lm_eval_demonstrations`), then
``\n\nQ: <input>\nA: Let's think step by step.\n``, sent as a completion; it needs a mirror
data dir holding the prompt files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heldout.benchmarks import extraction
from heldout.contracts import DataError, Example, RunContext, Source, Verdict
from heldout.benchmarks.prompt_task import (COMPLETION, ZERO_SHOT, PromptBenchmark, PromptSetting,
                                           modes_scored, prompt_verdict)
from heldout.benchmarks.registry import register, register_group
from heldout.benchmarks.sources import iter_hub_rows, read_json

TASKS = (
    "boolean_expressions", "causal_judgement", "date_understanding", "disambiguation_qa",
    "dyck_languages", "formal_fallacies", "geometric_shapes", "hyperbaton",
    "logical_deduction_five_objects", "logical_deduction_seven_objects",
    "logical_deduction_three_objects", "movie_recommendation", "multistep_arithmetic_two",
    "navigate", "object_counting", "penguins_in_a_table", "reasoning_about_colored_objects",
    "ruin_names", "salient_translation_error_detection", "snarks", "sports_understanding",
    "temporal_sequences", "tracking_shuffled_objects_five_objects",
    "tracking_shuffled_objects_seven_objects", "tracking_shuffled_objects_three_objects",
    "web_of_lies", "word_sorting",
)

SEPO_TASKS = (
    "causal_judgement", "date_understanding", "disambiguation_qa", "formal_fallacies",
    "logical_deduction_seven_objects", "reasoning_about_colored_objects", "snarks", "word_sorting",
)

QUIRKS: dict[tuple[str, str], str] = {
    ("causal_judgement", "32"): "identical input to 119 with the opposite target",
    ("causal_judgement", "119"): "identical input to 32 with the opposite target",
    ("causal_judgement", "36"): "identical input to 104 with the opposite target",
    ("causal_judgement", "104"): "identical input to 36 with the opposite target",
    ("movie_recommendation", "163"): "target is option text ('Monsters, Inc'), not a letter",
    ("ruin_names", "99"): "target is option text, not a letter",
    ("ruin_names", "144"): "target is option text, not a letter",
}


COT_3SHOT = "cot_3shot"
COT_3SHOT_SETTING = PromptSetting(
    COT_3SHOT, "Suzgun et al. (2022) 3-shot chain of thought as lm-evaluation-harness bbh_cot_fewshot sends it "
               "(output_type generate_until: a completion; greedy, max_gen_toks 1024, until </s>, Q, blank line)", 3,
    "bbh/cot-prompts/<task>.txt after its canary header, each answer on the line after its cue (lm-eval's YAML), "
    "then \\n\\nQ: <input>\\nA: Let's think step by step.\\n",
    COMPLETION, stop=("</s>", "Q", "\n\n"), max_tokens=1024, temperature=0.0)
"""The harness's context is its ``description`` (the prompt file's task line and a blank line)
followed by ``doc_to_text`` (the three demonstrations, then ``\n\nQ: {{input}}\nA: Let's think
step by step.\n``), sent to a base model as one completion. The stop sequences matter: without
them a model runs on into a question of its own, and the reference's answer rule (the *first*
"the answer is") and heldout's (the last) then disagree."""
COT_QUESTION = "\n\nQ: {question}\nA: Let's think step by step.\n"
"""What follows the demonstrations: the question, and the cue the model continues from."""
COT_HEADER = "-----\n"
COT_CUE = "A: Let's think step by step."


def cot_prompt_path(subtask: str) -> str:
    return f"bbh/cot-prompts/{subtask}.txt"


def read_cot_prompt(data_dir: str, subtask: str) -> str:
    """The three worked demonstrations of a task: its prompt file after the canary + ``-----`` lines."""
    path = Path(data_dir) / cot_prompt_path(subtask)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise DataError(f"bbh/{subtask}: cannot read the chain-of-thought prompt {cot_prompt_path(subtask)}: {exc}") from exc
    head, sep, body = text.partition(COT_HEADER)
    if not sep or head.count("\n") != 1 or not head.endswith("\n"):
        raise DataError(f"bbh/{subtask}: {cot_prompt_path(subtask)} lacks its canary + '-----' header")
    return body


def lm_eval_demonstrations(body: str) -> str:
    """The demonstrations as lm-evaluation-harness renders them from its YAML: each is its
    ``doc_to_text`` (ending "A: Let's think step by step." and a newline) followed by its target,
    so an answer always starts on the cue's next line. The BBH repo's sports_understanding file
    writes its three answers on the cue's own line, after a space (lm-eval 0.4.x: a newline, 3
    bytes across the prompt); the other 26 files already have the newline and stay untouched."""
    return body.replace(COT_CUE + " ", COT_CUE + "\n")


class BBHTask(PromptBenchmark):
    family = "bbh"
    metric = "exact match (published BBH rule; strict and flexible alongside)"
    version = "1"
    prompt_formats = (ZERO_SHOT, COT_3SHOT)

    def __init__(self, subtask: str) -> None:
        self.subtask = subtask
        self.name = f"bbh/{subtask}"
        self.description = f"BIG-Bench Hard {subtask.replace('_', ' ')}"
        self.source = Source(hub_id="lukaemon/bbh", config=subtask, split="test",
                             revision="refs/convert/parquet", mirror_files=(f"bbh/{subtask}.json",))

    def read_mirror(self, data_dir: str) -> list[dict[str, Any]]:
        data = read_json(data_dir, f"bbh/{self.subtask}.json")
        if not isinstance(data, dict) or not isinstance(data.get("examples"), list):
            raise DataError(f"{self.name}: mirror file is corrupt: expected an object with an 'examples' list")
        return data["examples"]

    def read_hub(self) -> list[dict[str, Any]]:
        return [{"input": row["input"], "target": row["target"]} for row in iter_hub_rows(self.source)]

    def load_raw(self, data_dir: str | None) -> list[Example]:
        examples = super().load_raw(data_dir)
        if data_dir and (Path(data_dir) / cot_prompt_path(self.subtask)).is_file():
            demos = lm_eval_demonstrations(read_cot_prompt(data_dir, self.subtask))  # one shared string, not hashed
            for ex in examples:
                ex.meta["cot_prompt"] = demos
        return examples

    def to_examples(self, rows: list[dict[str, Any]]) -> list[Example]:
        out = []
        for index, row in enumerate(rows):
            ex_id = str(index)
            fmt = extraction.bbh_format_of(row["target"], self.subtask)
            meta: dict[str, Any] = {"format": fmt}
            if fmt == "choice":
                meta["options"] = list(extraction.choice_options(row["input"]))
            if (self.subtask, ex_id) in QUIRKS:
                meta["quirk"] = QUIRKS[(self.subtask, ex_id)]
            out.append(Example(id=ex_id, input={"question": row["input"]}, target=row["target"],
                               group=None, meta=meta))
        return out

    def format_input(self, example: Example) -> str:
        return example.input["question"]

    def prompt_setting(self, prompt_format: str | None = None) -> PromptSetting:
        if self.check_prompt_format(prompt_format) == COT_3SHOT:
            return COT_3SHOT_SETTING
        return super().prompt_setting(prompt_format)

    def user_message(self, example: Example, prompt_format: str) -> str:
        if prompt_format == COT_3SHOT:
            demos = example.meta.get("cot_prompt")
            if demos is None:
                raise DataError(f"{self.name}: the {COT_3SHOT} prompt format needs {cot_prompt_path(self.subtask)} "
                                "from a mirror data dir (--data-dir / HELDOUT_DATA_DIR)")
            return demos + COT_QUESTION.format(question=example.input["question"])
        return super().user_message(example, prompt_format)

    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        fmt = example.meta.get("format") or extraction.bbh_format_of(example.target, self.subtask)
        options = tuple(example.meta.get("options") or ())
        return prompt_verdict(example.id, text, lambda clean: modes_scored(
            extraction.score_bbh(clean, example.target, fmt, options=options), example.target))


for _subtask in TASKS:
    register(BBHTask(_subtask))
register_group("bbh/sepo", [f"bbh/{t}" for t in SEPO_TASKS], "the eight BBH tasks of the SEPO paper")
