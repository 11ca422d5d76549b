"""The fork server (zygote) side: this file's source follows :mod:`heldout.sandbox._child`'s and
:mod:`heldout.sandbox._spare`'s in one program handed to ``python -s -c`` inside the same
bubblewrap root as a fresh sandbox (never imported; the names of both -- ``main``, ``isolate``,
``_fork_spare`` ... -- are its globals).

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
import fcntl
import gc
import selectors
import socket

PR_SET_DUMPABLE = 4
SETUP_FAILED = 125
SIOCOUTQ = 0x5411  # a socket's sent bytes its peer has not read yet
_own_fds = []  # the control socket, the wakeup pipe and its own PID namespace: no execution keeps them
_own_pid_ns = [-1]
# Executions prepared in advance. A spare's setup waits ~10-20 ms on the kernel (its cgroup join
# waits for an RCU grace period) while an execution takes ~6 ms: four keep one ready for
# back-to-back executions (with two, a request waited for a spare still in its setup: p95 2.5x p50)
SPARES = 4
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
_groups = collections.deque()  # (group id, its cgroup.procs fds): made by the harness for spares to join
_ctl = [None]  # the control socket (the zygote's own: no spare keeps it)


def _refill():
    while len(_spares) < SPARES:
        _spares.append(_prepare_spare())


def _report(msg):
    _ctl[0].sendmsg([json.dumps(msg).encode()])  # noqa: F821

def _exit_code(status):
    """bwrap's convention: the child's exit code, or 128 + the signal that killed it."""
    if os.WIFSIGNALED(status):  # noqa: F821
        return 128 + os.WTERMSIG(status)  # noqa: F821
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else SETUP_FAILED  # noqa: F821


def _reset_pid_ns():
    """The zygote's next child is in the zygote's own PID namespace again."""
    _check(_libc.setns(_own_pid_ns[0], CLONE_NEWPID), "reset the PID namespace for children")


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
    unread = False
    if handed is not None:
        unread = _request_unread(handed)
        handed.close()
    execution = _running.pop(child, None)
    if execution is not None:
        report = {"code": -9 if code is None else code}
        if unread:
            # the spare died before it took its request (its memory holder keeps the request socket
            # open, so the request went out): nothing of the execution ran, as when no spare is left
            report["no_spare"] = True
        _report_exit(execution[1], report)
    for spare in [x for x in _spares if x[0] == child]:
        _forget_spare(spare)  # a spare that died unused
        spare[1].close()
        if spare[2] is not None:
            _report({"group_gone": spare[2]})


def _request_unread(sock):
    """Whether the request handed over ``sock`` still waits in the spare's socket: the bytes this
    end sent that the other end has not read (SIOCOUTQ)."""
    queued = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), SIOCOUTQ, queued, True)
    except OSError:
        return False
    return queued[0] > 0


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


def _preload(modules, helpers):
    """Import the preload set (a task's helpers from ``helpers``, a folder no child looks in);
    returns the names imported and, by name, why the others failed (a child then imports such a
    module itself, and fails the same way)."""
    preloaded, failed = [], {}
    if helpers:
        sys.path.insert(0, helpers)  # noqa: F821 - for the preload only: no child looks there
    for name in modules:
        try:
            __import__(name)
            preloaded.append(name)
        except Exception as exc:  # noqa: BLE001
            failed[name] = repr(exc)[:300]
    if helpers:
        sys.path.remove(helpers)  # noqa: F821
        sys.path_importer_cache.pop(helpers, None)  # noqa: F821
    return preloaded, failed


def _start(ctl):
    """Everything before the first spare, then the hello to the harness: True when the zygote
    can serve (one thread, its own PID namespace for the spares)."""
    os.chdir("/")  # noqa: F821
    # every reaper shares this memory and file table and is PID 1 of its execution's namespace:
    # nothing in there may read or write them through /proc/1 or a pidfd (a candidate runs under
    # another uid without capabilities anyway; this holds even for a process that had both)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    use_python_path(json.loads(sys.argv[4]))  # noqa: F821 - before the preload: numpy is in site-packages
    helpers = sys.argv[5] if len(sys.argv) > 5 else ""  # noqa: F821 - the task's helper modules, if any
    seccomp_program()  # noqa: F821 - built once, here: every child inherits it
    preloaded, failed = _preload(json.loads(sys.argv[3]), helpers)  # noqa: F821
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
    return problem is None


def _kill_execution(ident, killed):
    """The harness asked for execution ``ident`` to be killed."""
    for pid, (running, _) in _running.items():
        if running == ident and pid in _reaper_of:
            killed.add(pid)
            # the child first: its reaper goes when it is reaped (see _reaped), and the whole
            # execution with it. Killed together, the holder could die first and leave the
            # child to tear its memory down on the exit's path
            os.kill(pid, 9)  # noqa: F821


def _on_control(ctl, killed):
    """One message of the harness: a group for a spare, a kill, or a request (handed to a spare).
    False when the harness is gone."""
    msg, fds = _recv(ctl)
    if not msg:
        for reaper in _reapers:
            os.kill(reaper, 9)  # noqa: F821 - the harness is gone: so is everything here
        return False
    req = json.loads(msg)  # noqa: F821
    if "stock" in req:
        _groups.append((int(req["stock"]), fds))
        return True
    if "kill" in req:
        _kill_execution(req["kill"], killed)
    else:
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
    return True


def _reap_all(killed):
    """Reap every child of the zygote that has exited."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)  # noqa: F821
        except ChildProcessError:
            return
        if pid == 0:
            return
        _reaped(pid, status, killed)


def serve():
    ctl = socket.socket(fileno=int(sys.argv[2]))  # noqa: F821
    _ctl[0] = ctl
    if not _start(ctl):
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
            elif key.data != "ctl":
                _spare_ready(key.fileobj, key.data[1])
            elif not _on_control(ctl, killed):
                return
        _reap_all(killed)
        _refill()


if __name__ == "__main__" and sys.argv[1:2] == ["zygote"]:  # noqa: F821
    serve()
