"""Evidence anyone can verify is strict JSON.

A MinMax candidate with two coincident points has an infinite distance ratio in its verdict's
details. ``json.dumps`` writes that as ``Infinity``, which Python reads back but ``jq``, a
browser's ``JSON.parse`` and the usual parsers of other languages refuse: a reviewer checking a
ledger or a run record with their own tools could not read it at all. So what heldout writes as
evidence (ledger entries, the run record) holds "inf" (and null for NaN), as its reports and its
view server already do; a ledger written before, holding ``Infinity``, still verifies."""

from __future__ import annotations

import json

from heldout.contracts import canonical_json
from heldout.evaluators import ledger as ledger_module
from heldout.evaluators.ledger import LEDGER_FILE, Ledger, verify_ledger
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.evaluators.session import Session
from heldout.evaluators.signing import TrustedSigners
from heldout.reports.verify import verify_run_dir

COINCIDENT = {"program.py": "import numpy as np\n\ndef min_max_dist_dim3_14():\n"
                            "    p = np.random.default_rng(42).normal(size=(14, 3))\n"
                            "    p[1] = p[0]\n    return p\n"}


def strict(text: str):
    """Parse as a strict parser does: the non-JSON constants NaN, Infinity, -Infinity refused."""
    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def infinite_details(value) -> list[str]:
    """The "inf" strings anywhere inside ``value`` (the infinite details, as strict JSON has them)."""
    if isinstance(value, dict):
        return [s for v in value.values() for s in infinite_details(v)]
    if isinstance(value, list):
        return [s for v in value for s in infinite_details(v)]
    return [value] if value in ("inf", "-inf") else []


def test_a_run_whose_verdicts_hold_an_infinity_writes_strict_json_that_verifies(tmp_path):
    session = Session("minmax/d3n14", budget=4, run_dir=tmp_path / "run")

    def optimizer(view, seed):
        view.evaluate(COINCIDENT, "train")
        return COINCIDENT

    record = session.run(optimizer)
    run_dir = tmp_path / "run"
    assert record.status == "ok"
    lines = (run_dir / LEDGER_FILE).read_text(encoding="utf-8").splitlines()
    entries = [strict(line) for line in lines]  # every entry parses strictly
    evaluations = [e for e in entries if e["kind"] in ("evaluation", "test_scoring")]
    assert evaluations and all(infinite_details(e["data"]) for e in evaluations)  # the infinity is there, as "inf"
    saved = strict((run_dir / RECORD_FILE).read_text(encoding="utf-8"))
    assert infinite_details(saved["test_verdicts"])
    # the evidence checks: the chain, and every number of the record re-derived from the ledger
    assert verify_ledger(run_dir).ok
    verified = verify_run_dir(run_dir, TrustedSigners())
    assert verified.differences == [] and verified.notes == []
    assert RunRecord.load(run_dir).digest() == record.digest()


def test_a_resumed_session_replays_the_recorded_infinity_as_the_original_run_saw_it(tmp_path):
    first = Session("minmax/d3n14", budget=4, run_dir=tmp_path)
    seen = first.view.evaluate(COINCIDENT, "train")
    first.ledger.close()  # as if the process had died here
    resumed = Session("minmax/d3n14", budget=4, run_dir=tmp_path)
    assert resumed.view.evaluate(COINCIDENT, "train") == seen and resumed.service.usage.replayed > 0
    resumed.ledger.close()


def test_a_ledger_written_before_with_infinity_still_verifies(tmp_path, monkeypatch):
    # the writer as it was: the lenient encoding, so Infinity is written and hashed as such
    monkeypatch.setattr(ledger_module, "canonical_json", lambda value, strict=False: canonical_json(value))
    old = Ledger.open(tmp_path)
    old.append_entry("evaluation", {"details": {"ratio": float("inf")}, "score": 0.5})
    old.close()
    monkeypatch.undo()
    assert "Infinity" in (tmp_path / LEDGER_FILE).read_text(encoding="utf-8")
    assert verify_ledger(tmp_path).ok
    reopened = Ledger.open(tmp_path)  # and a writer continues it, strictly
    reopened.append_entry("evaluation", {"details": {"ratio": float("-inf"), "spread": float("nan")}})
    reopened.close()
    assert verify_ledger(tmp_path).ok
    last = strict((tmp_path / LEDGER_FILE).read_text(encoding="utf-8").splitlines()[-1])
    assert last["data"]["details"] == {"ratio": "-inf", "spread": None}

