"""The shared vocabulary of heldout: every other module speaks in these terms.

This module depends on the standard library only (an isolated optimizer's sandbox may import it
without the rest of heldout). It holds:

* values: :data:`Candidate`, :class:`Example`, :class:`Verdict`, :class:`Message`,
  :class:`RunLimits`, :class:`Source`, :class:`RunContext`;
* the one hashing rule (:func:`canonical_json`, :func:`candidate_id`);
* the errors heldout raises on purpose (all subclasses of :class:`HeldoutError`);
* the Protocols that the parts meet at: :class:`Worker`, :class:`PromptTask`,
  :class:`ProgramTask`, :class:`Verifier`, :class:`TaskView`, :data:`Optimizer`.

Three words for a task, each for one thing:

* a **task** is what the CLI and study files name (``--task bbh/word_sorting``): one named,
  versioned benchmark cell;
* its **benchmark** is the task's definition, its rules without its data: an instance of
  :class:`heldout.benchmarks.base.Benchmark` meeting :class:`PromptTask` or :class:`ProgramTask`
  (how to load the examples, render or run a candidate, score, aggregate); stateless;
* a **loaded task** (:class:`heldout.benchmarks.loading.Task`, from ``load_task``) is that
  benchmark bound to one split profile, with its examples verified against the frozen manifest.

An optimizer sees none of them: it gets a :class:`TaskView`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import stat
import statistics
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence, runtime_checkable

Candidate = dict[str, str]
"""What an optimizer proposes: named text components (``{"instruction": ...}``,
``{"program.py": ...}``, ``{"scorer.sql": ...}``)."""

TaskKind = Literal["prompt", "program"]
SPLITS = ("train", "val", "test")


# -- hashing ----------------------------------------------------------------------------------------
def canonical_json(value: Any) -> str:
    """The one serialisation used for every hash in heldout: sorted keys, no whitespace,
    non-ASCII kept, integers of any size kept exactly."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# -- errors ------------------------------------------------------------------------------------------
class HeldoutError(Exception):
    """Base class of every error heldout raises on purpose (always with a clear message)."""


class MalformedCandidate(HeldoutError, ValueError):
    """A candidate is not a non-empty ``dict[str, str]``."""


