"""The VLIW machine, instruction by instruction (spec sections 2-4 and 8).

Every rule is checked on both engines: the plain reference (the executable specification) and the
fast numba path. A differential test then runs random programs through both and requires
identical results."""

from __future__ import annotations

import random

import pytest

from heldout.benchmarks.vliw import InvalidInput, simulate, words_sha256
from heldout.benchmarks.vliw.fast import SLOT_FORMS
from heldout.benchmarks.vliw.reference import MASK, SCRATCH_SIZE

ENGINES = ("reference", "fast")
W = MASK


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


def run(engine, program, mem=None, **kw):
    return simulate(program, [0] * 16 if mem is None else mem, engine=engine, **kw)


def consts(**values):
    """One bundle per pair of consts (the load engine has 2 slots): scratch[addr] = value."""
    items = [("const", int(k[1:]), v) for k, v in values.items()]
    return [{"load": items[i:i + 2]} for i in range(0, len(items), 2)]


# -- ALU -----------------------------------------------------------------------------------------
ALU_CASES = [
    ("+", 5, 7, 12), ("+", W, 1, 0), ("+", W, W, W - 1),
    ("-", 5, 7, 4294967294), ("-", 0, 1, W), ("-", 7, 5, 2),
    ("*", 65536, 65536, 0), ("*", W, W, 1), ("*", 123456, 789, (123456 * 789) & W),
    ("//", 7, 2, 3), ("//", W, 1, W), ("//", 0, 5, 0),
    ("cdiv", 7, 2, 4), ("cdiv", 0, 3, 0), ("cdiv", 6, 3, 2), ("cdiv", W, W, 1), ("cdiv", W, 2, 2**31),
    ("%", 7, 3, 1), ("%", W, 10, W % 10),
    ("^", 0b1100, 0b1010, 0b0110), ("&", 0b1100, 0b1010, 0b1000), ("|", 0b1100, 0b1010, 0b1110),
    ("<<", 1, 31, 2**31), ("<<", 3, 31, 2**31), ("<<", 1, 32, 0), ("<<", 1, 33, 0), ("<<", W, 0, W),
    ("<<", 1, 1000, 0),
    (">>", 2**31, 31, 1), (">>", W, 32, 0), (">>", W, 1, 2**31 - 1), (">>", 8, 40, 0),
    ("<", 1, 2, 1), ("<", 2, 1, 0), ("<", 2, 2, 0), ("<", 0, W, 1),
    ("==", 3, 3, 1), ("==", 3, 4, 0),
]


@pytest.mark.parametrize("op,x,y,expected", ALU_CASES)
def test_alu_ops_wrap_unsigned_and_give_0_1_comparisons(engine, op, x, y, expected):
    r = run(engine, consts(s1=x, s2=y) + [{"alu": [(op, 3, 1, 2)]}])
    assert r.ok and r.scratch[3] == expected


@pytest.mark.parametrize("op", ["//", "%", "cdiv"])
def test_zero_divisor_faults_and_commits_nothing(engine, op):
    r = run(engine, consts(s1=9) + [{"alu": [("+", 5, 1, 1), (op, 3, 1, 2)]}])
    assert r.fault.kind == "zero_division" and r.fault.bundle == 1
    assert r.scratch[5] == 0  # the bundle's other pending write was discarded
    assert r.cycles == 1 and r.pc == 2  # faulting bundle not charged; pc already advanced


# -- VALU ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("op,x,y,expected", [c for c in ALU_CASES if c[2] != 0 or c[0] not in ("//", "%", "cdiv")])
def test_valu_ops_are_lane_wise(engine, op, x, y, expected):
    setup = [{"load": [("const", 0, x), ("const", 1, y)]},
             {"valu": [("vbroadcast", 16, 0), ("vbroadcast", 24, 1)]},
             {"load": [("const", 27, 0), ("const", 28, 0)]}]  # lanes 3 and 4 of b become 0
    r = run(engine, setup + [{"valu": [(op, 40, 16, 24)]}])
    from heldout.benchmarks.vliw.reference import alu
    want = [expected] * 8
    if op not in ("//", "%", "cdiv"):
        want[3] = want[4] = alu(op, x, 0)
        assert r.ok and r.scratch[40:48] == want
    else:
        assert r.fault.kind == "zero_division"  # one zero lane faults the whole slot


