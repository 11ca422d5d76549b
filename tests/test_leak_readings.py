"""Leakage readings: generated from a table of rules over decided signs, never contradicting them.

The adversary is twofold: an optimizer that memorises at the topic level (one answer per trained
family, so no training question appears in its prompt), and a profile whose held-out split shares
topics with training, where such a key looks like a rule. The reading table must be total and
consistent over all 3**4 sign patterns; the seed-paired verdict it reads must hold its type-I
error under the null; and the planted cases, run end to end on the loopback model, must each get
the right reading."""

from __future__ import annotations

import hashlib
import itertools
import json

import numpy as np
import pytest
from scipy import stats

import heldout
from heldout import cli
from heldout.data_manifests import MANIFEST_PATH_ENV
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient
from heldout.models.testserver import TestServer
from heldout.protocols.leak_readings import READINGS, headline, reading_rule, reading_signs
from heldout.protocols.leak_scan import scan_candidate
from heldout.protocols.leak_statistics import MethodAblation, subset_gain
from heldout.protocols.leakage import ablate, decide_rows
from heldout.protocols.splits import SplitSizes, build_split, check_split
from heldout.reports.collect import collect_runs
from heldout.reports.render import build_report, render_markdown

PATTERNS = list(itertools.product("+-0", repeat=4))


# -- the table ------------------------------------------------------------------------------------
def contradictions(signs, text: str, *, topic_disjoint: bool) -> list[str]:
    """Every claim of a reading that its signs (exact, fresh memorised, fresh other, held-out)
    do not support. Written independently of the table it checks."""
    exact, mem, other, test = signs
    claim = text.split(" Decided ")[0]  # the rule's words, without the list of decided axes
    low = claim.lower()
    wrong = []
    if "a rule, not a key" in claim or "a rule beside" in claim:
        if not (test == "+" and "-" not in signs and topic_disjoint):
            wrong.append("calls it a rule")
    if "memorisation pays" in low and not (test != "+" and "+" in (exact, mem)):
        wrong.append("says memorisation pays")
    if "a rule" in claim and "memorisation pays" in low:
        wrong.append("both a rule and memorisation pays")
    if "exact training questions only" in claim and (exact, mem, other, test) != ("+", "0", "0", "0"):
        wrong.append("exact questions only")
    if "at the topic level" in claim and not (mem == "+" and test == "0"):
        wrong.append("topic-level memorisation")
    if "transfers" in claim and test != "+":
        wrong.append("transfers")
    if ("no subset separates" in low) != (signs == ("0", "0", "0", "0")):
        wrong.append("no subset separates")
    if ("worse" in low or "lose" in low) and "-" not in signs:
        wrong.append("says something loses")
    if "held-out topics do not" in low and test != "0":
        wrong.append("held-out topics do not")
    for axis, word in ((test, "held-out topics gain"), (test, "reaches the held-out")):
        if word in low and axis != "+":
            wrong.append(word)
    lower = [a for a, s in zip(("exact", "memorised", "other trained", "held-out"), signs) if s == "-"]
    if lower and "Decided lower on" not in text:
        wrong.append("hides a decided loss")
    if not topic_disjoint and not text.startswith("NOT PROVEN topic-disjoint"):
        wrong.append("not loud about the split")
    return wrong


def test_every_sign_pattern_has_one_reading_and_every_rule_is_used():
    used = {reading_rule(p).name for p in PATTERNS}
    assert used == {r.name for r in READINGS}
    assert len(PATTERNS) == 81


@pytest.mark.parametrize("has_key", (False, True))
@pytest.mark.parametrize("topic_disjoint", (True, False))
def test_no_reading_contradicts_its_signs(has_key, topic_disjoint):
    for signs in PATTERNS:
        text = headline(signs, has_key=has_key, topic_disjoint=topic_disjoint)
        assert contradictions(signs, text, topic_disjoint=topic_disjoint) == [], (signs, text)


def test_the_issues_contradictions_are_impossible():
    # a positive fresh-family gain is never read as "exact training questions only"
    assert "only" not in headline(("+", "+", "0", "0"), has_key=True, topic_disjoint=True)
    assert reading_rule(("+", "+", "0", "0")).name == "topic-level-key"
    # "a rule, not a key" and "memorisation pays" never stand together, proven or not
    for signs, proven, key in itertools.product(PATTERNS, (True, False), (True, False)):
        text = headline(signs, has_key=key, topic_disjoint=proven).lower()
        assert not ("a rule" in text.split(" decided ")[0] and "memorisation pays" in text)
        if not proven:
            assert "a rule, not a key" not in text and "rule beside" not in text


