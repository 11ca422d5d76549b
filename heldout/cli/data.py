"""The tasks and their data: ``heldout tasks list``, ``heldout data verify`` and ``data freeze``
(manifests), ``heldout split build`` and ``split check`` (topic-disjoint split profiles)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from heldout.cli.shared import add_data_dir, add_json, print_json
from heldout.contracts import HeldoutError, MetricSpec

# Start-up time: each command imports its modules when it runs, and an `_arguments` function the
# modules its choices come from, so the parser loads none of them (heldout/cli/__init__.py).


def tasks_list_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--groups", action="store_true", help="with --json: print the task groups instead")
    add_json(p)


def cmd_tasks_list(args: argparse.Namespace) -> int:
    from heldout.benchmarks.registry import all_tasks, task_groups
    from heldout.data_manifests import task_manifests
    rows = []
    metrics: dict[str, str] = {}  # task -> its metric and direction, as the table shows them
    groups = task_groups()
    for bench in all_tasks():
        try:  # every profile a study may name: a user manifest's, and the shipped ones it does not repeat
            profiles = {}
            for manifest in task_manifests(bench.name):
                profiles.update({p: manifest.sizes(p) for p in manifest.profiles if p not in profiles})
        except HeldoutError as exc:
            profiles = {"error": str(exc)}
        metric = MetricSpec.of(getattr(bench, "metric", "score"))
        metrics[bench.name] = f"{metric.name} ({metric.direction})"
        rows.append({**bench.describe(), "higher_is_better": metric.higher_is_better, "profiles": profiles,
                     "groups": [name for name, members in groups.items() if bench.name in members]})
    if args.json:
        print_json(rows if not args.groups else groups)
        return 0
    print(f"{'task':<48} {'kind':<8} {'metric (direction)':<34} profiles (train/val/test)")
    for row in rows:
        profs = "  ".join(
            f"{p}:{'/'.join(str(s.get(k, 0)) for k in ('train', 'val', 'test'))}"
            for p, s in row["profiles"].items() if isinstance(s, dict)
        )
        print(f"{row['name']:<48} {row['kind']:<8} {metrics[row['name']]:<34} {profs}")
    print(f"{len(rows)} tasks")
    print("\ngroups (--task GROUP, or a glob such as 'mmlu_pro/*'):")
    for name, members in groups.items():
        print(f"  {name:<18} {len(members):>3} task(s)")
    return 0


def data_verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("tasks", nargs="*", help="task names or family prefixes (default: all)")
    add_data_dir(p)
    add_json(p)


def cmd_data_verify(args: argparse.Namespace) -> int:
    from heldout.benchmarks.manifest_tools import verify_tasks
    rows = verify_tasks(args.tasks, data_dir=args.data_dir)
    if args.json:
        print_json(rows)
    else:
        print(f"{'task':<48} {'status':<8} {'examples':>8}  profiles")
        for r in rows:
            print(f"{r['task']:<48} {'ok' if r['ok'] else 'FAILED':<8} {r['examples']:>8}  {','.join(r['profiles'])}")
            if r["problem"]:
                print("    " + r["problem"].replace("\n", "\n    "))
        bad = sum(not r["ok"] for r in rows)
        print(f"{len(rows) - bad} of {len(rows)} manifests verify" + (f"; {bad} FAILED" if bad else ""))
    return 0 if all(r["ok"] for r in rows) else 1


def data_freeze_arguments(p: argparse.ArgumentParser) -> None:
    from heldout.benchmarks.user_jsonl import ANSWER_FORMATS
    p.add_argument("--task", required=True, help="task name (registered, or new with --jsonl)")
    p.add_argument("--jsonl", default=None, help="your own examples: JSON lines with id, input, target[, group]")
    p.add_argument("--answer-format", choices=ANSWER_FORMATS, default="span",
                   help="how answers to your JSONL questions are scored (with --jsonl)")
    p.add_argument("--profile", required=True, help="name of the split profile to write")
    p.add_argument("--sizes", default=None, help="train/val/test sizes, e.g. 100/50/200 (seeded shuffle)")
    p.add_argument("--seed", type=int, default=0, help="salt of the hash order the profile is drawn in")
    p.add_argument("--by-group", action="store_true", help="topic-disjoint: no group spans two splits")
    add_data_dir(p)
    p.add_argument("--out", default=None, help="manifest root (default: heldout/data_manifests)")


def cmd_data_freeze(args: argparse.Namespace) -> int:
    from heldout.benchmarks.manifest_tools import freeze_profile
    saved, sizes = freeze_profile(args.task, args.profile, out=args.out, jsonl=args.jsonl,
                                  data_dir=args.data_dir, sizes=args.sizes, by_group=args.by_group,
                                  seed=args.seed, answer_format=args.answer_format)
    print(f"froze profile {args.profile!r} of {args.task} ({sizes}) in {saved}")
    return 0


def split_build_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, help="the task whose examples are split")
    p.add_argument("--by", choices=("group",), default="group", help="the unit kept whole (topic groups)")
    p.add_argument("--sizes", required=True, help="target examples TRAIN/VAL/TEST, e.g. 60/40/120")
    p.add_argument("--probe", type=int, default=0, help="fresh items per train group for shared_topic_probe")
    p.add_argument("--seed", type=int, default=0, help="seed of the group shuffle (the split is a function of it)")
    p.add_argument("--name", required=True, help="the new profile's name")
    p.add_argument("--out", default=None, help="user manifest root (default: first dir of $HELDOUT_MANIFEST_PATH)")
    add_data_dir(p)
    add_json(p)


def cmd_split_build(args: argparse.Namespace) -> int:
    from heldout.protocols.splits import SplitSizes, build_split
    built = build_split(args.task, args.name, SplitSizes.parse(args.sizes), probe=args.probe, seed=args.seed,
                        out=args.out, data_dir=args.data_dir)
    if args.json:
        print_json(asdict(built))
    else:
        print(f"froze profile {built.profile!r} of {built.task} in {built.path}")
        for pool, n in built.sizes.items():
            print(f"  {pool:<20} {n:>6} examples  {built.groups[pool]:>5} groups")
        print(f"load it with --profile {built.profile} and $HELDOUT_MANIFEST_PATH including {Path(built.path).parents[len(Path(built.task).parts) - 1]}")
    return 0


def split_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, help="the task whose profile is checked")
    p.add_argument("--profile", required=True, help="the split profile to check")
    p.add_argument("--threshold", type=float, default=0.5, help="near-duplicate Jaccard threshold")
    p.add_argument("--ngram", type=int, default=2, help="word n-gram size of the near-duplicate scan")
    p.add_argument("--min-answer-words", type=int, default=3, help="answers shorter than this many words are not scanned (too common to mean a leak)")
    add_data_dir(p)
    add_json(p)


def cmd_split_check(args: argparse.Namespace) -> int:
    from heldout.protocols.splits import check_split
    check = check_split(args.task, args.profile, data_dir=args.data_dir,
                        threshold=args.threshold, ngram=args.ngram, min_answer_words=args.min_answer_words)
    if args.json:
        print_json(check.to_dict())
    else:
        print(check.describe())
    return 0 if check.ok else 1
