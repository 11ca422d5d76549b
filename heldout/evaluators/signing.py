"""Ed25519 signatures for ledger heads and run records, and the trusted signers they are checked
against: authenticity a reviewer verifies with a public key alone, no secret.

**Keys.** A user's signing key is, in this order: ``$HELDOUT_SIGNING_KEY`` (the private key
itself, for a CI secret: PEM PKCS#8 or the base64 of the 32 raw bytes; never written to disk),
the file ``$HELDOUT_SIGNING_KEY_FILE``, else ``$XDG_CONFIG_HOME/heldout/signing.key``, else
``~/.config/heldout/signing.key``. A key file is PEM PKCS#8 (``openssl pkey -in FILE -pubout``
reads it), created owner-only (0600) on first use, and refused when others may read it.

**Public keys and fingerprints.** A public key is written ``ed25519:<base64 of the 32 raw bytes>``;
its fingerprint is ``SHA256:<unpadded base64 of sha256 of those bytes>``.

**Signature blocks.** :meth:`SigningKey.sign` returns the block stored beside what it signs::

    {"scheme": "heldout-ed25519-v1", "public_key": "ed25519:...", "fingerprint": "SHA256:...",
     "signature": "<base64>"}

over ``heldout-ed25519-v1\\n<purpose>\\n<canonical JSON of the payload>`` (the purpose keeps a
head's signature from passing as a record's).

**Trusted signers** (:class:`TrustedSigners`): a file a repository can commit, one signer a line,
like SSH's allowed_signers::

    # name   public key or fingerprint
    ci       ed25519:3Jb0...=
    alice    SHA256:q1w2...

plus keys given on the command line. With neither, the only trusted signer is this machine's own
key (:meth:`TrustedSigners.own`, never created by a check).

**Verification** (:func:`verify_block`) returns a :class:`SignatureCheck`: exactly one
:class:`Authenticity` with a one-line reason, the trusted signer's name when authentic, and the
fingerprint that signed. Its exit code (:data:`EXIT_CODES`): 0 authentic, 1 tampered, 3 unsigned,
4 signed by a key not in the trusted list. :func:`worst` combines several checks. How a whole run
dir (ledger head, run record, and the HMAC anchor of studies written before signatures) is judged
is :func:`heldout.evaluators.authenticity.verify_run`."""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from heldout.contracts import HeldoutError, canonical_json
from heldout.files import read_user_text

SCHEME = "heldout-ed25519-v1"
KEY_ENV = "HELDOUT_SIGNING_KEY"
KEY_FILE_ENV = "HELDOUT_SIGNING_KEY_FILE"
KEY_FILE_NAME = "signing.key"
PUBLIC_PREFIX = "ed25519:"
FINGERPRINT_PREFIX = "SHA256:"
MAX_KEY_FILE_BYTES = 1 << 14
MAX_SIGNERS_FILE_BYTES = 1 << 20
OWN_KEY_NAME = "this machine's signing key"


class SigningError(HeldoutError):
    """A signing key or trusted-signers list is unusable (one line naming it and the way out)."""


class Authenticity(enum.Enum):
    """What verification found; exactly one holds."""

    AUTHENTIC = "authentic"
    TAMPERED = "tampered"
    UNSIGNED = "unsigned"
    UNTRUSTED = "untrusted signer"


EXIT_CODES: Mapping[Authenticity, int] = {Authenticity.AUTHENTIC: 0, Authenticity.TAMPERED: 1,
                                          Authenticity.UNSIGNED: 3, Authenticity.UNTRUSTED: 4}
# how bad each is when several are combined (worst first): a forgery outranks a stranger's key,
# which outranks no signature at all
_SEVERITY = (Authenticity.TAMPERED, Authenticity.UNTRUSTED, Authenticity.UNSIGNED, Authenticity.AUTHENTIC)


