"""The compact build form (issue 19): a sandboxed builder sends its stream as integer arrays, the
parent decodes and checks them. It must give exactly what the plain JSON path gives (rows, starts,
charges, slot counts, fault messages; hence cycles, memory and scratch), fall back to JSON for
anything it cannot express, and reject a forged payload from a hostile builder."""

from __future__ import annotations

import base64
import json
import random

import numpy as np
import pytest

from heldout.benchmarks.vliw import simulate
from heldout.benchmarks.vliw.benchmark import make_instance
from heldout.benchmarks.vliw.build_runner import compact
from heldout.benchmarks.vliw.compact_form import CompactFormError, _unique_inverse, decode_compact
from heldout.benchmarks.vliw.fast import DecodedProgram
from heldout.benchmarks.vliw.task import VliwTakehome
from heldout.contracts import Example
from vliw_programs import CONFORMANCE, SHAPE, assert_same_decoding, kernel, random_program, via_json

KERNELS = ("baseline", "packed")


def via_compact(program) -> DecodedProgram:
    payload = compact(program)
    assert payload is not None, "expected a plain program"
    return decode_compact(json.loads(json.dumps(payload)), 2_000_000)


@pytest.mark.parametrize("name", sorted(CONFORMANCE))
def test_compact_decoding_equals_the_plain_decoding_on_conformance_programs(name):
    assert_same_decoding(via_compact(CONFORMANCE[name]), via_json(CONFORMANCE[name]))


@pytest.mark.parametrize("bound", [50, 1 << 40], ids=["by a table", "by sorting"])
def test_distinct_slot_numbering_is_numpy_unique_whichever_way_it_is_computed(bound):
    keys = np.random.default_rng(7).integers(0, min(bound, 1 << 40), 5_000)
    unique, inverse = _unique_inverse(keys, bound)
    expected_unique, expected_inverse = np.unique(keys, return_inverse=True)
    assert unique.tolist() == expected_unique.tolist() and inverse.tolist() == expected_inverse.tolist()


def test_compact_decoding_equals_the_plain_decoding_on_random_programs():
    rng = random.Random(19)
    faults = set()
    for case in range(300):
        program = random_program(rng, rng.randrange(1, 60))
        want = via_json(program)
        assert_same_decoding(via_compact(program), want)
        faults.update(want.messages.values())
    kinds = " ".join(faults)
    # the generator really reaches every decode-time fault
    for words in ("unknown engine", "slots, limit", "scratch read", "is not a", "negative bundle"):
        assert words in kinds, words


@pytest.mark.parametrize("debug_groups", [1, 3, 64, 65, 300])
def test_debug_groups_are_dropped_alike_whether_few_or_many(debug_groups):
    # the debug groups are masked out wherever they are, however many; the decoding equals the plain one
    rng = random.Random(debug_groups)
    program = [{"alu": [("+", 1, 2, 3)]} for _ in range(400)]
    for index in rng.sample(range(400), debug_groups):
        program[index] = dict(rng.sample([("debug", [("comment", index)]), ("alu", [("+", 1, 2, 3)]),
                                          ("load", [("const", 4, index)])], 3))
    assert_same_decoding(via_compact(program), via_json(program))


@pytest.mark.parametrize("program", [
    [{"alu": [("+", 0, True, 1)]}],          # a bool operand (equal to 1 as a dict key)
    [{"alu": [("+", 0, 1.0, 1)]}],           # a float operand
    [{"alu": [("+", 0, 1, 2 ** 62)]}],       # beyond the int64-safe bound
    [{"alu": [("+", 0, np.int64(1), 1)]}],   # a numpy integer (the plain path converts it)
    [[("alu", ("+", 0, 1, 1))]],             # a bundle that is not a dict
    [{1: [("+", 0, 1, 1)]}],                 # a non-str engine key
    [{"alu": ("+", 0, 1, 1)}, {"alu": [5]}],  # slots that are not sequences
])
def test_anything_the_compact_form_cannot_express_falls_back_to_json(program):
    assert compact(program) is None  # the builder then sends as_json(program): the plain path


def test_a_bool_after_an_equal_int_slot_is_not_mistaken_for_it():
    assert compact([{"alu": [("+", 0, 1, 1)]}, {"alu": [("+", 0, True, 1)]}]) is None


# -- through the sandbox, on the real kernels ---------------------------------------------------------
@pytest.fixture(scope="module")
def benches():
    return VliwTakehome(build_form="compact"), VliwTakehome(build_form="json")


