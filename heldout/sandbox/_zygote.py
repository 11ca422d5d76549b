"""The fork server (zygote) side: this file's source is appended to :mod:`heldout.sandbox._child`'s
and handed to ``python -s -c`` inside the same bubblewrap root as a fresh sandbox (never imported;
the names of ``_child`` -- ``main``, ``isolate`` ... -- are its globals).

The zygote is trusted code that runs no candidate itself. It imports the modules it was asked to
preload (a task's helper modules from a folder of its inbox, which every child's own code dir
covers), freezes the garbage collector (fewer copy-on-write pages in every child) and then waits
on its control socket, which only the harness holds (an inherited fd; it binds no socket anyone
could connect to). Per execution (in advance: see ``SPARES``) it makes three processes:

* a **reaper**, PID 1 of a new PID namespace: a ``clone`` that shares the zygote's memory, file
  table and file-system state and does nothing but wait in ``pause()`` with every signal blocked.
  It holds the namespace open; when it dies the kernel kills everything left in the namespace,
  and reports its death only after every other process of the namespace was reaped. Sharing the
  zygote's memory, it costs no copy of the zygote's page tables to make and none to tear down
  (a forked reaper did both: about 0.7 ms of every execution's exit, measured);
* the **child**, PID 2 of that namespace, forked by the zygote inside it (``setns`` on the
  reaper's ``/proc/PID/ns/pid``), which unshares fresh mount, IPC, network, UTS and cgroup
  namespaces, mounts a fresh size-capped tmpfs as the scratch, remounts ``/dev`` read-only
  and mounts a fresh, capped tmpfs on ``/dev/shm`` (as a fresh sandbox has them), mounts a ``/proc`` of its PID namespace
  (hidepid=2: the child sees no process but its own; with bwrap's read-only covers), makes its memory holder, joins the execution's own cgroup (an
  empty group the harness made in advance and sent with its ``cgroup.procs`` fds; the harness
  sets its limits when it sends the request), says it is ready (the zygote reports the spare's
  group to the harness only then, and hands a request that brings its own group to a ready spare
  first: a request sent to a spare still in its setup waited up to ~20 ms) and waits for its
  request;
* the child's **memory holder** (PID 3): a ``clone`` that shares the child's memory and waits in
  ``pause()`` as the reaper does, outside the execution's cgroup, so that the child's exit does
  not tear down its page tables (see :func:`_hold_memory`).

On the request (a request that brings a group of its own moves the child there first) the child
binds the execution's code dir read-only over the code path (which held the inbox of every
execution's code dir, now out of reach), gets exactly the fds of a fresh sandbox (job on stdin,
output on stdout/stderr, result channel on fd 3), the sandbox environment, re-seeded random
states and cleared import caches, and runs the ordinary child ``main()`` (rlimits, throw-away uid,
no_new_privs, seccomp, audit hook, the calls).

One fork of the zygote's image per execution: copying and tearing down its page tables is most of
what an execution costs the machine.

When the child exits (or the harness asks for the execution to be killed: the zygote kills the
child) the zygote reaps it, reports the execution's exit and kills the reaper, which takes
whatever is left of the execution with it (the holder too). The report has bwrap's exit-code
convention (the child's code, or 128 + the signal; -9 when the harness had it killed first); the
harness then waits until the execution's cgroup is empty: every process of the run has exited.
The code is only used in messages (the harness decides every outcome from the result channel and
the cgroup, as for a fresh sandbox). Orphans of the run are reaped when the namespace dies, not
before (a run allowed processes keeps their zombies until then); the holder tears the child's
memory down then, after the report."""

