"""A reviewer's bundle: everything needed to check a study in one ``.tar.gz``, nothing secret.

Layout (under ``heldout-bundle/``)::

    bundle.json            what is inside: every file with its sha256 and size, each run's signer
                           fingerprints, the manifests and whether they match the records, who bundled
    SIGNERS                the public keys that signed the runs, trusted-signers format (a reviewer
                           compares the fingerprints with the ones the authors published; being in
                           the bundle makes a key trusted by nobody)
    environment.json       each distinct environment the runs recorded, and the bundler's
    runs/<path>/           per run dir (path relative to the root given): ledger.jsonl,
                           ledger.head, run_record.json; a study root's study.json and study.toml
    manifests/<task>.json  the data manifest of every task the runs name, as found on this machine
    report/...             the report folder, when one is given

Rules. Only files of these names are taken from a run dir (never a lock file, never anything
else a folder holds), each a regular file opened without following links: a run dir whose ledger
is a link (to a key, say) is refused, so a bundle cannot carry a secret someone planted a link to.
No key is read to bundle: the public keys come from the signatures. The archive is written under
a temporary name and renamed, so a refused bundle writes nothing."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import time
from pathlib import Path
from typing import Any, Iterable

from heldout.contracts import HeldoutError
from heldout.data_manifests import Manifest, manifest_roots
from heldout.evaluators.ledger import HEAD_FILE, LEDGER_FILE, MAX_LEDGER_BYTES
from heldout.evaluators.records import RECORD_FILE, environment, heldout_version
from heldout.evaluators.signing import fingerprint, parse_public_key, SigningError
from heldout.reports.collect import ReportError, find_run_dirs

ROOT = "heldout-bundle"
RUN_FILES = (LEDGER_FILE, HEAD_FILE, RECORD_FILE)
STUDY_FILES = ("study.json", "study.toml")
MAX_REPORT_FILE_BYTES = 256 << 20


class BundleError(ReportError):
    """The bundle cannot be made as asked (one line; nothing is written)."""


def read_regular(path: Path, max_bytes: int = MAX_LEDGER_BYTES) -> bytes:
    """The bytes of ``path``, a regular file reached without following a link at its last part."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "is a symbolic link" if os.path.islink(path) else (exc.strerror or str(exc))
        raise BundleError(f"refusing to bundle {path}: {why}") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise BundleError(f"refusing to bundle {path}: not a regular file")
        if info.st_size > max_bytes:
            raise BundleError(f"refusing to bundle {path}: {info.st_size} bytes, over {max_bytes}")
        return fh.read(max_bytes + 1)


def _signers_of(files: dict[str, bytes]) -> dict[str, str]:
    """fingerprint -> public key of every signature in a run's head and record."""
    found = {}
    for name in (HEAD_FILE, RECORD_FILE):
        try:
            block = json.loads(files[name]).get("signature") if name in files else None
            raw = parse_public_key(block["public_key"]) if isinstance(block, dict) else None
        except (ValueError, AttributeError, KeyError, TypeError, SigningError):
            raw = None  # an unreadable signature: the reviewer's verification says so
        if raw is not None:
            found[fingerprint(raw)] = block["public_key"]
    return found


def _manifests(records: Iterable[dict[str, Any]]) -> tuple[dict[str, bytes], list[dict[str, Any]]]:
    """The manifest file of every task the records name, and whether each matches what they recorded."""
    wanted: dict[str, set[str]] = {}
    for rec in records:
        digest = ((rec.get("experiment") or {}).get("manifest") or {}).get("sha256")
        if isinstance(rec.get("task"), str):
            wanted.setdefault(rec["task"], set()).add(str(digest))
    files, index = {}, []
    for task, recorded in sorted(wanted.items()):
        found = _manifest_recorded(task, recorded)
        if found is None:
            index.append({"task": task, "file": None, "matches_records": False, "note": "no manifest found here"})
            continue
        path, whole = found
        files[f"manifests/{task}.json"] = read_regular(path)
        index.append({"task": task, "file": f"manifests/{task}.json", "sha256": whole,
                      "matches_records": recorded == {whole}})
    return files, index


