"""The recipe baseline and the reviewer evidence of `heldout protocol generalisation`.

The adversary is a candidate that mixes a genuine rule with an answer key, so the gain it shows on
held-out is part rule, part key: on a topic-shared profile the key (one memorised answer per
trained "fact" family) pays on held-out questions of those families too, and the rule ("the code
of a word is the word spelled backwards") pays on every "code" question. The loopback model honours
both, and nothing else answers these questions, so the rule's share of the held-out gain is known
from the data alone: held-out code questions over held-out code questions plus held-out questions
of keyed families. The recipe baseline (the final candidate with the scan's key spans cut) must
recover that share through the real CLI, keep the rule and drop every key line, and its verdicts
must come from the decision layer."""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import pytest

import heldout
from heldout import cli
from heldout.data_manifests import MANIFEST_PATH_ENV
from heldout.models.testserver import TestServer
from heldout.protocols.leak_scan import scan_candidate
from heldout.protocols.recipe import (RECIPE_READINGS, component_shares, key_tokens, recipe_candidate,
                                     recipe_reading)
from heldout.reports.render import build_report
from latex_tables import compile_tables

TASK = "user/key_and_rule"
PROFILE = "shared"
FAMILIES, PER_FAMILY = 24, 6
RULE = "Rule: the code of a word is the word spelled backwards."
_SYLLABLES = ("ka", "lo", "mi", "nu", "pe", "ra", "so", "ti", "vu", "we", "xo", "zi")


def _word(*parts) -> str:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return "".join(_SYLLABLES[b % len(_SYLLABLES)] for b in digest[:4]) + "n"  # never a palindrome


def is_code_family(family: str) -> bool:
    return int(family[1:]) % 2 == 0


def rows():
    """Even families ask for the code of a word (the rule answers them); odd families share one
    answer per family (a family key answers them)."""
    out = []
    for f in range(FAMILIES):
        for k in range(PER_FAMILY):
            w = _word(f, k)
            if f % 2 == 0:
                out.append({"id": f"f{f:02d}-{k}", "input": f"Family f{f:02d}: what is the code of '{w}'?",
                            "target": w[::-1], "group": f"f{f:02d}"})
            else:
                out.append({"id": f"f{f:02d}-{k}", "input": f"Family f{f:02d}: which word goes with '{w}'?",
                            "target": _word("answer", f) + "x", "group": f"f{f:02d}"})
    return out


def keyed_families(train: list[dict], seed: int) -> list[str]:
    """The fact families the planted optimizer keys: about half of those with >= 2 training
    questions (by seed), so the scan's family rule can see each key's family."""
    counts: dict[str, int] = {}
    for ex in train:
        counts[ex["id"].split("-")[0]] = counts.get(ex["id"].split("-")[0], 0) + 1
    eligible = sorted(f for f, n in counts.items() if n >= 2 and not is_code_family(f))
    digest = lambda f: hashlib.sha256(f"{seed}|{f}".encode()).digest()[0]  # noqa: E731
    return [f for f in eligible if digest(f) % 2 == 0] or eligible[:1]


def key_and_rule(view, seed):
    """The planted optimizer: the seed instruction, then the rule, then a family key."""
    answers = {ex["id"].split("-")[0]: ex["target"] for ex in view.train}
    key = [f"Q: Family {f} A: {answers[f]}" for f in keyed_families(view.train, seed)]
    return {"instruction": view.seed_candidate["instruction"] + "\n" + RULE + "\n\nKnown answers:\n" + "\n".join(key)}


@pytest.fixture(scope="module")
def manifests(tmp_path_factory):
    root = tmp_path_factory.mktemp("manifests")
    mp = pytest.MonkeyPatch()
    mp.setenv(MANIFEST_PATH_ENV, str(root))
    source = root.parent / "key_and_rule.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    assert cli.main(["data", "freeze", "--jsonl", str(source), "--task", TASK, "--answer-format", "span",
                     "--profile", PROFILE, "--sizes", "72/24/48", "--out", str(root)]) == 0
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def server():
    with TestServer(seed=0) as srv:
        yield srv


def test_the_recipe_keeps_the_rule_and_drops_every_key_line(manifests):
    task = heldout.load_task(TASK, PROFILE)
    train = [{"id": ex.id, "target": ex.target} for ex in task.split("train")]
    families = keyed_families(train, 0)
    answers = {ex["id"].split("-")[0]: ex["target"] for ex in train}
    key = "\n".join(f"Q: Family {f} A: {answers[f]}" for f in families)
    candidate = {"instruction": f"Answer briefly.\n{RULE}", "memory": f"Known answers:\n{key}\nBe careful."}
    scan = scan_candidate(candidate, task)
    assert sorted(scan.memorised_families) == families
    recipe, removed = recipe_candidate(candidate, scan)
    assert recipe == {"instruction": f"Answer briefly.\n{RULE}", "memory": "Known answers:\nBe careful."}
    assert removed == 4 * len(families)  # "q family fNN <answer>", dropped whole
    shares = {c.component: c for c in component_shares(candidate, scan)}
    assert shares["instruction"].key_words == 0
    assert shares["memory"].key_words == scan.key_words and shares["memory"].share > 0.4
    # a key token inside a line of prose is cut, the prose kept
    mixed = {"instruction": f"{RULE} Remember that Family {families[0]} is {answers[families[0]]} always, and "
                            "answer with one word only please thanks."}
    cut, n = recipe_candidate(mixed, scan_candidate(mixed, task))
    assert n == 2 and answers[families[0]] not in cut["instruction"] and RULE in cut["instruction"]
    # no key: unchanged
    assert recipe_candidate({"instruction": RULE}, scan_candidate({"instruction": RULE}, task)) == ({"instruction": RULE}, 0)



