"""The hash-chained audit log: canonical payloads, hashing, and what each entry records.

Every dataset creation, charge and release appends one entry, committed in the
same transaction as the row it describes: the entry is canonicalised when the row
is written and appended as the transaction's last step. SQLite numbers and hashes
it there (write transactions are ``BEGIN IMMEDIATE``); PostgreSQL numbers it there
if the audit sequencer's lock is free, else commits it to ``audit_queue``, where the
next holder of that lock or the next reader of the chain numbers it
(:mod:`privcal.storage.audit_queue`). Either way
every number is assigned under one lock, so sequence numbers are gapless, follow
commit order per dataset, and the chain cannot fork.

How a third party re-verifies the log (all hashes SHA-256, hex-encoded in the DB):

1. ``payload`` is the UTF-8 bytes of RFC 8785 (JCS) canonical JSON of an object
   ``{"seq": N, "kind": K, "data": {...}}``. Every non-integer number is written
   as a decimal *string* (ε, δ, ρ, α, thresholds: ``"0.3"``, ``"1e-06"``), an
   infinite threshold as ``"Infinity"``; so no JSON float appears at all.
2. ``leaf_hash = SHA-256(0x00 || payload)`` — the RFC 9162 §2.1.1 leaf hash.
3. ``entry_hash = SHA-256(0x01 || prev_hash || leaf_hash)`` with ``prev_hash``
   the 32-byte ``entry_hash`` of entry N−1 and 32 zero bytes for N = 1 (0x01 is
   RFC 9162's interior-node prefix, so a chain link can never be confused with a leaf).
4. Entries are numbered 1, 2, 3, … with no gap; the payload's ``seq`` equals
   the row's. The head ``N:entry_hash`` commits to the whole history, so a
   head kept outside the database detects a truncated or rewritten log.

Each entry's ``data`` is a pure function of the row it describes
(:func:`dataset_doc`, :func:`charge_doc`, :func:`release_doc`), so verification
also recomputes it from the current row and detects an edited threshold or
amount, and checks that every row has exactly one entry.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import UTC, datetime
from decimal import Decimal
from json.encoder import encode_basestring as _encode_str  # type: ignore[attr-defined]
from typing import Any

import rfc8785

from privcal.storage.models import Charge, Dataset, ReleaseRow

__all__ = [
    "GENESIS",
    "canonical",
    "chain_hash",
    "charge_doc",
    "dataset_doc",
    "entry_payload",
    "entry_prefix",
    "fast_canonical",
    "jsonable",
    "leaf_hash",
    "release_doc",
    "threshold_str",
]

#: prev_hash of the first entry
GENESIS = "00" * 32


def dec(d: Decimal | None) -> str | None:
    """An exact decimal as a plain string ("0.3"); trailing zeros from NUMERIC scale dropped."""
    if d is None:
        return None
    if d == 0:
        return "0"
    s = format(d, "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s


def threshold_str(t: float) -> str:
    """A threshold as a decimal string: the float's shortest repr, or "Infinity"/"-Infinity"."""
    if math.isnan(t):
        raise ValueError("a threshold cannot be NaN")
    if math.isinf(t):
        return "Infinity" if t > 0 else "-Infinity"
    return repr(float(t))


def jsonable(obj: Any) -> Any:
    """Make ``obj`` canonicalisable: floats → decimal strings, Decimals → plain strings.

    Integers stay JSON integers (bools too); tuples become lists; keys become strings.
    """
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        return threshold_str(obj) if not math.isnan(obj) else "NaN"
    if isinstance(obj, Decimal):
        return dec(obj)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "model_dump"):
        return jsonable(obj.model_dump(mode="python"))
    if hasattr(obj, "tolist"):  # numpy scalars and arrays
        return jsonable(obj.tolist())
    raise TypeError(f"cannot record a {type(obj).__name__} in the audit log")


def canonical(obj: Any) -> str:
    """RFC 8785 canonical JSON of ``jsonable(obj)``, as text."""
    return rfc8785.dumps(jsonable(obj)).decode("utf-8")


#: integers JSON (and so RFC 8785) represents exactly: |n| ≤ 2⁵³ − 1
MAX_SAFE_INT = 2**53 - 1