import array
import collections
import errno
import gc
import importlib
import selectors
import socket

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
CLONE_VM, CLONE_FS, CLONE_FILES, CLONE_PARENT = 0x100, 0x200, 0x400, 0x8000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
PROC_COVERS = ("sys", "sysrq-trigger", "irq", "bus")  # what bwrap's --proc makes read-only
RESULT_FD = 3
SETUP_FAILED = 125
_own_fds = []  # the control socket, the wakeup pipe and its own PID namespace: no execution keeps them
_own_pid_ns = [-1]
# Executions prepared in advance. A spare's setup waits ~10-20 ms on the kernel (its cgroup join
# waits for an RCU grace period) while an execution takes ~6 ms: four keep one ready for
# back-to-back executions (with two, a request waited for a spare still in its setup: p95 2.5x p50)
SPARES = 4
SCRATCH = "/sandbox/scratch"
SHM, SHM_BYTES = "/dev/shm", 64 << 20  # the cap of a fresh sandbox's /dev/shm (root.SHM_MB; a test checks)
_spares = collections.deque()  # (child pid, request socket, group id or None), oldest first
_waiting = set()  # pids of the spares that said they wait for a request (their setup is done)
# child pid -> the zygote's end of its request socket, kept open until the child is reaped: closed
# with the spare's "ready" unread in it, the child's read of its request fails (ECONNRESET)
_handed = {}
_sel = [None]  # the zygote's selector: the control socket, the wakeup pipe, spares not yet waiting
_reaper_of = {}  # child pid -> its reaper's pid, until the child is reaped
# child pid -> (execution id, the write end of its exit report's pipe: the harness reads it)
_running = {}
_reapers = {}  # reaper pid -> its stack, until the reaper is reaped
_dying = set()  # reapers killed and not yet reaped: their holders' teardowns are pending
# more pending teardowns than this (a busy machine starves a low priority) and the holders get the
# default priority: the memory of finished executions must not pile up
SLOW_TEARDOWNS = 4
REAPER_STACK_BYTES = 16384
_groups = collections.deque()  # (group id, its cgroup.procs fds): made by the harness for spares to join
_ctl = [None]  # the control socket (the zygote's own: no spare keeps it)


def _refill():
    while len(_spares) < SPARES:
        _spares.append(_prepare_spare())


def _report(msg):
    _ctl[0].sendmsg([json.dumps(msg).encode()])  # noqa: F821

_libc = libc()  # noqa: F821 - _child's: every child of this zygote inherits the handle


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()  # noqa: F821
        raise OSError(err, f"{what}: {os.strerror(err)}")  # noqa: F821


def _mount(source, target, fstype, flags, data=None):
    _check(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags,
                       data and data.encode()), f"mount {target}")