def test_multiply_add_wraps_after_multiply_and_after_add(engine):
    prog = consts(s0=W, s1=W, s2=5) + [
        {"valu": [("vbroadcast", 8, 0), ("vbroadcast", 16, 1), ("vbroadcast", 24, 2)]},
        {"valu": [("multiply_add", 32, 8, 16, 24)]},
    ]
    r = run(engine, prog)
    assert r.scratch[32:40] == [6] * 8  # (W*W mod 2^32) = 1, + 5 ... = 6


def test_vector_operands_may_overlap_and_read_pre_bundle_state(engine):
    prog = [{"load": [("const", i, i + 1)]} for i in range(9)] + [{"valu": [("+", 1, 0, 0)]}]
    r = run(engine, prog)
    assert r.scratch[1:9] == [2 * (i + 1) for i in range(8)]


@pytest.mark.parametrize("engine_name,slot", [
    ("valu", ("vbroadcast", 8, 0, 1)),      # 4-tuple vbroadcast is an unknown lane op
    ("valu", ("multiply_add", 8, 0, 1)),    # 4-tuple multiply_add too
    ("alu", ("multiply_add", 8, 0, 1, 2)),  # multiply_add exists only on the VALU
    ("alu", ("vbroadcast", 8, 0)),
    ("alu", ("const", 3, 5)),               # const belongs to the load engine
    ("alu", ("min", 3, 1, 2)),
    ("load", ("load", 3, 1, 2)),
    ("store", ("store", 3)),
    ("flow", ("halt", 1)),
    ("flow", ("jump",)),
    ("alu", ("+", 3, 1, 2.0)),              # operands are integers
    ("alu", ("+", 3, 1, True)),
    ("alu", ["+"]),
    ("alu", 7),
])
def test_unknown_opcodes_and_wrong_shapes_fault(engine, engine_name, slot):
    r = run(engine, [{engine_name: [slot]}])
    assert r.fault is not None and r.fault.kind == "bad_slot" and r.fault.bundle == 0
    assert r.cycles == 0


@pytest.mark.parametrize("engine_name,opcode,count", sorted((e, op, n) for (e, op), (n, _) in SLOT_FORMS.items()))
def test_every_slot_form_of_the_decoder_is_one_the_reference_machine_accepts(engine, engine_name, opcode, count):
    # the fast decoder's table of forms against the specification: each form runs (operand 8 is a
    # valid scratch address, room for a vector); one operand more or fewer is a bad slot on both
    accepted = run(engine, [{engine_name: [(opcode, *[8] * count)]}], cycle_cap=50)
    assert accepted.fault is None or accepted.fault.kind != "bad_slot"
    for wrong in (count - 1, count + 1):
        if wrong >= 0:
            refused = run(engine, [{engine_name: [(opcode, *[8] * wrong)]}], cycle_cap=50)
            assert refused.fault is not None and refused.fault.kind == "bad_slot"


# -- LOAD / STORE --------------------------------------------------------------------------------
def test_loads(engine):
    mem = [10 * i for i in range(32)]
    prog = consts(s0=3, s1=20) + [
        {"load": [("load", 2, 0), ("vload", 8, 1)]},
        {"load": [("const", 20, 5), ("const", 21, 6)]},
        {"load": [("load_offset", 40, 19, 1), ("load_offset", 40, 19, 2)]},
        {"load": [("const", 60, -1), ("const", 61, 2**40 + 7)]},
    ]
    r = run(engine, prog, mem)
    assert r.scratch[2] == 30
    assert r.scratch[8:16] == [10 * i for i in range(20, 28)]
    # load_offset offsets the two scratch addresses, not the memory address
    assert r.scratch[41] == 50 and r.scratch[42] == 60
    assert r.scratch[60] == W and r.scratch[61] == 7


