"""How a ledger writer (:class:`heldout.evaluators.ledger.Ledger`) keeps its chain and its files:
each entry held as the canonical text it was hashed from (:class:`Recorded`), a written batch
made durable at once or behind (:class:`InFlight`), the head file rewritten in place
(:class:`HeadFile`), and the exclusive lock on a run dir or study (:func:`hold_lock`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import threading
from pathlib import Path
from typing import Any, BinaryIO, Callable

from heldout.files import writer_temp_name

# a head longer than this (never an unsigned one: about 250 bytes) is renamed into place, not
# overwritten: one write within a disk sector is all-or-nothing, on a kill and on power loss alike
HEAD_IN_PLACE_BYTES = 512


class Recorded:
    """One entry of a writer's chain: its kind and hash at hand, the entry itself (as any reader
    gets it back) decoded from its canonical text only when someone asks for it."""

    __slots__ = ("kind", "hash", "_canonical", "_entry")

    def __init__(self, kind: str, digest: str, canonical: str | None = None,
                 entry: dict[str, Any] | None = None) -> None:
        self.kind, self.hash, self._canonical, self._entry = kind, digest, canonical, entry

    @classmethod
    def read(cls, entry: dict[str, Any], on_disk: frozenset[str] = frozenset()) -> "Recorded":
        """An entry as read from a ledger file; its kind and hash only when its kind is ``on_disk``
        (the ledger reads it from the file again when asked: see ``Ledger.open``)."""
        return cls(entry["kind"], entry["hash"], entry=None if entry["kind"] in on_disk else entry)

    @property
    def on_disk(self) -> bool:
        """Kept as kind and hash only: the ledger reads the entry from its file when asked."""
        return self._entry is None and self._canonical is None

    def entry(self) -> dict[str, Any]:
        if self.on_disk:
            raise RuntimeError("this entry is kept on disk only: read it through Ledger.entries()")
        if self._entry is None:
            self._entry = json.loads(self._canonical)  # type: ignore[arg-type]
            self._entry["hash"] = self.hash
            self._canonical = None
        return self._entry


class InFlight:
    """A batch's entries once written: made durable (fsync, then the head names them) at once, or
    behind, on a thread of their own (an fsync holds no interpreter lock) until :meth:`wait`."""

    def __init__(self, entries: list[Recorded], size: int) -> None:
        self.entries, self.size = entries, size
        self.failure: OSError | None = None
        self._thread: threading.Thread | None = None

    def make_durable(self, fd: int, write_head: Callable[[], None], behind: bool) -> None:
        if behind:
            self._thread = threading.Thread(target=self._durable, args=(fd, write_head), name="heldout-ledger-fsync")
            self._thread.start()
        else:
            self._durable(fd, write_head)

    def _durable(self, fd: int, write_head: Callable[[], None]) -> None:
        try:
            sync_data(fd)  # and every unsynced entry before it
            write_head()  # the head names the entries only once their bytes are synced
        except OSError as exc:
            self.failure = exc
        except Exception as exc:  # noqa: BLE001 - on a thread of its own, nothing may pass unseen
            self.failure = OSError(errno.EIO, f"the ledger head could not be written: {type(exc).__name__}: {exc}")

    def wait(self) -> OSError | None:
        """Once the entries are durable: None, or why they could not be made so."""
        if self._thread is not None:
            self._thread.join()
        return self.failure


class HeadFile:
    """A writer's head file. Its first head is a new file renamed into place, and so is a signed
    one; every other head overwrites the first in place, in one write of less than a sector at
    offset 0 (padded with spaces, which JSON ignores, over a longer head before it): a kill leaves
    the old head or the new one, never a mix, and a batch costs no rename (on ext4, renaming over
    a file waits about as long as an fsync)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = None  # the head this writer installed, kept open to overwrite
        self._size = 0

    def write(self, text: bytes, in_place: bool = True) -> None:
        """``text`` as the head; ``in_place=False`` (a signed head) always renames a new file into place."""
        if not (in_place and self._file is not None and len(text) <= HEAD_IN_PLACE_BYTES):
            self._install(text, keep=in_place)
            return
        padded = text.ljust(self._size)
        if os.pwrite(self._file.fileno(), padded, 0) != len(padded):
            raise OSError(errno.EIO, "the ledger head was written short")
        self._size = len(padded)
        start_writeback(self._file.fileno())

    def _install(self, text: bytes, keep: bool) -> None:
        """``text`` written under a temp name of this writer's own, then renamed over the old head;
        with ``keep``, its descriptor stays open for the heads written in place after it."""
        target = os.fspath(self.path)
        tmp = writer_temp_name(target)
        installed = os.fdopen(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), "r+b", buffering=0)
        try:
            if installed.write(text) != len(text):
                raise OSError(errno.EIO, "the ledger head was written short")
            os.replace(tmp, target)
        except BaseException:
            installed.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self.close()
        if keep:
            self._file, self._size = installed, len(text)
        else:
            installed.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def sync_data(fd: int) -> None:
    """Make what was written to the file durable: ``fdatasync`` where the system has it (the
    appended bytes and the file's new size, all a reader needs; not its times, which ``fsync``
    also waits for: about a fifth of an appended batch's sync on ext4 here), else ``fsync``."""
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def start_writeback(fd: int) -> None:
    """Send the file's written pages to the disk now, without waiting for them (as ext4 did for a
    head renamed over the old one): after a power loss the head is then about as current as the
    ledger, which the next batch's fsync makes durable. Where the system cannot, the kernel's own
    writeback follows within seconds."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        with contextlib.suppress(OSError):
            advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


class LockHeld(Exception):
    """Another process holds the lock; ``holder`` is what it wrote into the lock file."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def hold_lock(path: Path) -> int:
    """An exclusive lock on the file ``path`` for this process's lifetime (the kernel releases it
    when the process dies, so kill -9 + resume works); returns its fd, which holds the lock. Raises
    :class:`LockHeld` naming the holder (the pid it wrote) when another process has it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise LockHeld(holder) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
    except OSError:  # a full disk: the lock is held all the same, only the holder's name is missing
        pass
    return fd


def bytes_of_lines(path: Path, count: int) -> int:
    """The length of the first ``count`` lines of ``path``, in bytes."""
    size = 0
    with open(path, "rb") as fh:
        for _, line in zip(range(count), fh):
            size += len(line)
    return size


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a write may take fewer bytes, e.g. near a full
    disk, before the next one fails)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


__all__ = ["HEAD_IN_PLACE_BYTES", "HeadFile", "InFlight", "LockHeld", "Recorded", "bytes_of_lines", "hold_lock",
           "start_writeback", "sync_data", "write_all"]
