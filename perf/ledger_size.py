"""Ledger bytes per entry against the outputs it records, packed against unpacked (issue 60).

A session's ledger is mostly model outputs. This writes the entries of one session through the
real :class:`heldout.evaluators.ledger.Ledger` twice, in batches of 50 as a session does: once as
it stores them (long outputs compressed, a repeat stored once) and once with packing turned off
(every line as written before packing: the reference, in the same run). The outputs are real
prose (HotpotQA's Wikipedia paragraphs from the data dir, cut to ``--words``, so they compress as
text does, not as perf/cot_server.py's ten repeated sentences do), ``--hits`` of the evaluations
are memo hits (the same output again), and every evaluation is followed, as in a session, by the
held-out scoring of ``--test`` examples. It prints bytes per entry, per output byte and the CPU
per append of both, and checks both ledgers read back to the same entries.

    python perf/ledger_size.py [--evaluations 2000] [--test 200] [--words 400] [--hits 0.2]
        [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from heldout.evaluators import ledger as ledger_module  # noqa: E402
from heldout.evaluators.ledger import LEDGER_FILE, Ledger, read_entries, verify_ledger  # noqa: E402
from machine import fixed_loop_seconds  # noqa: E402


def prose(data_dir: Path, words: int, count: int) -> list[str]:
    """``count`` distinct chains of thought of ``words`` words each: windows at seeded offsets into
    HotpotQA's paragraphs (the data dir holds about 200,000 words of them)."""
    pool: list[str] = []
    with open(data_dir / "hotpotqa" / "hotpotqa_validate.jsonl") as fh:
        for line in fh:
            for _title, sentences in json.loads(line)["context"]:
                pool.extend(" ".join(sentences).split())
    rng = random.Random(1)
    starts = rng.sample(range(len(pool) - words), count)
    return [" ".join(pool[at:at + words]) + "\nSo the answer is (B)." for at in starts]


def session_entries(outputs: list[str], evaluations: int, test: int, hits: float) -> list[tuple[str, dict]]:
    rng = random.Random(0)
    candidate = "c" * 64
    entries: list[tuple[str, dict]] = [("session_start", {"task": "bbh/x", "seed": 0})]
    fresh = iter(outputs)
    seen: list[str] = []
    for i in range(evaluations):
        cached = bool(seen) and rng.random() < hits
        text = rng.choice(seen) if cached else next(fresh)
        seen.append(text)
        entries.append(("evaluation", {"candidate_id": candidate, "split": "train", "example_id": str(i % 50),
                                       "cached": cached, "cost": 1, "metric_calls": i + 1,
                                       "verdict": verdict(str(i % 50), text)}))
    for i in range(test):
        entries.append(("test_scoring", {"candidate_id": candidate, "example_id": f"t{i}",
                                         "verdict": verdict(f"t{i}", next(fresh))}))
    return entries


def verdict(example: str, text: str) -> dict[str, Any]:
    return {"example_id": example, "score": 0.0, "valid": True, "error": None, "error_kind": None,
            "feedback": "wrong: '(B)', expected '(A)' [published 0; strict 0, flexible 0]",
            "dimensions": {"flexible": 0.0, "published": 0.0, "strict": 0.0},
            "usage": {"cached": 0.0, "completion_tokens": 550, "prompt_tokens": 55, "seconds": 0.05},
            "output": {"text": text, "answer": "(B)", "extracted_flexible": "(B)", "extracted_published": "(B)",
                       "extracted_strict": "(B)", "why": None}}


def write(run_dir: Path, entries: list[tuple[str, dict]]) -> float:
    """CPU seconds of appending ``entries`` in batches of 50 (fsyncs and heads included)."""
    ledger = Ledger.open(run_dir)
    start = time.process_time()
    for at in range(0, len(entries), 50):
        with ledger.batch():
            for kind, data in entries[at:at + 50]:
                ledger.append_entry(kind, data)
    cpu = time.process_time() - start
    ledger.close()
    return cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=2000)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--words", type=int, default=400)
    parser.add_argument("--hits", type=float, default=0.2, help="share of evaluations that are memo hits")
    parser.add_argument("--data-dir", default=os.environ.get("HELDOUT_DATA_DIR", str(HERE.parent.parent / "shared" / "data")))
    args = parser.parse_args(argv)
    loop, load = fixed_loop_seconds(), os.getloadavg()[0]
    entries = session_entries(prose(Path(args.data_dir), args.words, args.evaluations + args.test),
                              args.evaluations, args.test, args.hits)
    output_bytes = sum(len(json.dumps(d["verdict"]["output"], ensure_ascii=False).encode())
                       for _, d in entries if "verdict" in d)
    root = Path(tempfile.mkdtemp(prefix="heldout-ledger-size-"))
    packed_cpu = write(root / "packed", entries)
    real_pack = ledger_module.pack_outputs
    ledger_module.pack_outputs = lambda data, line, stored: (data, [])  # every line as before packing
    try:
        plain_cpu = write(root / "unpacked", entries)
    finally:
        ledger_module.pack_outputs = real_pack
    rows = []
    for name, cpu in (("packed", packed_cpu), ("unpacked", plain_cpu)):
        run_dir = root / name
        size = (run_dir / LEDGER_FILE).stat().st_size
        assert verify_ledger(run_dir).ok
        rows.append((name, size, cpu))
    read = [[{k: e[k] for k in ("kind", "data", "hash")} for e in read_entries(root / n / LEDGER_FILE)[0]]
            for n in ("packed", "unpacked")]
    same = [[e["data"] for e in r] for r in read]
    assert same[0] == same[1], "the packed ledger reads back other entries than the unpacked one"
    n = len(entries)
    print(f"{n} entries ({args.evaluations} evaluations, {int(args.hits * 100)}% memo hits; {args.test} held-out "
          f"scorings), outputs of about {args.words} words of prose: {output_bytes / 2 ** 20:.2f} MiB of outputs")
    for name, size, cpu in rows:
        print(f"  {name:<9} {size / 2 ** 20:7.2f} MiB  {size / n:7.0f} B per entry  {size / output_bytes:5.2f} x the "
              f"outputs  {1e6 * cpu / n:6.0f} us CPU per append")
    (_, packed, pcpu), (_, plain, ucpu) = rows
    print(f"packed / unpacked: {packed / plain:.2f} x the bytes, {pcpu / ucpu:.2f} x the CPU per append; both read "
          f"back to the same entries")
    print(f"fixed loop {loop:.3f} s before, {fixed_loop_seconds():.3f} s after; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; ledgers in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
