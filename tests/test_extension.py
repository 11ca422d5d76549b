"""The CLI starts light, and the parser's copied choices stay equal to their modules' constants."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from plugin_site import pip_installed_site, with_site

HEAVY = ("numba", "scipy", "statsmodels", "matplotlib", "datasets", "duckdb")


def _loaded_after(code: str) -> list[str]:
    probe = code + f"\nimport sys\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return [m for m in out.strip().split(",") if m]


def test_importing_the_cli_loads_no_heavy_module():
    assert _loaded_after("import heldout.cli") == []


def test_building_the_parser_for_help_loads_no_heavy_module():
    # `heldout --help` builds the whole parser: its choices must not pull the statistics or reports in
    assert _loaded_after("import heldout.cli.commands as c\nc.build_parser().format_help()") == []


@pytest.mark.parametrize("argv", [["report", "runs/mistyped", "--out", "out"],
                                  ["check", "--baseline", "runs/main", "--current", "runs/mistyped"]])
def test_a_mistyped_run_dir_is_answered_before_the_statistics_load(argv, tmp_path):
    (tmp_path / "runs" / "main").mkdir(parents=True)
    code = ("import sys\nfrom heldout.cli import main\ncode = main(sys.argv[1:])\n"
            f"print(code, ','.join(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.stdout.split() == ["2"] and "run dir runs/mistyped does not exist" in done.stderr, done


@pytest.mark.parametrize("copy,source", [
    ("heldout.cli.study:FIXED_UNITS", "heldout.protocols.arms_plan:FIXED_UNITS"),
    ("heldout.cli.results:DEFAULT_MARGIN", "heldout.protocols.stats.margin:DEFAULT_MARGIN"),
    ("heldout.cli.results:PAPER_FORMATS", "heldout.reports.paper:FORMATS"),
    ("heldout.cli.results:DESIGN_FIELDS", "heldout.reports.check:DESIGN_FIELDS"),
    ("heldout.cli.results:TABLES", "heldout.reports.store:TABLES"),
])
def test_the_parsers_copied_choices_equal_their_source(copy, source):
    import importlib

    def value(where: str):
        module, name = where.split(":")
        return getattr(importlib.import_module(module), name)
    assert value(copy) == value(source)


@pytest.fixture(scope="module")
def broken_plugin_site(tmp_path_factory):
    """A badly made plugin package, installed by pip (read only by the tests): its ``heldout.tasks``
    entry point raises on import, and of its ``heldout.optimizers`` entry points one takes a
    reference name (``seed``), one names a module, not ``module:function`` (``odd``: setuptools
    itself refuses a value that names no object), and one is good (``ok-name``)."""
    return pip_installed_site(
        tmp_path_factory.mktemp("broken-plugin"), "brokenplug",
        {"brokenplug_tasks.py": "raise RuntimeError('this plugin is broken on purpose')\n",
         "brokenplug_search.py": "def optimize(view, seed):\n    return dict(view.seed_candidate)\n"},
        {"heldout.tasks": {"brokenplug": "brokenplug_tasks"},
         "heldout.optimizers": {"seed": "brokenplug_search:optimize", "odd": "brokenplug_search",
                                "ok-name": "brokenplug_search:optimize"}})


def _heldout(site, *argv):
    code = "import sys\nfrom heldout.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=with_site(site),
                          timeout=300)


def test_a_broken_task_plugin_is_skipped_with_a_warning_naming_it_and_the_rest_are_listed(broken_plugin_site):
    result = _heldout(broken_plugin_site, "tasks", "list")
    assert result.returncode == 0, result.stderr
    assert "brokenplug" in result.stderr and "broken on purpose" in result.stderr
    assert "lockpicking/six" in result.stdout


def test_asking_for_a_broken_plugins_task_by_name_still_fails_naming_the_plugin(broken_plugin_site):
    code = ("from heldout.benchmarks.registry import get_benchmark\n"
            "from heldout.contracts import HeldoutError\n"
            "try:\n    get_benchmark('brokenplug/anything')\nexcept HeldoutError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=with_site(broken_plugin_site), timeout=300)
    assert "task plugin 'brokenplug'" in out.stdout and "broken on purpose" in out.stdout, out.stderr


def test_a_study_file_may_name_its_methods_as_plain_strings(tmp_path):
    from heldout.protocols.study import load_study
    plain, table = tmp_path / "plain.toml", tmp_path / "table.toml"
    head = f'run_dir = "{tmp_path / "runs"}"\ntasks = ["lockpicking/six"]\nbudget = 20\n'
    plain.write_text(head + 'methods = ["seed", "local-search"]\n')
    table.write_text(head + '[[methods]]\nname = "seed"\n\n[[methods]]\nname = "local-search"\n')
    assert load_study(plain).resolved() == load_study(table).resolved()
    assert [m.name for m in load_study(plain).methods] == ["seed", "local-search"]


def test_a_plain_method_name_is_checked_like_a_table_name(tmp_path):
    from heldout.protocols.study import StudyError, load_study
    bad = tmp_path / "bad.toml"
    bad.write_text(f'run_dir = "{tmp_path}"\ntasks = ["lockpicking/six"]\nbudget = 5\nmethods = ["seed", "seed", 3]\n')
    with pytest.raises(StudyError, match=r"methods\[2\] must be a table, got 3"):
        load_study(bad)
    bad.write_text(f'run_dir = "{tmp_path}"\ntasks = ["lockpicking/six"]\nbudget = 5\nmethods = ["seed", "seed"]\n')
    with pytest.raises(StudyError, match="unique"):
        load_study(bad)


def _options_without_help(parser, path):
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options_without_help(sub, f"{path} {name}")
        elif not action.help and not isinstance(action, argparse._HelpAction):
            yield f"{path} {'/'.join(action.option_strings) or action.dest}"


def test_every_cli_option_and_argument_has_help_text():
    from heldout.cli.commands import build_parser
    assert list(_options_without_help(build_parser(), "heldout")) == []


PROGRAM_TASK = '''
from heldout.benchmarks.base import Benchmark
from heldout.benchmarks.registry import register
from heldout.contracts import Verdict

class Forgetful(Benchmark):
    name = "forgetful/prog"
    family = "forgetful"
    {kind}
    def run(self, candidate, example, context=None):
        return Verdict(example.id, score=1.0)

try:
    register(Forgetful())
    print("registered", Forgetful.kind)
except ValueError as exc:
    print("refused:", exc)
'''


def test_a_program_task_that_forgets_its_kind_is_refused_at_register_naming_the_fix():
    # in a child: a registered test task must not join this process's registry
    out = subprocess.run([sys.executable, "-c", PROGRAM_TASK.format(kind="")], capture_output=True, text=True)
    assert out.stdout.startswith("refused:"), out.stdout + out.stderr
    assert "'forgetful/prog'" in out.stdout and 'kind = "program"' in out.stdout
    out = subprocess.run([sys.executable, "-c", PROGRAM_TASK.format(kind='kind = "program"')],
                         capture_output=True, text=True)
    assert out.stdout.strip() == "registered program", out.stdout + out.stderr


LIMITED_TASK = PROGRAM_TASK.replace("from heldout.contracts import Verdict",
                                    "from heldout.contracts import RunLimits, Verdict")


def test_a_program_task_whose_wall_limit_binds_before_its_cpu_limit_is_refused_naming_the_fix():
    # a 20 s wall limit for 20 s of CPU fails a correct program on a busy machine: a score that
    # depends on the load. A task on the library's defaults gets the backstop instead.
    chosen = LIMITED_TASK.format(kind='kind = "program"\n    default_limits = RunLimits(wall_seconds=20, cpu_seconds=20)')
    out = subprocess.run([sys.executable, "-c", chosen], capture_output=True, text=True)
    assert out.stdout.startswith("refused:"), out.stdout + out.stderr
    assert "'forgetful/prog'" in out.stdout and "wall_backstop(cpu_seconds)" in out.stdout and "82 s" in out.stdout
    defaults = PROGRAM_TASK.format(kind='kind = "program"') + (
        "from heldout.benchmarks.registry import get_benchmark\n"
        "print(get_benchmark('forgetful/prog').default_limits.wall_seconds)\n")
    out = subprocess.run([sys.executable, "-c", defaults], capture_output=True, text=True)
    assert out.stdout.split() == ["registered", "program", "122.0"], out.stdout + out.stderr


MY_SEARCH = ("from heldout.optimizers.geometry_search import optimize as search\n\n"
             "def optimize(view, seed):\n    return search(view, seed)\n")


def _run_record(run_dir):
    import json
    [path] = run_dir.rglob("run_record.json")
    return json.loads(path.read_text())


@pytest.mark.skipif(__import__("shutil").which("bwrap") is None, reason="bubblewrap is not installed")
def test_an_installed_optimizer_plugin_runs_by_its_name_and_isolated_like_any_user_code(tmp_path):
    site = pip_installed_site(tmp_path, "myopts", {"myopts_search.py": MY_SEARCH},
                              {"heldout.optimizers": {"my-search": "myopts_search:optimize"}})
    run_dir = tmp_path / "study"
    result = _heldout(site, "run", "--task", "circle_packing/square26", "--optimizer", "my-search", "--seeds", "0",
                      "--budget", "6", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr[-2000:]
    record = _run_record(run_dir)
    assert record["status"] == "ok", record.get("error")
    assert record["isolation"].startswith("isolated (bwrap") and record["experiment"]["isolation"] == "isolated"
    assert record["experiment"]["optimizer"]["target"] == "myopts_search:optimize"


def test_a_plugin_may_not_take_a_reference_name_and_one_with_a_bad_target_is_left_out_with_a_warning(
        broken_plugin_site):
    code = ("import warnings\nwarnings.simplefilter('always')\n"
            "from heldout.optimizers import optimizer_target, plugin_optimizers\n"
            "print(optimizer_target('seed'))\nprint(sorted(plugin_optimizers()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=with_site(broken_plugin_site), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["heldout.optimizers.seed:optimize", "['ok-name']"]
    assert "skipped optimizer plugin 'seed': the name is heldout's own" in out.stderr
    assert "skipped optimizer plugin 'odd'" in out.stderr and "is not module:function" in out.stderr


def test_only_heldouts_reference_optimizers_run_in_process_without_trust():
    from heldout.optimizers import is_reference_optimizer
    assert is_reference_optimizer("seed") and is_reference_optimizer("geometry-search?width=2")
    assert not is_reference_optimizer("mine:optimize") and not is_reference_optimizer("mine:optimize?width=2")
    assert not is_reference_optimizer("some-plugin")


def test_the_shell_completes_task_names_after_task_not_file_names(tmp_path):
    pytest.importorskip("argcomplete", reason="the [completion] extra is not installed")
    out = tmp_path / "completions"
    line = "heldout run --task bbh/bool"
    env = dict(os.environ, _ARGCOMPLETE="1", _ARGCOMPLETE_IFS="\n", COMP_LINE=line, COMP_POINT=str(len(line)),
               COMP_TYPE="9", _ARGCOMPLETE_STDOUT_FILENAME=str(out))
    (tmp_path / "bbh-bool-file.txt").write_text("a file the old completion offered")
    done = subprocess.run([sys.executable, "-m", "heldout.cli"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert out.read_text().split() == ["bbh/boolean_expressions"]
