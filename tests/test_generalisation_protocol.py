"""The generalisation-first protocol, end to end through `heldout protocol generalisation`.

The adversary is an optimizer that pastes training questions with their answers verbatim into
its prompt: the loopback model honours such a key (`Q: <question> A: <answer>` lines in the
system message), so the key pays on exactly those training questions and nowhere else. On a
small topic-disjoint profile of the real HotpotQA data the one command must prove the split, run
the seeds, decide the held-out comparison, ablate, and show the key in the prompt autopsy, and its
reading must not call the key transfer. A family-level key (one memorised answer per trained
family, no training question pasted; the synthetic task of ``test_leak_readings``) must be read
as memorisation at the topic level, a seed-blind optimizer (one candidate in every seed) must
decide nothing however its one run scored, and a real-rule optimizer (a generic instruction, no key) must show share 0.
`--plan` spends and writes nothing; a profile that is not topic-disjoint is refused in one line
unless `--allow-topic-shared`, which the report then states."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from heldout import cli
from heldout.data_manifests import MANIFEST_PATH_ENV, Manifest
from heldout.evaluators.records import RunRecord
from heldout.models.testserver import TestServer
from heldout.protocols.generalisation import (GAP_READINGS, GeneralisationError, GeneralisationSpec, compare_heldout,
                                             gap_reading)
from heldout.protocols.generalisation_file import load_generalisation_file
from heldout.protocols.prompt_autopsy import accepted_candidates
from heldout.protocols.placebo import STRIDE
from heldout.protocols.study import parse_methods
from heldout.protocols.splits import SplitSizes, build_split, check_split

from test_leak_readings import TASK as FAMILY_TASK, _rows as family_rows

TASK = "hotpotqa/distractor"
PROFILE = "gen-tiny"  # a small topic-disjoint draw of the real data (split build), proven by split check
SHARED = "gen-shared"  # a small profile of the shipped default one: one topic in train and test
VAL_LOOK = 10  # val examples the planted optimizers evaluate each candidate on
BUDGET = 3 * VAL_LOOK
KEYED = 6  # training examples the verbatim key holds per seed


def verbatim_key(view, seed):
    """Evaluates the seed, then two candidates holding a growing verbatim key of training
    questions and answers (which ones depends on the seed), each on the same few val examples."""
    ids = [ex["id"] for ex in view.val][:VAL_LOOK]
    base = view.seed_candidate
    view.evaluate(base, "val", ids)
    start = (seed * 7) % max(1, len(view.train) - KEYED)
    keyed = view.train[start:start + KEYED]
    lines = [f"Q: {ex['input']['question']} A: {ex['target']['answer']}" for ex in keyed]
    half = {"instruction": base["instruction"] + "\n\nKnown answers:\n" + "\n".join(lines[:KEYED // 2])}
    view.evaluate(half, "val", ids, parent=None)
    full = {"instruction": base["instruction"] + "\n\nKnown answers:\n" + "\n".join(lines)}
    view.evaluate(full, "val", ids)
    return full


INTERRUPTED_ONCE = "HELDOUT_TEST_INTERRUPTED_ONCE"  # a marker file: present after the first Ctrl-C


def interrupted_once(view, seed):
    """The generic rule, but the first session ever run presses Ctrl-C on its own process after
    one evaluation (a user stopping the protocol mid-session)."""
    ids = [ex["id"] for ex in view.val][:VAL_LOOK]
    view.evaluate(view.seed_candidate, "val", ids)
    marker = Path(os.environ[INTERRUPTED_ONCE])
    if not marker.exists():
        marker.write_text("stopped once")
        os.kill(os.getpid(), signal.SIGINT)
    return generic_rule(view, seed)


def generic_rule(view, seed):
    """A generic instruction change that holds no training data."""
    ids = [ex["id"] for ex in view.val][:VAL_LOOK]
    base = view.seed_candidate
    view.evaluate(base, "val", ids)
    ruled = {"instruction": base["instruction"] + "\nRead both paragraphs that share an entity with the "
             "question, then answer with the shortest span that answers it."}
    view.evaluate(ruled, "val", ids)
    return ruled


@pytest.fixture(scope="module", autouse=True)
def manifests(data_dir, tmp_path_factory):
    """A user manifest root on the search path holding both small profiles of the real task."""
    root = tmp_path_factory.mktemp("manifests")
    mp = pytest.MonkeyPatch()
    mp.setenv(MANIFEST_PATH_ENV, str(root))
    manifest = Manifest.load(TASK)
    default = manifest.profiles["default"]
    overlap = {"train": "5a80b3a9554299485f5986cc", "test": "95"}  # 'McLean, Virginia | Tysons Galleria'
    manifest.profiles = {SHARED: {"train": [overlap["train"]] + [i for i in default["train"] if i != overlap["train"]][:15],
                                  "val": default["val"][:12],
                                  "test": [overlap["test"]] + [i for i in default["test"] if i != overlap["test"]][:23]}}
    manifest.notes = {SHARED: "generalisation test: a topic-shared profile (one topic in train and test)"}
    manifest.save(root)
    build_split(TASK, PROFILE, SplitSizes(16, 12, 24), seed=0, data_dir=str(data_dir))
    source = root.parent / "family_answers.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in family_rows()))
    assert cli.main(["data", "freeze", "--jsonl", str(source), "--task", FAMILY_TASK, "--answer-format", "span",
                     "--profile", "default", "--out", str(root)]) == 0
    build_split(FAMILY_TASK, "disjoint", SplitSizes(32, 24, 48), probe=2, seed=0)
    assert check_split(TASK, PROFILE, data_dir=str(data_dir)).ok and not check_split(TASK, SHARED,
                                                                                     data_dir=str(data_dir)).ok
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def server():
    with TestServer(seed=0) as srv:
        yield srv


def protocol(run_dir: Path, server, data_dir, optimizer: str, *extra: str) -> int:
    extra = extra if "--profile" in extra else ("--profile", PROFILE, *extra)
    return cli.main(["-q", "protocol", "generalisation", "--task", TASK, "--optimizer",
                     f"{optimizer}=test_generalisation_protocol:{optimizer}", "--trusted-optimizer",
                     "--seeds", "0,1,2", "--budget", str(BUDGET), "--run-dir", str(run_dir),
                     "--worker-model", "test-model", "--base-url", server.base_url, "--data-dir", str(data_dir),
                     *extra])


def saved(run_dir: Path) -> dict:
    return json.loads((run_dir / "report" / "generalisation.json").read_text())


@pytest.fixture(scope="module")
def keyed_study(server, data_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("keyed") / "study"
    assert protocol(run_dir, server, data_dir, "verbatim_key", "--profile", PROFILE) == 0
    return run_dir


# for a test of the protocol's machinery, not of its readings: one placebo draw per seed where a
# verdict needs 7 (9 sessions instead of 27; the placebo sessions still run)
ONE_DRAW = ("--placebo-draws", "1")
# the generic rule is one instruction in every seed (seed-blind): no held-out verdict exists at any
# number of placebo draws, so its studies take one draw per seed, in the verifier ablation too (the
# optimizer and the seed again under each variant, with one placebo draw per seed and variant: 18
# sessions, not 54); the ablation's table and readings and the autopsy are what their tests read
RULE_VARIANTS = ("--variants", "decomposed,scalar", *ONE_DRAW)


@pytest.fixture(scope="module")
def rule_study(server, data_dir, tmp_path_factory):
    """The generic rule's protocol with two named verifier variants (read only by its tests; a test
    that runs the protocol again does so on a copy)."""
    run_dir = tmp_path_factory.mktemp("rule") / "study"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert protocol(run_dir, server, data_dir, "generic_rule", *RULE_VARIANTS, "--json") == 0
    (run_dir.parent / "printed.json").write_text(printed.getvalue())  # what a rerun's --json is compared with
    assert saved(run_dir)["answer"] == "seed-blind"  # why one draw per seed reads the same here
    return run_dir


def test_a_verbatim_key_shows_in_the_autopsy_and_is_never_read_as_transfer(keyed_study, capsys):
    result = saved(keyed_study)
    assert result["split"]["proven"] and not result["split"]["allowed_topic_shared"]
    finals = [r for r in result["autopsy"]["rows"] if r["final"]]
    assert [r["seed"] for r in finals] == [0, 1, 2]
    assert all(r["share"] > 0.3 and r["encoded"] == KEYED for r in finals)
    assert all(r["heldout"] is not None for r in finals)
    assert all(r["heldout"] is None for r in result["autopsy"]["rows"] if not r["final"])
    # the role column says both things a row can be: a best-so-far of the run, the candidate it returned
    md = (keyed_study / "report" / "report.md").read_text()
    autopsy_lines = md[md.index("## 4. Prompt autopsy"):].split("\n\n")[1].splitlines()[2:]
    roles = [line.split("|")[4].strip() for line in autopsy_lines]
    assert roles == [", ".join(n for n, on in (("accepted", r["accepted"]), ("final", r["final"])) if on)
                     for r in result["autopsy"]["rows"]]
    # the key pays on the questions it encodes, decided at the seed level
    rows = {r["subset"]: r for r in result["ablation"]["methods"][0]["rows"]}
    assert rows["train_encoded"]["gain"] > 0.5 and rows["train_encoded"]["sign"] == "+"
    assert result["answer"] != "transfer"
    text = " ".join(s["text"] for s in result["reading"])
    assert "Transfer:" not in text and "a rule, not a key" not in text
    assert "The final candidates hold an answer key" in text and "not independent" in text
    assert all(s["source"] for s in result["reading"])
    md = (keyed_study / "report" / "report.md").read_text()
    titles = ("## 1. Split proof", "## 2. Validation gain vs held-out gain", "## 3. Topic-shared ablation",
              "## 4. Prompt autopsy", "## Reading (generated from the decision rules)")
    order = [md.index(title) for title in titles]
    assert order == sorted(order)
    assert "not scored here" in md  # intermediate held-out rewards: said, not spent
    # the autopsy figure sits right below its table, before the reading
    assert md.index("## 4. Prompt autopsy") < md.index("![Prompt autopsy (figure)](figures/autopsy.png)") \
        < md.index("## Reading")
    assert (keyed_study / "report" / "figures" / "autopsy.png").stat().st_size > 5000
    html = (keyed_study / "report" / "report.html").read_text()
    assert html.index('id="table-autopsy"') < html.index('id="figure-autopsy"') < html.index('id="table-reading"')
    assert (keyed_study / "report" / "report.html").is_file()
    assert (keyed_study / "report" / "paper" / "autopsy.tex").is_file()


CHROMIUM = Path("/usr/bin/chromium")
LAYOUT_PROBE = """<script>
window.addEventListener('load', function () {
  var shown = function (el) { var r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  var blocks = Array.from(document.querySelectorAll('h1,h2,h3,p,table,img,figure,pre,ul,ol')).filter(shown);
  var overlaps = [];
  for (var i = 0; i < blocks.length; i++) {
    for (var j = i + 1; j < blocks.length; j++) {
      var a = blocks[i], b = blocks[j];
      if (a.contains(b) || b.contains(a)) continue;
      var r = a.getBoundingClientRect(), q = b.getBoundingClientRect();
      var w = Math.min(r.right, q.right) - Math.max(r.left, q.left);
      var h = Math.min(r.bottom, q.bottom) - Math.max(r.top, q.top);
      if (w > 1 && h > 1) overlaps.push(a.tagName + '/' + b.tagName + ' ' + (a.textContent || '').slice(0, 30));
    }
  }
  var imgs = Array.from(document.images);
  var out = document.createElement('pre');
  out.id = 'layout-check';
  out.textContent = 'tables=' + Array.from(document.querySelectorAll('table')).filter(shown).length
    + ' images=' + imgs.length + ' decoded=' + imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length
    + ' wider_than_page=' + (document.documentElement.scrollWidth > window.innerWidth)
    + ' overlaps=' + overlaps.length + ' ' + overlaps.slice(0, 3).join(' | ');
  document.body.appendChild(out);
});
</script></body>"""


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (/usr/bin/chromium absent)")
def test_the_report_renders_in_headless_chromium_with_nothing_overlapping(keyed_study, tmp_path):
    # a copy of the self-contained report gets a probe that measures the laid-out page
    page = tmp_path / "probe.html"
    page.write_text((keyed_study / "report" / "report.html").read_text().replace("</body>", LAYOUT_PROBE))
    done = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1280,900",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'id="layout-check">([^<]*)<', done.stdout)
    assert found, done.stdout[-2000:]
    check = found.group(1)
    tables, images, decoded = (int(re.search(rf"{k}=(\d+)", check).group(1)) for k in ("tables", "images", "decoded"))
    assert tables >= 5 and images >= 1 and decoded == images, check
    assert "wider_than_page=false" in check and "overlaps=0 " in check, check


def test_every_ledger_of_the_protocol_verifies(keyed_study, capsys):
    assert cli.main(["ledger", "verify", str(keyed_study)]) == 0
    out = capsys.readouterr().out
    assert "runs/ablation" in out and "protocol" in out and "INVALID" not in out and "authentic" in out


def test_a_family_level_key_is_read_as_memorisation_at_the_topic_level(server, data_dir, tmp_path):
    run_dir = tmp_path / "family"
    assert cli.main(["-q", "protocol", "generalisation", "--task", FAMILY_TASK, "--profile", "disjoint",
                     "--optimizer", "family_keyer=test_leak_readings:family_keyer", "--trusted-optimizer",
                     "--seeds", "0,1,2", "--budget", "10", "--run-dir", str(run_dir), "--worker-model",
                     "test-model", "--base-url", server.base_url]) == 0
    result = saved(run_dir)
    assert result["split"]["proven"]
    finals = [r for r in result["autopsy"]["rows"] if r["final"]]
    assert len(finals) == 3 and all(r["share"] > 0 and r["families"] >= 1 for r in finals)
    method = result["ablation"]["methods"][0]
    rows = {r["subset"]: r["sign"] for r in method["rows"]}
    assert rows["train_encoded"] == "+" and rows["probe_memorised"] == "+" and rows["test"] == "0"
    assert method["reading_rule"] == "topic-level-key"
    assert result["answer"] == "memorisation"
    text = " ".join(s["text"] for s in result["reading"])
    assert "Memorisation pays at the topic level" in text and "Transfer:" not in text


def test_a_generic_rule_holds_no_key_and_a_rerun_resumes_without_spending(rule_study, server, data_dir, tmp_path,
                                                                          capsys):
    result = saved(rule_study)
    assert result["autopsy"]["rows"] and all(r["share"] == 0.0 for r in result["autopsy"]["rows"])
    assert "Spearman correlation undefined: the answer-key share is the same" in result["autopsy"]["correlation_note"]
    assert "No final candidate holds an answer key" in " ".join(s["text"] for s in result["reading"])
    assert result["answer"] != "memorisation" and "Memorisation" not in " ".join(s["text"] for s in result["reading"])
    run_dir = tmp_path / "rule"
    shutil.copytree(rule_study, run_dir)
    records = sorted(run_dir.glob("runs/*/generic_rule/seed-*/run_record.json"))
    before = [p.read_text() for p in records]
    capsys.readouterr()
    assert protocol(run_dir, server, data_dir, "generic_rule", *RULE_VARIANTS, "--json") == 0
    again = json.loads(capsys.readouterr().out)
    assert [p.read_text() for p in records] == before  # finished cells are skipped, not rerun
    # printed against printed, and against the file: --json is strict JSON as generalisation.json is
    # (with one draw per seed the floor's interval is infinite: "-inf" in both, never -Infinity)
    assert again["comparison"] == json.loads((rule_study.parent / "printed.json").read_text())["comparison"] \
        == saved(rule_study)["comparison"]


def test_an_interrupted_protocol_exits_130_and_the_same_command_continues_it(server, data_dir, tmp_path, capsys,
                                                                           monkeypatch):
    # one placebo draw per seed (9 sessions, not 27): what is tested is stopping and continuing
    monkeypatch.setenv(INTERRUPTED_ONCE, str(tmp_path / "pressed"))
    run_dir = tmp_path / "stopped"
    assert protocol(run_dir, server, data_dir, "interrupted_once", *ONE_DRAW) == 130
    err = capsys.readouterr().err
    assert "re-run the same command to continue" in err and "Traceback" not in err
    assert not (run_dir / "report").exists()
    assert protocol(run_dir, server, data_dir, "interrupted_once", *ONE_DRAW) == 0
    assert saved(run_dir)["answer"]


def test_the_plan_prints_every_session_and_what_it_can_detect_and_writes_nothing(data_dir, tmp_path, capsys):
    run_dir = tmp_path / "planned"
    assert cli.main(["protocol", "generalisation", "--task", TASK, "--profile", PROFILE, "--optimizer", "reflective",
                     "--seeds", "0,1,2",
                     "--budget", "30", "--variants", "decomposed,scalar", "--run-dir", str(run_dir),
                     "--data-dir", str(data_dir), "--plan"]) == 0
    out = capsys.readouterr().out
    assert "topic-disjoint: PROVEN" in out and "study sessions (27, of which 21 placebo draws" in out
    assert sum(line.split()[:2] == [TASK, "reflective"] for line in out.splitlines()) == 3
    assert "total: 270 optimisation metric calls (study 90, verifier ablation 180)" in out
    for part in ("held-out comparison (3 verdicts against the placebo floor, Holm): placebo floor (7 draw(s) per seed) "
                 "over 3 seeds", "topic-shared ablation (up to 5 rows, Holm)", "verifier ablation: exact sign-flip over 3 "
                 "seeds: the smallest two-sided p is 0.25"):
        assert f"what it can detect: {part}" in out
    assert not run_dir.exists()


def test_a_profile_not_proven_topic_disjoint_is_refused_in_one_line(data_dir, tmp_path, capsys):
    run_dir = tmp_path / "shared"
    code = cli.main(["protocol", "generalisation", "--task", TASK, "--profile", SHARED, "--optimizer", "reflective",
                     "--budget", "10", "--run-dir", str(run_dir), "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "not proven topic-disjoint" in err and "--allow-topic-shared" in err
    assert not run_dir.exists()


def test_allow_topic_shared_runs_and_the_report_says_so(server, data_dir, tmp_path):
    run_dir = tmp_path / "allowed"
    assert protocol(run_dir, server, data_dir, "generic_rule", "--profile", SHARED, "--allow-topic-shared",
                    *ONE_DRAW) == 0
    result = saved(run_dir)
    assert result["answer"] == "seed-blind"  # one draw per seed decides what seven would: nothing
    assert result["split"]["allowed_topic_shared"] and not result["split"]["proven"]
    assert result["reading"][0]["text"].startswith("NOT PROVEN topic-disjoint")
    assert result["answer"] != "transfer"
    md = (run_dir / "report" / "report.md").read_text()
    assert "NOT PROVEN topic-disjoint; allowed by --allow-topic-shared (recorded)" in md
    start = json.loads((run_dir / "protocol" / "ledger.jsonl").read_text().splitlines()[0])
    assert start["data"]["split"]["allowed_topic_shared"] is True


def test_named_variants_add_the_verifier_table_and_its_readings(rule_study):
    run_dir = rule_study
    result = saved(run_dir)
    assert [r["variant"] for r in result["verifier"]["rows"]] == ["decomposed", "scalar"]
    # --placebo-draws reaches the verifier ablation's floor too: one draw per seed and variant
    placebo_runs = [p for p in (run_dir / "verifiers").rglob("run_record.json") if "placebo" in p.parts]
    assert len(placebo_runs) == 2 * 3, placebo_runs
    sources = [s["source"] for s in result["reading"]]
    assert "verdict seed-paired-contrast: scalar gaming gap" in sources
    md = (run_dir / "report" / "report.md").read_text()
    assert md.index("## 4. Prompt autopsy") < md.index("## 5. Verifier ablation") < md.index("## Reading")


# -- the answer table -------------------------------------------------------------------------------
def test_every_sign_pattern_has_one_answer_and_none_claims_what_its_signs_do_not_support():
    used = set()
    for key_pays, heldout, gap, proven in itertools.product((True, False), "+-0", "+-0", (True, False)):
        rule = gap_reading(key_pays, heldout, gap, proven)
        used.add(rule.name)
        text = rule.text.lower()
        if "memorisation:" in text:
            assert key_pays and heldout != "+"
        if text.startswith("transfer"):
            assert heldout == "+" and proven
        if "overstates" in text:
            assert gap == "+"
        if "neither" in text and "separates" in text:
            assert (key_pays, heldout, gap) == (False, "0", "0")
        if "no answer key earns" in text:
            assert not key_pays
    assert used == {r.name for r in GAP_READINGS}


def _record(method: str, seed: int, candidate: str, val: float, test: float,
            right: tuple[set[int], set[int]] | None = None) -> RunRecord:
    """A finished run; ``right``: the val and test example indices it answered (12 val, 24 test),
    else no per-example verdicts."""
    verdicts = [[{"example_id": f"{split}-{i}", "score": float(i in hits)} for i in range(n)]
                for split, n, hits in (("val", 12, right[0]), ("test", 24, right[1]))] if right else [[], []]
    if right:
        val, test = len(right[0]) / 12, len(right[1]) / 24
    return RunRecord(task=TASK, profile=PROFILE, seed=seed, method=method, status="ok", budget={}, policy={},
                     limits={}, options={}, drift=None, final_candidate={"instruction": candidate},
                     final_candidate_id=candidate, test_verdicts=verdicts[1], val_verdicts=verdicts[0], test_score=test,
                     val_score=val, usage={}, trajectory=[], lineage=[])


def _placebo(seeds=(0, 1, 2), draws=7, val=(0.35, 0.4, 0.45), test=(0.45, 0.5, 0.55)) -> list[RunRecord]:
    """Each seed's placebo draws (neutral re-wordings of the seed): scores that move with wording."""
    return [_record("placebo", s * STRIDE + k, f"p{s}-{k}", val[k % len(val)], test[k % len(test)])
            for s in seeds for k in range(draws)]


def test_a_seed_blind_optimizer_decides_nothing_however_its_one_run_scored():
    """One candidate in every seed, so every seed re-scores one run: the same +0.2 held-out and
    +0.3 validation gain three times is one draw, not three, against fresh placebo draws too."""
    records = [r for s in (0, 1, 2) for r in (_record("seed", s, "base", 0.4, 0.5), _record("blind", s, "same", 0.7, 0.7))]
    comparison = compare_heldout(records + _placebo(), "blind", {"val": 12, "test": 24})
    for verdict in (comparison.heldout, comparison.validation, comparison.gap):
        assert verdict.rule == "placebo-floor" and verdict.replayed and not verdict.decided and verdict.sign == "0"
        assert "one draw repeated" in verdict.sentence
    # a different candidate per seed, each above all of its seed's placebo draws: decided beyond the
    # seed's re-wording noise at 3 seeds (the smallest p of 3 seeds x 7 draws is 2/512)
    varied = [r for s in (0, 1, 2) for r in (_record("seed", s, "base", 0.4, 0.5),
                                             _record("opt", s, f"c{s}", 0.4, 0.7 + 0.01 * s))]
    held = compare_heldout(varied + _placebo(), "opt", {"val": 12, "test": 24}).heldout
    assert held.decided and held.sign == "+" and "beyond the seed's re-wording noise" in held.sentence
    # the same gain inside the placebo draws' own spread is re-wording noise
    inside = [r for s in (0, 1, 2) for r in (_record("seed", s, "base", 0.4, 0.5), _record("opt", s, f"c{s}", 0.4, 0.55))]
    assert not compare_heldout(inside + _placebo(), "opt", {"val": 12, "test": 24}).heldout.decided
    # without the floor there is no verdict against the seed: the command says how to get one
    with pytest.raises(GeneralisationError, match="no finished placebo draw"):
        compare_heldout(varied, "opt", {"val": 12, "test": 24})


def test_accepted_candidates_are_the_best_so_far_steps_then_the_final():
    record = RunRecord(task=TASK, profile=PROFILE, seed=0, method="m", status="ok", budget={}, policy={}, limits={},
                       options={}, drift=None, final_candidate={"instruction": "c"}, final_candidate_id="c",
                       test_verdicts=[], val_verdicts=[], test_score=None, val_score=None, usage={},
                       trajectory=[{"candidate_id": "a"}, {"candidate_id": "b"}, {"candidate_id": "a"}], lineage=[])
    assert accepted_candidates(record) == ["a", "b", "c"]


def test_a_protocol_file_says_what_the_flags_say(tmp_path):
    path = tmp_path / "protocol.toml"
    path.write_text('protocol = "generalisation"\nrun_dir = "runs/g"\ntask = "hotpotqa/distractor"\n'
                    'optimizer = "reflective"\nseeds = [0, 1, 2]\nbudget = 30\nvariants = ["decomposed", "scalar"]\n'
                    '[models]\nworker = "w"\nbase_url = "http://127.0.0.1:9/v1"\n')
    loaded = load_generalisation_file(path)
    (method,) = parse_methods(["reflective"], [])
    assert loaded.spec == GeneralisationSpec(task="hotpotqa/distractor", profile="topic-disjoint", optimizer=method,
                                             seeds=(0, 1, 2), budget=30, variants=("decomposed", "scalar"))
    assert loaded.run_dir == "runs/g"
    assert loaded.settings == {"worker_model": "w", "base_url": "http://127.0.0.1:9/v1"}


def protocol_file(path: Path, run_dir: Path, server, data_dir, optimizer: str) -> Path:
    """The study-file form of :func:`protocol` (same spec, same settings)."""
    path.write_text(f'protocol = "generalisation"\nrun_dir = "{run_dir}"\ntask = "{TASK}"\nprofile = "{PROFILE}"\n'
                    f'optimizer = "{optimizer}=test_generalisation_protocol:{optimizer}"\n'
                    f'seeds = [0, 1, 2]\nbudget = {BUDGET}\ndata_dir = "{data_dir}"\n'
                    f'[models]\nworker = "test-model"\nbase_url = "{server.base_url}"\n')
    return path


def without_paths(value, *roots: Path):
    """``value`` with each of ``roots`` written as ROOT (two run dirs' reports compared)."""
    text = json.dumps(value, sort_keys=True)
    for root in roots:
        text = text.replace(str(root), "ROOT")
    return json.loads(text)


def test_the_study_file_form_runs_the_same_protocol_as_the_flags(keyed_study, server, data_dir, tmp_path, capsys):
    """The file form continues a copy of the flags' run without its report: every session of the
    same spec is found finished and the report is written again from them. A file read as another
    spec fails here: the run refuses to continue as another experiment (another budget, other
    seeds: tried). Running the same protocol afresh from the file cost a second keyed study
    (11 CPU-s)."""
    run_dir = tmp_path / "from-file"
    shutil.copytree(keyed_study, run_dir)
    shutil.rmtree(run_dir / "report")
    records = sorted(run_dir.rglob("run_record.json"))
    before = [p.read_text() for p in records]
    study = protocol_file(tmp_path / "protocol.toml", run_dir, server, data_dir, "verbatim_key")
    # trust is the person's: the flag beside the file (the file may not say it)
    assert cli.main(["-q", "protocol", "generalisation", "--study", str(study), "--trusted-optimizer"]) == 0
    from_file, from_flags = saved(run_dir), saved(keyed_study)
    assert from_file["answer"] == from_flags["answer"] == "memorisation"
    for part in ("split", "comparison", "ablation", "autopsy", "reading"):
        assert without_paths(from_file[part], run_dir) == without_paths(from_flags[part], keyed_study), part
    assert [p.read_text() for p in records] == before and sorted(run_dir.rglob("run_record.json")) == records
    assert cli.main(["ledger", "verify", str(run_dir)]) == 0


def test_a_protocol_file_that_grants_itself_trust_is_refused_naming_the_flag(server, data_dir, tmp_path, capsys):
    study = protocol_file(tmp_path / "protocol.toml", tmp_path / "never", server, data_dir, "generic_rule")
    study.write_text(study.read_text().replace('budget =', 'trusted_optimizer = true\nbudget ='))
    code = cli.main(["protocol", "generalisation", "--study", str(study), "--trusted-optimizer"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "trusted_optimizer = true is refused" in err, err
    assert "--trusted-optimizer" in err and "HELDOUT_TRUSTED_OPTIMIZER=1" in err
    assert not (tmp_path / "never").exists()


def test_the_study_file_and_the_flags_are_one_or_the_other(server, data_dir, tmp_path, capsys):
    study = protocol_file(tmp_path / "protocol.toml", tmp_path / "never", server, data_dir, "generic_rule")
    code = cli.main(["protocol", "generalisation", "--study", str(study), "--budget", "9", "--seeds", "0,1,2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "drop --seeds, --budget" in err
    code = cli.main(["protocol", "generalisation", "--task", TASK, "--optimizer", "reflective"])
    err = capsys.readouterr().err
    assert code == 2 and "needs --study PROTOCOL.toml, or --budget, --run-dir" in err
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("text, says", [
    ('run_dir = "r"\ntask = "t"\noptimizer = "reflective"\nbudget = 3\nbudgets = 4\n', "unknown key 'budgets'"),
    ('run_dir = "r"\ntask = "t"\noptimizer = "reflective"\nbudget = true\n', "budget must be metric calls"),
    ('run_dir = "r"\ntask = "t"\noptimizer = "reflective"\n', "missing key 'budget'"),
    ('run_dir = "r"\ntask = "t"\noptimizer = "reflective"\nbudget = 3\nseeds = [1, 1]\n', "seeds must be distinct"),
    ('run_dir = "r"\ntask = "t"\noptimizer = "reflective"\nbudget = 3\n[models]\nmodel = "m"\n', "models.model"),
    ('protocol = "arms"\nrun_dir = "r"\ntask = "t"\noptimizer = "reflective"\nbudget = 3\n', "must be \"generalisation\""),
    ('task = [', "not valid TOML"),
])
def test_a_protocol_file_that_does_not_fit_is_one_clear_error(text, says, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(GeneralisationError, match=says) as caught:
        load_generalisation_file(path)
    assert "\n" not in str(caught.value)


SHADOWS = ("typing_extensions", "sniffio", "gepa")


@pytest.mark.skipif(__import__("shutil").which("bwrap") is None, reason="bubblewrap is not installed")
def test_the_protocol_run_in_the_users_folder_imports_none_of_its_modules(server, data_dir, tmp_path):
    """The protocol runs the seed baseline itself: a folder holding modules named like the
    harness's lazy imports must not supply them (issue 55); the user's optimizer runs isolated.
    With one placebo draw per seed every kind of session (the optimizer's, the seed baseline, a
    placebo draw, the ablation) and the report still run, so every lazy import still happens."""
    code, markers = tmp_path / "code", tmp_path / "markers"
    code.mkdir(mode=0o755)
    markers.mkdir()
    for name in SHADOWS:
        (code / f"{name}.py").write_text(f"import os\ntry:\n    open(os.path.join({str(markers)!r}, {name!r}), 'w')"
                                         ".close()\nexcept OSError:\n    pass\n")
    (code / "mine.py").write_text("def optimize(view, seed):\n    ids = [ex['id'] for ex in view.val][:4]\n"
                                  "    view.evaluate(view.seed_candidate, 'val', ids)\n"
                                  "    return dict(view.seed_candidate)\n")
    for path in code.iterdir():
        path.chmod(0o644)
    tmp_path.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("HELDOUT_TRUSTED_OPTIMIZER", None)
    done = subprocess.run([__import__("sys").executable, "-m", "heldout", "-q", "protocol", "generalisation",
                           "--task", TASK, "--profile", PROFILE, "--optimizer", "mine=mine:optimize",
                           "--seeds", "0,1,2", "--budget", str(BUDGET), "--run-dir", str(tmp_path / "run"),
                           "--worker-model", "test-model", "--base-url", server.base_url, "--data-dir", str(data_dir),
                           *ONE_DRAW],
                          cwd=code, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in markers.iterdir()) == []
    records = [RunRecord.load(p.parent) for p in (tmp_path / "run").rglob("run_record.json")]
    mine = [r for r in records if r.method == "mine"]
    assert len(mine) == 3 and all(r.status == "ok" and r.isolation.startswith("isolated (bwrap") for r in mine)


@pytest.mark.parametrize("baseline", ["seed", "placebo"])
def test_the_protocols_own_baselines_are_refused_as_the_optimizer_to_study(baseline, data_dir, tmp_path, capsys):
    # an optimizer named placebo would put its runs among the placebo draws it is compared with
    run_dir = tmp_path / "own"
    code = cli.main(["protocol", "generalisation", "--task", TASK, "--profile", SHARED, "--allow-topic-shared",
                     "--optimizer", baseline, "--budget", "10", "--run-dir", str(run_dir), "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is the protocol's baseline" in err
    assert not run_dir.exists()
