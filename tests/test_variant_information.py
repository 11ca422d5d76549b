"""A verifier variant changes one knob on every channel the optimizer sees.

The adversary is an optimizer that reads everything ``evaluate`` returns (GEPA and reflective
optimizers read feedback, OpenEvolve reads the output): under ``coarse:3`` or ``noisy:0.3`` it
would parse the exact objective out of the feedback ("objective 2.4975; ratio 0.947 ..."), the
dimensions or the output (an output graded against the shown target), and run under the
canonical verifier by another name. Specification: for every variant and task kind, no field of
what the optimizer saw predicts the canonical score better than the variant's own score does,
measured by the leave-one-out R^2 of a least-squares fit of the canonical score on the numbers
parsed from that field (plus, for text, whether it holds the shown target). The canonical
verifier shows the fields that carry the exact score, so the same measure proves it can see a
leak.

Real evaluators: circle_packing/square26 run in the sandbox (a program task with a continuous
objective) and a frozen user JSONL prompt task answered by the loopback model (which honours
answer keys, so each candidate is right on exactly the items it keys)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import heldout
from heldout.contracts import candidate_id
from heldout.data_manifests import MANIFEST_PATH_ENV
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient
from heldout.models.testserver import TestServer

import synthetic_code_words as synthetic

VARIANTS = ("coarse:3", "noisy:0.3", "scalar", "repeated:2")
FIELDS = ("valid", "dimensions", "feedback", "error", "error_kind", "output")
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
TOLERANCE = 0.02  # R^2 points: the feedback's "score 0.7883" is the variant score to 4 digits


def numbers_in(value: Any) -> list[float]:
    """Every number a reader finds in a field: numeric leaves and numbers written in its text."""
    if isinstance(value, bool):
        return [float(value)]
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, str):
        return [float(x) for x in NUMBER.findall(value)]
    if isinstance(value, dict):
        return [x for key in sorted(value) for x in numbers_in(value[key])]
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in numbers_in(item)]
    return []


def features(value: Any, target: Any) -> list[float]:
    """What a reader could pull out of one field: its first 24 numbers (padded), how many there
    are, and whether its text holds the shown target (an output graded by the reader)."""
    numbers = numbers_in(value)[:24]
    answer = target if isinstance(target, str) else None
    text = json.dumps(value, default=str).lower()
    holds = float(bool(answer) and answer.lower() in text)
    return numbers + [0.0] * (24 - len(numbers)) + [float(len(numbers)), holds]


def loo_r2(x: np.ndarray, y: np.ndarray) -> float:
    """Leave-one-out R^2 of an ordinary least-squares fit with intercept (constant columns and
    duplicates dropped): how well the columns predict ``y`` out of sample."""
    x = x[:, np.std(x, axis=0) > 1e-12]
    if x.size:
        x = np.unique(np.round(x, 12), axis=1)
    design = np.column_stack([np.ones(len(y)), x])
    errors = []
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        coef, *_ = np.linalg.lstsq(design[keep], y[keep], rcond=None)
        errors.append(y[i] - design[i] @ coef)
    total = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum(np.square(errors))) / total


def canonical_scores(run_dir: Path) -> dict[tuple[str, str], float]:
    """(candidate, example) -> the canonical score, from the session's ledger: under a variant the
    verdict it was derived from is kept beside what was shown (``scored``)."""
    out = {}
    for line in (run_dir / "ledger.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["kind"] == "evaluation":
            data = entry["data"]
            raw = data.get("scored", [data["verdict"]])[0]
            out[(data["candidate_id"], data["example_id"])] = raw["score"]
    return out


def information(run_dir: Path, seen: list[tuple[str, dict]]) -> dict[str, float]:
    """Per field, and for the shown score itself, the LOO R^2 of the canonical score on it."""
    truth = canonical_scores(run_dir)
    y = np.array([truth[(cid, shown["id"])] for cid, shown in seen])
    assert np.std(y) > 0.1, "the candidates must spread the canonical score"
    out = {"score": loo_r2(np.array([[shown["score"]] for _, shown in seen]), y)}
    for name in FIELDS:
        out[name] = loo_r2(np.array([features(shown.get(name), shown.get("target")) for _, shown in seen]), y)
    return out


def assert_no_field_beats_the_score(variant: str, r2: dict[str, float]) -> None:
    beaten = {f: round(v, 3) for f, v in r2.items() if f != "score" and v > r2["score"] + TOLERANCE}
    assert not beaten, f"{variant}: these fields predict the canonical score better than the shown score " \
                       f"(R^2 {r2['score']:.3f}): {beaten}"


# -- a program task: circle packing, scored in the sandbox ---------------------------------------
def packings(view, n: int = 24) -> list[dict[str, str]]:
    """The seed's 5 x 5 grid with its radius scaled, so the objective spreads over [1.25, 2.5]."""
    rng = random.Random(7)
    base = view.seed_candidate["program.py"]
    return [{"program.py": base.replace("r = 0.0999", f"r = {0.0999 * rng.uniform(0.5, 1.0):.6f}")}
            for _ in range(n)]


