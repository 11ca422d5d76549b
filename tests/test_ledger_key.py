"""The ledger key: created once, whole, however many processes start at the same moment; and
where it is absent (a reviewer's machine), verification says UNANCHORED instead of "intact", and
the head the writer published checks authenticity without the writer's secret.

A study run with ``--jobs 2`` on a machine without a key starts two sessions together; each
creates the anchoring key on first use. One used to find the file created but not yet written,
read an empty key, and anchor its heads with it: its ledger then failed to verify ("the head was
rewritten") although nobody had touched it."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

from heldout.evaluators.ledger import HEAD_FILE, KEY_ENV, LEDGER_FILE, RECORD_FILE, entry_hash, ledger_key


def _read_key(path: str, barrier, out) -> None:
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


# -- verifying where the writer's key is absent ------------------------------------------------------


def _cli(warm_cli, *args: str, key: str) -> subprocess.CompletedProcess:
    """The real ``heldout`` command with ``key`` as the ledger key, a process of its own (forked warm:
    tests/warm_cli.py; the key is read when a ledger is, never at import)."""
    return warm_cli.run(*args, cwd=Path.cwd(), env={**os.environ, KEY_ENV: key})


def _forge_score(run_dir) -> None:
    """What a forger without the key can do: raise one held-out score, rehash the chain after it,
    rewrite the head file and the record to match. Only the head's HMAC stays wrong."""
    lines = [json.loads(line) for line in (run_dir / LEDGER_FILE).read_text().splitlines()]
    at = next(i for i, e in enumerate(lines) if e["kind"] == "test_scoring")
    lines[at]["data"]["score"] = 1.0
    old_hashes = [e["hash"] for e in lines]
    for i in range(at, len(lines)):
        lines[i]["prev"] = lines[i - 1]["hash"] if i else lines[i]["prev"]
        lines[i]["hash"] = entry_hash(lines[i])
    (run_dir / LEDGER_FILE).write_text("".join(json.dumps(e) + "\n" for e in lines))
    head = json.loads((run_dir / HEAD_FILE).read_text())
    (run_dir / HEAD_FILE).write_text(json.dumps({**head, "count": len(lines), "hash": lines[-1]["hash"]}))
    record = json.loads((run_dir / RECORD_FILE).read_text())
    record["ledger_head"] = lines[old_hashes.index(record["ledger_head"])]["hash"]
    (run_dir / RECORD_FILE).write_text(json.dumps(record))


def _as_written_before_signatures(run_dir) -> None:
    """A study of the HMAC era: no signature on its head or record (signed studies are
    tests/test_signatures.py's; there a reviewer catches this forgery without any key)."""
    for name in (HEAD_FILE, RECORD_FILE):
        data = json.loads((run_dir / name).read_text())
        data.pop("signature", None)
        (run_dir / name).write_text(json.dumps(data))


def test_without_the_key_a_forged_ledger_is_unanchored_and_the_published_head_catches_it(warm_cli, tmp_path):
    key = str(tmp_path / "writer" / "ledger.key")
    study = tmp_path / "study"
    made = _cli(warm_cli, "run", "--task", "lockpicking/six", "--optimizer", "seed", "--seeds", "0", "--budget", "5",
                "--run-dir", str(study), key=key)
    assert made.returncode == 0, made.stderr
    run_dir = next(p.parent for p in study.rglob(RECORD_FILE))
    _as_written_before_signatures(run_dir)
    published = json.loads((run_dir / RECORD_FILE).read_text())["ledger_head"]
    honest = tmp_path / "honest-copy"
    shutil.copytree(run_dir, honest)
    _forge_score(run_dir)
    reviewer = str(tmp_path / "reviewer" / "ledger.key")  # another machine: no key there

    # the writer, holding the key, sees the forgery
    assert _cli(warm_cli, "ledger", "verify", str(run_dir), key=key).returncode == 1
    # a reviewer without the key: the chain is consistent, but it is NOT called authentic
    res = _cli(warm_cli, "ledger", "verify", str(run_dir), key=reviewer)
    assert res.returncode == 3 and res.stdout.startswith("UNANCHORED") and "NOT checked" in res.stdout
    assert not os.path.exists(reviewer)  # verifying never creates a key
    # ... and with the head the writer published, the forgery fails and the honest copy passes
    res = _cli(warm_cli, "ledger", "verify", str(run_dir), "--head", published, key=reviewer)
    assert res.returncode == 1 and "published head" in res.stdout
    res = _cli(warm_cli, "ledger", "verify", str(honest), "--head", published, key=reviewer)
    assert res.returncode == 0 and "authentic (checked against the published head)" in res.stdout
    assert _cli(warm_cli, "ledger", "verify", str(honest), key=key).stdout.startswith("ok ")
