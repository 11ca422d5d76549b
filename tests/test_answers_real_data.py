"""The scorers against the real data in ../shared/data: every gold answer, written as a model would
write it, scores 1 in both modes; every other answer of the same task scores 0.

The files are read directly (json / pyarrow), not through the task loaders, so these tests pin the
scorers to the data itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from heldout.benchmarks.extraction import (
    BBH_TASK_FORMATS,
    bbh_format_of,
    extract_choice_letter,
    numbers_match,
    score_bbh,
    score_choice,
    score_number,
    score_span,
)

BOTH_RIGHT = {"strict": 1, "flexible": 1}


def right(result: dict) -> dict:
    return {"strict": result["strict"], "flexible": result["flexible"]}


@pytest.fixture(scope="module")
def bbh(data_dir: Path) -> dict[str, list[dict]]:
    return {task: json.loads((data_dir / "bbh" / f"{task}.json").read_text())["examples"]
            for task in BBH_TASK_FORMATS}


def test_the_format_table_matches_every_bbh_target(bbh):
    quirks = {("movie_recommendation", 163), ("ruin_names", 99), ("ruin_names", 144)}
    assert sum(len(examples) for examples in bbh.values()) == 6511
    for task, examples in bbh.items():
        for i, example in enumerate(examples):
            if (task, i) in quirks:
                assert not re.fullmatch(r"\([A-R]\)", example["target"])
                continue
            # Inferred from the target alone, the format agrees with the table.
            assert bbh_format_of(example["target"], "not_a_bbh_task") == BBH_TASK_FORMATS[task], (task, i)


def test_every_bbh_gold_answer_written_as_a_model_would_scores_one(bbh):
    for task, examples in bbh.items():
        fmt = bbh_format_of(examples[0]["target"], task)
        for i, example in enumerate(examples):
            target = example["target"]
            cot = f"A: Let's think step by step.\nWe weigh each option carefully. So the answer is {target}."
            assert right(score_bbh(cot, target, fmt)) == BOTH_RIGHT, (task, i, target)
            bare = score_bbh(target, target, fmt)  # the answer alone, no cue
            assert bare["flexible"] == 1, (task, i, target, bare)


def test_every_other_answer_of_the_same_bbh_task_scores_zero(bbh):
    for task, examples in bbh.items():
        fmt = BBH_TASK_FORMATS[task]
        targets = sorted({e["target"] for e in examples})
        for target in targets[:25]:
            for other in targets[:25]:
                if other != target:
                    text = f"So the answer is {other}."
                    assert score_bbh(text, target, fmt)["flexible"] == 0, (task, target, other)


def test_the_non_letter_bbh_targets_score_by_text(bbh):
    movie = bbh["movie_recommendation"][163]
    assert movie["target"] == "Monsters, Inc"
    assert right(score_bbh("So the answer is Monsters, Inc.", movie["target"], "choice")) == BOTH_RIGHT
    for part in ("(A)", "(B)", "Monsters", "Inc"):  # the halves the option list split it into
        assert score_bbh(f"So the answer is {part}.", movie["target"], "choice")["flexible"] == 0
    for i in (99, 144):
        example = bbh["ruin_names"][i]
        assert right(score_bbh(f"So the answer is {example['target']}.", example["target"], "choice")) == BOTH_RIGHT


def _demonstrations(prompt: str) -> list[str]:
    """The worked answers of a BBH chain-of-thought prompt file (text after each 'A:')."""
    body = prompt.split("-----", 1)[1]
    return [block.split("\nA:", 1)[1] for block in re.split(r"\n\nQ:", "\n\n" + body.split("\n\n", 1)[1]) if "\nA:" in block]


def test_the_real_chain_of_thought_demonstrations_are_read_right(data_dir: Path, bbh):
    """BBH's own worked answers mention other options, numbers and brackets before the final
    'So the answer is X.': both modes must still find X."""
    checked = 0
    for task in BBH_TASK_FORMATS:
        prompt = (data_dir / "bbh" / "cot-prompts" / f"{task}.txt").read_text()
        demos = _demonstrations(prompt)
        assert len(demos) == 3, task
        others = sorted({e["target"] for e in bbh[task]})
        for demo in demos:
            answer = demo.rsplit("So the answer is ", 1)[1].strip().removesuffix(".")
            assert right(score_bbh(demo, answer, BBH_TASK_FORMATS[task])) == BOTH_RIGHT, (task, demo[-80:])
            fmt = BBH_TASK_FORMATS[task]
            wrong = next(o for o in others if score_bbh(f"So the answer is {o}.", answer, fmt)["flexible"] == 0)
            assert right(score_bbh(demo, wrong, fmt)) == {"strict": 0, "flexible": 0}, (task, wrong)
            checked += 1
    assert checked == 81


@pytest.fixture(scope="module")
def mmlu_pro_main(data_dir: Path) -> list[dict]:
    return pq.read_table(data_dir / "mmlu_pro_main" / "test-00000-of-00001.parquet",
                         columns=["question_id", "options", "answer"]).to_pylist()


def test_every_mmlu_pro_gold_letter_scores_one_and_its_neighbour_zero(mmlu_pro_main):
    assert len(mmlu_pro_main) == 12032
    for row in mmlu_pro_main:
        n = len(row["options"])
        gold = row["answer"]
        assert right(score_choice(f"Let's think step by step. The answer is ({gold}).", gold, n)) == BOTH_RIGHT
        other = "ABCDEFGHIJ"[("ABCDEFGHIJ".index(gold) + 1) % n]
        assert score_choice(f"The answer is ({other}).", gold, n)["flexible"] == 0, row["question_id"]


def test_the_real_mmlu_pro_chains_of_thought_give_their_answer(data_dir: Path):
    rows = pq.read_table(data_dir / "mmlu_pro_main" / "validation-00000-of-00001.parquet").to_pylist()
    assert len(rows) == 70
    for row in rows:
        for mode in ("strict", "flexible"):
            assert extract_choice_letter(row["cot_content"], len(row["options"]), mode) == row["answer"], row["question_id"]


@pytest.fixture(scope="module")
def gsm_targets(data_dir: Path) -> list[float]:
    lines = (data_dir / "gsm_hard" / "gsmhardv2.jsonl").read_text().splitlines()
    return [json.loads(line)["target"] for line in lines if line.strip()]


def test_every_gsm_hard_target_written_as_a_model_would_scores_one(gsm_targets):
    assert len(gsm_targets) == 1319
    assert sum(t != int(t) for t in gsm_targets) == 303 and sum(t < 0 for t in gsm_targets) == 146
    rounded_only = 0
    for t in gsm_targets:
        for written in (f"{t!r}", f"{t:.17g} dollars", f"{t:,.3f}"):
            result = score_number(f"Step by step... So the answer is {written}.", t)
            assert (result["strict"], result["flexible"], result["published"], result["pal"]) == (1, 1, 1, 1), (
                t, written, result)
        for written in (f"{t!r}", f"{t:.17g}", f"{t:.3f}"):  # PAL's text rule: "The answer is " and a float
            assert score_number(f"Step by step...\nThe answer is {written}", t)["pal_text"] == 1, (t, written)
            assert score_number(f"Step by step... So the answer is {written}", t)["pal_text"] == 0, (t, written)
        for written in (f"{t:,.2f}", f"${t:,.2f}"):  # honoured as a rounding by flexible only
            result = score_number(f"Step by step... So the answer is {written}.", t)
            assert result["flexible"] == 1 and result["strict"] == result["pal"] == result["published"], (t, result)
        rounded_only += 1 - score_number(f"The answer is {t:.2f}", t)["published"]
        if t == int(t):
            assert right(score_number(f"The answer is {int(t):,}.", t)) == BOTH_RIGHT
    assert rounded_only == 85  # non-integer targets written to 2 places that PAL's comparison rejects


def test_no_gsm_hard_target_accepts_an_off_by_one_answer(gsm_targets):
    for t in gsm_targets:
        assert not numbers_match(t + 1, t) and not numbers_match(t - 1, t), t
        assert score_number(f"So the answer is {t + 1!r}.", t)["flexible"] == 0, t


@pytest.fixture(scope="module")
def hotpot_answers(data_dir: Path) -> dict[str, str]:
    folder = data_dir / "hotpotqa"
    records = [json.loads(line) for line in (folder / "hotpotqa_validate.jsonl").read_text().splitlines() if line.strip()]
    records += json.loads((folder / "hotpot_dev_distractor_v1_100.json").read_text())
    return {r["_id"]: r["answer"] for r in records}


def test_every_hotpotqa_gold_answer_scores_full_em_and_f1(hotpot_answers):
    assert len(hotpot_answers) == 302
    for qid, answer in hotpot_answers.items():
        result = score_span(f"Both paragraphs mention it.\nSo the answer is {answer}.", answer)
        assert right(result) == BOTH_RIGHT, (qid, answer, result)
        assert result["f1_strict"] == result["f1_flexible"] == 1.0
        assert score_span(answer, answer)["flexible"] == 1, (qid, answer)


def test_hotpotqa_yes_no_answers_give_no_partial_credit(hotpot_answers):
    yes_no = [a for a in hotpot_answers.values() if a in ("yes", "no")]
    assert yes_no  # the dev items include comparison questions answered yes/no
    for answer in yes_no:
        flipped = "no" if answer == "yes" else "yes"
        result = score_span(f"So the answer is {flipped}.", answer)
        assert result["f1_strict"] == 0.0 and result["strict"] == 0


def test_a_closing_remark_about_this_answer_never_replaces_the_hotpotqa_answer(hotpot_answers):
    """The audit's case: wrapping every gold as 'So the answer is X. I hope this answer is helpful.'
    once left 0/302 correct (the last 'answer is' won)."""
    for qid, answer in hotpot_answers.items():
        for tail in (" I hope this answer is helpful.", "\nI am sure the answer is correct."):
            result = score_span(f"So the answer is {answer}.{tail}", answer)
            assert right(result) == BOTH_RIGHT, (qid, answer, tail, result)


def test_every_hotpotqa_gold_in_the_three_common_answer_shapes_scores_one_in_the_headline(hotpot_answers):
    """The audit's shapes (issue 35): the old headline rule scored 0 of the 302 golds in each of
    them while strict read them all; the headline now reads them as strict does."""
    for qid, answer in hotpot_answers.items():
        for text in (f"Both paragraphs mention it.\nAnswer: **{answer}**",
                     f"Both paragraphs mention it. So the answer is\n{answer}",
                     f"Both paragraphs mention it.\nFinal answer: {answer}"):
            result = score_span(text, answer)
            assert (result["strict"], result["published"]) == (1, 1), (qid, text, result)
            assert result["f1_published"] == 1.0
