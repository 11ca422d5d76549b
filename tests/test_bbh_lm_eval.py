"""BBH ``cot_3shot`` is lm-evaluation-harness's ``bbh_cot_fewshot`` context, byte for byte, for
every example of all 27 tasks, checked against the harness itself: its own task YAMLs (shipped
inside the ``lm_eval`` package, ``lm_eval/tasks/bbh/cot_fewshot/``) loaded by its own loader and
rendered by its own ``ConfigurableTask.fewshot_context``, with the BBH mirror's rows as the
task's dataset (the harness would download a parquet copy; the rows are the same).

lm_eval comes with the ``[test]`` extra (without torch: its declared dependencies need none);
where it is absent the tests skip and say so."""

from __future__ import annotations

import importlib.resources
import json

import pytest

from heldout.benchmarks.bbh import TASKS, read_cot_prompt
from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import RunContext

lm_eval = pytest.importorskip("lm_eval", reason="lm_eval (lm-evaluation-harness) is not installed: "
                              "pip install -e '.[test]' brings it")
datasets = pytest.importorskip("datasets")
from lm_eval.api.task import ConfigurableTask  # noqa: E402 - only once lm_eval is known to be there
from lm_eval.tasks._yaml_loader import load_yaml  # noqa: E402

COT_3SHOT = RunContext(options={"prompt_format": "cot_3shot"})
NO_INSTRUCTION = {"instruction": ""}  # the published setting sends the reference bytes alone


def harness_task(task: str, rows: list[dict]) -> ConfigurableTask:
    """The harness's ``bbh_cot_fewshot_<task>``, its dataset the given rows."""
    yaml_file = importlib.resources.files("lm_eval") / "tasks" / "bbh" / "cot_fewshot" / f"{task}.yaml"
    config = load_yaml(str(yaml_file))
    config["custom_dataset"] = lambda **_: datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
    return ConfigurableTask(config=config)


@pytest.mark.parametrize("task", TASKS)
def test_cot_3shot_sends_the_harness_context_for_every_example(data_dir, task):
    bench = get_benchmark(f"bbh/{task}")
    examples = bench.load_raw(str(data_dir))
    rows = json.loads((data_dir / "bbh" / f"{task}.json").read_text(encoding="utf-8"))["examples"]
    harness = harness_task(task, rows)
    assert harness.config.num_fewshot == 3
    differ = [ex.id for ex, doc in zip(examples, harness.test_docs(), strict=True)
              if bench.render(NO_INSTRUCTION, ex, COT_3SHOT)[0].content != harness.fewshot_context(doc, 3)]
    assert differ == [], f"{len(differ)} of {len(examples)} prompts differ from lm-eval's"


def test_only_sports_understanding_differs_from_the_bbh_repo_file_by_three_newlines(data_dir):
    """Why a rendering rule exists at all: the BBH repo's sports_understanding file puts each
    answer after "step by step." on the same line; lm-eval's YAML, like the other 26 files, on the
    next line. heldout sends lm-eval's bytes (so 3 bytes differ from the BBH file there)."""
    changed = {}
    for task in TASKS:
        bench = get_benchmark(f"bbh/{task}")
        example = bench.load_raw(str(data_dir))[0]
        sent = bench.render(NO_INSTRUCTION, example, COT_3SHOT)[0].content
        file_text = read_cot_prompt(str(data_dir), task) + f"\n\nQ: {example.input['question']}\n" \
                                                            "A: Let's think step by step.\n"
        if sent != file_text:
            assert len(sent) == len(file_text)
            changed[task] = [(a, b) for a, b in zip(file_text, sent) if a != b]
    assert changed == {"sports_understanding": [(" ", "\n")] * 3}
