"""``vliw/takehome``: the benchmark (spec section 5), the seed = 147,734 cycles, candidates built in
the sandbox and run on hidden instances, and every way a candidate can be wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heldout import load_task
from heldout.contracts import Example, RunLimits
from heldout.benchmarks.vliw import simulate
from heldout.benchmarks.vliw.benchmark import (
    BASELINE_CYCLES, HASH_STAGES, Input, Tree, build_mem_image, make_instance, myhash, reference_kernel,
)
from heldout.benchmarks.vliw.instances import make_instance as fast_make_instance
from heldout.benchmarks.vliw.task import PACKAGE_DIR, VliwTakehome

PACKED_SOURCE = (PACKAGE_DIR / "kernels" / "packed.py").read_text(encoding="utf-8")
SHAPE = {"forest_height": 10, "batch_size": 256, "rounds": 16}


@pytest.fixture(scope="module")
def bench():
    return VliwTakehome()


def instance(seed: int) -> Example:
    return Example(id=f"seed-{seed}", input={"seed": seed, **SHAPE}, target=None)


# -- the benchmark -------------------------------------------------------------------------------
@pytest.mark.parametrize("x,h", [(0, 0x6B4ED927), (1, 0xB48681B6), (2, 0xE267B84C), (0xFFFFFFFF, 0xFE64C182),
                                 (123456789, 0xD9AB9E21), (0x80000000, 0x7E7B3C12)])
def test_hash_test_vectors(x, h):
    assert myhash(x) == h


def test_hash_has_six_stages_three_of_them_affine():
    affine = [k for k, (op1, _, op2, op3, _) in enumerate(HASH_STAGES) if (op1, op2, op3) == ("+", "+", "<<")]
    assert len(HASH_STAGES) == 6 and affine == [0, 2, 4]


def test_seed_123_fingerprint_and_memory_image_layout():
    mem, final_values = make_instance(123)
    assert len(mem) == 2566
    assert mem[:7] == [16, 2047, 256, 10, 7, 2054, 2310]
    assert mem[7:10] == [112449971, 574832345, 187231959]
    assert mem[2054:2310] == [0] * 256
    assert mem[2310:2313] == [319861016, 570165276, 361744404]
    assert final_values[:4] == [677941075, 2166718950, 1850294448, 228067758]


@pytest.mark.parametrize("shape", [{}, {"forest_height": 3, "batch_size": 17, "rounds": 40},
                                   {"forest_height": 1, "batch_size": 1, "rounds": 5},
                                   {"forest_height": 6, "batch_size": 64, "rounds": 0}])
def test_the_vectorised_walk_scores_exactly_what_the_plain_reference_does(shape):
    """The harness computes fresh instances' expected values with the numpy walk; it must equal
    the plain walk word for word (image and values), on the scored shape and on odd ones."""
    for seed in (0, 1, 123, 2**47 + 3, 987_654_321):
        assert fast_make_instance(seed, **shape) == make_instance(seed, **shape), (seed, shape)


def test_list_and_memory_forms_of_the_reference_agree():
    import random
    rng = random.Random(7)
    tree = Tree.generate(4, rng)
    inp = Input.generate(tree, 10, 6, rng)
    mem = build_mem_image(tree, inp)
    from heldout.benchmarks.vliw.benchmark import run_reference_on_image
    run_reference_on_image(mem)
    reference_kernel(tree, inp)
    assert mem[mem[6]:mem[6] + 10] == inp.values and mem[mem[5]:mem[5] + 10] == inp.indices


def test_manifest_freezes_train_instances_and_fresh_test_slots(bench):
    task = load_task("vliw/takehome")
    assert task.sizes() == {"train": 3, "test": 8}
    train, test = task.split("train"), task.split("test")
    assert [e.id for e in train] == ["seed-1", "seed-2", "seed-3"]
    assert make_instance(train[0].input["seed"])[1] == train[0].target  # train stays deterministic
    # a test slot holds no seed and no target: its instance is drawn when it is scored
    slot = test[0]
    assert slot.target is None and "seed" not in slot.input
    seeds = [bench.run(bench.seed_candidate(), slot).output["seed"] for _ in range(2)]
    assert seeds[0] != seeds[1]
    again = bench.run(bench.seed_candidate(), bench.replay(slot.id, seeds[0]))
    assert again.valid and again.dimensions["cycles"] == BASELINE_CYCLES


# -- the seed and a packed kernel ----------------------------------------------------------------
def test_seed_measures_exactly_147734_cycles_on_several_instances(bench):
    seed = bench.seed_candidate()
    verdicts = [bench.run(seed, instance(s)) for s in (1, 99, 123456)]
    assert all(v.valid for v in verdicts), [v.error for v in verdicts]
    assert [v.dimensions["cycles"] for v in verdicts] == [BASELINE_CYCLES] * 3
    summary = bench.summarize(seed, verdicts)
    assert summary["score"] == 1.0 and summary["cycles"] == BASELINE_CYCLES
    assert summary["bottleneck"] == "alu" and "bottleneck: alu" in verdicts[0].feedback
    # slot mix of the baseline (spec 6.3): alu 118,784 slots over 147,734 cycles of 12 slots
    assert summary["utilisation"]["alu"] == pytest.approx(118784 / (12 * BASELINE_CYCLES), abs=1e-6)


def test_packed_kernel_is_valid_and_much_faster(bench):
    cand = {"perf_takehome.py": PACKED_SOURCE}
    verdicts = [bench.run(cand, instance(s)) for s in (5, 6)]
    assert all(v.valid for v in verdicts), verdicts[0].error
    cycles = verdicts[0].dimensions["cycles"]
    assert cycles < BASELINE_CYCLES / 50 and verdicts[0].score > 50
    assert bench.summarize(cand, verdicts)["bottleneck"] == "load"


def test_prebuilt_instruction_stream_is_accepted_directly(bench, tmp_path):
    built = bench.build({"perf_takehome.py": PACKED_SOURCE})
    stream = tmp_path / "kernel.json"
    program = _packed_program(bench)
    stream.write_text(json.dumps(program))
    cand = bench.candidate_from_path(str(stream))
    assert list(cand) == ["program.json"]
    v = bench.run(cand, instance(8))
    assert v.valid and v.dimensions["cycles"] == simulate(built.program, make_instance(8)[0]).cycles


def _packed_program(bench) -> list:
    """The packed kernel's instruction stream, built in the sandbox like any candidate."""
    from heldout.sandbox import run_function
    from heldout.benchmarks.vliw.task import TASK
    res = run_function({"perf_takehome.py": PACKED_SOURCE}, "_heldout_vliw_build", "build",
                       ["perf_takehome", 10, 2047, 256, 16, 10**6], limits=bench.default_limits,
                       setup_files=TASK.helper_files())
    assert res.ok, res.error
    return json.loads(res.value)


