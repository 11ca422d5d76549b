"""MBPP+ code extraction: a correct function passes in every output shape a model writes it in,
through heldout's own extractor; evalplus's sanitizer (where installed) keeps the same definitions
on every shape but four, where the two differ by design and the test names how."""

from __future__ import annotations

import ast

import pytest

from heldout.benchmarks.extraction.code import evalplus_sanitizer, extract_code
from heldout.benchmarks.mbpp_plus.execution import check_solution, load_problems
from heldout.contracts import RunLimits

# A correct Mbpp/17 function, written as models write it (a docstring), in each shape.
FUNCTION = 'def square_perimeter(a):\n    """The perimeter of a square with side a."""\n    return 4 * a'
DRAFT = "def square_perimeter(a):\n    # first try\n    total = 0\n    for _ in range(3):\n        total += a\n    return total"
HELPERS = "import math\n\nSIDES = 4\n\n\ndef _sides():\n    return SIDES\n\n\ndef square_perimeter(a):\n    return _sides() * a"


def indent(code: str, by: str = "   ") -> str:
    return "\n".join(by + line if line else line for line in code.split("\n"))


# Model outputs as they look: the audit's shapes (issue 20) and the ones issue 35 found.
SHAPES = {
    "fence python, prose before and after": (
        "Here is a function that returns the perimeter of a square:\n\n```python\n" + FUNCTION +
        "\n```\n\nA square has four equal sides, so the perimeter is `4 * a`; `square_perimeter(10)` returns `40`."),
    "fence python3": "Sure! Here's the code:\n```python3\n" + FUNCTION + "\n```\nThis runs in constant time.",
    "fence PYTHON": "```PYTHON\n" + FUNCTION + "\n```\n\nExplanation: multiply the side by 4.",
    "fence py": "Solution:\n\n```py\n" + FUNCTION + "\n```",
    "fence without a tag": "The function is:\n\n```\n" + FUNCTION + "\n```\n\nHope this helps!",
    "no fence, prose before and after": (
        "Sure! The perimeter of a square is four times its side.\n\n" + FUNCTION +
        "\n\nThis function runs in O(1) time and works for floats as well."),
    "truncated fence (cut at max tokens)": "Here is my solution:\n\n```python\n" + FUNCTION + "\n",
    "demo assert after the function": (
        "```python\n" + FUNCTION + "\n\n\n# Test the function\nassert square_perimeter(10) == 40\n"
        "assert square_perimeter(5) == 20\n```"),
    "input() and print() after the function": (
        "```python\n" + FUNCTION + '\n\n\nside = int(input("Enter the side: "))\nprint(square_perimeter(side))\n```'),
    "a __main__ block": (
        "```python\n" + FUNCTION + "\n\n\nif __name__ == \"__main__\":\n    print(square_perimeter(10))  # 40\n```"),
    "helpers, constants and imports": "```python\n" + HELPERS + "\n\n\nprint(square_perimeter(3))\n```",
    "explanation block, then the code": (
        "The idea:\n```text\nperimeter = 4 * side\n```\nIn Python:\n```python\n" + FUNCTION + "\n```"),
    "a usage block after the code": (
        "```python\n" + FUNCTION + "\n```\n\nUsage:\n\n```python\n>>> square_perimeter(10)\n40\n```"),
    "CRLF line endings, fenced": (
        "Here is the function:\r\n\r\n```python\r\n" + FUNCTION.replace("\n", "\r\n") +
        "\r\n```\r\n\r\nIt multiplies the side by four.\r\n"),
    "CRLF line endings, helpers and a demo": (
        ("```python\n" + HELPERS + "\n\nprint(square_perimeter(3))\n```\n").replace("\n", "\r\n")),
    "So the answer is def ...": (
        "Let's think step by step. A square has four sides of length a, so its perimeter is 4 * a.\n"
        "So the answer is def square_perimeter(a):\n    return 4 * a"),
    "Answer: def ... after reasoning": (
        "The perimeter is the sum of the four sides.\n\nAnswer: def square_perimeter(a):\n    return 4 * a\n"),
    "fenced block indented in a list item": (
        "1. Define the function:\n\n   ```python\n" + indent(FUNCTION) + "\n   ```\n\n2. Call it with the side length."),
    "a draft, then the corrected version": (
        "First attempt:\n```python\n" + DRAFT + "\n```\nThat loops three times, which is wrong. Fixed:\n"
        "```python\n" + FUNCTION + "\n```"),
}