@pytest.mark.parametrize("name", KERNELS)
def test_both_kernels_build_to_identical_programs_and_runs(benches, name):
    fast_bench, plain_bench = benches
    got, want = fast_bench.build(kernel(name), SHAPE), plain_bench.build(kernel(name), SHAPE)
    assert got.error is None and want.error is None, (got.error, want.error)
    assert got.n_bundles == want.n_bundles > 0
    assert_same_decoding(got.program, want.program)
    mem, _ = make_instance(20240619)
    a, b = simulate(got.program, mem), simulate(want.program, mem)
    assert (a.cycles, a.memory, a.scratch, a.slots) == (b.cycles, b.memory, b.scratch, b.slots)


def test_verdicts_are_identical_on_both_forms_including_fallback_candidates(benches):
    odd = ("class KernelBuilder:\n"
           "    def build_kernel(self, *shape):\n"
           "        self.instrs = [{'load': [('const', 0, 1)]}, {'alu': [('+', 0, True, 0)]}]\n")
    example = Example(id="seed-5", input={"seed": 5, **SHAPE}, target=None)
    for candidate in (kernel("packed"), {"perf_takehome.py": odd}):
        got, want = (bench.run(candidate, example) for bench in benches)
        assert (got.score, got.valid, got.error, got.dimensions) == (want.score, want.valid, want.error,
                                                                       want.dimensions)


# -- a hostile builder forging the payload -------------------------------------------------------------
PADDED = ["valu", "+"] + [f"pad{i}" for i in range(18)]


def forged(**override) -> dict:
    payload = compact([{"valu": [("+", 0, 8, 16)] * 6}])
    payload = json.loads(json.dumps(payload))
    payload.update(override)
    return payload


def wire(values, dtype="i4") -> dict:
    return {"dtype": dtype, "data": base64.b64encode(np.asarray(values, dtype="<" + dtype).tobytes()).decode()}


@pytest.mark.parametrize("override,words", [
    # one engine named 20 times in a bundle would be 120 VALU slots: past the interpreter's buffers
    ({"n_groups": wire([20]), "group_engine": wire([0] * 20), "group_slots": wire([6] * 20),
      "slot_ids": wire([0] * 120), "strings": PADDED}, "one engine twice"),
    ({"n_groups": wire([20]), "group_engine": wire([0] * 20), "group_slots": wire([6] * 20),
      "slot_ids": wire([0] * 120)}, "outside"),  # more groups than distinct strings
    ({"strings": ["debug", "+"], "n_groups": wire([1]), "group_engine": wire([0])}, "debug group"),
    ({"slot_ids": wire([0, 0, 0, 0, 0, 7])}, "outside"),
    ({"slot_ids": wire([0, 0, 0])}, "expected 6"),
    ({"group_slots": wire([2 ** 40], "i8")}, "outside"),
    ({"unique_operands": wire([0, 8, 2 ** 62], "i8")}, "outside"),
    ({"unique_op": {"dtype": "f8", "data": ""}}, "dtype"),
    ({"n_groups": {"dtype": "i4", "data": "!!!"}}, "base64"),
    ({"n_groups": {"dtype": "i4", "data": "AAA="}}, "whole number"),
    ({"strings": ["valu", "valu"]}, "distinct"),
    ({"strings": ["valu", 3]}, "distinct str"),
    ({"format": "something-else"}, "payload"),
    ({"extra": 1}, "payload"),
])
def test_a_forged_payload_is_rejected(override, words):
    with pytest.raises(CompactFormError, match=words):
        decode_compact(forged(**override), 2_000_000)


def test_a_payload_over_the_bundle_cap_is_rejected():
    with pytest.raises(CompactFormError, match="cap"):
        decode_compact(json.loads(json.dumps(compact([{}] * 11))), 10)


def test_a_builder_that_replaces_the_encoder_gets_a_clear_build_error(benches):
    hostile = ("import _heldout_vliw_build as runner\n"
               "class KernelBuilder:\n"
               "    def build_kernel(self, *shape):\n"
               "        self.instrs = [{'valu': [('+', 0, 8, 16)] * 6}]\n"
               "        real = runner.compact\n"
               "        def forge(program):\n"
               "            p = real(program)\n"
               "            p['n_groups'] = " + json.dumps(wire([20])) + "\n"
               "            p['group_engine'] = " + json.dumps(wire([0] * 20)) + "\n"
               "            p['group_slots'] = " + json.dumps(wire([6] * 20)) + "\n"
               "            p['slot_ids'] = " + json.dumps(wire([0] * 120)) + "\n"
               "            p['strings'] = " + json.dumps(PADDED) + "\n"
               "            return p\n"
               "        runner.compact = forge\n"
               "        runner.marshalled = lambda program: None\n")  # the compact arrays, not marshal
    example = Example(id="seed-5", input={"seed": 5, **SHAPE}, target=None)
    verdict = benches[0].run({"perf_takehome.py": hostile}, example)
    assert not verdict.valid and verdict.score == 0
    assert "bad instruction stream" in verdict.error and "one engine twice" in verdict.error
