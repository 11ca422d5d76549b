"""Verifying task data against manifests and freezing new profiles (the logic behind ``heldout data
verify`` and ``heldout data freeze``; the commands themselves live in :mod:`heldout.cli`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from heldout.contracts import DataError, Example, HeldoutError, Source
from heldout.files import check_name
from heldout.benchmarks.loading import resolve_data_dir
from heldout.benchmarks.registry import all_tasks, get_benchmark
from heldout.benchmarks.user_jsonl import ANSWER_FORMATS, read_user_examples
from heldout.data_manifests import MANIFEST_DIR, Manifest, freeze
from heldout.data_manifests.profiles import default_profile, group_disjoint_profile, sized_profile


def verify_one(name: str, data_dir: str | None) -> dict[str, Any]:
    """Check every example a task's manifest freezes (all profiles) against the data."""
    row: dict[str, Any] = {"task": name, "ok": False, "examples": 0, "profiles": [], "problem": None}
    try:
        bench = get_benchmark(name)
        manifest = Manifest.load(name)
        row["profiles"] = sorted(manifest.profiles)
        examples = bench.load_raw(None if bench.source.embedded else data_dir)
        report = manifest.verify(examples, ids=list(manifest.hashes))
        row["examples"] = report.checked
        row["ok"] = report.clean
        if not report.clean:
            row["problem"] = report.describe()
            row["drift"] = report.to_dict()
    except HeldoutError as exc:
        row["problem"] = str(exc)
    return row


def select(names: list[str]) -> list[str]:
    every = [b.name for b in all_tasks()]
    if not names:
        return every
    chosen = [n for n in every if any(n == p or n.startswith(p.rstrip("/") + "/") for p in names)]
    unknown = [p for p in names if not any(n == p or n.startswith(p.rstrip("/") + "/") for n in every)]
    if unknown:
        raise DataError(f"unknown task or family: {', '.join(unknown)}")
    return chosen


def verify_tasks(names: list[str], data_dir: str | None) -> list[dict[str, Any]]:
    """One row per selected task: ok, examples checked, profiles, the problem when not ok."""
    resolved = resolve_data_dir(data_dir)
    return [verify_one(n, resolved) for n in select(names)]


def freeze_profile(task: str, profile_name: str, *, out: str | None = None, jsonl: str | None = None,
                   data_dir: str | None = None, sizes: str | None = None, by_group: bool = False,
                   seed: int = 0, answer_format: str = "span") -> tuple[Path, dict[str, int]]:
    """Add (or create) a profile in a manifest; returns the manifest path and the split sizes.
    Existing hashes are never rewritten: data that drifted from an existing manifest is refused.
    With ``jsonl`` the file is copied next to the manifest and becomes a :class:`UserJsonlTask`
    (``out`` is then required: user manifests never go into heldout's own folder)."""
    check_name(profile_name, "profile name", error=DataError)  # it is a key of a file other runs read
    root = Path(out) if out else MANIFEST_DIR
    data_file = None
    if jsonl:
        if not out:
            raise DataError("freezing your own JSONL needs --out DIR (then put DIR on $HELDOUT_MANIFEST_PATH)")
        if answer_format not in ANSWER_FORMATS:
            raise DataError(f"--answer-format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}")
        examples = read_user_examples(jsonl)
        data_file = Manifest.path_for(task, root).with_suffix(".jsonl")
        if data_file.exists() and data_file.read_bytes() != Path(jsonl).read_bytes():
            raise DataError(f"{data_file} already holds other data for {task!r}; refusing to overwrite it")
        source: Source | dict = {"kind": "jsonl", "file": data_file.name, "answer_format": answer_format,
                                 "user_file": Path(jsonl).name}
        version = "user"
    else:
        bench = get_benchmark(task)
        examples = bench.load_raw(None if bench.source.embedded else resolve_data_dir(data_dir))
        source, version = bench.source, bench.version
    ids = [ex.id for ex in examples]
    if by_group:
        profile = group_disjoint_profile(task, examples, salt=f"{profile_name}|{seed}")
        note = f"topic-disjoint, hash order salted with {profile_name}|{seed}"
    elif sizes:
        try:
            train, val, test = (int(x) for x in sizes.split("/"))
        except ValueError:
            raise DataError(f"--sizes must look like 100/50/200, got {sizes!r}") from None
        profile = sized_profile(task, ids, train, val, test, salt=f"{profile_name}|{seed}")
        note = f"sizes {sizes}, hash order salted with {profile_name}|{seed}"
    else:
        profile, note = default_profile(task, ids), "default rule: 20/20/60 hash order"
    path = Manifest.path_for(task, root)
    if path.exists():
        manifest = Manifest.load(task, root)
        report = manifest.verify(examples, ids=list(manifest.hashes))
        if not report.clean:
            raise DataError("refusing to add a profile to a manifest whose data drifted:\n" + report.describe())
        manifest.profiles[profile_name] = profile
        manifest.notes[profile_name] = note
    else:
        manifest = freeze(task, version, source, examples, {profile_name: profile}, {profile_name: note})
    if data_file is not None:  # the data is copied only once the profile is known to be good
        data_file.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(jsonl, data_file)
    saved = manifest.save(root)
    return saved, {k: len(v) for k, v in profile.items()}