def _row(subset: str, sign: str, n: int = 12):
    """A row of 3 seeds against 9 placebo draws per seed (rule placebo-floor, as leak ablate decides)."""
    gains = {"+": (0.30, 0.32, 0.34), "-": (-0.30, -0.32, -0.34), "0": (-0.05, 0.0, 0.05)}[sign]
    cells = [{f"{subset}-{k}": (0.4, 0.4 + g) for k in range(n)} for g in gains]
    floors = [[0.4 + d / 100 for d in range(-4, 5)] for _ in gains]
    return subset_gain(subset, cells, n_boot=100, floors=floors)


@pytest.mark.parametrize("has_key", (False, True))
def test_readings_of_decided_rows_follow_the_contrasts(has_key):
    """The same check on whole readings built from seed-level contrasts, Holm-adjusted over the
    five rows printed: the signs read are the contrasts' decisions, and the text holds no claim
    they do not support."""
    for signs in PATTERNS:
        exact, mem, other, test = signs
        rows = [_row("test", test), _row("train", exact if not has_key else "0"),
                _row("train_encoded", exact if has_key else "0"), _row("probe_memorised", mem),
                _row("probe_other", other)]
        m = MethodAblation("t", "p", "opt", [0, 1, 2], rows, val_gain=None,
                           key_share=[0.3 if has_key else 0.0] * 3, families_memorised=[2] * 3, red_flags=[0] * 3)
        assert decide_rows([m]) == 5
        assert reading_signs(m) == (signs, has_key)
        assert contradictions(signs, m.reading, topic_disjoint=True) == [], (signs, m.reading)
        assert m.reading_rule == reading_rule(signs).name


# -- the verdict's error rate ---------------------------------------------------------------------
NEVER_SIMS = 500
"""Draws for a null whose seeds are too few for the exact sign-flip to reach alpha (fewer than 6):
the claim there is that nothing is ever separable (asserted as 0, beside the binomial bound), and a
rule that separates at all (a t test, an example-level test: 5-25% of these draws) shows in 500
draws with probability 1 - 0.99**500 > 0.993 even if it did in only 1% of them (2000 and 1000 draws
against the bound alone let a rule deciding 5% of the time pass)."""