@dataclass(frozen=True)
class SignatureCheck:
    """The verdict on one signed thing: ``status``, a one-line ``reason``, the trusted ``signer``'s
    name (authentic only) and the ``fingerprint`` of the key that signed (None when unsigned or
    the block is unreadable)."""

    status: Authenticity
    reason: str
    signer: str | None = None
    fingerprint: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is Authenticity.AUTHENTIC

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]


def worst(checks: Iterable[SignatureCheck]) -> SignatureCheck | None:
    """The most severe of ``checks`` (tampered > untrusted > unsigned > authentic); None if empty."""
    checks = list(checks)
    return min(checks, key=lambda c: _SEVERITY.index(c.status)) if checks else None


# -- public keys --------------------------------------------------------------------------------------
def public_key_text(raw: bytes) -> str:
    return PUBLIC_PREFIX + base64.b64encode(raw).decode("ascii")


def fingerprint(raw: bytes) -> str:
    return FINGERPRINT_PREFIX + base64.b64encode(hashlib.sha256(raw).digest()).decode("ascii").rstrip("=")


def parse_public_key(text: str) -> bytes:
    """The 32 raw bytes of an ``ed25519:BASE64`` public key; :class:`SigningError` otherwise."""
    if not isinstance(text, str) or not text.startswith(PUBLIC_PREFIX):
        raise SigningError(f"not a heldout public key (expected {PUBLIC_PREFIX}BASE64): {str(text)[:60]!r}")
    raw = _b64(text[len(PUBLIC_PREFIX):])
    if raw is None or len(raw) != 32:
        raise SigningError(f"not a heldout public key (32 bytes of base64 after {PUBLIC_PREFIX}): {text[:60]!r}")
    return raw


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


# -- the signing key ----------------------------------------------------------------------------------
def config_dir() -> Path:
    """heldout's folder of this user's keys: ``$XDG_CONFIG_HOME/heldout``, else ``~/.config/heldout``.
    Refused in one line where that is no absolute path (no ``$HOME`` and a user without a home:
    ``~`` stays ``~``), which would put a new private key in every working directory."""
    folder = Path(os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")) / "heldout"
    if not folder.is_absolute():
        raise SigningError(f"this user's keys would be kept in {folder}, a path relative to the working directory "
                           f"($HOME is unset and user {os.getuid()} has no home folder): set $HOME or "
                           f"$XDG_CONFIG_HOME to a folder of yours, or ${KEY_FILE_ENV} to a key file")
    return folder


def signing_key_path() -> Path:
    """Where this user's signing key file is (see the module docstring)."""
    override = os.environ.get(KEY_FILE_ENV)
    return Path(override) if override else config_dir() / KEY_FILE_NAME


class SigningKey:
    """A private key that signs; ``public_key`` and ``fingerprint`` name it. ``source`` says where
    it came from (a path, or ``$HELDOUT_SIGNING_KEY``), never the key."""

    def __init__(self, private: Ed25519PrivateKey, source: str) -> None:
        self._private = private
        self.source = source
        self.public_raw = private.public_key().public_bytes(serialization.Encoding.Raw,
                                                           serialization.PublicFormat.Raw)
        self.public_key = public_key_text(self.public_raw)
        self.fingerprint = fingerprint(self.public_raw)

    def sign(self, purpose: str, payload: Any) -> dict[str, str]:
        """The signature block over ``payload`` (plain JSON data) for ``purpose``."""
        signature = self._private.sign(_message(purpose, payload))
        return {"scheme": SCHEME, "public_key": self.public_key, "fingerprint": self.fingerprint,
                "signature": base64.b64encode(signature).decode("ascii")}

    def private_pem(self) -> bytes:
        return self._private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())

    def __repr__(self) -> str:  # never the key
        return f"SigningKey({self.fingerprint}, from {self.source})"


