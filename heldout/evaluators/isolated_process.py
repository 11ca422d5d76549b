"""The process of an isolated optimizer: what runs inside the sandbox and how the harness waits
for it (:mod:`heldout.evaluators.isolated` prepares the launch and serves the view meanwhile).

The sandbox's first Python is a supervisor (:data:`_SUPERVISOR_SOURCE`): it reads the job from
stdin, forks the optimizer (rlimits, a throw-away uid, no new privileges, the seccomp filter of
:mod:`heldout.sandbox._child`, exec), waits for it and writes its exact wait status to a pipe the
optimizer does not hold, so a process that kills itself with a signal is reported as killed by it.
:func:`run_sandboxed` starts it in the run's cgroup, copies its output to the run dir (capped),
waits up to the wall limit, kills the whole group, and returns how the process exited;
:func:`exit_error` says in words why such an exit is a failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from heldout.sandbox.cgroups import RunGroup

TAIL_BYTES = 4000
PACKAGE_DIR = Path(__file__).resolve().parents[1]


class _LogPump(threading.Thread):
    """Copies the child's output to the run dir (up to a cap, owner-only) and keeps its tail."""

    def __init__(self, stream, path: Path, cap: int) -> None:
        super().__init__(name="heldout-optimizer-log", daemon=True)
        self.stream, self.path, self.cap = stream, path, cap
        self.tail = bytearray()
        self.total = 0

    def run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab") as out:
            while True:
                chunk = self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536)
                if not chunk:
                    break
                if self.total < self.cap:
                    out.write(chunk[: self.cap - self.total])
                    out.flush()
                self.total += len(chunk)
                self.tail += chunk
                del self.tail[:-TAIL_BYTES]
            if self.total > self.cap:
                out.write(f"\n[heldout: output truncated; {self.total} bytes in all]\n".encode())

    def text(self) -> str:
        return self.tail.decode("utf-8", errors="replace")


def run_sandboxed(log_path: Path, sandbox: Sequence[str], job: dict[str, Any], group: RunGroup, wall: float,
                  max_log_bytes: int) -> dict[str, Any]:
    """Run ``job`` (argv, env, uid, limits) under the supervisor inside ``sandbox`` (a bubblewrap
    argv) in the run group ``group``, wait at most ``wall`` seconds, kill what is left, and return
    how it exited: exit status or signal (as the supervisor saw them), why it was killed, seconds,
    the output's tail and size (the whole output goes to ``log_path``, up to ``max_log_bytes``),
    and the group's memory and process verdicts."""
    # the supervisor's source goes on the command line and the job on stdin: nothing of the job
    # (the view token) stays readable inside but the optimizer's own environment
    status_r, status_w = os.pipe()
    cmd = [*sandbox, "--", sys.executable, "-s", "-c", _SUPERVISOR_SOURCE, str(status_w), _CHILD_HELPERS]
    cmd = group.attach_argv(cmd)
    started = time.time()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                pass_fds=(status_w,), start_new_session=True, cwd="/",
                                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    except OSError as exc:
        os.close(status_r)
        os.close(status_w)
        return {"returncode": None, "signal": None, "killed_for": None, "seconds": 0.0,
                "tail": f"could not start the optimizer: {exc}", "output_bytes": 0}
    os.close(status_w)
    try:
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
    except OSError:
        pass
    pump = _LogPump(proc.stdout, log_path, max_log_bytes)
    pump.start()
    killed_for = None
    try:
        try:
            proc.wait(timeout=wall)
        except subprocess.TimeoutExpired:
            killed_for = "wall_time"
    finally:
        # the harness may be interrupted too: never leave the child behind
        group.kill_run(proc.pid)
        proc.wait()
    with os.fdopen(status_r, "rb") as fh:
        status_text = fh.read(4096).decode(errors="replace")
    pump.join(timeout=10)
    proc.stdout.close()
    status = _parse_status(status_text)
    return {"returncode": status.get("exit", proc.returncode), "signal": status.get("signal"),
            "setup_error": status.get("setup_error"), "killed_for": killed_for,
            "seconds": round(time.time() - started, 3), "tail": pump.text(), "output_bytes": pump.total,
            "memory_exceeded": group.memory_exceeded(), "oom_kills": group.oom_kills(),
            "processes_exceeded": group.processes_exceeded()}


