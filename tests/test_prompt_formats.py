"""Named prompt formats: zero-shot by default; BBH's published 3-shot chain of thought and
MMLU-Pro's published 5-shot chain of thought, rendered byte for byte from the shipped files."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from heldout.benchmarks.bbh import TASKS
from heldout.benchmarks.prompt_task import UnknownPromptFormat
from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import RunContext

SEED = {"instruction": "Think step by step."}


def fmt(name: str) -> RunContext:
    return RunContext(options={"prompt_format": name})


@pytest.mark.parametrize("task", TASKS)
def test_bbh_3shot_renders_the_shipped_prompt_file_byte_for_byte(data_dir, task):
    bench = get_benchmark(f"bbh/{task}")
    example = bench.load_raw(str(data_dir))[0]
    user = bench.render(SEED, example, fmt("cot_3shot"))[1].content.encode("utf-8")
    shipped = (data_dir / "bbh" / "cot-prompts" / f"{task}.txt").read_bytes()
    demonstrations = shipped.split(b"\n-----\n", 1)[1]  # after the canary line and the ----- line
    question = f"\n\nQ: {example.input['question']}\nA: Let's think step by step.".encode("utf-8")
    assert user == demonstrations + question
    assert user.count(b"\nQ: ") + user.startswith(b"Q: ") >= 4  # 3 demonstrations + the question


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


def official_question(row: dict, with_answer: bool) -> str:
    """The official format_cot_example, from its published source, with N/A options dropped."""
    text = "Question:\n" + row["question"] + "\n" + "Options:\n"
    for i, opt in enumerate(o for o in row["options"] if o != "N/A"):
        text += "{}. {}\n".format("ABCDEFGHIJ"[i], opt)
    if with_answer:
        return text + row["cot_content"].replace("A: Let's think step by step.",
                                                 "Answer: Let's think step by step.") + "\n\n"
    return text + "Answer: Let's think step by step."


@pytest.mark.parametrize("category", ["math", "law", "computer science"])
def test_mmlu_pro_5shot_is_the_official_prompt_with_na_options_dropped(data_dir, validation, category):
    bench = get_benchmark(f"mmlu_pro/{category.replace(' ', '_')}")
    examples = bench.load_raw(str(data_dir))
    test_example = next(ex for ex in examples if ex.meta["source_split"] == "test")
    shots = sorted((r for r in validation if r["category"] == category), key=lambda r: r["question_id"])
    assert len(shots) == 5
    expected = (f"The following are multiple choice questions (with answers) about {category}. Think step by step "
                "and then finish your answer with \"the answer is (X)\" where X is the correct letter choice.\n\n")
    expected += "".join(official_question(r, True) for r in shots)
    row = {"question": test_example.input["question"], "options": test_example.input["options"]}
    expected += official_question(row, False)
    user = bench.render(SEED, test_example, fmt("cot_5shot"))[1].content
    assert user == expected


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
            session = Session(task, budget=2, worker=worker, run_dir=tmp_path / name,
                              options={"prompt_format": name})
            before = server.stats.prompt_tokens
            verdicts = session.view.evaluate(session.view.seed_candidate, "train", [session.view.train[0]["id"]])
            tokens[name] = server.stats.prompt_tokens - before
            assert verdicts[0]["score"] in (0.0, 1.0)
            assert session.header()["options"] == {"prompt_format": name}
    assert tokens["cot_3shot"] > tokens["zero_shot"] + 300  # the three demonstrations were sent
