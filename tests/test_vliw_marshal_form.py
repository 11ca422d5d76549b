"""The marshal build form: the sandboxed builder sends ``marshal.dumps(program)`` (compressed) and
heldout parses those bytes itself. It must decode exactly as the plain JSON path does, shared
objects and all; decline (so the task builds again as JSON) anything outside its vocabulary; and
stay safe on bytes forged by a hostile builder: truncated, mutated, bombs, bad references, cycles.
It is never ``marshal.loads``."""

from __future__ import annotations

import base64
import json
import marshal
import random
import zlib

import numpy as np
import pytest

from heldout.benchmarks.vliw import build_runner
from heldout.benchmarks.vliw.build_runner import MARSHAL_FORMAT, marshalled
from heldout.benchmarks.vliw.compact_form import CompactFormError
from heldout.benchmarks.vliw.fast import DecodedProgram
from heldout.benchmarks.vliw.marshal_form import decode_marshal, parse
from heldout.benchmarks.vliw.marshal_parser import REASONS
from heldout.benchmarks.vliw.task import VliwTakehome
from heldout.contracts import Example
from vliw_programs import CONFORMANCE, SHAPE, assert_same_decoding, kernel, random_program, via_json


def payload_of(blob: bytes) -> dict:
    return {"format": MARSHAL_FORMAT, "data": base64.b64encode(zlib.compress(blob)).decode()}


def via_marshal(program) -> DecodedProgram | None:
    payload = marshalled(program)
    assert payload is not None, "marshal refused a plain program"
    return decode_marshal(json.loads(json.dumps(payload)), 2_000_000)


@pytest.mark.parametrize("name", sorted(CONFORMANCE))
def test_marshal_decoding_equals_the_plain_decoding_on_conformance_programs(name):
    assert_same_decoding(via_marshal(CONFORMANCE[name]), via_json(CONFORMANCE[name]))


def test_marshal_decoding_equals_the_plain_decoding_on_random_programs():
    rng = random.Random(38)
    for case in range(300):
        program = random_program(rng, rng.randrange(1, 60))
        assert_same_decoding(via_marshal(program), via_json(program))


def test_shared_objects_decode_as_their_copies():
    # marshal writes an object seen before as a back-reference: a bundle, a group or a slot reused
    # (as builders do with constants) must decode as if each use were a fresh copy
    slot = ("+", 1, 2, 3)
    group = [slot, ("const", 4, 2 ** 40)]
    bundle = {"alu": group, "load": [("const", 5, 6)], "debug": [("comment", "shared")]}
    program = [bundle, {"alu": group}, bundle, {"valu": [slot, slot]}, bundle, {"flow": [("jump", 1000)]}] * 50
    assert b"r" in marshal.dumps(program, 4)
    assert_same_decoding(via_marshal(program), via_json(program))


def test_a_reference_may_point_into_a_debug_value():
    # a string first written inside the skipped debug group, then used (by reference) as an engine
    name = "".join(["al", "u"])  # not the interned literal, so marshal writes it once and refers to it
    program = [{"debug": [("comment", name)]}, {name: [("+", 1, 2, 3)]}]
    assert_same_decoding(via_marshal(program), via_json(program))


@pytest.mark.parametrize("debug_value", [[("compare", 3, (1, 2, "idx"))], [None, True, 1.5, {"k": {1, 2}}],
                                         [("x", 2 ** 100, -(2 ** 70), frozenset({3}))], []])
def test_the_debug_group_is_dropped_whatever_plain_data_it_holds(debug_value):
    program = [{"debug": debug_value, "alu": [("+", 1, 2, 3)]}, {"debug": debug_value}]
    want = via_json([{k: v for k, v in b.items() if k != "debug"} for b in program])
    assert_same_decoding(via_marshal(program), want)


def test_expansion_beyond_the_first_workspace_grows_it_and_parses_again():
    # one bundle object of 20 slots appended 8,000 times: 160,000 slot positions from ~40 kB,
    # far past the workspace's first guess from the byte count
    bundle = {"alu": [("+", i, 1, 2) for i in range(12)], "valu": [("*", 8 * i, 8, 16) for i in range(6)],
              "load": [("const", 100, 7), ("load", 101, 100)]}
    program = [bundle] * 8_000
    raw = marshal.dumps(program, 4)
    status, _, arrays = parse(raw, 2_000_000)
    assert status == 0 and len(arrays[3]) == 20 * 8_000 and len(raw) // 4 < 20 * 8_000
    assert_same_decoding(via_marshal(program), via_json(program))


