"""A task plugin on a folder of its own: modules and a dist-info naming their ``heldout.tasks``
entry points, put on a child's ``PYTHONPATH``. For tests of what a plugin task does, not of how it
installs (tests/test_doc_packages.py installs the how-to packages with a real pip)."""

from __future__ import annotations

import os
from pathlib import Path


def task_plugin_site(root: Path, dist: str, modules: dict[str, str],
                     entry_points: dict[str, str]) -> tuple[Path, Path, dict[str, str]]:
    """``(site, manifests, env)``: ``modules`` (name -> source) written in ``root/site`` with a
    dist-info ``dist`` whose ``heldout.tasks`` entry points are ``entry_points`` (family ->
    module); ``env`` puts the site on ``PYTHONPATH`` and the manifests folder (to freeze into) on
    ``HELDOUT_MANIFEST_PATH``."""
    site, manifests = root / "site", root / "manifests"
    site.mkdir()
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[heldout.tasks]\n" + "".join(f"{family} = {module}\n"
                                                                         for family, module in entry_points.items()))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
               HELDOUT_MANIFEST_PATH=str(manifests))
    return site, manifests, env