def _bind_readonly(source, target):
    _mount(source, target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _exit_code(status):
    """bwrap's convention: the child's exit code, or 128 + the signal that killed it."""
    if os.WIFSIGNALED(status):  # noqa: F821
        return 128 + os.WTERMSIG(status)  # noqa: F821
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else SETUP_FAILED  # noqa: F821


def _reset_pid_ns():
    """The zygote's next child is in the zygote's own PID namespace again."""
    _check(_libc.setns(_own_pid_ns[0], CLONE_NEWPID), "reset the PID namespace for children")


def _spare_setup(scratch, group_fds):
    """The child, before its request: its namespaces, scratch and /proc (nothing shared with an
    earlier or concurrent execution but the read-only root), its memory holder, then its own cgroup
    (if the harness gave the spare one: the holder stays out of it)."""
    _libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # the zygote gone: so is this execution
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWCGROUP), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "size=1048576,mode=1777")
    _mount(None, "/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    # /dev/shm is bwrap's one tmpfs for the zygote's life (a mount of its own: the remount of /dev
    # leaves it writable): a fresh one per execution, or a file parked there reaches the next
    # execution and a full one makes it fail with ENOSPC
    _mount("tmpfs", SHM, "tmpfs", MS_NOSUID | MS_NODEV, f"size={SHM_BYTES},mode=1777")
    # hidepid=2 (invisible): the child, under its throw-away uid, sees no process it may not
    # ptrace (the root reaper and memory holder are not there at all: the holder shares the child's
    # memory, and the kernel lets a process read the maps of any process with its own memory)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    for name in PROC_COVERS:
        if os.path.exists("/proc/" + name):  # noqa: F821
            _bind_readonly("/proc/" + name, "/proc/" + name)
    try:
        _hold_memory()  # it keeps the namespaces too: their teardown leaves the path with it
    except OSError:
        pass  # without a holder the child's own exit tears its memory down (slower, the same)
    for fd in group_fds:
        # joined now, before any request (a cgroup.procs write can wait for an RCU grace period,
        # ~10 ms here: it is off the execution's path)
        try:
            os.write(fd, b"0")  # noqa: F821
        except OSError as exc:
            # ENODEV: the group is gone already. The zygote handed this spare to a request that
            # brings its own group (which the child moves to) and reported its group gone, and
            # the harness removed it before this join ran. No request can name it any more.
            if exc.errno != errno.ENODEV:
                raise
        os.close(fd)  # noqa: F821


_clone = _libc.clone
_clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]  # noqa: F821
_clone.restype = ctypes.c_int  # noqa: F821
_PAUSE = ctypes.cast(_libc.pause, ctypes.c_void_p)  # noqa: F821
# signal masks as libc's sigset_t (128 bytes), set through libc: signal.pthread_sigmask turns every
# signal of the masks it returns into an enum member, 0.2 ms of every spare
_ALL_SIGNALS, _SAVED_MASK = ctypes.create_string_buffer(128), ctypes.create_string_buffer(128)  # noqa: F821
_libc.sigfillset(_ALL_SIGNALS)
SIG_BLOCK, SIG_SETMASK = 0, 2


def _parked_clone(flags, what):
    """A process that shares the caller's memory (``CLONE_VM`` among ``flags``) and waits in
    ``pause()`` on a stack of its own in that memory, every signal blocked: it runs no handler
    there, so it never returns to user space and only SIGKILL ends it. Returns ``(pid, stack)``;
    the stack must outlive the process."""
    stack = ctypes.create_string_buffer(REAPER_STACK_BYTES)  # noqa: F821
    top = (ctypes.addressof(stack) + REAPER_STACK_BYTES - 64) & ~15  # noqa: F821
    err = _libc.pthread_sigmask(SIG_BLOCK, _ALL_SIGNALS, _SAVED_MASK)  # the clone inherits the mask
    if err:
        raise OSError(err, f"block signals: {os.strerror(err)}")  # noqa: F821
    try:
        pid = _clone(_PAUSE, top, flags | signal.SIGCHLD, None)  # noqa: F821
        err = ctypes.get_errno()  # noqa: F821
    finally:
        _libc.pthread_sigmask(SIG_SETMASK, _SAVED_MASK, None)
    if pid <= 0:
        raise OSError(err, f"clone {what}: {os.strerror(err)}")  # noqa: F821
    return pid, stack


def _new_reaper():
    """PID 1 of a new PID namespace: a parked clone sharing the zygote's memory, file table and
    file-system state. Returns its pid."""
    pid, stack = _parked_clone(CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_NEWPID, "a reaper")
    _reapers[pid] = stack
    return pid


_holder = []  # in a spare child: its memory holder's stack (the holder waits on it)
PARKED_SECONDS = 5.0
HOLDER_NICENESS = 19


