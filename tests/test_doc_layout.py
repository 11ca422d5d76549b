"""What the docs say about the code's shape is read off the tree, not typed and left to rot.

- DESIGN.md's layout names every module of ``heldout/`` and nothing that does not exist: each entry
  of ``heldout/`` (a ``.py`` file or a package folder) is a line of its own, and a package's
  description names each of its modules as ``name.py`` and each of its packages as ``name/``.
  Written that way, and only that way, a name in the layout can be checked against the tree.
- The README quotes no test count: ``scripts/count_tests.py`` prints the suite's size from pytest's
  own collection.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from doc_blocks import ROOT

LAYOUT = re.compile(r"^## Layout\n\n```\n(?P<body>heldout/\n.*?)^```$", re.S | re.M)
ENTRY = re.compile(r"^  (?P<name>[\w.]+/?)(?:\s+(?P<what>.*))?$")
NAMED = re.compile(r"(?<![\w./<-])(?P<name>[A-Za-z_]\w*(?:\.py\b|/))")


def layout(design: str) -> dict[str, str]:
    """{entry of heldout/ (``name.py`` or ``name/``): its description, continuation lines included}."""
    match = LAYOUT.search(design)
    assert match, "DESIGN.md has no ## Layout block starting with heldout/"
    entries: dict[str, str] = {}
    current = None
    for line in match["body"].splitlines()[1:]:
        if (entry := ENTRY.match(line)) and not line.startswith("   "):
            current = entry["name"]
            entries[current] = entry["what"] or ""
        elif line.startswith("   ") and current is not None:
            entries[current] += " " + line.strip()
        else:
            current = None  # the lines after heldout/'s (tests/ perf/ ...) are not checked
    return entries


def is_package(path: Path) -> bool:
    return path.is_dir() and (path / "__init__.py").is_file()


def modules(folder: Path, top: bool = False) -> set[str]:
    """What a layout must name in ``folder``: its modules and packages (``__init__.py`` only with ``top``;
    a package's may be named, as what exists)."""
    files = {p.name for p in folder.glob("*.py") if top or p.name != "__init__.py"}
    return files | {p.name + "/" for p in folder.iterdir() if is_package(p)}


def disagreements(design: str, package: Path) -> list[str]:
    """Every module the layout leaves out and every name it gives that the tree does not have."""
    entries, problems = layout(design), []
    for missing in sorted(modules(package, top=True) - set(entries)):
        problems.append(f"heldout/{missing} is not in the layout")
    for phantom in sorted(set(entries) - modules(package, top=True)):
        problems.append(f"the layout's heldout/{phantom} does not exist")
    for entry, what in entries.items():
        if not entry.endswith("/"):
            continue
        named = {m["name"] for m in NAMED.finditer(what)}
        problems += [f"heldout/{entry}{name} is not named in the layout"
                     for name in sorted(modules(package / entry) - named)]
        problems += [f"the layout names heldout/{entry}{name}, which does not exist"
                     for name in sorted(named - modules(package / entry, top=True))]
    return problems


def test_design_layout_names_every_module_of_the_tree_and_nothing_else():
    problems = disagreements((ROOT / "docs/DESIGN.md").read_text(encoding="utf-8"), ROOT / "heldout")
    assert problems == [], "docs/DESIGN.md's layout and heldout/ disagree:\n" + "\n".join(problems)


def test_the_layout_check_finds_a_left_out_module_and_a_phantom_one(tmp_path):
    package = tmp_path / "heldout"
    (package / "sandbox").mkdir(parents=True)
    for name in ("__init__.py", "contracts.py", "sandbox/__init__.py", "sandbox/launcher.py", "sandbox/monitor.py"):
        (package / name).write_text("")
    design = ("## Layout\n\n```\nheldout/\n  __init__.py   the API\n  contracts.py  values\n"
              "  sandbox/      launcher.py (start),\n                process.py (gone)\n  cli.py        moved\n"
              "tests/  perf/\n```\n")
    assert disagreements(design, package) == [
        "the layout's heldout/cli.py does not exist",
        "heldout/sandbox/monitor.py is not named in the layout",
        "the layout names heldout/sandbox/process.py, which does not exist"]


def test_the_readme_types_no_test_count_and_names_the_command_that_prints_it():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    typed = re.findall(r"\b\d[\d,.]*\s+(?:tests|test functions|test modules)\b", readme)
    assert typed == [], f"README types test counts by hand: {typed}; quote scripts/count_tests.py instead"
    assert "python scripts/count_tests.py" in readme


def test_count_tests_prints_what_pytest_collects():
    # tests/test_doc_layout.py: its own tests, none parametrized, the slow ones listed in
    # tests/slow_tests.txt; test_demo.py: one slow test
    own = len(re.findall(r"^def test_", Path(__file__).read_text(encoding="utf-8"), re.M))
    listed = (ROOT / "tests" / "slow_tests.txt").read_text(encoding="utf-8").splitlines()
    own_slow = sum(line.startswith("tests/test_doc_layout.py::") for line in listed)
    done = subprocess.run([sys.executable, str(ROOT / "scripts/count_tests.py"), __file__, str(ROOT / "tests/test_demo.py")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == (f"{own + 1} tests in 2 modules, {own_slow + 1} marked slow; "
                           f"the fast loop (-m 'not slow') runs {own - own_slow}\n")


def test_count_tests_fails_loudly_when_a_module_does_not_import(tmp_path):
    broken = tmp_path / "test_broken.py"
    broken.write_text("import a_module_that_is_not_there\n")
    done = subprocess.run([sys.executable, str(ROOT / "scripts/count_tests.py"), str(broken)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode != 0 and done.stdout == "" and "could not collect" in done.stderr
