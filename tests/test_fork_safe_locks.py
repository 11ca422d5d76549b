"""A forked child never waits on a lock its parent's other thread held.

MBPP+ checks fork worker processes from the harness (``mbpp_plus/_schedule.py``), and process
pools fork workers. ``fork`` copies a held lock as held and not the thread that would release it:
a child that then asks for it waits for ever, and the harness waits on the child. So every
module-level lock in heldout is replaced in a forked child (``os.register_at_fork``), the rule the
fork-server registry and the cleanup queue already followed."""

from __future__ import annotations

import ast
import importlib
import os
import threading
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "heldout"


def module_level_locks() -> list[tuple[str, str]]:
    """(module, name) of every ``NAME = threading.Lock()`` (or RLock) at a module's top level."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            value = getattr(node, "value", None)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(value, ast.Call) \
                    and ast.unparse(value.func) in ("threading.Lock", "threading.RLock"):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
                found += [(module, t.id) for t in targets if isinstance(t, ast.Name)]
    return found


LOCKS = module_level_locks()


def test_the_scan_finds_the_locks_it_must():
    assert {("heldout.sandbox.root", "_probe_lock"), ("heldout.files", "_process_dirs_lock"),
            ("heldout.sandbox.zygote", "_lock")} <= set(LOCKS)


@pytest.mark.parametrize("module,name", LOCKS, ids=[f"{m}.{n}" for m, n in LOCKS])
def test_a_child_forked_while_another_thread_holds_a_module_lock_gets_it(module, name):
    mod = importlib.import_module(module)
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with getattr(mod, name):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    assert held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: the module's lock as the module now names it
            got = getattr(mod, name).acquire(timeout=2)
            os._exit(0 if got else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join(10)
    assert os.waitstatus_to_exitcode(status) == 0, f"{module}.{name} stays held in a forked child"
