"""Ed25519 signatures over an artifact's manifest (`cryptography`).

What is signed: the exact bytes of `tfcompile/manifest.json` as stored. The
manifest holds the sha256 of every other file of the artifact (weights,
config.json, tokenizer, kernels, views; the report page in its integrity entry),
so a valid signature plus matching checksums plus no unlisted files (`verify`'s
`checksums`, `paths`, `extra files` and `report` checks) proves every byte is
what the key holder signed. Signing the
stored bytes, not a re-serialization, leaves nothing to canonicalize: the
manifest writer is deterministic, and any edit, even whitespace, breaks it.

Where: `tfcompile/manifest.sig`, a small JSON document
`{algorithm, key_id, signed_file, manifest_sha256, signature}` (base64). It
is not in the manifest's `files` (it cannot hash itself) and `verify` allows
exactly it and the manifest beside the listed files. `key_id` is the sha256
of the raw 32-byte public key, so a wrong key is named as such.

Keys: a private key is a PEM (PKCS#8, as `openssl genpkey -algorithm ed25519`
writes) or OpenSSH file; an encrypted one takes its passphrase from
TFCOMPILE_KEY_PASSPHRASE. A public key is a PEM (`openssl pkey -pubout`) or an
OpenSSH `ssh-ed25519 ...` line. Key material is never written into the
artifact, echoed in errors or logged: messages name the file only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tfcompile.artifact.manifest import MANIFEST
from tfcompile.errors import UserError
from tfcompile.io.bounded import read_regular
from tfcompile.io.jsonfile import write_json
from tfcompile.settings import settings

SIGNATURE = "tfcompile/manifest.sig"
ALGORITHM = "ed25519"
PASSPHRASE_ENV = "TFCOMPILE_KEY_PASSPHRASE"
_MAX_KEY_BYTES = 64 << 10
_MAKE_KEY = ("make one with: openssl genpkey -algorithm ed25519 -out release.pem "
             "(public half: openssl pkey -in release.pem -pubout -out release.pub)")


def _read_key_file(path: Path, what: str) -> bytes:
    """A regular file of at most 64 KiB (a FIFO would block verify forever); UserError naming it."""
    try:
        return read_regular(path, what, _MAX_KEY_BYTES)
    except UserError as e:
        if "limit" in e.message:
            raise UserError(f"{path} is not an ed25519 {what} (too large)", hint=_MAKE_KEY) from None
        raise


def load_private_key(path: str | os.PathLike):
    """The Ed25519PrivateKey in `path`; UserError (naming the file only) otherwise."""
    path = Path(path)
    data = _read_key_file(path, "private key")
    password = settings().key_passphrase
    password = password.encode() if password else None
    try:
        if b"BEGIN OPENSSH PRIVATE KEY" in data:
            key = serialization.load_ssh_private_key(data, password)
        else:
            key = serialization.load_pem_private_key(data, password)
    except TypeError:  # encrypted without a passphrase, or a passphrase for a plain key
        if password is None:
            raise UserError(f"the private key {path} is encrypted and no passphrase was given",
                            hint=f"set {PASSPHRASE_ENV} to its passphrase") from None
        raise UserError(f"the private key {path} is not encrypted, but {PASSPHRASE_ENV} is set",
                        hint=f"unset {PASSPHRASE_ENV}") from None
    except (ValueError, UnsupportedAlgorithm):
        hint = (f"check {PASSPHRASE_ENV}" if password and b"ENCRYPTED" in data
                else "pass a PEM (PKCS#8) or OpenSSH ed25519 private key; " + _MAKE_KEY)
        raise UserError(f"{path} is not an ed25519 private key (or its passphrase is wrong)", hint=hint) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UserError(f"{path} holds a {_kind(key)} key, not an ed25519 private key",
                        hint="tfcompile signs with ed25519 only; " + _MAKE_KEY)
    return key


def load_public_key(path: str | os.PathLike):
    """The Ed25519PublicKey in `path`; UserError (naming the file only) otherwise."""
    path = Path(path)
    data = _read_key_file(path, "public key")
    if b"PRIVATE KEY" in data:
        raise UserError(f"{path} is a private key; verify takes the public key",
                        hint="derive it with: openssl pkey -in KEY.pem -pubout -out KEY.pub")
    try:
        if data.lstrip().startswith(b"ssh-"):
            key = serialization.load_ssh_public_key(data.strip())
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise UserError(f"{path} is not an ed25519 public key",
                        hint="pass a PEM public key (openssl pkey -pubout) or an OpenSSH ssh-ed25519 line") from None
    if not isinstance(key, Ed25519PublicKey):
        raise UserError(f"{path} holds a {_kind(key)} public key, not an ed25519 one",
                        hint="tfcompile signatures are ed25519")
    return key


def _kind(key) -> str:
    return type(key).__name__.removeprefix("_").replace("PrivateKey", "").replace("PublicKey", "") or "other"


def key_id(public_key) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def sign_artifact(path: Path, private_key) -> Path:
    """Write `path`/tfcompile/manifest.sig for the manifest as it is now; returns its path."""
    manifest = Path(path) / MANIFEST
    data = manifest.read_bytes()
    doc = {"algorithm": ALGORITHM, "key_id": key_id(private_key.public_key()), "signed_file": MANIFEST,
           "manifest_sha256": hashlib.sha256(data).hexdigest(),
           "signature": base64.b64encode(private_key.sign(data)).decode()}
    out = Path(path) / SIGNATURE
    write_json(out, doc, atomic=True)
    return out


def drop_stale_signature(path: Path) -> list[str]:
    """After a tool rewrote the manifest (tune): remove the signature it broke; the warning to show."""
    sig = Path(path) / SIGNATURE
    if not os.path.lexists(sig):
        return []
    sig.unlink()
    return [f"the manifest changed, so its signature was removed; re-sign with: tfcompile sign {path} --key KEY"]


def check_signature(path: Path, public_key=None) -> tuple[bool, str]:
    """(ok, detail) for verify's `signature` check. Without a key, a signature is reported, not checked."""
    sig_path = Path(path) / SIGNATURE
    if public_key is None:
        if os.path.lexists(sig_path):
            return True, f"{SIGNATURE} present, not checked (pass --public-key to check it)"
        return True, "not signed"
    if not os.path.lexists(sig_path) or os.path.islink(sig_path) or not sig_path.is_file():
        return False, f"{SIGNATURE} is missing: the artifact is not signed"
    try:
        doc = json.loads(read_regular(sig_path, "signature file", _MAX_KEY_BYTES))  # no FIFO, at most 64 KiB
        signature = base64.b64decode(doc["signature"], validate=True)
        kid, algorithm = doc["key_id"], doc["algorithm"]
    except (UserError, OSError, ValueError, KeyError, TypeError, RecursionError):
        return False, f"{SIGNATURE} is damaged"
    if algorithm != ALGORITHM:
        return False, f"{SIGNATURE}: unsupported algorithm {str(algorithm)[:20]!r}"
    if kid != key_id(public_key):
        return False, f"signed with a different key (key id {str(kid)[:16]}..., yours {key_id(public_key)[:16]}...)"
    try:
        public_key.verify(signature, (Path(path) / MANIFEST).read_bytes())
    except InvalidSignature:
        return False, "the manifest does not match its signature: the artifact was changed after signing"
    return True, f"{ALGORITHM} signature valid (key id {kid[:16]}...)"
