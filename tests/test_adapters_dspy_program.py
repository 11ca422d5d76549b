"""A user's own DSPy program (``dspy-mipro?program=MODULE:FACTORY``, ``dspy-gepa?program=...``)
optimised through heldout's protected session: every program call is one metered, ledgered
metric call, DSPy's rendering of the program is the candidate the harness re-scores on test, the
user's module runs isolated unless trusted, and a module that raises fails the cell with its error."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("dspy", reason="the [dspy] extra is not installed (CI installs it)")
pytest.importorskip("optuna", reason="MIPROv2 needs optuna (the [dspy] extra installs it)")

import dspy  # noqa: E402

import heldout  # noqa: E402
from heldout.adapters.dspy import UserProgram, ViewBridge, heldout_examples, metric  # noqa: E402
from heldout.contracts import HeldoutError  # noqa: E402
from heldout.evaluators.ledger import LEDGER_FILE, verify_ledger  # noqa: E402
from heldout.evaluators.records import RunRecord  # noqa: E402
from heldout.evaluators.session import Budget, Session  # noqa: E402
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient  # noqa: E402
from heldout.models.server import ChatServer  # noqa: E402
from heldout.models.testserver import RecordingBackend, TestServer  # noqa: E402
from heldout.optimizers import is_reference_optimizer, resolve_optimizer, user_code  # noqa: E402
from heldout.protocols.run import Cell, Method, StudyConfig, cell_is_isolated, run_cell  # noqa: E402
from heldout.protocols.study import parse_methods  # noqa: E402
from heldout.protocols.study import StudyError, load_study  # noqa: E402

import dspy_programs  # noqa: E402  (tests/, on the path)

TASK = "bbh/word_sorting"  # default profile: 50/50/150


def ledger(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / LEDGER_FILE).read_text().splitlines()]


def events(entries: list[dict], kind: str) -> list[dict]:
    return [e["data"]["data"] for e in entries if e["kind"] == "optimizer_event" and e["data"]["kind"] == kind]


@pytest.fixture
def readable_dir():
    path = Path(tempfile.mkdtemp(prefix="heldout-test-dspy-program-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def word_sorting(data_dir):
    return heldout.load_task(TASK, data_dir=data_dir)


def run_program(server: TestServer, root: Path, spec: str, budget: int, *, trusted: bool = False) -> Path:
    cell = Cell(TASK, parse_methods([f"mine={spec}"], [])[0], seed=0, budget=budget)
    config = StudyConfig(run_root=str(root), worker_model="test", architect_model="test", base_url=server.base_url,
                         trusted_optimizer=trusted, wall_seconds=600)
    assert cell_is_isolated(cell, config) is not trusted
    run_cell(cell, config)
    return cell.run_dir(root)


def assert_rendered_candidate_was_scored(run_dir: Path, record: RunRecord) -> None:
    entries = ledger(run_dir)
    rendered = record.final_candidate["instruction"]
    # DSPy's chat adapter rendering of the ChainOfThought predictor, not heldout's instruction
    assert "Your output fields are:" in rendered and "`reasoning`" in rendered and "[[ ## answer ## ]]" in rendered
    assert record.final_candidate_id in {e["data"]["candidate_id"] for e in entries if e["kind"] == "evaluation"}
    test_rows = [e for e in entries if e["kind"] == "test_scoring"]
    assert len({e["data"]["example_id"] for e in test_rows}) == len(test_rows) == 150
    assert record.test_score is not None and 0.0 < record.test_score < 1.0
    assert all(e["data"]["split"] in ("train", "val") for e in entries if e["kind"] == "evaluation")
    event = events(entries, "dspy_run")[0]
    rows = [e for e in entries if e["kind"] == "evaluation"]
    # one ChainOfThought call = one LM call = one metric call, each on the ledger
    assert event["program"] == "UserProgram"
    assert event["worker_lm_calls"] == event["bridge_worker_calls"] == len(rows) == record.usage["metric_calls"]
    assert verify_ledger(run_dir).ok


def test_a_program_option_is_user_code_so_it_runs_isolated_unless_trusted(tmp_path, monkeypatch):
    (tmp_path / "mod.py").write_text("def build():\n    pass\n")  # found by path when the cell is decided
    monkeypatch.chdir(tmp_path)
    assert is_reference_optimizer("dspy-mipro") and not is_reference_optimizer("dspy-mipro?program=mod:build")
    assert user_code("dspy-gepa?program=mod:build") == user_code("dspy-gepa", {"program": "mod:build"}) == ["mod:build"]
    method = Method("mine", target="dspy-gepa", options={"program": "mod:build"})
    assert cell_is_isolated(Cell(TASK, method, 0, 10), StudyConfig(run_root="unused"))
    assert not cell_is_isolated(Cell(TASK, method, 0, 10), StudyConfig(run_root="unused", trusted_optimizer=True))
    with pytest.raises(HeldoutError, match="module:function"):
        resolve_optimizer("dspy-mipro?program=no_function_named")
    with pytest.raises(HeldoutError, match="takes no option program"):
        resolve_optimizer("seed?program=mod:build")


def test_the_study_file_form_names_the_program_in_the_methods_options(tmp_path):
    text = ('run_dir = "{root}"\ntasks = ["bbh/word_sorting"]\nbudget = 240\n'
            '[[methods]]\nname = "mine"\noptimizer = "dspy-mipro"\noptions = {{ program = "{program}" }}\n')
    good = tmp_path / "good.toml"
    good.write_text(text.format(root=tmp_path / "study", program="dspy_programs:chain_of_thought"))
    study = load_study(good)
    cell = study.cells()[0]
    assert cell.method.options == {"program": "dspy_programs:chain_of_thought"}
    assert cell_is_isolated(cell, study.config)
    bad = tmp_path / "bad.toml"
    bad.write_text(text.format(root=tmp_path / "study2", program="dspy_programs"))
    with pytest.raises(StudyError, match="module:function"):
        load_study(bad)


def test_a_pipeline_is_one_metric_call_per_program_call_and_its_steps_are_rendered_in_order(word_sorting,
                                                                                           readable_dir):
    with TestServer() as srv:
        (readable_dir / "run").mkdir()
        model = ModelClient("test", base_url=srv.base_url, api_key="k")
        view = Session(word_sorting, budget=Budget(10), seed=0, models=SessionModels(worker=model), run_dir=readable_dir / "run").view
        bridge = ViewBridge(view)
        program = UserProgram(view, bridge, dspy_programs.plan_then_answer())
        devset = heldout_examples(view, "train")[:4]
        result = dspy.Evaluate(devset=devset, metric=metric, num_threads=1, display_progress=False)(program)
        with dspy.context(trace=[]):
            answered = program(**devset[0].inputs())
            traced = [outputs for _, _, outputs in dspy.settings.trace]
    rendered = program.candidate()["instruction"]
    assert rendered.index("## Step 1: plan") < rendered.index("## Step 2: answer.predict")
    assert bridge.worker_calls == 4 + 1 == 10 - view.remaining and len(program.worker.history) == 2 * 5
    assert result.score == pytest.approx(100 * sum(p.heldout_verdict["score"] for _, p, _ in result.results) / 4)
    # the verdict rides on the program's answer only, never on a traced prediction (demos and
    # dspy.GEPA's reflective records are written from the trace)
    assert "heldout_verdict" in answered.keys() and len(traced) == 2
    assert all("heldout_verdict" not in outputs.keys() for outputs in traced)
    with pytest.raises(HeldoutError, match="returns a dspy.Module"):
        UserProgram(view, bridge, dspy_programs.not_a_module())


@pytest.mark.parametrize("library", ["dspy-mipro", "dspy-gepa"])
def test_a_users_chain_of_thought_is_optimised_through_heldout_isolated(library, readable_dir):
    budget = 240 if library == "dspy-mipro" else 80  # MIPROv2: two trials fit
    with TestServer() as srv:
        run_dir = run_program(srv, readable_dir / "study", f"{library}?program=dspy_programs:chain_of_thought", budget)
    record = RunRecord.load(run_dir)
    assert record.status == "ok", record.error
    launch = [e["data"] for e in ledger(run_dir) if e["kind"] == "optimizer_launch"][0]
    assert launch["options"] == {"program": "dspy_programs:chain_of_thought"}
    assert launch["readable"] == ["/sandbox/user/dspy_programs.py"]  # the user's file, nothing around it
    assert_rendered_candidate_was_scored(run_dir, record)


def test_a_module_that_raises_fails_the_cell_with_its_error(readable_dir):
    with TestServer() as srv:
        run_dir = run_program(srv, readable_dir / "study", "dspy-gepa?program=dspy_programs:broken", 40,
                              trusted=True)
    record = RunRecord.load(run_dir)
    entries = ledger(run_dir)
    assert record.status == "failed" and "ValueError: the user's module is broken" in record.error
    [error] = events(entries, "dspy_program_error")
    assert error["error"] == "ValueError: the user's module is broken"
    # the failing call's one evaluation was charged; nothing ran after the failure
    assert sum(1 for e in entries if e["kind"] == "evaluation") == record.usage["metric_calls"] == 1


REPR_MARKS = ("{'", "'extracted_", "'why'", "heldout_verdict")
DSPY_EXAMPLE = re.compile(r"Example\(\{.*?\}\) \(input_keys=\{[^}]*\}\)", re.DOTALL)  # how DSPy prints a train example


def test_no_python_repr_reaches_the_proposer_or_reflection_prompts(readable_dir):
    # every request the model server received, architect and worker: demos, reflective records
    # and proposer prompts are text a model would read, never a dict repr of a verdict
    for spec, budget in (("dspy-gepa", 80), ("dspy-mipro", 240), ("gepa", 106)):
        backend = RecordingBackend()
        with ChatServer(backend) as srv:
            run_dir = run_program(srv, readable_dir / spec, spec, budget, trusted=True)
        assert RunRecord.load(run_dir).status == "ok"
        # DSPy's proposer marks its inputs [[ ## x ## ]]; GEPA's reflection quotes the instruction in ```
        architect = [c for c in backend.calls if any(m in str(c.messages[-1].get("content")) for m in ("[[ ## ", "```"))]
        assert len(architect) >= 1, spec
        for call in backend.calls:
            # MIPROv2's data-aware proposer shows train examples as DSPy prints them, Example({...}),
            # as it does for every DSPy user: their inputs, the train target and the example's ref
            text = DSPY_EXAMPLE.sub("Example(...)", "\n".join(str(m.get("content", "")) for m in call.messages))
            assert not any(mark in text for mark in REPR_MARKS), (spec, text[:2000])


@pytest.mark.parametrize("verifier", ["scalar", "coarse:3", "noisy:0.1", "repeated:2"])
@pytest.mark.parametrize("library", ["gepa", "dspy-gepa"])
def test_the_librarys_count_and_the_ledgers_differ_only_by_what_the_event_names(library, verifier, readable_dir):
    k = int(verifier.partition(":")[2]) if verifier.startswith("repeated") else 1
    budget = 120 * k  # above gepa's minimum (106 program calls, each K metric calls under repeated:K)
    with TestServer() as srv:
        cell = Cell(TASK, Method(library), seed=0, budget=budget, verifier=verifier)
        config = StudyConfig(run_root=str(readable_dir), worker_model="test", architect_model="test",
                             base_url=srv.base_url, wall_seconds=600)
        run_cell(cell, config)
    run_dir = cell.run_dir(readable_dir)
    record, entries = RunRecord.load(run_dir), ledger(run_dir)
    assert record.status == "ok", record.error
    charged = sum(e["data"]["cost"] for e in entries if e["kind"] == "evaluation")
    assert charged == record.usage["metric_calls"] <= budget
    if library == "gepa":
        event = events(entries, "gepa_run")[0]
        # GEPA counts a validation example as one call whatever it costs
        assert event["gepa_total_metric_calls"] + event["val_calls_gepa_did_not_count"] == charged
        val_examples = sum(1 for e in entries if e["kind"] == "evaluation" and e["data"]["split"] == "val")
        assert event["val_calls_gepa_did_not_count"] == (k - 1) * val_examples
    else:
        event = events(entries, "dspy_run")[0]
        # dspy.GEPA counts one call per rollout, refused ones too; the view charges K per scored one
        assert event["metric_calls_charged"] == charged
        assert event["bridge_worker_calls"] + event["charged_beyond_dspy_count"] == charged
        assert event["charged_beyond_dspy_count"] == (k - 1) * event["bridge_worker_calls"]
        assert event["gepa_total_metric_calls"] == event["bridge_worker_calls"] + event["refusals"]
