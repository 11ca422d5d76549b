"""``heldout vliw simulate CASES.json``: one JSON line per case, identical on both engines."""

from __future__ import annotations

import hashlib
import json

import pytest

CASES = [
    {"name": "swap", "program": [{"load": [["const", 0, 5], ["const", 1, 7]]},
                                 {"alu": [["+", 0, 1, 2], ["+", 1, 0, 2]]}], "mem": [1, 2, 3]},
    {"name": "pause-resume", "program": [{"flow": [["pause"]]}, {"load": [["const", 0, 1]]}], "mem": [0],
     "enable_pause": True, "runs": 2, "scratch_init": {"3": 9}},
    {"name": "paused", "program": [{"flow": [["pause"]]}, {"load": [["const", 0, 1]]}], "mem": [0],
     "enable_pause": True},
    {"name": "div0", "program": [{"debug": [["comment", "x"]]}, {"alu": [["//", 0, 1, 2]]}], "mem": []},
    {"name": "store", "program": [{"load": [["const", 0, 1], ["const", 1, 42]]}, {"store": [["store", 0, 1]]}],
     "mem": [0, 0]},
]


def simulate_cli(warm_cli, tmp_path, cases, *extra):
    """``heldout vliw simulate``, a process of its own (forked warm: tests/warm_cli.py)."""
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    return warm_cli.run("vliw", "simulate", str(path), *extra, cwd=tmp_path, timeout=120)


def sha(words):
    return hashlib.sha256(b"".join(w.to_bytes(4, "little") for w in words)).hexdigest()


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_one_line_per_case_with_cycle_pc_state_hashes_and_error(warm_cli, tmp_path, engine):
    out = simulate_cli(warm_cli, tmp_path, CASES, "--engine", engine)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    by_name = {line["name"]: line for line in lines}
    assert [line["name"] for line in lines] == [c["name"] for c in CASES]
    assert set(lines[0]) == {"name", "cycle", "pc", "state", "memory_sha256", "scratch_sha256", "error"}
    swap = by_name["swap"]
    assert (swap["cycle"], swap["pc"], swap["state"], swap["error"]) == (2, 2, "STOPPED", None)
    assert swap["memory_sha256"] == sha([1, 2, 3])
    assert swap["scratch_sha256"] == sha([7, 5] + [0] * 1534)
    assert by_name["pause-resume"]["state"] == "STOPPED" and by_name["pause-resume"]["cycle"] == 2
    assert by_name["pause-resume"]["scratch_sha256"] == sha([1, 0, 0, 9] + [0] * 1532)
    assert (by_name["paused"]["state"], by_name["paused"]["pc"]) == ("PAUSED", 1)
    div0 = by_name["div0"]
    assert (div0["error"], div0["cycle"], div0["pc"], div0["state"]) == ("zero_division", 0, 2, "RUNNING")
    assert by_name["store"]["memory_sha256"] == sha([0, 42])


def test_both_engines_print_identical_lines(warm_cli, tmp_path):
    fast = simulate_cli(warm_cli, tmp_path, CASES)
    assert fast.stdout == simulate_cli(warm_cli, tmp_path, CASES, "--engine", "reference").stdout


@pytest.mark.parametrize("cases,message", [
    ("not json", "not valid JSON"),
    ({"name": "x"}, "expected a JSON list"),
    ([{"name": "x", "program": [], "mem": [2**32]}], "memory word 0"),
    ([{"name": "x", "program": []}], "missing 'mem'"),
    ([{"name": "x", "program": [], "mem": [], "extra": 1}], "unknown keys"),
])
def test_malformed_cases_give_a_clear_error(warm_cli, tmp_path, cases, message):
    path = tmp_path / "cases.json"
    path.write_text(cases if isinstance(cases, str) else json.dumps(cases))
    out = warm_cli.run("vliw", "simulate", str(path), cwd=tmp_path, timeout=120)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
