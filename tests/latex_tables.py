"""Report tables typeset the way a paper would: every ``.tex`` table a report writes, in a one-column
and a two-column article, by Debian's ``pdflatex`` (scripts/_setup.sh installs it for the tests;
a test is skipped with the reason where it is absent)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PDFLATEX = shutil.which("pdflatex")


def compile_tables(tex_files: list[Path], work: Path) -> tuple[int, str]:
    """Every table in a one-column and a two-column article; returns (exit code, the logs)."""
    if PDFLATEX is None:
        pytest.skip("no TeX engine: pdflatex is absent (scripts/_setup.sh installs texlive-latex-base and "
                    "texlive-latex-recommended for the tests; apt was not available here)")
    body = "\n".join(f"\\input{{{p}}}\\clearpage" for p in tex_files)
    logs, worst = [], 0
    for name, options in (("onecolumn", ""), ("twocolumn", "twocolumn")):
        doc = work / f"{name}.tex"
        doc.write_text(f"\\documentclass[{options}]{{article}}\n\\usepackage[T1]{{fontenc}}\n"
                       "\\usepackage{booktabs,array,graphicx}\n\\begin{document}\n" + body + "\n\\end{document}\n")
        done = subprocess.run([PDFLATEX, "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=work,
                              capture_output=True, text=True, timeout=120)
        worst = max(worst, done.returncode)
        logs.append((work / f"{name}.log").read_text(errors="replace"))
    return worst, "\n".join(logs)
