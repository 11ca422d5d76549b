"""The child side of the sandbox: this file's *source* is handed to a fresh ``python -s -c``
inside the bubblewrap root (see :mod:`heldout.sandbox.root`); it is never imported by the child,
so the child needs no path to heldout.

It reads its job's header (everything but the calls) from stdin, applies rlimits, becomes a
throw-away uid (when started as root) with no capabilities and no new privileges, says ``ready``
on the result channel, installs an audit hook that ends the run with a named error on a
forbidden operation and imports the candidate module. Then it says ``start`` and receives the
calls **one at a time**: the parent sends a call's input when it starts that call's clock (after
the start line, then after each outcome), so no input exists in the process before the call
that uses it, and work done on an input counts on that input's clock (an import that walks the
frames for the test inputs finds none). Every outcome is one JSON line on the result pipe;
values are converted to plain data here, so the parent never unpickles or evaluates anything the
candidate made. The parent closes the call stream when no call is left.

Only the standard library is used (numpy is converted when the candidate already imported it)."""

import builtins
import ctypes
import itertools
import json
import math
import os
import resource
import signal
import sys
import time
import traceback

PR_SET_NO_NEW_PRIVS = 38
TAIL = 3000
STACK_BYTES = 64 * 1024 * 1024  # runaway C recursion ends in SIGSEGV quickly instead of eating memory

_chan = None
_libc_handle = []  # the C library, opened once per interpreter (a fork server's children inherit it)


def libc():
    if not _libc_handle:
        _libc_handle.append(ctypes.CDLL(None, use_errno=True))
    return _libc_handle[0]


class CallTimeout(BaseException):
    """Raised by a per-call timer (its CPU limit, or its wall backstop); a BaseException so
    `except Exception` in candidates does not swallow it."""


class CpuLimit(BaseException):
    pass


def encode(obj):
    return (json.dumps(obj, allow_nan=True) + "\n").encode("utf-8")


def write(data):
    # unbuffered: one write per message (or per pair); a signal can cut a large write short
    view = memoryview(data)
    while view:
        view = view[_chan.write(view):]


def send(obj):
    write(encode(obj))


# Outcome lines held back in a run whose inputs came up front (trusted code only: nothing times
# its calls from the parent, see run_calls' inputs_up_front). A line per write had the parent wake
# and parse once per call; a few writes per run let it take many lines per read.
_held = bytearray()
HELD_BYTES, HELD_SECONDS = 1 << 16, 0.05


def release_held():
    if _held:
        data = bytes(_held)
        _held.clear()
        write(data)


def fatal(kind, message):
    try:
        release_held()  # the outcomes before it, in their order
        send({"fatal": True, "error_kind": kind, "error": message})
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(3)


# -- isolation (the file system and namespaces are bwrap's; these are the per-process parts) ------
def isolate(job):
    os.chdir(job["scratch"])
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
    uid = job.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # drops every capability; the uid owns nothing on the host
        # the process counter is per uid: with the throw-away uid it counts only this run
        resource.setrlimit(resource.RLIMIT_NPROC, (lim["max_processes"],) * 2)
    libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    install_seccomp()


# -- seccomp: the kernel's escape hatches answer EPERM -----------------------------------------------
# The namespaces already confine mounts and IPC; these syscalls would let a candidate build new
# namespaces (a user namespace gives it capabilities there), reach kernel surfaces no program task
# needs (bpf, keyrings, perf, io_uring) or trace processes. x86-64 numbers; other architectures
# rely on the namespaces alone.
AUDIT_ARCH_X86_64 = 0xC000003E
DENIED_SYSCALLS = (272, 308, 165, 166, 155, 161, 101, 321, 250, 248, 249, 298, 323, 304, 246, 320, 175, 313,
                   176, 442, 430, 431, 432, 429, 428, 425, 426, 427, 310, 311, 134, 163, 167, 168, 169)
CLONE_NS_FLAGS = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
SYS_CLONE, SYS_CLONE3 = 56, 435
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


_seccomp = []  # the built filter (a fork server builds it once; its children inherit it)


