"""The README's main job: `heldout demo` runs a real small study and writes the report."""

from __future__ import annotations

import json
import subprocess
import sys


def test_demo_runs_the_study_and_writes_a_self_contained_report(tmp_path):
    run_dir, out = tmp_path / "runs", tmp_path / "report"
    res = subprocess.run([sys.executable, "-m", "heldout.cli", "demo", "--run-dir", str(run_dir),
                          "--out", str(out), "--jobs", "2"], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    html = (out / "report.html").read_text()
    assert "Table 1" in html and html.count("<img") >= 3 and "src=\"data:image/png;base64," in html
    results = json.loads((out / "results.json").read_text())
    assert results  # strict JSON
    records = sorted(run_dir.rglob("run_record.json"))
    assert len(records) == 18
    # the reference search beats the unoptimised seed on lockpicking in every seed
    scores = {p.parent.parent.name + p.parent.name: json.loads(p.read_text())["test_score"]
              for p in records if "lockpicking" in str(p)}
    assert min(v for k, v in scores.items() if k.startswith("local-search")) > \
        max(v for k, v in scores.items() if k.startswith("seed"))
