"""Signed audit heads: Ed25519 signatures over ``(seq, hash, time)`` (issue 16 item 4).

A bare head ``SEQ:HASH`` kept outside the database proves the log's *prefix* up to
SEQ, but whoever can write the database can append entries and recompute the chain
after it. A head signed with a key kept outside the database fixes the whole log up
to the signed entry and marks every later entry as *unsigned*: ``audit verify
--trusted-key PUB --signed-head FILE`` fails on any entry the key holder did not sign
(unless the caller explicitly accepts an unsigned tail after the signed head).

Format. :func:`generate_keypair` writes the private key as unencrypted PKCS#8 PEM
(mode 0600) and the public key as SubjectPublicKeyInfo PEM (``cryptography``). A
signed head is a JSON document ``{"format", "seq", "hash", "time", "key_id",
"signature"}``; the signed message is the RFC 8785 canonical JSON of
``{"format", "seq", "hash", "time"}`` (``time`` ISO 8601 UTC), the signature is
Ed25519 (RFC 8032) in base64, and ``key_id`` is the first 16 hex digits of SHA-256 of
the raw public key (informative: verification uses the trusted key file only).
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from privcal.errors import AuditFailed, InvalidInput, first_error
from privcal.storage.audit import canonical
from privcal.storage.records import AuditHeadInfo

__all__ = [
    "FORMAT",
    "SignedHead",
    "generate_keypair",
    "load_private_key",
    "load_public_key",
    "public_key_from_pem",
    "read_signed_head",
    "sign_head",
    "sign_verified",
    "verify_signed_head",
]

#: the ``format`` field of a signed head document
FORMAT = "privcal-signed-head-v1"


class SignedHead(BaseModel):
    """An audit head signed by the holder of an Ed25519 key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = FORMAT
    seq: int
    hash: str
    time: str
    key_id: str
    signature: str

    @property
    def head(self) -> str:
        """``SEQ:HASH``."""
        return f"{self.seq}:{self.hash}"


def _message(seq: int, entry_hash: str, time: str) -> bytes:
    return canonical({"format": FORMAT, "seq": seq, "hash": entry_hash,
                      "time": time}).encode("utf-8")


def _raw_public(pub: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _key_id(pub: Any) -> str:
    return hashlib.sha256(_raw_public(pub)).hexdigest()[:16]


def generate_keypair(private_path: str | os.PathLike[str],
                     public_path: str | os.PathLike[str] | None = None) -> tuple[Path, Path, str]:
    """Write a new Ed25519 key pair; returns (private path, public path, key id).

    The public key goes to ``public_path`` (default: the private path + ``.pub``).
    Refuses to overwrite an existing file.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    priv_p = Path(private_path)
    pub_p = Path(public_path) if public_path is not None else Path(f"{priv_p}.pub")
    for p in (priv_p, pub_p):
        if p.exists():
            raise InvalidInput(f"{p} already exists: refusing to overwrite a key")
        if not p.parent.is_dir():
            raise InvalidInput(f"directory {p.parent} does not exist")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    pub_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    made: list[Path] = []
    try:
        fd = os.open(priv_p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        made.append(priv_p)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        with open(pub_p, "xb") as fh:
            made.append(pub_p)
            fh.write(pub_pem)
    except OSError as exc:
        for p in made:  # a full disk left a private key and an empty .pub, which every retry
            p.unlink(missing_ok=True)  # refused to overwrite (red team 12): none is kept
        raise InvalidInput(f"cannot write the key pair: {exc}; no key was kept") from exc
    return priv_p, pub_p, _key_id(key.public_key())


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidInput(f"cannot read the {what} {path}: {exc.strerror or exc}") from exc


def load_private_key(path: str | os.PathLike[str]) -> Any:
    """An Ed25519 private key from a PEM file (InvalidInput if it is not one)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = _read(path, "private key")  # a missing file says so (InvalidInput is a ValueError)
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"{path} is not an unencrypted PEM private key") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidInput(f"{path} is not an Ed25519 private key")
    return key


