"""All 378 MBPP+ canonical solutions pass their base and plus tests through the sandboxed path.

The slowest test of the suite (about 2 minutes on 2 busy cores): a handful of canonical solutions
compute for tens of seconds on their plus inputs, and every problem runs twice, as in evalplus:
expected outputs (each problem's inputs dealt over the two workers), then the check (one process
per problem, so it also shows that dealing the inputs out changed no expected output)."""

from __future__ import annotations

from heldout.contracts import RunLimits
from heldout.benchmarks.mbpp_plus.execution import check_many, load_problems


def test_every_canonical_solution_passes_base_and_plus(data_dir):
    problems = load_problems(data_dir / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl")
    assert len(problems) == 378
    results = check_many([(p, p["prompt"] + p["canonical_solution"]) for p in problems], workers=2,
                         limits=RunLimits(wall_seconds=120, cpu_seconds=120, memory_mb=4096))
    failing = {r.task_id: r.first_failure() for r in results if not (r.base_pass and r.plus_pass)}
    assert failing == {}
    assert sum(r.base.total for r in results) == sum(len(p["base_input"]) for p in problems)