def _parse_status(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict):
            return msg
    return {}


def exit_error(exited: Mapping[str, Any], submitted: bool, wall: float) -> str | None:
    """Why an isolated run failed (exit status, the signal that killed it, the wall limit, the
    whole-run memory limit, no final), with the tail of its output; None for a clean exit that
    submitted a final."""
    tail = exited["tail"].strip()
    tail_note = f"\n--- last output ---\n{tail[-1500:]}" if tail else ""
    sig = exited.get("signal")
    if exited["killed_for"] == "wall_time":
        return f"optimizer killed at its wall-time limit ({wall:g} s)" + tail_note
    if exited["returncode"] is None and sig is None:
        return exited["tail"]
    if sig is not None:
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        limit = " (whole-run memory limit reached)" if exited.get("memory_exceeded") else ""
        return f"optimizer crashed: killed by signal {name}{limit}" + tail_note
    if exited["returncode"] != 0:
        return f"optimizer crashed: exited with status {exited['returncode']}" + tail_note
    if exited.get("oom_kills"):
        # the memory limit is a budget of the whole tree: a run that went over it is not a run
        # within budget, even if the process the kernel picked was a helper and the main one went on
        return (f"optimizer crashed: its processes together went over the whole-run memory limit and the "
                f"kernel killed {exited['oom_kills']} of them" + tail_note)
    if not submitted:
        return "optimizer exited without submitting a final candidate (POST /final)" + tail_note
    return None


# -- inside the sandbox --------------------------------------------------------------------------------
# The supervisor is the sandbox's first Python: it reads the job from stdin, forks the optimizer
# (rlimits, throw-away uid, no new privileges, exec), waits for it and writes its exact wait status
# to a pipe the optimizer does not hold. As root-in-the-sandbox it cannot be signalled by the
# optimizer's uid.
_CHILD_HELPERS = (PACKAGE_DIR / "sandbox" / "_child.py").read_text(encoding="utf-8")  # for its seccomp filter
_SUPERVISOR_SOURCE = r'''
import ctypes, json, os, resource, sys
status = int(sys.argv[1])
helpers = {"__name__": "heldout_sandbox_child"}
exec(sys.argv[2], helpers)
job = json.loads(sys.stdin.buffer.read())
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
def report(**msg):
    os.write(status, (json.dumps(msg) + "\n").encode())
pid = os.fork()
if pid == 0:
    try:
        os.close(status)
        os.chdir("/sandbox/scratch")
        lim = job["limits"]
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim["max_file_mb"] << 20,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim["max_open_files"],) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        uid = job["uid"]
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            resource.setrlimit(resource.RLIMIT_NPROC, (lim["max_processes"],) * 2)
        ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        helpers["install_seccomp"]()  # no new namespaces, mounts, ptrace, bpf ... (see heldout.sandbox._child)
    except Exception as exc:
        print(f"heldout: isolating the optimizer failed: {exc!r}", file=sys.stderr, flush=True)
        os._exit(125)
    argv = job["argv"]
    try:
        os.execve(argv[0], argv, job["env"]) if "/" in argv[0] else os.execvpe(argv[0], argv, job["env"])
    except OSError as exc:
        print(f"heldout: cannot run the optimizer command {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(127)
_, wait_status = os.waitpid(pid, 0)
if os.WIFSIGNALED(wait_status):
    report(signal=os.WTERMSIG(wait_status))
else:
    report(exit=os.WEXITSTATUS(wait_status))
'''


__all__ = ["TAIL_BYTES", "exit_error", "run_sandboxed"]
