"""The ledger key is created once, whole, however many processes start at the same moment.

A study run with ``--jobs 2`` on a machine without a key starts two sessions together; each
creates the anchoring key on first use. One used to find the file created but not yet written,
read an empty key, and anchor its heads with it: its ledger then failed to verify ("the head was
rewritten") although nobody had touched it."""

from __future__ import annotations

import multiprocessing

from heldout.evaluators.ledger import KEY_ENV, ledger_key


def _read_key(path: str, barrier, out) -> None:
    import os

    os.environ[KEY_ENV] = path
    barrier.wait()  # every process asks for the key at the same moment
    out.put(ledger_key())


def test_processes_that_create_the_key_together_all_get_the_same_whole_key(tmp_path):
    ctx = multiprocessing.get_context("fork")
    for trial in range(20):
        path = str(tmp_path / f"trial-{trial}" / "ledger.key")
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_read_key, args=(path, barrier, out)) for _ in range(4)]
        for p in procs:
            p.start()
        keys = [out.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        assert len(set(keys)) == 1 and len(keys[0]) == 32, f"trial {trial}: {[k.hex()[:8] for k in keys]}"
        assert sorted(p.name for p in (tmp_path / f"trial-{trial}").iterdir()) == ["ledger.key"]  # no temp left
