"""Reading the fenced blocks of the docs, and running them as a reader would.

A block is either run by a test (``RUN_BY`` in tests/test_doc_blocks.py names which) or marked in the
Markdown, on the line just above its fence, as ``<!-- not-run: the reason -->``. Shell blocks run in
``bash -e`` in a temporary folder, with three substitutions a reader makes too: the doc's
``http://127.0.0.1:8000/v1`` becomes the loopback test server the test started itself (so the doc's
own line starting one is skipped), ``../shared/data`` becomes the real data directory, and the
commands come from the ``bin`` folder the test chooses (the project's venv, or a throw-away venv
holding the doc's packages installed by pip).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC_URL = "http://127.0.0.1:8000/v1"
DOC_DATA = "../shared/data"
DOC_SERVER_LINE = re.compile(r"^python -m heldout\.models\.testserver --port 8000 &.*$", re.M)
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
FENCE = re.compile(r"(?:<!-- not-run: (?P<why>[^>]*) -->\n)?^```(?P<lang>[\w-]*)\n(?P<code>.*?)^```$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    doc: str
    lang: str
    index: int          # among the doc's blocks of the same kind (shell or python)
    code: str
    not_run: str | None  # the marker's reason, or None when a test must run it


def blocks(doc: str, kind: str) -> list[Block]:
    """The doc's ```python blocks (kind "python") or shell blocks (kind "shell"), in order."""
    langs = SHELL_LANGUAGES if kind == "shell" else (kind,)
    text = (ROOT / doc).read_text(encoding="utf-8")
    found = [m for m in FENCE.finditer(text) if m["lang"] in langs]
    return [Block(doc, m["lang"], i, m["code"], m["why"]) for i, m in enumerate(found)]


def the_block(doc: str, snippet: str) -> Block:
    """The one shell or python block of ``doc`` that holds ``snippet`` (a block is named by what it
    says, so blocks added or moved around it do not change which one a test runs)."""
    found = [b for kind in ("shell", "python") for b in blocks(doc, kind) if snippet in b.code]
    if len(found) != 1:
        raise LookupError(f"{doc}: {len(found)} blocks hold {snippet!r}, not one")
    return found[0]


def python_blocks(doc: str) -> list[tuple[str, str | None]]:
    """(code, not-run reason or None) for each ```python block, in order."""
    return [(b.code, b.not_run) for b in blocks(doc, "python")]


def as_here(code: str, server_url: str | None, data_dir: Path | None) -> str:
    """The block as it runs here: this test's model server and data directory for the doc's."""
    if DOC_URL in code:
        if server_url is None:
            raise ValueError("the block names the doc's model server: start a TestServer for it")
        code = DOC_SERVER_LINE.sub(": the test started its own loopback model server", code)
        code = code.replace(DOC_URL, server_url)
    if DOC_DATA in code:
        if data_dir is None:
            raise ValueError("the block reads ../shared/data: pass the real data directory")
        code = code.replace(DOC_DATA, str(data_dir))
    return code


def run_shell(code: str, cwd: Path, *, bin_dir: Path | None = None, server_url: str | None = None,
              data_dir: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run a shell block with ``bash -e -o pipefail -x`` (a failing line fails the block; stderr shows
    each command before its output, so a failure names its line)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HELDOUT_MANIFEST_PATH")}
    env["PATH"] = os.pathsep.join([str(bin_dir or Path(sys.executable).parent), env.get("PATH", "")])
    if data_dir is not None:
        env["HELDOUT_DATA_DIR"] = str(data_dir)
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-x", "-c", as_here(code, server_url, data_dir)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run_python(code: str, cwd: Path, path: Path | None = None, **extra_env: str) -> subprocess.CompletedProcess:
    """A ```python block in a fresh interpreter, ``path`` first on its import path."""
    env = dict(os.environ, **extra_env)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600)


def json_objects(text: str) -> list[dict]:
    """Every JSON object that starts a line of ``text`` (what ``--json`` commands print)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (start := text.find("{", at)) != -1:
        if start == 0 or text[start - 1] == "\n":
            try:
                value, end = decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                end = start + 1
            else:
                found.append(value)
            at = end
        else:
            at = start + 1
    return found


# pip here is offline: it builds with the setuptools already installed and takes nothing from an index;
# heldout and its dependencies are this interpreter's, so --no-deps
PIP = """#!/bin/sh
if [ "$1" = install ]; then
  shift
  exec "{python}" -m pip install --no-index --no-build-isolation --no-deps --disable-pip-version-check -q "$@"
fi
exec "{python}" -m pip "$@"
"""
HELDOUT = '#!/bin/sh\nexec "{python}" -m heldout "$@"\n'  # what pip's console script for heldout runs


def offline_venv(path: Path) -> Path:
    """A new venv at ``path`` that sees this interpreter's packages (a ``.pth`` adding its site
    folder, whose own ``.pth`` files are processed too), with ``heldout`` and an offline ``pip`` in
    its ``bin``. Returns the ``bin`` folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "heldout_doc_parent.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    for name, text in (("pip", PIP), ("heldout", HELDOUT)):
        script = path / "bin" / name
        script.write_text(text.format(python=python))
        script.chmod(0o755)
    return path / "bin"
