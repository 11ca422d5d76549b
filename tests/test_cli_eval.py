"""`heldout eval`: prompt tasks with a worker, val by default, test only when asked and then
without targets unless asked."""

from __future__ import annotations

import json

import pytest

from heldout.cli import main
from heldout.contracts import wall_backstop
from heldout.models.testserver import TestServer


@pytest.fixture(scope="module")
def server():
    with TestServer(latency=0.0, seed=0) as srv:
        yield srv


def test_eval_scores_a_prompt_task_through_the_worker_on_val_by_default(server, data_dir, capsys):
    assert main(["eval", "--task", "hotpotqa/distractor", "--profile", "default", "--data-dir", str(data_dir),
                 "--worker-model", "test-worker", "--base-url", server.base_url, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["split"] == "val" and out["n"] > 0 and out["worker"]["model"] == "test-worker"
    assert 0.0 <= out["score"] <= 1.0


def test_eval_of_a_prompt_task_without_a_worker_says_what_to_pass(data_dir, capsys):
    assert main(["eval", "--task", "hotpotqa/distractor", "--data-dir", str(data_dir)]) == 2
    assert "--worker-model" in capsys.readouterr().err


def test_eval_on_test_prints_no_targets_unless_asked(capsys):
    # (exit 1 would only mean the seed's summary carries an error; the printing rule is the point)
    assert main(["eval", "--task", "lockpicking/six", "--split", "test"]) in (0, 1)
    hidden = capsys.readouterr().out
    assert "split: test" in hidden and "--show-targets" in hidden and "--- " not in hidden
    assert main(["eval", "--task", "lockpicking/six", "--split", "test", "--show-targets"]) in (0, 1)
    shown = capsys.readouterr().out
    assert "--- " in shown and "expected" in shown.lower()


def test_eval_defaults_to_train_when_the_profile_has_no_val(capsys):
    assert main(["eval", "--task", "lockpicking/six", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["split"] == "train"


def test_eval_limits_a_program_by_cpu_time_with_the_wall_clock_as_its_backstop(capsys):
    # a wall-clock limit would make the verdict depend on how busy the machine is
    assert main(["eval", "--task", "lockpicking/six", "--cpu-seconds", "5", "--json"]) == 0
    limits = json.loads(capsys.readouterr().out)["limits"]
    assert limits["cpu_seconds"] == 5 and limits["wall_seconds"] == wall_backstop(5) == 22
    with pytest.raises(SystemExit) as exited:  # no wall-clock limit to set any more
        main(["eval", "--task", "lockpicking/six", "--wall-seconds", "5"])
    assert exited.value.code == 2