def test_store_takes_address_register_then_source(engine):
    prog = consts(s0=4, s1=77, s2=8) + [
        {"valu": [("vbroadcast", 16, 1)]},
        {"store": [("store", 0, 1), ("vstore", 2, 16)]},
    ]
    r = run(engine, prog, [0] * 16)
    assert r.memory[4] == 77 and r.memory[8:16] == [77] * 8 and r.memory[0] == 0


def test_load_and_store_of_one_address_in_one_bundle_see_the_old_value(engine):
    prog = consts(s0=3, s1=99) + [{"store": [("store", 0, 1)], "load": [("load", 5, 0)]}]
    r = run(engine, prog, [0, 0, 0, 42])
    assert r.scratch[5] == 42 and r.memory[3] == 99


def test_two_alu_slots_swap_registers(engine):
    prog = consts(s1=11, s2=22, s0=0) + [{"alu": [("+", 1, 2, 0), ("+", 2, 1, 0)]}]
    r = run(engine, prog)
    assert (r.scratch[1], r.scratch[2]) == (22, 11)


# -- write conflicts -----------------------------------------------------------------------------
def test_last_writer_in_key_order_then_slot_order_wins(engine):
    base = consts(s1=5, s2=6)
    alu_then_load = {"alu": [("+", 3, 1, 2)], "load": [("const", 3, 100)]}
    load_then_alu = {"load": [("const", 3, 100)], "alu": [("+", 3, 1, 2)]}
    assert run(engine, base + [alu_then_load]).scratch[3] == 100
    assert run(engine, base + [load_then_alu]).scratch[3] == 11
    within = {"alu": [("+", 3, 1, 1), ("+", 3, 2, 2), ("+", 4, 1, 2)]}
    assert run(engine, base + [within]).scratch[3] == 12
    # a scalar write after a vector lane wins for that lane only
    lane = {"valu": [("vbroadcast", 8, 1)], "flow": [("add_imm", 10, 2, 1)]}
    assert run(engine, base + [lane]).scratch[8:16] == [5, 5, 7, 5, 5, 5, 5, 5]
    # memory: later store to the same address wins
    stores = consts(s0=2, s1=5, s2=6) + [{"store": [("store", 0, 1), ("store", 0, 2)]}]
    assert run(engine, stores).memory[2] == 6


# -- cycle accounting ----------------------------------------------------------------------------
@pytest.mark.parametrize("bundle,cost", [
    ({}, 0), ({"debug": [("comment", "x")]}, 0), ({"debug": [("comment", "x")] * 100}, 0),
    ({"alu": []}, 1), ({"debug": [], "alu": []}, 1), ({"flow": [("pause",)]}, 1),
])
def test_cycles_are_charged_by_key_presence(engine, bundle, cost):
    r = run(engine, [bundle, bundle, bundle])
    assert r.ok and r.cycles == 3 * cost and r.pc == 3 and r.state == "STOPPED"


# -- control flow --------------------------------------------------------------------------------
def test_jumps_absolute_relative_indirect_and_past_the_end(engine):
    prog = [
        {"load": [("const", 0, 1), ("const", 1, 6)]},   # 0
        {"flow": [("jump", 3)]},                        # 1
        {"load": [("const", 10, 1)]},                   # 2 skipped
        {"flow": [("cond_jump_rel", 0, 1)]},            # 3 -> 5 (relative to the next bundle)
        {"load": [("const", 11, 1)]},                   # 4 skipped
        {"flow": [("jump_indirect", 1)]},               # 5 -> 6
        {"flow": [("cond_jump", 2, 0)]},                # 6 not taken (scratch[2] == 0)
        {"flow": [("cond_jump", 0, 9)]},                # 7 -> 9
        {"load": [("const", 12, 1)]},                   # 8 skipped
        {"flow": [("jump", 1000)]},                     # 9 past the end: stop
        {"load": [("const", 13, 1)]},
    ]
    r = run(engine, prog)
    assert r.ok and r.state == "STOPPED" and r.pc == 1000
    assert r.scratch[10:14] == [0, 0, 0, 0]
    assert r.cycles == 7  # bundles 0, 1, 3, 5, 6, 7, 9