def parse_private_key(text: str, source: str) -> SigningKey:
    """A key from PEM PKCS#8 text or the base64 of its 32 raw bytes."""
    text = text.strip()
    try:
        if text.startswith("-----BEGIN"):
            key = serialization.load_pem_private_key(text.encode("ascii"), password=None)
        else:
            raw = _b64(text)
            if raw is None or len(raw) != 32:
                raise ValueError("neither PEM nor the base64 of 32 raw bytes")
            key = Ed25519PrivateKey.from_private_bytes(raw)
    except (ValueError, TypeError, UnicodeEncodeError) as exc:
        raise SigningError(f"the signing key from {source} is unreadable: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"the signing key from {source} is a {type(key).__name__}, not an Ed25519 key")
    return SigningKey(key, source)


def load_signing_key(create: bool = True) -> SigningKey | None:
    """This user's signing key (see the module docstring). A missing key file is created when
    ``create``; else None. A corrupt key, or a key file others may read, is a :class:`SigningError`."""
    secret = os.environ.get(KEY_ENV)
    if secret:
        return parse_private_key(secret, f"${KEY_ENV}")
    path = signing_key_path()
    if not path.exists():
        if not create:
            return None
        _create_key_file(path)
    mode = path.stat().st_mode
    if mode & 0o077 and stat.S_ISREG(mode):
        raise SigningError(f"the signing key {path} may be read by others (mode {stat.S_IMODE(mode):o}): "
                           f"chmod 600 {path}")
    return parse_private_key(read_user_text(path, "signing key", max_bytes=MAX_KEY_FILE_BYTES, error=SigningError),
                             str(path))


def write_new_key(path: Path) -> SigningKey:
    """A new key written to ``path`` (owner-only); refuses to replace an existing file."""
    key = SigningKey(Ed25519PrivateKey.generate(), str(path))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise SigningError(f"{path} exists; a new key never replaces a key (move it away first)") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.private_pem())
        fh.flush()
        os.fsync(fh.fileno())
    return key


def _create_key_file(path: Path) -> None:
    """Create the key whole under a private name, then link it into place: two sessions starting
    together both end up with the one key that won, never a half-written file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        write_new_key(tmp)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: theirs is the key
    finally:
        tmp.unlink(missing_ok=True)


# -- trusted signers ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrustedSigner:
    name: str
    fingerprint: str
    public_key: str | None  # None when the list names the fingerprint only


@dataclass(frozen=True)
class TrustedSigners:
    """Who may sign: a list of named keys (by public key or fingerprint)."""

    signers: tuple[TrustedSigner, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.signers)

    def name_of(self, fp: str) -> str | None:
        """The trusted name for the key with fingerprint ``fp``, or None."""
        return next((s.name for s in self.signers if s.fingerprint == fp), None)

    def describe(self) -> str:
        return ", ".join(f"{s.name} ({s.fingerprint})" for s in self.signers) or "nobody"

    def __add__(self, other: "TrustedSigners") -> "TrustedSigners":
        return TrustedSigners(self.signers + other.signers)

    @classmethod
    def parse(cls, text: str, source: str) -> "TrustedSigners":
        """``name key-or-fingerprint`` lines; ``#`` starts a comment; a bad line is one error
        naming ``source`` and the line number."""
        signers = []
        for lineno, line in enumerate(text.splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) != 2:
                raise SigningError(f"{source} line {lineno}: expected 'NAME PUBLIC-KEY-OR-FINGERPRINT', "
                                   f"got {len(words)} word(s)")
            try:
                signers.append(signer_from(words[0], words[1]))
            except SigningError as exc:
                raise SigningError(f"{source} line {lineno}: {exc}") from None
        return cls(tuple(signers))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "TrustedSigners":
        text = read_user_text(path, "trusted signers file", max_bytes=MAX_SIGNERS_FILE_BYTES, error=SigningError)
        found = cls.parse(text, os.fspath(path))
        if not found:
            raise SigningError(f"trusted signers file {os.fspath(path)} names no signer")
        return found

    @classmethod
    def from_flag(cls, value: str) -> "TrustedSigners":
        """``--trust-key [NAME=]KEY-OR-FINGERPRINT``."""
        name, sep, key = value.partition("=")
        if not sep or name.startswith((PUBLIC_PREFIX, FINGERPRINT_PREFIX)):
            name, key = "--trust-key", value
        return cls((signer_from(name, key),))

    @classmethod
    def own(cls) -> "TrustedSigners":
        """This machine's own key, when it has one (never created here)."""
        key = load_signing_key(create=False)
        return cls(()) if key is None else cls((TrustedSigner(OWN_KEY_NAME, key.fingerprint, key.public_key),))

    @classmethod
    def resolve(cls, files: Iterable[str | os.PathLike[str]] = (), keys: Iterable[str] = ()) -> "TrustedSigners":
        """The signers a command trusts: the files and keys it was given, or, given none, this
        machine's own key (an empty list when it has none: the caller refuses to call anything
        authentic then)."""
        files, keys = list(files), list(keys)
        if not files and not keys:
            return cls.own()
        found = cls(())
        for path in files:
            found = found + cls.load(path)
        for key in keys:
            found = found + cls.from_flag(key)
        return found


