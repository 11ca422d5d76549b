"""Study files: a TOML file and the `heldout run` flags that say the same thing give the same cells;
the resolved study round-trips; a bad key is a one-line error naming it; --dry-run spends nothing;
a study runs, saves its resolved file, and refuses to be mixed with a different study."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from heldout.benchmarks.bbh import SEPO_TASKS
from heldout.cli.commands import build_parser
from heldout.cli.study import study_from_flags
from heldout.cli import main as cli_main
from heldout.data_manifests import MANIFEST_PATH_ENV, Manifest, manifest_holding
from heldout.evaluators.records import RunRecord
from heldout.protocols.study import (
    StudyError,
    find_resolved_studies,
    load_study,
    parse_study,
    read_resolved,
    save_resolved,
    to_toml,
)

REPO = Path(__file__).resolve().parents[1]

FLAGS = ["run", "--task", "bbh/sepo", "--task", "bbh/navigate", "--budget", "40", "--budget", "bbh/navigate=60",
         "--seeds", "0,1,2", "--optimizer", "seed", "--optimizer", "refl=reflective",
         "--optimizer-cmd", "mine=python my_opt.py", "--profile", "default", "--verifier", "scalar",
         "--prompt-format", "cot_3shot", "--policy", "standard", "--worker-model", "w", "--architect-model", "a",
         "--base-url", "http://127.0.0.1:9/v1", "--architect-tokens", "5000", "--wall-seconds", "600",
         "--jobs", "2"]

SAME_AS_FILE = """
tasks = ["bbh/sepo", "bbh/navigate"]
seeds = [0, 1, 2]
verifiers = ["scalar"]
prompt_format = "cot_3shot"
policy = "standard"

[budget]
default = 40
"bbh/navigate" = 60

[limits]
architect_tokens = 5000
wall_seconds = 600

[models]
worker = "w"
architect = "a"
base_url = "http://127.0.0.1:9/v1"

[executor]
jobs = 2

[[methods]]
name = "seed"

[[methods]]
name = "refl"
optimizer = "reflective"