def _plain(obj: Any) -> bool:
    """Whether ``json.dumps(sort_keys=True, ensure_ascii=False)`` writes RFC 8785 for ``obj``.

    True for dicts, lists, strings, bools, None and safe integers (no floats) whose
    strings encode to UTF-8 (no lone surrogates) and whose keys order the same by
    code point as by UTF-16 code unit (no character from U+D800 up). Then the two agree:
    RFC 8785 §3.2.2.2 escapes exactly ``"``, ``\\`` and the controls below U+0020
    (``\\b \\t \\n \\f \\r`` short, the rest ``\\u00hh`` in lower case), as
    :mod:`json` does with ``ensure_ascii=False``, and §3.2.3 sorts keys by UTF-16 code unit.
    """
    if obj is None or isinstance(obj, bool):
        return True
    if isinstance(obj, int):
        return -MAX_SAFE_INT <= obj <= MAX_SAFE_INT
    if isinstance(obj, str):
        if obj.isascii():
            return True
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str) or not (k.isascii() or max(map(ord, k)) < 0xD800):
                return False
            if not _plain(v):
                return False
        return True
    if isinstance(obj, list):
        return all(_plain(v) for v in obj)
    return False


def fast_canonical(obj: Any) -> str:
    """:func:`canonical`, written by :mod:`json` when that is byte-identical (see
    :func:`_plain`; ~10× faster than ``rfc8785``), else by ``rfc8785``. Used on the
    write path; ``audit verify`` re-checks every payload with ``rfc8785`` itself."""
    j = jsonable(obj)
    if _plain(j):
        return json.dumps(j, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return rfc8785.dumps(j).decode("utf-8")


def iso(dt: datetime) -> str:
    """A timestamp as ISO 8601 UTC with microseconds ("2026-01-01T00:00:00.000000Z").

    SQLite returns naive datetimes (stored as UTC); PostgreSQL returns aware ones.
    """
    if dt.tzinfo is UTC and dt.year >= 1000:  # a charge's own time (audit.now): its
        # isoformat ends "+00:00"; the same text as below without converting it (issue 11)
        return dt.isoformat(timespec="microseconds")[:-6] + "Z"
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC).replace(tzinfo=None)
    if dt.year >= 1000:  # the same text as strftime below, ~5× faster (the charge hot path)
        return dt.isoformat(timespec="microseconds") + "Z"
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now() -> datetime:
    """The current UTC time, truncated to microseconds (what both backends store)."""
    return datetime.now(UTC)


def leaf_hash(payload: str) -> bytes:
    """SHA-256(0x00 || payload) — RFC 9162 leaf hash."""
    return hashlib.sha256(b"\x00" + payload.encode("utf-8")).digest()


def chain_hash(prev_hash_hex: str, payload: str) -> str:
    """SHA-256(0x01 || prev_hash || leaf_hash(payload)), hex."""
    return hashlib.sha256(b"\x01" + bytes.fromhex(prev_hash_hex) + leaf_hash(payload)).hexdigest()


def entry_payload(seq: int, kind: str, data: dict[str, Any]) -> str:
    """The canonical payload text of entry ``seq``."""
    return canonical({"seq": seq, "kind": kind, "data": data})


def _flat_text(v: Any) -> str | None:
    """The RFC 8785 text of a JSON scalar that needs no float formatting: None, a bool, a
    safe integer, or a string that encodes to UTF-8; else None (see :func:`_plain`)."""
    t = type(v)
    if t is str:
        if not v.isascii():
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: rfc8785 refuses it
                return None
        return _encode_str(v)
    if v is None:
        return "null"
    if t is int:
        return str(v) if -MAX_SAFE_INT <= v <= MAX_SAFE_INT else None
    if t is bool:
        return "true" if v else "false"
    return None


def _flat_prefix(kind: str, data: dict[str, Any]) -> str | None:
    """:func:`entry_prefix` of a flat ``data`` (ASCII keys, scalar values: a charge's
    document) written directly, or None for any other document.

    RFC 8785 orders keys by UTF-16 code unit, which for ASCII keys is :func:`sorted`'s order;
    it writes ``null``/``true``/``false``, integers in decimal, and strings escaped as
    :func:`json.encoder.encode_basestring` escapes them (§3.2.2.2; see :func:`_plain`).
    """
    parts = []
    for k in sorted(data):
        if type(k) is not str or not k.isascii():
            return None
        text = _flat_text(data[k])
        if text is None:
            return None
        parts.append(f"{_encode_str(k)}:{text}")
    kind_text = _flat_text(kind)
    if kind_text is None or type(kind) is not str:
        return None
    return f'{{"data":{{{",".join(parts)}}},"kind":{kind_text},"seq":'


