"""What signatures add to a session, and to verifying one run.

A session pays, once each: loading the signing key (PEM read + parse, when its ledger opens),
signing the head (one Ed25519 signature + one rewrite of the head file, when its ledger closes)
and signing the run record (its digest + one signature). Nothing is signed per ledger entry.
Measured here on a ledger of ENTRIES entries (a 30-metric-call Heilbronn session writes 66),
beside the appends themselves; and a reviewer's verify_run of one finished run.

Run: python perf/signing_cost.py   (medians of REPEATS; prints the load average, since a busy
machine inflates every figure)
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

ENTRIES, REPEATS = 66, 30


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def main() -> None:
    config = tempfile.mkdtemp(prefix="signing-cost-")
    os.environ["HELDOUT_LEDGER_KEY"] = os.path.join(config, "ledger.key")
    os.environ["HELDOUT_SIGNING_KEY_FILE"] = os.path.join(config, "signing.key")
    os.environ.pop("HELDOUT_SIGNING_KEY", None)
    from heldout.evaluators.authenticity import verify_run
    from heldout.evaluators.ledger import Ledger
    from heldout.evaluators.records import FORMAT_VERSION, RunRecord
    from heldout.evaluators.signing import TrustedSigners, load_signing_key

    key = load_signing_key()
    trusted = TrustedSigners.own()
    load, appends, close_signed, close_plain, record_sign, verify = [], [], [], [], [], []
    for i in range(REPEATS):
        for signed in (True, False):
            run_dir = Path(config) / f"run-{i}-{signed}"
            ledger = Ledger.open(run_dir)
            if not signed:
                ledger.signing_key = None  # the same ledger, closed without signing its head
            start = time.perf_counter()
            for n in range(ENTRIES - 1):
                ledger.append_entry("evaluation", {"example_id": f"e{n}", "score": 0.5, "verdict": {"score": 0.5}})
            header = {"task": "t", "profile": "p", "seed": i, "method": "m", "budget": {"metric_calls": 30},
                      "policy": {}, "limits": {}, "options": {}, "drift": None}
            record = RunRecord(**header, status="ok", final_candidate={"x": "y"}, final_candidate_id="c",
                               test_verdicts=[{"example_id": "t0", "score": 0.5}], val_verdicts=[], test_score=0.5,
                               val_score=None, usage={}, trajectory=[], lineage=[], format_version=FORMAT_VERSION,
                               experiment=dict(header))
            ledger.append_entry("session_end", {"record_sha256": record.digest()})
            record.ledger_head, record.ledger_entries = ledger.head, len(ledger)
            if signed:
                appends.append(time.perf_counter() - start)
                t = time.perf_counter()
                record.sign(key)
                record_sign.append(time.perf_counter() - t)
            record.save(run_dir)
            t = time.perf_counter()
            ledger.close()
            (close_signed if signed else close_plain).append(time.perf_counter() - t)
            if signed:
                t = time.perf_counter()
                found = verify_run(run_dir, trusted)
                verify.append(time.perf_counter() - t)
                assert found.ok, found.line()
        t = time.perf_counter()
        load_signing_key()
        load.append(time.perf_counter() - t)
    per_session = median_ms(load) + median_ms(record_sign) + median_ms(close_signed) - median_ms(close_plain)
    print(f"load average {os.getloadavg()[0]:.2f}; medians of {REPEATS}")
    print(f"  {ENTRIES} ledger appends (fsynced):        {median_ms(appends):8.2f} ms")
    print(f"  load the signing key:                  {median_ms(load):8.3f} ms")
    print(f"  sign the run record:                   {median_ms(record_sign):8.3f} ms")
    print(f"  close the ledger, signing its head:    {median_ms(close_signed):8.3f} ms "
          f"(unsigned: {median_ms(close_plain):.3f} ms)")
    print(f"  signing, per session:                  {per_session:8.3f} ms "
          f"({per_session / median_ms(appends) * 100:.1f}% of the appends alone)")
    print(f"  verify_run of one finished run:        {median_ms(verify):8.3f} ms")


if __name__ == "__main__":
    main()
