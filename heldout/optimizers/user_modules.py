"""Where a user's code is, found without running any of it, and how trusted code is loaded.

A user's module (an optimizer, a plugin's target, a DSPy program) is hostile until it is inside
the sandbox. The harness therefore never changes its own import path for it and never imports
from a user's folder:

* :func:`find_module_source` finds a module's source file by path alone: in the current
  directory, then on ``sys.path`` (never ``import`` nor ``importlib.util.find_spec``, which would
  run the parent packages' ``__init__.py``);
* an optimizer plugin is looked for where its distribution put it (:func:`distribution_search`):
  a regular install's folder, or, for ``pip install -e``, the folders its ``.pth`` file lists and
  the mapping of setuptools' editable finder (both read as text, neither imported), never the
  current directory, which could hold a module of the same name;
* :func:`load_trusted_function` (``--trusted-optimizer`` only) loads the module from its file
  under a name of its own (``heldout_user_<hash>``), so it can never take the place of a module
  the harness imports; the module's own imports of its siblings still work through
  :class:`SiblingFinder`, which is asked last, and only for an import made by code inside the
  user's folder.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from importlib.metadata import Distribution, entry_points
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import unquote, urlparse

from heldout.contracts import HeldoutError
from heldout.files import regular_files

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding heldout/
USER_PREFIX = "heldout_user_"


@dataclass(frozen=True)
class UserModule:
    """A user's module as found on disk, nothing of it run: ``file`` is its source (``a/b/c.py``
    or ``a/b/c/__init__.py``), ``top`` the file or top-level package dir (``a/``) an isolated run
    copies into its sandbox, where the module is imported."""

    name: str
    file: Path
    top: Path

    @property
    def root(self) -> Path:
        """The folder holding ``top``: where the module's siblings are."""
        return self.top.parent


def search_path() -> list[str]:
    """Where a user's module is looked for: the current directory, then ``sys.path`` (a lookup by
    path only; the harness's own ``sys.path`` is never changed)."""
    cwd = os.getcwd()
    return [cwd] + [p for p in sys.path if p not in ("", cwd)]


def is_heldout_module(module: str) -> bool:
    return module.split(".")[0] == "heldout"


def find_module_source(module: str, search: Sequence[str] | None = None,
                       mapping: dict[str, str] | None = None) -> UserModule:
    """The source file of ``module``, found by path alone: a top-level name ``mapping`` holds (an
    editable install's ``{"pkg": "/src/pkg"}``) first, then each entry of ``search`` (default
    :func:`search_path`; ``""`` is the current directory) in order, ``a/b/c/__init__.py`` then
    ``a/b/c.py``; an entry holding a regular package or module ``a`` ends the search, as it ends an
    import. heldout's own modules are looked for in heldout's package only. Zip entries, other
    import hooks and compiled modules are not followed: only a source file can be checked and
    hashed before it runs."""
    parts = module.split(".")
    if is_heldout_module(module):
        search, mapping = [str(PACKAGE_ROOT)], None
    mapped = (mapping or {}).get(parts[0])
    if mapped:
        top = Path(mapped)
        inner = top.joinpath(*parts[1:])
        files = [inner / "__init__.py", inner.with_name(inner.name + ".py")] if top.is_dir() else [top]
        for file in files if top.is_dir() or len(parts) == 1 else []:
            if file.is_file():
                return UserModule(module, file.absolute(), top.absolute())
    for entry in search_path() if search is None else search:
        base = Path(entry or os.getcwd())
        folder = base.joinpath(*parts[:-1])
        for file in (folder / parts[-1] / "__init__.py", folder / f"{parts[-1]}.py"):
            if file.is_file():
                top = base / parts[0] if len(parts) > 1 or file.name == "__init__.py" else file
                return UserModule(module, file.absolute(), top.absolute())
        if (base / parts[0] / "__init__.py").is_file() or (base / f"{parts[0]}.py").is_file():
            break
    path = "/".join(parts)
    raise HeldoutError(f"no {path}.py or {path}/__init__.py in the current directory or on sys.path "
                       "(user code is found by path; the harness never imports it)")


def check_regular(found: UserModule, what: str) -> None:
    """The user's code goes into a sandbox as copies of regular files from inside its own folder:
    a module file or package folder that is a symbolic link, or holds one (to a file or a folder,
    inside or pointing out) or a FIFO, device or socket, is one :class:`HeldoutError` naming it."""
    if found.top.is_symlink():
        raise HeldoutError(f"{what}: {found.top} is a symbolic link: refused (user code is copied into the sandbox "
                           "as regular files only)")
    if found.top.is_dir():
        regular_files(found.top, what)
    elif not found.top.is_file():
        raise HeldoutError(f"{what}: {found.top} is not a regular file: refused")


# -- plugins: where the distribution put the code ---------------------------------------------------
def plugin_distribution(name: str, group: str) -> Distribution | None:
    """The distribution that installed entry point ``name`` of ``group``, if one did."""
    for ep in entry_points(group=group):
        if ep.name == name:
            return getattr(ep, "dist", None)
    return None