def _manifest_recorded(task: str, recorded: set[str]) -> tuple[Path, str] | None:
    """The manifest file of ``task`` on the search path whose digest the records recorded (a user
    manifest that adds a profile sits before the shipped one it does not replace), else the first
    one; with its digest. None when there is none, or it does not read."""
    first = None
    for root in manifest_roots():
        path = Manifest.path_for(task, root)
        if not path.exists():
            continue
        try:
            whole = Manifest.load(task, root).sha256()
        except HeldoutError:
            continue
        if whole in recorded:
            return path, whole
        first = first or (path, whole)
    return first


def collect_bundle(roots: list[Path], report: Path | None) -> dict[str, bytes]:
    """Every file of the bundle, by its path inside it (see the module docstring)."""
    files: dict[str, bytes] = {}
    runs, records, environments = [], [], []
    signers: dict[str, str] = {}
    for root in roots:
        for name in STUDY_FILES:
            if (root / name).exists() or (root / name).is_symlink():
                files[f"runs/{root.name}/{name}"] = read_regular(root / name)
        for run_dir in find_run_dirs([root]):
            inside = f"runs/{root.name}" + ("" if run_dir == root else f"/{run_dir.relative_to(root).as_posix()}")
            mine = {name: read_regular(run_dir / name) for name in RUN_FILES
                    if (run_dir / name).exists() or (run_dir / name).is_symlink()}
            files.update({f"{inside}/{name}": data for name, data in mine.items()})
            keys = _signers_of(mine)
            signers.update(keys)
            runs.append({"path": inside, "files": sorted(mine), "signed_by": sorted(keys)})
            try:
                rec = json.loads(mine[RECORD_FILE]) if RECORD_FILE in mine else None
            except ValueError:
                rec = None
            if isinstance(rec, dict):
                records.append(rec)
                env = (rec.get("experiment") or {}).get("environment")
                if env is not None and env not in environments:
                    environments.append(env)
    if not runs:
        raise BundleError("no run dir found under " + ", ".join(map(str, roots)))
    manifest_files, manifest_index = _manifests(records)
    files.update(manifest_files)
    if report is not None:
        files.update(_report_files(report))
    files["environment.json"] = json.dumps({"runs": environments, "bundled_by": environment()}, indent=1).encode()
    files["SIGNERS"] = ("# the keys that signed these runs. Trust one only after comparing its fingerprint with the\n"
                        "# one its owner published: a key in this file is trusted by nobody.\n"
                        + "".join(f"signer-{i + 1} {key}  # {fp}\n"
                                  for i, (fp, key) in enumerate(sorted(signers.items())))).encode()
    index = {"format": 1, "heldout_version": heldout_version(), "created_at": time.time(), "runs": runs,
             "manifests": manifest_index, "signers": sorted(signers),
             "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                       for name, data in sorted(files.items())}}
    files["bundle.json"] = json.dumps(index, indent=1).encode()
    return files


def _report_files(report: Path) -> dict[str, bytes]:
    if not report.is_dir() or report.is_symlink():
        raise BundleError(f"report folder {report} is not a folder")
    out = {}
    for dirpath, dirnames, filenames in os.walk(report):  # os.walk follows no link to a folder
        for name in sorted(filenames):
            path = Path(dirpath) / name
            out[f"report/{path.relative_to(report).as_posix()}"] = read_regular(path, MAX_REPORT_FILE_BYTES)
    return out


def write_bundle(roots: Iterable[str | Path], out: str | Path, report: str | Path | None = None) -> dict[str, Any]:
    """Write the bundle of the run dirs under ``roots`` (and the ``report`` folder) to ``out``
    (a ``.tar.gz``); returns its index (``bundle.json``). Nothing is written when it is refused."""
    roots = [Path(r).resolve() for r in roots]  # a root's name is its folder in the bundle ("." has none)
    for root in roots:
        if not root.is_dir():
            raise BundleError(f"run dir {root} does not exist")
    names = [r.name for r in roots]
    if len(set(names)) != len(names):
        raise BundleError(f"the run dirs given share a folder name ({', '.join(names)}): bundle them one by one")
    files = collect_bundle(roots, Path(report) if report is not None else None)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for name, data in sorted(files.items()):
                info = tarfile.TarInfo(f"{ROOT}/{name}")
                info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return json.loads(files["bundle.json"])
