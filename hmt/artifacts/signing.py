"""Optional ed25519 signatures over an artifact's manifest (``manifest.sig`` beside it).

The manifest lists the sha256 and size of every file, and a verified load refuses files
it does not list, so signing the manifest signs the whole artifact. The signed message is
``hmt-manifest-v2\\n`` + the manifest's sha256 (hex) + ``\\n`` + the release version (an
integer) + ``\\n`` + the creation time (the manifest's ``created_utc``): the domain prefix
keeps a signature from being reusable for any other purpose, the hash is the one the
verified load computed from the very bytes it parsed, and the version and time let a
verifier refuse a roll-back to an older release signed by the same key
(:mod:`hmt.artifacts.rollback`). Signatures of the first format (``hmt-manifest-v1``,
no version) still verify, as version ``None``: a verifier that has seen a versioned
release of the key refuses them.

Keys are PEM files, as ``hmt deploy --gen-key`` or OpenSSL write them::

    openssl genpkey -algorithm ed25519 -out hmt-sign.pem
    openssl pkey -in hmt-sign.pem -pubout -out hmt-sign.pub
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hmt.errors import ArtifactError, InputError

SIGNATURE_NAME = "manifest.sig"
ALGORITHM = "ed25519"
_DOMAIN = b"hmt-manifest-v1\n"
_DOMAIN_V2 = b"hmt-manifest-v2\n"
MAX_VERSION = (1 << 63) - 1
_MAX_KEY_BYTES = 64 << 10
_MAX_SIGNATURE_BYTES = 64 << 10
_OPENSSL_HINT = ("create one with `hmt deploy --gen-key KEY` or `openssl genpkey -algorithm ed25519 -out KEY` "
                 "(public half: `openssl pkey -in KEY -pubout -out KEY.pub`)")


def _message(manifest_sha256: str, version: int | None = None, created_utc: str | None = None) -> bytes:
    if version is None:
        return _DOMAIN + manifest_sha256.encode("ascii")
    return _DOMAIN_V2 + f"{manifest_sha256}\n{version}\n{created_utc or ''}".encode("ascii")


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > _MAX_KEY_BYTES:
            raise InputError(f"{path}: {size} bytes; expected a small PEM {what}")
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: does not exist; expected a {what} file; {_OPENSSL_HINT}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc})") from exc


def load_private_key(path: Path | str) -> Any:
    """An ed25519 private key from a PEM file (InputError naming the file otherwise)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    try:
        key = serialization.load_pem_private_key(_read_key_file(path, "private key"), password=None)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{path}: not an unencrypted PEM private key ({exc}); {_OPENSSL_HINT}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"{path}: a {type(key).__name__}, expected an ed25519 private key; {_OPENSSL_HINT}")
    return key


def load_public_key(path: Path | str) -> Any:
    """An ed25519 public key from a PEM file (InputError naming the file otherwise)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    path = Path(path)
    try:
        key = serialization.load_pem_public_key(_read_key_file(path, "public key"))
    except (ValueError, TypeError) as exc:
        raise InputError(f"{path}: not a PEM public key ({exc}); {_OPENSSL_HINT}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(f"{path}: a {type(key).__name__}, expected an ed25519 public key; {_OPENSSL_HINT}")
    return key


def public_key_id(public_key: Any) -> str:
    """sha256 (hex) of the raw 32-byte public key: names the key in signatures and messages."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def generate_key_pair(private_path: Path | str) -> tuple[Path, Path]:
    """Write a new ed25519 key: ``private_path`` (PEM, mode 0600) and ``private_path.pub``.

    Refuses to overwrite either file.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from hmt.artifacts.outputs import check_new_file

    private_path = check_new_file(private_path, what="--gen-key")  # '' and '.' exist: refused before .pub is named
    public_path = private_path.with_name(private_path.name + ".pub")
    check_new_file(public_path, what="--gen-key")  # a key, a link or anything else there is never replaced
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    private_path.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL + 0600 from the start: the private key is never readable by others, not even briefly.
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private_pem)
    fd = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(public_pem)
    return private_path, public_path


def check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
        raise InputError(f"--bundle-version must be an integer in 0..{MAX_VERSION}, got {version!r}")
    return version


def signature_document(manifest_sha256: str, private_key: Any, *, version: int = 0,
                       created_utc: str = "") -> bytes:
    """The ``manifest.sig`` contents for a manifest with this sha256, binding ``version`` and ``created_utc``."""
    check_version(version)
    signature = private_key.sign(_message(manifest_sha256, version, created_utc))
    doc = {"algorithm": ALGORITHM, "key_sha256": public_key_id(private_key.public_key()),
           "manifest_sha256": manifest_sha256, "signature": base64.b64encode(signature).decode("ascii"),
           "version": version, "created_utc": created_utc}
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def sign_artifact_dir(root: Path, manifest_sha256: str, private_key: Any, *, version: int = 0,
                      created_utc: str | None = None) -> Path:
    """Write ``manifest.sig`` into ``root`` (an ``ArtifactWriter.before_commit`` hook).

    ``created_utc``: default the manifest's own creation time (read from ``root``)."""
    if created_utc is None:
        created_utc = _manifest_created(root)
    path = root / SIGNATURE_NAME
    path.write_bytes(signature_document(manifest_sha256, private_key, version=version, created_utc=created_utc))
    return path


