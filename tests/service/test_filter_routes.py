"""The service side of issue 14: an (ε, δ) dataset's Rényi grid over HTTP, and budgets that
give the cap's guarantee with the realized spend labelled as such."""

from __future__ import annotations

import pytest

from tests.service.conftest import Live

ADAPTIVE = "not a guarantee under adaptive use"


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_grid_over_http_and_guarantee_in_budget_and_history(live: Live) -> None:
    with live.client("admin") as c:
        r = c.post("/v1/datasets", json={"name": "a", "approx_epsilon": "1",
                                         "approx_delta": "0.000001", "renyi_orders": ["4", "2"]})
        assert r.status_code == 201, r.text
        assert r.json()["renyi_orders"] == ["2", "4"]
        head = str(live.accountant.ledger.head())
        for bad in (["1"], ["x"], [], [2]):
            r = c.post("/v1/datasets", json={"name": "b", "approx_epsilon": "1",
                                             "approx_delta": "0.000001", "renyi_orders": bad})
            assert r.status_code == 422, r.text
            assert r.headers["content-type"] == "application/problem+json"
        r = c.post("/v1/datasets", json={"name": "b", "rho": "1", "renyi_orders": ["2"]})
        assert r.status_code == 422 and "only to an (ε, δ) budget" in r.text
        assert str(live.accountant.ledger.head()) == head  # nothing written
    with live.client("auditor") as c:
        b = c.get("/v1/datasets/d/budget").json()
        assert b["guarantee"]["delta"] == "0.000001" and ADAPTIVE in b["spent_dp"]["note"]
        h = c.get("/v1/datasets/a/spend-history").json()
        assert "however the requests adapt" in h["guarantee"]
