"""Topic-disjoint splits: drawn test first, frozen into user manifests, proven disjoint, scanned
for paraphrase leaks; the shipped topic-disjoint profiles pass the proof on the real data."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import heldout
from heldout import cli
from heldout.data_manifests import MANIFEST_PATH_ENV
from heldout.contracts import DataError, Example
from heldout.data_manifests import Manifest
from heldout.data_manifests.profiles import group_sample_profile
from heldout.protocols.splits import (PROBE, SplitSizes, build_split, check_profile, check_split, group_split,
                                      near_duplicates)

import synthetic_code_words as synthetic

REPO_ROOT = Path(__file__).resolve().parents[1]


# -- the draw, by properties ------------------------------------------------------------------------
def grouped_examples(group_sizes: list[int], ungrouped: int = 0) -> list[Example]:
    out = [Example(id=f"g{g}-{k}", input={"question": f"q {g} {k}"}, target="a", group=f"g{g}")
           for g, n in enumerate(group_sizes) for k in range(n)]
    return out + [Example(id=f"solo{k}", input={"question": "q"}, target="a") for k in range(ungrouped)]


draws = st.fixed_dictionaries({
    "groups": st.lists(st.integers(1, 9), min_size=1, max_size=30),
    "ungrouped": st.integers(0, 4),
    "sizes": st.tuples(st.integers(0, 60), st.integers(0, 60), st.integers(0, 60)),
    "probe": st.integers(0, 3),
    "salt": st.text(max_size=6),
})


def kept_in_train(n: int, probe: int) -> int:
    return n - min(probe, n - 1)


@settings(max_examples=300, deadline=None)
@given(draws)
def test_group_split_invariants(draw):
    examples = grouped_examples(draw["groups"], draw["ungrouped"])
    sizes, probe = SplitSizes(*draw["sizes"]), draw["probe"]
    split = group_split("t", examples, sizes, probe, salt=draw["salt"])
    group_of = {ex.id: ex.group or f"__id__{ex.id}" for ex in examples}
    members = {}
    for ex in examples:
        members.setdefault(group_of[ex.id], []).append(ex.id)
    every = [i for ids in split.values() for i in ids]
    assert len(every) == len(set(every)) and set(every) <= set(group_of)  # each id once, only real ids
    groups = {pool: {group_of[i] for i in ids} for pool, ids in split.items()}
    assert not groups["train"] & groups["val"] and not groups["train"] & groups["test"] \
        and not groups["val"] & groups["test"]
    assert groups.get(PROBE, set()) <= groups["train"]
    for pool in ("val", "test"):  # whole groups
        assert all(set(members[g]) <= set(split[pool]) for g in groups[pool])
    for g in groups["train"]:  # a train group keeps all but min(probe, n-1) items, which go to the probe
        n = len(members[g])
        in_probe = [i for i in split.get(PROBE, []) if group_of[i] == g]
        assert len(in_probe) == min(probe, n - 1)
        assert set(members[g]) == set(in_probe) | {i for i in split["train"] if group_of[i] == g}
    assert (PROBE in split) == (probe > 0)
    # fill rule: overshoot below half of the largest group; undershoot only when no group left fits
    taken: set[str] = set()
    for pool in ("test", "val", "train"):
        goal = sizes.target(pool)
        count = len(split[pool])
        kept = {g: kept_in_train(len(m), probe) if pool == "train" else len(m) for g, m in members.items()}
        if count > goal:
            assert 2 * (count - goal) < max(kept[g] for g in groups[pool])
        taken |= groups[pool]
        for g in set(members) - taken:
            assert kept[g] >= 2 * (goal - count)
    # test first: the held-out split depends on its own target only
    other = group_split("t", examples, SplitSizes(sizes.train + 7, max(0, sizes.val - 3), sizes.test), probe,
                        salt=draw["salt"])
    assert other["test"] == split["test"]
    assert group_split("t", examples, sizes, probe, salt=draw["salt"]) == split  # deterministic


def test_sizes_parse_refuses_nonsense():
    assert SplitSizes.parse("10/0/30") == SplitSizes(10, 0, 30)
    for bad in ("10/20", "a/b/c", "10/-1/3"):
        with pytest.raises(DataError, match="sizes"):
            SplitSizes.parse(bad)


# -- building a user manifest -------------------------------------------------------------------------
TASK = "user/code_words_splits"


@pytest.fixture(scope="module")
def frozen_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("frozen") / "manifests"
    synthetic.freeze_task(TASK, root)
    return root


@pytest.fixture
def manifest_dir(frozen_task, tmp_path, monkeypatch):
    """A user manifest root on the search path holding the synthetic task (frozen once as a user
    JSONL task); each test gets its own copy."""
    root = tmp_path / "manifests"
    shutil.copytree(frozen_task, root)
    monkeypatch.setenv(MANIFEST_PATH_ENV, str(root))
    return root


def test_built_profile_is_frozen_hashed_and_loads_by_name(manifest_dir):
    built = build_split(TASK, "td-probe", SplitSizes(32, 24, 48), probe=2, seed=3)
    assert Path(built.path) == manifest_dir / "user" / "code_words_splits.json"
    assert built.sizes == {"train": 32, "val": 24, "test": 48, PROBE: 16}
    assert built.groups == {"train": 8, "val": 4, "test": 8, PROBE: 8}
    manifest = Manifest.load(TASK, manifest_dir)
    assert len(manifest.hashes) == synthetic.FAMILIES * synthetic.PER_FAMILY
    assert "test first" in manifest.notes["td-probe"]
    task = heldout.load_task(TASK, "td-probe")  # found through $HELDOUT_MANIFEST_PATH
    assert task.sizes() == built.sizes
    check = check_profile(task)
    assert check.ok and not check.group_overlaps
    # the only look-alikes are a family's template shared by its train and probe items (by design)
    assert check.near_duplicates and all({d.a_pool, d.b_pool} == {"train", PROBE} for d in check.near_duplicates)
    # rebuilding the same draw is a no-op; a different draw under the same name is refused
    assert build_split(TASK, "td-probe", SplitSizes(32, 24, 48), probe=2, seed=3).sizes == built.sizes
    with pytest.raises(DataError, match="already holds a different profile"):
        build_split(TASK, "td-probe", SplitSizes(32, 24, 48), probe=2, seed=4)


def test_cli_build_then_check_exits_zero(manifest_dir, capsys):
    assert cli.main(["split", "build", "--task", TASK, "--by", "group", "--sizes", "24/12/36",
                     "--probe", "1", "--seed", "0", "--name", "cli", "--out", str(manifest_dir)]) == 0
    assert "froze profile 'cli'" in capsys.readouterr().out
    assert cli.main(["split", "check", "--task", TASK, "--profile", "cli", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["pools"]["test"]["groups"] == 6
    # a train family keeps 5 of its 6 items: 5 families (25 items) come closest to the target 24
    assert report["pools"]["train"] == {"examples": 25, "groups": 5, "ungrouped": 0}
    assert report["pools"][PROBE]["examples"] == 5


def test_build_refuses_tasks_without_topics_and_shipped_names(manifest_dir, data_dir):
    with pytest.raises(DataError, match="no topic groups .*BBH"):
        build_split("bbh/word_sorting", "x", SplitSizes(10, 10, 10), data_dir=str(data_dir))
    with pytest.raises(DataError, match="already ships a profile 'topic-disjoint'"):
        build_split("hotpotqa/distractor", "topic-disjoint", SplitSizes(10, 10, 10), data_dir=str(data_dir))


def test_build_without_a_destination_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.delenv(MANIFEST_PATH_ENV, raising=False)
    assert cli.main(["split", "build", "--task", TASK, "--sizes", "6/6/6", "--name", "x"]) == 2
    assert "say where the user manifest goes: --out DIR or $HELDOUT_MANIFEST_PATH" in capsys.readouterr().err


def test_check_refutes_a_profile_whose_groups_span_splits(manifest_dir, capsys):
    build_split(TASK, "clean", SplitSizes(24, 12, 24), seed=1)
    manifest = Manifest.load(TASK, manifest_dir)
    bad = {k: list(v) for k, v in manifest.profiles["clean"].items()}
    leaked = bad["test"][0]  # one test item moved into train: its family now spans train and test
    bad["train"].append(leaked)
    bad["test"].remove(leaked)
    manifest.profiles["leaky"] = bad
    manifest.save(manifest_dir)
    assert cli.main(["split", "check", "--task", TASK, "--profile", "leaky"]) == 1
    out = capsys.readouterr().out
    assert "NOT PROVEN" in out and "1 group(s) span two splits" in out and leaked.split("-")[0] in out


# -- near-duplicates ---------------------------------------------------------------------------------
def paraphrase(question: str) -> str:
    """A light rewording (a word dropped, one swapped, punctuation and case changed): the kind of
    leak a topic-disjoint split cannot see because the paraphrase may carry a different topic key."""
    tokens = question.rstrip("?").split()
    tokens = tokens[:1] + tokens[2:]
    tokens[-1] = tokens[-1].upper()
    return " ".join(tokens) + " ?"


@pytest.fixture(scope="module")
def hotpot(data_dir):
    return heldout.load_task("hotpotqa/distractor", "topic-disjoint", data_dir=data_dir)


def test_near_duplicate_scan_finds_planted_paraphrases_across_splits(hotpot):
    clean = {p: list(v) for p, v in hotpot.splits.items()}
    assert [d for d in near_duplicates(clean)[0] if d.field == "question"] == []
    planted = []
    for ex in clean["train"][:4]:
        copy = replace(ex, id=f"para-{ex.id}", input={**ex.input, "question": paraphrase(ex.input["question"])},
                       group=f"another topic {ex.id}")
        planted.append((ex.id, copy.id))
        clean["test"].append(copy)
    found = {(d.a, d.b) for d in near_duplicates(clean)[0] if d.field == "question"}
    assert found == set(planted)


def test_near_duplicate_scan_ignores_pairs_within_one_pool_and_short_answers():
    a = Example("a", {"question": "Which river flows through the old town of Prague in spring?"}, "yes")
    b = replace(a, id="b")
    c = Example("c", {"question": "Name the composer of the opera Rusalka"}, "yes")
    pairs, skipped = near_duplicates({"train": [a, b], "test": [c]})
    assert pairs == [] and skipped["answers_too_short"] == 3
    pairs, _ = near_duplicates({"train": [a], "test": [b]})
    assert [(p.field, p.similarity) for p in pairs] == [("question", 1.0)]


# -- the shipped profiles on the real data --------------------------------------------------------------
MMLU_CATEGORIES = ["biology", "business", "chemistry", "computer_science", "economics", "engineering", "health",
                   "history", "math", "other", "philosophy", "physics", "psychology"]


@pytest.mark.parametrize("task", ["hotpotqa/distractor"] + [f"mmlu_pro/{c}" for c in MMLU_CATEGORIES])
def test_shipped_topic_disjoint_profiles_are_proven_disjoint(task, data_dir, capsys):
    assert cli.main(["split", "check", "--task", task, "--profile", "topic-disjoint",
                     "--data-dir", str(data_dir)]) == 0
    assert "PROVEN (zero group overlap" in capsys.readouterr().out


def test_the_cpu_demo_profile_of_mmlu_pro_business_is_a_reproducible_topic_disjoint_draw(data_dir):
    """One source group per pool (MMLU-Pro's groups are too large for whole-group splits of 16
    questions); test_manifest_profiles checks the shipped file is what the build script draws."""
    task = heldout.load_task("mmlu_pro/business", "cpu-demo", data_dir=str(data_dir))
    check = check_split("mmlu_pro/business", "cpu-demo", data_dir=str(data_dir))
    assert check.ok
    assert task.sizes() == {"train": 16, "val": 12, "test": 24, PROBE: 8, "fewshot": 5}
    pools = {pool: {ex.group for ex in task.split(pool)} for pool in ("train", "val", "test", PROBE)}
    assert all(len(groups) == 1 for groups in pools.values()) and pools[PROBE] == pools["train"]
    assert len(pools["train"] | pools["val"] | pools["test"]) == 3


def test_a_group_sample_profile_refuses_when_no_group_is_large_enough():
    examples = [Example(id=f"e{i}", input={"question": "q"}, target="a", group=f"g{i % 4}") for i in range(12)]
    with pytest.raises(DataError, match="no free group holds the 5 items test needs"):
        group_sample_profile("t", examples, 1, 1, 5)


def test_shipped_law_profile_is_proven_disjoint(data_dir):
    # redrawn by issue 12: one src family holds most items, and every split still gets a family
    assert check_split("mmlu_pro/law", "topic-disjoint", data_dir=str(data_dir)).ok


def test_split_check_entry_point_exits_zero_on_hotpotqa(warm_cli, data_dir):
    proc = warm_cli.run("split", "check", "--task", "hotpotqa/distractor", "--profile", "topic-disjoint", "--data-dir",
                        str(data_dir), "--json", cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["pools"]["test"]["groups"] == 178 and report["group_overlaps"] == []


def test_a_user_profile_for_a_shipped_task_adds_to_it_without_hiding_the_shipped_ones(data_dir, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setenv(MANIFEST_PATH_ENV, str(tmp_path))
    built = build_split("mmlu_pro/economics", "td-probe", SplitSizes(200, 150, 400), probe=20,
                        data_dir=str(data_dir))
    assert built.sizes[PROBE] == 20 and built.groups[PROBE] == 1
    mine = heldout.load_task("mmlu_pro/economics", "td-probe", data_dir=data_dir)
    shipped = heldout.load_task("mmlu_pro/economics", "topic-disjoint", data_dir=data_dir)
    assert [ex.id for ex in mine.split("fewshot")] == [ex.id for ex in shipped.split("fewshot")]  # carried over
    assert Manifest.load("mmlu_pro/economics", tmp_path).hashes == shipped.manifest.hashes  # the same freeze
    assert check_profile(mine).ok


def test_tasks_without_topics_say_so(data_dir):
    check = check_split("gsm_hard", "sepo", data_dir=str(data_dir))
    assert check.ok and check.group_key is None
    assert any("no topic key" in note for note in check.notes) and "no topic groups" in check.describe()
