"""`heldout export inspect`: the written logs read back with the real inspect-ai and carry exactly
the ledger's scores, outputs, answers and dimensions, with the rendered prompt and the target;
a session whose ledger does not verify is not exported."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

inspect_log = pytest.importorskip("inspect_ai.log", reason="the [inspect] extra (inspect-ai) is not installed")

from heldout.benchmarks.loading import load_task  # noqa: E402
from heldout.contracts import RunContext  # noqa: E402
from heldout.evaluators.ledger import Ledger, read_entries  # noqa: E402
from heldout.evaluators.records import RunRecord  # noqa: E402
from heldout.evaluators.session import Session  # noqa: E402
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient  # noqa: E402
from heldout.models.testserver import TestServer  # noqa: E402
from heldout.optimizers import resolve_optimizer  # noqa: E402
from heldout.reports.inspect_export import export_inspect  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TASK, PROFILE = "bbh/causal_judgement", "sepo"
CHROMIUM = Path("/usr/bin/chromium")
INSPECT = shutil.which("inspect", path=str(Path(sys.executable).parent)) or shutil.which("inspect")


def _probe_then_seed(view, seed):
    """Pays for three train examples twice (the second time from the session's memo) and keeps the seed."""
    ids = [ex["id"] for ex in view.train[:3]]
    view.evaluate(view.seed_candidate, "train", ids)
    view.evaluate(view.seed_candidate, "train", ids)
    return dict(view.seed_candidate)


@pytest.fixture(scope="module")
def study(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("study")
    with TestServer() as server:
        session = Session(TASK, profile=PROFILE, budget=6, run_dir=root / "bbh__causal_judgement" / "probe" / "seed-0",
                          models=SessionModels(worker=ModelClient("test-model", base_url=server.base_url)), data_dir=str(data_dir),
                          method="probe")
        session.run(_probe_then_seed)
    session = Session("lockpicking/six", budget=2, run_dir=root / "lockpicking__six" / "seed" / "seed-0", method="seed")
    session.run(resolve_optimizer("seed"))
    return root


def _ledger(session_dir: Path, kind: str) -> list[dict]:
    entries, _ = read_entries(session_dir / "ledger.jsonl")
    return [e["data"] for e in entries if e["kind"] == kind]


def test_heldout_logs_read_back_with_the_ledgers_scores(study, data_dir, tmp_path):
    result = export_inspect(study, tmp_path / "logs", with_optimisation=True, data_dir=str(data_dir))
    assert not result.skipped and len(result.written) == 3  # the seed session paid for no evaluation
    prompt_dir = study / "bbh__causal_judgement" / "probe" / "seed-0"
    log = inspect_log.read_eval_log(str(tmp_path / "logs" / "bbh__causal_judgement__probe__seed-0__heldout.eval"))
    scored = {d["example_id"]: d["verdict"] for d in _ledger(prompt_dir, "test_scoring")}
    assert len(scored) == 137 and {s.id for s in log.samples} == set(scored)
    task = load_task(TASK, profile=PROFILE, data_dir=str(data_dir))
    examples = {ex.id: ex for ex in task.split("test")}
    final = _ledger(prompt_dir, "final_candidate")[0]["components"]
    for sample in log.samples:
        verdict = scored[sample.id]
        score = sample.scores["heldout"]
        assert score.value == verdict["score"] and score.metadata["dimensions"] == verdict["dimensions"]
        assert score.answer == (None if verdict["output"]["answer"] is None else str(verdict["output"]["answer"]))
        assert sample.output.completion == verdict["output"]["text"]
        assert sample.target == examples[sample.id].target
        rendered = task.benchmark.render(final, examples[sample.id], RunContext())
        assert [(m.role, m.text) for m in sample.messages] == [(m.role, m.content) for m in rendered] + [
            ("assistant", verdict["output"]["text"])]
    metrics = log.results.scores[0].metrics
    assert metrics["task_metric"].value == pytest.approx(RunRecord.load(prompt_dir).test_score)
    assert log.eval.task == f"heldout/{TASK}" and log.eval.task_args["profile"] == PROFILE and log.status == "success"


def test_logs_name_the_worker_model_the_task_and_the_tokens_the_ledger_recorded(study, data_dir, tmp_path):
    export_inspect(study, tmp_path / "logs", with_optimisation=True, data_dir=str(data_dir))
    prompt_dir = study / "bbh__causal_judgement" / "probe" / "seed-0"
    start = _ledger(prompt_dir, "session_start")[0]
    profile_digest = start["manifest"]["profile_sha256"]
    for kind, entry_kind in (("heldout", "test_scoring"), ("optimisation", "evaluation")):
        log = inspect_log.read_eval_log(str(tmp_path / "logs" / f"bbh__causal_judgement__probe__seed-0__{kind}.eval"))
        assert log.eval.model == "test-model" and log.eval.task_id == f"{TASK}@{PROFILE}:{profile_digest[:12]}"
        assert log.eval.packages["heldout"] == start["environment"]["heldout_version"]
        entries, _ = read_entries(prompt_dir / "ledger.jsonl")
        by_seq = {e["seq"]: e["data"]["verdict"]["usage"] for e in entries if e["kind"] == entry_kind}
        recorded = list(by_seq.values())
        assert len(log.samples) == len(recorded) and all(u["prompt_tokens"] > 0 and u["completion_tokens"] > 0
                                                         for u in recorded)
        for sample in log.samples:
            usage, counted = by_seq[sample.metadata["ledger_seq"]], sample.model_usage["test-model"]
            assert (counted.input_tokens, counted.output_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])
            assert sample.output.usage == counted and sample.messages[-1].model == "test-model"
        total = log.stats.model_usage["test-model"]
        assert total.input_tokens == sum(u["prompt_tokens"] for u in recorded)
        assert total.total_tokens == sum(u["prompt_tokens"] + u["completion_tokens"] for u in recorded)
    code = start["environment"]["heldout_code"]
    if code["commit"]:
        assert (log.eval.revision.commit, log.eval.revision.dirty) == (code["commit"], code["dirty"])
    program = inspect_log.read_eval_log(str(tmp_path / "logs" / "lockpicking__six__seed__seed-0__heldout.eval"))
    assert program.eval.model == "none" and program.eval.task_id.startswith("lockpicking/six@default:")
    assert not program.stats.model_usage and not program.samples[0].model_usage  # no worker, no tokens
    again = export_inspect(study, tmp_path / "again", data_dir=str(data_dir))  # an export repeats: ids from the ledger
    assert inspect_log.read_eval_log(str(again.written[0])).eval.eval_id == \
        inspect_log.read_eval_log(str(tmp_path / "logs" / again.written[0].name)).eval.eval_id


def test_optimisation_logs_hold_every_paid_evaluation_with_repeats_as_epochs(study, data_dir, tmp_path):
    export_inspect(study, tmp_path / "logs", with_optimisation=True, data_dir=str(data_dir))
    log = inspect_log.read_eval_log(str(tmp_path / "logs" / "bbh__causal_judgement__probe__seed-0__optimisation.eval"))
    evaluations = _ledger(study / "bbh__causal_judgement" / "probe" / "seed-0", "evaluation")
    assert len(evaluations) == len(log.samples) == 6
    assert sorted(s.epoch for s in log.samples) == [1, 1, 1, 2, 2, 2]
    assert [s.scores["heldout"].value for s in log.samples] == [e["verdict"]["score"] for e in evaluations]
    assert {s.metadata["split"] for s in log.samples} == {"train"}


def test_program_samples_carry_the_candidate_and_the_verdict(study, tmp_path):
    export_inspect(study / "lockpicking__six", tmp_path / "logs")
    log = inspect_log.read_eval_log(str(tmp_path / "logs" / "seed__seed-0__heldout.eval"))
    scored = {d["example_id"]: d["verdict"] for d in _ledger(study / "lockpicking__six" / "seed" / "seed-0", "test_scoring")}
    assert {s.id: s.scores["heldout"].value for s in log.samples} == {i: v["score"] for i, v in scored.items()}
    assert "scorer.sql" in log.samples[0].input[0].text


def test_the_studys_worker_model_names_only_sessions_that_do_not_name_their_own(study, tmp_path):
    """study.json keeps flat keys (config.worker_model): a session_start written before sessions named
    their worker takes the study's; a program session without a worker stays 'none'."""
    copy = tmp_path / "study"
    shutil.copytree(study / "lockpicking__six", copy)
    (copy / "study.json").write_text(json.dumps({"config.worker_model": "study-model"}))
    export_inspect(copy, tmp_path / "logs")
    assert inspect_log.read_eval_log(str(tmp_path / "logs" / "seed__seed-0__heldout.eval")).eval.model == "none"
    entries, _ = read_entries(copy / "seed" / "seed-0" / "ledger.jsonl")
    for key in ("worker", "deployment_worker"):  # a session_start from before sessions named their worker
        del entries[0]["data"][key]
    older = Ledger.open(copy / "seed" / "older")  # written by the real writer, as that session's was
    for entry in entries:
        older.append_entry(entry["kind"], entry["data"])
    older.close()
    assert not export_inspect(copy, tmp_path / "old").skipped
    assert inspect_log.read_eval_log(str(tmp_path / "old" / "seed__older__heldout.eval")).eval.model == "study-model"


def test_a_session_whose_ledger_does_not_verify_is_not_exported(warm_cli, study, tmp_path):
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(study / "lockpicking__six"), str(copy)], check=True)
    ledger = copy / "seed" / "seed-0" / "ledger.jsonl"
    lines = ledger.read_text().splitlines()
    at = max(k for k, line in enumerate(lines) if json.loads(line)["kind"] == "test_scoring")
    entry = json.loads(lines[at])
    entry["data"]["verdict"]["score"] = 1.0  # a better held-out score than was earned
    lines[at] = json.dumps(entry)
    ledger.write_text("\n".join(lines) + "\n")
    done = warm_cli.run("export", "inspect", str(copy), "--out", str(tmp_path / "logs"), cwd=REPO, timeout=120)
    assert done.returncode == 1 and "SKIPPED" in done.stderr and "ledger does not verify" in done.stderr
    assert not list((tmp_path / "logs").glob("*.eval"))


