"""The child side of the sandbox: this file's *source* is handed to a fresh ``python -s -c``; it is
never imported by the child, so the child needs no path to heldout.

It reads its job file, isolates itself (mount namespace: everything read-only except the scratch
dir, heldout's code/data/manifests hidden under empty tmpfs; then a throw-away uid, no
capabilities, no new privileges), applies rlimits, installs an audit hook that ends the run on a
forbidden operation, imports the candidate module and calls the function once per call. Every
outcome is one JSON line on the result pipe; values are converted to plain data here, so the
parent never unpickles or evaluates anything the candidate made.

Only the standard library is used (numpy is converted when the candidate already imported it)."""

import ctypes
import json
import math
import os
import resource
import signal
import sys
import time
import traceback

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
ST_FLAGS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME,
            2048: MS_NODIRATIME, 4096: MS_RELATIME}
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
TAIL = 3000
STACK_BYTES = 64 * 1024 * 1024  # runaway C recursion ends in SIGSEGV quickly instead of eating memory

_chan = None
_libc = None


class CallTimeout(BaseException):
    """Raised by the per-call timer; a BaseException so `except Exception` in candidates does not
    swallow it."""


class CpuLimit(BaseException):
    pass


def send(obj):
    data = (json.dumps(obj, allow_nan=True) + "\n").encode("utf-8")
    _chan.write(data)
    _chan.flush()


def fatal(kind, message):
    try:
        send({"fatal": True, "error_kind": kind, "error": message})
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(3)


# -- isolation -------------------------------------------------------------------------------------
def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    if libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source!r} on {target!r}: {os.strerror(err)}")


def mount_points():
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            raw = line.split()[4]
            points.append(raw.encode("latin-1").decode("unicode_escape"))
    return points


def inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def expose(paths):
    """Make ``paths`` readable for the throw-away uid even when an ancestor (e.g. /root, mode 700)
    is not: cover that ancestor with a tmpfs holding only bind mounts of ``paths``."""
    by_anchor = {}
    for path in paths:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            anc = "/" + "/".join(parts[:i])
            if not os.stat(anc).st_mode & 0o001:
                by_anchor.setdefault(anc, set()).add(path)
                break
    for anchor, wanted in sorted(by_anchor.items()):
        if any(inside(anchor, other) and anchor != other for other in by_anchor):
            continue
        fds = {p: os.open(p, os.O_PATH) for p in sorted(wanted)}
        mount("tmpfs", anchor, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=64k")
        for path, fd in fds.items():
            os.makedirs(path, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            os.close(fd)


def isolate(job):
    scratch = job["scratch"]
    mode = job["isolation"]
    if mode in ("root", "userns"):
        mount(scratch, scratch, None, MS_BIND)
        if mode == "root":
            expose(job["expose"])
        for path in job["hide"]:
            if not os.path.exists(path) or inside(scratch, path):
                continue
            if os.path.isdir(path):
                mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=555,size=4k")
            else:
                mount("/dev/null", path, None, MS_BIND)
        for point in mount_points():
            if point == scratch or point in job.get("writable", ()):  # private mounts made for the child
                continue
            try:
                flags = 0
                fflag = os.statvfs(point).f_flag
                for st, ms in ST_FLAGS.items():
                    if fflag & st:
                        flags |= ms
                mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
            except OSError:
                if point == "/":
                    raise
    os.chdir(scratch)
    lim = job["limits"]
    cpu = max(1, int(math.ceil(lim["cpu_seconds"])))
    mem = int(lim["memory_mb"]) * 1024 * 1024
    hard_stack = resource.getrlimit(resource.RLIMIT_STACK)[1]
    stack = STACK_BYTES if hard_stack == resource.RLIM_INFINITY else min(STACK_BYTES, hard_stack)
    for res, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),
                       (resource.RLIMIT_AS, (mem, mem)),
                       (resource.RLIMIT_FSIZE, (lim["max_file_mb"] * 1024 * 1024,) * 2),
                       (resource.RLIMIT_NOFILE, (lim["max_open_files"],) * 2),
                       (resource.RLIMIT_STACK, (stack, stack)),
                       (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(res, value)
    if mode == "root":
        uid = job["uid"]
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if mode in ("root", "userns"):
        # the process counter is per uid: with the throw-away uid it counts only this run
        resource.setrlimit(resource.RLIMIT_NPROC, (lim["max_processes"],) * 2)
    if mode == "userns":
        drop_capabilities()
    if mode != "none":
        libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # reset by the uid change
    libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def drop_capabilities():
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)()
    if libc().capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


# -- forbidden operations (a second line of defence; namespaces are the first) --------------------
FORBIDDEN = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
             "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
             "subprocess.Popen", "os.killpg", "pty.spawn"}


