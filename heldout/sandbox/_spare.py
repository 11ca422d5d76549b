"""A spare execution of the fork server: made in advance, used for exactly one request. Its
source sits between :mod:`heldout.sandbox._child`'s and :mod:`heldout.sandbox._zygote`'s in the
zygote's program (never imported: the names of both -- ``main``, the constants and the pools of
``_zygote`` -- are its globals; see ``_zygote`` for the three processes of an execution).

A spare is a **reaper** (PID 1 of a new PID namespace, :func:`_new_reaper`) and a **child** forked
inside it (:func:`_fork_spare`), which builds its isolation (:func:`_spare_setup`: namespaces,
scratch, ``/dev/shm``, ``/proc``, its **memory holder** and its cgroup), says it is ready, and
waits for its request (:func:`_wait_for_request`); the request's code dir, fds and environment
make it the ordinary sandboxed child (:func:`_become_child`). The zygote's side of a spare
(:func:`_prepare_spare`, :func:`_spare_ready`, :func:`_forget_spare`) keeps its pool."""

import errno
import importlib
import selectors
import socket

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
CLONE_VM, CLONE_FS, CLONE_FILES, CLONE_PARENT = 0x100, 0x200, 0x400, 0x8000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
PROC_COVERS = ("sys", "sysrq-trigger", "irq", "bus")  # what bwrap's --proc makes read-only
RESULT_FD = 3
SCRATCH = "/sandbox/scratch"
REAPER_STACK_BYTES = 16384
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