def distribution_search(dist: Distribution) -> tuple[list[str], dict[str, str]]:
    """``(folders, mapping)`` where ``dist``'s modules are: the folder it is installed in, the
    folders its ``.pth`` files list (an editable install's path entries), and the module -> path
    mapping of setuptools' editable finder (``__editable___*_finder.py``), each read as text, none
    imported; with ``direct_url.json`` naming a local editable project, its folder and ``src/``
    last."""
    folders: list[str] = []
    mapping: dict[str, str] = {}
    for file in dist.files or []:
        where = Path(str(dist.locate_file(file)))
        if file.suffix == ".pth" and where.is_file():
            for line in where.read_text(encoding="utf-8", errors="replace").splitlines():
                line = line.strip()
                folder = os.path.join(where.parent, line)  # as site reads it: relative to the .pth's dir
                if line and not line.startswith(("#", "import ", "import\t")) and os.path.isdir(folder):
                    folders.append(folder)
        elif file.name.startswith("__editable__") and file.name.endswith("_finder.py") and where.is_file():
            mapping.update(_editable_mapping(where))
    installed = str(dist.locate_file(""))
    if os.path.isdir(installed):
        folders.append(installed)
    project = _editable_project(dist)
    if project:
        folders += [project, os.path.join(project, "src")]
    return folders, mapping


def _editable_mapping(finder: Path) -> dict[str, str]:
    """The ``MAPPING = {...}`` literal of a setuptools editable finder, read with :mod:`ast`."""
    try:
        tree = ast.parse(finder.read_bytes(), filename=str(finder))
    except (OSError, SyntaxError, ValueError):
        return {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "MAPPING" for t in targets) and node.value is not None:
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            if isinstance(value, dict):
                return {str(k): str(v) for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
    return {}


def _editable_project(dist: Distribution) -> str | None:
    text = dist.read_text("direct_url.json")
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return None
    if not isinstance(data, dict) or not (data.get("dir_info") or {}).get("editable"):
        return None
    url = urlparse(str(data.get("url", "")))
    return unquote(url.path) if url.scheme == "file" and os.path.isdir(unquote(url.path)) else None


# -- trusted code: loaded from its file, under a name of its own ------------------------------------
def load_trusted_function(found: UserModule, function: str, what: str) -> Callable:
    """``function`` of the user's module ``found``, loaded in this process (``--trusted-optimizer``).
    A module this process already loaded from that very file is taken as it is; otherwise the
    module's top (its file or package) is loaded from its path as ``heldout_user_<hash>``, which no
    import of the harness asks for, and its siblings become importable to it alone
    (:class:`SiblingFinder`)."""
    module = _already_loaded(found.file) or _load_by_path(found)
    try:
        value = getattr(module, function)
    except AttributeError:
        raise HeldoutError(f"cannot load {what} {found.name}:{function}: {found.file.name} defines no "
                           f"{function!r}") from None
    if not callable(value):
        raise HeldoutError(f"{what} {found.name}:{function} is not callable")
    return value


def _already_loaded(file: Path) -> Any:
    """The module of ``file`` if this process has imported it (by any path to the same file).
    Compared by the file's identity (device, inode): one stat per module, where resolving every
    module's path took a fifth of a second per trusted cell of a study."""
    try:
        wanted = os.stat(file)
    except OSError:
        return None
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str):
            continue
        try:
            found = os.stat(path)
        except OSError:
            continue
        if (found.st_dev, found.st_ino) == (wanted.st_dev, wanted.st_ino):
            return module
    return None


def _load_by_path(found: UserModule) -> Any:
    SiblingFinder.allow(found.root)
    parts = found.name.split(".")
    unique = USER_PREFIX + hashlib.sha256(str(found.top).encode()).hexdigest()[:12] + "_" + parts[0]
    if unique not in sys.modules:
        package = found.top.is_dir()
        init = found.top / "__init__.py" if package else found.top
        spec = importlib.util.spec_from_file_location(
            unique, init, submodule_search_locations=[str(found.top)] if package else None)
        if spec is None or spec.loader is None:
            raise HeldoutError(f"cannot load {found.name} from {init}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[unique] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(unique, None)
            raise
    return importlib.import_module(".".join([unique, *parts[1:]]))


class SiblingFinder(importlib.abc.MetaPathFinder):
    """The last finder on ``sys.meta_path``: a top-level module in a trusted user's folder, for an
    import made by code in that folder and found by no other finder. It never takes the place of a
    module the harness could import (every other finder is asked first), and an import the
    harness makes (a library's optional dependency) is never answered from the user's folder."""

    roots: list[str] = []

    @classmethod
    def allow(cls, root: Path) -> None:
        real = os.path.realpath(root)
        if real not in cls.roots:
            cls.roots.append(real)
        if not any(isinstance(f, cls) for f in sys.meta_path):
            sys.meta_path.append(cls())

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if path is not None or "." in fullname:
            return None  # a submodule: its package's own __path__ finds it
        root = _importer_root(self.roots)
        if root is None:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [root])


def _importer_root(roots: list[str]) -> str | None:
    """The allowed root holding the file of the code that asked for the import, if any."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith("<frozen importlib") or name == importlib.__file__):
            real = os.path.realpath(name)
            for root in roots:
                if real.startswith(root.rstrip("/") + "/"):
                    return root
            return None
        frame = frame.f_back
    return None