def _null_cells(rng: np.random.Generator, seeds: int, n: int = 20):
    """One subset under the null: a baseline right on half the examples, and per seed a final
    candidate that flips each baseline outcome with its own seed-level rate (so the mean paired
    gain is 0 while seeds differ in how much they change)."""
    base = np.array([1.0] * (n // 2) + [0.0] * (n - n // 2))
    cells = []
    for _ in range(seeds):
        flip = rng.random(n) < rng.uniform(0.05, 0.6)
        final = np.where(flip, 1.0 - base, base)
        cells.append({f"e{i}": (base[i], final[i]) for i in range(n)})
    return cells


@pytest.mark.parametrize("seeds", (3, 5, 10))
def test_leak_separable_type_one_error_at_most_alpha(seeds):
    sims, alpha = (2000 if seeds >= 6 else NEVER_SIMS), 0.05
    rng = np.random.default_rng(1000 + seeds)
    false = sum(subset_gain("test", _null_cells(rng, seeds), n_boot=100).separable for _ in range(sims))
    bound = stats.binom.ppf(0.999, sims, alpha) / sims  # the 99.9% binomial upper bound of 0.05
    assert false / sims <= bound, (seeds, false / sims)
    if seeds < 6:  # the exact sign-flip cannot reach alpha: nothing is ever separable (NEVER_SIMS)
        assert false == 0, (seeds, false)


def test_holm_over_the_printed_rows_keeps_the_family_wise_error_at_most_alpha():
    """Five null rows per ablation, decided together as `leak ablate` does: the chance that any
    of them is called separable stays within the binomial bound of 0.05 (5 seeds: where the exact
    sign-flip cannot reach alpha, so no row may ever be, in NEVER_SIMS draws)."""
    sims, alpha = NEVER_SIMS, 0.05
    rng = np.random.default_rng(55)
    any_false = 0
    for _ in range(sims):
        rows = [subset_gain(name, _null_cells(rng, 5), n_boot=100)
                for name in ("test", "train", "train_encoded", "probe_memorised", "probe_other")]
        m = MethodAblation("t", "p", "opt", list(range(5)), rows, None, [0.0] * 5, [0] * 5, [0] * 5)
        decide_rows([m])
        any_false += any(r.separable for r in m.rows)
    assert any_false / sims <= stats.binom.ppf(0.999, sims, alpha) / sims, any_false / sims
    assert any_false == 0, any_false


def test_leak_separable_has_power_against_a_planted_gain():
    """Each seed's final candidate fixes 6 of the 10 wrong answers on average: at 6 seeds (the
    fewest the exact sign-flip decides at) the verdict finds it nearly always (the floor stated: 0.8)."""
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(300):
        base = np.array([1.0] * 10 + [0.0] * 10)
        cells = []
        for _ in range(6):
            fixed = (base == 0) & (rng.random(20) < rng.uniform(0.4, 0.8))
            cells.append({f"e{i}": (base[i], 1.0 if fixed[i] else base[i]) for i in range(20)})
        hits += subset_gain("test", cells, n_boot=100).sign == "+"
    assert hits / 300 >= 0.8


# -- planted cases end to end ---------------------------------------------------------------------
TASK = "user/family_answers"
FAMILIES, PER_FAMILY = 24, 6
SEEDS = (0, 1, 2)


def _word(*parts) -> str:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return "".join(("ka", "lo", "mi", "nu", "pe", "ra", "so", "ti")[b % 8] for b in digest[:4]) + "x"


def family_answer(f: int) -> str:
    return _word("answer", f)


def _rows():
    """Every item of family fNN has the same answer: the family's word (a topic-level fact)."""
    return [{"id": f"f{f:02d}-{k}", "input": f"Family f{f:02d}: which word goes with '{_word(f, k)}'?",
             "target": family_answer(f), "group": f"f{f:02d}"} for f in range(FAMILIES) for k in range(PER_FAMILY)]


def _unit(*parts) -> float:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big") / 2 ** 64


def family_keyer(view, seed):
    """One memorised answer per chosen training family (about half, by seed), keyed by the
    family's name only: no training question is pasted."""
    answers = {ex["id"].split("-")[0]: ex["target"] for ex in view.train}
    chosen = [f for f in sorted(answers) if _unit("fam", seed, f) < 0.5] or sorted(answers)[:1]
    key = [f"Q: Family {f} A: {answers[f]}" for f in chosen]
    return {"instruction": view.seed_candidate["instruction"] + "\n\nKnown answers:\n" + "\n".join(key)}


@pytest.fixture(scope="module")
def server():
    with TestServer(seed=0) as srv:
        yield srv


@pytest.fixture(scope="module")
def manifests(tmp_path_factory):
    root = tmp_path_factory.mktemp("manifests")
    mp = pytest.MonkeyPatch()
    mp.setenv(MANIFEST_PATH_ENV, str(root))
    source = root.parent / "family_answers.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    assert cli.main(["data", "freeze", "--jsonl", str(source), "--task", TASK, "--answer-format", "span",
                     "--profile", "default", "--out", str(root)]) == 0
    # topic-shared: a split by example, so held-out families are training families too
    assert cli.main(["data", "freeze", "--jsonl", str(source), "--task", TASK, "--answer-format", "span",
                     "--profile", "shared", "--sizes", "48/24/48", "--out", str(root)]) == 0
    build_split(TASK, "disjoint", SplitSizes(32, 24, 48), probe=2, seed=0)
    yield root
    mp.undo()


def _study(root, server, profile):
    task = heldout.load_task(TASK, profile)
    worker = ModelClient("test-model", base_url=server.base_url, api_key="k", concurrency=4)
    for seed in SEEDS:
        record = Session(task, budget=Budget(0), seed=seed, models=SessionModels(worker=worker), method="family-key",
                         run_dir=root / "family-key" / f"seed-{seed}").run(family_keyer)
        assert record.status == "ok"
    return ablate(root, baseline="seed", worker=worker, n_boot=500)


def test_scan_finds_a_topic_level_key_and_names_its_families(manifests):
    task = heldout.load_task(TASK, "disjoint")
    view_train = [{"id": ex.id, "input": ex.input, "target": ex.target} for ex in task.split("train")]
    fam = view_train[0]["id"].split("-")[0]
    scan = scan_candidate({"instruction": f"Answer briefly.\nQ: Family {fam} A: {view_train[0]['target']}"}, task)
    assert scan.share > 0 and scan.memorised_families == [fam]
    assert sorted(scan.encoded) == sorted(e["id"] for e in view_train if e["id"].startswith(fam + "-"))
    assert {s.field for s in scan.spans} == {"family_answer", "family_context"}
    # out of context the same short answer is no key: it names no family
    far = scan_candidate({"instruction": f"Family {fam}." + " filler" * 60 + f" {view_train[0]['target']}"}, task)
    assert far.encoded == [] and far.share == 0.0


@pytest.fixture(scope="module")
def topic_study(manifests, server, tmp_path_factory):
    root = tmp_path_factory.mktemp("topic-study")
    return root, _study(root, server, "disjoint")