def test_loops_count_every_iteration(engine):
    prog = consts(s0=5, s1=1) + [
        {"alu": [("-", 0, 0, 1)], "flow": [("add_imm", 2, 2, 3)]},  # 1: body
        {"flow": [("cond_jump", 0, 1)]},                            # 2: back while s0 != 0
    ]
    r = run(engine, prog)
    assert r.scratch[2] == 15 and r.cycles == 1 + 2 * 5


def test_negative_jump_target_is_a_fault(engine):
    r = run(engine, [{"load": [("const", 0, 1)]}, {"flow": [("cond_jump_rel", 0, -5)]}])
    assert r.fault.kind == "bad_jump" and r.fault.bundle == 1
    assert run(engine, [{"flow": [("jump", -1)]}]).fault.kind == "bad_jump"


def test_halt_inside_a_busy_bundle_still_commits_and_costs_a_cycle(engine):
    prog = [{"flow": [("halt",)], "load": [("const", 0, 7)], "alu": [("+", 1, 0, 0)]},
            {"load": [("const", 2, 9)]}]
    r = run(engine, prog)
    assert r.state == "STOPPED" and r.cycles == 1 and r.pc == 1
    assert r.scratch[:3] == [7, 0, 0]


def test_pause_enabled_stops_run_and_the_next_run_resumes(engine):
    prog = [{"load": [("const", 0, 1)]}, {"flow": [("pause",)], "load": [("const", 1, 2)]},
            {"load": [("const", 2, 3)]}]
    once = run(engine, prog, enable_pause=True)
    assert once.state == "PAUSED" and once.pc == 2 and once.cycles == 2 and once.scratch[:3] == [1, 2, 0]
    twice = run(engine, prog, enable_pause=True, runs=2)
    assert twice.state == "STOPPED" and twice.cycles == 3 and twice.scratch[:3] == [1, 2, 3]
    disabled = run(engine, prog)
    assert disabled.state == "STOPPED" and disabled.cycles == 3


def test_trace_write_and_coreid(engine):
    r = run(engine, [{"load": [("const", 0, 9)]}, {"flow": [("trace_write", 0)]}, {"flow": [("coreid", 0)]}])
    assert r.ok and r.scratch[0] == 0 and r.cycles == 3
    assert run(engine, [{"flow": [("trace_write", SCRATCH_SIZE)]}]).fault.kind == "scratch_range"


def test_select_and_vselect(engine):
    prog = consts(s0=1, s1=0, s2=10, s3=20) + [
        {"flow": [("select", 4, 0, 2, 3)]}, {"flow": [("select", 5, 1, 2, 3)]},
        {"valu": [("vbroadcast", 16, 2), ("vbroadcast", 24, 3)]},
        {"load": [("const", 34, 1), ("const", 37, 5)]},
        {"flow": [("vselect", 40, 32, 16, 24)]},
    ]
    r = run(engine, prog)
    assert r.scratch[4] == 10 and r.scratch[5] == 20
    assert r.scratch[40:48] == [20, 20, 10, 20, 20, 10, 20, 20]


def test_add_imm_takes_negative_immediates(engine):
    r = run(engine, consts(s0=3) + [{"flow": [("add_imm", 1, 0, -5)]}])
    assert r.scratch[1] == W - 1


# -- faults --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,limit", [("alu", 12), ("valu", 6), ("load", 2), ("store", 2), ("flow", 1)])
def test_slot_limits(engine, name, limit):
    slot = {"alu": ("+", 0, 0, 0), "valu": ("+", 0, 0, 0), "load": ("const", 0, 1),
            "store": ("store", 0, 0), "flow": ("add_imm", 0, 0, 0)}[name]
    assert run(engine, [{name: [slot] * limit}]).ok
    r = run(engine, [{name: [slot] * (limit + 1)}])
    assert r.fault.kind == "slot_overflow" and r.cycles == 0


