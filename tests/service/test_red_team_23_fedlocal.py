"""Red team 23, fedlocal F2 over HTTP: ``POST /v1/fed/plan`` with the FedCP²-QQ grid
(``bins``, ``lower``, ``upper``) but no ``epsilon`` answered FedCP-QQ's plan (200); it is a
one-line 422 now, and nothing is written."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.conftest import Live

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)


@pytest.mark.parametrize("grid", [{"bins": 50}, {"lower": -1.0}, {"upper": 7.0}])
def test_a_grid_without_epsilon_is_a_one_line_422(live: Live, grid: dict[str, Any]) -> None:
    head = live.accountant.ledger.head()
    with live.client("analyst") as c:
        r = c.post("/v1/fed/plan", json={"agents": 5, "local_n": 200, "alpha": 0.1, **grid})
        assert r.status_code == 422, r.text
        assert "needs an epsilon" in r.json()["detail"] and "\n" not in r.json()["detail"]
        ok = c.post("/v1/fed/plan", json={"agents": 5, "local_n": 200, "alpha": 0.1,
                                          "epsilon": 10.0, **grid})
        assert ok.status_code == 200 and ok.json()["method"] == "fedcp2-qq"
        plain = c.post("/v1/fed/plan", json={"agents": 5, "local_n": 200, "alpha": 0.1})
        assert plain.status_code == 200 and plain.json()["method"] == "fedcp-qq"
    assert live.accountant.ledger.head() == head
