"""``heldout data verify`` and ``heldout data freeze``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from heldout.benchmarks.base import DataError, Example, HeldoutError, Source
from heldout.benchmarks.loading import resolve_data_dir
from heldout.benchmarks.registry import all_tasks, get_benchmark
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


def verify_tasks(names: list[str], data_dir: str | None, as_json: bool = False) -> int:
    resolved = resolve_data_dir(data_dir)
    rows = [verify_one(n, resolved) for n in select(names)]
    if as_json:
        print(json.dumps(rows))
    else:
        print(f"{'task':<48} {'status':<8} {'examples':>8}  profiles")
        for r in rows:
            print(f"{r['task']:<48} {'ok' if r['ok'] else 'FAILED':<8} {r['examples']:>8}  {','.join(r['profiles'])}")
            if r["problem"]:
                print("    " + r["problem"].replace("\n", "\n    "))
        bad = sum(not r["ok"] for r in rows)
        print(f"{len(rows) - bad} of {len(rows)} manifests verify" + (f"; {bad} FAILED" if bad else ""))
    return 0 if all(r["ok"] for r in rows) else 1


def read_user_examples(path: str) -> list[Example]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.append(Example(id=str(row["id"]), input=row["input"], target=row.get("target"),
                                   group=row.get("group"), meta=row.get("meta") or {}))
            except (ValueError, KeyError, TypeError) as exc:
                raise DataError(f"{path} line {lineno}: need a JSON object with id, input, target: {exc}") from exc
    return out


def freeze_command(args: argparse.Namespace) -> int:
    """Add (or create) a profile in a manifest. Existing hashes are never rewritten: data that
    drifted from an existing manifest is refused."""
    root = Path(args.out) if args.out else MANIFEST_DIR
    if args.jsonl:
        examples = read_user_examples(args.jsonl)
        source: Source | dict = {"mirror_files": (), "user_file": Path(args.jsonl).name}
        version = "user"
    else:
        bench = get_benchmark(args.task)
        examples = bench.load_raw(None if bench.source.embedded else resolve_data_dir(args.data_dir))
        source, version = bench.source, bench.version
    ids = [ex.id for ex in examples]
    if args.by_group:
        profile = group_disjoint_profile(args.task, examples, salt=f"{args.profile}|{args.seed}")
        note = f"topic-disjoint, hash order salted with {args.profile}|{args.seed}"
    elif args.sizes:
        try:
            train, val, test = (int(x) for x in args.sizes.split("/"))
        except ValueError:
            raise DataError(f"--sizes must look like 100/50/200, got {args.sizes!r}") from None
        profile = sized_profile(args.task, ids, train, val, test, salt=f"{args.profile}|{args.seed}")
        note = f"sizes {args.sizes}, hash order salted with {args.profile}|{args.seed}"
    else:
        profile, note = default_profile(args.task, ids), "default rule: 20/20/60 hash order"
    path = Manifest.path_for(args.task, root)
    if path.exists():
        manifest = Manifest.load(args.task, root)
        report = manifest.verify(examples, ids=list(manifest.hashes))
        if not report.clean:
            raise DataError("refusing to add a profile to a manifest whose data drifted:\n" + report.describe())
        manifest.profiles[args.profile] = profile
        manifest.notes[args.profile] = note
    else:
        manifest = freeze(args.task, version, source, examples, {args.profile: profile}, {args.profile: note})
    saved = manifest.save(root)
    sizes = {k: len(v) for k, v in profile.items()}
    print(f"froze profile {args.profile!r} of {args.task} ({sizes}) in {saved}")
    return 0
