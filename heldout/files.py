"""Files heldout reads from a user or a run dir, and files it writes: the one rule for each.

Reading (:func:`read_user_bytes` and its text, JSON and TOML forms, :func:`regular_files` for a
folder): only a regular file under a size limit, else one clear error naming what it is and
where. Names and folders a user gives (:func:`check_name`, :func:`check_folder`). Writing
(:func:`write_text_atomically`): through a temp name unique to its writer, renamed over the
target, so a reader never sees half a file (:func:`write_bytes_atomically` for bytes);
:func:`remove_stale_temp_files` clears what a killed
writer left. Temp folders (:func:`make_temp_dir`): inside one folder per process that the next
process removes if its owner was killed. Standard library only, like :mod:`heldout.contracts` (an isolated optimizer's sandbox
may import it)."""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

from heldout.contracts import DataError, HeldoutError


def read_user_bytes(path: "str | os.PathLike[str]", what: str, *, max_bytes: int = 64 * 1024 * 1024,
                    error: type[HeldoutError] = DataError, follow_symlinks: bool = True) -> bytes:
    """The bytes of a file heldout reads from a user or a run dir (a study file, outputs, a
    candidate, a ledger, a run record). The one rule for every such file: a missing path, a
    directory, anything that is not a regular file (a FIFO, a device such as ``/dev/zero``, a
    socket: refused before a read could block or never end), an unreadable file or one over
    ``max_bytes`` is one ``error`` naming ``what`` and the path; nothing else is read. Without
    ``follow_symlinks`` a path that is itself a symbolic link is refused too (what goes into a
    sandbox: a link would carry the file it names, from anywhere on the host)."""
    p = os.fspath(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat below refuses it
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
                     | (0 if follow_symlinks else os.O_NOFOLLOW))
    except FileNotFoundError:
        raise error(f"{what} {p} does not exist") from None
    except OSError as exc:
        if not follow_symlinks and exc.errno == errno.ELOOP:
            raise error(f"{what} {p} is a symbolic link: refused (copy the file itself in)") from None
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise error(f"{what} {p} is a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{what} {p} is not a regular file (a device, FIFO or socket): refused")
        if info.st_size > max_bytes:
            raise error(f"{what} {p} is {info.st_size:,} bytes, over the limit of {max_bytes:,}")
        chunks, size = [], 0
        while size <= max_bytes:  # files that report size 0 (/proc) are capped as they are read
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise error(f"{what} {p} is over the limit of {max_bytes:,} bytes")
    return b"".join(chunks)


def read_user_text(path: "str | os.PathLike[str]", what: str, *, max_bytes: int = 64 * 1024 * 1024,
                   error: type[HeldoutError] = DataError, follow_symlinks: bool = True) -> str:
    """:func:`read_user_bytes` as text: bytes that are not UTF-8, or a NUL character, are one
    ``error`` too (never a traceback)."""
    p = os.fspath(path)
    data = read_user_bytes(path, what, max_bytes=max_bytes, error=error, follow_symlinks=follow_symlinks)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {p} is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") from None
    if "\x00" in text:
        raise error(f"{what} {p} holds a NUL character at offset {text.index(chr(0))}: not a text file")
    return text


def regular_files(folder: "str | os.PathLike[str]", what: str, *, error: type[HeldoutError] = HeldoutError,
                  max_files: int = 10_000, skip: tuple[str, ...] = ("__pycache__",)) -> list[str]:
    """The relative paths (``a/b.py``) of every file under ``folder``, the rule for anything heldout
    copies into a sandbox (a candidate folder, a user's code): directories and regular files only,
    none of them reached through a symbolic link. A symlink (to a file or a folder, inside or
    pointing out) or a special file (FIFO, device, socket) anywhere below is one ``error`` naming it:
    a link would carry whatever it names on the host into the sandbox. Folders named in ``skip``
    (bytecode caches) are left out."""
    root = os.fspath(folder)
    if os.path.islink(root):
        raise error(f"{what} {root} is a symbolic link: refused (name the folder itself)")
    if not os.path.isdir(root):
        raise error(f"{what} {root} is not a folder")
    found: list[str] = []
    todo = [""]
    while todo:
        rel = todo.pop()
        try:
            entries = sorted(os.scandir(os.path.join(root, rel) if rel else root), key=lambda e: e.name)
        except OSError as exc:
            raise error(f"cannot read {what} {os.path.join(root, rel)}: {exc.strerror or exc}") from None
        for entry in entries:
            path = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_symlink():
                raise error(f"{what} {root}: {path} is a symbolic link: refused (only regular files are copied in)")
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in skip:
                    todo.append(path)
            elif entry.is_file(follow_symlinks=False):
                found.append(path)
                if len(found) > max_files:
                    raise error(f"{what} {root} holds over {max_files:,} files: refused")
            else:
                raise error(f"{what} {root}: {path} is not a regular file (a FIFO, device or socket): refused")
    return sorted(found)


