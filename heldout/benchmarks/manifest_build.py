"""How the shipped dataset manifests were built (re-runnable, for review):

    python -m heldout.benchmarks.manifest_build --data-dir ../shared/data [TASK_PREFIX...]

Profiles (all drawn in hash order, see :mod:`heldout.data_manifests.profiles`):

* ``default`` (every task): 20% train / 20% val / 60% test.
* ``sepo`` (the SEPO paper's sizes): every BBH task train 50 / test the rest up to 200;
  MMLU-Pro computer_science, economics, psychology train 100 / test 200; MBPP+ train 100 /
  val 50 / test 228; GSM-Hard train 200 / test 400; HotpotQA (only 302 real items offline)
  train 100 / test 200.
* ``topic-disjoint`` (HotpotQA, MMLU-Pro): no group (gold-title pair / source subject) spans
  two splits; 20/20/60 by examples.
* ``cpu-demo`` (MMLU-Pro business, for ``heldout demo --protocol``): train 16 / val 12 / test
  24 plus 8 probe questions, one source group per pool (``group_sample_profile``: whole groups are
  too large for a split this small), topic-disjoint.
* MMLU-Pro profiles also carry a ``fewshot`` pool: the category's validation rows.

Re-running on unchanged data reproduces the shipped files byte for byte."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from heldout.contracts import Example
from heldout.benchmarks.loading import resolve_data_dir
from heldout.benchmarks.registry import all_tasks
from heldout.data_manifests import Manifest, file_sha256, freeze
from heldout.data_manifests.profiles import default_profile, group_disjoint_profile, group_sample_profile, sized_profile

SEPO_SIZES: dict[str, tuple[int, int, int | None]] = {
    "mmlu_pro/computer_science": (100, 0, 200),
    "mmlu_pro/economics": (100, 0, 200),
    "mmlu_pro/psychology": (100, 0, 200),
    "mbpp_plus": (100, 50, 228),
    "gsm_hard": (200, 0, 400),
    "hotpotqa/distractor": (100, 0, 200),
}
BBH_SEPO = (50, 0, 200)
CPU_DEMO_SIZES: dict[str, tuple[int, int, int, int]] = {"mmlu_pro/business": (16, 12, 24, 8)}  # + probe


def profiles_for(task: str, examples: list[Example]) -> tuple[dict, dict]:
    fewshot = [ex.id for ex in examples if ex.meta.get("source_split") == "validation"]
    pool = [ex for ex in examples if ex.id not in set(fewshot)]
    ids = [ex.id for ex in pool]
    profiles: dict[str, dict[str, list[str]]] = {"default": default_profile(task, ids)}
    notes = {"default": "hash order (sha256 of task|default|id): 20% train, 20% val, rest test"}
    sizes = BBH_SEPO if task.startswith("bbh/") else SEPO_SIZES.get(task)
    if sizes:
        profiles["sepo"] = sized_profile(task, ids, *sizes, salt="sepo")
        notes["sepo"] = f"SEPO sizes train {sizes[0]} / val {sizes[1]} / test up to {sizes[2]}, hash order"
    if task.startswith(("hotpotqa/", "mmlu_pro/")):
        profiles["topic-disjoint"] = group_disjoint_profile(task, pool)
        notes["topic-disjoint"] = "whole groups per split, groups in hash order, 20/20/60 by examples"
    if task in CPU_DEMO_SIZES:
        train, val, test, probe = CPU_DEMO_SIZES[task]
        profiles["cpu-demo"] = group_sample_profile(task, pool, train, val, test, probe, salt="cpu-demo|0")
        notes["cpu-demo"] = (f"sizes {train}/{val}/{test} + {probe} probe: one source group per pool (test, then val, "
                             "then train, each the first free group in hash order salted cpu-demo|0 with enough "
                             "items), items in hash order")
    if fewshot:
        for prof in profiles.values():
            prof["fewshot"] = fewshot
    return profiles, notes


def build(data_dir: str, prefixes: list[str], root: Path | None = None) -> list[str]:
    """Rebuild the manifests of the prompt tasks matching ``prefixes`` (all when empty) into
    ``root`` (default: the shipped manifest folder)."""
    written = []
    for bench in all_tasks():
        if bench.source.embedded or bench.kind != "prompt":
            continue
        if prefixes and not any(bench.name.startswith(p) for p in prefixes):
            continue
        examples = bench.load_raw(data_dir)
        profiles, notes = profiles_for(bench.name, examples)
        shas = {p: file_sha256(Path(data_dir) / p) for p in bench.source.mirror_files}
        manifest = freeze(bench.name, bench.version, bench.source, examples, profiles, notes, shas)
        written.append(str(manifest.save(root)))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*")
    parser.add_argument("--data-dir", required=True)
    args = parser.parse_args(argv)
    for path in build(resolve_data_dir(args.data_dir), args.prefixes):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
