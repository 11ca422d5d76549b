"""All 378 MBPP+ canonical solutions pass their base and plus tests through the sandboxed path.

The slowest test of the suite: a handful of canonical solutions compute for tens of seconds on
their plus inputs (Mbpp/599 23 s of CPU), and as in evalplus each problem's expected outputs
come from one run of the canonical solution (its inputs dealt over the two workers) and the check
from another (one process per problem, so it also shows that dealing the inputs out changed no
expected output). The expected outputs are kept between runs (``mbpp_truths``: keyed by the data
file and the code that computes them), so a run after the first on a machine only checks: half
the work. ``test_mbpp_exec`` computes expected outputs afresh, dealt and alone."""

from __future__ import annotations

import pytest

from heldout.contracts import RunLimits
from heldout.benchmarks.mbpp_plus import execution
from heldout.benchmarks.mbpp_plus.execution import check_many, load_problems
from mbpp_truths import kept_truths


@pytest.fixture(scope="module")
def data_file(data_dir):
    return data_dir / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl"


@pytest.fixture(scope="module", autouse=True)
def truths(data_file):
    with kept_truths(data_file) as kept:
        yield kept


def test_every_canonical_solution_passes_base_and_plus(data_file, truths):
    problems = load_problems(data_file)
    assert len(problems) == 378
    results = check_many([(p, p["prompt"] + p["canonical_solution"]) for p in problems], workers=2,
                         limits=RunLimits(wall_seconds=120, cpu_seconds=120, memory_mb=4096))
    failing = {r.task_id: r.first_failure() for r in results if not (r.base_pass and r.plus_pass)}
    assert failing == {}
    assert sum(r.base.total for r in results) == sum(len(p["base_input"]) for p in problems)
    # every problem's expected outputs, computed here or kept from a run before (the kept file also
    # holds other modules' truths, e.g. the load test's problems on a few of their inputs)
    assert {execution._problem_key(p) for p in problems} <= set(truths)