def test_cycles_are_the_maximum_over_instances_for_data_dependent_kernels(bench):
    # Prepend a loop that runs (node 0's value mod 8) times, on scratch the packed kernel never uses.
    loop = [{"load": [["const", 1500, 7]]},
            {"load": [["load", 1501, 1500]]},                      # node 0's value
            {"load": [["const", 1502, 7], ["const", 1503, 1]]},
            {"alu": [["&", 1501, 1501, 1502]]},
            {"flow": [["cond_jump_rel", 1501, 1]]},               # skip the halt if the count > 0
            {"flow": [["jump", 8]]},
            {"alu": [["-", 1501, 1501, 1503]]},
            {"flow": [["jump", 4]]}]
    program = loop + _packed_program(bench)
    cand = {"program.json": json.dumps(program)}
    seeds = [11, 12, 13, 14]
    verdicts = [bench.run(cand, instance(s)) for s in seeds]
    assert all(v.valid for v in verdicts), verdicts[0].error
    per = [int(v.dimensions["cycles"]) for v in verdicts]
    assert len(set(per)) > 1
    summary = bench.summarize(cand, verdicts)
    assert summary["cycles"] == max(per) and summary["score"] == pytest.approx(BASELINE_CYCLES / max(per))
    assert summary["cycles_per_instance"] == {f"seed-{s}": c for s, c in zip(seeds, per)}


# -- wrong candidates score 0 with a precise reason ----------------------------------------------
def hard_coded_stream(values: list[int], values_p: int = 2310) -> list:
    """Writes the given final values straight into memory: right only for that one instance."""
    program = [{"load": [["const", 0, values_p], ["const", 1, 1]]}]
    for i, v in enumerate(values):
        program.append({"load": [["const", 2, v]]})
        program.append({"store": [["store", 0, 2]], "alu": [["+", 0, 0, 1]]})
    return program


