"""The leak scan without blind spots, through the real CLI.

Adversaries: an optimizer (or a harness bug) that puts the *test* families' answers in a prompt,
one line per family naming its keeper and its secret; an optimizer that memorises training
families under a word other than the family's own name; and, the other way round, a task whose
vocabulary is so small that any text of its kind overlaps its test split (BBH boolean
expressions), which must not be read as a leak, while verbatim test items still are.

The planted task: families of eight questions "Family fNN: which word opens door '<word>'?", every
item of a family answered by the family's secret (a topic-level fact); two of the eight questions
name the family's keeper ("Family fNN: zorbin keeps door '<word>'; which word opens it?"). A
key "zorbin: nakor" names the family by its keeper, a word in a third of its training questions at
most (two more of its questions are held out as fresh probe questions): the old
rule (a context word in at least half of a family's training questions) could not see it."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
from scipy import stats

import heldout
from heldout import cli
from heldout.data_manifests import MANIFEST_PATH_ENV
from heldout.protocols.leak_scan import FLAG_RULE, ScanRules, scan_candidate
from heldout.protocols.splits import SplitSizes, answer_text, build_split, question_text, words

TASK = "user/keepers"
FAMILIES, PER_FAMILY = 24, 8
KEEPER_ITEMS = (1, 5)  # the questions that name the keeper


def _word(*parts) -> str:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return "".join(("ka", "lo", "mi", "nu", "pe", "ra", "so", "ti", "vu", "ze")[b % 10] for b in digest[:4])


def keeper(f: int) -> str:
    return _word("keeper", f) + "or"


def secret(f: int) -> str:
    return _word("secret", f) + "ex"


def _rows():
    rows = []
    for f in range(FAMILIES):
        for k in range(PER_FAMILY):
            door = _word("door", f, k) + "um"
            question = (f"Family f{f:02d}: {keeper(f)} keeps door '{door}'; which word opens it?" if k in KEEPER_ITEMS
                        else f"Family f{f:02d}: which word opens door '{door}'?")
            rows.append({"id": f"f{f:02d}-{k}", "input": question, "target": secret(f), "group": f"f{f:02d}"})
    return rows


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("manifests")
    mp = pytest.MonkeyPatch()
    mp.setenv(MANIFEST_PATH_ENV, str(root))
    source = root.parent / "keepers.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    assert cli.main(["data", "freeze", "--jsonl", str(source), "--task", TASK, "--answer-format", "span",
                     "--profile", "default", "--out", str(root)]) == 0
    build_split(TASK, "disjoint", SplitSizes(64, 32, 64), probe=2, seed=0)
    yield heldout.load_task(TASK, "disjoint")
    mp.undo()


def families(task, pool: str) -> list[int]:
    return sorted({int(ex.group[1:]) for ex in task.split(pool)})


def scan_cli(tmp_path, capsys, text: str, task_name: str, profile: str, *extra) -> tuple[int, str]:
    path = tmp_path / "candidate.txt"
    path.write_text(text)
    code = cli.main(["leak", "scan", str(path), "--task", task_name, "--profile", profile, *extra])
    return code, capsys.readouterr().out


# -- family-level keys, in every split ----------------------------------------------------------------
def test_a_key_to_the_test_families_answers_is_a_red_flag_and_exits_1(task, tmp_path, capsys):
    tested = families(task, "test")
    key = "Answer briefly.\n" + "\n".join(f"{keeper(f)}: {secret(f)}" for f in tested)
    code, out = scan_cli(tmp_path, capsys, key, TASK, "disjoint")
    assert code == 1
    assert "RED FLAG" in out and f"rule {FLAG_RULE}" in out and "flagged at most 1% of the time" in out
    code, out = scan_cli(tmp_path, capsys, key, TASK, "disjoint", "--json")
    scan = json.loads(out)
    assert scan["red_flag"] and scan["held_out_families"] == [f"f{f:02d}" for f in tested]
    assert scan["chance"]["p"] <= scan["chance"]["alpha"] == 0.01
    assert {s["example_id"] for s in scan["red_flags"] if s["field"] == "family_answer"} == \
        {ex.id for ex in task.split("test")}
    assert scan["share"] == 0.0 and scan["encoded"] == []  # no training data in it


def test_one_test_familys_key_alone_or_buried_in_training_text_is_still_a_red_flag(task):
    """The key of a single test family is two words; buried in all the training text (which
    the scan explains) it is a few words in hundreds: neither hides it."""
    f = families(task, "test")[0]
    line = f"{keeper(f)}: {secret(f)}"
    alone = scan_candidate({"instruction": line}, task)
    assert alone.red_flag and alone.held_out_families == [f"f{f:02d}"]
    training = "\n".join(f"Q: {question_text(ex)} A: {answer_text(ex)}" for ex in task.split("train"))
    buried = scan_candidate({"instruction": training + "\n" + line}, task)
    assert buried.share > 0.8 and buried.red_flag and buried.held_out_families == [f"f{f:02d}"]


def test_a_family_key_named_by_its_keeper_is_found_for_every_memorised_family(task, tmp_path, capsys):
    trained = families(task, "train")
    chosen = trained[::2]
    for f in chosen:  # the old rule's blind spot: the keeper is in fewer than half its training questions
        questions = [set(words(question_text(ex))) for ex in task.split("train") if ex.group == f"f{f:02d}"]
        assert sum(keeper(f) in q for q in questions) < len(questions) / 2
    key = "Remember these.\n" + "\n".join(f"{keeper(f)}: {secret(f)}" for f in chosen)
    code, out = scan_cli(tmp_path, capsys, key, TASK, "disjoint", "--json")
    scan = json.loads(out)
    assert code == 0 and not scan["red_flag"]  # training answers: the optimizer saw them
    assert scan["memorised_families"] == [f"f{f:02d}" for f in chosen]
    assert sorted(scan["encoded"]) == sorted(ex.id for ex in task.split("train") if int(ex.group[1:]) in chosen)
    assert scan["share"] > 0.8
    # the fresh questions of those families share the key, and training text explains it: no overlap
    assert scan["held_out"] == []


def test_a_keeper_or_secret_alone_is_no_key(task):
    f = families(task, "train")[0]
    prose = f"{keeper(f)} wrote this prompt." + " filler" * 60 + f" {secret(f)}"
    scan = scan_candidate({"instruction": prose}, task)
    assert scan.encoded == [] and scan.share == 0.0


def test_a_verbatim_test_item_is_still_a_red_flag_on_the_planted_task(task, tmp_path, capsys):
    ex = task.split("test")[0]
    code, out = scan_cli(tmp_path, capsys, f"Q: {question_text(ex)} A: {answer_text(ex)}", TASK, "disjoint")
    assert code == 1 and "RED FLAG" in out


# -- chance overlap: small vocabularies -------------------------------------------------------------
BBH = "bbh/boolean_expressions"


def _line(ex) -> str:
    return f"Q: {question_text(ex)} A: {answer_text(ex)}"


def fresh_expressions(rng: random.Random, n: int) -> str:
    """Worked examples an optimizer writes itself: boolean expressions in the task's vocabulary,
    with their true values."""
    lines = []
    for _ in range(n):
        parts = [rng.choice(["True", "False", "not True", "not False"])]
        for _ in range(rng.randint(1, 4)):
            parts += [rng.choice(["and", "or"]), rng.choice(["True", "False", "not True", "not False", "( True )"])]
        expression = " ".join(parts)
        value = eval(expression.replace("( ", "(").replace(" )", ")"))  # noqa: S307 - our own literal text
        lines.append(f"{expression} is {value}")
    return "\n".join(lines)


def test_training_text_on_a_small_vocabulary_task_raises_no_red_flag(data_dir, tmp_path, capsys):
    task = heldout.load_task(BBH, "default", data_dir=data_dir)
    text = "\n".join(_line(ex) for ex in task.split("train"))
    code, out = scan_cli(tmp_path, capsys, text, BBH, "default", "--data-dir", str(data_dir))
    assert code == 0 and "RED FLAG" not in out, out


def test_self_written_examples_on_a_small_vocabulary_task_are_within_chance(data_dir, tmp_path, capsys):
    task = heldout.load_task(BBH, "default", data_dir=data_dir)
    seed = task.benchmark.seed_candidate()["instruction"]
    text = seed + "\nExamples:\n" + fresh_expressions(random.Random(3), 30)
    scan = scan_candidate({"instruction": text}, task)
    assert scan.held_out, "the test split's short expressions recur in any text of the task's kind"
    code, out = scan_cli(tmp_path, capsys, text, BBH, "default", "--data-dir", str(data_dir))
    assert code == 0 and "no red flag" in out and f"rule {FLAG_RULE}" in out, out


def test_verbatim_test_items_on_a_small_vocabulary_task_are_still_a_red_flag(data_dir, tmp_path, capsys):
    task = heldout.load_task(BBH, "default", data_dir=data_dir)
    seed = task.benchmark.seed_candidate()["instruction"]
    text = seed + "\n" + "\n".join(_line(ex) for ex in task.split("test")[:20])
    code, out = scan_cli(tmp_path, capsys, text, BBH, "default", "--data-dir", str(data_dir))
    assert code == 1 and "RED FLAG" in out and "p 0.005 <= alpha 0.01" in out, out


# -- the flag's error rate --------------------------------------------------------------------------
def test_the_flags_error_rate_on_text_that_holds_no_held_out_data(data_dir):
    """40 candidates of the seed and self-written examples (5, 15 or 30 lines) on BBH boolean
    expressions, and 40 of key lines to the planted task's training families in varied layouts:
    none holds held-out data, so every flag is false; the rate stays within the binomial 99.9%
    bound of alpha (0.01)."""
    rules = ScanRules()
    task = heldout.load_task(BBH, "default", data_dir=data_dir)
    seed = task.benchmark.seed_candidate()["instruction"]
    rng = random.Random(11)
    flags = sum(scan_candidate({"instruction": seed + "\n" + fresh_expressions(rng, rng.choice((5, 15, 30)))}, task).red_flag
                for _ in range(40))
    assert flags / 40 <= stats.binom.ppf(0.999, 40, rules.alpha) / 40, flags


def test_the_flags_error_rate_on_training_family_keys(task):
    rng = random.Random(5)
    trained = families(task, "train")
    flags = 0
    for k in range(40):
        chosen = rng.sample(trained, rng.randint(1, len(trained)))
        layout = rng.choice(["{k}: {s}", "{k} -> {s}", "If the keeper is {k}, answer {s}.", "{s} ({k})"])
        text = "Answer with one word.\n" + "\n".join(layout.format(k=keeper(f), s=secret(f)) for f in chosen)
        flags += scan_candidate({"instruction": text}, task).red_flag
    assert flags <= stats.binom.ppf(0.999, 40, ScanRules().alpha), flags