def install_audit_hook(hidden, allow_processes):
    pid = os.getpid()
    forbidden = set(FORBIDDEN)
    if allow_processes:
        forbidden -= {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
                      "subprocess.Popen"}
    hidden = tuple(h.rstrip("/") + "/" for h in hidden)
    _exit, _str, _isinstance, _abspath = os._exit, str, isinstance, os.path.abspath

    def hook(event, args):
        if event in forbidden or (event == "os.kill" and args and args[0] != pid):
            fatal("forbidden", f"forbidden operation: {event}{_str(args)[:200]}")
        if event == "open" and args and _isinstance(args[0], (str, bytes)) and hidden:
            path = args[0].decode(errors="replace") if _isinstance(args[0], bytes) else args[0]
            if (_abspath(path) + "/").startswith(hidden):
                fatal("forbidden", f"forbidden operation: reading {path!r} (hidden from candidates)")

    sys.addaudithook(hook)


# -- plain-data conversion -------------------------------------------------------------------------
class BadOutput(Exception):
    pass


class OutputTooLarge(Exception):
    pass


class Budget:
    """Counts (a lower bound of) the JSON size while converting, so a huge value is refused
    before it is built a second time."""

    def __init__(self, limit):
        self.left = limit

    def spend(self, n):
        self.left -= n
        if self.left < 0:
            raise OutputTooLarge()


def to_plain(value, typed, depth=0, budget=None):
    """JSON mode: dict(str keys)/list/str/int/float/bool/None, tuples -> lists, numpy -> lists.
    Typed mode keeps tuple/set/frozenset/bytes/complex/non-str keys as tagged objects."""
    if budget is None:
        budget = Budget(float("inf"))
    if depth > 200:
        raise BadOutput("output is nested more than 200 levels deep")
    t = type(value)
    if value is None or t in (bool, str, float, int):
        budget.spend(len(value) + 2 if t is str else 2)
        return value
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biuf":
                raise BadOutput(f"numpy array of dtype {value.dtype} is not numeric")
            budget.spend(2 * value.size)
            return value.tolist()
        if isinstance(value, np.generic):
            item = value.item()
            if type(item) not in (bool, int, float):
                raise BadOutput(f"numpy scalar of type {t.__name__} is not a number")
            return item
    if t is list:
        return [to_plain(v, typed, depth + 1, budget) for v in value]
    if t is tuple:
        items = [to_plain(v, typed, depth + 1, budget) for v in value]
        return {"__tuple__": items} if typed else items
    if isinstance(value, dict) and type(value).__module__ in ("builtins", "collections"):
        if typed:
            return {"__dict__": [[to_plain(k, typed, depth + 1, budget), to_plain(v, typed, depth + 1, budget)]
                                 for k, v in dict.items(value)]}
        out = {}
        for k, v in dict.items(value):
            if type(k) is not str:
                raise BadOutput(f"dict key {type(k).__name__} is not a str")
            out[k] = to_plain(v, typed, depth + 1, budget)
        return out
    if typed:
        if t in (set, frozenset):
            return {f"__{t.__name__}__": [to_plain(v, typed, depth + 1, budget) for v in value]}
        if t is bytes:
            return {"__bytes__": value.hex()}
        if t is complex:
            return {"__complex__": [value.real, value.imag]}
    raise BadOutput(f"cannot return a {t.__module__}.{t.__name__} (only plain data crosses the sandbox)")


# -- running ---------------------------------------------------------------------------------------
def tail_of_traceback(exc):
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-TAIL:]


