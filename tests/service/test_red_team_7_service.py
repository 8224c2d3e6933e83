"""Red team 7, the service: what a review of its routes found, each now refused or fixed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from privcal.storage.sessions import CollectionSession


def _sessions(lv: Any) -> int:
    with lv.accountant.ledger.read() as s:
        return int(s.scalar(select(func.count()).select_from(CollectionSession)))


def test_session_open_refuses_an_option_its_method_does_not_use(live: Any) -> None:
    body = {"method": "fedcp-qq", "alpha": 0.2, "agents": 3, "local_n": 50}
    with live.client("analyst") as c:
        for extra in ({"lower": 0.0}, {"upper": 5.0}, {"bins": 20}, {"rounds": 2}):
            r = c.post("/v1/datasets/d/sessions", json={**body, **extra})
            assert r.status_code == 422, r.text
            assert "fedcp-qq sessions take no --" in r.json()["detail"]
        assert _sessions(live) == 0
        r = c.post("/v1/datasets/d/sessions",
                   json={"method": "ldp-score", "alpha": 0.2, "epsilon": 1.0, "rounds": 2,
                         "group_size": 4, "bins": 20})
        assert r.status_code == 422 and "ldp-score sessions take no --bins" in r.json()["detail"]
        assert _sessions(live) == 0
        assert c.post("/v1/datasets/d/sessions", json=body).status_code == 201
    assert _sessions(live) == 1


def test_an_unused_option_added_on_a_retry_is_another_request(live: Any) -> None:
    """The open's fingerprint hashed the body with its defaults filled in, so a retry that
    added ``"bins": 100`` to an ldp-score open was replayed (200) instead of refused: the
    option slipped through unrefused. The body as sent is fingerprinted now."""
    body = {"method": "ldp-score", "alpha": 0.2, "epsilon": 1.0, "rounds": 2,
            "group_size": 4}
    with live.client("analyst") as c:
        first = c.post("/v1/datasets/d/sessions", json=body, headers={"Idempotency-Key": "o1"})
        assert first.status_code == 201, first.text
        again = c.post("/v1/datasets/d/sessions", json=body, headers={"Idempotency-Key": "o1"})
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
        r = c.post("/v1/datasets/d/sessions", json={**body, "bins": 100},
                   headers={"Idempotency-Key": "o1"})
        assert r.status_code == 409, r.text
    assert _sessions(live) == 1