def load_public_key(path: str | os.PathLike[str]) -> Any:
    """An Ed25519 public key from a PEM file (InvalidInput if it is not one)."""
    return public_key_from_pem(_read(path, "public key"), str(path))


def public_key_from_pem(pem: bytes, source: str = "the trusted key") -> Any:
    """An Ed25519 public key from its PEM text (SubjectPublicKeyInfo, as
    :func:`generate_keypair` writes it); InvalidInput naming ``source`` if it is not one."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"{source} is not a PEM public key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise InvalidInput(f"{source} is not an Ed25519 public key")
    return key


def sign_head(head: AuditHeadInfo, private_key: Any, *, time: datetime | None = None
              ) -> SignedHead:
    """Sign ``head`` (seq, hash) and the signing time with ``private_key`` (a key or a path)."""
    key = private_key if hasattr(private_key, "sign") else load_private_key(private_key)
    t = (time or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    sig = key.sign(_message(head.seq, head.entry_hash, t))
    return SignedHead(seq=head.seq, hash=head.entry_hash, time=t,
                      key_id=_key_id(key.public_key()),
                      signature=base64.b64encode(sig).decode("ascii"))


def sign_verified(verify: Callable[..., Any], private_key: Any, previous: Any = None
                  ) -> SignedHead:
    """The head a verification reports, signed: ``verify`` (a ``verify`` of the ledger or of
    the accountant) runs with ``previous`` — the last head signed with this key, which the
    log must contain — as its signed head, entries after it allowed; its AuditFailed means
    nothing is signed."""
    key = private_key if hasattr(private_key, "sign") else load_private_key(private_key)
    rep = verify(signed_head=previous, allow_unsigned_tail=True,
                 trusted_key=key.public_key() if previous is not None else None)
    seq, entry_hash = rep.head.split(":", 1)
    return sign_head(AuditHeadInfo(seq=int(seq), entry_hash=entry_hash), key)


def read_signed_head(path_or_doc: str | os.PathLike[str] | dict[str, Any] | SignedHead
                     ) -> SignedHead:
    """A signed head from a file, a parsed document, or as is (InvalidInput if malformed)."""
    if isinstance(path_or_doc, SignedHead):
        return path_or_doc
    if not isinstance(path_or_doc, dict | str | os.PathLike):
        raise InvalidInput(f"a signed head is a file, its document or a SignedHead, got "
                           f"{type(path_or_doc).__name__}")
    try:
        if isinstance(path_or_doc, dict):
            return SignedHead.model_validate(path_or_doc)
        return SignedHead.model_validate_json(_read(path_or_doc, "signed head"))
    except ValidationError as exc:
        what = "the document" if isinstance(path_or_doc, dict) else str(path_or_doc)
        raise InvalidInput(f"{what} is not a privcal signed head: "
                           f"{': '.join(filter(None, first_error(exc)[:2]))}") from exc


def verify_signed_head(signed: SignedHead, public_key: Any) -> None:
    """AuditFailed unless ``signed`` carries a valid signature by ``public_key`` (key or path)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if isinstance(public_key, str | os.PathLike):
        key = load_public_key(public_key)
    elif isinstance(public_key, Ed25519PublicKey):
        key = public_key
    else:  # a private key, another algorithm's, a number: the caller's mistake, one line
        raise InvalidInput(f"the trusted key must be an Ed25519 public key or its PEM file, "
                           f"got {type(public_key).__name__}")
    if signed.format != FORMAT:
        raise AuditFailed(f"signed head: unknown format {signed.format!r}")
    try:
        sig = base64.b64decode(signed.signature, validate=True)
        key.verify(sig, _message(signed.seq, signed.hash, signed.time))
    except (InvalidSignature, ValueError) as exc:
        raise AuditFailed(f"signed head {signed.head}: the signature does not verify with the "
                          "trusted key (head forged or altered, or signed by another key)"
                          ) from exc
