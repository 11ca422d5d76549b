"""The sandbox's rooms: one execution reads top-down (process -> monitor -> launcher ->
zygote/cgroups/root), the launcher makes every zygote and cgroup call an execution needs, there is
one kill sequence, and each module is small enough to read."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from heldout.contracts import RunLimits
from heldout.sandbox import process, run_calls, zygote

SANDBOX = Path(__file__).resolve().parents[1] / "heldout" / "sandbox"
MODULES = sorted(SANDBOX.glob("*.py"))
# what each module may take from the other sandbox modules (module -> names; "*": any name). The
# child-side sources (_child, _spare, _zygote) are never imported: they run inside the sandbox.
MAY_TAKE = {
    "__init__": {"monitor": {"decode_typed", "wall_backstop"}, "process": {"*"}},
    # the isolation level is the harness's policy, not an execution's: the one cgroup and root name
    "process": {"launcher": {"*"}, "monitor": {"*"}, "cgroups": {"limits_level"}, "root": {"probe_bwrap"}},
    "monitor": {"launcher": {"Launched"}},  # the type of what it watches
    "launcher": {"zygote": {"*"}, "cgroups": {"*"}, "root": {"*"}, "cleanup": {"*"}},
    "zygote": {"cgroups": {"*"}, "root": {"*"}, "cleanup": {"*"}, "control": {"ControlChannel", "GroupStock"}},
    "control": {"cgroups": {"RunGroup"}, "cleanup": {"after_run"}},  # talking to a zygote, and its stocked groups
}


def sandbox_names(path: Path) -> dict[str, set[str]]:
    """The names ``path`` takes from each heldout.sandbox module, by module (``*`` for the module
    itself, imported whole)."""
    taken: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("heldout.sandbox."):
            taken.setdefault(node.module.split(".")[2], set()).update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "heldout.sandbox":
            for alias in node.names:
                taken.setdefault(alias.name, set()).add("*")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("heldout.sandbox."):
                    taken.setdefault(alias.name.split(".")[2], set()).add("*")
    return taken


def _allowed(module: str, source: str, names: set[str]) -> bool:
    allowed = MAY_TAKE.get(module, {}).get(source, set())
    return "*" in allowed or names <= allowed


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_a_module_takes_from_the_sandbox_only_what_its_place_allows(path):
    wrong = {source: sorted(names) for source, names in sandbox_names(path).items()
             if not _allowed(path.stem, source, names)}
    assert not wrong, f"heldout/sandbox/{path.name} takes {wrong}"


def _signals_process_groups(path: Path) -> bool:
    """Whether ``path`` names ``os.killpg`` (a kill sequence typed out) anywhere."""
    return any(isinstance(node, ast.Attribute) and node.attr == "killpg"
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def test_the_harness_kills_a_run_through_one_sequence():
    """RunGroup.kill_run is the one kill sequence: no other harness module of the sandbox, nor the
    isolated optimizer, types it again (the child-side programs kill inside the sandbox)."""
    harness = [p for p in MODULES if not p.stem.startswith("_")] + [SANDBOX.parent / "evaluators" / "isolated.py"]
    typed_out = [p.name for p in harness if _signals_process_groups(p)]
    assert typed_out == ["cgroups.py"]


def test_the_checkers_see_every_form_of_import_and_of_a_typed_out_kill(tmp_path):
    """The rules above would pass vacuously if the checkers missed a form."""
    probe = tmp_path / "probe.py"
    probe.write_text("from heldout.sandbox import zygote\nfrom heldout.sandbox.cgroups import RunGroup\n"
                     "import heldout.sandbox.root\nimport os\nos.killpg(1, 9)\n")
    assert sandbox_names(probe) == {"zygote": {"*"}, "cgroups": {"RunGroup"}, "root": {"*"}}
    assert not _allowed("monitor", "cgroups", {"RunGroup"}) and not _allowed("process", "zygote", {"*"})
    assert _signals_process_groups(probe)


def test_the_zygotes_program_is_the_child_a_spare_and_the_loop_in_that_order():
    """One program: _spare's module-level code uses _child's names, and _zygote's last line runs
    the loop, which every function before it must already be defined for."""
    order = [zygote.SOURCE.index((SANDBOX / name).read_text(encoding="utf-8"))
             for name in ("_child.py", "_spare.py", "_zygote.py")]
    assert order == sorted(order)
    compile(zygote.SOURCE, "zygote", "exec")


def entries_into_sandbox_modules(run) -> dict[str, int]:
    """How often ``run()`` enters each sandbox module during one execution (process._execute):
    a call from a frame of another module into a function of that one (a reader of the execution
    opens that file again each time)."""
    entered: dict[str, int] = {}
    inside = [False]

    def module(frame) -> str | None:
        path = Path(frame.f_code.co_filename)
        return path.stem if path.parent == SANDBOX else None

    def profile(frame, event, arg) -> None:
        if frame.f_code is process._execute.__code__:
            if event in ("call", "return"):  # (its C calls come with its frame too)
                inside[0] = event == "call"
        elif event == "call" and inside[0]:
            here = module(frame)
            if here is not None and here != (module(frame.f_back) if frame.f_back else None):
                entered[here] = entered.get(here, 0) + 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return entered


def test_one_execution_enters_each_sandbox_module_at_most_twice():
    """issue 59: process._execute reads top-down. The launcher is entered to start the execution
    and to end it, and so is each module under it: the zygote (fork, finish), its control channel
    (the request, the kill), the cgroups (the limits, the end's kill and counters), cleanup (what
    follows each, off the caller's path); root once (the child's environment); the monitor is
    built and run, and reads the CPU clock and the joined check itself, however many calls are
    timed."""
    limits = RunLimits(wall_seconds=20, cpu_seconds=20, memory_mb=512)
    calls = [([i], {}) for i in range(6)]
    six_calls = lambda: run_calls({"p.py": "def f(x):\n    return x\n"}, "p", "f", calls,  # noqa: E731
                                  limits=limits, per_call_seconds=[2.0] * len(calls))
    assert six_calls().ok  # the zygote started, outside the count
    first = six_calls()
    if not first.forked:
        pytest.skip("no fork server here (it needs a root harness and cgroup v1): the fresh path is traced below")
    entered = entries_into_sandbox_modules(six_calls)
    # control: the tracer sees the execution (the launcher starts and ends it, the monitor watches)
    assert entered.get("launcher") == 2 and entered.get("monitor", 0) >= 1
    over = {module: n for module, n in entered.items() if n > 2}
    assert not over, entered


def test_a_fresh_execution_enters_each_sandbox_module_at_most_twice_but_its_group_three_times():
    """Without the fork server (off, or a machine it does not support) the launcher starts bwrap
    itself: root is entered for its command and environment, and cgroups three times, to make the
    run's group, to wrap the command so that its first process starts in it, and at the end."""
    limits = RunLimits(wall_seconds=20, cpu_seconds=20, memory_mb=512)
    fresh = lambda: run_calls({"p.py": "def f(x):\n    return x\n"}, "p", "f", [([1], {}), ([2], {})],  # noqa: E731
                              limits=limits, per_call_seconds=[2.0, 2.0], fork_server=False)
    assert fresh().ok
    entered = entries_into_sandbox_modules(fresh)
    assert entered.get("launcher") == 2 and "zygote" not in entered and "control" not in entered, entered
    assert entered.get("cgroups", 0) <= 3 and {m: n for m, n in entered.items() if m != "cgroups" and n > 2} == {}, entered
