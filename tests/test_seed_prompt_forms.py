"""Every prompt family's seed prompt asks for one answer form, and the gold answer written in that
form scores full marks on the headline, for every example of the real data (MBPP+, whose gold is
executed in the sandbox, on a sample).

The form is read from what the seed candidate actually sends: the system message's "in the form:
..." and the user message's "Finish with: ..." must ask for the same cue; the gold is then put
where the form's placeholder is. An optimizer should have nothing to gain by learning a
capitalisation the headline demands and the prompt never asked for."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from heldout.benchmarks.mbpp_plus import MBPPPlusTask
from heldout.benchmarks.registry import all_tasks, get_benchmark
from heldout.benchmarks.user_jsonl import UserJsonlTask

PLACEHOLDER = re.compile(r"<[^<>]+>|\(X\)")
REASONING = "Let me work through this carefully, one step at a time.\n"


def requested_form(bench, example) -> str:
    """The answer line the seed prompt asks for, with its placeholder: the system message's form
    and the user message's, which must agree on the cue before the placeholder."""
    system, user = bench.render(bench.seed_candidate(), example)
    asked = re.search(r"in the form: (.+)$", system.content).group(1)
    finish = re.search(r"[Ff]inish with: (.+)$", user.content).group(1)
    cue = PLACEHOLDER.split(asked)[0]
    assert cue and PLACEHOLDER.split(finish)[0] == cue, (asked, finish)  # one request, not two
    return cue + PLACEHOLDER.search(finish).group(0) + "."


def written(form: str, gold: str) -> str:
    return REASONING + PLACEHOLDER.sub(lambda _: gold, form, count=1)


def number_renderings(value: float) -> list[str]:
    """A number as a model writes it: as Python prints it, in full, with thousands commas."""
    out = [repr(value), f"{value:.17g}", f"{value:,}"]
    if value == int(value):
        out += [str(int(value)), f"{int(value):,}"]
    return out


def full_marks_failures(bench, examples, golds) -> list:
    failures = []
    for ex in examples:
        form = requested_form(bench, ex)
        for gold in golds(ex):
            verdict = bench.score_text(written(form, gold), ex)
            if verdict.score != 1.0:
                failures.append((bench.name, ex.id, form, gold, verdict.feedback))
    return failures


FAMILY_GOLDS = {
    "bbh": lambda ex: [str(ex.target)],
    "mmlu_pro": lambda ex: [f"({ex.target})"],
    "gsm_hard": lambda ex: number_renderings(float(ex.target)),
    "hotpotqa": lambda ex: [ex.target["answer"]],
}


@pytest.mark.parametrize("family", sorted(FAMILY_GOLDS))
def test_the_gold_answer_in_the_seed_prompts_form_scores_one_on_every_example(family, data_dir):
    benches = [b for b in all_tasks() if b.family == family]
    assert benches
    failures, examples = [], 0
    for bench in benches:
        loaded = bench.load_raw(str(data_dir))
        examples += len(loaded)
        failures += full_marks_failures(bench, loaded, FAMILY_GOLDS[family])
    assert examples > 0
    assert not failures, f"{len(failures)} failures, first: {failures[:5]}"


def test_gsm_hard_asks_the_seeds_form_and_its_headline_reads_a_lower_case_cue(data_dir):
    bench = get_benchmark("gsm_hard")
    example = bench.load_raw(str(data_dir))[0]
    assert requested_form(bench, example) == "So the answer is <number>."
    assert bench.score_text(written("So the answer is <number>.", "-9867630"), example).score == 1.0


@pytest.mark.parametrize("answer_format", ["number", "span"])
def test_a_user_jsonl_task_scores_the_gold_in_its_seed_prompts_form(tmp_path: Path, data_dir, answer_format):
    if answer_format == "number":  # GSM-Hard's targets, as a user's numeric task would hold them
        rows = [json.loads(line) for line in (data_dir / "gsm_hard" / "gsmhardv2.jsonl").read_text().splitlines()]
        records = [{"id": str(i), "input": r["input"], "target": r["target"]} for i, r in enumerate(rows)]
        golds = lambda ex: number_renderings(float(ex.target))  # noqa: E731
    else:
        hotpot = get_benchmark("hotpotqa/distractor").load_raw(str(data_dir))
        records = [{"id": ex.id, "input": ex.input["question"], "target": ex.target["answer"]} for ex in hotpot]
        golds = lambda ex: [str(ex.target)]  # noqa: E731
    data_file = tmp_path / "mine.jsonl"
    data_file.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    bench = UserJsonlTask("mine/task", data_file, answer_format)
    examples = bench.load_raw()
    assert len(examples) == len(records)
    failures = full_marks_failures(bench, examples, golds)
    assert not failures, f"{len(failures)} failures, first: {failures[:5]}"


MBPP_SAMPLE = ("Mbpp/2", "Mbpp/3", "Mbpp/4")


def test_mbpp_plus_canonical_solution_in_the_seed_prompts_code_block_passes(data_dir):
    bench = get_benchmark("mbpp_plus")
    assert isinstance(bench, MBPPPlusTask)
    system, user = bench.render(bench.seed_candidate(), bench.load_raw(str(data_dir))[0])
    assert "```python code block" in system.content and "```python code block" in user.content
    assert "answer is" not in system.content + user.content  # code, not an answer line
    examples = {ex.id: ex for ex in bench.load_raw(str(data_dir))}
    for task_id in MBPP_SAMPLE:
        ex = examples[task_id]
        reply = f"{REASONING}```python\n{ex.target['canonical_solution'].strip()}\n```\n"
        verdict = bench.score_text(reply, ex)
        assert verdict.score == 1.0, (task_id, verdict.feedback)
