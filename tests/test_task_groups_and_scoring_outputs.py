"""Task groups and globs expand to the right task lists; `heldout score` on a file of outputs gives
the same verdicts as the same outputs scored inside a session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heldout.benchmarks.bbh import SEPO_TASKS, TASKS as BBH_TASKS
from heldout.benchmarks.registry import UnknownTask, expand_tasks, task_groups
from heldout.evaluators.session import Session
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient
from heldout.models.testserver import TestServer

REPO = Path(__file__).resolve().parents[1]


def test_families_groups_globs_and_kinds_expand():
    assert expand_tasks(["bbh"]) == sorted(f"bbh/{t}" for t in BBH_TASKS) and len(BBH_TASKS) == 27
    assert expand_tasks(["bbh/sepo"]) == [f"bbh/{t}" for t in SEPO_TASKS] and len(SEPO_TASKS) == 8
    assert len(expand_tasks(["mmlu_pro/*"])) == 14
    program = expand_tasks(["program"])
    assert "vliw/takehome" in program and "lockpicking/six" in program and "gsm_hard" not in program
    assert expand_tasks(["gsm_hard", "gsm_hard", "circle_packing"]) == [
        "gsm_hard", "circle_packing/rect21", "circle_packing/square26"]
    assert {"bbh", "bbh/sepo", "program", "prompt"} <= set(task_groups())


@pytest.mark.parametrize("pattern", ["nope", "bbh/nope", "mmlu_pro/zz*"])
def test_an_unknown_pattern_is_a_clear_error(pattern):
    with pytest.raises(UnknownTask, match="heldout tasks list"):
        expand_tasks([pattern])


def test_score_a_file_of_outputs_like_a_session_does(warm_cli, tmp_path, data_dir):
    with TestServer() as server:
        session = Session("gsm_hard", profile="default", budget=12, run_dir=tmp_path / "run",
                          models=SessionModels(worker=ModelClient("test", base_url=server.base_url)), data_dir=str(data_dir))
        ids = [ex["id"] for ex in session.view.val[:12]]
        session.view.evaluate(session.view.seed_candidate, "val", ids)
    entries = [json.loads(line) for line in (tmp_path / "run" / "ledger.jsonl").read_text().splitlines()]
    evaluations = {e["data"]["example_id"]: e["data"]["verdict"] for e in entries if e["kind"] == "evaluation"}
    outputs = tmp_path / "outputs.jsonl"
    outputs.write_text("".join(json.dumps({"id": i, "output": v["output"]["text"]}) + "\n"
                               for i, v in evaluations.items()))
    done = warm_cli.run("score", "--task", "gsm_hard", "--outputs", str(outputs), "--split", "val", "--data-dir",
                        str(data_dir), "--json", cwd=REPO)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["n"] == 12 and summary["missing"] == len(session.task.split("val")) - 12
    assert {v["id"]: v["score"] for v in summary["verdicts"]} == {i: v["score"] for i, v in evaluations.items()}
    assert summary["score"] == pytest.approx(sum(v["score"] for v in evaluations.values()) / 12)


def test_outputs_for_ids_outside_the_split_are_refused(warm_cli, tmp_path, data_dir):
    outputs = tmp_path / "outputs.jsonl"
    outputs.write_text(json.dumps({"id": "no-such-id", "output": "So the answer is 3."}) + "\n")
    done = warm_cli.run("score", "--task", "gsm_hard", "--outputs", str(outputs), "--data-dir", str(data_dir), cwd=REPO)
    assert done.returncode == 2 and "not in split 'val'" in done.stderr


def test_tasks_list_json_names_each_tasks_groups_as_the_text_listing_does(capsys):
    from heldout import cli

    assert cli.main(["tasks", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    groups = task_groups()
    for row in rows:  # every group a task belongs to, and no other
        assert row["groups"] == [g for g, members in groups.items() if row["name"] in members], row["name"]
    assert {g for row in rows for g in row["groups"]} == set(groups)
    assert cli.main(["tasks", "list"]) == 0
    text = capsys.readouterr().out
    assert all(f"  {g:<18}" in text for g in groups)
