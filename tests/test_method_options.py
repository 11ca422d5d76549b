"""An adapter's settings from the command line (``--method-option NAME.KEY=VALUE``) and from a
study file (a method's ``options``): each key must be a field of that adapter's settings
dataclass and each value of the field's type (and one of its choices, where it lists them),
checked before any session starts, in one line naming the field; the values reach the library
(its run event records the settings it ran with, defaults included) and the run record names
them. The adversary here is a typo: a setting that silently does nothing would make two "tuned"
runs differ by nothing a reader can see."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from heldout import cli
from heldout.adapters.settings import (DSPyGEPASettings, GEPASettings, METHOD_SETTINGS, MIPROSettings,
                                       OpenEvolveSettings, make_settings, setting_value)
from heldout.contracts import HeldoutError
from heldout.evaluators.records import RunRecord
from heldout.models.testserver import TestServer
from heldout.optimizers import REFERENCE_OPTIMIZERS, check_optimizer, resolve_optimizer
from heldout.protocols.study import StudyError, load_study, parse_method_options, parse_methods


def test_every_library_adapter_names_its_settings_and_the_names_are_reference_optimizers():
    assert set(METHOD_SETTINGS) <= set(REFERENCE_OPTIMIZERS)
    assert METHOD_SETTINGS == {"gepa": GEPASettings, "dspy-mipro": MIPROSettings, "dspy-gepa": DSPyGEPASettings,
                               "openevolve": OpenEvolveSettings}


@pytest.mark.parametrize("settings, key, given, taken", [
    (GEPASettings, "use_merge", "true", True),
    (GEPASettings, "use_merge", False, False),
    (GEPASettings, "reflection_minibatch_size", "5", 5),
    (GEPASettings, "max_metric_calls", "none", None),
    (GEPASettings, "max_metric_calls", 40, 40),
    (GEPASettings, "perfect_score", "0.9", 0.9),
    (GEPASettings, "candidate_selection_strategy", "current_best", "current_best"),
    (MIPROSettings, "auto", "light", "light"),
    (MIPROSettings, "auto", "none", None),
    (OpenEvolveSettings, "num_islands", "3", 3),
])
def test_a_value_is_read_as_its_fields_type(settings, key, given, taken):
    assert setting_value(settings, key, given) == taken
    assert getattr(make_settings(settings, {key: given}), key) == taken


@pytest.mark.parametrize("settings, key, given, says", [
    (GEPASettings, "use_merge", "maybe", "use_merge='maybe' of GEPASettings must be bool"),
    (GEPASettings, "reflection_minibatch_size", "-1", "must be int"),
    (GEPASettings, "reflection_minibatch_size", True, "must be int"),
    (GEPASettings, "reflection_minibatch_size", 2.5, "must be int"),
    (GEPASettings, "candidate_selection_strategy", "best", "one of pareto, current_best, epsilon_greedy"),
    (MIPROSettings, "auto", "extreme", "must be str or none, one of none, light, medium, heavy"),
    (OpenEvolveSettings, "cascade_threshold", "high", "must be float"),
    (GEPASettings, "minibatch", "3", "GEPASettings has no setting 'minibatch' (settings: reflection_minibatch_size"),
])
def test_a_value_of_the_wrong_type_or_an_unknown_key_is_one_line_naming_the_field(settings, key, given, says):
    with pytest.raises(HeldoutError) as refused:
        setting_value(settings, key, given)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_method_options_are_checked_typed_and_kept_on_their_method():
    methods = parse_methods(["gepa", "seed"], [])
    gepa, seed = parse_method_options(methods, ["gepa.use_merge=true", "gepa.reflection_minibatch_size=2"])
    assert gepa.options == {"use_merge": True, "reflection_minibatch_size": 2} and seed.options == {}
    assert gepa.describe()["options"] == {"use_merge": True, "reflection_minibatch_size": 2}
    resolved = resolve_optimizer("gepa", gepa.options)
    assert resolved.keywords == {"use_merge": True, "reflection_minibatch_size": 2}


@pytest.mark.parametrize("spec, says", [
    ("gepa.minibatch=3", "optimizer option 'minibatch' is not one of width, stream, program, reflection_minibatch_size"),
    ("gepa.use_merge=sometimes", "must be bool"),
    ("gepa:use_merge=true", "takes NAME.KEY=VALUE"),
    ("mipro.auto=light", "no method named 'mipro' (methods: gepa, seed)"),
    ("seed.width=2", "takes no option width"),  # the seed optimizer has no settings and no width mode
])
def test_a_bad_method_option_is_refused_before_anything_runs(spec, says):
    with pytest.raises(HeldoutError) as refused:
        parse_method_options(parse_methods(["gepa", "seed"], []), [spec])
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_the_spec_form_and_the_study_file_form_are_checked_the_same_way(tmp_path):
    check_optimizer("gepa?candidate_selection_strategy=epsilon_greedy")
    with pytest.raises(HeldoutError, match="one of pareto, current_best, epsilon_greedy"):
        check_optimizer("gepa?candidate_selection_strategy=greedy")
    study = tmp_path / "study.toml"
    body = ('run_dir = "{run}"\ntasks = ["bbh/word_sorting"]\nbudget = 120\n'
            '[[methods]]\nname = "g"\noptimizer = "gepa"\noptions = {{ {options} }}\n')
    study.write_text(body.format(run=tmp_path / "ok", options="reflection_minibatch_size = 2, use_merge = true"))
    (method,) = load_study(study).methods
    assert method.options == {"reflection_minibatch_size": 2, "use_merge": True}
    study.write_text(body.format(run=tmp_path / "bad", options='reflection_minibatch_size = "two"'))
    with pytest.raises((StudyError, HeldoutError), match="reflection_minibatch_size='two' of GEPASettings must be int"):
        load_study(study)
    assert not (tmp_path / "bad").exists()


def test_the_cli_refuses_a_bad_method_option_in_one_line(tmp_path, capsys):
    code = cli.main(["run", "--task", "bbh/word_sorting", "--optimizer", "gepa", "--budget", "20",
                     "--method-option", "gepa.islands=2", "--run-dir", str(tmp_path / "never")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "optimizer option 'islands' is not one of" in err
    assert not (tmp_path / "never").exists()


def run_event(run_dir: Path, kind: str) -> dict:
    entries = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    (event,) = [e["data"]["data"] for e in entries if e["kind"] == "optimizer_event" and e["data"]["kind"] == kind]
    return event


def test_settings_given_on_the_command_line_reach_gepa_and_the_run_record(tmp_path, data_dir):
    pytest.importorskip("gepa", reason="the [gepa] extra is not installed (CI installs it)")
    with TestServer() as server:
        code = cli.main(["-q", "run", "--task", "bbh/word_sorting", "--optimizer", "gepa", "--seeds", "0",
                         "--budget", "102", "--method-option", "gepa.reflection_minibatch_size=1",
                         "--method-option", "gepa.candidate_selection_strategy=current_best",
                         "--worker-model", "test", "--architect-model", "test", "--base-url", server.base_url,
                         "--data-dir", str(data_dir), "--run-dir", str(tmp_path / "study")])
    assert code == 0
    (run_dir,) = [p.parent for p in (tmp_path / "study").rglob("run_record.json")]
    record = RunRecord.load(run_dir)
    assert record.status == "ok", record.error
    chosen = {"reflection_minibatch_size": 1, "candidate_selection_strategy": "current_best"}
    assert record.experiment["optimizer"]["options"] == chosen
    assert run_event(run_dir, "gepa_run")["settings"] == asdict(GEPASettings(**chosen))  # defaults included


PROGRAM = "def build():\n    import dspy\n    return dspy.ChainOfThought('question -> answer')\n"


def test_a_method_option_reaches_a_bring_your_own_dspy_program_which_runs_isolated(tmp_path, monkeypatch, capsys):
    # the user's program makes the method user code (isolated); its settings are flags all the same,
    # checked against the adapter's settings and refused in the flags' words
    (tmp_path / "prog.py").write_text(PROGRAM)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HELDOUT_TRUSTED_OPTIMIZER", raising=False)
    (method,) = parse_method_options(parse_methods(["mine=dspy-gepa?program=prog:build"], []),
                                     ["mine.reflection_minibatch_size=2"])
    assert method.options == {"reflection_minibatch_size": 2}
    code = cli.main(["run", "--task", "bbh/word_sorting", "--budget", "5000", "--optimizer",
                     "mine=dspy-gepa?program=prog:build", "--method-option", "mine.reflection_minibatch_size=2",
                     "--worker-model", "w", "--run-dir", str(tmp_path / "never"), "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0 and "mine" in out, err
    code = cli.main(["run", "--task", "bbh/word_sorting", "--budget", "5000", "--optimizer",
                     "mine=dspy-gepa?program=prog:build", "--method-option", "mine.islands=2",
                     "--worker-model", "w", "--run-dir", str(tmp_path / "never")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--method-option mine" in err and "islands" in err, err
    assert "methods[" not in err and "trusted_optimizer" not in err
    assert not (tmp_path / "never").exists()
