"""Plugin packages installed the way a user installs them: a project (``pyproject.toml`` naming its
entry points) built and installed by a real offline ``pip install --target`` into a folder of its
own, then put on a child's ``PYTHONPATH``. What heldout reads is what pip wrote (the dist-info, its
``entry_points.txt``), never a hand-written copy. tests/test_doc_packages.py installs the how-to
pages' packages the same way into a venv, editable ones included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def pip_installed_site(root: Path, dist: str, files: dict[str, str],
                       entry_points: dict[str, dict[str, str]]) -> Path:
    """``root/site`` holding the distribution ``dist`` (version 0.1) as pip installed it from the
    project ``root/<dist>-project``: ``files`` (path -> source; a top-level ``name.py`` is a
    module, ``name/...`` a package) and ``entry_points`` (group -> name -> target). Offline: pip
    builds with the setuptools already installed and takes nothing from an index. Everything is
    world-readable afterwards (a sandbox's uid reads the installed modules)."""
    project, site = root / f"{dist}-project", root / "site"
    for path, source in files.items():
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(source)
    modules = sorted(path[:-3] for path in files if "/" not in path)
    packages = sorted({path.split("/")[0] for path in files if "/" in path})
    groups = "".join(f'[project.entry-points."{group}"]\n' + "".join(f'"{name}" = "{target}"\n'
                                                                      for name, target in named.items())
                     for group, named in entry_points.items())
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{dist}"\nversion = "0.1"\n{groups}'
        f"[tool.setuptools]\npy-modules = {json.dumps(modules)}\npackages = {json.dumps(packages)}\n")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                          "--disable-pip-version-check", "-q", "--target", str(site), str(project)],
                         capture_output=True, text=True, timeout=600, cwd=root)
    assert pip.returncode == 0, pip.stderr[-3000:]
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return site


def with_site(site: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``site`` first on ``PYTHONPATH``."""
    env = dict(os.environ if env is None else env)
    return dict(env, PYTHONPATH=os.pathsep.join([str(site), env.get("PYTHONPATH", "")]))


def task_plugin_site(root: Path, dist: str, modules: dict[str, str],
                     entry_points: dict[str, str]) -> tuple[Path, Path, dict[str, str]]:
    """``(site, manifests, env)``: ``modules`` (name -> source) installed by pip in ``root/site``
    as the distribution ``dist`` whose ``heldout.tasks`` entry points are ``entry_points`` (family
    -> module); ``env`` puts the site on ``PYTHONPATH`` and the manifests folder (to freeze into)
    on ``HELDOUT_MANIFEST_PATH``."""
    site = pip_installed_site(root, dist, {f"{name}.py": source for name, source in modules.items()},
                              {"heldout.tasks": entry_points})
    manifests = root / "manifests"
    return site, manifests, dict(with_site(site), HELDOUT_MANIFEST_PATH=str(manifests))
