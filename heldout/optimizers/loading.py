"""Finding, checking and loading an optimizer's code.

**User code is found, never run, by the harness.** A user's module (an optimizer, a plugin's
target, a DSPy program) is hostile until it is inside the sandbox: importing it in the harness,
even ``importlib.util.find_spec`` of a dotted name (which runs the parent packages'
``__init__.py``), would hand its module-level code the harness's privileges: the test labels, the
ledger key, the run dirs, heldout itself. So :func:`locate_target` finds its file by path alone
(:mod:`heldout.optimizers.user_modules`; a plugin where its distribution put it, editable installs
included), :func:`check_function` reads that file with :mod:`ast` for the function's name, and
:func:`optimizer_code_sha256` hashes the file's bytes; the isolated runner imports it inside the
sandbox. The harness's ``sys.path`` is never changed for it. Only heldout's own modules are
imported in-process, and user code only under ``--trusted-optimizer``, loaded from its file under
a name of its own (:func:`~heldout.optimizers.user_modules.load_trusted_function`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from heldout.contracts import HeldoutError
from heldout.optimizers.registry import ENTRY_POINT_GROUP, TARGET, optimizer_target, plugin_optimizers
from heldout.optimizers.specs import check_options, code_options, settings_type, split_spec, user_code
from heldout.optimizers.user_modules import (UserModule, check_regular, distribution_search, find_module_source,
                                             is_heldout_module, load_trusted_function, plugin_distribution)

def check_optimizer(spec: str, options: Mapping[str, Any] | None = None) -> None:
    """Check an optimizer spec, and a study file's method ``options``, before any session starts,
    running no user code: heldout's own optimizers are imported (:func:`resolve_optimizer` checks
    the options against their signatures); a ``module:function`` or a plugin's target, and the
    user code the options name (:func:`code_options`), are read, not run (:func:`check_function`)."""
    try:
        name, spec_options = split_spec(spec)
    except ValueError as exc:  # parse_qsl's own complaint about a malformed query
        raise HeldoutError(f"bad optimizer options in {spec!r}: {exc}") from None
    target = optimizer_target(name)
    if is_heldout_code(target):
        resolve_optimizer(spec, options)
    else:
        try:
            found = _locate(name, target)
        except HeldoutError as exc:
            raise HeldoutError(f"cannot load optimizer {target!r}: {exc}") from None
        check_function(target, "optimizer", [*spec_options, *(options or {})], found=found)
    for key, code in code_options(spec, options).items():
        check_function(code, f"the {key} option's code")


def is_heldout_code(target: str) -> bool:
    """True when ``module:function`` (or a module name) is of heldout's own package, the only code the
    harness imports without ``--trusted-optimizer`` (an import of ``heldout.x`` finds it in the
    package already loaded, never on the user's path)."""
    return is_heldout_module(target.partition(":")[0])


def locate_target(name: str) -> UserModule:
    """Where the code of optimizer ``name`` (a reference name, a plugin's name or
    ``module:function``; options dropped) is on disk, found by path, nothing of it run: heldout's
    own in heldout's package, a plugin's where its distribution installed it (an editable install's
    source folder too, never the current directory), ``module:function`` in the current directory
    then on ``sys.path``."""
    base = name.partition("?")[0]
    return _locate(base, optimizer_target(base))


def _locate(base: str, target: str) -> UserModule:
    module = target.partition(":")[0]
    dist = plugin_distribution(base, ENTRY_POINT_GROUP) if base in plugin_optimizers() else None
    if dist is not None:
        search, mapping = distribution_search(dist)
        return find_module_source(module, search, mapping)
    return find_module_source(module)


def user_modules(spec: str, options: Mapping[str, Any] | None = None) -> list[UserModule]:
    """The user's modules an optimizer spec runs (its target unless heldout's own, then the code
    its options name: :func:`code_options`), each found by path."""
    target = optimizer_target(spec)
    found = [] if is_heldout_code(target) else [locate_target(spec)]
    return found + [find_module_source(code.partition(":")[0]) for code in user_code(spec, options)]


def resolve_optimizer(spec: str, options: Mapping[str, Any] | None = None) -> Callable:
    """A reference name (or alias) or ``module:function``, optionally with ``?options`` (see the
    module doc) and further ``options`` (a study file's or ``--method-option``'s; they win),
    imported in this process: for heldout's own optimizers, for user code only when it is trusted
    (``--trusted-optimizer``) or already inside the sandbox. A user's module is looked up with the
    current directory on the path, as ``python -m`` would (no PYTHONPATH=.)."""
    try:
        name, given = split_spec(spec)
    except ValueError as exc:  # parse_qsl's own complaint about a malformed query
        raise HeldoutError(f"bad optimizer options in {spec!r}: {exc}") from None
    settings = settings_type(name)
    given.update(check_options(options or {}, spec, settings))
    optimizer = _load(name)
    if not given:
        return optimizer
    parameters = inspect.signature(optimizer).parameters
    takes_any = settings is None and any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    accepted = {n for n, p in parameters.items() if p.kind is not p.VAR_KEYWORD}
    accepted |= {f.name for f in dataclasses.fields(settings)} if settings else set()
    refused = [k for k in given if k not in accepted and not takes_any]
    if refused:
        raise HeldoutError(f"optimizer {name!r} takes no option {', '.join(refused)}")
    return functools.partial(optimizer, **given)


def _load(name: str) -> Callable:
    target = optimizer_target(name)
    if is_heldout_code(target):
        return load_function(target, "optimizer")
    return load_trusted_function(locate_target(name), target.partition(":")[2], "optimizer")


def load_function(target: str, what: str) -> Callable:
    """The callable ``module:function`` names (a ``what``: optimizer, DSPy program factory).
    heldout's own modules are imported; a user's is found by path (:func:`find_module_source`)
    and loaded from its file under a name of its own, so running it is trusted code only (see the
    module doc; :func:`check_function` checks without running). The import path is never changed."""
    module, _, func = target.partition(":")
    if not is_heldout_code(target):
        return load_trusted_function(find_module_source(module), func, what)
    try:
        found = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise HeldoutError(f"cannot load {what} {target!r}: {exc}") from exc
    if not callable(found):
        raise HeldoutError(f"{what} {target!r} is not callable")
    return found


def optimizer_code_sha256(name: str, options: Mapping[str, Any] | None = None) -> str | None:
    """sha256 of the source file that defines the optimizer, then of each user code target its
    options name (:func:`user_code`) and that target's file, so a run record says which version of
    the code ran. heldout's own optimizers are imported and add their sibling files (``CODE_FILES``:
    the reference searches dispatch to them; None when there is no file); user code is found by
    path, never imported (:func:`find_module_source`)."""
    return target_code_sha256(name, optimizer_target(name.partition("?")[0]), user_code(name, options))


def target_code_sha256(name: str, target: str, codes: Sequence[str]) -> str | None:
    """:func:`optimizer_code_sha256` of ``name`` whose ``module:function`` target and user code
    targets (:func:`user_code`) are already decided (a
    :class:`~heldout.optimizers.resolved.ResolvedMethod`'s): nothing is resolved again."""
    if is_heldout_code(target):
        module = sys.modules.get(getattr(load_function(target, "optimizer"), "__module__", "") or "")
        path = getattr(module, "__file__", None)
        if not path or not os.path.exists(path):
            return None
        digest = hashlib.sha256(Path(path).read_bytes())
        for extra in sorted(getattr(module, "CODE_FILES", ())):
            digest.update(Path(path).with_name(extra).read_bytes())
    else:
        digest = hashlib.sha256(_locate(name.partition("?")[0], target).file.read_bytes())
    for code in codes:
        digest.update(code.encode())
        digest.update(find_module_source(code.partition(":")[0]).file.read_bytes())
    return digest.hexdigest()


def check_function(target: str, what: str, options: Iterable[str] = (),
                   search: Sequence[str] | None = None, found: UserModule | None = None) -> UserModule:
    """Check user code ``module:function`` without running it: its module's file is found
    (:func:`find_module_source`) and parses, it binds ``function`` at module level (a def, a class, an
    assignment or an import; after ``from ... import *`` the import inside the sandbox decides),
    and a top-level ``def`` of it takes each of ``options`` as a keyword. Else one clear error."""
    if not TARGET.match(target):
        raise HeldoutError(f"{what} {target!r} must be module:function")
    module, _, name = target.partition(":")
    try:
        found = found or find_module_source(module, search)
        check_regular(found, "its code")  # before reading: a link may name anything on the host
        tree = ast.parse(found.file.read_bytes(), filename=str(found.file))
    except HeldoutError as exc:
        raise HeldoutError(f"cannot load {what} {target!r}: {exc}") from None
    except (OSError, SyntaxError, ValueError) as exc:  # ValueError: a NUL byte in the source
        raise HeldoutError(f"cannot load {what} {target!r}: {type(exc).__name__}: {exc}") from None
    bound, star = _module_level_names(tree)
    if name not in bound and not star:
        raise HeldoutError(f"cannot load {what} {target!r}: {found.file.name} of {module!r} defines no {name!r} "
                           "at module level")
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    if defs and defs[-1].args.kwarg is None:
        keywords = {a.arg for a in [*defs[-1].args.args, *defs[-1].args.kwonlyargs]}
        refused = [k for k in options if k not in keywords]
        if refused:
            raise HeldoutError(f"{what} {target!r} takes no option {', '.join(refused)}")
    return found


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def _module_level_names(tree: ast.Module) -> tuple[set[str], bool]:
    """The names a module binds in its own namespace, and whether it star-imports; a def or class
    binds its name, and what is bound inside it is its own."""
    names: set[str] = set()
    star = False
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            star = star or any(a.name == "*" for a in node.names)
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return names, star