# Where evalplus's sanitizer reads a shape differently, and what it reads instead.
EVALPLUS_DIFFERS = {
    "So the answer is def ...": None,  # the prose line does not parse, the body alone is indented
    "Answer: def ... after reasoning": None,
    "fenced block indented in a list item": None,  # no block of lines at column 0 parses
    "a draft, then the corrected version": DRAFT,  # the longest parsable block wins: the draft
}
AGREED = sorted(set(SHAPES) - set(EVALPLUS_DIFFERS))
BACKENDS = ["heldout"] + (["evalplus"] if evalplus_sanitizer() is not None else [])
needs_evalplus = pytest.mark.skipif(evalplus_sanitizer() is None,
                                    reason="evalplus is not installed (pip install heldout[evalplus])")
LIMITS = RunLimits(wall_seconds=60, cpu_seconds=60, memory_mb=2048)


@pytest.fixture(scope="module")
def problem(data_dir):
    return next(p for p in load_problems(data_dir / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl") if p["task_id"] == "Mbpp/17")


def assert_passes(problem, code, shape):
    assert code is not None and "input(" not in code and "assert " not in code and "print(" not in code, (shape, code)
    result = check_solution(problem, code, limits=LIMITS)
    assert result.base_pass and result.plus_pass, (shape, code, result.first_failure())


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_heldout_extracts_a_correct_function_from_every_shape(problem, shape):
    assert_passes(problem, extract_code(SHAPES[shape], "square_perimeter", backend="heldout"), shape)


@needs_evalplus
@pytest.mark.parametrize("shape", AGREED)
def test_evalplus_extracts_a_correct_function_from_every_shape_it_reads(problem, shape):
    assert_passes(problem, extract_code(SHAPES[shape], "square_perimeter", backend="evalplus"), shape)


@needs_evalplus
@pytest.mark.parametrize("shape", AGREED)
def test_heldout_keeps_the_same_code_as_evalplus_where_they_agree(shape):
    """The same statements (compared as syntax trees: evalplus keeps CRLF line endings, heldout
    reads them as newlines)."""
    heldout, evalplus = (extract_code(SHAPES[shape], "square_perimeter", backend=b) for b in ("heldout", "evalplus"))
    assert ast.dump(ast.parse(heldout)) == ast.dump(ast.parse(evalplus)), shape


@needs_evalplus
@pytest.mark.parametrize("shape", sorted(EVALPLUS_DIFFERS))
def test_where_the_backends_differ_by_design_evalplus_reads_what_the_table_says(shape):
    assert extract_code(SHAPES[shape], "square_perimeter", backend="evalplus") == EVALPLUS_DIFFERS[shape]


def test_auto_uses_evalplus_where_installed_so_its_readings_hold_there():
    auto = extract_code(SHAPES["So the answer is def ..."], "square_perimeter")
    assert auto == (None if evalplus_sanitizer() is not None else "def square_perimeter(a):\n    return 4 * a")


def test_a_prose_line_is_split_before_def_only_when_nothing_else_defines_the_entry_point():
    code = 'def square_perimeter(a):\n    """Four sides.\n\n    Then def square_perimeter(b) would shadow it.\n    """\n    return 4 * a'
    assert extract_code(code, "square_perimeter", backend="heldout") == code


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