def test_a_kernel_right_on_one_instance_and_wrong_on_another_is_caught(bench):
    _, expected = make_instance(21)
    cand = {"program.json": json.dumps(hard_coded_stream(expected))}
    right, wrong = bench.run(cand, instance(21)), bench.run(cand, instance(22))
    assert right.valid
    assert not wrong.valid and wrong.error_kind == "wrong_values" and "seed-22" in wrong.error
    assert "in 256 of 256 lanes" in wrong.error
    summary = bench.summarize(cand, [right, wrong])
    assert summary["valid"] is False and summary["score"] == 0.0 and summary["cycles"] is None


BUILDER_LOOKING_FOR_DATA = '''
import gc, inspect, os, sys
from problem import VLEN

MANIFEST = {manifest!r}
READ_FILES = {read_files!r}


def find_data():
    """Anything that looks like test data: a 2566-word image or 256 batch values."""
    found = []
    frame = sys._getframe()
    while frame is not None:
        for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
            if isinstance(value, list) and len(value) in (2566, 256) and all(isinstance(v, int) for v in value):
                found.append(value)
        frame = frame.f_back
    for obj in gc.get_objects():
        if isinstance(obj, list) and len(obj) == 2566 and obj[:3] == [16, 2047, 256]:
            found.append(obj)
    for path in (MANIFEST, "../heldout/data_manifests/vliw/takehome.json") if READ_FILES else ():
        try:
            with open(path) as fh:
                found.append(fh.read())
        except OSError:
            pass
    return found


class KernelBuilder:
    def build_kernel(self, forest_height, n_nodes, batch_size, rounds):
        found = find_data()
        self.instrs = []
        if found:  # cheat: write what was found as the answer
            data = found[0] if isinstance(found[0], list) else [0] * 256
            values = data[2310:2566] if len(data) == 2566 else data
            self.instrs.append({{"load": [("const", 0, 2310), ("const", 1, 1)]}})
            for v in values:
                self.instrs.append({{"load": [("const", 2, v)]}})
                self.instrs.append({{"store": [("store", 0, 2)], "alu": [("+", 0, 0, 1)]}})
        self.instrs.append({{"flow": [("halt",)]}})
'''


@pytest.mark.parametrize("read_files", [False, True], ids=["stack-and-heap", "files"])
def test_a_builder_looking_for_test_data_finds_none(bench, read_files):
    manifest = str(Path(PACKAGE_DIR).parents[1] / "data_manifests" / "vliw" / "takehome.json")
    source = BUILDER_LOOKING_FOR_DATA.format(manifest=manifest, read_files=read_files)
    v = bench.run({"perf_takehome.py": source}, instance(31))
    # Nothing is found (the manifest does not exist in the sandbox's root) and the do-nothing
    # kernel is (correctly) judged wrong. A leak would make it valid.
    assert not v.valid
    assert v.error_kind == "wrong_values", v.error
    # The same cheat does work when data is reachable: the test above can fail.
    namespace: dict = {}
    source = BUILDER_LOOKING_FOR_DATA.format(manifest=manifest, read_files=False)
    exec(compile(source.replace("from problem import VLEN\n", ""), "cheat", "exec"), namespace)
    image, _ = make_instance(31)  # noqa: F841  (a local the stack walk can see)
    builder = namespace["KernelBuilder"]()
    builder.build_kernel(10, 2047, 256, 16)
    assert len(builder.instrs) == 1 + 2 * 256 + 1


def test_a_builder_that_never_returns_is_stopped(bench):
    loop = "class KernelBuilder:\n    def build_kernel(self, *a):\n        while True:\n            pass\n"
    v = bench.run({"perf_takehome.py": loop}, instance(1), bench.context(RunLimits(wall_seconds=3, cpu_seconds=3)))
    assert not v.valid and v.error_kind == "timeout" and "build error" in v.error


@pytest.mark.parametrize("candidate,kind,words", [
    ({"perf_takehome.py": "def broken(:\n"}, "crash", "SyntaxError"),
    ({"perf_takehome.py": "x = 1\n"}, "crash", "defines no KernelBuilder"),
    ({"program.json": "[{\"alu\": [[\"+\", 0, 0, 0]]}, "}, "bad_output", "not valid JSON"),
    ({"program.json": json.dumps([{"alu": [["+", 0, 0, 0]] * 13}])}, "slot_overflow", "at bundle 0"),
    ({"program.json": json.dumps([{"alu": []}, {"flow": [["jump", 0]]}])}, "cycle_cap", "cycle cap exceeded"),
    ({"program.json": json.dumps([{"load": [["const", 0, 5000]]}, {"load": [["load", 1, 0]]}])},
     "memory_range", "memory_range at bundle 1"),
    ({"a.py": "class KernelBuilder: pass", "b.py": "class KernelBuilder: pass"}, "malformed_candidate",
     "entry file"),
])
def test_bad_candidates_fail_with_a_named_reason(bench, candidate, kind, words):
    v = bench.run(candidate, instance(2), bench.context(cycle_cap=10_000))
    assert not v.valid and v.score == 0.0 and v.error_kind == kind, (v.error_kind, v.error)
    assert words in v.error


