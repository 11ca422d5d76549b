"""The house rules of the package, checked by walking every module's imports.

Dependencies point one way: contracts <- sandbox, models, data_manifests <- benchmarks <-
evaluators <- protocols <- reports <- cli. ``optimizers`` and ``adapters`` see the harness only
through the TaskView Protocol in ``contracts`` (a task-specific reference optimizer may use its
task's public helpers in ``benchmarks``). No function-level import of heldout code (that is how a
cycle hides); imports under ``if TYPE_CHECKING:`` are annotations only and allowed. The one exception
is the CLI, the top of the house, which nothing in the package imports: each command imports its
modules when it runs, so ``heldout --help`` does not load numba, scipy and matplotlib. A cycle cannot
hide there, and the test checks that nothing imports the CLI."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "heldout"

LAYER = {"contracts": 0, "files": 0.5, "sandbox": 1, "models": 1, "data_manifests": 1, "benchmarks": 2,
         "evaluators": 3, "protocols": 4, "reports": 5, "cli": 6, "__main__": 7}
"""``heldout.__main__`` (``python -m heldout``) is the one room above the CLI: it only starts it;
``heldout.files`` (reading what users hand heldout, writing atomically) sits on the vocabulary only."""
SIDE = {"optimizers", "adapters"}  # beside the layers, reaching the harness only through contracts
SIDE_MAY_IMPORT = {"contracts", "files", "benchmarks", "models", "optimizers", "adapters"}


def folder_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append((".".join(parts), path))
    return out


def heldout_imports(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "heldout":
            found.append((node, node.module))
        elif isinstance(node, ast.Import):
            found += [(node, a.name) for a in node.names if a.name.split(".")[0] == "heldout"]
    return found


def type_checking_nodes(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for child in node.body for n in ast.walk(child))
    return inside


MODULES = modules()


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_imports_point_one_way(module: str, path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    src = folder_of(module)
    if src == "__init__":
        return  # the public API re-exports everything
    wrong = []
    for node, target in heldout_imports(tree):
        dst = folder_of(target)
        if dst == src or dst == "__init__" and target == "heldout":
            continue
        if src in SIDE:
            if dst not in SIDE_MAY_IMPORT:
                wrong.append(target)
        elif dst in SIDE:
            if src not in ("protocols", "reports", "cli", "evaluators"):
                wrong.append(target)
        elif LAYER.get(dst, 99) >= LAYER.get(src, -1):
            wrong.append(target)
    assert not wrong, f"{module} imports against the direction of dependencies: {sorted(set(wrong))}"


LAZY_IMPORTS_ALLOWED = {"heldout.cli"}  # commands import what they need when they run (start-up time)


def in_the_cli(module: str) -> bool:
    """``heldout.cli`` and its command groups (``heldout.cli.study``, ...)."""
    return any(module == top or module.startswith(top + ".") for top in LAZY_IMPORTS_ALLOWED)


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_no_function_level_imports_of_heldout(module: str, path: Path) -> None:
    if in_the_cli(module):
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level = {id(n) for n in tree.body}
    annotations_only = type_checking_nodes(tree)
    hidden = [f"line {node.lineno}: {target}" for node, target in heldout_imports(tree)
              if id(node) not in top_level and id(node) not in annotations_only]
    assert not hidden, f"{module} imports heldout code inside a function: {hidden}"


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80
LONG_KERNELS = {
    ("heldout.benchmarks.vliw.interpreter", "execute"): "numba: a helper per engine made the kernel 3x-8x slower",
    ("heldout.benchmarks.vliw.marshal_parser", "parse_stream"): "numba: split per level, the parse took 6x longer",
}
"""Functions allowed over the limit, each with the measured reason its own comment gives."""


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_no_module_over_600_lines_and_no_function_over_80(module: str, path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{module}: {len(text.splitlines())} lines"
    long = [f"{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES and (module, node.name) not in LONG_KERNELS]
    assert not long, f"{module}: {long}"


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_nothing_imports_the_cli_so_its_lazy_imports_cannot_hide_a_cycle(module: str, path: Path) -> None:
    if in_the_cli(module) or module == "heldout.__main__":  # the entry point starts the CLI
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert not [t for _, t in heldout_imports(tree) if in_the_cli(t)], f"{module} imports the CLI"


@pytest.mark.parametrize("name", ["contracts.py", "files.py"])
def test_contracts_and_files_need_only_the_standard_library(name: str) -> None:
    tree = ast.parse((PACKAGE / name).read_text(encoding="utf-8"))
    imported = [a for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for a in ([node.module] if isinstance(node, ast.ImportFrom) else [x.name for x in node.names])]
    assert imported, "the walk found no imports at all"
    outside = [a for a in imported if a and a.split(".")[0] not in sys.stdlib_module_names and a != "heldout.contracts"]
    assert not outside, outside
