"""Run records: the outcome of one session, derived from (and anchored to) its ledger.

A run record (``run_record.json``, :data:`FORMAT_VERSION`) holds the full description of the
experiment it is the outcome of (:func:`describe_experiment`: task, profile and manifest digest,
verifier, visibility policy, budget, seed, optimizer name and the hash of its code, worker and
architect models, endpoint, decoding settings, isolation, heldout/Python/package versions and the
exact heldout code that scored, :func:`heldout_code`) plus its results and the ledger head it was
derived from.

Provenance rule: ``environment.heldout_code`` pins heldout itself, never the directory it was run
from: the git commit (and dirty flag) of the checkout holding the imported ``heldout`` package when
that checkout tracks it, and always the sha256 of the package's files (a wheel install has no
commit; a dirty checkout's commit alone does not say what ran).

Anchoring rule: the session writes the record's sha256 (:meth:`RunRecord.digest`) into the
ledger's ``session_end`` entry, so an edited record no longer matches its ledger;
:func:`anchor_problem` says how (naming the file), and reports refuse such a record.

Identity rule: a run dir holds one experiment (:mod:`heldout.evaluators.same_experiment`)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from heldout.contracts import (Candidate, HeldoutError, InfrastructureFailure, MetricSpec, Verdict, candidate_id,
                               canonical_json, json_safe, sha256_text)
from heldout.files import read_user_json, write_text_atomically
from heldout.evaluators.ledger import MAX_RECORD_BYTES
from heldout.evaluators.same_experiment import split_experiment, stated_decoding
from heldout.evaluators.scoring import Decoding
from heldout.evaluators.signing import SigningKey

RECORD_FILE = "run_record.json"
RECORD_PURPOSE = "run-record"
FORMAT_VERSION = 2
# the fields every reader relies on, by type (bool is refused where a number is meant)
_RECORD_TYPES: dict[str, tuple[type, ...]] = {
    "task": (str,), "profile": (str,), "method": (str,), "status": (str,), "seed": (int,),
    "budget": (dict,), "policy": (dict,), "limits": (dict,), "options": (dict,), "final_candidate": (dict, type(None)),
    "test_verdicts": (list,), "val_verdicts": (list,), "test_score": (int, float, type(None)),
    "val_score": (int, float, type(None)), "usage": (dict,), "trajectory": (list,), "lineage": (list,),
    "experiment": (dict,), "extra": (dict,), "ledger_head": (str,), "ledger_entries": (int,),
    "signature": (dict, type(None))}
KEY_PACKAGES = ("numpy", "scipy", "statsmodels", "datasets", "duckdb", "sqlglot", "httpx", "matplotlib",
                "numba", "evalplus")
@functools.lru_cache(maxsize=1)
def _package_versions() -> dict[str, str | None]:
    """Read once a process (9 ms of package metadata): the packages a process scores with are the
    ones it imported. Callers copy it."""
    versions: dict[str, str | None] = {}
    for name in KEY_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the imported heldout package, wherever it is installed


def package_files_sha256(package_dir: str | Path) -> str:
    """sha256 over every file of the package (relative path and content; compiled ``__pycache__``
    files left out, since they are derived and differ between Pythons), in a fixed order."""
    root = Path(package_dir)
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = Path(dirpath) / name
            try:
                content = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError as exc:  # unreadable: named in the hash rather than skipped
                content = f"unreadable: {exc.strerror}"
            digest.update(f"{path.relative_to(root).as_posix()}\0{content}\n".encode())
    return digest.hexdigest()


def _git(package_dir: Path, *args: str) -> subprocess.CompletedProcess | None:
    # GIT_DIR/GIT_WORK_TREE in the caller's environment would point git at the user's repository
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    try:
        return subprocess.run(["git", "-C", str(package_dir), *args], capture_output=True, text=True, timeout=10,
                              env=env)
    except (OSError, subprocess.SubprocessError):
        return None


def git_checkout_of(package_dir: str | Path) -> dict[str, Any] | None:
    """The commit of the git checkout that holds ``package_dir`` and tracks it, and whether the
    package's files differ from that commit (modified or untracked, ignored files aside); None
    when no checkout tracks it (a wheel install, even one inside a venv inside a repository)."""
    package_dir = Path(package_dir)
    tracked = _git(package_dir, "ls-files", "--error-unmatch", "--", "__init__.py")
    if tracked is None or tracked.returncode != 0:
        return None
    commit = _git(package_dir, "rev-parse", "HEAD")
    status = _git(package_dir, "status", "--porcelain", "--", ".")
    if commit is None or commit.returncode != 0 or status is None or status.returncode != 0:
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def heldout_code(package_dir: str | Path | None = None) -> dict[str, Any]:
    """The exact heldout code that scores (see the provenance rule): ``commit`` and ``dirty``
    (None when no git checkout tracks the package) and ``files_sha256``."""
    if package_dir is None:
        return dict(_this_heldout_code())
    git = git_checkout_of(package_dir)
    return {"commit": git and git["commit"], "dirty": git and git["dirty"],
            "files_sha256": package_files_sha256(package_dir)}


@functools.lru_cache(maxsize=1)
def _this_heldout_code() -> dict[str, Any]:
    """Computed once a process: the code a process scores with is the code it imported."""
    return heldout_code(PACKAGE_DIR)


def heldout_version() -> str:
    try:
        return metadata.version("heldout")
    except metadata.PackageNotFoundError:
        return "unknown"


def environment() -> dict[str, Any]:
    """Where a session ran: heldout's version and code (:func:`heldout_code`), Python and key
    package versions, the platform."""
    return {"heldout_version": heldout_version(), "heldout_code": heldout_code(), "python": platform.python_version(),
            "implementation": platform.python_implementation(), "platform": platform.platform(),
            "packages": dict(_package_versions())}


def model_description(client: Any) -> dict[str, Any] | None:
    """Model id and endpoint of a worker/architect client (None when the session has none)."""
    if client is None:
        return None
    return {"model": getattr(client, "model", None), "base_url": getattr(client, "base_url", None),
            "client": type(client).__name__}


def manifest_digest(manifest: Any, profile: str) -> dict[str, Any]:
    """sha256 of the whole manifest and of the profile used (its id lists and their content
    hashes): two runs with the same profile digest saw exactly the same examples."""
    whole = manifest.sha256()
    splits = manifest.profile(profile)
    used = {"profile": splits, "hashes": {i: manifest.hashes.get(i) for ids in splits.values() for i in ids}}
    return {"version": manifest.version, "sha256": whole, "profile_sha256": sha256_text(canonical_json(used))}


def describe_experiment(session: Any) -> dict[str, Any]:
    """The full description of a session's experiment (the ``session_start`` entry). Fields a
    caller passes as ``provenance`` (the optimizer's code hash, ...) are merged in."""
    task, bench = session.task, session.task.benchmark
    scorer = session.scorer
    decoding = getattr(session, "decoding", None) or Decoding()
    options = dict(session.options)  # the task options; the decoding is its own field
    provenance = dict(getattr(session, "provenance", None) or {})
    verifier = getattr(session, "variant", None)
    # what a published number depends on (shots, template, stop, decoding); None for program tasks
    setting = bench.prompt_setting(options.get("prompt_format")) if hasattr(bench, "prompt_setting") else None
    description = {
        "format_version": FORMAT_VERSION,
        "task": task.name, "task_version": bench.version, "kind": bench.kind,
        **MetricSpec.of(getattr(bench, "metric", "score")).record_fields(),
        "score_ceiling": getattr(bench, "score_ceiling", None),
        "profile": task.profile, "seed": session.seed, "method": session.method,
        "budget": asdict(session.budget), "policy": session.policy.to_dict(),
        "verifier": getattr(verifier, "name", None) or "decomposed",
        "sizes": task.sizes(), "manifest_version": task.manifest.version,
        "manifest": manifest_digest(task.manifest, task.profile),
        "drift": None if task.drift is None else task.drift.to_dict(),
        "limits": asdict(scorer.limits), "options": options,
        "worker": model_description(scorer.worker),
        "deployment_worker": model_description(getattr(session, "deploy_scorer", scorer).worker),
        "architect": model_description(session.models.architect),
        "judge": model_description(getattr(scorer, "judge", None)),
        # as the experiment stated it (None: the task's) and as the models' requests carry it
        "decoding": {"stated": asdict(decoding), "sent": {
            "temperature": decoding.temperature if decoding.temperature is not None else (
                setting.temperature if setting else 0.0),
            "max_tokens": decoding.max_tokens if decoding.max_tokens is not None else (
                setting.max_tokens if setting else None),
            **({"stop": list(setting.stop)} if setting and setting.stop else {}),
            "judge_temperature": decoding.judge_temperature, "judge_max_tokens": decoding.judge_max_tokens}},
        "prompt_setting": setting.as_dict() if setting else None,
        "optimizer": provenance.pop("optimizer", {"name": session.method, "code_sha256": None}),
        "isolation": provenance.pop("isolation", "in-process (trusted)"),
        # the study's error budget: the share of examples an infrastructure failure may leave
        # unscored. Zero, always: such an example stops the session (contracts.INFRASTRUCTURE_ERROR_KINDS)
        "infrastructure_failures_tolerated": 0.0,
        "environment": environment(),
        "started_at": time.time(),
    }
    description.update(provenance)
    return description


ANCHOR_FIELDS = ("ledger_head", "ledger_entries", "signature")
"""The fields a record gets once its digest is in the ledger: outside what is digested and signed."""
_PLAIN_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain_json(value: Any) -> bool:
    """Whether ``value`` is JSON data that reads back as it is encoded: exact dicts with text keys,
    lists, tuples and scalars (a key that is not text would be sorted otherwise once read back)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            if any(type(k) is not str for k in item):
                return False
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif kind not in _PLAIN_SCALARS:
            return False
    return True


def _json_value(obj: Any) -> Any:
    """What json writes for a value it has no rule for: a dataclass as its fields, else its str."""
    return asdict(obj) if is_dataclass(obj) and not isinstance(obj, type) else str(obj)


#: what an optimizer states about its run (an ``optimizer_event`` of these kinds) and the record keeps:
#: the split that selected its final candidate, and what its library could not make reproducible
SELECTION_EVENT, NOT_REPRODUCIBLE_EVENT = "final_selection", "not_reproducible"
SELECTION_SPLITS = ("val", "train", "train+val", "none")


def optimizer_statements(events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``selection`` ({split, how}) and ``not_reproducible`` ({what}) as the optimizer last stated
    them in its ``optimizer_event`` ledger entries ``events``, each None when it stated nothing
    (user code need not). The optimizer's word, not the harness's measurement; the report says so.
    A split outside :data:`SELECTION_SPLITS` is kept as "unknown"; texts are cut to 300 characters."""
    stated: dict[str, Any] = {"selection": None, "not_reproducible": None}
    for entry in events:
        kind, data = entry["data"].get("kind"), entry["data"].get("data") or {}
        if kind == SELECTION_EVENT:
            split = data.get("split")
            stated["selection"] = {"split": split if split in SELECTION_SPLITS else "unknown",
                                   "how": str(data.get("how", ""))[:300]}
        elif kind == NOT_REPRODUCIBLE_EVENT:
            stated["not_reproducible"] = {"what": str(data.get("what", ""))[:300]}
    return stated


@dataclass
class RunRecord:
    """Final candidate, its held-out verdicts (scored once by the harness after the optimizer
    returned), val verdicts, usage by channel, best-so-far trajectory by metric calls, lineage,
    and the full description of the experiment (``experiment``, the ledger's session_start)."""

    task: str
    profile: str
    seed: int
    method: str
    status: str  # "ok" | "failed"
    budget: dict[str, Any]
    policy: dict[str, Any]
    limits: dict[str, Any]
    options: dict[str, Any]
    drift: dict[str, Any] | None
    final_candidate: Candidate | None
    final_candidate_id: str | None
    test_verdicts: list[dict[str, Any]]
    val_verdicts: list[dict[str, Any]]
    test_score: float | None
    val_score: float | None
    usage: dict[str, Any]
    trajectory: list[dict[str, Any]]
    lineage: list[dict[str, Any]]
    error: str | None = None
    ledger_head: str = ""
    ledger_entries: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = 1
    experiment: dict[str, Any] = field(default_factory=dict)
    isolation: str = "in-process (trusted)"
    started_at: float | None = None
    finished_at: float | None = None
    signature: dict[str, str] | None = None
    """The writer's Ed25519 signature over :meth:`signed_payload` (see :mod:`heldout.evaluators.signing`)."""

    @classmethod
    def build(cls, session, final: Candidate | None, status: str, error: str | None,
              test_verdicts: list[Verdict], val_verdicts: list[Verdict],
              test_metrics: Mapping[str, float] | None = None,
              val_score_own_verifier: float | None = None) -> "RunRecord":
        """The record of ``session``'s run: its experiment as the ledger's ``session_start`` states
        it, the held-out verdicts, usage, trajectory and lineage; in ``extra`` the benchmark's test
        metrics, what the optimizer stated (:func:`optimizer_statements`) and, under a verifier
        variant, the val score as the optimizer's own verifier shows it."""
        record = cls._built(session, final, status, error, test_verdicts, val_verdicts)
        record.extra["test_metrics"] = dict(test_metrics or {})  # the verifier is the experiment's (record.verifier)
        record.extra.update(optimizer_statements(session.ledger.entries("optimizer_event")))
        if val_score_own_verifier is not None:
            record.extra["val_score_own_verifier"] = val_score_own_verifier
        # evidence is strict JSON, as the ledger's entries are: a verdict's infinite detail (two
        # coincident points' distance ratio) is "inf" here too, never Infinity, which jq refuses
        for name in ("test_verdicts", "val_verdicts", "trajectory", "lineage", "extra"):
            setattr(record, name, json_safe(getattr(record, name)))
        return record

    @classmethod
    def _built(cls, session, final: Candidate | None, status: str, error: str | None,
               test_verdicts: list[Verdict], val_verdicts: list[Verdict]) -> "RunRecord":
        service = session.service
        usage = service.usage
        start = next((e["data"] for e in session.ledger.entries("session_start")), None) or session.header()
        launch = next((e["data"] for e in session.ledger.entries("optimizer_launch")), None)
        isolation = f"isolated ({launch['isolation']})" if launch else start.get("isolation", "in-process (trusted)")

        aggregate = session.task.benchmark.aggregate

        def metric(vs: list[Verdict]) -> float | None:  # the task's stated metric (None: no examples)
            return aggregate(vs) if vs else None

        lineage = [{"candidate_id": cid, "parent": info["parent"],
                    "first_metric_call": info["first_metric_call"],
                    "means": {s: t[0] / t[1] for s, t in info["sums"].items() if t[1]}}
                   for cid, info in service.candidates.items()]
        return cls(
            task=start["task"], profile=start["profile"], seed=start["seed"], method=start["method"],
            status=status, budget=start["budget"], policy=start["policy"], limits=start["limits"],
            options=start["options"], drift=start["drift"], final_candidate=final,
            final_candidate_id=candidate_id(final) if final else None,
            test_verdicts=[v.to_dict() for v in test_verdicts],
            val_verdicts=[v.to_dict() for v in val_verdicts],
            test_score=metric(test_verdicts), val_score=metric(val_verdicts),
            usage={"metric_calls": usage.metric_calls, "metric_call_budget": session.budget.metric_calls,
                   "endpoint_calls": dict(usage.endpoint_calls), "cache_hits": usage.cache_hits,
                   "replayed": usage.replayed, "tokens": {k: dict(v) for k, v in usage.tokens.items()}},
            trajectory=list(service.trajectory), lineage=lineage, error=error,
            format_version=FORMAT_VERSION, experiment=dict(start), isolation=isolation,
            started_at=start.get("started_at"), finished_at=time.time())

    @property
    def task_options(self) -> dict[str, Any]:
        """The task options the run's task read (a record written before issue 59 kept the decoding
        settings among its ``options``: they are left out here)."""
        return split_experiment({"options": self.options})["options"]

    @property
    def decoding(self) -> dict[str, Any]:
        """The decoding the experiment stated (every :class:`Decoding` field; None: the task's),
        from its ``experiment`` or, in a record written before issue 59, its ``options``."""
        stated = (split_experiment(self.experiment).get("decoding") or {}).get("stated")
        return dict(stated) if isinstance(stated, Mapping) else stated_decoding(self.options)

    @property
    def options_as_stated(self) -> dict[str, Any]:
        """The task options with the stated decoding among them (None: the task's, left out), as a
        study file's ``[options]`` table states them: what a re-scoring of this run (an ablation,
        a recipe baseline, a re-run cell) splits again into the same task options and decoding."""
        return {**self.task_options, **{k: v for k, v in self.decoding.items() if v is not None}}

    @property
    def verifier(self) -> str:
        """The verifier variant the optimizer ran under (held-out scoring is always canonical): the
        experiment's, recorded once; records written before that kept a copy in ``extra``."""
        return str(self.experiment.get("verifier") or self.extra.get("verifier") or "decomposed")

    # -- anchoring --------------------------------------------------------------------------------
    def content(self) -> dict[str, Any]:
        """The record as plain JSON data, without the ledger anchor fields (which are set after
        the digest is written to the ledger)."""
        data = json.loads(json.dumps(self._fields(), default=_json_value))
        for key in ANCHOR_FIELDS:
            data.pop(key, None)
        return data

    def sealed_content(self) -> str:
        """:meth:`content` as the canonical JSON :meth:`digest` hashes: a session takes it once when
        the record is final, and reserves room, digests, signs and saves from it. Fields that are
        plain JSON already (text keys, exact types: as :meth:`content` reads them back) are encoded
        as they are, once, not written, read back and encoded again."""
        unanchored = {k: v for k, v in self._fields().items() if k not in ANCHOR_FIELDS}
        return canonical_json(unanchored) if _plain_json(unanchored) else canonical_json(self.content())

    def digest(self, sealed: str | None = None) -> str:
        """sha256 of :meth:`content` (``sealed``: its :meth:`sealed_content`, already taken): what
        the ledger's ``session_end`` entry holds."""
        return sha256_text(self.sealed_content() if sealed is None else sealed)

    def signed_payload(self, record_sha256: str | None = None) -> dict[str, Any]:
        """What the record's signature signs: its digest and the ledger head it is anchored to
        (which vouches for every ledger entry up to it)."""
        return {"record_sha256": record_sha256 or self.digest(), "ledger_head": self.ledger_head,
                "ledger_entries": self.ledger_entries}

    def sign(self, key: SigningKey, record_sha256: str | None = None) -> None:
        """Sign the finished record (its ledger anchor set) with ``key`` (``record_sha256``: its
        :meth:`digest`, already taken)."""
        self.signature = key.sign(RECORD_PURPOSE, self.signed_payload(record_sha256))

    # -- io ---------------------------------------------------------------------------------------
    def reserve_room(self, run_dir: str | Path, sealed: str | None = None) -> None:
        """Write the record once under a scratch name before its session's ``session_end``: a disk
        that fills between that entry and the record would leave a finished ledger without a
        record, which no resume can finish; failing here (:class:`InfrastructureFailure`) leaves
        the session resumable instead."""
        probe = Path(run_dir) / f".{RECORD_FILE}.room"
        try:
            probe.write_text((self.sealed_content() if sealed is None else sealed) + " " * 4096, encoding="utf-8")
        except OSError as exc:
            raise InfrastructureFailure(f"cannot write the run record in {run_dir}: {exc.strerror or exc}; "
                                        "free space, then rerun the same command with --resume") from None
        finally:
            probe.unlink(missing_ok=True)

    def save(self, run_dir: str | Path, sealed: str | None = None) -> Path:
        """Write the record (owner-only, like the ledger): its :meth:`sealed_content` with the anchor
        fields, one line. ``sealed``: that content, taken once the record became final (only the
        anchors set since), so the whole record is not encoded a second time."""
        path = Path(run_dir) / RECORD_FILE
        sealed = self.sealed_content() if sealed is None else sealed  # one line, as a session writes it
        anchors = canonical_json({k: getattr(self, k) for k in ANCHOR_FIELDS})
        text = anchors[:-1] + ("," if sealed != "{}" else "") + sealed[1:]
        write_text_atomically(path, text, mode=0o600)
        return path

    def _fields(self) -> dict[str, Any]:
        """The fields as they are (json writes them as ``asdict`` would have: a record's fields
        are plain data, and :func:`_json_value` turns a nested dataclass into a dict), without
        ``asdict``'s deep copy (a sixth of writing a whole synthetic run, ledger included)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def load(cls, run_dir: str | Path) -> "RunRecord":
        """The record in ``run_dir``; a record that is not one (unreadable, truncated, not an
        object, a field missing or of the wrong type, or written by a newer heldout) is one
        :class:`HeldoutError` naming the path and what is wrong."""
        path = Path(run_dir) / RECORD_FILE
        data = read_user_json(path, "run record", max_bytes=MAX_RECORD_BYTES, error=HeldoutError)
        version = data.get("format_version", 1)
        if type(version) is not int or version > FORMAT_VERSION:
            raise HeldoutError(f"run record {path} has format version {version!r}: this heldout reads versions up "
                               f"to {FORMAT_VERSION} (written by a newer heldout? upgrade to read it)")
        missing = [k for k, f in cls.__dataclass_fields__.items()
                   if k not in data and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise HeldoutError(f"run record {path} lacks {', '.join(missing)}")
        for key, types in _RECORD_TYPES.items():
            if key in data and not (isinstance(data[key], types) and type(data[key]) is not bool):
                raise HeldoutError(f"run record {path}: {key} must be {' or '.join(t.__name__ for t in types)}, "
                                   f"got {data[key]!r:.60}")
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def verdict_scores(self, split: str = "test") -> dict[str, float]:
        verdicts = self.test_verdicts if split == "test" else self.val_verdicts
        return {v["example_id"]: float(v["score"]) for v in verdicts}

    # -- what a report needs to know to pool runs --------------------------------------------------
    def pooling_key(self) -> dict[str, str]:
        """The settings runs must share to be pooled in one table cell or compared by the gate:
        worker model, profile (and the exact examples), budget, policy and verifier."""
        exp = self.experiment
        worker = exp.get("worker") or {}
        profile_digest = (exp.get("manifest") or {}).get("profile_sha256")
        return {
            "worker model": str(worker.get("model") or "none"),
            "profile": self.profile,
            "examples": (profile_digest or "unknown")[:12],  # the same profile name with other examples
            "budget": canonical_json(self.budget),
            "policy": str(self.policy.get("name", self.policy)),
            "verifier": str(exp.get("verifier") or "decomposed"),
        }


def anchor_problem(record: RunRecord, entries: Sequence[Mapping[str, Any]], head: str,
                   path: str | Path) -> str | None:
    """Why ``record`` (read from ``path``) is not the record its ledger ``entries`` (ending in
    ``head``) produced, or None when it is. Checks the format, the head and entry count, and
    the digest the session wrote to ``session_end``."""
    if record.format_version < FORMAT_VERSION:
        return (f"{path} is a format {record.format_version} run record (not anchored to its ledger by a "
                f"digest; heldout {heldout_version()} writes format {FORMAT_VERSION}); re-run it")
    if record.ledger_head != head or record.ledger_entries != len(entries):
        return (f"{path} is not anchored to its ledger (record says {record.ledger_entries} entries ending "
                f"{record.ledger_head[:16]}, ledger has {len(entries)} ending {head[:16]})")
    end = next((e["data"] for e in reversed(entries) if e["kind"] == "session_end"), None)
    if end is None or "record_sha256" not in end:
        return f"{path}: its ledger has no session_end entry with the record's digest"
    if end["record_sha256"] != record.digest():
        return (f"{path} was edited after the session wrote it: its content no longer matches the digest "
                f"in its ledger (sha256 {end['record_sha256'][:16]}...); every number in it is refused")
    return None
