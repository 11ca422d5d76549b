"""MBPP+ code extraction: the solution inside a model's answer, at least as tolerant as
evalplus's sanitizer (``evalplus.sanitize.sanitize``), which is used when installed.

The rule (both backends): take the longest block of lines that parses as Python (so prose, fence
lines of any tag - ``python``, ``python3``, ``PYTHON``, none - and a missing closing fence do not
matter), then keep only its imports and the top-level definitions the entry point needs (its
function, the helpers, classes and constants it names, transitively): demo ``assert``s,
``print(...)``, ``input()`` calls and ``if __name__ == "__main__":`` blocks are dropped, since
they would run (or block) at import. Like evalplus, a function with no ``return`` is not a
definition to keep and the first definition of a name wins.

heldout's own backend looks at fenced blocks first (the last block that defines the entry point)
and parses at most :data:`MAX_SEARCH_LINES` lines with the quadratic longest-block search, so a
long output cannot cost minutes; evalplus's search is cubic and is only used below that size. It
also reads three shapes evalplus's sanitizer does not: CRLF or CR line endings (read as ``\n``),
a fenced block indented as a whole (inside a list item: dedented), and a definition that starts
on a prose line after an answer cue (``So the answer is def f(a):``: when nothing else defines the
entry point, the line is split before ``def``). Where the two differ by design, evalplus takes the
longest parsable block and heldout the last fenced block that defines the entry point (a model's
corrected version after a draft)."""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from typing import Callable

MAX_SEARCH_LINES = 200

_FENCE_OPEN = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[ \t]*$")
_FENCE_CLOSE = re.compile(r"^[ \t]*```[ \t]*$")


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def fenced_blocks(text: str) -> list[str]:
    """The contents of every ``` block, whatever its tag, dedented as a whole (a block inside a
    list item is indented with its fence); an unclosed last block runs to the end."""
    blocks, current = [], None
    for line in text.split("\n"):
        if current is None:
            if _FENCE_OPEN.match(line):
                current = []
        elif _FENCE_CLOSE.match(line):
            blocks.append(textwrap.dedent("\n".join(current)))
            current = None
        else:
            current.append(line)
    if current is not None:
        blocks.append(textwrap.dedent("\n".join(current)))
    return blocks


def longest_parsable(text: str) -> str:
    """The longest run of lines (counted in non-blank lines) that parses as Python."""
    if _parses(text):
        return text
    lines = text.split("\n")[:MAX_SEARCH_LINES]
    weight = [0]
    for line in lines:
        weight.append(weight[-1] + bool(line.strip()))
    best, best_span = 0, (0, -1)
    for i in range(len(lines)):
        if not lines[i].strip() or lines[i][0] in " \t" or weight[-1] - weight[i] <= best:
            continue  # a block starts at a non-blank, unindented line; skip ones that cannot win
        for j in range(len(lines) - 1, i - 1, -1):
            if weight[j + 1] - weight[i] <= best:
                break
            if _parses("\n".join(lines[i:j + 1])):
                best, best_span = weight[j + 1] - weight[i], (i, j)
                break
    return "\n".join(lines[best_span[0]:best_span[1] + 1])


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def keep_definitions(code: str, entry_point: str | None) -> str:
    """Imports + the top-level definitions reachable from ``entry_point`` (all of them without one)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return ""
    imports, definitions = [], {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name not in definitions and any(isinstance(n, ast.Return) for n in ast.walk(node)):
                definitions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            definitions.setdefault(node.name, node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                definitions.setdefault(targets[0].id, node)
    keep = set(definitions)
    if entry_point:
        keep, queue = {entry_point}, [entry_point]
        while queue:
            node = definitions.get(queue.pop())
            for name in _names(node) if node is not None else ():
                if name in definitions and name not in keep:
                    keep.add(name)
                    queue.append(name)
    chosen = [n for n in tree.body if n in imports or (n in definitions.values() and _defined_name(n) in keep)]
    return "\n".join(ast.get_source_segment(code, n) or "" for n in chosen).strip()


def _defined_name(node: ast.AST) -> str:
    if isinstance(node, ast.Assign):
        return node.targets[0].id  # type: ignore[union-attr]
    if isinstance(node, ast.AnnAssign):
        return node.target.id  # type: ignore[union-attr]
    return node.name  # type: ignore[attr-defined]


# Prose then ``def`` on one line ("So the answer is def f(a):"). The prose holds no quote, "#",
# bracket or "=": in Python code, ``def`` only opens a statement, so such a line is never code.
_DEF_AFTER_PROSE = re.compile(
    r"^([ \t]*[A-Za-z][^\n\"#`=()\[\]{}]*?)(?<!\basync)[ \t]+(?=(?:async[ \t]+)?def[ \t]+\w+[ \t]*\()", re.MULTILINE)


def sanitize_heldout(text: str, entry_point: str | None) -> str:
    """heldout's own equivalent of evalplus's sanitizer, plus the shapes it reads beyond it (see
    the module doc)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    code = _sanitize_lines(text, entry_point)
    if entry_point and not defines(code, entry_point):
        split = _DEF_AFTER_PROSE.sub(lambda m: m.group(1) + "\n", text)
        if split != text:
            code = _sanitize_lines(split, entry_point)
    return code


def _sanitize_lines(text: str, entry_point: str | None) -> str:
    blocks = fenced_blocks(text)
    if entry_point:
        defining = [b for b in blocks if re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", b)]
        blocks = defining or blocks
    region = longest_parsable(blocks[-1] if blocks else text)
    return keep_definitions(region, entry_point) or region


@functools.cache
def evalplus_sanitizer() -> Callable[[str, str | None], str] | None:
    """evalplus's sanitizer, or None when evalplus is not installed. Imported at the first
    extraction, not with this module: evalplus.sanitize imports HF datasets and pandas (about
    1 CPU-s), which every process that loads the task registry paid without extracting code."""
    try:
        from evalplus.sanitize import sanitize
    except Exception:  # noqa: BLE001 - evalplus (and tree-sitter) are optional
        return None
    return lambda text, entry_point: sanitize(text, entry_point)


BACKENDS = ("auto", "evalplus", "heldout")


def extract_code(text: str, entry_point: str | None, *, backend: str = "auto") -> str | None:
    """The solution code in a model answer, or None when it holds no definition of ``entry_point``.

    ``backend``: ``evalplus`` (its sanitizer; ``ValueError`` if not installed), ``heldout``
    (:func:`sanitize_heldout`), ``auto`` (evalplus when installed and the text has at most
    :data:`MAX_SEARCH_LINES` lines, else heldout's)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown code extraction backend {backend!r}; expected one of {BACKENDS}")
    evalplus = evalplus_sanitizer() if backend != "heldout" else None
    if backend == "evalplus" and evalplus is None:
        raise ValueError("the evalplus backend needs evalplus installed (pip install heldout[evalplus])")
    use_evalplus = evalplus is not None and (backend == "evalplus" or text.count("\n") < MAX_SEARCH_LINES)
    code = evalplus(text, entry_point) if use_evalplus else sanitize_heldout(text, entry_point)
    if entry_point and not defines(code, entry_point):
        return None
    return code


def defines(code: str, name: str) -> bool:
    """Whether ``code`` parses and defines ``name`` at top level (a function, class or assignment)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False
