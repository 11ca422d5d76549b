"""The signing library (:mod:`heldout.evaluators.signing`): where keys live and who may read them,
trusted-signers files, and the four verdicts with their exit codes. The same studies checked across
machines through the CLI are tests/test_signatures.py's."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from heldout.evaluators.ledger import HEAD_PURPOSE
from heldout.evaluators.signing import (Authenticity, SigningError, SigningKey, TrustedSigners, load_signing_key,
                                        verify_block)

KEY_ENV = ("HELDOUT_LEDGER_KEY", "HELDOUT_SIGNING_KEY_FILE", "HELDOUT_SIGNING_KEY")


def forger() -> SigningKey:
    return SigningKey(Ed25519PrivateKey.generate(), "a key of the test's")


def test_the_key_is_made_once_owner_only_under_xdg_config_home_and_refused_once_others_may_read_it(tmp_path,
                                                                                                monkeypatch):
    for name in KEY_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert load_signing_key(create=False) is None and not (tmp_path / "config").exists()
    key = load_signing_key()
    path = tmp_path / "config" / "heldout" / "signing.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and load_signing_key().fingerprint == key.fingerprint
    path.chmod(0o644)
    with pytest.raises(SigningError, match="may be read by others"):
        load_signing_key()
    # a CI secret: the key itself in the environment, never written anywhere
    secret = Ed25519PrivateKey.generate()
    monkeypatch.setenv("HELDOUT_SIGNING_KEY", SigningKey(secret, "test").private_pem().decode())
    assert load_signing_key().fingerprint == SigningKey(secret, "test").fingerprint
    monkeypatch.setenv("HELDOUT_SIGNING_KEY", "not a key")
    with pytest.raises(SigningError, match=r"HELDOUT_SIGNING_KEY is unreadable"):
        load_signing_key()


def test_a_trusted_signers_file_names_keys_or_fingerprints_and_a_bad_line_is_named(tmp_path):
    a, b = forger(), forger()
    path = tmp_path / "allowed_signers"
    path.write_text(f"# who signs\nalice {a.public_key}\n\nbob {b.fingerprint}  # by fingerprint\n")
    trusted = TrustedSigners.load(path)
    assert trusted.name_of(a.fingerprint) == "alice" and trusted.name_of(b.fingerprint) == "bob"
    path.write_text(f"alice {a.public_key}\nbob ed25519:short\n")
    with pytest.raises(SigningError, match="allowed_signers line 2"):
        TrustedSigners.load(path)
    assert TrustedSigners.from_flag(a.public_key).name_of(a.fingerprint) == "--trust-key"


def test_each_verdict_has_its_own_status_and_exit_code():
    key, payload = forger(), {"first": "a", "count": 3, "last": "b"}
    block = key.sign(HEAD_PURPOSE, payload)
    mine = TrustedSigners.from_flag(f"me={key.public_key}")
    verdicts = {
        "authentic": verify_block(block, HEAD_PURPOSE, payload, mine),
        "untrusted": verify_block(block, HEAD_PURPOSE, payload, TrustedSigners()),
        "unsigned": verify_block(None, HEAD_PURPOSE, payload, mine),
        "edited": verify_block(block, HEAD_PURPOSE, {**payload, "count": 4}, mine),
        "another purpose": verify_block(block, "run-record", payload, mine),
        "swapped key": verify_block({**block, "public_key": forger().public_key}, HEAD_PURPOSE, payload, mine),
        "garbage": verify_block({"scheme": 1}, HEAD_PURPOSE, payload, mine),
    }
    assert {k: (v.status, v.exit_code) for k, v in verdicts.items()} == {
        "authentic": (Authenticity.AUTHENTIC, 0), "untrusted": (Authenticity.UNTRUSTED, 4),
        "unsigned": (Authenticity.UNSIGNED, 3), "edited": (Authenticity.TAMPERED, 1),
        "another purpose": (Authenticity.TAMPERED, 1), "swapped key": (Authenticity.TAMPERED, 1),
        "garbage": (Authenticity.TAMPERED, 1)}
    assert verdicts["authentic"].signer == "me" and verdicts["untrusted"].fingerprint == key.fingerprint


@pytest.mark.parametrize("bad", ["a CI secret that is not a key", "a key file others may read"])
def test_a_study_with_an_unusable_signing_key_is_refused_in_one_line_and_writes_nothing(tmp_path, bad):
    env = {k: v for k, v in os.environ.items() if k not in KEY_ENV}
    env.update(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "home" / ".config"))
    if bad == "a CI secret that is not a key":
        env["HELDOUT_SIGNING_KEY"] = "${{ secrets.HELDOUT_SIGNING_KEY }}"  # a workflow that never set it
    else:
        key = tmp_path / "home" / ".config" / "heldout" / "signing.key"
        key.parent.mkdir(parents=True)
        key.write_bytes(forger().private_pem())
        key.chmod(0o644)
    done = subprocess.run([sys.executable, "-m", "heldout.cli", "run", "--task", "heilbronn/triangle11", "--optimizer",
                           "seed", "--seeds", "0", "--budget", "2", "--run-dir", str(tmp_path / "study")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "signing key" in done.stderr and not (tmp_path / "study").exists()
