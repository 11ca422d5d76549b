"""The five dataset benchmarks on the real files in ../shared/data: counts, frozen manifests,
tamper and drift detection, and each example's own gold answer scoring 1.0 through its scorer."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import heldout
from heldout.benchmarks import bbh, mmlu_pro
from heldout.benchmarks.registry import all_tasks, get_benchmark
from heldout.data_manifests import DriftError, Manifest

DATASET_FAMILIES = ("bbh", "mmlu_pro", "mbpp_plus", "gsm_hard", "hotpotqa")


def dataset_tasks():
    return [b for b in all_tasks() if b.family in DATASET_FAMILIES]


def count(family_prefix: str, data_dir: Path) -> int:
    return sum(len(b.load_raw(str(data_dir))) for b in dataset_tasks() if b.name.startswith(family_prefix))


def test_registry_has_27_bbh_14_mmlu_pro_and_3_single_tasks():
    names = [b.name for b in dataset_tasks()]
    assert sum(n.startswith("bbh/") for n in names) == 27
    assert sum(n.startswith("mmlu_pro/") for n in names) == 14
    assert {"mbpp_plus", "gsm_hard", "hotpotqa/distractor"} <= set(names)
    assert "mmlu_pro/computer_science" in names


def test_counts_match_the_sources(data_dir):
    assert count("bbh/", data_dir) == 6511
    sepo = sum(len(get_benchmark(f"bbh/{t}").load_raw(str(data_dir))) for t in bbh.SEPO_TASKS)
    assert sepo == 1865
    mmlu = [ex for b in dataset_tasks() if b.family == "mmlu_pro" for ex in b.load_raw(str(data_dir))]
    assert sum(ex.meta["source_split"] == "test" for ex in mmlu) == 12032
    assert sum(ex.meta["source_split"] == "validation" for ex in mmlu) == 70
    assert count("mbpp_plus", data_dir) == 378
    assert count("gsm_hard", data_dir) == 1319
    assert count("hotpotqa/", data_dir) == 302


def test_gsm_hard_targets_are_floats_with_negatives_and_fractions(data_dir):
    targets = [ex.target for ex in get_benchmark("gsm_hard").load_raw(str(data_dir))]
    assert all(isinstance(t, float) for t in targets)
    assert sum(t != int(t) for t in targets) == 303
    assert sum(t < 0 for t in targets) == 146


def test_hotpotqa_records_carry_context_facts_and_title_pair_group(data_dir):
    examples = get_benchmark("hotpotqa/distractor").load_raw(str(data_dir))
    first = next(ex for ex in examples if ex.id == "5a7613c15542994ccc9186bf")
    assert len(first.input["context"]) == 10
    titles = sorted({t for t, _ in first.target["supporting_facts"]})
    assert first.group == " | ".join(titles)
    assert first.meta["type"] in ("bridge", "comparison")


def test_hotpotqa_hub_schema_converts_to_the_same_records(data_dir):
    from heldout.benchmarks.hotpotqa import hub_row_to_record

    original = json.loads((data_dir / "hotpotqa/hotpot_dev_distractor_v1_100.json").read_text())[0]
    hub_row = {  # the hub's parquet layout of the same record
        "id": original["_id"], "question": original["question"], "answer": original["answer"],
        "type": original["type"], "level": original["level"],
        "supporting_facts": {"title": [t for t, _ in original["supporting_facts"]],
                             "sent_id": [i for _, i in original["supporting_facts"]]},
        "context": {"title": [t for t, _ in original["context"]],
                    "sentences": [s for _, s in original["context"]]},
    }
    bench = get_benchmark("hotpotqa/distractor")
    assert bench.to_examples([hub_row_to_record(hub_row)]) == bench.to_examples([original])


@pytest.mark.parametrize("name", [b.name for b in dataset_tasks()])
def test_every_shipped_manifest_verifies(name, data_dir):
    manifest = Manifest.load(name)
    examples = get_benchmark(name).load_raw(str(data_dir))
    report = manifest.verify(examples, ids=list(manifest.hashes))
    assert report.clean, report.describe()
    assert "default" in manifest.profiles


def test_sepo_profile_sizes(data_dir):
    sizes = {n: Manifest.load(n).sizes("sepo") for n in
             ("bbh/word_sorting", "bbh/causal_judgement", "mmlu_pro/economics", "mbpp_plus", "gsm_hard")}
    assert sizes["bbh/word_sorting"] == {"train": 50, "val": 0, "test": 200}
    assert sizes["bbh/causal_judgement"] == {"train": 50, "val": 0, "test": 137}
    assert sizes["mmlu_pro/economics"] == {"train": 100, "val": 0, "test": 200, "fewshot": 5}
    assert sizes["mbpp_plus"] == {"train": 100, "val": 50, "test": 228}
    assert sizes["gsm_hard"] == {"train": 200, "val": 0, "test": 400}


def test_profiles_never_put_an_id_in_two_splits():
    for bench in dataset_tasks():
        manifest = Manifest.load(bench.name)
        for pname, splits in manifest.profiles.items():
            seen = [i for s in ("train", "val", "test") for i in splits.get(s, [])]
            assert len(seen) == len(set(seen)), (bench.name, pname)


def test_topic_disjoint_profile_keeps_groups_whole(data_dir):
    task = heldout.load_task("hotpotqa/distractor", profile="topic-disjoint", data_dir=data_dir)
    groups = {s: {ex.group for ex in task.split(s)} for s in ("train", "val", "test")}
    assert not (groups["train"] & groups["test"]) and not (groups["val"] & groups["test"])


def test_load_task_returns_verified_splits(data_dir):
    task = heldout.load_task("bbh/word_sorting", profile="sepo", data_dir=data_dir)
    assert task.sizes() == {"train": 50, "val": 0, "test": 200}
    assert task.drift is None
    assert all(ex.target == " ".join(sorted(ex.target.split())) for ex in task.split("test"))


def copy_mirror(data_dir: Path, tmp_path: Path, rel: str) -> Path:
    dst = tmp_path / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data_dir / rel, dst)
    return dst


def test_one_changed_byte_is_a_clear_error_naming_task_id_and_field(data_dir, tmp_path):
    path = copy_mirror(data_dir, tmp_path, "bbh/word_sorting.json")
    text = path.read_text()
    data = json.loads(text)
    victim = data["examples"][7]["target"]
    flipped = ("b" if victim[0] != "b" else "c") + victim[1:]
    path.write_text(text.replace(json.dumps(victim), json.dumps(flipped), 1))
    with pytest.raises(DriftError) as info:
        heldout.load_task("bbh/word_sorting", profile="default", data_dir=tmp_path)
    message = str(info.value)
    assert "bbh/word_sorting" in message and "7 (target)" in message and "--allow-drift" in message


def test_a_byte_that_breaks_the_file_format_is_a_clear_error(data_dir, tmp_path):
    path = copy_mirror(data_dir, tmp_path, "gsm_hard/gsmhardv2.jsonl")
    raw = bytearray(path.read_bytes())
    raw[0] = ord("x")  # the opening brace of the first record
    path.write_bytes(bytes(raw))
    with pytest.raises(heldout.DataError, match="gsm_hard/gsmhardv2.jsonl.*corrupt"):
        heldout.load_task("gsm_hard", data_dir=tmp_path)


def test_allow_drift_proceeds_and_records_the_drift(data_dir, tmp_path):
    path = copy_mirror(data_dir, tmp_path, "bbh/word_sorting.json")
    data = json.loads(path.read_text())
    data["examples"][0]["input"] += " zebra"
    path.write_text(json.dumps(data))
    task = heldout.load_task("bbh/word_sorting", data_dir=tmp_path, allow_drift=True)
    assert task.drift is not None and task.drift.changed == {"0": ["input.question"]}
    assert task.describe()["drift"]["changed"] == {"0": ["input.question"]}


def test_old_mmlu_pro_snapshot_is_reported_as_drift(data_dir, tmp_path):
    """The 2024 snapshot differs from the pinned revision in 205 answers (and more text)."""
    old = tmp_path / mmlu_pro.MIRROR_DIR
    old.mkdir()
    for name in ("test-00000-of-00001.parquet", "validation-00000-of-00001.parquet"):
        (old / name).symlink_to(data_dir / "mmlu_pro" / name)
    changed_answers = {"test": 0, "validation": 0}
    for bench in (b for b in dataset_tasks() if b.family == "mmlu_pro"):
        manifest = Manifest.load(bench.name)
        report = manifest.verify(bench.load_raw(str(tmp_path)), ids=list(manifest.hashes))
        for ex_id, fields in report.changed.items():
            if "target" in fields:
                changed_answers["validation" if ex_id.startswith("v") else "test"] += 1
    assert changed_answers["test"] == 205  # SOURCES.md: health 109, law 65, math 24, 7 others
    assert changed_answers["validation"] >= 1
    with pytest.raises(DriftError, match="mmlu_pro/health"):
        heldout.load_task("mmlu_pro/health", data_dir=tmp_path)


def gold_text(bench, ex) -> str:
    if bench.family == "mmlu_pro":
        return f"Let me think. Option ({ex.target}) fits best. So the answer is ({ex.target})."
    if bench.family == "hotpotqa":
        return f"Both paragraphs point the same way. So the answer is {ex.target['answer']}."
    if bench.family == "gsm_hard":
        value = ex.target
        shown = str(int(value)) if value == int(value) else repr(value)
        return f"Working through the numbers step by step. So the answer is {shown}."
    return f"Let's think step by step. So the answer is {ex.target}."


@pytest.mark.parametrize("family", ["bbh", "mmlu_pro", "gsm_hard", "hotpotqa"])
def test_every_gold_answer_written_as_a_model_would_scores_one(family, data_dir):
    failures = []
    for bench in (b for b in dataset_tasks() if b.family == family):
        for ex in bench.load_raw(str(data_dir)):
            verdict = bench.score_text(gold_text(bench, ex), ex)
            if verdict.score != 1.0 or verdict.dimensions.get("strict") != 1.0:
                failures.append((bench.name, ex.id, verdict.feedback))
    assert not failures, failures[:10]


def test_bbh_quirks_are_kept_and_marked(data_dir):
    cj = {ex.id: ex for ex in get_benchmark("bbh/causal_judgement").load_raw(str(data_dir))}
    for a, b in (("32", "119"), ("36", "104")):
        assert cj[a].input == cj[b].input and cj[a].target != cj[b].target
        assert "opposite target" in cj[a].meta["quirk"]
    movie = get_benchmark("bbh/movie_recommendation").load_raw(str(data_dir))
    assert movie[163].target == "Monsters, Inc" and "quirk" in movie[163].meta
    ruin = get_benchmark("bbh/ruin_names").load_raw(str(data_dir))
    assert {ruin[99].target, ruin[144].target} == {"dearth, wind, & fire", "rita, sue and bob poo"}


def test_mbpp_plus_renders_prompt_and_hides_tests_from_the_input(data_dir):
    bench = get_benchmark("mbpp_plus")
    ex = bench.load_raw(str(data_dir))[0]
    assert ex.id == "Mbpp/2" and set(ex.input) == {"prompt", "entry_point"}
    messages = bench.render(bench.seed_candidate(), ex)
    assert "similar_elements" in messages[1].content and "```python" in messages[1].content
    assert "plus_input" not in json.dumps(ex.input)


def run_cli(warm_cli, *args: str) -> subprocess.CompletedProcess:
    """The real command (tests/conftest.py: warm_cli), in this process's folder."""
    return warm_cli.run(*args, cwd=Path.cwd())


