"""The verifier ablation: a weak verifier that is exploitable by construction shows a gaming gap.

The adversary is a scripted *gaming* optimizer on MBPP+ (real problems, real sandboxed tests).
It runs under the ``leaky-val`` policy (stated in every record), so the val targets are visible to
it: each problem's base test inputs and its reference solution. Its one candidate is a prompt
whose instruction embeds, per val problem, a ```python block that answers *only the base inputs*
(through the reference solution) and returns None for anything else: the shape of a candidate that
memorised the tests it was scored on. The loopback test model answers "Name the function `f`"
with the instruction's block defining ``f`` (the deterministic backend's keyed-code rule).

Under ``tests:base-only`` the optimizer is rewarded for it (base tests pass); under the canonical
verifier (base + plus tests) the same candidate earns nothing; on held-out problems it has no code
at all. The ablation must show exactly that, and must not call it decided: one candidate in every
seed on 3 val and 3 held-out problems gives a gap of 1 with zero variance over seeds, which no
calibrated seed-level test can separate from 0 at 3 seeds (a paired t would read it as p = 0)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import HeldoutError
from heldout.data_manifests import MANIFEST_PATH_ENV, Manifest
from heldout.models.testserver import TestServer
from heldout.protocols.run import Method, StudyConfig
from heldout.protocols.verifier_ablation import plan_ablation, run_ablation

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = os.environ.get("HELDOUT_DATA_DIR", str(REPO.parent / "shared" / "data"))
MBPP_FILE = Path(DATA_DIR) / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl"
pytestmark = pytest.mark.skipif(not MBPP_FILE.is_file(), reason=f"MBPP+ release file not found at {MBPP_FILE}")

PROFILE = "ablation-tiny"
# Non-recursive problems with plain integer arguments (the guard keys on their JSON).
SPLIT = {"train": ["Mbpp/234", "Mbpp/67"], "val": ["Mbpp/3", "Mbpp/80", "Mbpp/86"],
         "test": ["Mbpp/17", "Mbpp/59", "Mbpp/135"]}
SEEN: list[list[dict]] = []  # every view result the gaming optimizer received, per session


def base_only_block(entry: str, reference: str, base_inputs: list) -> str:
    keys = sorted(json.dumps(args) for args in base_inputs)
    renamed = reference.strip().replace(f"def {entry}(", f"def _reference_{entry}(")
    return (f"```python\nimport json as _json\n\n{renamed}\n\n_BASE_INPUTS = set({keys!r})\n\n"
            f"def {entry}(*args):\n"
            f"    if _json.dumps(list(args)) in _BASE_INPUTS:\n"
            f"        return _reference_{entry}(*args)\n"
            f"    return None\n```")


def gaming_optimizer(view, seed):
    """Read the val targets (leaky-val), special-case the base inputs, evaluate once, return it."""
    seen = view.evaluate(view.seed_candidate, "val")
    entries = {ex["id"]: ex["input"]["entry_point"] for ex in view.val}
    blocks = [base_only_block(entries[r["id"]], r["target"]["canonical_solution"], r["target"]["base_input"])
              for r in seen]
    candidate = {"instruction": view.seed_candidate["instruction"] + "\n\n" + "\n\n".join(blocks)}
    SEEN.append(seen + view.evaluate(candidate, "val"))
    return candidate


@pytest.fixture(scope="module")
def manifest_root(tmp_path_factory):
    """The shipped MBPP+ manifest plus a tiny profile, on the manifest search path."""
    root = tmp_path_factory.mktemp("manifests")
    manifest = Manifest.load("mbpp_plus")
    manifest.profiles[PROFILE] = {k: list(v) for k, v in SPLIT.items()}
    manifest.notes[PROFILE] = "verifier-ablation test: 2/3/3 hand-picked problems"
    manifest.save(root)
    old = os.environ.get(MANIFEST_PATH_ENV)
    os.environ[MANIFEST_PATH_ENV] = str(root)
    yield root
    if old is None:
        os.environ.pop(MANIFEST_PATH_ENV)
    else:
        os.environ[MANIFEST_PATH_ENV] = old


@pytest.fixture(scope="module")
def server():
    with TestServer() as srv:
        yield srv


def run(tmp_path, server, variants, seeds, placebo_draws=1):
    """One placebo draw per seed and variant: the floor's rule, its sign and its reading are the
    same at any number of draws (the gaming candidate's gap is 1 against draws that are all 0), and
    each draw is a session per variant (2 draws ran 24 sessions for the three-seed case, 1 runs 18)."""
    SEEN.clear()
    plan = plan_ablation("mbpp_plus", Method("gaming", f"{__name__}:gaming_optimizer"), variants, seeds, 12,
                         profile=PROFILE, data_dir=DATA_DIR, placebo_draws=placebo_draws)
    config = StudyConfig(run_root=str(tmp_path / "ablation"), data_dir=DATA_DIR, policy="leaky-val",
                         worker_model="heldout-test", base_url=server.base_url,
                         trusted_optimizer=True)  # the test's own scripted optimizer, observed in-process
    return plan, run_ablation(plan, config)


def ledger(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "ledger.jsonl").read_text().splitlines()]


def test_a_base_only_verifier_is_gamed_and_the_canonical_one_is_not(tmp_path, manifest_root, server):
    plan, result = run(tmp_path, server, ["decomposed", "tests:base-only"], [0, 1, 2])
    weak, canonical = result.row("tests:base-only"), result.row("decomposed")
    # the same candidate in every session: the comparison is of verifiers, not of candidates
    assert len(set(weak.final_candidates + canonical.final_candidates)) == 1

    assert weak.val_gain == [1.0, 1.0, 1.0]  # base tests pass on every val problem, the seed's answer has no code
    assert weak.transfer == [0.0, 0.0, 0.0]  # held-out problems: no code for them, like the seed
    assert weak.mean_gap == 1.0
    # the seed side is each seed's placebo draws (neutral re-wordings of the seed: no code either)
    assert weak.floor_gap == {0: [0.0], 1: [0.0], 2: [0.0]}  # one draw per seed, as asked
    # one candidate in every seed, the same gap of 1 on every seed: one run repeated, which a paired t
    # would read as p = 0. Against fresh placebo draws it is one draw, so nothing is decided and the
    # reading says the seeds replicate nothing: the gap is measured, not decided
    verdict = weak.gap_verdict
    assert verdict.rule == "placebo-floor" and verdict.sign == "0" and verdict.family == 3 and weak.replayed
    assert "gaming gap +1.000" in weak.reading and "the seeds replicate nothing: one run's number" in weak.reading
    assert "overstates held-out transfer" not in weak.reading

    assert canonical.val_gain == [0.0] * 3 and canonical.transfer == [0.0] * 3  # plus tests fail
    assert canonical.mean_gap == 0.0 and canonical.gap_verdict.sign == "0"
    assert "the seeds replicate nothing" in canonical.reading  # the same one candidate, re-scored
    # the weak verifier's transfer is no different from the canonical one's: both gain nothing held-out
    versus = weak.transfer_vs_canonical
    assert versus.sign == "0" and versus.seeds == (0, 1, 2) and canonical.transfer_vs_canonical is None

    # the held-out verdicts of the weak-verifier runs are canonical: base and plus dimensions
    text = result.describe()
    assert "tests:base-only" in text and "leaky-val" in text
    assert "transfer under tests:base-only vs decomposed: cannot separate" in text
    saved = json.loads((tmp_path / "ablation" / "verifier_ablation.json").read_text())
    assert saved["rows"][1]["variant"] == "tests:base-only" and saved["rows"][1]["mean_gap"] == 1.0


def test_canonical_feedback_never_reaches_the_optimizer_under_scalar(tmp_path, manifest_root, server):
    plan, result = run(tmp_path, server, ["scalar", "coarse:3+scalar"], [0])
    # even under leaky-val (every field shown), the optimizer sees the variant's verdicts only
    for seen in SEEN:
        assert seen and all(not r["dimensions"] for r in seen)
        assert all("base:" not in r["feedback"] and "plus:" not in r["feedback"] for r in seen)
        assert all(r["feedback"].startswith("score ") for r in seen)
    for variant in ("scalar", "coarse:3+scalar"):
        run_dir = plan.cell("gaming", variant, 0).run_dir(tmp_path / "ablation")
        entries = ledger(run_dir)
        evaluations = [e["data"] for e in entries if e["kind"] == "evaluation"]
        assert len(evaluations) == 6
        for data in evaluations:
            shown, (raw,) = data["verdict"], data["scored"]
            assert not shown["dimensions"] and raw["feedback"] not in shown["feedback"]
            assert set(raw["dimensions"]) == {"base", "plus"}  # the canonical verdict existed, beside it
        gamed = evaluations[3:]  # the gaming candidate's: the canonical feedback has the test counts
        assert all("base: pass" in d["scored"][0]["feedback"] and "base:" not in d["verdict"]["feedback"]
                   for d in gamed)
        held_out = [e["data"] for e in entries if e["kind"] == "test_scoring"]
        assert held_out and all(d["verifier"] == "decomposed" and "plus" in d["verdict"]["dimensions"]
                                for d in held_out)


def cli(warm_cli, *args: str) -> subprocess.CompletedProcess:
    """The real command (tests/conftest.py: warm_cli)."""
    return warm_cli.run(*args, cwd=REPO, env={**os.environ, "HELDOUT_DATA_DIR": DATA_DIR})


def test_the_plan_lists_every_session_with_its_budget_and_runs_nothing(warm_cli, tmp_path, manifest_root):
    done = cli(warm_cli, "compare", "verifiers", "--task", "mbpp_plus", "--profile", PROFILE, "--optimizer",
               "reflective", "--variants", "decomposed,scalar,coarse:3,repeated:2", "--seeds", "0,1", "--budget", "30",
               "--run-dir", str(tmp_path / "d"), "--plan")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # 16 sessions of the design, and 10 placebo draws per seed and variant (3 seeds' worth: 2 decide nothing)
    assert "96 sessions (80 of them placebo draws)" in lines[0]
    assert sum(line.split()[0] == "placebo" for line in lines[2:] if line.strip()) == 4
    assert sum(line.split()[0] == "reflective" for line in lines[2:] if line.strip()) == 8
    # two seeds: the summary would attempt no verdict, and the plan says so before anything is spent
    assert "what it can detect: 2 seed(s): no verdict is attempted" in done.stdout
    assert "optimisation budget: 240 metric calls" in done.stdout and "repeated:2 spend K" in done.stdout
    assert not (tmp_path / "d").exists()
    fewer = cli(warm_cli, "compare", "verifiers", "--task", "mbpp_plus", "--profile", PROFILE, "--optimizer",
                "reflective", "--variants", "decomposed,scalar", "--seeds", "0,1,2", "--budget", "30",
                "--placebo-draws", "2", "--run-dir", str(tmp_path / "d"), "--plan")
    assert fewer.returncode == 0, fewer.stderr
    assert "24 sessions (12 of them placebo draws)" in fewer.stdout.splitlines()[0]


def test_a_bad_variant_is_one_clear_line(warm_cli, tmp_path, manifest_root):
    done = cli(warm_cli, "compare", "verifiers", "--task", "mbpp_plus", "--profile", PROFILE, "--optimizer",
               "reflective", "--variants", "decomposed,tests:count-only", "--budget", "5", "--run-dir",
               str(tmp_path / "d"), "--plan")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "no test set 'count-only'" in done.stderr and "base-only" in done.stderr
    for baseline in ("seed", "placebo"):  # the floor's own cells: an optimizer of that name would be read as them
        with pytest.raises(HeldoutError, match="is part of every ablation"):
            plan_ablation("mbpp_plus", Method(baseline, baseline), ["scalar"], [0], 5, profile=PROFILE,
                          data_dir=DATA_DIR)
    assert get_benchmark("mbpp_plus").verifier_options == {"base-only": {"tests": "base"}}