def on_alarm(signum, frame):
    raise CallTimeout()


def on_xcpu(signum, frame):
    raise CpuLimit()


def run_call(fn, call, typed, cpu_limit, max_bytes):
    seconds = call.get("seconds")
    start = time.perf_counter()

    def failed(kind, error):
        return {"ok": False, "error_kind": kind, "error": error, "seconds": time.perf_counter() - start}

    try:
        if seconds:
            signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            value = fn(*call.get("args", []), **call.get("kwargs", {}))
        finally:
            if seconds:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except CallTimeout:
        return failed("timeout", f"timeout after {seconds:.3g} s wall (per-call limit)")
    except CpuLimit:
        fatal("timeout", f"timeout: cpu time limit of {cpu_limit} s exceeded")
    except MemoryError as exc:
        return failed("memory", f"memory limit exceeded (MemoryError{': ' + str(exc) if str(exc) else ''})")
    except SystemExit as exc:
        return failed("crash", f"the program called exit({exc.code!r})")
    except BaseException as exc:  # noqa: BLE001 - anything the candidate raises is its crash
        return failed("crash", tail_of_traceback(exc))
    elapsed = time.perf_counter() - start
    try:
        out = {"ok": True, "value": to_plain(value, typed, 0, Budget(max_bytes)), "seconds": elapsed}
        json.dumps(out, allow_nan=True)  # fails here, not in send(), on e.g. a huge int
        return out
    except OutputTooLarge:
        return failed("output_too_large", f"output too large: the result exceeds {max_bytes} bytes")
    except RecursionError:
        return failed("bad_output", "bad output: nested too deeply to convert")
    except MemoryError:
        return failed("memory", "memory limit exceeded while converting the output")
    except BaseException as exc:  # noqa: BLE001 - BadOutput, tricky __eq__/__len__ ...
        return failed("bad_output", f"bad output: {exc}"[:TAIL])


def main():
    global _chan
    job_path, fd = sys.argv[1], int(sys.argv[2])
    _chan = os.fdopen(fd, "wb", buffering=0)
    sys.dont_write_bytecode = True
    try:
        with open(job_path, encoding="utf-8") as fh:
            job = json.load(fh)
        os.unlink(job_path)
        isolate(job)
    except Exception as exc:  # noqa: BLE001
        fatal("sandbox_error", f"sandbox setup failed: {exc!r}")
    signal.signal(signal.SIGXCPU, on_xcpu)
    signal.signal(signal.SIGALRM, on_alarm)
    sys.path.insert(0, job["scratch"])
    install_audit_hook(job["hide"], job.get("allow_processes", False))
    typed = job["encoding"] == "typed"
    cpu_limit = job["limits"]["cpu_seconds"]
    try:
        module = __import__(job["module"], fromlist=["_"])
        fn = getattr(module, job["function"], None)
        if fn is None:
            fatal("crash", f"module {job['module']!r} defines no function {job['function']!r}")
        if not callable(fn):
            fatal("crash", f"{job['module']}.{job['function']} is not callable")
    except CpuLimit:
        fatal("timeout", f"timeout: cpu time limit of {cpu_limit} s exceeded")
    except MemoryError:
        fatal("memory", "memory limit exceeded while importing the program")
    except BaseException as exc:  # noqa: BLE001
        fatal("crash", "importing the program failed:\n" + tail_of_traceback(exc))
    failed_groups = set()
    for index, call in enumerate(job["calls"]):
        group = call.get("group")
        if group in failed_groups:
            continue  # stop_on_error stops only the failing call's group
        out = run_call(fn, call, typed, cpu_limit, job["limits"]["max_output_bytes"])
        out["call"] = index
        try:
            send(out)
        except (ValueError, RecursionError, OverflowError) as exc:
            send({"call": index, "ok": False, "error_kind": "bad_output", "error": f"bad output: {exc}"})
        if not out["ok"] and job.get("stop_on_error"):
            if group is None:
                break
            failed_groups.add(group)
    send({"done": True})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# run as `python -s -c SOURCE` (the sandbox); imported, it only lends its isolation helpers
# (heldout.evaluators.isolated reuses them)
if __name__ == "__main__":
    main()