def seccomp_program():
    """The filter program, built once per process (None off x86-64)."""
    if _seccomp:
        return _seccomp[0]
    import platform

    if platform.machine() != "x86_64":
        _seccomp.append(None)
        return None

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JSET|K, RET|K
    eperm, enosys = SECCOMP_RET_ERRNO | 1, SECCOMP_RET_ERRNO | 38
    insns = [(ld, 0, 0, 4), (jeq, 1, 0, AUDIT_ARCH_X86_64), (ret, 0, 0, SECCOMP_RET_ALLOW), (ld, 0, 0, 0)]
    for nr in DENIED_SYSCALLS:
        insns += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    # clone3 passes its flags in memory a filter cannot read: glibc falls back to clone on ENOSYS
    insns += [(jeq, 0, 1, SYS_CLONE3), (ret, 0, 0, enosys),
              (jeq, 0, 3, SYS_CLONE), (ld, 0, 0, 16), (jset, 0, 1, CLONE_NS_FLAGS), (ret, 0, 0, eperm),
              (ret, 0, 0, SECCOMP_RET_ALLOW)]
    program = (Filter * len(insns))(*[Filter(*i) for i in insns])
    _seccomp.append((Prog(len(insns), program), program, libc()))
    return _seccomp[0]


def install_seccomp():
    built = seccomp_program()
    if built is None:
        return
    prog, _, libc = built
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the seccomp filter")


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


SCALAR_TYPES = frozenset({bool, str, float, int, type(None)})


def _spend_on_scalars(kinds, count, scalars, budget):
    """Charge ``count`` scalars (``scalars`` iterates them; ``kinds``: their types, all in
    SCALAR_TYPES): 2 each, plus the length of each str."""
    if kinds == {str}:
        strings = sum(map(len, scalars))
    elif str in kinds:
        strings = sum(len(v) for v in scalars if type(v) is str)
    else:
        strings = 0
    budget.spend(2 * count + strings)


def _plain_rows(value, typed, budget):
    """The plain form of a list/tuple of scalars, or of lists/tuples of scalars (most large
    outputs: a vector, a matrix, a list of pairs), found with C-speed type checks instead of a
    call per item; None for anything else (converted item by item)."""
    kinds = set(map(type, value))
    if kinds <= SCALAR_TYPES:
        _spend_on_scalars(kinds, len(value), value, budget)
        return value if type(value) is list else list(value)
    if not kinds <= {list, tuple}:
        return None
    inner = set(map(type, itertools.chain.from_iterable(value)))
    if not inner <= SCALAR_TYPES:
        return None
    _spend_on_scalars(inner, sum(map(len, value)), itertools.chain.from_iterable(value), budget)
    if tuple not in kinds:
        return value if type(value) is list else list(value)
    if typed:
        return [{"__tuple__": list(row)} if type(row) is tuple else row for row in value]
    return [list(row) if type(row) is tuple else row for row in value]


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
    if t is list or t is tuple:
        items = _plain_rows(value, typed, budget)
        if items is None:
            items = [to_plain(v, typed, depth + 1, budget) for v in value]
        return {"__tuple__": items} if typed and t is tuple else items
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


# the running call's deadline per timer signal, on the timer's own clock (None: no call is
# timed): a POSIX timer is not disarmed when its call ends (two syscalls a call fewer), so a
# signal of an ended call's timer can still come, and is told apart here
_deadlines = {}


def on_alarm(signum, frame):
    deadline = _deadlines.get(signum)
    if deadline is None:
        return  # the call it timed has ended
    now = time.process_time() if signum == signal.SIGPROF else time.monotonic()
    # a POSIX timer never fires early, so a signal well before the running call's deadline is an
    # ended call's, delivered late (the millisecond: the kernel's sample of a clock and a reading
    # of it may differ by a little; the itimers, which may fire early, are disarmed instead)
    if now >= deadline - 1e-3 or _timers.get(_CLOCK_OF[signum]) is None:
        waited = _new_wait_for_cpu() if signum == signal.SIGALRM else 0.0
        if waited > 1e-3:
            # the wall backstop stops a program that sleeps or waits, not one the machine's other
            # work kept from a CPU: the time it waited, runnable, moves the deadline
            set_call_timer(CLOCK_MONOTONIC, waited, deadline + waited)
            return
        raise CallTimeout(signum)


_credited_wait = [0.0]  # the run delay already added to a wall deadline (each second of it once)


