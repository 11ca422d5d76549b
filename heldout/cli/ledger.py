"""Who wrote a run: ``heldout ledger verify`` (authentic, tampered, unsigned or untrusted) and
``ledger sign`` (HMAC-era runs), ``heldout key show`` and ``key generate`` (the signing key)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from heldout.cli.shared import add_json, add_trusted_signers, print_json, trusted_signers
from heldout.contracts import HeldoutError

# Start-up time: each command imports its modules when it runs, so the parser loads none of them
# (heldout/cli/__init__.py).


LEDGER_UNANCHORED_EXIT = 3
"""``ledger verify``: the chain is intact but nothing signed it (and no HMAC anchor or published
head vouches for it here). The codes are :data:`heldout.evaluators.signing.EXIT_CODES`: 0 authentic,
1 tampered, 3 unsigned, 4 signed by a key not among the trusted signers; several runs: the worst."""


def _ledger_dirs(roots: Sequence[str]) -> list[Path]:
    """Every dir holding a ledger in and below each of ``roots``, each once, in order."""
    from heldout.evaluators.ledger import LEDGER_FILE
    dirs: list[Path] = []
    for root in map(Path, roots):
        if not root.exists():
            raise HeldoutError(f"{root} does not exist")
        found = sorted({p.parent for p in root.rglob(LEDGER_FILE)} | ({root} if (root / LEDGER_FILE).exists() else set()))
        if not found:
            raise HeldoutError(f"no ledger in or below {root} (looked for {LEDGER_FILE})")
        dirs += [d for d in found if d not in dirs]
    return dirs


def ledger_verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", help="session or study dirs: every ledger.jsonl in and below them is checked")
    p.add_argument("--head", default=None, metavar="HASH",
                   help="the run's ledger head as its writer published it (the record's ledger_head): checks "
                        "an unsigned run's authenticity without the writer's key")
    add_trusted_signers(p)
    add_json(p)


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    """Every run in and below each DIR (a session dir or a whole study), one line each: ok
    (authentic, by whom), INVALID (tampered), UNANCHORED (unsigned), UNTRUSTED (which key)."""
    from heldout.evaluators.authenticity import verify_run
    from heldout.evaluators.signing import Authenticity, worst
    dirs = _ledger_dirs(args.run_dirs)
    if args.head and len(dirs) != 1:
        raise HeldoutError(f"--head names one run's published head; {len(dirs)} ledgers were found")
    trusted = trusted_signers(args)
    found = [verify_run(run_dir, trusted, args.head) for run_dir in dirs]
    if args.json:
        print_json([{"run_dir": str(f.run_dir), "status": f.status.value, "exit_code": f.exit_code, "ok": f.ledger.ok,
                      "signer": f.check.signer, "fingerprint": f.check.fingerprint, "reason": f.check.reason,
                      "anchored": f.ledger.anchored, "entries": f.ledger.entries, "head": f.ledger.head,
                      "problems": f.ledger.problems} for f in found])
    else:
        for f in found:
            print(f.line())
        counts = {status: sum(f.status is status for f in found) for status in Authenticity}
        if len(found) > 1:
            print(f"{len(found)} run(s) checked: " + ", ".join(f"{n} {status.value}" for status, n in counts.items() if n))
        if counts[Authenticity.UNTRUSTED] and not trusted:
            print("no trusted signer: pass --trusted-signers FILE or --trust-key KEY (this machine has no signing key)")
    return worst(f.check for f in found).exit_code


def ledger_sign_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", help="session or study dirs written before signatures, on this machine")


def cmd_ledger_sign(args: argparse.Namespace) -> int:
    """Migrate HMAC-era runs: sign each run that verifies under this machine's ledger key."""
    from heldout.evaluators.authenticity import sign_run
    from heldout.evaluators.signing import load_signing_key
    key = load_signing_key()
    refused = 0
    for run_dir in _ledger_dirs(args.run_dirs):
        done, line = sign_run(run_dir, key)
        refused += not done
        print(line)
    return 1 if refused else 0


def key_show_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default=os.environ.get("USER") or "me", help="the signer's name in the printed line")


def cmd_key_show(args: argparse.Namespace) -> int:
    """This user's public key as a trusted-signers line (the key is made on first use)."""
    from heldout.evaluators.signing import load_signing_key
    key = load_signing_key()
    print(f"{args.name} {key.public_key}  # {key.fingerprint}")
    print(f"(private key: {key.source}; commit the line above to a trusted-signers file)", file=sys.stderr)
    return 0


def key_generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="the new private key's file (PEM; refused if it exists): e.g. for a CI secret")
    p.add_argument("--name", default="ci", help="the signer's name in the printed line")


def cmd_key_generate(args: argparse.Namespace) -> int:
    from heldout.evaluators.signing import write_new_key
    key = write_new_key(Path(args.out))
    print(f"{args.name} {key.public_key}  # {key.fingerprint}")
    print(f"(private key written to {args.out}, owner-only: store it as a secret, e.g. HELDOUT_SIGNING_KEY, "
          "then delete the file; commit the line above to a trusted-signers file)", file=sys.stderr)
    return 0