class DataError(HeldoutError):
    """Data could not be loaded or does not match its manifest."""


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
    fails half-way with a traceback. Rules: no control character (newline, NUL, ...); the path and
    each name it adds within the system's length limits; the path, or else the nearest part of it
    that exists, is a folder (not a file, a device, a FIFO, a link to nothing or a link loop) in
    which a folder can be made (a read-only or pseudo file system, a folder without write
    permission: refused). The last rule is asked of the kernel itself: a folder is made there and
    removed at once (root bypasses permission bits, /proc and /sys refuse even root)."""
    p = os.fspath(path)
    if not isinstance(p, str) or not p or any(ord(c) < 32 or ord(c) == 127 for c in p):
        raise error(f"{what} {p!r} holds a control character (newline, NUL, ...) or is empty: not a folder "
                    "heldout will create")
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
    """Replace ``path`` with ``text`` in one step. Rule: a reader sees the old file or the new
    one, never half of either; two writers never share a temp file (its name carries this
    writer's pid and a random tag, so a concurrent writer cannot rename it away); a failed write
    leaves no temp file behind. ``mode`` 0o600 for files only their owner may read."""
    target = os.fspath(path)
    tmp = f"{target}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


_TEMP_NAME = re.compile(r"\.(\d+)\.[0-9a-f]{8}\.tmp$")


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


class BudgetExceeded(HeldoutError):
    """An evaluation (or architect call) would exceed the session's budget; nothing ran.

    The same class is raised in-process and by the isolated client, so an optimizer catches one
    name in both modes."""


class VisibilityError(HeldoutError):
    """The optimizer asked for something its visibility policy does not allow (e.g. test)."""


# -- candidates --------------------------------------------------------------------------------------
def check_candidate(candidate: Any) -> Candidate:
    """Return a plain ``dict[str, str]`` copy of ``candidate``, or raise ``MalformedCandidate``.

    The copy is the boundary rule: subclasses of ``dict`` or ``str`` (which could hash as one
    candidate and run as another) are refused; what is hashed, recorded and built is this copy."""
    if type(candidate) is not dict or not candidate:
        raise MalformedCandidate(
            "a candidate must be a non-empty plain dict of named text components, "
            f"got {type(candidate).__name__}")
    plain: Candidate = {}
    for key, value in candidate.items():
        if type(key) is not str or type(value) is not str:
            raise MalformedCandidate(
                f"candidate component {key!r} must map a plain str name to plain str text, "
                f"got {type(key).__name__} -> {type(value).__name__}")
        plain[str(key)] = str(value)
    return plain


def candidate_id(candidate: Mapping[str, str]) -> str:
    """A candidate is identified by the sha256 of its canonical JSON."""
    return sha256_text(canonical_json(check_candidate(candidate)))


# -- examples and verdicts ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Example:
    """One scored unit. ``target`` is hidden from optimizers unless the split allows it.

    ``group`` is the topic/family key protocols split on (None when the task has none)."""

    id: str
    input: dict[str, Any]
    target: Any
    group: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise TypeError(f"example ids are strings, got {self.id!r} ({type(self.id).__name__})")

    def content_hash(self) -> str:
        """sha256 of the canonical JSON of ``input`` + ``target``: what manifests freeze."""
        return sha256_text(canonical_json({"input": self.input, "target": self.target}))


@dataclass
class Verdict:
    """The result of scoring one candidate on one example.

    **The validity rule, stated once:** ``valid`` says whether the candidate *produced an output
    that could be scored*. A scored output is valid even when it is wrong or holds no extractable
    answer (score 0, the feedback says why). ``valid=False`` is reserved for failures to produce a
    scorable output at all: a crash, a timeout, a memory or output limit, a model error, a
    malformed candidate, an output of the wrong shape. Then ``score`` is 0.0 and ``error`` holds a
    clear message and ``error_kind`` naming the class of failure (``timeout``, ``memory``,
    ``crash``, ``bad_output``, ``forbidden``, ``malformed_candidate``, ``model_error`` ...).

    A scorer never raises for one bad example or one bad output; it returns such a verdict."""

    example_id: str
    score: float
    valid: bool = True
    dimensions: dict[str, float] = field(default_factory=dict)
    feedback: str = ""
    error: str | None = None
    error_kind: str | None = None
    output: Any = None  # what the candidate produced (model text, extracted answer, objective...)
    usage: dict[str, float] = field(default_factory=dict)  # tokens, seconds

    def __post_init__(self) -> None:
        if isinstance(self.score, bool) or not isinstance(self.score, (int, float)) \
                or not math.isfinite(self.score):
            raise ValueError(f"verdict score must be a finite number, got {self.score!r}")
        self.score = float(self.score)
        if not self.valid and self.score != 0.0:
            raise ValueError("an invalid verdict scores 0.0")

    @classmethod
    def failure(cls, example_id: str, error: str, kind: str, **extra: Any) -> "Verdict":
        return cls(example_id=example_id, score=0.0, valid=False, error=error, error_kind=kind,
                   feedback=extra.pop("feedback", error), **extra)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Verdict":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


# -- errors are not scores --------------------------------------------------------------------------
#: **Who failed, stated once.** A verdict whose ``error_kind`` is in this set failed for a reason
#: outside the candidate: the model endpoint could not be reached or gave no usable answer after
#: the client's retries (``model_error``: connection refused or reset, client timeout, 408/429/5xx,
#: 401/403/404, an unreadable reply, no endpoint configured), the sandbox could not be set up or
#: died (``sandbox_error``, bubblewrap missing included), or the task's own scoring code raised
#: (``evaluator_error``, ``scoring_error``: a harness bug). Such a verdict is never a score: the
#: session retries the example, and if it still fails the cell ends ``incomplete`` and resumes
#: from its ledger. Every other kind is the candidate's (its program crashed, ran past its limit,
#: printed garbage; the endpoint refused its prompt as invalid, ``model_refused``, e.g. longer than
#: the context; the judge could not read a reply to its output, ``judge_error``) and scores 0. An
#: unknown kind (a plugin task's own) is the candidate's: a task names an infrastructure failure by
#: using one of these kinds.
INFRASTRUCTURE_ERROR_KINDS = frozenset({"model_error", "sandbox_error", "evaluator_error", "scoring_error"})


def is_infrastructure_failure(verdict: "Verdict") -> bool:
    """True when ``verdict`` records a failure of the harness or its infrastructure, not of the
    candidate (see :data:`INFRASTRUCTURE_ERROR_KINDS`)."""
    return not verdict.valid and verdict.error_kind in INFRASTRUCTURE_ERROR_KINDS


class InfrastructureFailure(HeldoutError):
    """The harness or its infrastructure (model endpoint, sandbox, disk) failed where a result was
    needed. Never a score: the session stops, the cell ends ``incomplete`` and ``--resume``
    finishes what is missing. Raised to an optimizer by ``evaluate``/``architect`` once the
    session has stopped this way."""


def mean_score(verdicts: Sequence[Verdict]) -> float:
    """The default ``aggregate``: the plain mean of the scores (0.0 for no verdicts)."""
    return sum(v.score for v in verdicts) / len(verdicts) if verdicts else 0.0


# -- the metric: its name, its direction, its aggregation --------------------------------------------
#: Aggregations a :class:`MetricSpec` can name and :meth:`MetricSpec.aggregate` computes; a task
#: with an aggregate of its own (VLIW's 147,734 / max cycles) names it in words and overrides
#: ``aggregate``.
AGGREGATIONS: dict[str, Callable[[Sequence[float]], float]] = {
    "mean": lambda values: sum(values) / len(values),  # bit for bit mean_score, so old records re-derive
    "median": statistics.median, "min": min, "max": max}


@dataclass(frozen=True)
class MetricSpec:
    """What a task's score is: its ``name``, its direction and how a split's verdicts aggregate.

    **The direction rule, stated once:** every comparison, table, gate, plan and verdict sentence
    reads ``higher_is_better``; a cost (seconds, cycles, bytes) is declared lower-is-better and
    never negated by hand. ``failure_score`` is what an invalid verdict (score 0.0 by the validity
    rule) counts as in the aggregate and in every comparison: 0.0 for a higher-is-better metric
    (the rule as it stands); a lower-is-better one must state it, because a cost of 0 is the best
    there is and a candidate that crashes on purpose would otherwise win."""

    name: str
    higher_is_better: bool = True
    aggregation: str = "mean"
    failure_score: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a metric is named by a non-empty string, got {self.name!r}")
        if type(self.higher_is_better) is not bool:
            raise ValueError(f"higher_is_better is True or False, got {self.higher_is_better!r}")
        if not isinstance(self.aggregation, str) or not self.aggregation.strip():
            raise ValueError(f"a metric's aggregation is named by a non-empty string, got {self.aggregation!r}")
        if self.failure_score is None and not self.higher_is_better:
            raise ValueError(f"metric {self.name!r} is lower-is-better: state failure_score, the cost an invalid "
                             "verdict counts as (its score 0.0 would be the best cost there is)")
        if self.failure_score is not None and (isinstance(self.failure_score, bool) or not isinstance(
                self.failure_score, (int, float)) or not math.isfinite(self.failure_score)):
            raise ValueError(f"failure_score must be a finite number, got {self.failure_score!r}")

    @classmethod
    def of(cls, metric: "MetricSpec | str") -> "MetricSpec":
        """A task's ``metric`` attribute as a spec: a plain string names a higher-is-better mean
        (how tasks declared their metric before directions existed)."""
        if isinstance(metric, MetricSpec):
            return metric
        if isinstance(metric, str):
            return cls(metric)
        raise ValueError(f"a task's metric is a MetricSpec or its name, got {type(metric).__name__}")

    @property
    def sign(self) -> int:
        """+1 when higher is better, -1 when lower is: ``sign * (b - a) > 0`` says b is better."""
        return 1 if self.higher_is_better else -1

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    def reading(self, verdict: Verdict) -> float:
        """The value ``verdict`` counts as: its score, or ``failure_score`` when it is invalid."""
        return verdict.score if verdict.valid else float(self.failure_score or 0.0)

    def aggregate(self, verdicts: Sequence[Verdict]) -> float:
        """The named aggregation of the verdicts' readings (0.0 for no verdicts)."""
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"metric {self.name!r} aggregates by {self.aggregation!r}, which only its task "
                             f"computes (named aggregations: {', '.join(AGGREGATIONS)})")
        return float(AGGREGATIONS[self.aggregation]([self.reading(v) for v in verdicts])) if verdicts else 0.0

    def record_fields(self) -> dict[str, Any]:
        """The spec as a run record states it (``metric`` stays the name, as before directions)."""
        return {"metric": self.name, "higher_is_better": self.higher_is_better, "aggregation": self.aggregation,
                "failure_score": self.failure_score}

    @classmethod
    def from_record(cls, fields: Mapping[str, Any]) -> "MetricSpec":
        """The spec a run record states; a record from before directions reads higher-is-better."""
        return cls(str(fields.get("metric") or "score"), bool(fields.get("higher_is_better", True)),
                   str(fields.get("aggregation") or "mean"), fields.get("failure_score"))


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True)
class RunLimits:
    """Resource limits for one sandboxed execution; per task, overridable, printed in verdicts."""

    wall_seconds: float = 30.0
    cpu_seconds: float = 30.0
    memory_mb: int = 2048
    max_processes: int = 64
    max_file_mb: int = 16
    max_open_files: int = 256
    max_output_bytes: int = 4 * 1024 * 1024
    scratch_mb: int = 64  # the private writable scratch (a tmpfs): a total quota, not per file

    def replace(self, **changes: Any) -> "RunLimits":
        values = asdict(self)
        values.update({k: v for k, v in changes.items() if v is not None})
        return RunLimits(**values)