def test_many_distinct_strings_and_wide_slots_grow_their_tables():
    program = [{f"engine{i}": [("+", 1, 2, 3)]} for i in range(3000)]  # unknown engines: 3000 faults
    program += [{"alu": [("frob",) + tuple(range(200))]}, {"alu": [(f"op{i}", i) for i in range(5)]}]
    assert_same_decoding(via_marshal(program), via_json(program))


@pytest.mark.parametrize("program", [
    [{"alu": [("+", 0, True, 1)]}],           # a bool operand (equal to 1, but not an int here)
    [{"alu": [("+", 0, 1, 1)]}, {"alu": [("+", 0, True, 1)]}],
    [{"alu": [("+", 0, 1.0, 1)]}],            # a float operand
    [{"alu": [("+", 0, 1, 2 ** 62)]}],        # beyond the int64-safe bound
    [{"alu": [("+", 0, 1, -(2 ** 62))]}],
    [{"alu": [("+", 0, 1, 2 ** 200)]}],
    [[("alu", ("+", 0, 1, 1))]],              # a bundle that is not a dict
    [{1: [("+", 0, 1, 1)]}],                  # a non-str engine key
    [{"alu": ("+", 0, 1, 1)}, {"alu": [5]}],  # slots that are not sequences
    [{"alu": [()]}],                          # an empty slot
    [{"alu": [("+", "x", 1, 1)]}],            # a string operand
    [{"alu": [(7, 1, 1, 1)]}],                # an operation that is not a string
    [{"alu": [("+", 0, None, 1)]}],
])
def test_anything_outside_the_vocabulary_is_declined_so_the_task_builds_as_json(program):
    assert via_marshal(program) is None


def test_a_cyclic_program_is_declined():
    bundle: dict = {"alu": [("+", 1, 2, 3)]}
    program: list = [bundle]
    bundle["load"] = program  # the program inside its own bundle
    assert via_marshal(program) is None
    group: list = [("+", 1, 2, 3)]
    group.append(group)
    assert via_marshal([{"alu": group}]) is None


def test_a_numpy_integer_is_written_as_raw_bytes_and_declined():
    # marshal writes anything with the buffer protocol as bytes: the parser declines, the task
    # builds as JSON, which converts the integer (a second build, for such builders only)
    assert via_marshal([{"alu": [("+", 0, np.int64(1), 1)]}]) is None


def test_what_marshal_refuses_or_what_is_too_large_is_not_sent_this_way(monkeypatch):
    assert marshalled([{type("Engine", (str,), {})("alu"): [("+", 0, 1, 1)]}]) is None  # a str subclass
    monkeypatch.setattr(build_runner, "MAX_MARSHAL_BYTES", 100)
    program = [{"alu": [("+", i, 1, 1)]} for i in range(100)]
    assert marshalled(program) is None
    assert build_runner.compact(program)["format"] == build_runner.COMPACT_FORMAT  # the next form


# -- a hostile builder forging the bytes ---------------------------------------------------------
def outcome(payload) -> str:
    """'program', 'declined' or 'rejected': the three answers; anything else (a crash, another
    exception, a hang) fails the test."""
    try:
        got = decode_marshal(payload, 2_000_000)
    except CompactFormError:
        return "rejected"
    return "declined" if got is None else "program"


SAMPLE = [{"load": [("const", 0, 5), ("const", 1, 2 ** 40)]}, {"alu": [("+", 0, 1, 2)] * 3, "debug": [("c", 1)]},
          {"flow": [("cond_jump_rel", 0, -1)]}, {"valu": [("vbroadcast", 16, 0)]}] * 3


def test_every_truncation_of_a_stream_is_declined_never_misread():
    raw = marshal.dumps(SAMPLE, 4)
    for cut in range(len(raw)):
        assert outcome(payload_of(raw[:cut])) == "declined", cut
    assert outcome(payload_of(raw + b"\x00")) == "declined"  # trailing bytes


def test_mutated_bytes_give_a_program_or_a_decline_and_nothing_else():
    rng = random.Random(2026)
    raw = bytearray(marshal.dumps(SAMPLE, 4))
    seen = set()
    for case in range(3000):
        forged = bytearray(raw)
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(forged))
            forged[at] = rng.choice([rng.randrange(256), 0xFF, 0x7F, ord("r"), ord("["), ord("{"), ord("0")])
        seen.add(outcome(payload_of(bytes(forged))))
    assert seen <= {"program", "declined", "rejected"} and {"program", "declined"} <= seen