def signer_from(name: str, key: str) -> TrustedSigner:
    if key.startswith(FINGERPRINT_PREFIX):
        digest = _b64(key[len(FINGERPRINT_PREFIX):] + "=")
        if digest is None or len(digest) != 32:
            raise SigningError(f"not a fingerprint (expected {FINGERPRINT_PREFIX} and 43 base64 characters): "
                               f"{key[:60]!r}")
        return TrustedSigner(name, key, None)
    raw = parse_public_key(key)
    return TrustedSigner(name, fingerprint(raw), public_key_text(raw))


# -- verification -------------------------------------------------------------------------------------
def _message(purpose: str, payload: Any) -> bytes:
    return f"{SCHEME}\n{purpose}\n{canonical_json(payload)}".encode("utf-8", "surrogatepass")


def verify_block(block: Any, purpose: str, payload: Any, trusted: TrustedSigners,
                 what: str = "signature") -> SignatureCheck:
    """Check the signature ``block`` (as read from a file: anything) over ``payload`` for
    ``purpose`` against ``trusted``. ``what`` names the signed thing in the reason."""
    if block is None:
        return SignatureCheck(Authenticity.UNSIGNED, f"{what}: unsigned")
    if not isinstance(block, dict) or not all(isinstance(block.get(k), str) for k in
                                              ("scheme", "public_key", "fingerprint", "signature")):
        return SignatureCheck(Authenticity.TAMPERED, f"{what}: the signature block is malformed")
    if block["scheme"] != SCHEME:
        return SignatureCheck(Authenticity.TAMPERED, f"{what}: unknown signature scheme {block['scheme'][:40]!r}")
    try:
        raw = parse_public_key(block["public_key"])
    except SigningError:
        return SignatureCheck(Authenticity.TAMPERED, f"{what}: the signature's public key is malformed")
    fp = fingerprint(raw)
    if block["fingerprint"] != fp:
        return SignatureCheck(Authenticity.TAMPERED, f"{what}: the signature names fingerprint "
                              f"{block['fingerprint'][:60]} but carries the key {fp}", fingerprint=fp)
    signature = _b64(block["signature"])
    try:
        if signature is None:
            raise InvalidSignature
        Ed25519PublicKey.from_public_bytes(raw).verify(signature, _message(purpose, payload))
    except InvalidSignature:
        return SignatureCheck(Authenticity.TAMPERED, f"{what}: the signature by {fp} does not match the "
                              "content (edited after it was signed)", fingerprint=fp)
    name = trusted.name_of(fp)
    if name is None:
        return SignatureCheck(Authenticity.UNTRUSTED, f"{what}: signed by {fp}, a key that is not among the "
                              "trusted signers", fingerprint=fp)
    return SignatureCheck(Authenticity.AUTHENTIC, f"{what}: signed by {name} ({fp})", signer=name, fingerprint=fp)