def test_control_effects_before_a_fault_in_the_same_bundle_remain(engine):
    r = run(engine, [{"flow": [("jump", 7)], "alu": [("+", 0, 0, 0)] * 13}])
    assert r.fault.kind == "slot_overflow" and r.pc == 7 and r.state == "RUNNING"


def test_unknown_engine(engine):
    r = run(engine, [{"alu": [("+", 0, 0, 0)]}, {"gpu": []}])
    assert r.fault.kind == "unknown_engine" and r.fault.bundle == 1 and r.cycles == 1


def test_memory_range(engine):
    mem = [0] * 16
    read = run(engine, consts(s0=16) + [{"load": [("load", 1, 0)]}], mem)
    assert read.fault.kind == "memory_range"
    vread = run(engine, consts(s0=9) + [{"load": [("vload", 1, 0)]}], mem)
    assert vread.fault.kind == "memory_range"
    # An out-of-range write faults at commit, after the writes before it (lanes 0..4 land).
    prog = consts(s0=11, s1=5) + [{"valu": [("vbroadcast", 8, 1)]},
                                  {"store": [("vstore", 0, 8)], "load": [("const", 30, 3)]}]
    vwrite = run(engine, prog, mem)
    assert vwrite.fault.kind == "memory_range" and vwrite.fault.bundle == 2
    assert vwrite.memory[11:16] == [5] * 5 and vwrite.scratch[30] == 3 and vwrite.cycles == 2


def test_scratch_range_including_negative_addresses(engine):
    assert run(engine, [{"alu": [("+", 0, SCRATCH_SIZE, 0)]}]).fault.kind == "scratch_range"
    assert run(engine, [{"alu": [("+", 0, -1, 0)]}]).fault.kind == "scratch_range"
    assert run(engine, [{"valu": [("+", 0, SCRATCH_SIZE - 7, 0)]}]).fault.kind == "scratch_range"
    write = run(engine, [{"load": [("const", 0, 4), ("const", SCRATCH_SIZE, 4)]}])
    assert write.fault.kind == "scratch_range" and write.scratch[0] == 4  # earlier write committed
    assert run(engine, [{"load": [("const", -1, 4)]}]).fault.kind == "scratch_range"
    assert run(engine, [{"load": [("load_offset", 0, 0, -1)]}]).fault.kind == "scratch_range"


def test_cycle_cap_stops_a_program_that_never_ends(engine):
    r = run(engine, [{"flow": [("jump", 0)]}], cycle_cap=1000)
    assert r.fault.kind == "cycle_cap" and r.cycles == 1000 and r.fault.bundle == 0
    assert run(engine, [{"alu": []}] * 5, cycle_cap=5).ok


def test_bad_bundles_fault_only_when_executed(engine):
    prog = [{"flow": [("halt",)]}, ["not", "a", "bundle"], {"gpu": [("x",)]}]
    assert run(engine, prog).ok
    r = run(engine, prog[1:])
    assert r.fault.kind == "bad_bundle" and r.fault.bundle == 0


def test_bad_machine_input_is_rejected_clearly():
    with pytest.raises(InvalidInput, match="memory word 1"):
        simulate([], [0, -1])
    for bad in (True, 2**32, 1.0, "7", None):  # the fast check lets only exact ints in range through
        with pytest.raises(InvalidInput, match="memory word 2"):
            simulate([], [0, 5, bad])
    with pytest.raises(InvalidInput, match="scratch_init"):
        simulate([], [0], scratch_init={"2000": 1})
    with pytest.raises(InvalidInput, match="list of bundles"):
        simulate({"alu": []}, [0])


def test_words_sha256_packs_little_endian_uint32():
    import hashlib
    assert words_sha256([1, 2**32 - 1]) == hashlib.sha256(b"\x01\0\0\0\xff\xff\xff\xff").hexdigest()