def read_user_json(path: "str | os.PathLike[str]", what: str, *, expect: type = dict,
                   max_bytes: int = 64 * 1024 * 1024, error: type[HeldoutError] = DataError) -> Any:
    """:func:`read_user_text` parsed as one JSON value of type ``expect`` (an object by default):
    truncated JSON or a value of another type is one ``error``."""
    text = read_user_text(path, what, max_bytes=max_bytes, error=error)
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise error(f"{what} {os.fspath(path)} is not valid JSON: {exc}") from None
    if not isinstance(value, expect):
        names = {dict: "a JSON object", list: "a JSON list"}
        raise error(f"{what} {os.fspath(path)} holds {names.get(type(value), f'JSON {type(value).__name__}')}, "
                    f"expected {names.get(expect, expect.__name__)}")
    return value


MAX_TOML_DEPTH = 16
"""How deep arrays and tables may nest in a TOML file a user hands heldout (a study needs 3)."""


def read_user_toml(path: "str | os.PathLike[str]", what: str, *, max_bytes: int = 1024 * 1024,
                   error: type[HeldoutError] = DataError) -> dict[str, Any]:
    """:func:`read_user_text` parsed as TOML (a study or protocol file): invalid TOML, or arrays and
    tables nested deeper than :data:`MAX_TOML_DEPTH` (which would exhaust the parser's recursion,
    ``[[[[...]]]]`` 5,000 deep), is one ``error``."""
    text = read_user_text(path, what, max_bytes=max_bytes, error=error)
    deep = f"{what} {os.fspath(path)} nests arrays or tables deeper than {MAX_TOML_DEPTH} levels: refused"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} {os.fspath(path)} is not valid TOML: {exc}") from None
    except RecursionError:  # the parser recurses once per level
        raise error(deep) from None
    todo = [(data, 1)]
    while todo:  # without recursion: the parsed value is the input
        value, depth = todo.pop()
        if depth > MAX_TOML_DEPTH:
            raise error(deep)
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        todo.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return data


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+\-:?=&,@]{0,99}")
"""What a name heldout turns into a file or folder (a method, a split profile) may hold."""


