"""Pseudonymous subject ids and the digests that commit subject-level rows to the audit log.

**Pseudonyms** (issue 16 item 6). ``subject_spend``, ``subject_baseline`` and
``session_reports`` never hold a subject or agent id: they hold
``HMAC-SHA256(K, UTF-8(id))`` in hex, with ``K`` a 256-bit secret made once per
ledger (``ledger_secret``, created by migration 0005 at ``privcal db upgrade``, or on
first use of a ledger built without migrations). ``budget show --subject ID``
recomputes the pseudonym of ``ID`` and looks it up.

*Where the secret lives — decision.* In the ledger, in its own table. Every client of
a shared ledger must derive the same pseudonym for the same person, or per-subject
caps would silently stop binding (a subject charged under two pseudonyms gets two
budgets); a key file beside each client is one more secret to distribute, and losing
it would have that exact effect. What this protects: a dump or replica of the data
tables (``subject_spend``, ``session_reports``, ``subject_baseline``) without the
``ledger_secret`` table does not say who took part — not even by hashing guessed ids.
What it does not protect: whoever can read ``ledger_secret`` can test a guessed id
(one HMAC per guess); a full database dump is as sensitive as the ids. Keep
``ledger_secret`` out of exports (``pg_dump --exclude-table=ledger_secret``).
The secret's fingerprint :func:`key_id` (not the secret) is committed in every
subject batch's audit digest, so replacing the secret is detected by ``audit verify``.

**Digests** (issue 16 item 3). :func:`members_digest` commits, in a charge's audit
entry, to the sorted pseudonyms it charged (stored in ``charge_members``), from
which ``audit verify`` recomputes every per-subject spend; :func:`reports_digest`
commits a session batch's stored reports; :func:`keyed_state_digest` a session's state.

*The members and reports digests are salted* (red team 10). A plain hash of a one-subject
charge's members, or of a one-row batch's ``(pseudonym, round, value)``, is the same
wherever the same person reports (the pseudonym is the same in every session of a ledger):
an audit reader who never sees a pseudonym could still link one person's charges across
sessions and — comparing a shuffled session's one-row batch with another session whose
release shows that person's bit — read the shuffled bit. Each digest is now computed over
a fresh random salt that it carries (:data:`SALTED`, :func:`salted`), so no two entries'
digests are equal; ``audit verify`` recomputes it with that salt, and still accepts the
unsalted form on entries written before.

*The state digest is keyed* (red team 7, B-1). A session's state holds what is not public
until a round completes — ``round_ones``, the running count of 1-reports of the open round —
and everything else in it can be rebuilt from public numbers (the open entry's params, the
group size, the charge entries). A plain hash of it, in every ``session_batch`` entry, let
an audit reader try ``round_ones = 0..accepted`` and learn each batch's count of ones (a
one-report batch: a device's bit, unshuffled). So the entries commit to
HMAC-SHA256 under a key derived from the ledger secret, tagged :data:`STATE_KEYED`;
:func:`state_digest` (plain SHA-256, untagged) is the form written before, which
``audit verify`` still accepts on old entries (migration 0005's ``migration`` entry, written
when a ledger of schema ≤ 0004 is upgraded, keys and salts its digests since red team 10).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "BATCH_IDS_PG",
    "PSEUDONYM_BYTES",
    "SALTED",
    "STATE_KEYED",
    "hex_of",
    "key_id",
    "keyed_state_digest",
    "members_blob",
    "members_commitment",
    "members_digest",
    "members_digest_matches",
    "new_secret",
    "pseudonym",
    "pseudonym_bytes",
    "pseudonyms",
    "pseudonyms_raw",
    "reports_digest",
    "reports_digest_matches",
    "reports_digest_sorted",
    "spend_digest",
    "spend_digest_matches",
    "state_digest",
    "state_digest_matches",
    "subjects_digest",
    "subjects_digest_raw",
]

#: bytes of one pseudonym (the full HMAC-SHA256 output); stored as 64 hex characters
PSEUDONYM_BYTES = 32


def new_secret() -> str:
    """A fresh 256-bit ledger secret, hex."""
    return secrets.token_hex(32)


def key_id(key: bytes) -> str:
    """A public fingerprint of the secret (SHA-256 under a domain prefix): reveals nothing of it."""
    return hashlib.sha256(b"privcal subject key id\x00" + key).hexdigest()[:32]


def pseudonym(key: bytes, subject: Any) -> str:
    """HMAC-SHA256(key, UTF-8(str(subject))), hex: what the ledger stores for ``subject``."""
    return hmac.digest(key, str(subject).encode("utf-8", "surrogatepass"), "sha256").hex()


def _hmac_states(key: bytes) -> tuple[Any, Any]:
    """The inner and outer SHA-256 states of HMAC-SHA256 under ``key`` (RFC 2104 §2)."""
    k = hashlib.sha256(key).digest() if len(key) > 64 else key
    k = k.ljust(64, b"\x00")
    return (hashlib.sha256(bytes(b ^ 0x36 for b in k)),
            hashlib.sha256(bytes(b ^ 0x5C for b in k)))


def pseudonym_bytes(key: bytes, subjects: Iterable[str]) -> list[bytes]:
    """The raw 32-byte :func:`pseudonym` of each id.

    HMAC-SHA256 from precomputed inner/outer states (RFC 2104), equal to ``hmac.digest``
    (a test checks it) and ~1.6× faster for 10⁶ ids, which key setup would otherwise dominate.
    """
    inner, outer = _hmac_states(key)
    out = []
    for s in subjects:
        i = inner.copy()
        i.update(s.encode("utf-8", "surrogatepass"))
        o = outer.copy()
        o.update(i.digest())
        out.append(o.digest())
    return out


def pseudonyms_raw(key: bytes, subjects: Iterable[str]) -> np.ndarray:
    """:func:`pseudonym` of each id as 32-byte NumPy strings (``S32``: sorts ~5× faster than
    their hex form)."""
    return np.frombuffer(b"".join(pseudonym_bytes(key, subjects)), dtype="S32")


def hex_of(raw: np.ndarray) -> np.ndarray:
    """``S32`` pseudonyms as a NumPy array of 64-character hex strings (what the ledger stores)."""
    if raw.size == 0:
        return np.zeros(0, dtype="<U64")
    h = np.ascontiguousarray(raw).tobytes().hex()
    return np.asarray(h, dtype=f"<U{len(h)}").reshape(1).view("<U64")


def pseudonyms(key: bytes, subjects: Iterable[str]) -> np.ndarray:
    """:func:`pseudonym` of each id, as a NumPy array of 64-character hex strings."""
    return hex_of(pseudonyms_raw(key, subjects))


def members_blob(hex_pseudonyms: Iterable[str]) -> bytes:
    """The sorted pseudonyms of one charge, 32 raw bytes each (what ``charge_members`` stores)."""
    return b"".join(sorted(bytes.fromhex(h) for h in hex_pseudonyms))


#: what begins a salted digest (an unsalted one is 64 hex digits: never this)
SALTED = "s:"
#: hex digits of a salt (64 random bits) and of the SHA-256 kept after it: ``s:SALT:HASH``
#: fits the 64 characters of ``charges.members_digest`` (176 bits of SHA-256 stay)
_SALT_HEX, _SALTED_HASH_HEX = 16, 44


def _new_salt() -> str:
    return secrets.token_hex(_SALT_HEX // 2)


def salted(salt: str, h: Any) -> str:
    """The salted form of a digest whose SHA-256 object ``h`` began with the salt:
    ``s:SALT:`` and the first 44 hex digits of ``h``."""
    return f"{SALTED}{salt}:{h.hexdigest()[:_SALTED_HASH_HEX]}"


def _salt_of(digest: str) -> str | None:
    """The salt a salted digest carries, or None (unsalted, or not a well-formed one)."""
    parts = digest.split(":")
    if len(parts) != 3 or parts[0] + ":" != SALTED or len(parts[1]) != _SALT_HEX or \
            len(parts[2]) != _SALTED_HASH_HEX:
        return None
    return parts[1]


def _start(domain: bytes, salt: str | None) -> Any:
    """A SHA-256 over ``domain`` and, when given, the salt (the salted forms' prefix)."""
    h = hashlib.sha256(domain)
    if salt is not None:
        h.update(b"salt\x00" + salt.encode() + b"\x00")
    return h


def _matches(digest: str, make: Any) -> bool:
    """Whether ``digest`` (as an entry recorded it) is ``make(its salt)`` — or, unsalted
    (written before the salt), ``make(None)``; a malformed salted one never matches."""
    if not digest.startswith(SALTED):
        return bool(make(None) == digest)
    salt = _salt_of(digest)
    return salt is not None and make(salt) == digest


def members_digest(kid: str, blob: bytes, salt: str | None = None, *,
                   unsalted: bool = False) -> str:
    """Commitment to a charge's members under the secret's fingerprint ``kid``, salted
    (:data:`SALTED`; a fresh salt unless ``salt`` is given): no two charges' digests are
    equal, even of the same one subject (``unsalted``: the form written before)."""
    salt = None if unsalted else _new_salt() if salt is None else salt
    h = _start(b"privcal members\x00", salt)
    h.update(kid.encode() + b"\x00" + blob)
    return h.hexdigest() if salt is None else salted(salt, h)


def members_digest_matches(kid: str, blob: bytes, digest: str) -> bool:
    """Whether ``digest`` (as a charge recorded it) commits to ``blob``."""
    return _matches(digest, lambda salt: members_digest(kid, blob, salt,
                                                        unsalted=salt is None))


def members_commitment(kid: str, accepted: np.ndarray, *,
                       presorted: bool = False) -> tuple[bytes, str]:
    """(blob, members_digest) of the distinct pseudonyms a charge charged: the blob is what
    ``charge_members`` stores (sorted, 32 raw bytes each), the digest what its entry commits.
    ``accepted``: raw 32-byte pseudonyms (dtype ``S32``) or their hex."""
    if accepted.dtype.kind == "S":  # raw 32-byte pseudonyms
        raw = accepted if presorted else np.sort(accepted)
        blob = np.ascontiguousarray(raw).tobytes()
    else:  # hex; lowercase hex sorts as the bytes it encodes
        acc_hex = np.asarray(accepted, dtype="<U64")
        if not presorted:
            acc_hex = np.sort(acc_hex)
        blob = bytes.fromhex("".join(acc_hex.tolist()))
    return blob, members_digest(kid, blob)


def subjects_digest(key: bytes, subjects: Sequence[str]) -> str:
    """A *keyed* digest of an ordered list of subject ids (for idempotency; never a plain hash):
    HMAC-SHA256(key, concatenation of their pseudonyms)."""
    mac = hmac.new(key, b"privcal subject list\x00", "sha256")
    for s in subjects:
        mac.update(hmac.digest(key, s.encode("utf-8", "surrogatepass"), "sha256"))
    return mac.hexdigest()


def subjects_digest_raw(key: bytes, raw: np.ndarray) -> str:
    """:func:`subjects_digest` of ids whose raw pseudonyms (``S32``, in the ids' order) are
    already computed: the same HMAC over the same bytes, without an HMAC per id again."""
    mac = hmac.new(key, b"privcal subject list\x00", "sha256")
    mac.update(np.ascontiguousarray(raw, dtype="S32").tobytes())
    return mac.hexdigest()


def reports_digest(rows: Iterable[tuple[str, int, str]], salt: str | None = None, *,
                   unsalted: bool = False) -> str:
    """Digest of the sorted ``(pseudonym, round, value)`` rows of one session batch: salted
    (:data:`SALTED`; a fresh salt unless ``salt`` is given), or the plain SHA-256 written
    before the salt (``unsalted``: how entries written before it are checked)."""
    salt = None if unsalted else _new_salt() if salt is None else salt
    h = _start(b"privcal reports\x00", salt)
    for subj, rnd, val in sorted((str(a), int(b), str(c)) for a, b, c in rows):
        h.update(f"{subj}\t{rnd}\t{val}\n".encode())
    return h.hexdigest() if salt is None else salted(salt, h)


def reports_digest_matches(rows: Iterable[tuple[str, int, str]], digest: str) -> bool:
    """Whether ``digest`` (as an entry recorded it) commits to ``rows``."""
    rows = list(rows)
    return _matches(digest, lambda salt: reports_digest(rows, salt, unsalted=salt is None))


def hex_matrix(raw: np.ndarray) -> np.ndarray:
    """The lowercase hex of each ``S32`` pseudonym as one row of 64 ASCII bytes (``uint8``)."""
    return np.frombuffer(np.ascontiguousarray(raw, dtype="S32").tobytes().hex().encode("ascii"),
                         dtype=np.uint8).reshape(-1, 2 * PSEUDONYM_BYTES)


def fixed_lines(n: int, parts: Sequence[bytes | np.ndarray]) -> bytes:
    """``n`` lines of fixed-width fields, concatenated: each part is either constant bytes
    (the same in every line) or an ``(n, w)`` ``uint8`` matrix (row ``i`` goes to line
    ``i``). One NumPy fill per part instead of a Python string per line."""
    cols = [np.frombuffer(p, dtype=np.uint8) if isinstance(p, bytes) else p for p in parts]
    out = np.empty((n, sum(c.shape[-1] for c in cols)), dtype=np.uint8)
    at = 0
    for c in cols:
        w = c.shape[-1]
        out[:, at:at + w] = c
        at += w
    return out.tobytes()


#: PostgreSQL: a batch of pseudonyms passed as one text of newline-joined hex (psycopg
#: placeholder ``ids``; see :func:`fixed_lines`), split by the server into rows ``b.subject``
#: — to be probed one primary-key lookup per row (a LATERAL subquery with LIMIT 1)
BATCH_IDS_PG = "unnest(string_to_array(%(ids)s, chr(10))) AS b(subject)"


def _ascii_matrix(values: np.ndarray) -> np.ndarray | None:
    """``values`` as an ``(n, w)`` matrix of ASCII bytes if it is a fixed-width bytes array
    (dtype ``S``) whose every entry is exactly ``w`` bytes of ASCII, else None."""
    if values.dtype.kind != "S" or values.dtype.itemsize == 0:
        return None
    m = np.frombuffer(np.ascontiguousarray(values).tobytes(),
                      dtype=np.uint8).reshape(values.shape[0], values.dtype.itemsize)
    if values.shape[0] and (int(m.min()) == 0 or int(m.max()) > 0x7F):
        return None  # a shorter (NUL-padded) entry, or not ASCII
    return m


def reports_digest_sorted(raw_sorted: np.ndarray, round_: int,
                          values: np.ndarray | Sequence[str], salt: str | None = None) -> str:
    """:func:`reports_digest` of one batch's rows ``(hex(raw_sorted[i]), round_, values[i])``,
    hashed in one pass when it can be: bit for bit the same digest (a test checks it).

    ``raw_sorted``: the batch's raw pseudonyms (``S32``) in ascending order, all distinct —
    then the sort of :func:`reports_digest` is this order (lowercase hex sorts as the bytes it
    encodes, and distinct subjects never reach the round or the value), and its SHA-256 over
    the rows one after the other is the SHA-256 of their concatenation. Salted as
    :func:`reports_digest` is (a fresh salt unless ``salt`` is given). ``values``: the
    stored value strings — an ``S`` array of ASCII text (equal widths: one NumPy fill) or
    any strings (one join).
    Anything else (repeated or unsorted pseudonyms) is hashed by :func:`reports_digest`.
    """
    raw_sorted = np.asarray(raw_sorted)
    salt = _new_salt() if salt is None else salt
    if raw_sorted.dtype != np.dtype("S32") or raw_sorted.ndim != 1:
        raise TypeError("reports_digest_sorted takes a 1-D array of raw pseudonyms (S32)")
    n = int(raw_sorted.shape[0])
    vals = values if isinstance(values, np.ndarray) else None
    if n > 1 and not bool(np.all(raw_sorted[1:] > raw_sorted[:-1])):
        text = values.tolist() if isinstance(values, np.ndarray) else list(values)
        strs = [v.decode("ascii") if isinstance(v, bytes) else v for v in text]
        return reports_digest(zip(hex_of(raw_sorted).tolist(), [round_] * n, strs, strict=True),
                              salt)
    h = _start(b"privcal reports\x00", salt)
    mat = _ascii_matrix(vals) if vals is not None else None
    if mat is not None:
        h.update(fixed_lines(n, [hex_matrix(raw_sorted), f"\t{int(round_)}\t".encode(), mat,
                                 b"\n"]))
    else:
        text = values.tolist() if isinstance(values, np.ndarray) else list(values)
        mid = f"\t{int(round_)}\t"
        h.update("".join([s + mid + (v.decode("ascii") if isinstance(v, bytes) else str(v))
                          + "\n" for s, v in zip(hex_of(raw_sorted).tolist(), text,
                                                  strict=True)]).encode())
    return salted(salt, h)


def spend_digest(rows: Iterable[tuple[str, int]], salt: str | None = None, *,
                 unsalted: bool = False) -> str:
    """Digest of the sorted ``(pseudonym, units)`` rows of a per-subject baseline: salted as
    :func:`reports_digest` is (a one-subject dataset's would otherwise be the same wherever
    that person had spent as much), or the plain SHA-256 written before (``unsalted``)."""
    salt = None if unsalted else _new_salt() if salt is None else salt
    h = _start(b"privcal spends\x00", salt)
    for subj, units in sorted((str(a), int(b)) for a, b in rows):
        h.update(f"{subj}\t{units}\n".encode())
    return h.hexdigest() if salt is None else salted(salt, h)


def spend_digest_matches(rows: Iterable[tuple[str, int]], digest: str) -> bool:
    """Whether ``digest`` (as the ``migration`` entry recorded it) commits to ``rows``."""
    rows = list(rows)
    return _matches(digest, lambda salt: spend_digest(rows, salt, unsalted=salt is None))


def state_digest(state: Any) -> str:
    """SHA-256 of the RFC 8785 canonical JSON of a session's state document: the *old*,
    unkeyed form (64 hex digits). Not written by sessions any more — it can be inverted for
    the open round's count of ones (see the module docstring); kept for verifying entries
    written before the change."""
    from privcal.storage.audit import canonical

    return hashlib.sha256(canonical(state).encode()).hexdigest()


#: what begins a keyed state digest (an unkeyed one is 64 hex digits: never this)
STATE_KEYED = "k:"

#: domain of the key state digests are made under (derived from the ledger secret; a NUL
#: byte, which no subject id may hold, keeps the derived key from being any subject's
#: pseudonym)
_STATE_DOMAIN = b"privcal session state\x00"


def keyed_state_digest(key: bytes, state: Any) -> str:
    """The state commitment sessions write: :data:`STATE_KEYED` and
    HMAC-SHA256(HMAC-SHA256(key, domain), RFC 8785 of ``state``) in hex, ``key`` the ledger
    secret. Without the secret it cannot be recomputed for a guessed state, so it does not
    reveal the open round's count of ones; with it ``audit verify`` checks the row."""
    from privcal.storage.audit import canonical

    derived = hmac.digest(key, _STATE_DOMAIN, "sha256")
    return STATE_KEYED + hmac.new(derived, canonical(state).encode(), "sha256").hexdigest()


def state_digest_matches(key: bytes | None, state: Any, digest: str) -> bool:
    """Whether ``digest`` (as an entry recorded it) commits to ``state``: a tagged digest by
    :func:`keyed_state_digest` under ``key`` (None: the ledger has no secret — never a
    match), an untagged one by :func:`state_digest` (entries written before it was keyed)."""
    if digest.startswith(STATE_KEYED):
        # plain ==: a forged entry's digest may be any text (compare_digest refuses non-ASCII)
        return key is not None and keyed_state_digest(key, state) == digest
    return state_digest(state) == digest
