"""Invariants are raises with a message, never ``assert``: ``python -O`` strips asserts, so a
guard written as one (``assert "test" not in examples``) silently vanishes where it matters."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "heldout"
#: candidate programs heldout ships (the VLIW seed kernels run in the sandbox as a candidate's code)
CANDIDATE_CODE = (PACKAGE / "benchmarks" / "vliw" / "kernels",)


def heldout_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not any(d in p.parents for d in CANDIDATE_CODE)]


def asserts_in(paths: list[Path]) -> list[str]:
    return [f"{p.name}:{node.lineno}" for p in paths
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if isinstance(node, ast.Assert)]


def test_no_module_of_heldout_guards_anything_with_assert() -> None:
    modules = heldout_modules()
    assert len(modules) > 100  # the walk found the package
    found = asserts_in(modules)
    assert not found, f"asserts vanish under python -O; raise with a message instead: {found}"


def test_the_walk_finds_an_assert_nested_in_a_method(tmp_path) -> None:
    (tmp_path / "m.py").write_text("class A:\n    def f(self, x):\n        if x:\n            assert x, 'no'\n")
    assert asserts_in([tmp_path / "m.py"]) == ["m.py:4"]
