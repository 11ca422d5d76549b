"""Frozen manifests: per task, the data source, the content hash of every example and named split
profiles as explicit id lists.

Splits are data, not code. A manifest is written once by :func:`freeze` and then only read;
loading checks every example of the chosen profile against its hash and refuses to go on when
anything changed (unless drift is explicitly allowed, and then the drift is recorded).

Each profile's id lists have a digest (``profile_digests``), written by :meth:`Manifest.save` and
checked by :meth:`Manifest.load` (so also by ``heldout data verify``): a hand-edited split list
(moving a test id into train, dropping hard test examples) is refused with a clear error, never
silently used. The digest is not a signature; it makes an edit deliberate and visible in review.

File layout: ``heldout/data_manifests/<task name>.json`` (``bbh/word_sorting`` ->
``bbh/word_sorting.json``)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from heldout.contracts import DataError, Example, HeldoutError, Source, canonical_json, sha256_text
from heldout.files import NAME, read_user_json, write_text_atomically

MANIFEST_DIR = Path(__file__).resolve().parent
MANIFEST_FORMAT = 1
MAX_MANIFEST_BYTES = 256 << 20
SPLITS = ("train", "val", "test")


class DriftError(DataError):
    """The data no longer matches its frozen manifest."""

    def __init__(self, report: "DriftReport") -> None:
        self.report = report
        super().__init__(report.describe() + "\n(pass --allow-drift / allow_drift=True to proceed "
                         "anyway; the drift is then recorded in every output)")


@dataclass
class DriftReport:
    """What differs between the data as loaded and its manifest. Empty means identical."""

    task: str
    changed: dict[str, list[str]] = field(default_factory=dict)  # id -> changed fields
    missing: list[str] = field(default_factory=list)  # in the manifest, not in the data
    unexpected: list[str] = field(default_factory=list)  # in the data, not in the manifest
    checked: int = 0

    @property
    def clean(self) -> bool:
        return not (self.changed or self.missing or self.unexpected)

    def describe(self, limit: int = 10) -> str:
        if self.clean:
            return f"{self.task}: {self.checked} examples match the manifest"
        parts = [f"{self.task}: data does not match its frozen manifest"]
        if self.changed:
            ids = list(self.changed)
            shown = ", ".join(f"{i} ({'+'.join(self.changed[i])})" for i in ids[:limit])
            more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
            parts.append(f"  {len(ids)} examples changed: {shown}{more}")
        if self.missing:
            parts.append(f"  {len(self.missing)} examples missing: {', '.join(self.missing[:limit])}")
        if self.unexpected:
            parts.append(f"  {len(self.unexpected)} examples not in the manifest: "
                         f"{', '.join(self.unexpected[:limit])}")
        return "\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "clean": self.clean, "checked": self.checked,
                "changed": self.changed, "missing": self.missing, "unexpected": self.unexpected}


def field_hashes(example: Example) -> dict[str, str]:
    """Hashes of the separate fields, so a drift message can say *what* changed."""

    out = {"target": sha256_text(canonical_json(example.target))}
    for key in sorted(example.input):
        out[f"input.{key}"] = sha256_text(canonical_json(example.input[key]))
    return out


def profile_digest(task: str, name: str, splits: Mapping[str, Sequence[str]]) -> str:
    """sha256 of a profile's id lists (split order and id order both count)."""
    return sha256_text(canonical_json({"task": task, "profile": name,
                                       "splits": [[split, list(ids)] for split, ids in splits.items()]}))


