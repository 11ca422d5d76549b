"""Is a run dir authentic? One verdict per run dir, from its ledger, its head, its run record and
their signatures, checked against a list of trusted signers with no secret.

Rules (:func:`verify_run`), in order:

1. **Tampered** when the ledger does not verify (an edited, dropped or reordered entry, a head
   that disagrees with the ledger, a head signature that does not match what the head claims),
   when the run record is not the one its ledger anchors (its digest in ``session_end``, its head
   and entry count), or when a signature does not match what it signs.
2. Otherwise the signatures decide: a finished run's record signature (it vouches for the
   record's digest and the ledger head, hence for every entry), and the head's signature when
   the head carries one or there is no record. Every signature present must be valid; the
   verdict is the worst of them (:func:`heldout.evaluators.signing.worst`): **untrusted** names
   the fingerprint that signed, **authentic** names the trusted signer.
3. A run with no signature at all was written before signatures (the HMAC era): it is
   **authentic** when its head's HMAC verifies under this machine's ledger key, or its chain holds
   the head its writer published (``published_head``); otherwise **unsigned**, saying what its
   HMAC anchor is (another machine's key, no key here). A head that does not name its HMAC key
   and does not match this machine's is unsigned too, not tampered: another machine's key and a
   rewritten head look the same (rule 1 does not apply to that one problem).

Exit codes are :data:`heldout.evaluators.signing.EXIT_CODES` (0 authentic, 1 tampered, 3 unsigned,
4 untrusted). **Migrating** an HMAC-era run: :func:`sign_run` signs a run that verifies as
authentic by this machine's ledger key with this user's signing key (``heldout ledger sign``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from heldout.contracts import HeldoutError
from heldout.files import read_user_json, write_text_atomically
from heldout.evaluators.ledger import (HEAD_FILE, HEAD_PURPOSE, LOCK_FILE, MAX_HEAD_BYTES, UNNAMED_MISMATCH, LedgerError,
                                       LedgerReport, head_payload, ledger_key, ledger_key_id, verify_ledger)
from heldout.evaluators.ledger_io import LockHeld, hold_lock
from heldout.evaluators.records import FORMAT_VERSION, RECORD_FILE, RECORD_PURPOSE, RunRecord, anchor_problem
from heldout.evaluators.signing import (Authenticity, SignatureCheck, SigningKey, TrustedSigners, verify_block,
                                        worst)

HMAC_SIGNER = "this machine's ledger key (HMAC, written before signatures)"
PUBLISHED_SIGNER = "the published head"
_LABELS = {Authenticity.AUTHENTIC: "ok", Authenticity.TAMPERED: "INVALID", Authenticity.UNSIGNED: "UNANCHORED",
           Authenticity.UNTRUSTED: "UNTRUSTED"}


@dataclass(frozen=True)
class RunAuthenticity:
    """The verdict on one run dir: ``check`` (status, one-line reason, signer, fingerprint), the
    ledger report it rests on, and whether the run is finished (has a record)."""

    run_dir: Path
    check: SignatureCheck
    ledger: LedgerReport
    finished: bool

    @property
    def status(self) -> Authenticity:
        return self.check.status

    @property
    def ok(self) -> bool:
        return self.check.ok

    @property
    def exit_code(self) -> int:
        return self.check.exit_code

    def line(self, limit: int = 300) -> str:
        """One line: ``LABEL DIR: what was found`` (at most ``limit`` characters of reason)."""
        reason = self.check.reason if len(self.check.reason) <= limit else self.check.reason[:limit - 3] + "..."
        if self.ok:
            reason = (f"{self.ledger.entries} entries, chain intact, head {self.ledger.head[:16]}, "
                      f"authentic ({reason})")
        return f"{_LABELS[self.status]:<9} {self.run_dir}: {reason}"


def _tampered(reason: str) -> SignatureCheck:
    return SignatureCheck(Authenticity.TAMPERED, reason)


def verify_run(run_dir: str | Path, trusted: TrustedSigners, published_head: str | None = None) -> RunAuthenticity:
    """The authenticity of ``run_dir`` (see the module docstring). Reads only; never raises on
    a hostile run dir (its problem is the verdict)."""
    run_dir = Path(run_dir)
    ledger = verify_ledger(run_dir, published_head, trusted)
    finished = (run_dir / RECORD_FILE).exists()
    if ledger.hmac == UNNAMED_MISMATCH and len(ledger.problems) == 1 and ledger.signature is not None \
            and ledger.signature.status is Authenticity.UNSIGNED:
        # an HMAC-era head from another machine looks exactly like a rewritten one: not INVALID, unanchored
        return RunAuthenticity(run_dir, SignatureCheck(
            Authenticity.UNSIGNED, "unsigned, and its HMAC anchor is not under this machine's ledger key: another "
            "machine's key or a rewritten head (a head written before heads named their key cannot say which); "
            "authenticity NOT checked (sign it where it was written: heldout ledger sign DIR)"),
            ledger, (run_dir / RECORD_FILE).exists())
    if not ledger.ok:
        more = f" (+{len(ledger.problems) - 1} more)" if len(ledger.problems) > 1 else ""
        return RunAuthenticity(run_dir, _tampered(ledger.problems[0] + more), ledger, finished)
    checks: list[SignatureCheck] = []
    if finished:
        try:
            record = RunRecord.load(run_dir)
        except (HeldoutError, TypeError) as exc:
            return RunAuthenticity(run_dir, _tampered(f"run record unreadable: {exc}"), ledger, finished)
        if record.format_version < FORMAT_VERSION:
            return RunAuthenticity(run_dir, SignatureCheck(
                Authenticity.UNSIGNED, f"a format {record.format_version} run record: not anchored to its ledger; "
                "re-run it"), ledger, finished)
        problem = anchor_problem(record, ledger.checked, ledger.head, run_dir / RECORD_FILE)
        if problem:
            return RunAuthenticity(run_dir, _tampered(problem), ledger, finished)
        checks.append(verify_block(record.signature, RECORD_PURPOSE, record.signed_payload(), trusted, "run record"))
    head_signed = ledger.signature is not None and ledger.signature.status is not Authenticity.UNSIGNED
    if head_signed or not finished:
        checks.append(ledger.signature or SignatureCheck(Authenticity.UNSIGNED, "ledger head: unsigned"))
    verdict = worst(checks)
    if verdict is None:  # a finished run checks its record, an unfinished one its head: never none
        raise HeldoutError(f"{run_dir}: no signature was checked (a bug in heldout, not in the run dir)")
    if all(c.status is Authenticity.UNSIGNED for c in checks):
        verdict = _hmac_era(ledger)
    return RunAuthenticity(run_dir, verdict, ledger, finished)


def _hmac_era(ledger: LedgerReport) -> SignatureCheck:
    """The verdict on a run signed by nobody: its HMAC anchor or the published head, else unsigned."""
    if ledger.anchored == "key":
        return SignatureCheck(Authenticity.AUTHENTIC, f"anchored by {HMAC_SIGNER}", signer=HMAC_SIGNER)
    if ledger.anchored == "published head":
        return SignatureCheck(Authenticity.AUTHENTIC, "checked against the published head", signer=PUBLISHED_SIGNER)
    where = {"another key": "its HMAC anchor is another machine's ledger key",
             "no key here": "no ledger key here to check its HMAC anchor"}.get(ledger.hmac or "", "no HMAC anchor")
    return SignatureCheck(Authenticity.UNSIGNED, f"unsigned, and {where}: authenticity NOT checked (sign it where "
                          "it was written: heldout ledger sign DIR; or pass the head its writer published: --head HASH)")


def sign_run(run_dir: str | Path, key: SigningKey) -> tuple[bool, str]:
    """Migrate an HMAC-era run: sign its head (and record, when finished) with ``key`` once it
    verifies as authentic by this machine's ledger key. Returns (whether it is signed now, one
    line saying what was done or why not): a run that does not verify, is anchored elsewhere or
    is in use by a writer is refused; one signed already is left as it is."""
    run_dir = Path(run_dir)
    try:
        lock = hold_lock(run_dir / LOCK_FILE)
    except LockHeld as held:
        return False, f"refused   {run_dir}: in use by another session ({held.holder}); sign it once it ends"
    except OSError as exc:
        return False, f"refused   {run_dir}: cannot lock it: {exc.strerror or exc}"
    try:
        found = verify_run(run_dir, TrustedSigners())
        if found.status is Authenticity.UNTRUSTED:  # valid signatures, by someone: nothing to migrate
            return True, f"signed    {run_dir}: already, by {found.check.fingerprint}"
        if found.check.signer != HMAC_SIGNER:
            return False, (f"refused   {run_dir}: {found.check.reason} (only a run anchored by this machine's ledger "
                           "key is signed here: the machine that wrote it vouches for it)")
        head = read_user_json(run_dir / HEAD_FILE, "ledger head file", max_bytes=MAX_HEAD_BYTES, error=LedgerError)
        first = found.ledger.checked[0]["hash"]
        head["signature"] = key.sign(HEAD_PURPOSE, head_payload(first, found.ledger.entries, found.ledger.head))
        head["key_id"] = ledger_key_id(ledger_key(create=False) or b"")  # it verified under this key
        if found.finished:
            record = RunRecord.load(run_dir)
            record.sign(key)
            record.save(run_dir)
        write_text_atomically(run_dir / HEAD_FILE, json.dumps(head), mode=0o600)
    except (HeldoutError, OSError) as exc:
        return False, f"refused   {run_dir}: {exc}"
    finally:
        os.close(lock)
    what = "head and run record" if found.finished else "head"
    return True, f"signed    {run_dir}: {what} (head {found.ledger.head[:16]}) by {key.fingerprint}"