def test_topic_level_key_is_read_as_topic_level_memorisation(topic_study):
    _, result = topic_study
    (m,) = result.methods
    assert m.topic_disjoint and m.row("probe_memorised").sign == "+" and m.row("test").sign == "0"
    assert m.row("train_encoded").sign == "+" and m.row("probe_other").sign == "0"
    assert all(s > 0 for s in m.key_share) and min(m.families_memorised) >= 1
    assert m.reading_rule == "topic-level-key"
    assert m.reading.startswith("Memorisation pays at the topic level")
    assert "only" not in m.reading.split(".")[0]


def test_topic_shared_profile_is_not_proven_and_never_called_a_rule(manifests, server, tmp_path, capsys):
    assert not check_split(TASK, "shared").ok
    result = _study(tmp_path, server, "shared")
    (m,) = result.methods
    assert m.row("test").sign == "+"  # held-out items of memorised families share the key
    assert not m.topic_disjoint and m.reading.startswith("NOT PROVEN topic-disjoint")
    assert "a rule, not a key" not in m.reading and "rule beside" not in m.reading
    assert any("NOT PROVEN" in n for n in result.notes)
    assert cli.main(["leak", "ablate", str(tmp_path), "--worker-model", "test-model",
                     "--base-url", server.base_url, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["topic_disjoint"] is False and out["methods"][0]["topic_disjoint"] is False
    assert out["methods"][0]["rows"][0]["seed_contrast"]["rule"] == "placebo-floor"  # the seed is one draw


def test_cli_scan_exits_1_on_red_flags(manifests, tmp_path, capsys):
    task = heldout.load_task(TASK, "disjoint")
    ex = task.split("test")[0]
    path = tmp_path / "c.txt"
    path.write_text(f"Q: {ex.input['question']} A: {ex.target}")
    assert cli.main(["leak", "scan", str(path), "--task", TASK, "--profile", "disjoint"]) == 1
    assert "RED FLAG" in capsys.readouterr().out


def test_report_shows_each_final_candidates_key_and_recognises_the_ablation_folder(topic_study):
    root, _ = topic_study
    report = build_report([root])
    assert not any("interrupted" in w or "ablation" in w for w in report.warnings), report.warnings
    (folder,) = report.runs.protocols
    assert folder.path.name == "ablation" and folder.verified and folder.entries > 0
    assert any("protocol folder" in n and "leak ablate" in n and "topic-level-key" in n for n in report.notes)
    keys = report.table("answer_key")
    assert [(r["method"], r["seed"]) for r in keys.data] == [("family-key", s) for s in SEEDS]
    assert all(r["share"] > 0 and r["families"] >= 1 and r["red_flags"] == 0 for r in keys.data)
    assert "Answer-key share" in render_markdown(report)


def test_an_interrupted_session_named_like_a_protocol_folder_stays_interrupted(topic_study, tmp_path):
    """Only a protocol's own ledger is recognised: a session ledger in a folder called
    ``ablation`` (an interrupted run) is still reported as one."""
    root, _ = topic_study
    src = next(p for p in (root / "family-key").iterdir())
    fake = tmp_path / "ablation"
    fake.mkdir()
    (fake / "ledger.jsonl").write_bytes((src / "ledger.jsonl").read_bytes())
    runs = collect_runs([tmp_path])
    assert runs.protocols == [] and "interrupted" in runs.excluded[0].reason


def test_short_answers_out_of_family_context_are_no_key_on_real_data(data_dir):
    """MMLU-Pro economics trains on one family: its common words ("of", "in") are in held-out
    questions too, so they are no family context, and a short answer beside them is no key."""
    task = heldout.load_task("mmlu_pro/economics", "topic-disjoint", data_dir=data_dir)
    assert len({ex.group for ex in task.split("train")}) == 1
    prose = ("Answer in at most 30 words, and think of the options in turn: 4 of them are often "
             "traps. The answer is one of the options; 1000 is not a word count to aim for.")
    scan = scan_candidate({"instruction": prose}, task)
    assert (scan.encoded, scan.share, scan.memorised_families) == ([], 0.0, [])


def test_a_verifier_ablation_folder_is_a_protocol_folder_not_a_run(topic_study, tmp_path):
    root, _ = topic_study
    ledger = Ledger.open(tmp_path / "verifier_ablation")
    ledger.append_entry("selection_scoring", {"candidate_id": "c", "split": "train", "example_id": "e", "score": 1.0})
    ledger.close()
    runs = collect_runs([tmp_path, root])
    kinds = sorted(f.kind.split(" ")[0] for f in runs.protocols)
    assert kinds == ["compare", "leak"] and runs.excluded == [] and len(runs.runs) == len(SEEDS)