[[methods]]
name = "mine"
command = "python my_opt.py"
"""


def _cells(study):
    return [(c.task, c.profile, c.method, c.seed, c.budget, c.verifier, c.options, c.run_dir(study.run_dir))
            for c in study.cells()]


def _flags_study(run_dir: Path, *extra: str):
    return study_from_flags(build_parser().parse_args([*FLAGS, "--run-dir", str(run_dir), *extra]))


def test_flags_and_a_study_file_give_the_same_cells(tmp_path):
    file = tmp_path / "study.toml"
    file.write_text(f'run_dir = "{tmp_path / "runs"}"\n' + SAME_AS_FILE)
    from_file, from_flags = load_study(file), _flags_study(tmp_path / "runs")
    assert _cells(from_file) == _cells(from_flags)
    assert asdict(from_file.config) == asdict(from_flags.config) and from_file.executor == from_flags.executor == {"kind": "local", "jobs": 2, "cell_cpus": None}
    # 9 tasks x 3 methods x 3 seeds, the SEPO eight at 40 calls and navigate at 60
    assert len(from_file.cells()) == 81
    assert from_file.budgets == {**{f"bbh/{t}": 40 for t in SEPO_TASKS}, "bbh/navigate": 60}
    assert from_file.total_metric_calls() == 9 * (8 * 40 + 60)
    assert all(c.options == {"prompt_format": "cot_3shot"} for c in from_file.cells())


def test_the_resolved_study_round_trips_and_states_every_default(tmp_path):
    study = _flags_study(tmp_path / "runs")
    resolved = tmp_path / "resolved.toml"
    resolved.write_text(to_toml(study))
    again = load_study(resolved)
    assert _cells(again) == _cells(study) and asdict(again.config) == asdict(study.config)
    data = again.resolved()
    assert data["tasks"] == [f"bbh/{t}" for t in SEPO_TASKS] + ["bbh/navigate"]  # groups expanded
    assert data["profiles"] == ["default"] and data["budget"]["bbh/navigate"] == 60
    assert data["methods"][0] == {"name": "seed", "optimizer": "seed"}


def test_two_profiles_keep_their_sessions_apart(tmp_path):
    study = parse_study({"run_dir": str(tmp_path), "tasks": ["bbh/causal_judgement"],
                         "profiles": ["default", "sepo"], "budget": 5, "methods": [{"name": "seed"}]})
    dirs = [c.run_dir(config.run_root) for config, cells in study.groups() for c in cells]
    assert dirs == [tmp_path / "profile-default" / "bbh__causal_judgement" / "seed" / "seed-0",
                    tmp_path / "profile-sepo" / "bbh__causal_judgement" / "seed" / "seed-0"]


BASE = {"run_dir": "r", "tasks": ["lockpicking/six"], "budget": 5, "methods": [{"name": "seed"}]}


@pytest.mark.parametrize("change, named", [
    ({"seedz": [0]}, "'seedz'"),
    ({"methods": [{"name": "seed", "optimzer": "seed"}]}, "'methods[0].optimzer'"),
    ({"models": {"worker_model": "x"}}, "'models.worker_model'"),
    ({"limits": {"tokens": 5}}, "'limits.tokens'"),
    ({"options": {"tolerence": 0.1}}, "'options.tolerence'"),
    ({"executor": {"kind": "slurm"}}, "executor.kind"),
    ({"budget": "lots"}, "budget must be"),
    ({"budget": {"default": True}}, "budget.'default' must be an integer"),
    ({"budget": {"nope/task": 3}}, "budget.'nope/task'"),
    ({"budget": {"circle_packing/square26": 3}}, "no budget for lockpicking/six"),
    ({"seeds": [0, 0]}, "seeds repeats"),
    ({"seeds": ["0"]}, "seeds[0] must be an integer"),
    ({"tasks": ["mmlu_pro/zz*"]}, "tasks:"),
    ({"profiles": ["nope"]}, "profiles: lockpicking/six has no profile 'nope'"),
    ({"verifiers": ["coarse:x"]}, "verifiers: 'coarse:x'"),
    ({"policy": "open"}, "policy 'open'"),
    ({"methods": [{"name": "a", "command": "x", "optimizer": "seed"}]}, "methods[0] has both"),
    ({"methods": [{"name": "a", "command": "x", "options": {"k": 1}}]}, "methods[0].options"),
    ({"methods": [{"name": "a"}, {"name": "a"}]}, "unique"),
    ({"methods": [{"optimizer": "seed"}]}, "'methods[0].name'"),
])
def test_a_bad_key_is_a_one_line_error_naming_it(change, named):
    with pytest.raises(StudyError) as err:
        parse_study({**BASE, **change}, origin="s.toml")
    message = str(err.value)
    assert named in message and message.startswith("s.toml: ") and "\n" not in message


def test_a_user_manifest_that_adds_a_profile_hides_no_shipped_one(tmp_path, monkeypatch, capsys):
    """A manifest on $HELDOUT_MANIFEST_PATH adding a profile to a shipped task: a study names the
    shipped profiles and the new one, and whatever reads a profile's sizes reads them from the
    manifest that holds it (it used to read the first manifest found, which lacked them)."""
    shipped = Manifest.load("lockpicking/six")
    root = tmp_path / "manifests"
    replace(shipped, profiles={"mine": shipped.profiles["paper"]}, notes={}, profile_digests={}).save(root)
    monkeypatch.setenv(MANIFEST_PATH_ENV, str(root))
    assert manifest_holding("lockpicking/six", "generalise").sizes("generalise") == shipped.sizes("generalise")
    assert manifest_holding("lockpicking/six", "mine").path == root / "lockpicking" / "six.json"
    parse_study({**BASE, "profiles": ["generalise", "mine"]}, origin="s.toml")
    with pytest.raises(StudyError, match=r"has no profile 'nope' \(it has .*generalise, mine, paper"):
        parse_study({**BASE, "profiles": ["nope"]}, origin="s.toml")
    assert cli_main(["tasks", "list", "--json"]) == 0  # the list shows what a study may name
    listed = next(row for row in json.loads(capsys.readouterr().out) if row["name"] == "lockpicking/six")
    assert set(listed["profiles"]) == set(shipped.profiles) | {"mine"}


def test_a_missing_key_or_bad_toml_is_named(tmp_path):
    with pytest.raises(StudyError, match="missing key 'methods'"):
        parse_study({k: v for k, v in BASE.items() if k != "methods"})
    bad = tmp_path / "bad.toml"
    bad.write_text("tasks = [\n")
    with pytest.raises(StudyError, match="bad.toml is not valid TOML"):
        load_study(bad)


def test_dry_run_prints_every_cell_and_the_total_and_spends_nothing(warm_cli, tmp_path):
    file = tmp_path / "study.toml"
    file.write_text(f'run_dir = "{tmp_path / "runs"}"\n' + SAME_AS_FILE)
    done = warm_cli.run("run", str(file), "--dry-run", cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 + 81 + 1
    assert lines[-1].startswith(f"81 cell(s); total budget {9 * (8 * 40 + 60)} metric calls, 405000 architect tokens")
    assert any("bbh/navigate" in line and "mine" in line and "seed-2" in line for line in lines)
    assert not (tmp_path / "runs").exists()
    mixed = warm_cli.run("run", str(file), "--task", "gsm_hard", cwd=REPO, timeout=120)
    assert mixed.returncode == 2 and "drop --task" in mixed.stderr


def test_a_study_runs_saves_its_resolved_file_and_refuses_another_study(warm_cli, tmp_path):
    runs = tmp_path / "runs"
    file = tmp_path / "study.toml"
    study = (f'run_dir = "{runs}"\ntasks = ["lockpicking/six"]\nbudget = 100\n'
             '[[methods]]\nname = "seed"\n'
             # method options are the optimizer's keyword arguments, checked before anything runs
             '[[methods]]\nname = "wide"\noptimizer = "local-search"\noptions = {{ {options} }}\n')
    file.write_text(study.format(options="bogus = 1"))
    done = warm_cli.run("run", str(file), "--json", cwd=REPO, timeout=300)
    assert done.returncode == 2 and "option 'bogus' is not one of" in done.stderr and not runs.exists(), done.stderr
    file.write_text(study.format(options="width = 2"))
    done = warm_cli.run("run", str(file), "--json", cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    results = {r["method"]: r for r in json.loads(done.stdout)}
    assert results["seed"]["status"] == "ok" and results["wide"]["status"] == "ok"
    assert RunRecord.load(results["wide"]["run_dir"]).experiment["optimizer"]["options"] == {"width": 2}
    saved = read_resolved(runs)
    assert saved["methods"][1] == {"name": "wide", "optimizer": "local-search", "options": {"width": 2}}
    assert find_resolved_studies([runs / "lockpicking__six"]) == [((runs / "study.toml").resolve(), saved)]
    other = load_study(file)
    other.seeds = [7]
    with pytest.raises(StudyError, match="holds a different study"):
        save_resolved(other)
    rerun = load_study(runs / "study.toml")  # the saved file reruns the same study (all cells done)
    assert _cells(rerun) == _cells(load_study(file))


def test_shell_completion_completes_subcommands_and_flags(tmp_path):
    pytest.importorskip("argcomplete", reason="the [completion] extra (argcomplete) is not installed")
    script = subprocess.run([sys.executable, "-m", "heldout.cli", "completion", "bash"], capture_output=True,
                            text=True, cwd=REPO, timeout=120)
    assert script.returncode == 0 and "complete " in script.stdout and "heldout" in script.stdout
    answers = tmp_path / "completions"
    line = "heldout run --dry"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(answers), "_ARGCOMPLETE_IFS": "\n"}
    subprocess.run([sys.executable, "-m", "heldout.cli"], env=env, cwd=REPO, timeout=120, capture_output=True)
    assert answers.read_text().split() == ["--dry-run"]


def test_quiet_and_verbose_are_a_top_level_pair(warm_cli, tmp_path):
    parser = build_parser()
    assert parser.parse_args(["-q", "tasks", "list"]).verbosity == -1
    assert parser.parse_args(["--verbose", "tasks", "list"]).verbosity == 1
    assert parser.parse_args(["tasks", "list"]).verbosity == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["-q", "-v", "tasks", "list"])
    bad = tmp_path / "bad.toml"
    bad.write_text('run_dir = "r"\ntasks = ["lockpicking/six"]\nbudget = 3\nmethodz = []\n')
    loud = warm_cli.run("-v", "run", str(bad), "--dry-run", cwd=REPO, timeout=120)
    plain = warm_cli.run("run", str(bad), "--dry-run", cwd=REPO, timeout=120)
    assert loud.returncode == plain.returncode == 2
    assert plain.stderr.strip().splitlines() == [f"heldout: error: {bad}: unknown key 'methodz' (allowed: "
                                                 + plain.stderr.split("(allowed: ", 1)[1].strip()]
    assert "Traceback" in loud.stderr and "Traceback" not in plain.stderr
