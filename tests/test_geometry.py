"""Geometry program tasks: every published construction scores its verified value through the full
path (a program returning it, run in the sandbox), tolerance is explicit, nothing claimed is trusted."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from heldout.contracts import RunLimits
from heldout.benchmarks.geometry import TASKS, GeometryError, scoring
from heldout.benchmarks.loading import load_task
from heldout.benchmarks.registry import get_benchmark
from heldout.cli import main as cli_main

LIMITS = RunLimits(wall_seconds=60, cpu_seconds=60, memory_mb=2048, max_output_bytes=64 * 1024 * 1024)
REL = 1e-12


def constructions(data_dir: Path, file: str) -> list[dict]:
    return json.loads((data_dir / "constructions" / file).read_text())["constructions"]


def program(entry: str, body: str) -> dict[str, str]:
    return {"program.py": f"import numpy as np\n\n\ndef {entry}():\n" + "".join(f"    {l}\n" for l in body.splitlines())}


def packing_program(entry: str, centers, radii) -> dict[str, str]:
    return program(entry, f"c = np.array({json.dumps(centers)})\nr = np.array({json.dumps(radii)})\n"
                          "return np.column_stack([c, r])")


def run(task: str, candidate: dict[str, str], tolerance: float | None = None):
    bench = get_benchmark(task)
    example = bench.load_raw(None)[0]
    return bench.run(candidate, example, bench.context(LIMITS, tolerance=tolerance))


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# -- fidelity: every construction through the sandbox ---------------------------------------------
SQUARE_IDS = ["alphaevolve_2025_B12_construction1", "alphaevolve_repo_of_problems_centers_26",
              "thetaevolve_8B_RL65_formal", "shinkaevolve_via_thetaevolve", "codeevolve_gemini_mp_insp",
              "thetaevolve_8B_RL65_tol1e-6"]


@pytest.mark.parametrize("cid", SQUARE_IDS)
def test_square26_constructions_score_their_computed_sum(data_dir, cid):
    c = next(c for c in constructions(data_dir, "circle_packing_square_n26.json") if c["id"] == cid)
    cand = packing_program("circle_packing26", c["centers"], c["radii"])
    strict = run("circle_packing/square26", cand)
    assert strict.valid is c["valid_float_tol0"]
    loose = run("circle_packing/square26", cand, tolerance=1e-6)
    assert loose.valid and rel(loose.dimensions["objective"], c["sum_radii_numpy"]) <= REL
    assert loose.dimensions["tolerance"] == 1e-6 and "tolerance 1e-06" in loose.feedback
    if strict.valid:
        assert rel(strict.score, c["sum_radii_numpy"]) <= REL
    else:
        assert strict.score == 0.0 and strict.error_kind == "invalid" and "overlap: circles" in strict.feedback


def test_thetaevolve_tolerance_only_packing_is_rejected_at_zero_and_accepted_at_1e_6(data_dir):
    c = next(c for c in constructions(data_dir, "circle_packing_square_n26.json") if c["id"] == "thetaevolve_8B_RL65_tol1e-6")
    cand = packing_program("circle_packing26", c["centers"], c["radii"])
    strict = run("circle_packing/square26", cand)
    assert not strict.valid and strict.score == 0.0
    # the feedback names the offending pair and the amount (3.1e-7)
    assert "overlap: circles" in strict.feedback and "3.09e-07" in strict.feedback
    assert run("circle_packing/square26", cand, tolerance=1e-6).score == pytest.approx(2.6359856612408987, rel=1e-15)


@pytest.mark.parametrize("cid", ["alphaevolve_2025_B13", "alphaevolve_repo_of_problems_21", "codeevolve_gemini_mp_insp"])
def test_rect21_constructions_score_their_computed_sum(data_dir, cid):
    c = next(c for c in constructions(data_dir, "circle_packing_rect_n21.json") if c["id"] == cid)
    cand = packing_program("circle_packing21", c["centers"], c["radii"])
    strict = run("circle_packing/rect21", cand)
    assert strict.valid is c["valid_float_tol0_bbox"]
    loose = run("circle_packing/rect21", cand, tolerance=1e-6)
    assert loose.valid and rel(loose.score, c["sum_radii_numpy"]) <= REL


def test_heilbronn_triangle_construction(data_dir):
    c = constructions(data_dir, "heilbronn_triangle_n11.json")[0]
    v = run("heilbronn/triangle11", program("heilbronn_triangle11", f"return np.array({json.dumps(c['points'])})"))
    assert v.valid and rel(v.score, c["score_float_reference"]) <= REL
    assert v.dimensions["ratio"] == pytest.approx(1.0, rel=REL)


def test_heilbronn_convex_construction(data_dir):
    c = constructions(data_dir, "heilbronn_convex_n13.json")[0]
    v = run("heilbronn/convex13", program("heilbronn_convex13", f"return np.array({json.dumps(c['points'])})"))
    assert v.valid and rel(v.score, c["score_float_reference"]) <= REL


def test_minmax_constructions(data_dir):
    for c in constructions(data_dir, "minmax_distance_d3_n14.json"):
        v = run("minmax/d3n14", program("min_max_dist_dim3_14", f"return np.array({json.dumps(c['points'])})"))
        assert v.valid and rel(v.score, c["score_(dmin/dmax)^2_float"]) <= REL


def test_ac2_constructions_including_50000_steps(data_dir):
    for c in constructions(data_dir, "autocorrelation_second.json"):
        body = f"h = np.array({json.dumps(c['heights'])})\nreturn h, 0.0, 0.0, len(h)"
        v = run("autocorrelation/second", program("run", body))
        assert v.valid, v.error
        assert rel(v.score, c["C2_vectorized_float"]) <= REL
        assert rel(v.score, c["C2_reference_loop_float"]) <= 1e-13
        assert "claims C2 = 0.0" in v.feedback  # the claim is compared, never used


def test_extra_instances_score_through_the_same_rules(data_dir):
    c = constructions(data_dir, "heilbronn_convex_n14.json")[0]
    assert rel(scoring.heilbronn_convex(c["points"], n=14).objective, c["score_float_reference"]) <= REL
    for c in constructions(data_dir, "minmax_distance_d2_n16.json"):
        got = scoring.min_max_distance(c["points"], n=16, d=2).objective
        assert rel(got, c["score_(dmin/dmax)^2_float"]) <= REL


# -- claims and cheats -----------------------------------------------------------------------------
def test_run_packing_claiming_more_than_it_has_gets_the_recomputed_sum(data_dir):
    c = constructions(data_dir, "circle_packing_square_n26.json")[0]
    body = (f"c = np.array({json.dumps(c['centers'])})\nr = np.array({json.dumps(c['radii'])})\n"
            "return c, r, 2.7")
    v = run("circle_packing/square26", program("run_packing", body))
    assert v.valid and v.output["entry"] == "run_packing"
    assert rel(v.score, c["sum_radii_numpy"]) <= REL
    assert v.output["claimed"] == 2.7 and "claims sum of radii = 2.7" in v.feedback


def test_nan_centre_packing_is_rejected_before_any_comparison():
    body = ("rows = [[0.1 + 0.2 * (i % 5), 0.1 + 0.2 * (i // 5), 0.0999] for i in range(25)]\n"
            "rows.append([float('nan'), float('nan'), 0.5])\nreturn np.array(rows)")
    v = run("circle_packing/square26", program("circle_packing26", body))
    assert not v.valid and v.score == 0.0 and v.error_kind == "bad_output" and "non-finite" in v.error
    rect = run("circle_packing/rect21", program("circle_packing21", "a = np.zeros((21, 3))\na[0, 0] = np.nan\n"
                                                "a[:, 2] = 1.0\nreturn a"))
    assert rect.error_kind == "bad_output"
    ac2 = run("autocorrelation/second", program("run", "h = np.ones(10)\nh[3] = np.inf\nreturn h, 1.0, 0.0, 10"))
    assert ac2.error_kind == "bad_output"


def test_violations_name_the_circles_and_the_host_side():
    body = "a = np.array([[0.1 + 0.2 * (i % 5), 0.1 + 0.2 * (i // 5), 0.0999] for i in range(26)])\n" \
           "a[25] = [0.95, 0.95, 0.2]\nreturn a"
    v = run("circle_packing/square26", program("circle_packing26", body))
    assert not v.valid
    assert "circle 25 leaves the square (right side) by 0.15" in v.feedback
    assert "overlap: circles 24 and 25" in v.feedback
    assert v.output["violations"] and "limits: 60 s wall" in v.feedback


def test_ac2_negative_tiny_huge_and_list_inputs():
    assert scoring.autocorrelation_c2([1.0, -1e-3, 1.0]).error_kind == "invalid"
    assert scoring.autocorrelation_c2([1.0, -1e-12, 1.0], tol=1e-10).valid  # declared tolerance, then clipped
    base = scoring.autocorrelation_c2([0.3, 1.0, 0.0, 0.7]).objective
    # values around 1e-161 would underflow the raw convolution; normalising by max f keeps the value
    assert scoring.autocorrelation_c2([0.3e-161, 1e-161, 0.0, 0.7e-161]).objective == pytest.approx(base, rel=1e-14)
    assert scoring.autocorrelation_c2([0.0, 0.0]).error_kind == "invalid"
    assert scoring.autocorrelation_c2(np.ones(11).tolist(), max_steps=10).error_kind == "bad_output"
    assert scoring.autocorrelation_c2([[1.0, 2.0]]).error_kind == "bad_output"  # shape
    assert scoring.autocorrelation_c2(["1", "x"]).error_kind == "bad_output"


def test_ac2_fft_matches_direct_convolution_on_random_input():
    rng = np.random.default_rng(5)
    h = rng.uniform(size=3000)
    got = scoring.autocorrelation_c2(h.tolist()).objective
    conv = np.convolve(h, h)
    y = np.concatenate(([0.0], conv, [0.0]))
    direct = np.sum(y[:-1] ** 2 + y[:-1] * y[1:] + y[1:] ** 2) / 3 / (np.sum(conv) * conv.max())
    assert got == pytest.approx(direct, rel=1e-12)


def test_heilbronn_point_outside_and_degenerate_inputs():
    inside = [[0.5, 0.2]] * 10
    out = scoring.heilbronn_triangle(inside + [[0.5, -1e-9]])
    assert not out.valid and "below the base" in out.violations[0]
    assert scoring.heilbronn_triangle(inside + [[0.5, -1e-9]], tol=1e-6).valid
    line = [[float(i), 2.0 * i] for i in range(13)]
    assert scoring.heilbronn_convex(line).error_kind == "invalid"
    same = scoring.min_max_distance([[0.0, 0.0, 0.0]] * 2 + [[float(i), 0.0, 1.0] for i in range(12)])
    assert same.valid and same.objective == 0.0


def test_a_program_without_the_entry_point_crashes_clearly():
    v = run("heilbronn/convex13", {"program.py": "def something_else():\n    return 1\n"})
    assert v.error_kind == "crash" and "heilbronn_convex13" in v.error and v.score == 0.0


def test_wrong_shapes_and_types_are_bad_output():
    v = run("minmax/d3n14", program("min_max_dist_dim3_14", "return np.zeros((13, 3))"))
    assert v.error_kind == "bad_output" and "(13, 3)" in v.error
    v = run("autocorrelation/second", program("run", "return [1.0, 2.0]"))
    assert v.error_kind == "bad_output"
    v = run("circle_packing/square26", program("run_packing", "return 'nothing'"))
    assert v.error_kind == "bad_output"


def test_malformed_candidates_get_a_clear_verdict_not_an_exception():
    v = run("minmax/d3n14", {"a.py": "x=1\n", "b.py": "y=2\n"})
    assert v.error_kind == "malformed_candidate" and "program.py" in v.error
    v = run("minmax/d3n14", {"program.py": "x=1\n", "../evil.py": "x=2\n"})
    assert v.error_kind == "malformed_candidate"
    v = run("minmax/d3n14", {})
    assert v.error_kind == "malformed_candidate"


def test_a_bad_tolerance_is_the_callers_error():
    bench = get_benchmark("minmax/d3n14")
    for tol in (-1e-6, float("nan")):
        with pytest.raises(GeometryError, match="tolerance"):
            bench.run(bench.seed_candidate(), bench.load_raw(None)[0], bench.context(LIMITS, tolerance=tol))


# -- tasks, manifests, CLI -------------------------------------------------------------------------
@pytest.mark.parametrize("task", [t.name for t in TASKS])
def test_each_seed_is_valid_and_loads_through_its_manifest(task):
    loaded = load_task(task)
    assert [ex.id for ex in loaded.split("train")] == [ex.id for ex in loaded.split("test")] == ["instance"]
    assert "train = test" in loaded.manifest.notes["default"]
    bench = loaded.benchmark
    v = bench.run(bench.seed_candidate(), loaded.split("test")[0], bench.context(LIMITS))
    assert v.valid and v.score > 0 and math.isfinite(v.dimensions["ratio"])


def test_cli_eval_seed_and_construction_file_with_tolerance(data_dir, tmp_path, capsys):
    assert cli_main(["eval", "--task", "circle_packing/rect21", "--json"]) == 0
    seed = json.loads(capsys.readouterr().out)
    assert seed["valid"] and seed["tolerance"] == 0.0 and seed["error"] is None
    assert {"task", "valid", "score", "objective", "tolerance", "error"} <= set(seed)

    c = next(c for c in constructions(data_dir, "circle_packing_square_n26.json") if c["id"] == "thetaevolve_8B_RL65_tol1e-6")
    path = tmp_path / "theta.py"
    path.write_text(packing_program("circle_packing26", c["centers"], c["radii"])["program.py"])
    assert cli_main(["eval", "--task", "circle_packing/square26", "--candidate", str(path), "--json"]) == 1
    strict = json.loads(capsys.readouterr().out)
    assert not strict["valid"] and strict["score"] == 0.0 and "overlap" in strict["error"]
    assert cli_main(["eval", "--task", "circle_packing/square26", "--candidate", str(path), "--tolerance", "1e-6",
                     "--json"]) == 0
    loose = json.loads(capsys.readouterr().out)
    assert loose["valid"] and loose["tolerance"] == 1e-6
    assert loose["objective"] == pytest.approx(2.6359856612408987, rel=1e-15)
    assert "2.6358627564136983" in json.dumps(loose["ratio_reference"])
