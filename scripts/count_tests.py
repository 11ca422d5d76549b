"""Print the test suite's size, counted by pytest's own collection (so no count is typed by hand):
tests (each parameter set one test), test modules, and how many are marked slow (tests/slow_tests.txt).

    python scripts/count_tests.py                 # the whole suite
    python scripts/count_tests.py tests/test_x.py # any pytest arguments narrow it

Exit 0 with one line; pytest's own exit code when collection fails (a module that does not import).
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


class Collected:
    """Keeps the items after every other hook (the conftest's slow marks included) has run."""

    def __init__(self) -> None:
        self.items: list[pytest.Item] = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.items = list(items)


def counted(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def main(argv: list[str]) -> int:
    collected, listing = Collected(), io.StringIO()
    with contextlib.redirect_stdout(listing):  # pytest's own listing of every test: not what is asked
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO),
                            *(argv or [str(REPO / "tests")])], plugins=[collected])
    if code != 0:
        print(listing.getvalue()[-3000:], end="", file=sys.stderr)
        print(f"count_tests: pytest could not collect the tests (exit {code})", file=sys.stderr)
        return int(code)
    items = collected.items
    slow = sum(1 for item in items if item.get_closest_marker("slow"))
    modules = len({item.nodeid.split("::")[0] for item in items})
    print(f"{counted(len(items), 'test')} in {counted(modules, 'module')}, {slow} marked slow; "
          f"the fast loop (-m 'not slow') runs {len(items) - slow}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