def _hold_memory():
    """The child's memory holder: a parked clone sharing the child's memory (and its new
    namespaces), a child of the zygote in the execution's PID namespace. It is made before the
    child joins its execution's group, so it is none of the run's processes, and before any fd
    of the execution arrives (it keeps copies of the zygote's log, the spare's request socket and
    its group's fds, and uses none). When the child exits, its memory is still in use, so the
    exit does not tear down the page tables (~2 ms with numpy's image, the largest part of an
    execution's exit). The holder does that when its namespace dies, after the exit is
    reported, at a low priority (at the default one it competed with the next execution's
    start, and nothing was gained: measured).

    The candidate can write this memory. The holder never returns to user space once it sleeps
    in ``pause()`` (every signal blocked; only root outside could stop or freeze it), so it runs
    nothing the candidate wrote: the child waits until it sleeps there, and kills it and goes on
    without a holder if it does not in time."""
    pid, stack = _parked_clone(CLONE_VM | CLONE_PARENT, "a memory holder")
    _holder.append(stack)
    deadline = time.monotonic() + PARKED_SECONDS  # noqa: F821
    try:
        # its first system call is pause(); "S" (an interruptible sleep) is only ever that one
        while not _sleeps(pid):
            if time.monotonic() > deadline:  # noqa: F821
                raise OSError(errno.ETIMEDOUT, "the memory holder did not park")
            time.sleep(0.0001)  # noqa: F821
        os.setpriority(os.PRIO_PROCESS, pid, HOLDER_NICENESS)  # noqa: F821
    except BaseException:
        os.kill(pid, 9)  # noqa: F821 - the zygote reaps it
        raise


