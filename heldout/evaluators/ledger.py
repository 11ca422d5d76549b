"""The ledger: an append-only, hash-chained record of every evaluation and budget event of a
session, the system of record every report is derived from.

Each line is one JSON entry ``{"seq", "prev", "kind", "time", "data", "hash"}`` where ``hash`` is
the sha256 of the canonical JSON of the other fields and ``prev`` is the previous entry's hash
(the first entry's ``prev`` is 64 zeros). A long model output in ``data`` is stored compressed, or
as a reference to the earlier line that holds the same output, with a ``packed`` field saying
where (:mod:`heldout.evaluators.ledger_json`); the hash is of the entry as recorded, unpacked. An entry is written, flushed and fsynced before the
result it records is returned. An entry that records no result (a candidate about to be
evaluated) may be appended unsynced: it waits in memory and is written with the next synced entry.
Inside :meth:`Ledger.batch` (a batch of evaluations, whose results are returned together) synced
entries wait too, and the block's end writes them all in one write, one fsync and one head:
the cost of an evaluation's record is then a share of one fsync, not one of its own; entries whose
results nobody is given before a later synced entry (held-out chunks) may end their batch without
waiting: fsync and head are made behind, and the next flush waits for them (:meth:`Ledger.batch`).
Each entry is encoded once: the hash is of the bytes at hand, and the writer keeps that text.
A sidecar ``ledger.head`` holds the count and last hash, so a dropped *tail* is caught too. This
is tamper-evident, not tamper-proof: someone who rewrites the whole chain and the head can forge
it; the run record keeps the head hash as a further anchor.

**What the head claims is the ledger.** The head is rewritten (in place, one write within a sector:
:class:`~heldout.evaluators.ledger_io.HeadFile`) only after the entries it names are
written and synced, and a result is returned only after that, so an entry past the head was never
acknowledged: killed between the fsync and the head, a writer leaves such a tail, and
:meth:`Ledger.open` cuts it off (a ``unclaimed_tail_dropped`` entry records how many) when the head
before it is genuine. The evaluations it recorded are run again on resume, as if never made; and
entries someone appended behind the writer's back are dropped the same way, never adopted.

**Anchors outside the ledger.** The head file carries an HMAC-SHA256 of (first entry's hash, count,
last hash) under a key in the user's config dir (:func:`ledger_key_path`: ``$HELDOUT_LEDGER_KEY``,
else ``$XDG_CONFIG_HOME/heldout/ledger.key``, else ``~/.config/heldout/ledger.key``; created with
32 random bytes, owner-only, on first use; never visible inside a sandbox). Dropping the last
entries and rewriting the head is then detected by anyone holding the key; and the run record's
``ledger_head`` must be an entry of the chain, so truncating below it is detected by anyone.
Ledger and head are written owner-only (0600) in an owner-only run dir (0700). The head names its
key (``key_id``, :func:`ledger_key_id`, a hash that reveals nothing of the key), so a head anchored
under another machine's key is told apart from a rewritten one: it is *unanchored here*, not invalid.
A head written before heads named their key cannot be told apart: a mismatch stays a problem.

**Signatures.** When a writer closes, it signs the head (first entry's hash, count, last hash)
with the user's Ed25519 signing key (:mod:`heldout.evaluators.signing`), once per writer, not per
entry; the signature is kept in the head file until the next append replaces the head. A signature
that does not match its head is a problem (the head or the ledger was changed after signing) for
anyone, with no secret; who signed, and whether that signer is trusted, is ``LedgerReport.signature``.

A torn last line (the process was killed mid-write) is not tampering: :meth:`Ledger.open`
truncates it and records a ``torn_tail_repaired`` entry, so nothing that was acknowledged is lost.

**A failed write** (a full disk, an I/O error) is not tampering either, and must not look like it.
The file never runs ahead of what the head claims, nor the in-memory chain ahead of the file: an
entry's bytes are written and synced first, then the head names it, then it joins the chain; if
any step fails, the file is cut back to its last claimed entry (so no partial line and no
unclaimed entry stays behind; a ledger left empty is removed), the append raises :class:`LedgerWriteError` (one line naming the run
dir and the way out: free space, ``--resume``) and that writer refuses every later append, so
nothing is ever written after a hole. The ledger then verifies as it stood before the failed entry."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from heldout.contracts import HeldoutError, canonical_json, sha256_text
from heldout.evaluators.ledger_json import (MAX_UNPACKED_CHARS, UnpackError, encodable, keys_are_text, pack_outputs,
                                            unpack_outputs)
from heldout.evaluators.signing import (Authenticity, SignatureCheck, SigningKey, TrustedSigners, config_dir,
                                        load_signing_key, verify_block)
from heldout.evaluators.ledger_io import HeadFile, InFlight, LockHeld, Recorded, bytes_of_lines, hold_lock, write_all
from heldout.files import read_user_bytes, read_user_json

GENESIS = "0" * 64
LEDGER_FILE = "ledger.jsonl"
HEAD_FILE = "ledger.head"
RECORD_FILE = "run_record.json"
LOCK_FILE = "ledger.lock"
# what a reader takes from a run dir before refusing it (the files are the harness's, but a run
# dir may be a copy from anyone): far above a real session's, far below a machine's memory
MAX_LEDGER_BYTES = 1 << 30
MAX_RECORD_BYTES = 256 << 20
MAX_HEAD_BYTES = 1 << 16
KEY_ENV = "HELDOUT_LEDGER_KEY"
HEAD_PURPOSE = "ledger-head"
# an HMAC mismatch on a head that does not name its key (written before heads did): another
# machine's key or a rewritten head, which nothing here can tell apart
UNNAMED_MISMATCH = "mismatch, key not named"


def ledger_key_path() -> Path:
    """Where the head-anchoring key lives (see the module docstring)."""
    override = os.environ.get(KEY_ENV)
    return Path(override) if override else config_dir() / "ledger.key"


def ledger_key(create: bool = True) -> bytes | None:
    """The anchoring key; created (owner-only) if missing and ``create``; None if unavailable."""
    path = ledger_key_path()
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        if not create:
            return None
    except (OSError, ValueError) as exc:
        raise LedgerError(f"the ledger key {path} is unreadable or corrupt: {exc}") from exc
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Written whole under a name of this writer's own, then linked into place: a second process
    # that starts at the same moment finds either no key or the whole key, never an empty file
    # (it once read "" and anchored its heads with an empty key that no later check could match).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(os.urandom(32).hex())
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:  # another session created it first: use theirs
            pass
    finally:
        tmp.unlink(missing_ok=True)
    key = bytes.fromhex(path.read_text().strip())
    if len(key) != 32:
        raise LedgerError(f"the ledger key {path} is not 32 bytes of hex ({len(key)} bytes): corrupt")
    return key


def head_mac(key: bytes, first: str, count: int, last: str) -> str:
    return hmac.new(key, f"heldout-ledger-head:{first}:{count}:{last}".encode(), hashlib.sha256).hexdigest()


def ledger_key_id(key: bytes) -> str:
    """What a head says its HMAC key is: the first 16 hex digits of the key's sha256."""
    return hashlib.sha256(key).hexdigest()[:16]