def run_program(variant: str, tmp_path: Path) -> tuple[Path, list[tuple[str, dict]]]:
    seen: list[tuple[str, dict]] = []

    def optimizer(view, seed):
        for candidate in packings(view):
            seen.extend((candidate_id(candidate), r) for r in view.evaluate(candidate, "train"))
        return view.seed_candidate

    run_dir = tmp_path / variant.replace(":", "-")
    record = Session("circle_packing/square26", budget=60, run_dir=run_dir, verifier=variant).run(optimizer)
    assert record.status == "ok", record.error
    return run_dir, seen


def test_the_canonical_verifier_states_the_program_objective_in_every_channel(tmp_path):
    """The measure sees a leak: under ``decomposed`` feedback, dimensions and output each
    determine the objective exactly."""
    r2 = information(*run_program("decomposed", tmp_path))
    assert r2["score"] > 0.999 and min(r2["feedback"], r2["dimensions"], r2["output"]) > 0.999, r2


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_channel_of_a_program_variant_beats_its_score(variant, tmp_path):
    r2 = information(*run_program(variant, tmp_path))
    assert_no_field_beats_the_score(variant, r2)
    if variant.startswith(("coarse", "noisy")):
        assert r2["score"] < 0.97, r2  # the knob really hides something on a continuous objective


# -- a prompt task: a frozen user JSONL task answered by the loopback model --------------------------
@pytest.fixture(scope="module")
def prompt_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("manifests")
    mp = pytest.MonkeyPatch()
    mp.setenv(MANIFEST_PATH_ENV, str(root))
    synthetic.freeze_task("user/code_words_variants", root)
    with TestServer(seed=0) as server:
        yield heldout.load_task("user/code_words_variants", "default"), server
    mp.undo()


def run_prompt(variant: str, prompt_task, tmp_path: Path) -> tuple[Path, list[tuple[str, dict]]]:
    task, server = prompt_task
    seen: list[tuple[str, dict]] = []

    def optimizer(view, seed):
        items = view.train[:12]
        rng = random.Random(11)
        for _ in range(8):  # each candidate keys a random half: right on exactly those items
            keyed = [ex for ex in items if rng.random() < 0.5]
            candidate = {"instruction": view.seed_candidate["instruction"] + "\nKnown answers:\n"
                         + "\n".join(synthetic.key_line(ex) for ex in keyed)}
            seen.extend((candidate_id(candidate), r) for r in view.evaluate(candidate, "train", [e["id"] for e in items]))
        return view.seed_candidate

    worker = ModelClient("test-model", base_url=server.base_url, api_key="k", concurrency=4)
    run_dir = tmp_path / variant.replace(":", "-")
    record = Session(task, budget=Budget(200), seed=0, models=SessionModels(worker=worker), run_dir=run_dir, verifier=variant).run(optimizer)
    assert record.status == "ok", record.error
    return run_dir, seen


def test_the_canonical_verifier_grades_the_prompt_answer_in_every_channel(prompt_task, tmp_path):
    r2 = information(*run_prompt("decomposed", prompt_task, tmp_path))
    assert min(r2["feedback"], r2["dimensions"], r2["output"]) > 0.99, r2


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_channel_of_a_prompt_variant_beats_its_score(variant, prompt_task, tmp_path):
    r2 = information(*run_prompt(variant, prompt_task, tmp_path))
    assert_no_field_beats_the_score(variant, r2)
    if variant.startswith("noisy"):
        assert r2["score"] < 0.97, r2