def _new_wait_for_cpu():
    """Seconds this (main) thread waited, runnable, for a CPU since the last time a deadline was
    moved for it (the kernel's run delay in ``/proc/thread-self/schedstat``; 0 where unreadable).
    Counted since the process started, not the call: a call may get the wait of an earlier one."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as stat:
            total = int(stat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0
    new, _credited_wait[0] = total - _credited_wait[0], max(total, _credited_wait[0])
    return new


class _Sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("thread_id", ctypes.c_int), ("rest", ctypes.c_byte * 44)]


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("interval", _Timespec), ("value", _Timespec)]


CLOCK_MONOTONIC, CLOCK_PROCESS_CPUTIME_ID, SIGEV_THREAD_ID = 1, 2, 4
# the per-call timers of this process by clock: (timer id, its itimerspec, timer_settime), made at
# the first timed call (timers do not survive a fork), or None where the kernel made none (the
# itimers then stand in)
_timers = {}
_FALLBACK = {CLOCK_PROCESS_CPUTIME_ID: (signal.ITIMER_PROF, signal.SIGPROF),
             CLOCK_MONOTONIC: (signal.ITIMER_REAL, signal.SIGALRM)}
_CLOCK_OF = {signal.SIGPROF: CLOCK_PROCESS_CPUTIME_ID, signal.SIGALRM: CLOCK_MONOTONIC}


def _make_timer(clock):
    timer = ctypes.c_void_p()
    # to the main thread, where the calls run (its kernel id is the pid)
    event = _Sigevent(None, _FALLBACK[clock][1], SIGEV_THREAD_ID, os.getpid())
    try:
        if libc().timer_create(clock, ctypes.byref(event), ctypes.byref(timer)) != 0:
            return None
        settime = libc().timer_settime
    except (AttributeError, OSError):
        return None
    settime.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    spec = _Itimerspec()
    return timer.value, spec, ctypes.byref(spec), settime


def set_call_timer(clock, seconds, deadline=None):
    """A signal to the calls' (main) thread after ``seconds`` of ``clock`` (0: disarm): of the
    process's CPU time, all its threads together (SIGPROF), or of wall time (SIGALRM); the
    handler raises only at or past ``deadline`` on that clock (see :func:`on_alarm`). POSIX
    timers, because the CPU clock counts exactly (ITIMER_PROF samples by ticks: it fired at
    0.87 s of a 1 s limit on a test VM) and a signal sent to the thread itself interrupts its
    sleep or wait even while other threads compute (a signal to the process may land on one of
    them, and Python runs its handler only once the main thread wakes)."""
    if clock not in _timers:
        _timers[clock] = _make_timer(clock)
    made = _timers[clock]
    _deadlines[_FALLBACK[clock][1]] = deadline if seconds else None
    if made is None:
        signal.setitimer(_FALLBACK[clock][0], seconds)
        return
    timer, spec, spec_ref, settime = made
    whole = int(seconds)
    spec.value.sec, spec.value.nsec = whole, int((seconds - whole) * 1e9)
    settime(timer, 0, spec_ref, None)


def end_call_timer(clock):
    """The call ``clock`` timed has ended: its signal no longer raises (a POSIX timer stays
    armed until the next call re-arms it; an itimer is disarmed)."""
    _deadlines[_FALLBACK[clock][1]] = None
    if _timers.get(clock) is None:
        signal.setitimer(_FALLBACK[clock][0], 0)


def on_xcpu(signum, frame):
    raise CpuLimit()


def run_call(index, fn, call, typed, cpu_limit, max_bytes):
    """``(ok, outcome line)`` of call ``index``: the line is encoded once, here (an output that
    cannot be encoded is the call's bad_output)."""
    # the call's limit is CPU time (the process's, all its threads: SIGPROF), so it does not move
    # with the machine's load; the wall timer is only the backstop for a call that sleeps or blocks.
    # These give a clean error; the parent measures the run's CPU itself and enforces both anyway.
    seconds = call.get("seconds")
    wall = call.get("wall")
    start = time.perf_counter()
    cpu_start = time.process_time()

    def failed(kind, error):
        out = {"call": index, "ok": False, "error_kind": kind, "error": error, "seconds": time.perf_counter() - start,
               "cpu_seconds": time.process_time() - cpu_start}
        try:
            return False, encode(out)
        except (ValueError, RecursionError, OverflowError) as exc:
            return False, encode({"call": index, "ok": False, "error_kind": "bad_output",
                                  "error": f"bad output: {exc}"})

    try:
        if seconds:
            set_call_timer(CLOCK_PROCESS_CPUTIME_ID, seconds, cpu_start + seconds)
        if wall:
            set_call_timer(CLOCK_MONOTONIC, wall, time.monotonic() + wall)
        try:
            value = fn(*call.get("args", []), **call.get("kwargs", {}))
        finally:
            if seconds:
                end_call_timer(CLOCK_PROCESS_CPUTIME_ID)
            if wall:
                end_call_timer(CLOCK_MONOTONIC)
    except CallTimeout as exc:
        if exc.args and exc.args[0] == signal.SIGALRM:
            return failed("timeout", f"timeout after {wall:.3g} s wall (the per-call backstop of its "
                                     f"{seconds:.3g} s cpu limit: the program sleeps or waits)")
        return failed("timeout", f"timeout: {seconds:.3g} s cpu used (per-call limit)")
    except CpuLimit:
        fatal("timeout", f"timeout: cpu time limit of {cpu_limit} s exceeded")
    except MemoryError as exc:
        return failed("memory", f"memory limit exceeded (MemoryError{': ' + str(exc) if str(exc) else ''})")
    except SystemExit as exc:
        return failed("crash", f"the program called exit({exc.code!r})")
    except BaseException as exc:  # noqa: BLE001 - anything the candidate raises is its crash
        return failed("crash", tail_of_traceback(exc))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    try:
        # fails here, not in write(), on e.g. a huge int
        return True, encode({"call": index, "ok": True, "value": to_plain(value, typed, 0, Budget(max_bytes)),
                             "seconds": elapsed, "cpu_seconds": cpu})
    except OutputTooLarge:
        return failed("output_too_large", f"output too large: the result exceeds {max_bytes} bytes")
    except RecursionError:
        return failed("bad_output", "bad output: nested too deeply to convert")
    except MemoryError:
        return failed("memory", "memory limit exceeded while converting the output")
    except BaseException as exc:  # noqa: BLE001 - BadOutput, tricky __eq__/__len__ ...
        return failed("bad_output", f"bad output: {exc}"[:TAIL])


def use_python_path(paths):
    """The interpreter started with -S: the host's start-up hooks (.pth files, sitecustomize) do
    not run in here. What ``site`` would give a program is made here: the parent's site-packages
    dirs at the end of sys.path, and the builtins exit, quit, help, copyright, credits, license."""
    import site

    for path in paths:
        if path not in sys.path:
            sys.path.append(path)
    if not hasattr(builtins, "copyright"):  # a fork server's child has them from its zygote (0.2 ms)
        site.setquit()
        site.setcopyright()
        site.sethelper()


def main():
    global _chan
    fd = int(sys.argv[1])
    _chan = os.fdopen(fd, "wb", buffering=0)
    sys.dont_write_bytecode = True
    try:
        frames = Frames(os.dup(0))  # the job's header, then its calls
        job = json.loads(frames.next())
        use_python_path(job["python_path"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the candidate's stdin is empty
        os.close(null)
        isolate(job)
    except Exception as exc:  # noqa: BLE001
        fatal("sandbox_error", f"sandbox setup failed: {exc!r}")
    send({"ready": True})  # from here on, the candidate's code may write to this channel too
    signal.signal(signal.SIGXCPU, on_xcpu)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGPROF, on_alarm)
    sys.path.insert(0, job["code"])
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
    # the parent times each call from the moment it sends it, and sends the next one only after
    # this call's outcome: it also decides which calls run (stop_on_error, failed groups)
    write(encode({"start": 0}))
    hold = job.get("hold_outcomes") is True  # every input is in the pipe already (trusted code)
    released = time.monotonic()
    while True:
        line = frames.next()
        if not line:
            break  # the parent closed the call stream: no call is left
        call = json.loads(line.decode("utf-8"))
        ok, outcome = run_call(call["index"], fn, call, typed, cpu_limit, job["limits"]["max_output_bytes"])
        if not hold:
            write(outcome)
            continue
        _held.extend(outcome)
        if len(_held) >= HELD_BYTES or time.monotonic() - released >= HELD_SECONDS:
            release_held()
            released = time.monotonic()
    release_held()
    # the program's prints go into the pipe before "done": the parent stops reading at "done"
    sys.stdout.flush()
    sys.stderr.flush()
    write(encode({"done": True}))
    os._exit(0)


class Frames:
    """The job stream's frames: a decimal length, a newline, that many bytes; b"" at the stream's
    end. Read a pipe-full at a time (one read a frame, where reading the length byte by byte
    took six): reading ahead finds nothing early, because the parent writes a call's frame only
    when it starts that call's clock, after the outcome of the call before (the pipe is the
    parent's gate, not this reader, which the program could replace: trusted up-front runs aside,
    whose frames are all there by design)."""

    def __init__(self, fd):
        self.fd = fd
        self.buffer = bytearray()

    def next(self):
        buffer, want = self.buffer, 0
        while True:
            newline = buffer.find(b"\n")
            if newline >= 0:
                end = newline + 1 + int(buffer[:newline])
                if len(buffer) >= end:
                    frame = bytes(buffer[newline + 1:end])
                    del buffer[:end]
                    return frame
                want = end - len(buffer)
            chunk = os.read(self.fd, max(1 << 16, want))
            if not chunk:
                if buffer:
                    raise EOFError("the job stream ended inside a frame")
                return b""
            buffer += chunk


# run as `python -s -c SOURCE RESULT_FD` inside the sandbox (with the fork server's source appended,
# `... zygote CONTROL_FD PRELOAD PYTHON_PATH HELPERS_DIR`: see heldout.sandbox._zygote)
if __name__ == "__main__" and sys.argv[1:2] != ["zygote"]:
    main()
