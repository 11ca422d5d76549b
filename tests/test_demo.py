"""The README's main job: `heldout demo` runs a real small study and writes the report (the README's
own block, run as written in a temporary folder)."""

from __future__ import annotations

import json
import shlex

import pytest

from doc_blocks import run_shell, the_block

README_DEMO = the_block("README.md", "heldout demo --run-dir").code


@pytest.mark.slow  # the whole demo study: 56 s at load 4.5 on 2 cores
def test_demo_runs_the_study_and_writes_a_self_contained_report(tmp_path):
    argv = shlex.split(README_DEMO)
    assert argv[:2] == ["heldout", "demo"], README_DEMO
    run_dir, out = tmp_path / argv[argv.index("--run-dir") + 1], tmp_path / argv[argv.index("--out") + 1]
    res = run_shell(README_DEMO, tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    html = (out / "report.html").read_text()
    assert "Table 1" in html and html.count("<img") >= 3 and "src=\"data:image/png;base64," in html
    results = json.loads((out / "results.json").read_text())
    assert results  # strict JSON
    records = sorted(run_dir.rglob("run_record.json"))
    assert len(records) == 30  # 3 tasks x 2 methods x 5 seeds
    # the first study a newcomer sees is designed to conclude: 5 runs per arm let the exact
    # permutation test reach alpha after Holm over the 3 tasks, and every row says what it found
    paired = results["tables"]["heldout"]
    assert all(not row["report_verdict"].startswith("cannot separate") for row in paired["data"]), \
        [row["report_verdict"] for row in paired["data"]]
    # the reference search beats the unoptimised seed on lockpicking in every seed
    scores = {p.parent.parent.name + p.parent.name: json.loads(p.read_text())["test_score"]
              for p in records if "lockpicking" in str(p)}
    assert min(v for k, v in scores.items() if k.startswith("local-search")) > \
        max(v for k, v in scores.items() if k.startswith("seed"))
    # every method that searches really uses its seed: its seeds end at different held-out scores
    by_cell: dict[tuple[str, str], set[float]] = {}
    for p in records:
        record = json.loads(p.read_text())
        by_cell.setdefault((record["task"], record["method"]), set()).add(record["test_score"])
    for (task, method), values in by_cell.items():
        if method != "seed":
            assert len(values) > 1, f"{method} gave the same held-out score for every seed on {task}"
    # the report says which code and which data produced its numbers
    md = (out / "report.md").read_text()
    assert "optimizers: local-search (" in md and "Worker model: none" in md
    # re-running the demo continues the same study instead of redoing or mixing it
    again = run_shell(README_DEMO, tmp_path)
    assert again.returncode == 0 and again.stderr.count("(already done)") == 30, again.stderr[-2000:]