def _sleeps(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rpartition(b")")[2].split()[0] == b"S"


def _wait_for_request():
    """The spare child: built in advance, used for exactly one execution. What does not depend
    on the request is done before it arrives (off the execution's path)."""
    numpy_random = sys.modules.get("numpy.random")  # noqa: F821
    if numpy_random is not None:
        numpy_random.seed()  # fresh entropy, as a fresh import would draw (random reseeds itself at fork)
    # No warm-up here (running a throw-away job so that its copy-on-write faults come before the
    # request): it took ~0.7 ms off the path of a lone execution but cost each spare ~1 ms of CPU,
    # and back to back, where the machine is busy with the next spares and the last teardowns,
    # that made the tail longer (p95 of 300 forked executions 9.5-11.4 ms with it, 7.9-9.2 without;
    # p50 5.5-5.9 and 5.6-6.3 ms)
    importlib.invalidate_caches()
    sys.path_importer_cache.clear()  # noqa: F821
    sock = socket.socket(fileno=_spare_end[0])
    try:
        sock.send(b"ready")  # the zygote routes requests to spares that said so (see _pick_spare)
    except OSError:
        os._exit(SETUP_FAILED)  # noqa: F821 - the zygote is gone
    msg, fds = _recv(sock)
    if not msg:
        os._exit(SETUP_FAILED)  # noqa: F821 - the zygote is gone
    req = json.loads(msg)  # noqa: F821
    n_cg = int(req["n_cgroup_fds"])
    stdin_r, stdout_w, result_w = fds[:3]
    try:
        for fd in fds[3:3 + n_cg]:  # a request that brings its group: the child moves there now
            os.write(fd, b"0")  # noqa: F821 - what it starts follows
            os.close(fd)  # noqa: F821
        _check(_libc.unshare(CLONE_NEWCGROUP), "unshare the cgroup namespace")  # rooted at its own group
        # the zygote's code dir is the inbox of every execution's code dir: covering it with
        # this execution's own leaves the others out of reach
        _bind_readonly(req["code"] + "/" + req["name"], req["code"])
        _mount(None, req["scratch"], None, MS_REMOUNT | MS_NOSUID | MS_NODEV,
               f"size={int(req['scratch_bytes'])},mode=1777")
    except BaseException as exc:  # noqa: BLE001
        os.write(stdout_w, f"fork server: execution setup failed: {exc!r}\n".encode())  # noqa: F821
        os._exit(SETUP_FAILED)  # noqa: F821
    _become_child(req, (stdin_r, stdout_w, result_w))


def _become_child(req, fds):
    stdin_r, stdout_w, result_w = fds
    os.dup2(stdin_r, 0)  # noqa: F821
    os.dup2(stdout_w, 1)  # noqa: F821
    os.dup2(stdout_w, 2)  # noqa: F821
    os.dup2(result_w, RESULT_FD)  # noqa: F821
    os.closerange(RESULT_FD + 1, 1 << 16)  # noqa: F821 - the request socket, anything inherited
    if dict(os.environ) != req["env"]:  # noqa: F821 - the zygote was started with the sandbox environment
        os.environ.clear()  # noqa: F821
        os.environ.update(req["env"])  # noqa: F821
    sys.argv[:] = ["-c", str(RESULT_FD)]  # noqa: F821
    main()  # noqa: F821 - the ordinary child; it never returns


_spare_end = [-1]  # in a spare's processes: their end of the request socket


def _prepare_spare():
    """Make a spare execution (a reaper and its waiting child), in the next group the harness
    made for one if there is any, and return ``(child pid, zygote's end of its request socket,
    group id or None)``."""
    gid, group_fds = _groups.popleft() if _groups else (None, [])
    try:
        pid, ours = _fork_spare(group_fds)
    except BaseException:
        if gid is not None:
            _report({"group_gone": gid})
        raise
    finally:
        for fd in group_fds:
            os.close(fd)  # noqa: F821 - the reaper has its copies
    _sel[0].register(ours, selectors.EVENT_READ, ("spare", pid))  # until it says it is ready
    return pid, ours, gid


def _spare_ready(sock, pid):
    """A spare said it waits for a request (or died first). Its group, if it has one, is
    reported then, not when it was forked: the harness names only groups whose spare is ready."""
    spare = next((x for x in _spares if x[0] == pid), None)
    if spare is None:
        return  # handed to a request earlier in the same wake-up: this event is stale
    try:
        said = sock.recv(16)
    except OSError:
        said = b""
    _sel[0].unregister(sock)
    if said != b"ready":
        return  # it died before it was ready: reaped (and its group reported gone) in the wait loop
    _waiting.add(pid)
    if spare[2] is not None:
        _report({"spare": spare[2]})


def _forget_spare(spare):
    """``spare`` leaves the pool (handed to a request, or dead); the caller closes its socket."""
    _spares.remove(spare)
    _waiting.discard(spare[0])
    try:
        _sel[0].unregister(spare[1])
    except (KeyError, ValueError):
        pass  # it had said it was ready


def _fork_spare(group_fds):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reaper = _new_reaper()
    try:
        # the pid cannot name another process: the reaper is the zygote's child, not yet reaped
        ns = os.open(f"/proc/{reaper}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)  # noqa: F821
        try:
            _check(_libc.setns(ns, CLONE_NEWPID), "enter the reaper's PID namespace")  # for the next child
        finally:
            os.close(ns)  # noqa: F821
        try:
            pid = os.fork()  # noqa: F821 - PID 2 of the reaper's namespace
        except BaseException:
            _reset_pid_ns()
            raise
    except BaseException:
        os.kill(reaper, 9)  # noqa: F821 - reaped with the others
        raise
    if pid:
        _reset_pid_ns()
        theirs.close()
        _reaper_of[pid] = reaper
        return pid, ours
    try:
        signal.set_wakeup_fd(-1)  # noqa: F821
        # the zygote changed only SIGCHLD and the wakeup fd: every other disposition is a fresh Python's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # noqa: F821
        ours.close()
        for fd in _own_fds:
            os.close(fd)  # noqa: F821
        for spare in _spares:
            spare[1].close()
        for handed in _handed.values():
            handed.close()
        for _, fd in _running.values():
            os.close(fd)  # noqa: F821 - running executions' reports
        for _, fds in _groups:
            for fd in fds:
                os.close(fd)  # noqa: F821 - other spares' groups
        _spare_end[0] = theirs.detach()
        _spare_setup(SCRATCH, group_fds)
        _wait_for_request()
    finally:
        os._exit(SETUP_FAILED)  # noqa: F821 - never back into the zygote's loop


def _reaped(pid, status, killed):
    """One process of the zygote's reaped. A child: its reaper is killed (and with it the
    child's memory holder and whatever the child left) and its execution is finished. A reaper
    or a memory holder: nothing is left of its execution."""
    reaper = _reaper_of.pop(pid, None)
    if reaper is None:
        _reapers.pop(pid, None)
        _dying.discard(pid)
        return
    # reported first: the reaper's death would run before the report, on this CPU (the harness
    # kills and waits for whatever of the run is still in its group, as the reaper's death would)
    _finished(pid, -9 if pid in killed else _exit_code(status), killed)
    try:
        os.kill(reaper, 9)  # noqa: F821
    except ProcessLookupError:
        pass
    _dying.add(reaper)
    if len(_dying) > SLOW_TEARDOWNS:
        _hurry_holders()


def _hurry_holders():
    """Give every memory holder (the zygote's children that are neither a child nor a reaper)
    the default priority."""
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:  # noqa: F821
            children = [int(p) for p in f.read().split()]
    except OSError:
        return
    for pid in children:
        if pid not in _reaper_of and pid not in _reapers:
            try:
                os.setpriority(os.PRIO_PROCESS, pid, 0)  # noqa: F821
            except OSError:
                pass


def _finished(child, code, killed):
    """The execution (or the spare) of ``child`` is over: the child is reaped (its reaper is
    killed next). Its exit is reported, or the spare is dropped."""
    killed.discard(child)
    handed = _handed.pop(child, None)
    if handed is not None:
        handed.close()
    execution = _running.pop(child, None)
    if execution is not None:
        _report_exit(execution[1], {"code": -9 if code is None else code})
    for spare in [x for x in _spares if x[0] == child]:
        _forget_spare(spare)  # a spare that died unused
        spare[1].close()
        if spare[2] is not None:
            _report({"group_gone": spare[2]})


def _report_exit(fd, msg):
    """An execution's exit report, on its own pipe (one small write: atomic, never blocking)."""
    try:
        os.write(fd, json.dumps(msg).encode() + b"\n")  # noqa: F821
    except OSError:
        pass  # the harness gave up on it
    finally:
        os.close(fd)  # noqa: F821


def _recv(ctl):
    fds = array.array("i")
    msg, anc, _, _ = ctl.recvmsg(1 << 20, socket.CMSG_SPACE(16 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


def _pick_spare(want):
    """The spare for a request: the one in the request's group ``want`` (the harness names only
    groups whose spare is ready); for a request that brings its own group (``want`` None), one in
    no group, a ready one first (one still in its setup keeps the request waiting), else the
    oldest (its child moves itself and its reaper to the request's group, and its old group is
    reported gone; a spare in a group is taken last, since the harness may be naming it)."""
    if want is not None:
        return next((x for x in _spares if x[2] == want), None)
    free = [x for x in _spares if x[2] is None]
    return next((x for x in free if x[0] in _waiting), free[0] if free else (_spares[0] if _spares else None))


def _dispatch(msg, fds, want):
    """Hand a request to a spare (see :func:`_pick_spare`): its child's pid, or None when there
    is no spare to hand it to."""
    while True:
        spare = _pick_spare(want)
        if spare is None:
            return None
        _forget_spare(spare)
        pid, sock, gid = spare
        try:
            sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            taken = True
        except OSError:
            taken = False  # that spare died
        if taken:
            _handed[pid] = sock
        else:
            sock.close()
        if gid is not None and (gid != want or not taken):
            _report({"group_gone": gid})  # its spare died, or its child moves to the request's group
        if taken:
            return pid
        if want is not None:
            return None


def serve():
    ctl = socket.socket(fileno=int(sys.argv[2]))  # noqa: F821
    _ctl[0] = ctl
    os.chdir("/")  # noqa: F821
    # every reaper shares this memory and file table and is PID 1 of its execution's namespace:
    # nothing in there may read or write them through /proc/1 or a pidfd (a candidate runs under
    # another uid without capabilities anyway; this holds even for a process that had both)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    use_python_path(json.loads(sys.argv[4]))  # noqa: F821 - before the preload: numpy is in site-packages
    helpers = sys.argv[5] if len(sys.argv) > 5 else ""  # noqa: F821 - the task's helper modules, if any
    preloaded, failed = [], {}
    seccomp_program()  # noqa: F821 - built once, here: every child inherits it
    if helpers:
        sys.path.insert(0, helpers)  # noqa: F821 - for the preload only: no child looks there
    for name in json.loads(sys.argv[3]):  # noqa: F821
        try:
            __import__(name)
            preloaded.append(name)
        except Exception as exc:  # noqa: BLE001 - a child then imports it itself (and fails the same way)
            failed[name] = repr(exc)[:300]
    if helpers:
        sys.path.remove(helpers)  # noqa: F821
        sys.path_importer_cache.pop(helpers, None)  # noqa: F821
    threads = len(os.listdir("/proc/self/task"))  # noqa: F821 - forking a threaded process is unsafe
    gc.collect()
    gc.freeze()
    problem = None if threads == 1 else f"{threads} threads after the preload"
    try:
        _own_pid_ns[0] = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)  # noqa: F821
        _own_fds.append(_own_pid_ns[0])
        _check(_libc.unshare(CLONE_NEWPID), "unshare the PID namespace")  # what every spare needs
        _reset_pid_ns()
    except OSError as exc:
        problem = problem or str(exc)
    ctl.sendmsg([json.dumps({"ready": problem is None, "problem": problem, "threads": threads,  # noqa: F821
                             "preloaded": preloaded, "failed": failed}).encode()])
    if problem is not None:
        return
    wake_r, wake_w = os.pipe()  # noqa: F821
    os.set_blocking(wake_w, False)  # noqa: F821
    signal.set_wakeup_fd(wake_w)  # noqa: F821
    signal.signal(signal.SIGCHLD, lambda *_: None)  # noqa: F821
    _own_fds.extend([ctl.fileno(), wake_r, wake_w])
    sel = _sel[0] = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    killed = set()  # children whose execution the harness had killed before they were reaped
    _refill()
    while True:
        for key, _ in sel.select(timeout=1.0):
            if key.data == "wake":
                os.read(wake_r, 4096)  # noqa: F821
                continue
            if key.data != "ctl":
                _spare_ready(key.fileobj, key.data[1])
                continue
            msg, fds = _recv(ctl)
            if not msg:
                for reaper in _reapers:
                    os.kill(reaper, 9)  # noqa: F821 - the harness is gone: so is everything here
                return
            req = json.loads(msg)  # noqa: F821
            if "stock" in req:
                _groups.append((int(req["stock"]), fds))
                continue
            if "kill" in req:
                for pid, (ident, _) in _running.items():
                    if ident == req["kill"] and pid in _reaper_of:
                        killed.add(pid)
                        # the child first: its reaper goes when it is reaped (see _reaped), and
                        # the whole execution with it. Killed together, the holder could die
                        # first and leave the child to tear its memory down on the exit's path
                        os.kill(pid, 9)  # noqa: F821
                for fd in fds:
                    os.close(fd)  # noqa: F821
                continue
            exit_pipe = fds.pop()  # the zygote's, not the child's
            child = _dispatch(msg, fds, req.get("group"))
            if child is None:
                # no spare left (it is not there yet, or the one in the request's group died):
                # report the execution as failed to set up
                _report_exit(exit_pipe, {"code": SETUP_FAILED, "no_spare": True})
            else:
                _running[child] = (req["id"], exit_pipe)
            for fd in fds:
                os.close(fd)  # noqa: F821
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)  # noqa: F821
            except ChildProcessError:
                break
            if pid == 0:
                break
            _reaped(pid, status, killed)
        _refill()

if __name__ == "__main__" and sys.argv[1:2] == ["zygote"]:  # noqa: F821
    serve()