# -- differential: random programs, both engines, identical results -----------------------------
def random_program(rng: random.Random, n: int) -> list[dict]:
    alu_ops = ["+", "-", "*", "^", "&", "|", "<<", ">>", "<", "=="]

    def alu_op():  # divisions are rare, or nearly every program would end in zero_division
        return rng.choice(["//", "cdiv", "%"]) if rng.random() < 0.01 else rng.choice(alu_ops)

    def addr(width=1):
        if rng.random() < 0.0005:
            return rng.choice([-1, SCRATCH_SIZE, SCRATCH_SIZE - width + 1])
        return rng.randrange(0, 64)

    def mem_addr():  # mostly a pointer register (100..107, never a destination), sometimes anything
        return rng.randrange(100, 108) if rng.random() < 0.9 else addr()

    def slot(engine):
        if engine == "alu":
            return (alu_op(), addr(), addr(), addr())
        if engine == "valu":
            k = rng.random()
            if k < 0.15:
                return ("vbroadcast", addr(8), addr())
            if k < 0.3:
                return ("multiply_add", addr(8), addr(8), addr(8), addr(8))
            return (alu_op(), addr(8), addr(8), addr(8))
        if engine == "load":
            k = rng.random()
            if k < 0.4:
                return ("const", addr(), rng.choice([rng.randrange(0, 40), rng.randrange(0, 2**32), -3, 33]))
            if k < 0.6:
                return ("load", addr(), mem_addr())
            if k < 0.8:
                return ("vload", addr(8), mem_addr())
            return ("load_offset", addr(), 100, rng.randrange(0, 8))
        if engine == "store":
            return (rng.choice(["store", "vstore"]), mem_addr(), addr(8))
        k = rng.random()
        if k < 0.3:
            return ("add_imm", addr(), addr(), rng.randrange(-50, 50))
        if k < 0.45:
            return (rng.choice(["select", "vselect"]), addr(8), addr(8), addr(8), addr(8))
        if k < 0.6:
            return ("cond_jump", addr(), rng.randrange(0, n + 2))
        if k < 0.7:
            return ("cond_jump_rel", addr(), rng.randrange(-4, 4))
        if k < 0.75:
            return ("jump_indirect", addr())
        if k < 0.8:
            return ("halt",)
        if k < 0.9:
            return ("pause",)
        return ("trace_write", addr())

    limits = {"alu": 12, "valu": 6, "load": 2, "store": 2, "flow": 1}
    program = []
    for _ in range(n):
        engines = rng.sample(list(limits), rng.randrange(0, 5))
        bundle: dict = {}
        for e in engines:
            count = rng.randrange(0, limits[e] + (2 if rng.random() < 0.02 else 1))
            bundle[e] = [slot(e) for _ in range(count)]
        if rng.random() < 0.1:
            bundle["debug"] = [("comment", "x")]
        program.append(bundle)
    return program


def test_fast_path_matches_reference_on_random_programs():
    rng = random.Random(20240607)
    outcomes = set()
    for case in range(600):
        program = random_program(rng, rng.randrange(1, 40))
        mem = [rng.choice([rng.randrange(0, 64), rng.randrange(0, 2**32)]) for _ in range(64)]
        init = {a: rng.randrange(0, 64) for a in range(72)}
        init.update({a: rng.randrange(0, 57) for a in range(100, 108)})
        kw = dict(enable_pause=rng.random() < 0.3, runs=rng.randrange(1, 3), cycle_cap=rng.choice([50, 3000]),
                  scratch_init=init)
        ref = simulate(program, mem, engine="reference", **kw)
        fast = simulate(program, mem, engine="fast", **kw)
        got = (fast.cycles, fast.pc, fast.state, fast.memory, fast.scratch, fast.slots, fast.bundles,
               None if fast.fault is None else (fast.fault.kind, fast.fault.bundle))
        want = (ref.cycles, ref.pc, ref.state, ref.memory, ref.scratch, ref.slots, ref.bundles,
                None if ref.fault is None else (ref.fault.kind, ref.fault.bundle))
        assert got == want, f"case {case}: {program}"
        outcomes.add(want[-1][0] if want[-1] else want[2])
    # the generator really exercises normal stops, pauses and several fault kinds
    assert {"STOPPED", "zero_division", "memory_range", "cycle_cap"} <= outcomes, outcomes