# -- the real `inspect view` serves the logs and its viewer renders them in headless Chromium ------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never an http_proxy from the environment


def _get_json(url: str):
    with _LOOPBACK.open(url, timeout=30) as response:
        return json.load(response)


def _start_view(logs: Path, env: dict[str, str], tmp_path: Path) -> tuple[subprocess.Popen, str]:
    """`inspect view` serving ``logs``, once it answers HTTP; (the process, its base URL). A port
    found free can be taken by another process before the viewer binds it: the viewer then exits
    saying the address is in use, and it is started again on another port."""
    for _ in range(5):
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        with open(tmp_path / "view.out", "w") as out, open(tmp_path / "view.err", "w") as err:
            server = subprocess.Popen([INSPECT, "view", "start", "--host", "127.0.0.1", "--port", str(port),
                                       "--log-dir", str(logs)], cwd=tmp_path, env=env, stdout=out, stderr=err)
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                said = (tmp_path / "view.err").read_text()[-2000:]
                if "address already in use" in (tmp_path / "view.out").read_text() + said:  # uvicorn logs it to stdout
                    break  # lost the port: another try
                pytest.fail(f"inspect view exited {server.returncode}: {said}")
            try:
                with _LOOPBACK.open(base + "/", timeout=5) as response:
                    assert response.status == 200
                return server, base
            except urllib.error.HTTPError:
                server.terminate()
                raise  # it answered, and refused
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() >= deadline:
                    server.terminate()
                    pytest.fail("inspect view did not answer HTTP within 60 s")
                time.sleep(0.25)
    pytest.fail("inspect view lost its port to another process five times")