def head_payload(first: str, count: Any, last: Any) -> dict[str, Any]:
    """What a head's signature signs."""
    return {"first": first, "count": count, "last": last}


class LedgerError(HeldoutError):
    pass


class LedgerWriteError(LedgerError):
    """An entry could not be written (disk full, I/O error): the ledger stays as it was before it,
    and the writer that failed takes no further entries. The message is the one line a user sees."""

    def __init__(self, run_dir: Path, cause: OSError) -> None:
        reason = "no space left on device" if cause.errno in (errno.ENOSPC, errno.EDQUOT) \
            else (cause.strerror or str(cause))
        super().__init__(f"cannot write the ledger in {run_dir}: {reason}; every entry before this one is intact. "
                         "Free space, then rerun the same command with --resume")
        self.run_dir = run_dir
        self.errno = cause.errno


def entry_hash(entry: dict[str, Any]) -> str:
    return sha256_text(canonical_json({k: entry[k] for k in ("seq", "prev", "kind", "time", "data")}))


@dataclass
class LedgerReport:
    """What :func:`verify_ledger` found. ``ok``: the chain, head file and record agree (a
    consistency check anyone can run). ``anchored``: how authenticity was checked, if at all:
    ``"key"`` (the head's HMAC under the writer's ledger key, present here), ``"published head"``
    (the chain holds the head the writer published), or None: NOT checked, since a forger who
    rewrites ledger, head file and record together leaves a consistent chain. ``hmac``: what the
    HMAC anchor says here (``"this machine's key"``, ``"another key"``, ``"no key here"``,
    ``"mismatch"``, :data:`UNNAMED_MISMATCH`, or None without a head). ``signature``: the head's signature checked against
    the trusted signers given (UNSIGNED when the head carries none; a signature that does not
    match is also among ``problems``)."""

    path: str
    entries: int = 0
    problems: list[str] = field(default_factory=list)
    head: str = GENESIS
    anchored: str | None = None
    hmac: str | None = None
    signature: SignatureCheck | None = None
    checked: list[dict[str, Any]] = field(default_factory=list, repr=False)
    """The entries as read and checked: use these, not a second read of a file that may have
    changed since."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        if self.ok:
            return f"{self.path}: {self.entries} entries, chain intact, head {self.head[:16]}"
        return f"{self.path}: LEDGER INVALID\n  " + "\n  ".join(self.problems)


def read_entries(path: Path) -> tuple[list[dict[str, Any]], bytes]:
    """All complete entries (packed outputs put back, :mod:`heldout.evaluators.ledger_json`),
    plus the bytes of a torn (unterminated) last line, if any."""
    raw = read_user_bytes(path, "ledger", max_bytes=MAX_LEDGER_BYTES, error=LedgerError) if os.path.lexists(path) else b""
    torn = b""
    if raw and not raw.endswith(b"\n"):
        cut = raw.rfind(b"\n") + 1
        raw, torn = raw[:cut], raw[cut:]
    entries: list[dict[str, Any]] = []
    budget = [MAX_UNPACKED_CHARS]
    for lineno, line in enumerate(raw.splitlines(), 1):
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise LedgerError(f"{path} line {lineno} is not JSON: {exc}") from exc
        if isinstance(entry, dict) and "packed" in entry:
            try:
                unpack_outputs(entry.get("data"), entry.pop("packed"), entries, budget)
            except UnpackError as exc:
                raise LedgerError(f"{path} line {lineno} (seq {entry.get('seq')}, {entry.get('kind')}): its stored "
                                  f"output cannot be read back (the line was edited): {exc}") from None
        entries.append(entry)
    return entries, torn


def verify_ledger(run_dir: str | Path, published_head: str | None = None,
                  trusted: TrustedSigners | None = None) -> LedgerReport:
    """Check the chain: every hash, every link, the sequence numbers and the head file. Detects
    an edited, dropped, inserted or reordered entry. Authenticity (``anchored``) is checked with
    the ledger key when it is here, and against ``published_head`` (the run record's
    ``ledger_head`` as the writer published it, e.g. beside a paper's numbers) when given: a
    reviewer without the writer's secret verifies a copy that way. The head's signature is
    checked against ``trusted`` (nobody when None: a valid signature is then UNTRUSTED)."""
    run_dir = Path(run_dir)
    path = run_dir / LEDGER_FILE
    report = LedgerReport(path=str(path))
    if not os.path.lexists(path):
        report.problems.append("no ledger file")
        return report
    try:
        entries, torn = read_entries(path)
    except LedgerError as exc:
        report.problems.append(str(exc))
        return report
    if torn:
        report.problems.append(f"torn last line ({len(torn)} bytes): the writer was interrupted; "
                               "re-opening the session repairs it")
    prev = GENESIS
    for index, entry in enumerate(entries):
        where = f"entry {index}"
        if not isinstance(entry, dict) or not {"seq", "prev", "kind", "time", "data", "hash"} <= set(entry):
            report.problems.append(f"{where}: missing fields")
            break
        if entry["seq"] != index:
            report.problems.append(f"{where}: sequence number {entry['seq']} (an entry was dropped, "
                                   "inserted or reordered)")
        if entry["prev"] != prev:
            report.problems.append(f"{where} (seq {entry['seq']}): does not link to the previous entry")
        if entry_hash(entry) != entry["hash"]:
            report.problems.append(f"{where} (seq {entry['seq']}, {entry['kind']}): content was edited")
        prev = entry["hash"]
    report.entries = len(entries)
    report.head = prev
    report.checked = entries
    head_path = run_dir / HEAD_FILE
    if os.path.lexists(head_path):
        try:
            head = read_user_json(head_path, "ledger head file", max_bytes=MAX_HEAD_BYTES, error=LedgerError)
            if head.get("count") != len(entries) or head.get("hash") != prev:
                report.problems.append(f"head file says {head.get('count')} entries ending "
                                       f"{str(head.get('hash'))[:16]}, ledger has {len(entries)} ending "
                                       f"{prev[:16]} (entries dropped or appended behind the writer's back)")
            first = entries[0].get("hash", "") if entries and isinstance(entries[0], dict) else ""
            _check_hmac(report, head, first, len(entries), prev)
            # the signature vouches for what the head claims; a ledger that differs from the claim
            # is the problem reported above
            report.signature = verify_block(head.get("signature"), HEAD_PURPOSE,
                                            head_payload(first, head.get("count"), head.get("hash")),
                                            trusted or TrustedSigners(), "ledger head")
            if report.signature.status is Authenticity.TAMPERED:
                report.problems.append(report.signature.reason)
        except LedgerError as exc:
            report.problems.append(str(exc))
    elif entries:
        report.problems.append("head file is missing")
    record_path = run_dir / RECORD_FILE
    if os.path.lexists(record_path):
        try:
            anchor = read_user_json(record_path, "run record", max_bytes=MAX_RECORD_BYTES,
                                    error=LedgerError).get("ledger_head")
        except LedgerError as exc:  # its ledger head cannot be checked: say so, never pass quietly
            report.problems.append(str(exc))
            anchor = None
        if anchor and anchor not in {e.get("hash") for e in entries if isinstance(e, dict)}:
            report.problems.append(f"the run record's ledger head {str(anchor)[:16]} is not in the ledger "
                                   "(entries were dropped)")
    if published_head is not None:
        hashes = {e.get("hash") for e in entries if isinstance(e, dict)}
        if published_head not in hashes:
            report.problems.append(f"the published head {published_head[:16]} is not in this ledger: it is not "
                                   "the ledger the writer published (rewritten, or another run)")
        elif report.anchored is None:
            report.anchored = "published head"
    return report


def _check_hmac(report: LedgerReport, head: dict[str, Any], first: str, count: int, last: str) -> None:
    """The head's HMAC anchor under this machine's ledger key (see the module docstring)."""
    key = ledger_key(create=False)
    if key is None:
        report.hmac = "no key here"
        return
    named = head.get("key_id")
    if isinstance(named, str) and named != ledger_key_id(key):
        report.hmac = "another key"  # anchored elsewhere: nothing to check here, nothing wrong
        return
    if not count:
        return
    want = head_mac(key, first, count, last)
    if isinstance(head.get("mac"), str) and hmac.compare_digest(head["mac"], want):
        report.hmac, report.anchored = "this machine's key", "key"
        return
    report.hmac = "mismatch" if isinstance(named, str) else UNNAMED_MISMATCH
    unnamed = "" if isinstance(named, str) else (" (or, since the head does not name its key, it was anchored "
                                                  "under another machine's ledger key)")
    report.problems.append("head file's anchor (HMAC under the user's ledger key) does not match the ledger: "
                           "the head was rewritten or the ledger truncated" + unnamed)


class Ledger:
    """Append-only writer. One per session; thread-safe; every append is durable on return."""

    def __init__(self, run_dir: Path, entries: list[dict[str, Any]], lock: int | None = None,
                 on_disk: frozenset[str] = frozenset()) -> None:
        self.run_dir = run_dir
        # a file object, so a writer that is dropped without close() still releases the run dir
        self._lock_file = os.fdopen(lock, "rb", buffering=0) if lock is not None else None
        self.path = run_dir / LEDGER_FILE
        self._entries = [Recorded.read(e, on_disk) for e in entries]  # written, synced and named by the head
        self._lock = threading.Lock()
        self._key = ledger_key()
        self._key_id = ledger_key_id(self._key)
        self.signing_key: SigningKey | None = load_signing_key()
        self._appended = False  # the head is signed at close only when this writer changed it
        # a bare descriptor, not a buffered file: after a failed write no bytes linger in a buffer
        # to reach the disk later, behind the head's back
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.chmod(self.path, 0o600)
        self._size = os.fstat(self._fd).st_size  # the end of the last entry the head claims
        self._failed: LedgerWriteError | None = None
        self._head = HeadFile(run_dir / HEAD_FILE)
        # entries chained but not yet written: (the entry, its line as stored); see the module docstring
        self._pending: list[tuple[Recorded, bytes]] = []
        self._inflight: InFlight | None = None  # written, being made durable (behind: batch(wait=False))
        self._long_texts: dict[str, tuple[int, list[Any]]] = {}  # outputs this writer stored: each is stored once
        # batches are per thread: another thread's synced append is durable on return, as always
        # (it writes the batch's entries so far along with its own)
        self._batching = threading.local()

    @classmethod
    def open(cls, run_dir: str | Path, on_disk: Iterable[str] = ()) -> "Ledger":
        """Open (or create) the ledger of ``run_dir``. An existing ledger must verify (a torn last
        line is repaired and the repair recorded); anything else is refused. Its entries of the kinds
        ``on_disk`` are not kept in memory: :meth:`entries` reads them from the file when asked."""
        run_dir = Path(run_dir)
        if not run_dir.exists():
            run_dir.mkdir(mode=0o700, parents=True)
        lock = _lock_run_dir(run_dir)
        try:
            return cls._open_locked(run_dir, lock, frozenset(on_disk))
        except BaseException:
            os.close(lock)
            raise

    @classmethod
    def _open_locked(cls, run_dir: Path, lock: int, on_disk: frozenset[str]) -> "Ledger":
        path = run_dir / LEDGER_FILE
        entries, torn = read_entries(path)
        if torn:
            with open(path, "r+b") as fh:
                fh.truncate(path.stat().st_size - len(torn))
        if not path.exists():
            return cls(run_dir, [], lock, on_disk)
        claimed = _claimed_count(run_dir, entries)
        unclaimed = entries[claimed:] if claimed is not None else []
        if unclaimed:  # written and synced, never named by the head: never acknowledged (module docstring)
            keep = bytes_of_lines(path, claimed)
            cut = path.stat().st_size - keep
            with open(path, "r+b") as fh:
                fh.truncate(keep)
            entries = entries[:claimed]
        report = verify_ledger(run_dir)
        if not report.ok:
            raise LedgerError("refusing to resume on a ledger that does not verify:\n" + report.describe())
        ledger = cls(run_dir, entries, lock, on_disk)
        with ledger.batch():
            if torn:
                ledger.append_entry("torn_tail_repaired", {"bytes_dropped": len(torn)})
            if unclaimed:
                ledger.append_entry("unclaimed_tail_dropped", {"entries": len(unclaimed), "bytes_dropped": cut,
                                                               "kinds": sorted({e["kind"] for e in unclaimed})})
        return ledger

    @property
    def head(self) -> str:
        if self._pending:
            return self._pending[-1][0].hash
        chain = self._entries + (self._inflight.entries if self._inflight else [])
        return chain[-1].hash if chain else GENESIS

    def __len__(self) -> int:
        return len(self._entries) + len(self._inflight.entries if self._inflight else ()) + len(self._pending)

    def entries(self, kind: str | None = None) -> Iterator[dict[str, Any]]:
        every = self._entries + (self._inflight.entries if self._inflight else []) + [r for r, _ in self._pending]
        chosen = [(seq, r) for seq, r in enumerate(every) if kind is None or r.kind == kind]
        from_file = read_entries(self.path)[0] if any(r.on_disk for _, r in chosen) else []
        return (_read_back(from_file, seq, r, self.path) if r.on_disk else r.entry() for seq, r in chosen)

    def append_entry(self, kind: str, data: dict[str, Any], *, sync: bool = True) -> dict[str, Any]:
        """Append one entry; with ``sync`` (the default) it is on disk when this returns, or, inside
        :meth:`batch`, when the batch ends. Only an entry whose content nobody acts on before a
        later synced entry may pass ``sync=False`` (it is written with that entry)."""
        with self._lock:
            if self._failed is not None:
                raise self._failed  # nothing is written after a hole
            if self._fd is None:
                raise LedgerError(f"the ledger in {self.run_dir} is closed")
            entry = {"seq": len(self), "prev": self.head, "kind": kind, "time": round(time.time(), 6), "data": data}
            # encoded once: the hash is of these bytes (entry_hash(entry)), and a reader who asks for
            # the entry gets it decoded from them. Data that is not strict JSON (NaN, infinities), or
            # whose keys are not all text (read back as text, they sort otherwise: the hash would not
            # be the reader's), is first made what a reader reads back.
            try:
                if not keys_are_text(data):
                    raise TypeError("a key that is not text")
                canonical = canonical_json(entry, strict=True)
                digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
            except (TypeError, ValueError, UnicodeEncodeError):
                entry["data"] = json.loads(json.dumps(encodable(data), ensure_ascii=False))
                canonical = canonical_json(entry)
                digest = sha256_text(canonical)
            entry["hash"] = digest
            stored, packed = pack_outputs(entry["data"], entry["seq"], self._long_texts)
            line = json.dumps({**entry, "data": stored, "packed": packed} if packed else entry,
                              sort_keys=True, ensure_ascii=False)
            self._pending.append((Recorded(kind, digest, canonical), (line + "\n").encode("utf-8")))
            if sync and not getattr(self._batching, "depth", 0):
                self._flush()
            return entry

    @contextlib.contextmanager
    def batch(self, *, wait: bool = True) -> Iterator[None]:
        """This thread's entries appended inside are written together when the block ends (one
        write, one fsync, one head), also when it ends by an exception; the caller returns the
        results they record only after the block. A failed write raises :class:`LedgerWriteError`
        at the block's end.

        ``wait=False``, for entries whose results nobody is given before a later synced entry
        (held-out scoring, chunk by chunk): the block's end writes them and returns; their fsync
        and head are made on a thread of their own (an fsync holds no interpreter lock) while the
        caller goes on, and the next flush (a synced entry, a batch's end, :meth:`close`) waits
        for them first. Heads stay in order, each names only synced entries, and a failure of that
        fsync or head is raised by that next flush (the ledger then stands before the batch)."""
        self._batching.depth = getattr(self._batching, "depth", 0) + 1
        try:
            yield
        finally:
            self._batching.depth -= 1
            with self._lock:
                if not self._batching.depth and self._fd is not None and self._failed is None:
                    self._flush(wait=wait)

    def _flush(self, wait: bool = True) -> None:
        """Write every pending entry, fsync, then let the head name the last (the caller holds the
        lock); without ``wait`` the fsync and head are left to a thread (:meth:`batch`). On a
        failure nothing pending joins the chain (:meth:`_take_back`)."""
        self._join_behind()  # the batch before, made durable behind: heads stay in order
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        stored = [recorded for recorded, _ in pending]
        data = b"".join(line for _, line in pending)
        named = ((self._entries or stored)[0].hash, len(self._entries) + len(stored), stored[-1].hash)
        self._inflight = InFlight(stored, len(data))
        try:
            write_all(self._fd, data)
        except OSError as exc:
            self._take_back(exc)
        self._inflight.make_durable(self._fd, lambda: self._write_head(*named), behind=not wait)
        if wait:
            self._join_behind()

    def _join_behind(self) -> None:
        """Wait for the entries in flight to be durable, then let them join the chain (the caller
        holds the lock); a failure to make them durable is :meth:`_take_back`."""
        if self._inflight is None:
            return
        inflight, self._inflight = self._inflight, None
        failure = inflight.wait()
        if failure is not None:
            self._take_back(failure)
        self._size += inflight.size
        self._entries.extend(inflight.entries)
        self._appended = True

    def _write_head(self, first: str, count: int, last: str, signature: dict[str, str] | None = None) -> None:
        """The head names ``count`` entries ending ``last`` (in place but when signed: :class:`HeadFile`)."""
        head: dict[str, Any] = {"count": count, "hash": last, "mac": head_mac(self._key, first, count, last),
                                "key_id": self._key_id}
        if signature is not None:
            head["signature"] = signature
        self._head.write(json.dumps(head).encode("utf-8"), in_place=signature is None)

    def _sign_head(self) -> None:
        """Sign the head this writer leaves (once, at close). A head that could not be rewritten
        (a full disk) stays unsigned and intact: it verifies as unsigned, never as tampered."""
        if not self._appended or self._failed is not None or not self._entries or self.signing_key is None:
            return
        first, count, last = self._entries[0].hash, len(self._entries), self.head
        try:
            self._write_head(first, count, last, self.signing_key.sign(HEAD_PURPOSE, head_payload(first, count, last)))
        except OSError:
            pass

    def _take_back(self, cause: OSError) -> None:
        """After a failed write: cut the file back to the last entry the head claims (a partial
        line, or a whole entry the head could not be made to name), refuse every later append, and
        raise the one-line :class:`LedgerWriteError`. Should even the cut fail, what is left past
        the head is a torn or unclaimed tail that :meth:`open` repairs on resume."""
        self._failed = LedgerWriteError(self.run_dir, cause)
        self._inflight, self._pending = None, []  # never to be written: they would follow a hole
        try:
            os.ftruncate(self._fd, self._size)
            if not self._entries:  # a ledger that recorded nothing is no ledger (the run dir's lock is held)
                self.path.unlink(missing_ok=True)
        except OSError:
            pass
        raise self._failed from cause

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                if self._failed is None:
                    try:
                        self._flush()
                    except LedgerWriteError:
                        pass  # the ledger stays as it was before the unwritten entries; nothing to sign
                self._sign_head()
                self._appended = False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._head.close()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the run dir for the next writer
            self._lock_file = None


def _read_back(from_file: list[dict[str, Any]], seq: int, recorded: Recorded, path: Path) -> dict[str, Any]:
    """An entry kept on disk, as the file holds it now: still hashing as when the ledger was opened."""
    if seq >= len(from_file) or entry_hash(from_file[seq]) != recorded.hash:
        raise LedgerError(f"{path}: entry {seq} ({recorded.kind}) changed on disk since the ledger was opened")
    return {**from_file[seq], "hash": recorded.hash}


def _lock_run_dir(run_dir: Path) -> int:
    """An exclusive lock on ``run_dir`` for this writer's lifetime. A second writer gets a clear
    error, not a corrupt ledger (e.g. the same seed twice in one study, or two studies on one run dir)."""
    try:
        return hold_lock(run_dir / LOCK_FILE)
    except LockHeld as held:
        raise LedgerError(f"{run_dir} is in use by another session ({held.holder}); one writer per run dir: "
                          "wait for it, or use another --run-dir / seed") from None


def _claimed_count(run_dir: Path, entries: list[dict[str, Any]]) -> int | None:
    """The number of entries the head names, when it names a genuine proper prefix of ``entries``
    (its hash is the last of them and, under this machine's key, its anchor is genuine): the rest
    were never acknowledged. None otherwise (no head, a head that names no prefix, a finished run:
    its record is never cut under), and :func:`verify_ledger` then judges the ledger as it is."""
    if os.path.lexists(run_dir / RECORD_FILE):
        return None
    try:
        head = read_user_json(run_dir / HEAD_FILE, "ledger head file", max_bytes=MAX_HEAD_BYTES, error=LedgerError)
    except (LedgerError, FileNotFoundError):
        return None
    count = head.get("count")
    if type(count) is not int or not 0 < count < len(entries) or head.get("hash") != entries[count - 1]["hash"]:
        return None
    key = ledger_key(create=False)
    named = head.get("key_id")
    if key is None or (isinstance(named, str) and named != ledger_key_id(key)):
        return count  # anchored under no key or another machine's: nothing here to check it by
    # the head must itself be genuine (anchored), not one rewritten to cut the ledger short
    want = head_mac(key, entries[0]["hash"], count, head["hash"])
    return count if isinstance(head.get("mac"), str) and hmac.compare_digest(head["mac"], want) else None