def _manifest_created(root: Path) -> str:
    try:
        value = json.loads((root / "manifest.json").read_bytes()).get("created_utc", "")
    except (OSError, ValueError, AttributeError):
        return ""
    return str(value)


def read_release(root: Path) -> tuple[int, str] | None:
    """``(version, created_utc)`` an artifact's ``manifest.sig`` claims, unchecked (None: absent or v1).

    Used to sign derived artifacts (the offload halves) as the same release."""
    try:
        doc = json.loads((root / SIGNATURE_NAME).read_bytes())
        version, created = doc["version"], str(doc["created_utc"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return (version, created) if isinstance(version, int) and not isinstance(version, bool) else None


@dataclass(frozen=True)
class SignatureCheck:
    status: str  # "ok" (checked against the trusted key), "unchecked" (present, no key), "absent"
    key_sha256: str | None = None
    version: int | None = None  # the signed release version (None: a first-format signature)
    created_utc: str | None = None


def check_signature(root: Path, manifest_sha256: str, trusted_key: Any | None) -> SignatureCheck:
    """Check ``root/manifest.sig`` against ``trusted_key`` (a loaded public key).

    With a trusted key, a missing, malformed or non-matching signature is an ArtifactError.
    Without one, the signature is only reported (nothing to check it against).
    """
    path = root / SIGNATURE_NAME
    if os.path.islink(path):
        raise ArtifactError(f"{path}: a symlink; a signature must be a regular file")
    if not path.is_file():
        if trusted_key is not None:
            raise ArtifactError(f"{path}: missing; a trusted key was given, so the bundle must be signed "
                                "(hmt deploy --sign-key KEY)")
        return SignatureCheck("absent")
    if path.stat().st_size > _MAX_SIGNATURE_BYTES:
        raise ArtifactError(f"{path}: larger than {_MAX_SIGNATURE_BYTES} bytes; not a signature")
    return check_signature_bytes(path.read_bytes(), manifest_sha256, trusted_key, str(path))


def check_signature_bytes(raw: bytes, manifest_sha256: str, trusted_key: Any | None, where: str) -> SignatureCheck:
    """:func:`check_signature` on the bytes of a signature document (``where`` names it in errors);
    an archive's signature is checked this way before anything is extracted."""
    path = where
    if len(raw) > _MAX_SIGNATURE_BYTES:
        raise ArtifactError(f"{path}: larger than {_MAX_SIGNATURE_BYTES} bytes; not a signature")
    try:
        doc = json.loads(raw)
        algorithm, key_id = doc["algorithm"], str(doc["key_sha256"])
        signature = base64.b64decode(str(doc["signature"]), validate=True)
        version, created = doc.get("version"), doc.get("created_utc")
        if version is not None:
            check_version(version)
            created = str(created)
            created.encode("ascii")
    except (json.JSONDecodeError, UnicodeError, RecursionError, KeyError, TypeError, AttributeError,
            binascii.Error, InputError) as exc:
        raise ArtifactError(f"{path}: malformed signature file ({type(exc).__name__}: {exc}); expected "
                            "JSON {algorithm, key_sha256, manifest_sha256, signature, version, created_utc}") from exc
    if algorithm != ALGORITHM:
        raise ArtifactError(f"{path}: algorithm {algorithm!r}; expected {ALGORITHM!r}")
    if trusted_key is None:
        return SignatureCheck("unchecked", key_id, version, created)
    from cryptography.exceptions import InvalidSignature

    trusted_id = public_key_id(trusted_key)
    try:
        trusted_key.verify(signature, _message(manifest_sha256, version, created))
    except InvalidSignature:
        if key_id != trusted_id:
            raise ArtifactError(f"{path}: signed by key {key_id[:16]}..., not by the trusted key "
                                f"{trusted_id[:16]}...; refusing the bundle") from None
        raise ArtifactError(f"{path}: the signature does not match manifest.json (sha256 {manifest_sha256[:16]}...);"
                            " the manifest or the signature was changed") from None
    return SignatureCheck("ok", trusted_id, version, created)
