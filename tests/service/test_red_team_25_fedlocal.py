"""Red team 25, fedlocal F3: an ingestor batch row's value took a JSON ``Infinity``, ``NaN``
or an overflowing number (``1e400``, which Python's JSON parser reads as +inf) — a FedCP-QQ
session stored it as the message +∞ — where an agent's own message (``PUT …/messages``) is
422 for the same value. A batch value is now a finite number, as a message is: 422,
nothing written."""

from __future__ import annotations

import pytest

from tests.service.conftest import Live

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)


def _open_fedcp(live: Live) -> int:
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/sessions", json={"method": "fedcp-qq", "alpha": 0.2,
                                                    "agents": 3, "local_n": 20})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])


@pytest.mark.parametrize("text", ["1e400", "Infinity", "NaN", "-1e400"])
def test_an_ingestor_batch_value_must_be_finite(live: Live, text: str) -> None:
    sid = _open_fedcp(live)
    ing = live.token("ingestor", session=sid)
    agent = live.token("agent", session=sid, agent="a1")
    body = ('{"reports": [{"subject": "a0", "value": ' + text
            + '}, {"subject": "a2", "value": 0.5}]}')
    with live.client(token=ing) as c:
        r = c.post(f"/v1/sessions/{sid}/batches", content=body,
                   headers={"Content-Type": "application/json", "Idempotency-Key": "k1"})
    with live.client(token=agent) as c:
        m = c.put(f"/v1/sessions/{sid}/messages", content='{"value": ' + text + '}',
                  headers={"Content-Type": "application/json"})
    assert m.status_code == 422, m.text  # an agent's own message: refused
    assert r.status_code == 422, r.text  # the same value in a batch: refused too, not +inf
    with live.client("analyst") as c:
        assert c.get(f"/v1/sessions/{sid}").json()["total_reports"] == 0


def test_a_finite_batch_value_is_still_taken(live: Live) -> None:
    sid = _open_fedcp(live)
    ing = live.token("ingestor", session=sid)
    with live.client(token=ing) as c:
        r = c.post(f"/v1/sessions/{sid}/batches", json={"reports": [
            {"subject": "a0", "value": 1e300}, {"subject": "a2", "value": 0.5}]},
            headers={"Idempotency-Key": "k1"})
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 2
