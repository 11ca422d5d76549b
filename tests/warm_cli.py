"""The real ``heldout`` command in a process of its own, without paying an interpreter start and
heldout's imports for every call: a server process imports the CLI and the modules its commands
load once, then forks one child per command. The child leaves the server's loop and runs the
command as ``python -m heldout.cli`` would in ``cwd`` with ``env`` (``sys.path[0]`` the folder,
stdin empty, output to files), and ends the way an interpreter ends (non-daemon threads joined,
atexit hooks run, output flushed; an escaping exception prints its traceback and exits 1), except
that it skips tearing down the modules the server preloaded (most of a second, which a cold
command that imports only its own modules does not pay). The server only imports and forks (one
thread, no sandbox of its own), so every child starts as clean as a fresh ``python -m heldout.cli``
that has imported the same modules.

What it cannot show: a failure at import time, or a module reading the environment when it is
imported (the server's environment is the tests' own). The suites that use it are about what the
commands answer, not about how the interpreter starts; ``python -m heldout.cli`` itself is run
by the other CLI tests."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# what heldout's commands import when they run (the CLI imports these lazily: its command table and
# groups too, 13 modules that every child imported again, 20-30 of a refusal's 40 CPU-ms), and every
# built-in task
WARM_MODULES = ("heldout.cli", "heldout.cli.dispatch", "heldout.cli.commands", "heldout.protocols.run",
                "heldout.protocols.leakage", "heldout.protocols.splits", "heldout.protocols.verifier_ablation",
                "heldout.reports", "heldout.reports.paper", "heldout.reports.store", "heldout.evaluators.session",
                "heldout.benchmarks.registry")

SERVER = r"""
import importlib, json, os, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
from heldout.benchmarks.registry import BUILTIN_FAMILIES
for name in BUILTIN_FAMILIES.values():
    importlib.import_module(name)
requests, replies = sys.stdin.buffer, sys.stdout.buffer
while True:
    line = requests.readline()
    if not line:
        os._exit(0)
    call = json.loads(line)
    pid = os.fork()
    if pid == 0:
        break
    _, status = os.waitpid(pid, 0)
    replies.write(b"%d\n" % os.waitstatus_to_exitcode(status))
    replies.flush()
os.chdir(call["cwd"])
os.environ.clear()
os.environ.update(call["env"])
sys.path[0] = os.getcwd()
stdin = os.open(os.devnull, os.O_RDONLY)
os.dup2(stdin, 0)
for fd, path in ((1, call["stdout"]), (2, call["stderr"])):
    out = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.dup2(out, fd)
    os.close(out)
os.close(stdin)
sys.stdin = open(0, closefd=False)
sys.stdout = open(1, "w", closefd=False)
sys.stderr = open(2, "w", closefd=False)
sys.argv = ["heldout", *call["args"]]
import atexit, threading, traceback
from heldout.cli import main
try:
    sys.exit(main(call["args"]))
except SystemExit as exc:  # what the interpreter makes of sys.exit's argument
    if exc.code is None or isinstance(exc.code, int):
        code = exc.code or 0
    else:
        print(exc.code, file=sys.stderr)
        code = 1
except BaseException:
    traceback.print_exc()
    code = 1
# an interpreter's exit without its teardown of every preloaded module (most of a second, for a heap
# no cold run has): non-daemon threads joined, atexit hooks run, output flushed
threading._shutdown()
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code & 0xFF)
"""


class WarmCli:
    """``run(*args, cwd=, env=)`` gives what ``subprocess.run([python, -m, heldout.cli, *args])``
    gives (returncode, stdout, stderr as text); one command at a time. A command that runs past
    ``timeout`` is killed with the server (the next call starts a new one)."""

    def __init__(self) -> None:
        self._proc = self._server()
        self._out = Path(tempfile.mkdtemp(prefix="heldout-warm-cli-"))

    def run(self, *args: str, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        if self._proc.poll() is not None:  # killed with a command that hung: the next caller gets a new one
            self._proc = self._server()
        files = {name: self._out / name for name in ("stdout", "stderr")}
        for path in files.values():
            path.write_bytes(b"")
        call = {"args": list(args), "cwd": str(cwd), "env": dict(os.environ if env is None else env),
                **{name: str(path) for name, path in files.items()}}
        self._proc.stdin.write(json.dumps(call).encode() + b"\n")
        self._proc.stdin.flush()
        if not select.select([self._proc.stdout], [], [], timeout)[0]:
            os.killpg(self._proc.pid, signal.SIGKILL)  # the server and the hung command with it
            raise subprocess.TimeoutExpired(["heldout", *args], timeout)
        reply = self._proc.stdout.readline()
        if not reply:
            raise RuntimeError(f"the warm CLI server died (exit {self._proc.wait()})")
        out, err = (files[n].read_text(encoding="utf-8", errors="replace") for n in ("stdout", "stderr"))
        return subprocess.CompletedProcess(["heldout", *args], int(reply), out, err)

    @staticmethod
    def _server() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(WARM_MODULES)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(timeout=60)
        for path in self._out.iterdir():
            path.unlink()
        self._out.rmdir()
