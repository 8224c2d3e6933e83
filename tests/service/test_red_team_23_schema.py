"""Red team 21 (left since): a running service whose ledger a newer privcal migrated under
it answered ``/readyz`` 503 "schema out of date" — and went on writing in the old way, its
schema check cached since its first request, until restarted. A failed check now ends the
process's trust in the schema: the next request checks again and is refused, nothing
written."""

from __future__ import annotations

import sqlite3

import httpx
import pytest

from tests.service.conftest import Live, ledger_snapshot

_SQLITE = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)


@_SQLITE
def test_after_readyz_finds_a_newer_schema_no_write_is_made(live: Live) -> None:
    auth = {"Authorization": f"Bearer {live.tokens['analyst']}"}
    charge = {"cost": {"rho": "0.001"}, "purpose": "before"}
    r = httpx.post(f"{live.url}/v1/datasets/d/charges", json=charge,
                   headers={**auth, "Idempotency-Key": "k1"}, timeout=60)
    assert r.status_code == 201, r.text
    path = live.ledger_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:  # what a newer privcal's `db upgrade` leaves
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    ready = httpx.get(f"{live.url}/readyz", timeout=60)
    assert ready.status_code == 503, ready.text
    before = ledger_snapshot(live)
    r = httpx.post(f"{live.url}/v1/datasets/d/charges", json={**charge, "purpose": "after"},
                   headers={**auth, "Idempotency-Key": "k2"}, timeout=60)
    assert r.status_code == 503, r.text
    assert r.json()["type"] == "urn:privcal:problem:schema-out-of-date"
    assert ledger_snapshot(live) == before
