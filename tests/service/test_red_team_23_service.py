"""Red team 23, service: findings against a running ``privcal serve`` (tests/service/conftest)."""

from __future__ import annotations

from tests.service.conftest import Live, ledger_snapshot


def test_f1_amplify_past_the_services_bound_is_a_422_that_computes_nothing(live: Live) -> None:
    """n = 10⁹ (the library's bound) took 12–15 s of the server's CPU per request: the
    service takes n ≤ 10⁸, a shuffled session's largest group, and names the limit."""
    limit = 10**8  # privcal.service.routes_plans.AMPLIFY_MAX_N
    body = {"epsilon0": 0.1, "delta": 1e-300, "randomizer": "generic"}  # cheap at any n
    with live.client("analyst") as c:
        before = ledger_snapshot(live)
        r = c.post("/v1/amplify", json={**body, "n": limit + 1})
        assert r.status_code == 422, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert "100,000,000" in r.json()["detail"] and "privcal amplify" in r.json()["detail"]
        assert ledger_snapshot(live) == before
        ok = c.post("/v1/amplify", json={**body, "n": limit})
        assert ok.status_code == 200, ok.text
        assert ok.json()["n"] == limit
