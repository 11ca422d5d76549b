"""The OpenAI-compatible test double: deterministic answers, faults, usage, lifecycle."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from heldout.models import ChatRequest, ModelClient
from heldout.models.testserver import TestServer, options_in, reply_for, solve

ANSWER = re.compile(r"So the answer is (.+)\.$")


def answer_of(text: str) -> str:
    match = ANSWER.search(text)
    assert match, f"reply does not end with 'So the answer is X.': {text!r}"
    return match.group(1)


def chat(instruction: str, question: str) -> list[dict]:
    return [{"role": "system", "content": instruction}, {"role": "user", "content": question}]


def post(srv: TestServer, body: dict | bytes, path: str = "/chat/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(srv.base_url + path, content=content, timeout=10)


def bbh(data_dir: Path, task: str) -> list[dict]:
    return json.loads((data_dir / "bbh" / f"{task}.json").read_text())["examples"]


# -- answers -------------------------------------------------------------------------------------
def test_answers_are_deterministic_and_end_with_the_answer_line():
    messages = chat("Answer.", "Which is bigger?\nOptions:\n(A) 3\n(B) 7\n(C) 5")
    assert reply_for(messages) == reply_for([dict(m) for m in messages])
    assert answer_of(reply_for(messages)) in ("(A)", "(B)", "(C)")


@pytest.mark.parametrize("prompt, options", [
    ("Pick one.\nOptions:\n(A) red\n(B) blue", ["(A)", "(B)"]),
    ("Is it valid?\nOptions:\n- valid \n- invalid", ["valid", "invalid"]),
    ("Choose. Options: cat, dog or bird", ["cat", "dog", "bird"]),
    ("Does Elanor tell the truth?", ["Yes", "No"]),
    ("Answer yes or no: snow is cold.", ["Yes", "No"]),
    ("How many apples do I have?", [str(n) for n in range(13)]),
    ("Tell me a story.", []),
])
def test_options_are_found_in_the_prompt(prompt, options):
    assert options_in(prompt) == options


@pytest.mark.parametrize("prompt, right", [
    ("Sort the following words alphabetically: List: pear apple fig", "apple fig pear"),
    ("not ( True ) and ( True ) is", "False"),
    ("Q: True or not False and False is\nA: Let's think.", "True"),
    ("((-1 + 2 + 9 * 5) - (-2 + -4 + -4 * -7)) =", "24"),
])
def test_the_shapes_it_solves_get_the_right_and_a_wrong_answer(prompt, right):
    got_right, got_wrong = solve(prompt)
    assert got_right == right and got_wrong != right


def test_no_code_is_evaluated_beyond_arithmetic_and_boolean_logic():
    assert solve("__import__('os').system('true') =") is None
    assert solve("(1).__class__ is") is None
    assert solve("2 ** 100000 =") is None


def test_different_instructions_reach_different_reproducible_accuracies(data_dir):
    examples = bbh(data_dir, "word_sorting")[:120]

    def accuracy(instruction: str) -> float:
        hits = [answer_of(reply_for(chat(instruction, e["input"]))) == e["target"] for e in examples]
        return sum(hits) / len(hits)

    accuracies = [accuracy(f"Instruction number {k}: sort the words.") for k in range(6)]
    assert len({round(a, 3) for a in accuracies}) > 1
    assert accuracies == [accuracy(f"Instruction number {k}: sort the words.") for k in range(6)]
    assert 0.1 < min(accuracies) and max(accuracies) < 1.0


@pytest.mark.parametrize("task", ["causal_judgement", "date_understanding", "formal_fallacies", "snarks"])
def test_answers_to_real_bbh_prompts_are_among_their_options(data_dir, task):
    for example in bbh(data_dir, task)[:40]:
        options = options_in(example["input"])
        assert example["target"].strip() in options
        assert answer_of(reply_for(chat("Answer.", example["input"]))) in options


def test_architect_requests_get_a_new_instruction_derived_from_the_old():
    ask = "Improve the instruction below given the feedback.\n```\nSort the words.\n```\nFeedback: {}"
    first = reply_for([{"role": "user", "content": ask.format("wrong order on item 3")}])
    again = reply_for([{"role": "user", "content": ask.format("wrong order on item 3")}])
    other = reply_for([{"role": "user", "content": ask.format("missed a word on item 9")}])
    new = re.search(r"```\n(.*?)\n```", first, re.DOTALL).group(1)
    assert first == again
    assert new.startswith("Sort the words.") and new != "Sort the words."
    # Feeding the new instruction back keeps it short: one strategy line replaces the last.
    second = reply_for([{"role": "user", "content": ask.format("x").replace("Sort the words.", new)}])
    assert re.search(r"```\n(.*?)\n```", second, re.DOTALL).group(1).count("\n") == 1
    assert {first, other} != {first}


# -- the HTTP surface ----------------------------------------------------------------------------
def test_usage_is_whitespace_tokens_and_max_tokens_truncates():
    messages = chat("Be brief.", "Sort the following words alphabetically: List: b a")
    with TestServer() as srv:
        full = post(srv, {"model": "m", "messages": messages}).json()
        short = post(srv, {"model": "m", "messages": messages, "max_tokens": 3}).json()
    assert full["usage"]["prompt_tokens"] == 2 + 8  # "Be brief." + the 8 words of the question
    assert full["usage"]["completion_tokens"] == len(full["choices"][0]["message"]["content"].split())
    assert full["choices"][0]["finish_reason"] == "stop"
    assert short["usage"]["completion_tokens"] == 3 and short["choices"][0]["finish_reason"] == "length"


def test_bad_requests_get_4xx_and_are_counted():
    with TestServer() as srv:
        assert post(srv, b"{not json").status_code == 400
        assert post(srv, {"model": "m", "messages": []}).status_code == 400
        assert post(srv, {"messages": [{"role": "user", "content": "x"}]}).status_code == 400
        assert post(srv, {"model": "m", "messages": []}, path="/nothing").status_code == 404
        assert httpx.get(srv.base_url + "/models").json()["data"][0]["id"]
        assert srv.stats.bad_requests == 3 and srv.stats.ok == 0


def test_fault_schedule_does_not_depend_on_arrival_order():
    bodies = [{"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(30)]

    def outcomes(order: list[int]) -> dict[int, list[int]]:
        seen: dict[int, list[int]] = {}
        with TestServer(error_rate=0.3, rate_429=0.3, seed=11) as srv, httpx.Client() as http:
            for i in order + order:  # each body twice: first and second sighting
                reply = http.post(srv.base_url + "/chat/completions", json=bodies[i])
                seen.setdefault(i, []).append(reply.status_code)
        return seen

    forward = outcomes(list(range(30)))
    assert forward == outcomes(list(reversed(range(30))))
    statuses = {s for pair in forward.values() for s in pair}
    assert statuses == {200, 429, 500}


def test_retry_after_header_is_sent_when_configured():
    with TestServer(rate_429=1.0, retry_after=0.5) as srv:
        reply = post(srv, {"model": "m", "messages": [{"role": "user", "content": "q"}]})
    assert reply.status_code == 429 and reply.headers["retry-after"] == "0.5"


def test_refuses_to_listen_beyond_loopback():
    with pytest.raises(ValueError, match="loopback"):
        TestServer(host="0.0.0.0")
    with pytest.raises(ValueError, match="exceed"):
        TestServer(error_rate=0.6, rate_429=0.6)


def test_runs_as_a_module_and_stops_on_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "heldout.models.testserver", "--port", "0",
                             "--api-key", "k"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        base_url = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line).group(1)
        client = ModelClient("test-model", base_url, "k")
        response = client.complete(ChatRequest(chat("Answer.", "Is 4 even?"), "test-model"))
        assert answer_of(response.text) in ("Yes", "No")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "served 1 of 1 calls" in err