@pytest.mark.skipif(INSPECT is None, reason="the `inspect` command (inspect-ai) is not on PATH or beside this Python")
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (/usr/bin/chromium absent)")
def test_inspect_view_serves_the_logs_and_its_viewer_renders_one(study, data_dir, tmp_path):
    logs = tmp_path / "logs"
    result = export_inspect(study, logs, with_optimisation=True, data_dir=str(data_dir))
    assert not result.skipped and len(result.written) == 3
    heldout = "bbh__causal_judgement__probe__seed-0__heldout.eval"
    test_score = RunRecord.load(study / "bbh__causal_judgement" / "probe" / "seed-0").test_score
    # `inspect view` keeps state under the user data dir: a pid file per port (which a later view on that port
    # SIGTERMs; SIGTERM leaves it behind) and a trace log; it also reads a .env up from its cwd. All go in tmp_path.
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INSPECT_")}  # e.g. no authorization token
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / "data"), XDG_CACHE_HOME=str(home / "cache"),
               XDG_CONFIG_HOME=str(home / "config"))
    server, base = _start_view(logs, env, tmp_path)
    try:
        # its own API: /api/logs lists the log dir (names are file:// URIs); /api/logs/<name>?header-only=0 returns
        # the log's header alone
        listing = _get_json(base + "/api/logs")
        assert listing["log_dir"] == logs.resolve().as_uri()
        tasks = {Path(urllib.parse.urlparse(f["name"]).path).name: f["task"] for f in listing["files"]}
        assert tasks == {heldout: f"heldout/{TASK}", "bbh__causal_judgement__probe__seed-0__optimisation.eval":
                         f"heldout/{TASK}", "lockpicking__six__seed__seed-0__heldout.eval": "heldout/lockpicking/six"}
        assert sorted(tasks) == sorted(p.name for p in result.written)
        name = next(f["name"] for f in listing["files"] if f["name"].endswith("/" + heldout))
        header = _get_json(f"{base}/api/logs/{urllib.parse.quote(name, safe='')}?header-only=0")
        assert header["eval"]["task"] == f"heldout/{TASK}" and header["status"] == "success"
        assert header["results"]["total_samples"] == 137 and not header.get("samples")
        metrics = header["results"]["scores"][0]["metrics"]
        assert metrics["task_metric"]["value"] == pytest.approx(test_score)

        # the viewer is a hash-routed SPA: #/logs/<file> opens one log. It reads the .eval zip in ranges through
        # /api/log-bytes and decompresses it in a web worker, which virtual time does not wait for: with a 10 s
        # budget the DOM is dumped at "Loading log…" (so is it at 1e6). Its 1 s intervals make virtual time tick
        # by, slowly while the page is busy, fast once it is idle: 2e6 was enough here, 1e8 leaves a wide margin
        # and its idle remainder passes in about half a second of real time.
        done = subprocess.run(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-proxy-server",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=100000000", "--dump-dom",
             f"{base}/#/logs/{heldout}"],
            capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(home)})
        assert done.returncode == 0, done.stderr[-2000:]
        dom = done.stdout
        assert "Loading log" not in dom, dom[-3000:]
        # the log's header rendered: the task title and its metrics, task_metric the ledger's held-out score
        assert re.search(rf'id="task-title"[^>]*>heldout/{re.escape(TASK)}<', dom)
        shown = re.search(r'>task_metric</div><div[^>]*>([0-9.]+)</div>', dom)
        assert shown and float(shown.group(1)) == pytest.approx(test_score, abs=5e-4)
        # ...and its samples: the grid counts the 137 held-out samples it read from the zip
        assert 'role="status" aria-live="polite">137 rows<' in dom
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_a_session_written_before_decoding_had_its_own_field_exports_its_task_options_and_decoding_apart(tmp_path):
    """Before issue 59 a session's ``options`` held the decoding settings a study stated among the
    task options; an export reads such a session as heldout now states it: the task's arguments
    are its task options, and the decoding is its own argument."""
    fixture = Path(__file__).resolve().parent / "fixtures" / "options_with_decoding" / "finished"
    copy = tmp_path / "study" / "old"
    shutil.copytree(fixture, copy)
    result = export_inspect(tmp_path / "study", tmp_path / "logs")
    (log_path,) = [p for p in (tmp_path / "logs").iterdir() if p.name.endswith("__heldout.eval")]
    args = inspect_log.read_eval_log(str(log_path)).eval.task_args
    assert args["options"] == {}
    assert args["decoding"] == {"temperature": 0.5, "max_tokens": 32, "judge_temperature": 0.25,
                                "judge_max_tokens": None}
    assert result.written
