"""Red team 7, collection sessions over HTTP, on SQLite and PostgreSQL.

B-1: an auditor reading ``GET /v1/audit/entries`` learned each batch's count of 1-reports
of a shuffled ldp-score session from the entries' unkeyed state digests (a one-report batch
from the shuffler: that device's bit). E-3: a session closed by another analyst was
recorded as the opener's act.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import select

from privcal.storage import pseudonyms
from privcal.storage.audit import canonical
from privcal.storage.sessions import CollectionSession
from tests.service.conftest import Live, answer_fed, open_fed

BITS = [1, 0, 0, 1, 1, 0]


def _session_entries(lv: Live, kind: str, sid: int) -> list[dict[str, Any]]:
    with lv.client("auditor") as c:
        r = c.get("/v1/audit/entries", params={"limit": 1000})
        assert r.status_code == 200, r.text
    docs = [json.loads(e["payload"]) for e in r.json()]
    return [d["data"] for d in docs if d["kind"] == kind and d["data"].get("session_id") == sid]


def _verified(lv: Live) -> None:
    with lv.client("auditor") as c:
        r = c.post("/v1/audit/verify", json={})
        assert r.status_code == 200 and r.json()["ok"] is True, r.text


def test_auditor_cannot_read_a_forwarded_report_bit_off_the_log(live: Live) -> None:
    live.accountant.create_dataset("s", approx_epsilon=5, approx_delta=1e-6, subject_epsilon=10)
    with live.client(token=live.token("analyst", name="sam", datasets=["s"])) as c:
        r = c.post("/v1/datasets/s/sessions", json={
            "method": "ldp-score", "alpha": 0.1, "epsilon": 2.0, "rounds": 2,
            "group_size": 2000, "shuffled": True}, headers={"Idempotency-Key": "open-s"})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
    # the shuffler forwards reports as they come: at low load, one per batch
    with live.client(token=live.token("ingestor", session=sid)) as c:
        for i, b in enumerate(BITS):
            r = c.post(f"/v1/sessions/{sid}/batches", json={"reports": [
                {"subject": f"dev-{i}", "value": b, "round": 0}]},
                headers={"Idempotency-Key": f"b{i}"})
            assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
    batches = _session_entries(live, "session_batch", sid)
    assert [b["accepted"] for b in batches] == [1] * len(BITS)
    # everything in the state but the open round's count of ones, granted to the attacker
    with live.accountant.ledger.read() as s:
        final = dict(s.scalars(select(CollectionSession).where(
            CollectionSession.id == sid)).one().state)
    key = live.accountant.ledger.subject_key()
    ones = 0
    for i, (entry, bit) in enumerate(zip(batches, BITS, strict=True)):
        def guess(g: int, i: int = i, ones: int = ones) -> dict[str, Any]:
            return {**final, "total": i + 1, "round_count": i + 1, "round_ones": ones + g,
                    "charge_ids": final["charge_ids"][:i + 1]}

        for g in (0, 1):
            plain = hashlib.sha256(canonical(guess(g)).encode()).hexdigest()
            assert entry["state_digest"] not in (plain, "k:" + plain)
        # control: the guesses are the true states — with the ledger secret the bit matches
        assert pseudonyms.keyed_state_digest(key, guess(bit)) == entry["state_digest"]
        ones += bit
    _verified(live)


def test_close_by_another_analyst_is_recorded_as_hers(live: Live) -> None:
    sid = open_fed(live, agents=3)  # opened by ann
    answer_fed(live, sid)
    carol = live.token("analyst", name="carol", datasets=["d"])
    with live.client(token=carol) as c:
        r = c.post(f"/v1/sessions/{sid}/close", json={"allow_missing": True},
                   headers={"Idempotency-Key": "c1"})
        assert r.status_code == 200, r.text
        rid = r.json()["release_id"]
        assert r.json()["requester"] == "analyst:ann"  # the session's opener, unchanged
    with live.client("auditor") as c:
        rel = c.get(f"/v1/releases/{rid}").json()
    assert rel["requester"] == "analyst:carol"
    assert rel["diagnostics"]["opened_by"] == "analyst:ann"
    assert _session_entries(live, "session_close", sid)[0]["closed_by"] == "analyst:carol"
    _verified(live)