def test_cli_data_verify_passes_on_real_data_and_fails_on_a_tampered_copy(warm_cli, data_dir, tmp_path):
    ok = run_cli(warm_cli, "data", "verify", "--data-dir", str(data_dir), "bbh", "gsm_hard", "hotpotqa", "mbpp_plus")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "30 of 30 manifests verify" in ok.stdout
    path = copy_mirror(data_dir, tmp_path, "gsm_hard/gsmhardv2.jsonl")
    path.write_text(path.read_text().replace("-9867630.0", "-9867631.0", 1))
    bad = run_cli(warm_cli, "data", "verify", "--data-dir", str(tmp_path), "gsm_hard")
    assert bad.returncode == 1 and "FAILED" in bad.stdout and "0 (target)" in bad.stdout


def test_cli_tasks_list_json_shows_profiles_and_sizes(warm_cli):
    out = run_cli(warm_cli, "tasks", "list", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["bbh/snarks"]["profiles"]["sepo"] == {"train": 50, "val": 0, "test": 128}
    assert rows["mbpp_plus"]["kind"] == "prompt"


def test_cli_data_freeze_adds_a_profile_without_touching_hashes(warm_cli, data_dir, tmp_path):
    out_root = tmp_path / "manifests"
    (out_root / "gsm_hard.json").parent.mkdir(parents=True)
    shutil.copyfile(Manifest.path_for("gsm_hard"), out_root / "gsm_hard.json")
    res = run_cli(warm_cli, "data", "freeze", "--task", "gsm_hard", "--profile", "mine", "--sizes", "10/5/20",
                  "--data-dir", str(data_dir), "--out", str(out_root))
    assert res.returncode == 0, res.stderr
    frozen = Manifest.load("gsm_hard", out_root)
    assert frozen.sizes("mine") == {"train": 10, "val": 5, "test": 20}
    assert frozen.hashes == Manifest.load("gsm_hard").hashes


def test_cli_data_freeze_builds_a_manifest_for_a_users_own_jsonl(warm_cli, tmp_path):
    src = tmp_path / "mine.jsonl"
    src.write_text("".join(json.dumps({"id": f"q{i}", "input": {"q": i}, "target": i * 2, "group": f"g{i % 7}"}) + "\n"
                           for i in range(40)))
    res = run_cli(warm_cli, "data", "freeze", "--task", "user/doubling", "--jsonl", str(src), "--profile", "topics",
                  "--by-group", "--out", str(tmp_path / "m"))
    assert res.returncode == 0, res.stderr
    manifest = Manifest.load("user/doubling", tmp_path / "m")
    assert len(manifest.hashes) == 40 and sum(manifest.sizes("topics").values()) == 40
