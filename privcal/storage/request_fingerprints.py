"""The fingerprint an idempotency record stores of its request (``idempotency_records``).

A request's fingerprint covers its body, and an ingestor's batch body holds subject ids and
their reports: an unkeyed hash of it would let whoever reads the table test a guess
"subject X reported v", which the pseudonyms (:mod:`privcal.storage.pseudonyms`) exist to
prevent. So the record stores HMAC-SHA256, under a key derived from the ledger's subject
key (:meth:`~privcal.storage.Ledger.subject_key`: the same secret guards both; the derived
key keeps these digests unrelated to the pseudonyms), of the SHA-256 hex digest the records
stored before they were keyed — so migration 0008 converts those rows in place, and a retry
that spans the upgrade still replays.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["KEYED", "keyed_fingerprint", "request_digest_hex"]

#: domain of the key fingerprints are made under (derived from the subject key)
_DOMAIN = b"privcal idempotency fingerprint\x00"


def request_digest_hex(canonical: bytes) -> str:
    """SHA-256 (hex) of a request's canonical bytes: what the records stored unkeyed."""
    return hashlib.sha256(canonical).hexdigest()


#: what begins every keyed fingerprint (an unkeyed digest is 64 hex digits: never this), so
#: migration 0008 keys each stored digest once, however often it runs
KEYED = "k:"


def keyed_fingerprint(subject_key: bytes, digest_hex: str) -> str:
    """The stored fingerprint of a request whose :func:`request_digest_hex` is
    ``digest_hex``, under the ledger's ``subject_key``: :data:`KEYED` and 62 hex digits
    (248 bits of the HMAC; the column holds 64 characters)."""
    key = hmac.digest(subject_key, _DOMAIN, "sha256")
    return KEYED + hmac.new(key, digest_hex.encode("ascii"), "sha256").hexdigest()[:62]
