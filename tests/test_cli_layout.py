"""The CLI's rooms: one module per group of commands, found from the command table, each small
enough to read; the groups reach one another only through ``heldout.cli.shared``."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from heldout.cli.commands import COMMANDS
from heldout.cli.shared import print_json

CLI = Path(__file__).resolve().parents[1] / "heldout" / "cli"
MODULES = sorted(CLI.glob("*.py"))
INFRASTRUCTURE = {"__init__", "__main__", "commands", "dispatch", "shared"}
GROUPS = sorted(path.stem for path in MODULES if path.stem not in INFRASTRUCTURE)

# which heldout.cli modules each infrastructure module may import; a group module may import shared alone
MAY_IMPORT = {"__init__": {"dispatch"}, "__main__": {"__init__"}, "dispatch": {"commands"},
              "commands": {"shared", *GROUPS}, "shared": set()}


def cli_imports(path: Path) -> set[str]:
    """The heldout.cli modules ``path`` imports (``__init__`` for the package itself)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "heldout.cli":
            found |= {alias.name if (CLI / f"{alias.name}.py").exists() else "__init__" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("heldout.cli."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] if a.name.count(".") >= 2 else "__init__"
                      for a in node.names if a.name == "heldout.cli" or a.name.startswith("heldout.cli.")}
    return found


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_a_module_imports_only_the_cli_modules_its_place_allows(path):
    allowed = MAY_IMPORT.get(path.stem, {"shared"})
    assert cli_imports(path) <= allowed, f"heldout/cli/{path.name} imports {sorted(cli_imports(path) - allowed)}"


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c.words) for c in COMMANDS])
def test_a_commands_arguments_and_body_sit_side_by_side_in_one_group_module(command):
    module = command.run.__module__
    assert module == command.add_arguments.__module__, (command.words, module, command.add_arguments.__module__)
    assert module.rsplit(".", 1)[-1] in GROUPS, f"{' '.join(command.words)} runs from {module}, not a group module"


def test_every_group_module_holds_a_command():
    assert {c.run.__module__.rsplit(".", 1)[-1] for c in COMMANDS} == set(GROUPS)


def test_the_checker_sees_every_form_of_importing_a_cli_module(tmp_path):
    """The rule above would pass vacuously if cli_imports missed an import form."""
    probe = tmp_path / "probe.py"
    probe.write_text("from heldout.cli import study\nfrom heldout.cli.results import cmd_report\n"
                     "import heldout.cli.demo\nfrom heldout.cli import main\n")
    assert cli_imports(probe) == {"study", "results", "demo", "__init__"}


def test_global_shell_completion_finds_its_marker_for_the_script_and_for_python_m():
    """argcomplete's global completion reads the marker from the module the console script names
    (heldout.cli's __init__.py) and, for ``python -m heldout.cli``, from the package's __main__.py."""
    check = pytest.importorskip("argcomplete._check_module")
    for path in (check.find("heldout.cli", return_package=True), check.find("heldout.cli")):
        assert "PYTHON_ARGCOMPLETE_OK" in Path(path).read_text(encoding="utf-8")[:1024], path


def test_what_a_command_prints_as_json_is_strict_json(capsys):
    # json.dumps alone writes NaN and -Infinity, which jq and every strict parser refuse
    print_json({"low": float("-inf"), "high": float("inf"), "p": float("nan"), "rows": [(1.5, float("nan"))]})
    printed = capsys.readouterr().out

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    assert json.loads(printed, parse_constant=refuse) == {"low": "-inf", "high": "inf", "p": None, "rows": [[1.5, None]]}