def entry_prefix(kind: str, data: dict[str, Any]) -> str:
    """The payload of an entry of ``kind`` recording ``data``, without its sequence number.

    RFC 8785 sorts keys (``data`` < ``kind`` < ``seq``), so a payload is this prefix
    followed by the decimal seq and ``}``: :func:`payload_at`. The writer canonicalises
    each entry once, before it takes the log's sequencer lock, and only the number is filled
    in under the lock. A flat document (a charge's) is written directly
    (:func:`_flat_prefix`, ~10× faster than :func:`fast_canonical`); ``audit verify``
    re-checks every payload with ``rfc8785``.
    """
    if type(data) is dict:
        flat = _flat_prefix(kind, data)
        if flat is not None:
            return flat
    text = fast_canonical({"seq": 0, "kind": kind, "data": data})
    if not text.endswith(',"seq":0}'):  # pragma: no cover - guaranteed by RFC 8785 key order
        raise AssertionError("canonical payload does not end with its seq")
    return text[:-2]


def payload_at(prefix: str, seq: int) -> str:
    """The payload of entry ``seq`` from its :func:`entry_prefix` (equal to
    :func:`entry_payload`)."""
    return f"{prefix}{seq}}}"


def dataset_doc(ds: Dataset) -> dict[str, Any]:
    """What the log records about a dataset: its name and budget policy (not its totals).

    ``renyi_orders`` (the (ε, δ) cap's grid, part of its filter rule) is recorded when the
    row has one; a row without it (pure and zCDP caps, and (ε, δ) datasets logged before the
    grid existed, which use the frozen ``MIGRATED_RENYI_ORDERS``) has no such key, so old
    entries still verify and an edited grid does not.
    """
    doc: dict[str, Any] = {
        "dataset_id": ds.id,
        "name": ds.name,
        "description": ds.description,
        "notion": ds.notion,
        "cap_epsilon": ds.cap_epsilon,
        "cap_rho": ds.cap_rho,
        "cap_delta": ds.cap_delta,
        "reporting_delta": ds.reporting_delta,
        "subject_epsilon": ds.subject_epsilon,
        "allow_nonprivate": bool(ds.allow_nonprivate),
        "created_at": iso(ds.created_at),
    }
    if ds.renyi_orders is not None:
        doc["renyi_orders"] = list(ds.renyi_orders)
    return jsonable(doc)


def charge_doc(c: Charge, dataset_name: str) -> dict[str, Any]:
    """What the log records about a charge (for a local-DP batch: counts, ε0 and a digest of the
    charged pseudonyms, never subject ids); the request digest of an idempotency key.

    ``request_digest`` and ``members_digest`` appear only when set, so entries written before
    migration 0005 still equal the doc of their row.
    """
    # jsonable(...) of the dict, written out for the hot path (issue 11): the values are
    # ints, strings, None and Decimals, which become plain decimal strings (dec)
    doc = {
        "charge_id": _scalar(c.id),
        "dataset_id": _scalar(c.dataset_id),
        "dataset": _scalar(dataset_name),
        "scope": _scalar(c.scope),
        "notion": _scalar(c.notion),
        "epsilon": _scalar(c.epsilon),
        "delta": _scalar(c.delta),
        "rho": _scalar(c.rho),
        "eps0": _scalar(c.eps0),
        "subjects_accepted": _scalar(c.subjects_accepted),
        "subjects_rejected": _scalar(c.subjects_rejected),
        "purpose": _scalar(c.purpose),
        "requester": _scalar(c.requester),
        "idempotency_key": _scalar(c.idempotency_key),
        "created_at": iso(c.created_at),
    }
    if c.request_digest is not None:
        doc["request_digest"] = _scalar(c.request_digest)
    if c.members_digest is not None:
        doc["members_digest"] = _scalar(c.members_digest)
    return doc


def _scalar(v: Any) -> Any:
    """:func:`jsonable` of one value, with the hot path's types first."""
    t = type(v)
    if v is None or t is str or t is int:
        return v
    if t is Decimal:
        return dec(v)
    return jsonable(v)


def release_doc(r: ReleaseRow, dataset_name: str) -> dict[str, Any]:
    """What the log records about a release: everything, so every guarantee can be recomputed."""
    return jsonable({
        "release_id": r.id,
        "dataset_id": r.dataset_id,
        "dataset": dataset_name,
        "method": r.method,
        "calibrator_version": r.calibrator_version,
        "distribution": r.distribution,
        "distribution_version": r.distribution_version,
        "params": r.params,
        "shape": r.shape,
        "threshold": r.threshold,
        "coverage": r.coverage,
        "privacy": r.privacy,
        "diagnostics": r.diagnostics,
        "requester": r.requester,
        "charge_id": r.charge_id,
        "charge_ids": r.charge_ids,
        "created_at": iso(r.created_at),
    })
