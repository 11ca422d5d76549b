"""Named prompt formats: zero-shot by default; BBH's published 3-shot chain of thought and
MMLU-Pro's published 5-shot chain of thought, rendered byte for byte (newlines included) as the
references build them (:mod:`reference_prompts`) from the shipped files."""

from __future__ import annotations

from hashlib import sha256

import pyarrow.parquet as pq
import pytest

from heldout.benchmarks.bbh import TASKS
from heldout.benchmarks.prompt_task import UnknownPromptFormat
from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import RunContext
from heldout.evaluators.scoring import SessionModels
from reference_prompts import (LM_EVAL_BOOLEAN_EXPRESSIONS_SHA256, lm_eval_bbh_context, lm_eval_bbh_template,
                               mmlu_pro_generate_cot_prompt)

SEED = {"instruction": "Think step by step."}


def fmt(name: str) -> RunContext:
    return RunContext(options={"prompt_format": name})


@pytest.mark.parametrize("task", TASKS)
def test_bbh_3shot_is_lm_eval_bbh_cot_fewshot_context_byte_for_byte(data_dir, task):
    bench = get_benchmark(f"bbh/{task}")
    example = bench.load_raw(str(data_dir))[0]
    user = bench.render(SEED, example, fmt("cot_3shot"))[1].content.encode("utf-8")
    shipped = (data_dir / "bbh" / "cot-prompts" / f"{task}.txt").read_bytes()
    if task == "sports_understanding":  # lm-eval moves its 3 answers to the cue's next line
        shipped = shipped.replace(b"step by step. ", b"step by step.\n")  # (tests/test_bbh_lm_eval.py)
    assert user == lm_eval_bbh_context(shipped, example.input["question"])
    demonstrations = shipped.split(b"\n-----\n", 1)[1]  # the prompt file after its canary and ----- lines
    question = f"\n\nQ: {example.input['question']}\nA: Let's think step by step.\n".encode("utf-8")
    assert user == demonstrations + question  # Suzgun et al.'s file, then the question
    assert user.count(b"\nQ: ") + user.startswith(b"Q: ") >= 4  # 3 demonstrations + the question


def test_the_bbh_reference_construction_is_the_harness_yaml_itself(data_dir):
    shipped = (data_dir / "bbh" / "cot-prompts" / "boolean_expressions.txt").read_bytes()
    template = lm_eval_bbh_template(shipped)
    assert sha256(template.encode("utf-8")).hexdigest() == LM_EVAL_BOOLEAN_EXPRESSIONS_SHA256
    assert template.endswith("True.\n\nQ: {{input}}\nA: Let's think step by step.\n")


def test_zero_shot_is_the_default_and_an_unknown_format_is_a_clear_error(data_dir):
    bench = get_benchmark("bbh/snarks")
    example = bench.load_raw(str(data_dir))[0]
    default = bench.render(SEED, example)[1].content
    assert default == bench.render(SEED, example, fmt("zero_shot"))[1].content
    assert default.endswith("Finish with: So the answer is <answer>.")
    with pytest.raises(UnknownPromptFormat, match="cot_3shot"):
        bench.render(SEED, example, fmt("cot_8shot"))


@pytest.fixture(scope="module")
def validation(data_dir):
    return pq.read_table(data_dir / "mmlu_pro_main" / "validation-00000-of-00001.parquet").to_pylist()


@pytest.mark.parametrize("category", ["math", "law", "computer science", "business"])
def test_mmlu_pro_5shot_is_generate_cot_prompt_of_evaluate_from_local_byte_for_byte(data_dir, validation, category):
    bench = get_benchmark(f"mmlu_pro/{category.replace(' ', '_')}")
    examples = bench.load_raw(str(data_dir))
    test_example = next(ex for ex in examples if ex.meta["source_split"] == "test")
    current = {"category": category, **test_example.input}
    user = bench.render(SEED, test_example, fmt("cot_5shot"))[1].content
    assert user == mmlu_pro_generate_cot_prompt(validation, current)
    header = user[:user.index("Question:\n")]
    assert header.endswith("letter choice.\n\n\n\n")  # four newlines after the header, as the script writes
    assert user.count("Question:\n") == 6 and user.endswith("Answer: Let's think step by step.")


def test_the_na_fillers_are_dropped_when_rendering_and_scoring_validation_rows(data_dir):
    bench = get_benchmark("mmlu_pro/math")
    row = next(ex for ex in bench.load_raw(str(data_dir)) if "N/A" in ex.input["options"])
    shown = bench.render(SEED, row)[1].content
    assert "N/A" not in shown
    kept = [o for o in row.input["options"] if o != "N/A"]
    letter = "ABCDEFGHIJ"[len(kept)]  # the first letter past the real options is no answer
    assert bench.score_text(f"The answer is ({letter}).", row).dimensions["strict"] == 0.0


def test_a_demonstration_cannot_be_asked_in_the_5shot_format(data_dir):
    bench = get_benchmark("mmlu_pro/math")
    demo = next(ex for ex in bench.load_raw(str(data_dir)) if ex.meta["source_split"] == "validation")
    with pytest.raises(Exception, match="demonstrations"):
        bench.render(SEED, demo, fmt("cot_5shot"))


def test_the_prompt_format_is_a_task_option_recorded_in_the_run_record(data_dir, tmp_path):
    import heldout
    from heldout.evaluators.session import Session
    from heldout.models import ModelClient
    from heldout.models.testserver import TestServer

    task = heldout.load_task("bbh/snarks", profile="sepo", data_dir=data_dir)
    tokens = {}
    with TestServer(latency=0.0, seed=0) as server:
        for name in ("zero_shot", "cot_3shot"):
            worker = ModelClient("test-model", base_url=server.base_url, api_key="k")
            session = Session(task, budget=2, models=SessionModels(worker=worker), run_dir=tmp_path / name,
                              options={"prompt_format": name})
            before = server.stats.prompt_tokens
            verdicts = session.view.evaluate(session.view.seed_candidate, "train", [session.view.train[0]["id"]])
            tokens[name] = server.stats.prompt_tokens - before
            assert verdicts[0]["score"] in (0.0, 1.0)
            assert session.header()["options"] == {"prompt_format": name}
            assert session.header()["prompt_setting"]["sent_as"] == ("chat" if name == "zero_shot" else "completion")
    assert tokens["cot_3shot"] > tokens["zero_shot"] + 300  # the three demonstrations were sent