def test_any_candidate_text_maps_onto_the_scans_words():
    """The recipe cuts tokens of the candidate's own text at the scan's word positions: a hostile
    text (Unicode spaces and line separators, ligatures, dotted capitals, lone articles and
    punctuation) must map exactly, or the key could not be located per component."""
    alphabet = list("abc the a an ,.-'\"()[]\t\n\r") + ["\u2028", "\x1c", "\x85", "\u00a0", "İ", "ß", "’",
                                                          "\u3000", "é", "\u200b", "Ⅻ", "ﬁ"]
    rng = random.Random(0)
    for _ in range(2000):
        candidate = {name: "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 50))) for name in ("a", "b")}
        tokens = key_tokens(candidate)
        positions = [p for t in tokens for p in t.positions]
        assert positions == list(range(len(positions)))


@pytest.fixture(scope="module")
def study(manifests, server, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("key-and-rule") / "study"
    assert cli.main(["-q", "protocol", "generalisation", "--task", TASK, "--profile", PROFILE, "--allow-topic-shared",
                     "--optimizer", "key_and_rule=test_recipe_baseline:key_and_rule", "--trusted-optimizer",
                     "--seeds", "0,1,2", "--budget", "5", "--run-dir", str(run_dir), "--worker-model", "test-model",
                     "--base-url", server.base_url]) == 0
    return run_dir


def test_a_recipe_baseline_of_a_key_plus_rule_candidate_recovers_the_rules_share(study):
    run_dir = study
    result = json.loads((run_dir / "report" / "generalisation.json").read_text())
    task = heldout.load_task(TASK, PROFILE)
    train = [{"id": ex.id, "target": ex.target} for ex in task.split("train")]
    test_families = [ex.group for ex in task.split("test")]
    recipe = result["evidence"]["recipe"]
    expected_rule, expected_total = [], []
    for row in recipe["per_seed"]:
        keyed = set(keyed_families(train, row["seed"]))
        code = sum(is_code_family(g) for g in test_families) / len(test_families)
        fact = sum(g in keyed for g in test_families) / len(test_families)
        assert row["seed_test"] == 0.0 and row["final_test"] == pytest.approx(code + fact)
        assert row["recipe_test"] == pytest.approx(code)  # the recipe keeps the rule's gain, loses the key's
        expected_rule.append(code)
        expected_total.append(code + fact)
    assert recipe["share_heldout"] == pytest.approx(sum(expected_rule) / sum(expected_total))
    assert 0.2 < recipe["share_heldout"] < 0.9  # both parts pay: the case the baseline exists for
    verdicts = recipe["contrasts"]
    assert {c["rule"] for c in verdicts.values()} == {"seed-paired-contrast"}
    assert all(c["family"] == 4 for c in verdicts.values())
    # the verdicts are the decision layer's over these very numbers, and the reading follows their signs
    n = len(recipe["per_seed"])
    assert verdicts["heldout_recipe"]["estimate"] == pytest.approx(sum(expected_rule) / n)
    assert verdicts["heldout_key"]["estimate"] == pytest.approx((sum(expected_total) - sum(expected_rule)) / n)
    # every seed's recipe is the same text (the rule; each seed's key is gone): its seeds re-score one
    # candidate, which the decision layer is told, while the finals (different keys) are three runs
    assert len({row["recipe_id"] for row in recipe["per_seed"]}) == 1
    assert verdicts["heldout_recipe"]["replayed"] and not verdicts["heldout_recipe"]["decided"]
    assert not verdicts["heldout_key"]["replayed"]
    rule = recipe_reading(verdicts["heldout_key"]["sign"], verdicts["heldout_recipe"]["sign"])
    assert recipe["reading_rule"] == rule.name and recipe["reading"] == rule.text
    # the recipe's scoring is ledgered as a protocol folder of its own, and it verifies
    assert (run_dir / "recipe" / "ledger.jsonl").is_file()
    assert cli.main(["ledger", "verify", str(run_dir)]) == 0
    # the reading names the rule the recipe sentence comes from
    sources = [s["source"] for s in result["reading"]]
    assert any(s.startswith(f"recipe baseline rule {rule.name!r}") for s in sources)
    # the reviewer evidence tables are in the report
    md = (run_dir / "report" / "report.md").read_text()
    for title in ("Held-out gain per seed over test items", "Lineage deltas", "Answer-key share per component",
                  "Recipe baseline (final minus its answer key)"):
        assert f"## {title}" in md, title
    items = result["evidence"]["items"]
    for s in items["per_seed"]:
        assert s["improved"] + s["regressed"] + s["unchanged"] == s["n_items"] == 48
        assert s["regressed"] == 0 and s["low"] <= s["gain"] <= s["high"]
    # the held-out gain per verifier dimension: the dimension the score is read from gains exactly
    # the held-out gain in every seed, and the table is in the report
    gains = {str(s["seed"]): s["gain"] for s in items["per_seed"]}
    dims = result["evidence"]["dimensions"]
    assert any(d["per_seed"] == pytest.approx(gains) for d in dims), dims
    assert "## Held-out gain per verifier dimension" in md
    shares = result["evidence"]["component_shares"]
    assert all(c[0]["component"] == "instruction" and c[0]["key_words"] > 0 for c in shares.values())
    lineage = result["evidence"]["lineage"]
    assert lineage and all(d["changed"] == ["instruction"] and d["words_delta"] > 0 for d in lineage)


def test_every_sign_pair_has_one_recipe_reading_and_none_claims_what_its_signs_do_not_support():
    used = set()
    for key, recipe in ((k, r) for k in "+-0" for r in "+-0"):
        rule = recipe_reading(key, recipe)
        used.add(rule.name)
        if "earns" in rule.text and "decided" in rule.text:
            assert key == "+"
        if "still beats the seed (decided)" in rule.text:
            assert recipe == "+"
        if rule.text.startswith("Removing the answer key raises"):
            assert key == "-"
        if "below the seed" in rule.text:
            assert recipe == "-"
        if "Neither" in rule.text:
            assert (key, recipe) == ("0", "0")
    assert used == {r.name for r in RECIPE_READINGS}


def test_a_report_on_the_protocols_run_dir_recognises_every_protocol_folder(study, capsys):
    """`heldout report` on the protocol's folder: its own ledger (protocol/), the recipe's and the
    ablation's are protocol folders, not interrupted runs; every study run is used."""
    report = build_report([study])
    assert not [w for w in report.warnings if "EXCLUDED" in w], report.warnings
    names = sorted(f.path.name for f in report.runs.protocols)
    assert names == ["ablation", "protocol", "recipe"]
    assert all(f.verified for f in report.runs.protocols)
    protocol = next(f for f in report.runs.protocols if f.path.name == "protocol")
    assert protocol.summary == [f"answer {json.loads((study / 'report' / 'generalisation.json').read_text())['answer']!r}"]
    assert len(report.runs.runs) == len(list((study / "runs").rglob("run_record.json"))) >= 6
    assert cli.main(["report", str(study), "--out", str(study.parent / "plain-report")]) == 0
    assert "interrupted" not in capsys.readouterr().err


def test_leak_ablate_gives_the_same_evidence_and_recipe_baseline(study, server, capsys):
    """`leak ablate` on the protocol's study runs: the same per-item gains and the same recipe
    share as the protocol's report (the recipe is scored afresh, under runs/recipe/)."""
    protocol = json.loads((study / "report" / "generalisation.json").read_text())["evidence"]
    capsys.readouterr()
    # no --worker-model: the study's own (study.json's config.worker_model, test-model)
    assert cli.main(["leak", "ablate", str(study / "runs"), "--base-url", server.base_url, "--json"]) == 0
    (mine,) = [e for e in json.loads(capsys.readouterr().out)["evidence"] if e["method"] == "key_and_rule"]
    assert mine["missing"] == ""
    ablated = mine["evidence"]
    assert ablated["items"] == protocol["items"]
    assert ablated["recipe"]["share_heldout"] == pytest.approx(protocol["recipe"]["share_heldout"])
    assert ablated["recipe"]["per_seed"] == protocol["recipe"]["per_seed"]
    assert ablated["component_shares"] == protocol["component_shares"]
    # without runs of the baseline method there is nothing to pair, and it says so
    assert cli.main(["leak", "ablate", str(study / "runs"), "--baseline-method", "nobody", "--worker-model",
                     "test-model", "--base-url", server.base_url]) in (0, 2)
    out = capsys.readouterr()
    assert "no seed of" in out.out + out.err or "baseline method 'nobody'" in out.out + out.err


def test_the_generalisation_reports_latex_tables_compile_without_an_overfull_box(study, tmp_path):
    """Every table `protocol generalisation` writes to report/paper/ (the reading's sentences, the
    autopsy, the recipe baseline): long text wraps, nothing runs past the column."""
    tex = sorted((study / "report" / "paper").glob("*.tex"))
    assert {"reading.tex", "recipe.tex", "item_gains.tex", "lineage.tex"} <= {p.name for p in tex}
    code, log = compile_tables(tex, tmp_path)
    assert code == 0, log[-3000:]
    assert "Overfull \\hbox" not in log, re.findall(r"Overfull \\hbox.*", log)[:5]