def check_name(name: Any, what: str, *, error: type[HeldoutError] = HeldoutError) -> str:
    """``name`` when it is a plain name by :data:`NAME` (an allow-list: no newline, NUL, slash,
    "..", space, leading "-" or control character can reach the file system), else ``error``."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or name in (".", ".."):
        raise error(f"{what} {name!r} is not allowed: use 1-100 letters, digits and ._+-:?=&,@, starting "
                    "with a letter or digit (it names a file or folder)")
    return name


def check_folder(path: "str | os.PathLike[str]", what: str, *, error: type[HeldoutError] = HeldoutError) -> str:
    """A folder heldout will create or write into (a run dir, a report's --out, a cache): refused
    in one ``error`` before anything is written when it could not be made or written, so no command
    fails half-way with a traceback. Rules: no control character (newline, NUL, ...), UTF-8 text; the path and
    each name it adds within the system's length limits; the path, or else the nearest part of it
    that exists, is a folder (not a file, a device, a FIFO, a link to nothing or a link loop) in
    which a folder can be made (a read-only or pseudo file system, a folder without write
    permission: refused). The last rule is asked of the kernel itself: a folder is made there and
    removed at once (root bypasses permission bits, /proc and /sys refuse even root)."""
    p = os.fspath(path)
    if not isinstance(p, str) or not p or any(ord(c) < 32 or ord(c) == 127 for c in p):
        raise error(f"{what} {p!r} holds a control character (newline, NUL, ...) or is empty: not a folder "
                    "heldout will create")
    check_utf8_text(p, what, error=error)
    path_max = _limit("/", "PC_PATH_MAX", 4096)
    if len(os.fsencode(os.path.abspath(p))) >= path_max:
        raise error(f"{what} is {len(os.fsencode(os.path.abspath(p))):,} bytes long as an absolute path, over the "
                    f"system's limit of {path_max - 1:,}: choose a shorter path")
    stem = p.rstrip(os.sep) or os.sep
    existing, missing = stem, []
    while not os.path.lexists(existing):  # a path under a file does not exist either: climb to what does
        parent = os.path.dirname(existing) or os.curdir
        missing.append(os.path.basename(existing))
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        if not missing:
            raise error(f"{what} {p} exists and is not a folder")
        raise error(f"{what} {p} cannot be created: {existing} is {_what_is_there(existing)}, not a folder")
    name_max = _limit(existing, "PC_NAME_MAX", 255)
    for name in missing:
        if len(os.fsencode(name)) > name_max:
            raise error(f"{what} {p} cannot be created: a name in it is {len(os.fsencode(name)):,} bytes long, over "
                        f"the file system's limit of {name_max} ({name[:24]}...)")
    probe = os.path.join(existing, f".heldout-probe-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        os.mkdir(probe, 0o700)
    except OSError as exc:
        where = "is not a folder heldout may write in" if not missing else f"cannot be created in {existing}"
        raise error(f"{what} {p} {where}: {exc.strerror or exc}") from None
    os.rmdir(probe)
    return p


def check_utf8_text(value: Any, what: str, *, error: type[HeldoutError] = HeldoutError, key: str = "") -> None:
    """Every string in ``value`` (a path, or the dicts and lists of a study as recorded) is text a
    record can hold, else one ``error`` naming it: a name of bytes that are not UTF-8 reaches
    Python as lone surrogates, which a JSON or TOML file written as UTF-8 cannot encode, so a
    command would fail half-way, after its first file."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise error(f"{what}{' ' + key if key else ''} {value!r} is not UTF-8 text (a name made of other bytes): "
                        "heldout records it as UTF-8 text; choose a UTF-8 name") from None
    elif isinstance(value, dict):
        for name, item in value.items():
            check_utf8_text(item, what, error=error, key=f"{key}.{name}" if key else f"{name}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_utf8_text(item, what, error=error, key=f"{key}[{index}]")


def _limit(where: str, name: str, default: int) -> int:
    try:
        return os.pathconf(where, name)
    except (OSError, ValueError):
        return default


def _what_is_there(path: str) -> str:
    """How a path that is no folder reads in a message: "a file", "a link to nothing", ..."""
    try:
        info = os.stat(path)
    except OSError as exc:
        return "a link loop" if exc.errno == errno.ELOOP else "a link to nothing"
    return "a file" if stat.S_ISREG(info.st_mode) else "a device, FIFO or socket"


def write_text_atomically(path: "str | os.PathLike[str]", text: str, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` (UTF-8) in one step, by :func:`write_bytes_atomically`."""
    write_bytes_atomically(path, text.encode("utf-8"), mode=mode)


def write_bytes_atomically(path: "str | os.PathLike[str]", data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` in one step. Rule: a reader sees the old file or the new
    one, never half of either, and a write that fails (a full disk, a kill) leaves the old one
    whole; two writers never share a temp file (its name carries this writer's pid and a random
    tag, so a concurrent writer cannot rename it away); a failed write leaves no temp file behind.
    ``mode`` 0o600 for files only their owner may read."""
    target = os.fspath(path)
    tmp = writer_temp_name(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


_TEMP_NAME = re.compile(r"\.(\d+)\.[0-9a-f]{8}\.tmp$")


def writer_temp_name(target: str) -> str:
    """The temp name a writer of ``target`` writes before renaming it into place: unique to the
    writer (its pid and a random tag), and what :func:`remove_stale_temp_files` recognises."""
    return f"{target}.{os.getpid()}.{os.urandom(4).hex()}.tmp"


def lock_holder(path: "str | os.PathLike[str]") -> int | None:
    """The pid of a process holding an ``flock`` on ``path``, read from /proc/locks, or None.
    Asking the lock itself would take it for a moment, and a study starting then would find its
    own folder "in use"; the kernel's table changes nothing."""
    try:
        info = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in lines:  # "16: FLOCK  ADVISORY  WRITE 374 fe:00:2146819 0 EOF" (a waiter's has "->" after the number)
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == wanted and parts[4].isdigit():
            return int(parts[4])
    return None


def pid_is_running(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host. A process we may not signal counts as running,
    and so does a number no pid can be: a caller that cleans up after the dead leaves it alone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def remove_stale_temp_files(root: "str | os.PathLike[str]") -> list[Path]:
    """Remove the temp files :func:`write_text_atomically` left under ``root`` when its writer was
    killed between creating and renaming one (kill -9 of a study); returns them. Only a file whose
    writer's pid is no live process here is removed, so a live writer's is never touched."""
    removed = []
    for path in Path(root).rglob("*.tmp"):
        match = _TEMP_NAME.search(path.name)
        if not match or not path.is_file() or pid_is_running(int(match.group(1))):
            continue  # its writer may still rename it
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


# -- temp folders: one per process, removed after its owner even when it was killed ----------------
PROCESS_DIR_PREFIX = "heldout-proc-"
_OWNER_FILE = ".owner"  # flock'ed by the process (and its forks) for as long as it runs
_UNCLAIMED_GRACE_SECONDS = 60.0  # a folder whose maker died before it could claim it
_process_dirs: dict[int, tuple[Path, int]] = {}  # pid -> (its folder, the owner file's locked fd)
_process_dirs_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    """A child forked while another thread held ``_process_dirs_lock`` (an MBPP+ worker process, a
    process-pool worker) would wait on it for ever: the child gets a lock of its own."""
    global _process_dirs_lock
    _process_dirs_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def process_temp_dir() -> Path:
    """This process's folder in the system temp dir, made on first use. Rule: every temp folder
    heldout makes (a sandbox's code, a fork server's inbox, an isolated optimizer's socket, a
    scratch table) lives in it (:func:`make_temp_dir`), so none outlives its process: a normal
    exit removes it, and after a kill -9 the next heldout process to make its own removes it. An
    owner holds a lock on the folder's owner file as long as it (or a child it forked) runs, and
    the lock dies with it; a folder whose lock is held is never touched, whatever pid it names."""
    pid = os.getpid()  # a forked child makes its own: its parent removes the parent's at exit
    with _process_dirs_lock:
        if pid not in _process_dirs:
            remove_orphaned_temp_dirs()
            _process_dirs[pid] = _claim_process_dir()
            atexit.register(_remove_process_dir, pid)
        return _process_dirs[pid][0]


def make_temp_dir(prefix: str) -> Path:
    """A fresh private folder (mode 0700) inside :func:`process_temp_dir`; its user removes it
    when done, and if the process is killed first it goes with the process's folder."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=process_temp_dir()))


def _claim_process_dir() -> tuple[Path, int]:
    root = Path(tempfile.mkdtemp(prefix=f"{PROCESS_DIR_PREFIX}{os.getpid()}-")).resolve()
    root.chmod(0o711)  # sandboxes bind what they need; nobody lists what is here
    # locked under a temp name first, then renamed: no sweeper ever sees an owner file unlocked
    claim = root / f"{_OWNER_FILE}.{os.urandom(4).hex()}"
    fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(claim, root / _OWNER_FILE)
    return root, fd


def remove_own_temp_dir() -> None:
    """Remove this process's folder now: a forked worker that ends with ``os._exit`` (which runs
    no exit handler) calls it last."""
    _remove_process_dir(os.getpid())


def _remove_process_dir(pid: int) -> None:
    if os.getpid() != pid:
        return  # a forked child exiting leaves its parent's folder alone
    with _process_dirs_lock:
        found = _process_dirs.pop(pid, None)
    if found is not None:
        shutil.rmtree(found[0], ignore_errors=True)
        os.close(found[1])


def remove_orphaned_temp_dirs(temp_root: "str | os.PathLike[str] | None" = None) -> list[Path]:
    """Remove the process folders (:func:`process_temp_dir`) under ``temp_root`` (the system temp
    dir) whose owner is gone: its owner file's lock is free, or it has none and is older than a
    minute (its maker died between making and claiming it). Only this user's folders are looked
    at; returns the ones removed."""
    removed = []
    root = Path(temp_root or tempfile.gettempdir())
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(PROCESS_DIR_PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue
        if _orphaned(Path(entry.path), info):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def _orphaned(folder: Path, info: os.stat_result) -> bool:
    try:
        fd = os.open(folder / _OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return time.time() - info.st_mtime > _UNCLAIMED_GRACE_SECONDS
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # its owner, or a child it forked, still runs
    finally:
        os.close(fd)
    return True
