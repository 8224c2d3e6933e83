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