def test_multi_file_builder_using_the_problem_module_locally(bench):
    # A take-home style builder: checks its kernel on a small instance with problem.Machine and
    # problem.reference_kernel2 before building the real one; the kernel lives in a sibling file.
    entry = '''
import random
from problem import Machine, Tree, Input, build_mem_image, reference_kernel2, N_CORES, SLOT_LIMITS, VLEN
from kernel_impl import KernelBuilder as Packed


class KernelBuilder(Packed):
    def build_kernel(self, forest_height, n_nodes, batch_size, rounds):
        random.seed(5)
        small = Packed()
        small.build_kernel(3, 15, 16, 5)
        tree = Tree.generate(3)
        inp = Input.generate(tree, 16, 5)
        mem = build_mem_image(tree, inp)
        machine = Machine(mem, small.instrs, small.debug_info(), n_cores=N_CORES)
        machine.enable_pause = False
        machine.run()
        for ref_mem in reference_kernel2(list(mem)):
            pass
        assert machine.mem[mem[6]:mem[6] + 16] == ref_mem[mem[6]:mem[6] + 16], "local check failed"
        super().build_kernel(forest_height, n_nodes, batch_size, rounds)
'''
    cand = {"perf_takehome.py": entry, "kernel_impl.py": PACKED_SOURCE}
    v = bench.run(cand, instance(41))
    assert v.valid, v.error


# -- the CLI -------------------------------------------------------------------------------------
def test_heldout_eval_on_the_seed_reports_147734_and_score_1(warm_cli, tmp_path):
    out = warm_cli.run("eval", "--task", "vliw/takehome", "--split", "test", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["task"] == "vliw/takehome" and summary["valid"] is True and summary["error"] is None
    assert summary["cycles"] == BASELINE_CYCLES and summary["score"] == 1.0
    assert len(summary["cycles_per_instance"]) == 8  # the hidden instances, only with --split test
    assert set(summary["utilisation"]) == {"alu", "valu", "load", "store", "flow"}


def test_heldout_eval_reports_a_wrong_stream_with_exit_1(warm_cli, tmp_path):
    stream = tmp_path / "stream.json"
    stream.write_text(json.dumps([{"flow": [["halt"]]}]))
    out = warm_cli.run("eval", "--task", "vliw/takehome", "--candidate", str(stream), "--json", cwd=tmp_path)
    summary = json.loads(out.stdout)
    assert out.returncode == 1 and summary["valid"] is False and summary["score"] == 0.0
    assert "wrong values" in summary["error"]


@pytest.mark.parametrize("kernel", ["baseline", "packed"])
def test_fast_and_reference_engines_agree_on_real_kernels(bench, kernel):
    source = (PACKAGE_DIR / "kernels" / f"{kernel}.py").read_text(encoding="utf-8")
    from heldout.sandbox import run_function
    from heldout.benchmarks.vliw.task import TASK
    res = run_function({"perf_takehome.py": source}, "_heldout_vliw_build", "build",
                       ["perf_takehome", 10, 2047, 256, 16, 10**6], limits=bench.default_limits,
                       setup_files=TASK.helper_files())
    assert res.ok, res.error
    program = json.loads(res.value)
    mem, expected = make_instance(77)
    ref = simulate(program, mem, engine="reference")
    fast = simulate(program, mem, engine="fast")
    assert ref.ok and fast.ok
    assert (fast.cycles, fast.pc, fast.state, fast.slots) == (ref.cycles, ref.pc, ref.state, ref.slots)
    assert fast.memory == ref.memory and fast.scratch == ref.scratch
    assert ref.memory[2310:2566] == expected


def test_fresh_instances_use_new_seeds_and_score_like_frozen_ones(bench):
    fresh = bench.fresh_instances(2)
    assert len({e.id for e in fresh}) == 2 and all(e.target == make_instance(e.input["seed"])[1] for e in fresh)
    v = bench.run({"perf_takehome.py": PACKED_SOURCE}, fresh[0])
    assert v.valid
