"""Field conditions: ``heldout eval`` pointed at an endpoint that is not there.

In the lab the worker's endpoint is up. In the field the URL is mistyped, the server not yet
started, the tunnel down. A study checks its endpoints before anything (one line, exit 2); ``heldout
eval`` sent every example's request, each retried with backoff (6 times, up to 20 s apart), and
said nothing for minutes (178 s for the 50 val examples of bbh/boolean_expressions against a
refused port, to end with the same error). It now asks once first."""

from __future__ import annotations

import socket
import subprocess
import sys


def test_eval_against_a_refused_port_is_one_line_and_exit_2_not_minutes_of_retries(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on: bound, then released
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    done = subprocess.run([sys.executable, "-m", "heldout", "eval", "--task", "bbh/boolean_expressions",
                           "--worker-model", "test-model", "--base-url", url], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)  # its retries took minutes: the timeout fails it
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines[-5:]
    assert "does not answer" in lines[0] and url in lines[0] and done.stdout == ""
