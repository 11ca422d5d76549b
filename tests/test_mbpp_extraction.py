"""MBPP+ code extraction: the common output shapes of a correct function all pass, through
evalplus's sanitizer (where installed) and through heldout's own equivalent alike."""

from __future__ import annotations

import pytest

from heldout.benchmarks.extraction.code import EVALPLUS_SANITIZE, extract_code, sanitize_heldout
from heldout.benchmarks.mbpp_plus.execution import check_solution, load_problems
from heldout.contracts import RunLimits

FUNCTION = "def square_perimeter(a):\n    return 4 * a"
HELPERS = "import math\n\nSIDES = 4\n\ndef _sides():\n    return SIDES\n\ndef square_perimeter(a):\n    return _sides() * a"

# The eleven shapes the fidelity audit found (a correct Mbpp/17 function in each).
SHAPES = {
    "fence python": f"Here is the function:\n```python\n{FUNCTION}\n```\nIt multiplies by four.",
    "fence python3": f"```python3\n{FUNCTION}\n```",
    "fence PYTHON": f"```PYTHON\n{FUNCTION}\n```",
    "fence without a tag": f"```\n{FUNCTION}\n```",
    "no fence, prose around": f"Sure! The perimeter is four sides.\n\n{FUNCTION}\n\nThis runs in O(1).",
    "truncated fence": f"```python\n{FUNCTION}\n",
    "demo assert next to it": f"```python\n{FUNCTION}\n\nassert square_perimeter(10) == 40\n```",
    "input() next to it": f"```python\n{FUNCTION}\n\nn = int(input())\nprint(square_perimeter(n))\n```",
    "a __main__ block": f"```python\n{FUNCTION}\n\nif __name__ == '__main__':\n    print(square_perimeter(int(input())))\n```",
    "helpers, constants and imports": f"```python\n{HELPERS}\n\nprint(square_perimeter(3))\n```",
    "explanation block, then the code": f"Idea:\n```text\nperimeter = 4 * side\n```\nCode:\n```py\n{FUNCTION}\n```",
}
BACKENDS = ["heldout"] + (["evalplus"] if EVALPLUS_SANITIZE is not None else [])
LIMITS = RunLimits(wall_seconds=60, cpu_seconds=60, memory_mb=2048)


@pytest.fixture(scope="module")
def problem(data_dir):
    return next(p for p in load_problems(data_dir / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl") if p["task_id"] == "Mbpp/17")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_of_a_correct_function_passes(problem, shape, backend):
    code = extract_code(SHAPES[shape], "square_perimeter", backend=backend)
    assert code is not None and "input(" not in code and "assert " not in code and "print(" not in code
    result = check_solution(problem, code, limits=LIMITS)
    assert result.base_pass and result.plus_pass, (shape, backend, code, result.first_failure())


@pytest.mark.skipif(EVALPLUS_SANITIZE is None, reason="evalplus is not installed (pip install heldout[evalplus])")
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_heldout_keeps_the_same_definitions_as_evalplus(shape):
    import ast

    def names(code):
        return [getattr(n, "name", None) or ast.unparse(n) for n in ast.parse(code).body]
    assert names(sanitize_heldout(SHAPES[shape], "square_perimeter")) == names(
        EVALPLUS_SANITIZE(SHAPES[shape], "square_perimeter"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_answer_without_the_function_has_no_code(backend):
    assert extract_code("I would multiply the side by four.", "square_perimeter", backend=backend) is None
    assert extract_code("```python\ndef perimeter(a):\n    return 4 * a\n```", "square_perimeter",
                        backend=backend) is None


def test_a_long_output_is_searched_in_bounded_time():
    prose = "\n".join(f"line {i} of musing about squares" for i in range(5000))
    assert extract_code(f"{prose}\n```python\n{FUNCTION}\n```", "square_perimeter") == FUNCTION


def test_an_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="backend"):
        extract_code(FUNCTION, "square_perimeter", backend="regex")


def test_the_task_scores_every_shape_and_says_when_there_is_no_code(data_dir):
    from heldout.benchmarks.registry import get_benchmark

    bench = get_benchmark("mbpp_plus")
    example = next(ex for ex in bench.load_raw(str(data_dir)) if ex.id == "Mbpp/17")
    assert bench.score_text(SHAPES["fence python3"], example).score == 1.0
    none = bench.score_text("The perimeter is 4a.", example)
    assert none.valid and none.score == 0.0 and "no Python code" in none.feedback
    assert "```python" in bench.seed_candidate()["instruction"] and "answer is" not in bench.seed_candidate()["instruction"]


def test_a_numpy_array_return_is_judged_as_evalplus_judges_it(data_dir, problem):
    """evalplus compares ``out == exp``: a numpy array makes that elementwise, so a multi-element
    array fails (ambiguous truth value) even when its values are right; a numpy scalar passes."""
    problems = {p["task_id"]: p for p in load_problems(data_dir / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl")}
    as_array = "import numpy as np\nimport heapq\ndef heap_queue_largest(nums, n):\n    return np.array(heapq.nlargest(n, nums))\n"
    assert not check_solution(problems["Mbpp/4"], as_array, limits=LIMITS).base_pass
    scalar = "import numpy as np\ndef square_perimeter(a):\n    return np.int64(4) * a\n"
    assert check_solution(problem, scalar, limits=LIMITS).base_pass
