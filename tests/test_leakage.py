"""Answer keys in candidates and the topic-shared leakage ablation.

The adversary is an optimizer that pastes training answers into its prompt. On a synthetic task
with planted families, served by the loopback test server (which honours an answer key and a
stated rule), a memorising candidate must gain on the exact training questions it encodes and
nowhere else, and a candidate with a real rule must gain everywhere; the ablation must say so,
count every scoring and ledger it."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import heldout
from heldout.contracts import candidate_id
from heldout.optimizers.placebo import placebo_candidate
from heldout.protocols.placebo import draws_for, placebo_seeds
from heldout import cli
from heldout.data_manifests import MANIFEST_PATH_ENV
from heldout.evaluators.ledger import Ledger, verify_ledger
from heldout.evaluators.records import RunRecord
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient
from heldout.models.testserver import TestServer
from heldout.protocols.leak_readings import reading
from heldout.protocols.leak_scan import answer_key_rows, scan_candidate
from heldout.protocols.leak_statistics import MethodAblation, SubsetGain, subset_gain
from heldout.protocols.decide import contrast
from heldout.protocols.folders import LEAK_ABLATION_DIR
from heldout.protocols.leakage import SUBSETS, ablate, decide_rows, find_records
from heldout.protocols.splits import PROBE, SplitSizes, build_split
from heldout.protocols.stats import mean_interval
from heldout.protocols.stats.paired import wilcoxon_p

import synthetic_code_words as synthetic

TASK = "user/code_words_leak"
PROFILE = "leak-probe"
SEEDS = (0, 1, 2)


def _unit(*parts) -> float:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big") / 2 ** 64


def memoriser(view, seed):
    """Pastes the answers of the training items of about half the training families (which half
    depends on the seed) into the prompt, spending no metric call."""
    families = sorted({ex["id"].split("-")[0] for ex in view.train})
    chosen = [f for f in families if _unit("family", seed, f) < 0.5] or families[:1]
    key = [synthetic.key_line(ex) for ex in view.train if ex["id"].split("-")[0] in chosen]
    return {"instruction": view.seed_candidate["instruction"] + "\n\nKnown answers:\n" + "\n".join(key)}


def inert_memoriser(view, seed):
    """Pastes the whole training key in a layout the worker does not act on (the study's case: a
    key that is there but earns nothing)."""
    key = [f"- {ex['input']['question']} -> {ex['target']}" for ex in view.train]
    return {"instruction": view.seed_candidate["instruction"] + f"\n\nNotes ({seed}):\n" + "\n".join(key)}


def rule_follower(view, seed):
    """The real rule, found in each seed's run in its own words (a seed-blind candidate would
    re-score one run three times, which decides nothing)."""
    return {"instruction": view.seed_candidate["instruction"] + f"\nRun {seed} found this.\n" + synthetic.RULE}


@pytest.fixture(scope="module")
def server():
    with TestServer(seed=0) as srv:
        yield srv


@pytest.fixture(scope="module")
def manifests(tmp_path_factory):
    root = tmp_path_factory.mktemp("manifests")
    mp = pytest.MonkeyPatch()
    mp.setenv(MANIFEST_PATH_ENV, str(root))
    synthetic.freeze_task(TASK, root)
    build_split(TASK, PROFILE, SplitSizes(32, 24, 48), probe=2, seed=0)
    yield root
    mp.undo()


def worker(server) -> ModelClient:
    return ModelClient("test-model", base_url=server.base_url, api_key="k", concurrency=4)


@pytest.fixture(scope="module")
def study(server, manifests, tmp_path_factory):
    """A study dir laid out like `heldout run` writes it: task/method/seed-n with run records."""
    root = tmp_path_factory.mktemp("study")
    task = heldout.load_task(TASK, PROFILE)
    for method, optimizer in (("memoriser", memoriser), ("inert", inert_memoriser), ("rule", rule_follower)):
        for seed in SEEDS:
            run_dir = root / "user__code_words_leak" / method / f"seed-{seed}"
            record = Session(task, budget=Budget(0), seed=seed, models=SessionModels(worker=worker(server)), run_dir=run_dir,
                             method=method).run(optimizer)
            assert record.status == "ok"
    return root


@pytest.fixture(scope="module")
def ablation(study, server):
    before = server.stats.ok
    result = ablate(study, baseline="seed", worker=worker(server), n_boot=2000)
    return result, server.stats.ok - before


# -- the leak scan ------------------------------------------------------------------------------------
def test_scan_finds_exactly_the_keyed_training_items_and_their_families(manifests):
    task = heldout.load_task(TASK, PROFILE)
    train = [{"id": ex.id, "input": ex.input, "target": ex.target} for ex in task.split("train")]
    keyed = [ex for ex in train if ex["id"].startswith(train[0]["id"].split("-")[0])]
    candidate = {"instruction": "Answer briefly.\n" + "\n".join(synthetic.key_line(ex) for ex in keyed)}
    scan = scan_candidate(candidate, task)
    assert sorted(scan.encoded) == sorted(ex["id"] for ex in keyed)
    assert scan.memorised_families == [train[0]["id"].split("-")[0]]
    assert scan.red_flags == [] and 0.8 < scan.share < 1.0  # all but "answer briefly" and the Q:/A: markers
    assert {s.field for s in scan.spans} == {"question", "answer"}


def test_scan_sees_through_case_punctuation_and_component_boundaries(manifests):
    task = heldout.load_task(TASK, PROFILE)
    ex = task.split("train")[0]
    shouted = ex.input["question"].upper().replace(":", " --").replace("'", '"')
    scan = scan_candidate({"a_notes": f"Remember: {shouted}", "b_more": f"=> {ex.target.upper()}!"}, task)
    assert scan.encoded == [ex.id] and any(s.field == "answer" for s in scan.spans)


def test_scan_flags_held_out_answers_and_test_questions_as_red(manifests):
    task = heldout.load_task(TASK, PROFILE)
    test_ex, probe_ex, val_ex = task.split("test")[0], task.split(PROBE)[0], task.split("val")[0]
    candidate = {"instruction": "\n".join(synthetic.key_line({"input": e.input, "target": e.target})
                                          for e in (test_ex, probe_ex, val_ex))}
    scan = scan_candidate(candidate, task)
    assert scan.encoded == [] and scan.share == 0.0
    flagged = {(s.pool, s.field) for s in scan.red_flags}
    # val inputs are visible to optimizers by policy, so only the val *answer* is a red flag
    assert flagged == {("test", "question"), ("test", "answer"), (PROBE, "question"), (PROBE, "answer"),
                       ("val", "answer")}
    # 3 lines of 9 words ("q", 7 question words, "a" dropped as an article, the answer): all but
    # the markers and the val question are flagged
    assert scan.words == 27 and scan.flagged_share == pytest.approx(17 / 27) and "RED FLAG" in scan.describe()


def test_scan_finds_nothing_in_a_seed_instruction_on_real_data(data_dir):
    for name in ("hotpotqa/distractor", "mmlu_pro/economics"):
        task = heldout.load_task(name, "topic-disjoint", data_dir=data_dir)
        scan = scan_candidate(task.benchmark.seed_candidate(), task)
        assert (scan.share, scan.spans, scan.red_flags) == (0.0, [], [])


def test_scan_on_real_hotpotqa_reports_the_pasted_families(data_dir, tmp_path, capsys):
    task = heldout.load_task("hotpotqa/distractor", "topic-disjoint", data_dir=data_dir)
    pasted = task.split("train")[:5]
    lines = [f"Example: {ex.input['question']} -> {ex.target['answer']}" for ex in pasted]
    path = tmp_path / "candidate.txt"
    path.write_text("Answer with a short span from the paragraphs.\n" + "\n".join(lines))
    assert cli.main(["leak", "scan", str(path), "--task", task.name, "--profile", "topic-disjoint",
                     "--data-dir", str(data_dir), "--json"]) == 0
    scan = json.loads(capsys.readouterr().out)
    assert sorted(scan["encoded"]) == sorted(ex.id for ex in pasted)
    assert scan["memorised_families"] == sorted({ex.group for ex in pasted})
    assert scan["share"] > 0.7 and scan["red_flags"] == []


# -- the ablation -------------------------------------------------------------------------------------
def test_memorising_candidate_gains_on_exact_training_questions_only(ablation):
    result, _ = ablation
    m = next(m for m in result.methods if m.method == "memoriser")
    encoded, test = m.row("train_encoded"), m.row("test")
    assert encoded.gain == 1.0 and encoded.separable and encoded.n_seeds == 3
    assert 0.0 < m.row("train").gain < 1.0  # only the keyed half of the families
    assert test.gain == 0.0 and not test.separable and test.n_examples == 48
    for subset in ("probe_memorised", "probe_other"):  # fresh questions: nothing, memorised family or not
        row = m.row(subset)
        assert row.n_examples > 0 and row.gain == 0.0 and not row.separable
    assert m.val_gain == 0.0 and all(s > 0.3 for s in m.key_share)
    assert "Memorisation pays on the exact training questions only" in m.reading
    assert m.reading_rule == "exact-only" and m.topic_disjoint and "NOT PROVEN" not in m.reading
    assert encoded.seed_flip_p == 0.25  # 3 seeds: 2/2^3 is the smallest exact p there is
    assert encoded.ci_method == "seeds, then examples within seed"  # each seed keyed different families


def test_a_key_the_worker_ignores_earns_nothing_even_where_it_is_exact(ablation):
    result, _ = ablation
    m = next(m for m in result.methods if m.method == "inert")
    assert m.row("train_encoded").n_examples == 32 and m.row("train_encoded").gain == 0.0
    assert m.row("probe_memorised").n_examples == 16 and m.row("probe_other").n_examples == 0
    assert all(s > 0.5 for s in m.key_share)
    assert "The key earns nothing measurable even on the questions it encodes" in m.reading


PLACEBO = [0.4 + d / 100 for d in range(-4, 5)]  # each seed's 9 placebo draws: re-wording moves the seed by 0.04


def _row(subset: str, per_seed_gains, n: int = 20) -> SubsetGain:
    """A subset whose seed s gains ``per_seed_gains[s]`` on each of its n examples, against 9
    placebo draws per seed (rule placebo-floor, as leak ablate decides)."""
    cells = [{f"{subset}-{k}": (0.4, 0.4 + g) for k in range(n)} for g in per_seed_gains]
    return subset_gain(subset, cells, n_boot=200, floors=[PLACEBO] * len(cells))


def test_a_seed_blind_candidate_re_scores_one_run_and_decides_nothing():
    cells = [{f"test-{k}": (0.4, 0.6) for k in range(20)} for _ in range(3)]
    blind = subset_gain("test", cells, n_boot=200, replayed=True, floors=[PLACEBO] * 3)
    assert not blind.separable and "one draw repeated" in blind.seed_contrast.sentence
    assert subset_gain("test", cells, n_boot=200, floors=[PLACEBO] * 3).separable  # three different candidates
    # against the seed's one draw, three seeds of one sign are p = 0.25: the sentence says how many would do
    lone = subset_gain("test", cells, n_boot=200)
    assert not lone.separable and ">= 6 seeds would" in lone.seed_contrast.sentence


def test_reading_of_the_studys_numbers():
    """Validation +0.202 against held-out +0.079: the gap is read from the decided signs, and a
    key whose exact-question gain is undecided earns nothing that can be claimed."""
    rows = [_row("test", [0.07, 0.08, 0.087]), _row("train", [0.0, 0.07, 0.14]),
            _row("train_encoded", [-0.05, 0.06, 0.17]), _row("probe_memorised", [-0.1, 0.05, 0.2]),
            _row("probe_other", [-0.02, 0.08, 0.18])]
    m = MethodAblation("t", "p", "gepa", [0, 1, 2], rows, val_gain=0.202, key_share=[0.45, 0.5, 0.4],
                       families_memorised=[12, 10, 9], red_flags=[0, 0, 0])
    decide_rows([m])
    assert [r.sign for r in m.rows] == ["+", "0", "0", "0", "0"]
    assert "Validation gain +0.202 overstates the held-out gain +0.079, 2.6x" in m.reading
    assert m.reading_rule == "transfer" and "memorisation pays" not in m.reading.lower()
    assert "The key earns nothing measurable even on the questions it encodes" in m.reading
    m.rows[2] = _row("train_encoded", [0.18, 0.19, 0.2])
    m.rows[0] = _row("test", [-0.02, 0.0, 0.02])
    decide_rows([m])
    # fresh questions gain too (undecided): the reading does not say "only"
    assert m.reading.startswith("Memorisation pays on the exact training questions;")
    assert "exact training questions only" not in m.reading
    assert "Not only there: fresh questions of memorised families gain +0.050" in m.reading


def test_rule_candidate_gains_everywhere(ablation):
    result, _ = ablation
    m = next(m for m in result.methods if m.method == "rule")
    for subset in ("test", "train", "probe_other"):
        row = m.row(subset)
        assert row.gain == 1.0 and row.separable and row.n_seeds == 3, subset
    assert m.row("test").ci_method == "seeds x shared examples"
    assert m.row("train_encoded").n_examples == 0 and m.row("probe_memorised").n_examples == 0
    assert m.key_share == [0.0, 0.0, 0.0] and m.val_gain == 1.0
    assert "The gain transfers" in m.reading and "a rule, not a key" in m.reading
    assert m.reading_rule == "transfer" and m.topic_disjoint
    assert [r.seed_contrast.family for r in m.rows if r.seed_contrast] == [result.family] * 3  # Holm over all rows


def test_ablation_scoring_is_counted_and_ledgered_and_always_fresh(ablation, study, server):
    result, calls = ablation
    task = heldout.load_task(TASK, PROFILE)
    pools = sum(len(task.split(p)) for p in ("test", "train", PROBE))
    unique_finals = 3 + 3 + 3  # one final candidate per method and seed
    seed_candidate = task.benchmark.seed_candidate()
    draws = len({candidate_id(placebo_candidate(dict(seed_candidate), s)[0])  # each seed's placebo draws,
                 for s in placebo_seeds([0, 1, 2], draws_for(3, family=len(SUBSETS)))})  # scored once each
    expected = pools * (1 + unique_finals + draws) + len(task.split("val"))  # the seed is scored on val too
    assert result.metric_calls == expected == calls
    ledger_dir = study / LEAK_ABLATION_DIR
    assert verify_ledger(ledger_dir).ok
    entries = list(Ledger.open(ledger_dir).entries("ablation_scoring"))
    assert len(entries) == expected
    before = server.stats.ok
    again = ablate(study, baseline="seed", worker=worker(server), n_boot=2000)
    # scored afresh (a ledger is never read back as results), appended to the same chain
    assert again.metric_calls == expected == server.stats.ok - before
    assert verify_ledger(ledger_dir).ok and len(list(Ledger.open(ledger_dir).entries("ablation_scoring"))) == 2 * expected
    assert [m.to_dict()["rows"] for m in again.methods] == [m.to_dict()["rows"] for m in result.methods]
    assert json.loads((ledger_dir / "ablation.json").read_text())["baseline"] == "seed"


def test_cli_ablate_prints_the_table_and_the_reading(ablation, study, server, capsys):
    assert cli.main(["leak", "ablate", str(study), "--baseline-method", "seed", "--worker-model", "test-model",
                     "--base-url", server.base_url]) == 0
    out = capsys.readouterr().out
    assert "train_encoded" in out and "probe_memorised" in out and "reading: " in out


def test_a_baseline_method_is_paired_by_seed(study, server):
    result = ablate(study, baseline="rule", worker=worker(server), n_boot=500)
    m = next(m for m in result.methods if m.method == "memoriser")
    assert m.row("test").gain == -1.0  # the key loses the rule's gains
    assert {m.method for m in result.methods} == {"memoriser", "inert"}


def test_answer_key_rows_for_the_report(study):
    rows = answer_key_rows(find_records(study))
    by_method = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row)
    assert len(by_method["memoriser"]) == len(by_method["inert"]) == len(by_method["rule"]) == 3
    assert all(r["share"] > 0.3 and r["families"] >= 1 for r in by_method["memoriser"])
    assert all(r["share"] == 0.0 and r["encoded"] == 0 for r in by_method["rule"])
    missing = RunRecord.load(next(iter(Path(study).rglob("run_record.json"))).parent)
    missing.profile = "no-such-profile"
    (row,) = answer_key_rows([missing])
    assert row["share"] is None and "no split profile" in row["problem"]


def test_subset_gain_with_one_seed_and_no_examples():
    one = subset_gain("test", [{"a": (0.0, 1.0), "b": (0.0, 1.0), "c": (1.0, 1.0)}])
    assert one.n_seeds == 1 and one.seed_flip_p is None and one.wins == 2 and one.losses == 0
    assert one.sign_test_p == 0.5 and not one.separable  # 2 wins cannot reach 0.05 exactly
    empty = subset_gain("probe_memorised", [{}, {}])
    assert (empty.n_examples, empty.gain, empty.separable) == (0, None, False)


def _seeded_cells(rng, k: int) -> list[dict]:
    """Seed cells of every shape subset_gain meets: shared examples in any order, ragged ones,
    0/1 integers, and one seed; up to 12 seeds and 40 examples (np.mean sums 8 or
    more numbers pairwise, not left to right)."""
    seeds, n = (1 if k % 9 == 0 else int(rng.integers(2, 13))), int(rng.integers(1, 41))
    cells = []
    for _ in range(seeds):
        ids = [f"e{i}" for i in (rng.permutation(n) if k % 4 == 1 else range(n))]
        if k % 4 == 2:
            ids = [i for i in ids if rng.random() < 0.7] or ids[:1]
        draw = {3: lambda: int(rng.integers(0, 2)), 4: lambda: float(rng.integers(0, 5)) / 4}.get(
            k % 5, lambda: float(rng.random()))
        cells.append({i: (draw(), draw()) for i in ids})
    return cells


def test_subset_gain_reports_the_plain_means_of_its_scores_to_the_last_bit():
    """subset_gain averages arrays it builds once per seed (the null simulations of
    test_leak_readings call it thousands of times). Every number it reports is, bit for bit, the
    one computed from the plain lists (np.mean of each), as the function computed it before: a
    per-seed mean summed left to right instead changes the last bits of the verdict's numbers on
    these inputs, and this test fails (tried)."""
    rng = np.random.default_rng(59)
    for k in range(150):
        cells = _seeded_cells(rng, k)
        got = subset_gain("test", cells, n_boot=100, seed=k)
        ids = sorted({i for c in cells for i in c})
        bases = [v[0] for c in cells for v in c.values()]
        finals = [v[1] for c in cells for v in c.values()]
        assert got.baseline == float(np.mean(bases)) and got.final == float(np.mean(finals))
        assert got.gain == float((np.array(finals) - np.array(bases)).mean())
        per_example = np.array([np.mean([c[i][1] - c[i][0] for c in cells if i in c]) for i in ids])
        assert (got.wins, got.losses) == (int((per_example > 0).sum()), int((per_example < 0).sum()))
        untied = got.wins + got.losses
        assert got.sign_test_p == (stats.binomtest(got.wins, untied, 0.5).pvalue if untied else 1.0)
        reference = wilcoxon_p(per_example)
        assert got.wilcoxon_p == reference or (np.isnan(got.wilcoxon_p) and np.isnan(reference)), k
        means = {s: (float(np.mean([v[0] for v in c.values()])), float(np.mean([v[1] for v in c.values()])))
                 for s, c in enumerate(cells)}
        expected = contrast({s: m[0] for s, m in means.items()}, {s: m[1] for s, m in means.items()},
                            n_examples=min(len(c) for c in cells), labels=("baseline", "final"), label="test",
                            alpha=1 - 0.95, examples=dict(enumerate(cells)))
        assert got.seed_contrast.as_dict() == expected.as_dict()
        if len(cells) == 1:
            interval = mean_interval(per_example, n_boot=100, seed=k, method="percentile")
            assert (got.ci_low, got.ci_high) == (interval.low, interval.high)
            continue
        gains = np.array([np.mean([v[1] - v[0] for v in c.values()]) for c in cells])
        flipped = np.abs((np.array(list(itertools.product((1.0, -1.0), repeat=len(cells)))) * gains).mean(axis=1))
        assert got.seed_flip_p == float((flipped >= abs(gains.mean()) - 1e-12).mean()), k