def short_hash(values: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


MANIFEST_PATH_ENV = "HELDOUT_MANIFEST_PATH"
_PLUGIN_ROOTS: list[Path] = []


def add_manifest_root(path: str | os.PathLike) -> None:
    """Put a plugin package's manifest folder on the search path (after the user's, before
    heldout's own)."""
    resolved = Path(path).resolve()
    if resolved not in _PLUGIN_ROOTS:
        _PLUGIN_ROOTS.append(resolved)


def manifest_roots() -> list[Path]:
    """Where manifests are looked up, in order: ``$HELDOUT_MANIFEST_PATH`` (``os.pathsep``-separated
    folders, e.g. where ``heldout data freeze --out`` wrote), plugin packages' folders, heldout's."""
    env = [Path(p) for p in os.environ.get(MANIFEST_PATH_ENV, "").split(os.pathsep) if p]
    return env + list(_PLUGIN_ROOTS) + [MANIFEST_DIR]


@dataclass
class Manifest:
    task: str
    version: str
    source: dict[str, Any]
    hashes: dict[str, str]  # example id -> content hash (source order)
    profiles: dict[str, dict[str, list[str]]]  # profile -> split -> ids
    fields: dict[str, dict[str, str]] = field(default_factory=dict)  # id -> field -> short hash
    notes: dict[str, str] = field(default_factory=dict)  # profile -> how it was drawn
    format: int = MANIFEST_FORMAT
    profile_digests: dict[str, str] = field(default_factory=dict)  # profile -> digest of its id lists

    def sha256(self) -> str:
        """sha256 of the whole manifest (its fields as canonical JSON): what a run records as its
        ``manifest.sha256``, and what a bundle matches a manifest file to the records by."""
        # the fields hold JSON values only: the same bytes as asdict's deep copy, without copying the ids
        return sha256_text(canonical_json({name: getattr(self, name) for name in self.__dataclass_fields__}))

    # -- io ---------------------------------------------------------------------------------
    @staticmethod
    def path_for(task: str, root: Path = MANIFEST_DIR) -> Path:
        # a task name becomes a file path: each part is a plain name (an allow-list), so no "..",
        # absolute path, newline, NUL or leading "-" reaches the file system
        if not isinstance(task, str) or not all(NAME.fullmatch(part) and part not in (".", "..")
                                                for part in task.split("/")):
            raise DataError(f"bad task name {task!r}: use parts of letters, digits and ._+-:?=&,@ separated by /")
        return root / f"{task}.json"

    @classmethod
    def find(cls, task: str) -> Path | None:
        """The first manifest of ``task`` on the search path (:func:`manifest_roots`), or None."""
        for root in manifest_roots():
            path = cls.path_for(task, root)
            if path.exists():
                return path
        return None

    @classmethod
    def load(cls, task: str, root: Path | None = None) -> "Manifest":
        """The manifest of ``task`` from ``root``, or the first one on the search path."""
        path = cls.path_for(task, Path(root)) if root is not None else cls.find(task)
        if path is None or not path.exists():
            where = path or ", ".join(str(r) for r in manifest_roots())
            raise DataError(f"no manifest for task {task!r} (looked in {where}); freeze one with `heldout data freeze`")
        data = read_user_json(path, "manifest", max_bytes=MAX_MANIFEST_BYTES)
        try:
            manifest = cls(**data)
        except (ValueError, TypeError) as exc:
            raise DataError(f"manifest {path} is unreadable: {exc}") from exc
        manifest.check_profile_digests(path)
        manifest.path = path  # where it was found (not part of the frozen content)
        return manifest

    def check_profile_digests(self, where: Path | str) -> None:
        """Every profile has a digest and its id lists match it; else :class:`DataError`."""
        for name in self.profiles:
            want = self.profile_digests.get(name)
            if want is None:
                raise DataError(f"manifest {where}: profile {name!r} has no digest of its id lists "
                                f"(re-freeze it with `heldout data freeze`)")
            if profile_digest(self.task, name, self.profiles[name]) != want:
                raise DataError(f"manifest {where}: profile {name!r}'s split lists do not match their digest "
                                f"(the id lists were edited); restore the manifest or re-freeze the profile")
        extra = sorted(set(self.profile_digests) - set(self.profiles))
        if extra:
            raise DataError(f"manifest {where}: digests for profiles that do not exist: {', '.join(extra)}")

    def save(self, root: Path | None = None) -> Path:
        path = self.path_for(self.task, root or MANIFEST_DIR)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.profile_digests = {name: profile_digest(self.task, name, splits) for name, splits in self.profiles.items()}
        write_text_atomically(path, json.dumps(asdict(self), indent=1, ensure_ascii=False) + "\n")
        return path

    # -- profiles ---------------------------------------------------------------------------
    def profile(self, name: str) -> dict[str, list[str]]:
        try:
            return self.profiles[name]
        except KeyError:
            raise DataError(f"task {self.task!r} has no split profile {name!r}; "
                            f"it has: {', '.join(sorted(self.profiles))}") from None

    def sizes(self, name: str) -> dict[str, int]:
        return {split: len(ids) for split, ids in self.profile(name).items()}

    def profile_ids(self, name: str) -> list[str]:
        seen: dict[str, None] = {}
        for ids in self.profile(name).values():
            seen.update(dict.fromkeys(ids))
        return list(seen)

    # -- verification -----------------------------------------------------------------------
    def verify(self, examples: Iterable[Example], ids: Sequence[str] | None = None) -> DriftReport:
        """Compare loaded examples with the frozen hashes (all of them, or only ``ids``)."""
        by_id = {ex.id: ex for ex in examples}
        wanted = list(self.hashes) if ids is None else list(ids)
        report = DriftReport(task=self.task, checked=len(wanted))
        for ex_id in wanted:
            ex = by_id.get(ex_id)
            if ex is None:
                report.missing.append(ex_id)
                continue
            if ex.content_hash() != self.hashes.get(ex_id):
                old = self.fields.get(ex_id, {})
                new = {k: v[:16] for k, v in field_hashes(ex).items()}
                changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                report.changed[ex_id] = changed or ["content"]
        if ids is None:
            report.unexpected = [i for i in by_id if i not in self.hashes]
        return report


def task_manifests(task: str) -> list[Manifest]:
    """Every manifest of ``task`` on the search path, in its order (:func:`manifest_roots`); with
    none, the :class:`DataError` of :meth:`Manifest.load` naming where it looked."""
    found = [Manifest.load(task, root) for root in manifest_roots() if Manifest.path_for(task, root).exists()]
    return found or [Manifest.load(task)]


def manifest_holding(task: str, profile: str) -> Manifest:
    """The first manifest of ``task`` on the search path that holds ``profile`` (else the first one,
    whose error, asked for the profile, lists the profiles it has): a user manifest adds profiles
    without hiding the shipped ones it does not repeat. Whatever reads a task's profile asks here."""
    manifests = task_manifests(task)
    return next((m for m in manifests if profile in m.profiles), manifests[0])


def freeze(task: str, version: str, source: Source | Mapping[str, Any], examples: Sequence[Example],
           profiles: Mapping[str, Mapping[str, Sequence[str]]], notes: Mapping[str, str] | None = None,
           mirror_sha256: Mapping[str, str] | None = None) -> Manifest:
    """Build a manifest for ``examples`` with the given profiles (explicit id lists).

    Refuses duplicate ids, ids a profile names that do not exist, an empty train or test split,
    and a profile whose train and
    test overlap unless the profile's note says it is intended (e.g. Lockpicking's ``paper``)."""
    ids = [ex.id for ex in examples]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise DataError(f"{task}: duplicate example ids {dupes}")
    known = set(ids)
    notes = dict(notes or {})
    for pname, splits in profiles.items():
        for split, split_ids in splits.items():
            unknown = [i for i in split_ids if i not in known]
            if unknown:
                raise DataError(f"{task}: profile {pname!r} split {split!r} names unknown ids {unknown[:5]}")
            if len(set(split_ids)) != len(split_ids):
                raise DataError(f"{task}: profile {pname!r} split {split!r} repeats ids")
        empty = [split for split in ("train", "test") if not splits.get(split)]
        if empty:
            # val may be empty (SEPO-style profiles have none); train and test may not
            raise DataError(f"{task}: profile {pname!r} has an empty {' and '.join(empty)} split")
        overlap = set(splits.get("train", ())) & set(splits.get("test", ()))
        if overlap and "train = test" not in notes.get(pname, ""):
            raise DataError(f"{task}: profile {pname!r} has {len(overlap)} ids in both train and test")
    src = asdict(source) if isinstance(source, Source) else dict(source)
    src["mirror_files"] = [
        {"path": p, "sha256": (mirror_sha256 or {}).get(p)} for p in src.get("mirror_files", ())
    ]
    return Manifest(
        task=task, version=version, source=src,
        hashes={ex.id: ex.content_hash() for ex in examples},
        fields={ex.id: {k: v[:16] for k, v in field_hashes(ex).items()} for ex in examples},
        profiles={p: {s: list(v) for s, v in splits.items()} for p, splits in profiles.items()},
        notes=notes,
        profile_digests={p: profile_digest(task, p, splits) for p, splits in profiles.items()},
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


__all__ = ["Manifest", "DriftReport", "DriftError", "freeze", "manifest_holding", "task_manifests", "file_sha256",
           "profile_digest", "MANIFEST_DIR", "SPLITS",
           "HeldoutError"]
