"""Split profiles never have an empty split the rule was asked to fill, and the shipped manifests
are exactly what the build script draws."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heldout.benchmarks.manifest_build import build
from heldout.contracts import DataError, Example
from heldout.data_manifests import MANIFEST_DIR, freeze
from heldout.data_manifests.profiles import group_disjoint_profile, sized_profile


def examples(groups: dict[str, int]) -> list[Example]:
    return [Example(f"{g}-{i}", {"q": f"{g}{i}"}, "a", group=g) for g, n in groups.items() for i in range(n)]


def test_freezing_a_profile_with_an_empty_test_split_is_an_error():
    exs = examples({"a": 5})
    with pytest.raises(DataError, match="empty test split"):
        freeze("demo/x", "1", {"mirror_files": ()}, exs, {"p": {"train": [e.id for e in exs], "val": [], "test": []}})


def test_a_sized_profile_whose_test_comes_out_empty_is_an_error():
    with pytest.raises(DataError, match="test split"):
        sized_profile("demo/x", [str(i) for i in range(10)], 6, 4, None)


def test_topic_disjoint_with_one_dominant_topic_still_fills_every_split():
    # the shape of MMLU-Pro law: one topic holds 90% of the examples
    profile = group_disjoint_profile("mmlu_pro/law", examples({"professional": 1003, "international": 55,
                                                               "jurisprudence": 43}))
    assert all(profile[s] for s in ("train", "val", "test"))
    groups = {s: {i.split("-")[0] for i in ids} for s, ids in profile.items()}
    assert not (groups["train"] & groups["test"]) and not (groups["val"] & groups["test"])


def test_topic_disjoint_with_fewer_topics_than_splits_is_an_error():
    with pytest.raises(DataError, match="empty"):
        group_disjoint_profile("demo/x", examples({"a": 10, "b": 10}))


def test_no_shipped_profile_has_an_empty_train_or_test_split():
    for path in sorted(MANIFEST_DIR.rglob("*.json")):
        manifest = json.loads(path.read_text())
        for name, splits in manifest["profiles"].items():
            assert splits.get("train") and splits.get("test"), f"{path.relative_to(MANIFEST_DIR)} {name}"
            if name == "topic-disjoint":
                assert splits.get("val"), f"{path.relative_to(MANIFEST_DIR)} topic-disjoint has no val"


def test_the_build_script_reproduces_the_shipped_mmlu_pro_and_hotpotqa_manifests(data_dir, tmp_path):
    written = build(str(data_dir), ["mmlu_pro/", "hotpotqa/"], root=tmp_path)
    assert written
    for path in map(Path, written):
        shipped = MANIFEST_DIR / path.relative_to(tmp_path)
        assert path.read_bytes() == shipped.read_bytes(), f"{shipped} differs from what the build draws"
