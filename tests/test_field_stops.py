"""Field conditions: a command stopped by Ctrl-C (or a scheduler's SIGTERM).

In the lab a command runs to its end. In the field a person stops it a few seconds in. The demo
then went on to build and write a report of the cells that happened to finish (over the report a
finished demo had written before), and exited 1 naming the stopped cells as failed; a command
without a stop handler of its own (eval, verify, report) ended in a KeyboardInterrupt traceback.
A stop is a stop: exit 130 and one line, no report.

``heldout eval`` waiting on an endpoint that never answers (its probe of the endpoint, up to 60 s
twice) relied on Python's Ctrl-C handler, which Python does not install in a process that inherits
SIGINT ignored, as everything a script starts in the background (``cmd &``) does: the whole test
suite run that way hung on this test, the command deaf to SIGINT for two minutes. A SIGTERM ended
it with no line at all. Now every command raises its stop on both, whatever it inherited, from
before its modules are imported (a Ctrl-C during the imports was a traceback), and a long DuckDB
query of ``runs query`` stops at once (it stopped when DuckDB next looked, then as a traceback)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import termios
import threading
import time

import pytest
from socket_server import ScriptedSocketServer, read_request
from synthetic_study import write_study


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_demo_exits_130_and_writes_no_report_of_the_cells_that_finished(sig, tmp_path):
    run_dir, out = tmp_path / "demo", tmp_path / "report"
    demo = subprocess.Popen([sys.executable, "-m", "heldout", "demo", "--run-dir", str(run_dir), "--out", str(out),
                             "--jobs", "1"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    give_up = time.monotonic() + 120
    while not list(run_dir.rglob("ledger.jsonl")):  # a session has started
        assert demo.poll() is None and time.monotonic() < give_up, demo.communicate()
        time.sleep(0.05)
    os.kill(demo.pid, sig)
    stdout, stderr = demo.communicate(timeout=120)
    assert demo.returncode == 130, stderr[-1500:]
    assert "interrupted by" in stderr and "Traceback" not in stderr
    assert not out.exists() and "report.md" not in stdout


class SilentEndpoint(ScriptedSocketServer):
    """Takes each request and never answers it; ``asked`` is set once a whole request has come."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.held: list[socket.socket] = []
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        self.held.append(conn)
        with conn.makefile("rb") as reader:
            if read_request(reader) is not None:
                self.asked.set()
                reader.read()  # until the client hangs up

    def close(self) -> None:
        super().close()
        for conn in self.held:
            conn.close()


# as a shell script starts a command in the background (``cmd &``, no job control): SIGINT ignored
IN_THE_BACKGROUND = ["sh", "-c", '"$@" & echo $!; wait $!', "sh"]


@pytest.mark.parametrize("sig,started", [(signal.SIGINT, "plainly"), (signal.SIGINT, "in the background"),
                                         (signal.SIGTERM, "plainly")],
                         ids=["SIGINT", "SIGINT-after-cmd-&", "SIGTERM"])
def test_a_stop_while_eval_waits_on_a_silent_endpoint_is_one_line_and_exit_130(sig, started, tmp_path):
    with SilentEndpoint() as endpoint:
        argv = [sys.executable, "-m", "heldout", "eval", "--task", "bbh/boolean_expressions", "--worker-model", "m",
                "--base-url", endpoint.base_url]
        wrapper = IN_THE_BACKGROUND if started == "in the background" else []
        command = subprocess.Popen(wrapper + argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        pid = int(command.stdout.readline()) if wrapper else command.pid
        try:
            assert endpoint.asked.wait(120), "the command never asked the endpoint"
            os.kill(pid, sig)  # it waits for the answer now
            _, stderr = command.communicate(timeout=60)  # about a second; it waited 120 s on its probe before
        finally:
            if command.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # (ended, and reaped by its shell, meanwhile)
                    os.kill(pid, signal.SIGKILL)
                command.communicate()
    how = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
    assert command.returncode == 130 and "Traceback" not in stderr, stderr[-1500:]
    assert stderr.strip().splitlines() == [f"heldout: interrupted ({how}): rerun the command to finish it"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_during_a_long_runs_query_is_one_line_and_exit_130_at_once(sig, tmp_path):
    """DuckDB looked at the signal only between its tasks (17 s later in one run, or at the query's
    end) and then raised its own RuntimeError: a traceback, exit 1."""
    write_study(tmp_path / "study", 1, 1, 1)
    started = tmp_path / "started.csv"  # written by the first statement: the long one runs next
    query = f"COPY (SELECT 1) TO '{started}'; SELECT sum(i % 7 * (i % 11)) FROM range(20000000000) t(i)"
    command = subprocess.Popen([sys.executable, "-m", "heldout", "runs", "query", str(tmp_path / "study"), query],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        give_up = time.monotonic() + 120
        while not started.exists():
            assert command.poll() is None and time.monotonic() < give_up, command.communicate()
            time.sleep(0.05)
        time.sleep(0.2)  # minutes of one core from here
        os.kill(command.pid, sig)
        _, stderr = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
            command.communicate()
    how = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
    assert command.returncode == 130, stderr[-1500:]
    assert stderr.strip().splitlines() == [f"heldout: interrupted ({how}): rerun the command to finish it"]


def test_ctrl_c_while_heldout_still_imports_the_command_line_is_one_line_and_exit_130(tmp_path):
    """Python's own handler was the one until main ran, after the CLI's modules were imported (most
    of a second on a loaded machine): a Ctrl-C then was a KeyboardInterrupt traceback."""
    # -X importtime writes a line per import to stderr, into a pipe of one page that this test stops
    # reading once the package heldout is imported: the command waits, in the middle of its imports
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 4096)
    command = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "heldout", "tasks", "list"], cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=write)
    os.close(write)
    lines = []
    try:
        with os.fdopen(read, "rb", buffering=0) as stderr:
            while not lines or not lines[-1].rstrip().endswith(b"| heldout"):
                lines.append(_read_line(stderr))
            give_up, held = time.monotonic() + 60, bytearray(4)
            # the pipe full but for less than a line: the command waits to write its next import's line
            while fcntl.ioctl(stderr, termios.FIONREAD, held) is not None and int.from_bytes(held, sys.byteorder) < 3840:
                assert command.poll() is None and time.monotonic() < give_up, "it never filled its stderr"
                time.sleep(0.01)
            os.kill(command.pid, signal.SIGINT)
            rest = stderr.read().splitlines()
        command.wait(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    said = [line.decode() for line in rest if not line.startswith(b"import time:")]
    assert command.returncode == 130, said[-30:]
    assert said == ["heldout: interrupted (Ctrl-C): rerun the command to finish it"]


def _read_line(stream) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        byte = stream.read(1)
        assert byte, "stderr ended before heldout was imported"
        line += byte
    return line
