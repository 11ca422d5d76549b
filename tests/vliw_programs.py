"""VLIW programs shared by the tests of the wire forms (compact arrays, marshal bytes): the
conformance corpus, a random program generator that reaches every decode-time fault, and the
plain JSON decoding every form must equal."""

from __future__ import annotations

import random

import numpy as np

from heldout.benchmarks.vliw.build_runner import as_json
from heldout.benchmarks.vliw.fast import DecodedProgram, decode
from heldout.benchmarks.vliw.machine import load_program_json
from heldout.benchmarks.vliw.reference import SCRATCH_SIZE
from heldout.benchmarks.vliw.task import PACKAGE_DIR

SHAPE = {"forest_height": 10, "batch_size": 256, "rounds": 16}


def kernel(name: str) -> dict[str, str]:
    """One of the shipped kernels as a candidate."""
    return {"perf_takehome.py": (PACKAGE_DIR / "kernels" / f"{name}.py").read_text(encoding="utf-8")}


def via_json(program) -> DecodedProgram:
    return decode(load_program_json(as_json(program)))


def assert_same_decoding(got: DecodedProgram, want: DecodedProgram) -> None:
    for name in ("code", "start", "charged", "counts"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
    assert got.messages == want.messages


# Programs exercising every slot form and every decode-time fault, as a conformance suite would.
CONFORMANCE = {
    "empty": [],
    "empty-bundles": [{}, {"debug": [("comment", "x")]}, {}],
    "swap": [{"load": [("const", 0, 5), ("const", 1, 7)]}, {"alu": [("+", 0, 1, 2), ("+", 1, 0, 2)]}],
    "every-form": [
        {"load": [("const", 0, 3), ("const", 1, 2 ** 32 + 5)]},
        {"alu": [(op, 2 + i, 0, 1) for i, op in enumerate(["+", "-", "*", "//", "cdiv", "%", "^", "&", "|",
                                                            "<<", ">>", "<"])]},
        {"valu": [("vbroadcast", 16, 0), ("multiply_add", 24, 16, 16, 16), ("+", 32, 16, 24),
                  ("==", 40, 16, 24)]},
        {"load": [("load", 50, 0), ("load_offset", 51, 0, 3)], "store": [("store", 0, 1), ("vstore", 0, 16)]},
        {"load": [("vload", 64, 0)], "flow": [("select", 72, 0, 1, 2)]},
        {"flow": [("vselect", 80, 16, 24, 32)]}, {"flow": [("add_imm", 90, 0, -7)]},
        {"flow": [("trace_write", 0)]}, {"flow": [("coreid", 91)]}, {"flow": [("cond_jump_rel", 0, 1)]},
        {"flow": [("cond_jump", 0, 12)]}, {"flow": [("jump", 13)]}, {"flow": [("jump_indirect", 1)]},
        {"flow": [("pause",)]}, {"flow": [("halt",)]},
    ],
    "faults": [
        {"alu": [("+", 0, 0, 0)] * 13},
        {"alu": [("+", 0, 0, 0)], "gpu": [("+", 0, 0, 0)], "valu": [("+", 0, 0, 0)]},
        {"valu": [("vbroadcast", SCRATCH_SIZE - 7, 0)], "alu": [("+", 0, 0, SCRATCH_SIZE)]},
        {"alu": [("+", -1, 0, 0)], "load": [("nope", 1, 2)]},
        {"flow": [("jump", -3)]}, {"flow": [("cond_jump_rel", 0, -(2 ** 61))]},
        {"flow": [("halt", 1)]}, {"load": [("const", 2 ** 61, 1)]}, {"store": [("vstore", 0, SCRATCH_SIZE - 4)]},
        {"alu": [("+", 0, 0, 0)], "flow": [("add_imm", 0, 0, 1), ("halt",)]},
    ],
    "list-slots": [{"alu": [["+", 0, 1, 2]], "load": [["const", 3, 4], ("const", 3, 4)]}],
}


def random_program(rng: random.Random, n: int) -> list[dict]:
    """Random bundles with repeated slots, unknown engines, overflows, bad shapes and wild operands."""
    engines = ["alu", "valu", "load", "store", "flow"]
    opcodes = ["+", "*", "//", "<", "vbroadcast", "multiply_add", "const", "load", "load_offset", "vload",
               "store", "vstore", "select", "vselect", "add_imm", "halt", "pause", "trace_write", "cond_jump",
               "cond_jump_rel", "jump", "jump_indirect", "coreid", "frobnicate"]

    def operand():
        k = rng.random()
        if k < 0.9:
            return rng.randrange(0, 40)
        return rng.choice([-1, SCRATCH_SIZE, SCRATCH_SIZE - 3, 2 ** 33, -(2 ** 45), 2 ** 61])

    well_formed = {"alu": [("+", 1, 2, 3), ("<", 4, 5, 6)], "valu": [("vbroadcast", 8, 1), ("*", 16, 8, 8)],
                   "load": [("const", 1, 2 ** 33), ("load_offset", 2, 1, 3)], "store": [("vstore", 1, 8)],
                   "flow": [("jump", -2), ("cond_jump_rel", 1, -3), ("cond_jump_rel", 1, 2), ("add_imm", 1, 2, -9)]}

    def slot(engine):
        if engine in well_formed and rng.random() < 0.5:
            return rng.choice(well_formed[engine])
        return (rng.choice(opcodes), *[operand() for _ in range(rng.randrange(0, 5))])

    program = []
    for index in range(n):
        bundle: dict = {}
        for engine in rng.sample(engines + ["debug", "tpu"], rng.randrange(0, 5)):
            count = rng.randrange(0, 3) if rng.random() < 0.9 else rng.randrange(0, 15)
            bundle[engine] = [slot(engine) for _ in range(count)]
        program.append(bundle)
    return program