@pytest.mark.parametrize("blob", [
    b"[\xff\xff\xff\x7f",                          # a list header asking for 2**31 - 1 bundles
    b"[\x01\x00\x00\x00" + b"{" + b"r\x00\x00\x00\x00" * 3,  # a reference to nothing yet
    b"[\x01\x00\x00\x00{r\xff\xff\xff\xff",        # a negative reference
    b"\xdb\x01\x00\x00\x00r\x00\x00\x00\x00",      # the program referring to itself
    b"[\x01\x00\x00\x00{\xda\x05debug" + b"[\x01\x00\x00\x00" * 100 + b"N",  # nesting past the skip stack
    b"[\x01\x00\x00\x00{z\x03alu[\x01\x00\x00\x00)\x02z\x01+l\x06\x00\x00\x00" + b"\x01\x00" * 6 + b"0",
    b"[\x01\x00\x00\x00{z\x03alu[\x01\x00\x00\x00)\x02z\x01+l\x01\x00\x00\x00\x00\x80" + b"0",  # a bad digit
    b"c" + b"\x00" * 40,                           # a code object
    b"",
])
def test_forged_frames_are_declined(blob):
    assert outcome(payload_of(blob)) == "declined"


def test_an_expansion_bomb_stops_at_the_cap():
    # 200 kB of references to one bundle of 1,000 slots: 40 million slot positions, past the cap
    bundle = {"alu": [("+", i % 7, 1, 2) for i in range(1000)]}
    raw = marshal.dumps([bundle] * 40_000, 4)
    assert len(raw) < 250_000
    status, _, arrays = parse(raw, 2_000_000)
    assert arrays is None and REASONS[status] == "too large"


def test_a_compression_bomb_stops_at_the_cap():
    bomb = {"format": MARSHAL_FORMAT,
            "data": base64.b64encode(zlib.compress(b"[" + b"\x00" * (200 * 1024 * 1024), 9)).decode()}
    assert len(bomb["data"]) < 400_000
    assert outcome(bomb) == "declined"


@pytest.mark.parametrize("payload", [
    {"format": MARSHAL_FORMAT, "data": "!!!"},
    {"format": MARSHAL_FORMAT, "data": 5},
    {"format": MARSHAL_FORMAT, "data": "", "extra": 1},
    {"format": "heldout-vliw-marshal/0", "data": ""},
    "not a dict",
])
def test_a_payload_that_is_not_the_form_is_rejected(payload):
    assert outcome(payload) == "rejected"


def test_duplicate_keys_forged_into_a_bundle_are_rejected():
    # marshal never writes one key twice; a forged dict naming "valu" 20 times is a bad stream
    group = b"[\x01\x00\x00\x00)\x04z\x01+i\x00\x00\x00\x00i\x08\x00\x00\x00i\x10\x00\x00\x00"
    blob = b"[\x01\x00\x00\x00{" + (b"z\x04valu" + group) * 20 + b"0"
    assert outcome(payload_of(blob)) == "rejected"


# -- through the sandbox -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bench():
    return VliwTakehome(build_form="compact")


def test_a_plain_kernel_is_sent_as_marshal_and_an_odd_one_is_built_again_as_json(bench):
    assert bench.build(kernel("packed"), SHAPE).extra["form"] == "marshal"
    odd = ("class KernelBuilder:\n"
           "    def build_kernel(self, *shape):\n"
           "        self.instrs = [{'load': [('const', 0, 1)]}, {'alu': [('+', 0, True, 0)]}]\n")
    built = bench.build({"perf_takehome.py": odd}, SHAPE)
    assert built.error is None and built.extra["form"] == "json"
    assert_same_decoding(built.program, via_json([{"load": [("const", 0, 1)]}, {"alu": [("+", 0, True, 0)]}]))


def test_a_builder_that_forges_the_marshal_bytes_gets_a_clear_build_error(bench):
    group = "[\\x01\\x00\\x00\\x00)\\x04z\\x01+i\\x00\\x00\\x00\\x00i\\x08\\x00\\x00\\x00i\\x10\\x00\\x00\\x00"
    hostile = ("import base64, zlib\n"
               "import _heldout_vliw_build as runner\n"
               "class KernelBuilder:\n"
               "    def build_kernel(self, *shape):\n"
               "        self.instrs = [{'valu': [('+', 0, 8, 16)]}]\n"
               f"        blob = b'[\\x01\\x00\\x00\\x00{{' + (b'z\\x04valu' + b'{group}') * 20 + b'0'\n"
               "        runner.marshalled = lambda program: {'format': runner.MARSHAL_FORMAT,\n"
               "            'data': base64.b64encode(zlib.compress(blob)).decode()}\n")
    verdict = bench.run({"perf_takehome.py": hostile}, Example(id="seed-5", input={"seed": 5, **SHAPE}, target=None))
    assert not verdict.valid and verdict.score == 0 and "bad instruction stream" in verdict.error