@dataclass(frozen=True)
class Source:
    """Where a task's data comes from: a hub dataset at a pinned revision, or mirror files (paths
    relative to a data dir laid out like ``../shared/data``)."""

    hub_id: str | None = None
    config: str | None = None
    split: str | None = None
    revision: str | None = None
    mirror_files: tuple[str, ...] = ()
    embedded: bool = False  # the examples are generated by heldout itself (program tasks)


# -- the worker ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Completion:
    """One worker answer: its text and what it cost."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    cached: bool = False


@runtime_checkable
class Worker(Protocol):
    """The frozen model that executes prompt candidates, as a task sees it.

    Rule: one ``complete`` call is one metric call; the harness meters and ledgers it. It raises
    (a ``HeldoutError`` subclass) when the model cannot answer; the task turns that into a
    ``model_error`` verdict for that example."""

    model: str

    def complete(self, messages: Sequence[Message]) -> Completion: ...


@dataclass(frozen=True)
class RunContext:
    """What the harness hands every task's run/score call: the resource limits, the metered
    worker (None when the session has none: a task that needs one returns a ``model_error``
    verdict), the metered judge model when the session has a separate one, and the task options (e.g. a tolerance) that are part of the experiment's
    description. Built by the harness, never by a candidate."""

    limits: RunLimits = RunLimits()
    worker: Worker | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    judge: Worker | None = None  # a separate metered judge model (model-judge verifiers); None: use worker

    def option(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)


# -- tasks ---------------------------------------------------------------------------------------------
@runtime_checkable
class PromptTask(Protocol):
    """A task's definition (its benchmark) when its candidate is a prompt: the worker turns
    ``render``'s messages into text, and ``score_text`` scores that text. ``score_text`` never
    raises (a verdict carries the error)."""

    name: str
    kind: TaskKind

    def seed_candidate(self) -> Candidate: ...
    def render(self, candidate: Candidate, example: Example, context: RunContext) -> list[Message]: ...
    def score_text(self, text: str, example: Example, context: RunContext) -> Verdict: ...
    def aggregate(self, verdicts: Sequence[Verdict]) -> float: ...


@runtime_checkable
class ProgramTask(Protocol):
    """A task's definition (its benchmark) when its candidate is code (or SQL): ``run`` executes
    it on one example in the sandbox and scores what it produced. ``run`` never raises for a bad
    candidate."""

    name: str
    kind: TaskKind

    def seed_candidate(self) -> Candidate: ...
    def run(self, candidate: Candidate, example: Example, context: RunContext) -> Verdict: ...
    def aggregate(self, verdicts: Sequence[Verdict]) -> float: ...


@runtime_checkable
class Verifier(Protocol):
    """What the optimizer is shown of a verdict: the task's scoring rule plus the feedback let through.

    Rule: a verifier changes only what the *optimizer sees*. The canonical verifier
    (``name == "decomposed"``) passes the task's verdict through; a variant returns a new verdict
    derived from it (a scalar, a coarse score, ...). Held-out results are always scored with the
    canonical verifier, whatever variant an optimisation ran under. ``repeats`` > 1 asks the
    harness to score that many times and pass all the verdicts (for stochastic scorers)."""

    name: str
    repeats: int

    def show(self, verdicts: Sequence[Verdict], example: Example) -> Verdict: ...


# -- the optimizer's side --------------------------------------------------------------------------------
@runtime_checkable
class TaskView(Protocol):
    """Everything an optimizer may see of a task, and nothing else. Implemented in-process by the
    session's view and, for isolated optimizers, by :class:`heldout.adapters.client.TaskClient`
    over HTTP: the same names, the same errors, the same architect call.

    * ``train``: dicts with ``id``, ``input``, ``target``; ``val``: ``id`` and ``input`` only;
      test examples are never reachable.
    * ``evaluate(candidate, split, ids)`` returns one dict per example with the fields the
      visibility policy shows; raises :class:`BudgetExceeded` (nothing ran) or
      :class:`VisibilityError`. ``split`` must be exactly ``"train"`` or ``"val"``.
    * ``architect(messages, ...)`` is one metered call of the session's architect model;
      ``architect_tokens_used`` the architect tokens spent so far.
    * ``record_event(kind, **data)`` writes mechanism evidence (e.g. ``merge_attempt``) to the
      ledger; it costs no budget.
    * ``remaining`` / ``metric_calls_budget``: metric calls left / in all; ``policy`` and
      ``verifier`` name the visibility policy and the verifier variant in force.

    The in-process view (:class:`heldout.evaluators.session.SessionView`) holds no test example,
    and neither does anything that refers to it, until the session has scored the final candidate.
    """

    task_name: str
    description: str
    kind: str
    policy: str
    verifier: str
    seed_candidate: Candidate
    train: list[dict[str, Any]]
    val: list[dict[str, Any]]

    @property
    def remaining(self) -> int: ...
    @property
    def metric_calls_budget(self) -> int: ...
    @property
    def architect_tokens_used(self) -> int: ...

    def evaluate(self, candidate: Candidate, split: str = "train", ids: Sequence[str] | None = None,
                 parent: str | None = None) -> list[dict[str, Any]]: ...
    def architect(self, messages: Sequence[Mapping[str, str]], *, temperature: float = 1.0,
                  max_tokens: int | None = None, replicate: int = 0) -> str: ...
    def record_event(self, kind: str, **data: Any) -> None: ...


Optimizer = Callable[[TaskView, int], Candidate]
"""An optimizer is ``optimize(view, seed) -> Candidate``. It may raise :class:`BudgetExceeded`
out of ``evaluate`` when it overruns; the harness then scores its best candidate so far only if
the optimizer returned one, so a careful optimizer catches it and returns its best."""


__all__ = [
    "SPLITS", "BudgetExceeded", "Candidate", "Completion", "DataError", "Example",
    "HeldoutError", "INFRASTRUCTURE_ERROR_KINDS", "MetricSpec", "InfrastructureFailure", "MalformedCandidate", "Message", "Optimizer", "ProgramTask", "PromptTask",
    "RunContext", "RunLimits", "Source", "TaskKind", "TaskView", "Verdict", "Verifier",
    "VisibilityError", "Worker", "candidate_id", "canonical_json", "check_candidate", "is_infrastructure_failure", "mean_score",
    "sha256_text",
]
