"""`heldout demo --protocol`: the generalisation-first protocol for reflective and gepa on the
shipped mmlu_pro/business [cpu-demo] profile, wired end to end. The real model is measured by
perf/demo_protocol.py; here the loopback test double stands in for it (--base-url), so the test
checks the wiring: both protocols run, both reports and every ledger exist, and the closing lines
say what such a demo can and cannot show, with its numbers."""

from __future__ import annotations

import json
import shutil

import pytest

from heldout import cli
from heldout.models.testserver import TestServer

pytest.importorskip("gepa", reason="the [gepa] extra is not installed (pip install 'heldout[gepa]')")


@pytest.fixture(scope="module")
def demo(data_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("demo") / "protocol"
    with TestServer(seed=0) as server:
        code = cli.main(["-q", "demo", "--protocol", "--base-url", server.base_url, "--worker-model", "test-model",
                         "--run-dir", str(run_dir), "--data-dir", str(data_dir)])
    return code, run_dir


def test_the_protocol_demo_runs_both_optimizers_and_writes_both_reports(demo, capsys):
    code, run_dir = demo
    assert code == 0
    for name in ("reflective", "gepa"):
        result = json.loads((run_dir / name / "report" / "generalisation.json").read_text())
        assert result["split"]["proven"] and result["spec"]["task"] == "mmlu_pro/business"
        assert [g["seed"] for g in result["comparison"]["per_seed"]] == [0, 1, 2]
        assert (run_dir / name / "report" / "report.html").is_file()
    assert cli.main(["ledger", "verify", str(run_dir)]) == 0


def test_the_protocol_demo_says_what_a_small_model_can_and_cannot_show(demo, data_dir, tmp_path, capsys):
    # the same command again continues the finished study: nothing is rerun, the summary is printed again
    # (on a copy of the module's finished demo: running it afresh here cost a second demo, 10 CPU-s)
    shutil.copytree(demo[1], tmp_path / "again")
    with TestServer(seed=0) as server:
        args = ["demo", "--protocol", "--base-url", server.base_url, "--worker-model", "test-model",
                "--run-dir", str(tmp_path / "again"), "--data-dir", str(data_dir)]
        assert cli.main(["-q", *args]) == 0
        capsys.readouterr()
        assert cli.main(["-q", *args]) == 0
    out = capsys.readouterr().out
    assert out.count("what a model this small can show: the seed prompt scores") == 2
    assert "chance with 10 options: 0.100" in out and "separates a true mean difference of" in out
    assert "worker and architect: test-model at" in out


@pytest.mark.parametrize("extra, says", [(["--real-model"], "two demos"),
                                         (["--base-url", "http://127.0.0.1:9/v1"], "go together")])
def test_protocol_demo_options_that_do_not_fit_are_one_clear_line(extra, says, tmp_path, capsys):
    assert cli.main(["demo", "--protocol", "--run-dir", str(tmp_path / "d"), *extra]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and not (tmp_path / "d").exists()
