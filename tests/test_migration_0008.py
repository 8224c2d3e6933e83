"""Migration 0008: the service's idempotency fingerprints become keyed (red team, session 10).

Before it, ``idempotency_records.fingerprint`` held the SHA-256 of the request's canonical
body, and an ingestor's batch body holds subject ids and their reports: a reader of the
table could test "subject X reported v". The upgrade keys every stored digest in place, so
the row equals what the service now computes for the same request (a retry spanning the
upgrade replays) and no stored value equals an unkeyed digest of a guess.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

from sqlalchemy import text

from privcal.storage import Ledger
from privcal.storage.request_fingerprints import keyed_fingerprint, request_digest_hex


def _body(subject: str, value: int) -> dict[str, object]:
    return {"reports": [{"subject": subject, "value": value, "round": 0}]}


def _canonical(body: dict[str, object]) -> bytes:
    return json.dumps(body, sort_keys=True).encode()


def test_upgrade_keys_the_stored_digests_in_place(ledger_url: str) -> None:
    ledger = Ledger(ledger_url)
    ledger.upgrade("0007")
    old = hashlib.sha256(_canonical(_body("patient-42", 1))).hexdigest()  # what 0007 stored
    with ledger.engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO idempotency_records (principal, key, route, fingerprint, state, "
            "status_code, response, created_at) VALUES ('p1', 'k1', 'POST /x', :f, 'done', "
            "200, '{}', :t)"), {"f": old, "t": datetime.now(UTC)})
    assert ledger.upgrade() == ledger.head_revision()  # (0009 after it)
    with ledger.engine.connect() as conn:
        stored = conn.execute(text("SELECT fingerprint FROM idempotency_records")).scalar()
    key = ledger.subject_key()
    # the service's fingerprint of the same request: a retry replays
    assert stored == keyed_fingerprint(key, request_digest_hex(_canonical(_body("patient-42",
                                                                                 1))))
    # the dictionary attack of the red team finds nothing
    guesses = {hashlib.sha256(_canonical(_body(f"patient-{i}", v))).hexdigest()
               for i in range(100) for v in (0, 1)}
    assert old in guesses and stored not in guesses
    ledger.close()


def test_the_service_fingerprint_is_keyed_and_matches_the_migrated_form() -> None:
    from privcal.service.common import request_fingerprint

    body = _body("a", 0)
    k1, k2 = b"\x01" * 32, b"\x02" * 32
    fp = request_fingerprint(k1, body)
    assert fp == keyed_fingerprint(k1, hashlib.sha256(_canonical(body)).hexdigest())
    assert fp != request_fingerprint(k2, body) and fp != request_digest_hex(_canonical(body))


def test_a_downgrade_and_upgrade_keys_each_digest_once(ledger_url: str) -> None:
    """The downgrade leaves keyed values (one-way); upgrading again must not key them twice
    (a retry would then be refused as another request), only the digests written between."""
    ledger = Ledger(ledger_url)
    ledger.upgrade()
    key = ledger.subject_key()
    first = keyed_fingerprint(key, request_digest_hex(_canonical(_body("a", 1))))
    with ledger.engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO idempotency_records (principal, key, route, fingerprint, state, "
            "created_at) VALUES ('p1', 'k1', 'POST /x', :f, 'pending', :t)"),
            {"f": first, "t": datetime.now(UTC)})
    ledger.downgrade("0007")
    between = request_digest_hex(_canonical(_body("b", 0)))  # written by the older code
    with ledger.engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO idempotency_records (principal, key, route, fingerprint, state, "
            "created_at) VALUES ('p1', 'k2', 'POST /x', :f, 'pending', :t)"),
            {"f": between, "t": datetime.now(UTC)})
    assert ledger.upgrade() == ledger.head_revision()  # (0009 after it)
    with ledger.engine.connect() as conn:
        got = dict(conn.execute(text("SELECT key, fingerprint FROM idempotency_records")).all())
    assert got == {"k1": first, "k2": keyed_fingerprint(key, between)}
    assert all(len(v) == 64 for v in got.values())
    ledger.close()
