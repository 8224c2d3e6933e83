"""Red team 6, service: the work of a federated plan a request may ask for, what a 503 tells
a client about the ledger, and unknown query parameters of writing routes."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx
import pytest

from tests.service.conftest import Live, open_ldp


def _head(lv: Live) -> Any:
    with lv.client("admin") as c:
        return c.get("/v1/audit/head").json()


def _refused(r: httpx.Response, *words: str) -> str:
    assert r.status_code == 422, r.text
    assert r.json()["type"] == "urn:privcal:problem:invalid-input"
    detail = str(r.json()["detail"])
    assert "\n" not in detail
    for w in words:
        assert w in detail, detail
    return detail


# ----------------------------------------------------------------- 1. planning work bound
@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_fed_plan_refuses_more_work_than_a_request_may_ask(live: Live) -> None:
    """agents=300 with n=1e8 planned for 30 s, 1000 unequal sizes for 53 s: now 422 at once,
    naming the limit and that the CLI has none; a request within the limits still plans."""
    with live.client("analyst") as c:
        t0 = time.monotonic()
        _refused(c.post("/v1/fed/plan", json={"agents": 300, "local_n": 10**8, "alpha": 0.5}),
                 "at most 100000", "CLI")
        _refused(c.post("/v1/fed/plan", json={"agents": 1001, "local_n": 100, "alpha": 0.5}),
                 "at most 1000 agents", "CLI")
        _refused(c.post("/v1/fed/plan", json={"local_n": list(range(1, 1001)), "alpha": 0.1}),
                 "unequal", "at most 100 agents", "CLI")
        _refused(c.post("/v1/fed/plan", json={"agents": 51, "local_n": 400, "alpha": 0.1,
                                               "epsilon": 1.0}), "FedCP²-QQ", "at most 50")
        _refused(c.post("/v1/fed/plan", json={"agents": 10, "local_n": 10_001, "alpha": 0.1,
                                               "epsilon": 1.0}), "FedCP²-QQ", "at most 10000")
        assert time.monotonic() - t0 < 10
        ok = c.post("/v1/fed/plan", json={"agents": 20, "local_n": 500, "alpha": 0.1})
        assert ok.status_code == 200, ok.text
        ok = c.post("/v1/fed/plan", json={"local_n": [50, 60, 70], "alpha": 0.2})
        assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_fed_session_open_refuses_more_planning_work(live: Live) -> None:
    """A federated session's open runs the same planner: the same limits, nothing opened."""
    head = _head(live)
    with live.client("analyst") as c:
        _refused(c.post("/v1/datasets/d/sessions", json={
            "method": "fedcp-qq", "alpha": 0.5, "agents": 300, "local_n": 10**8}),
            "at most 100000", "CLI")
        _refused(c.post("/v1/datasets/d/sessions", json={
            "method": "fedcp2-qq", "alpha": 0.2, "epsilon": 1.0, "agents": 5000,
            "local_n": 200}), "at most 50 agents")
    assert _head(live) == head


# ------------------------------------------------------------ 2. what a 503 tells a client
def test_ledger_unavailable_503_names_no_url_nor_driver_error(
        live: Live, caplog: pytest.LogCaptureFixture) -> None:
    """The ledger unreachable: every 503 says the ledger is unavailable, never its URL, file
    or the driver's message (even to an unauthenticated /readyz); the log has them."""
    from privcal.accountant import Accountant
    from privcal.storage import Ledger

    secret_url = "postgresql+psycopg://postgres:s3cretpw@127.0.0.1:1/no_such_ledger_db"
    down = Accountant(Ledger(secret_url))
    good = live.app.state.accountant
    live.app.state.accountant = down
    try:
        with caplog.at_level(logging.WARNING, logger="privcal.service"):
            answers = [httpx.get(live.url + "/readyz", timeout=60)]
            with live.client("analyst") as c:
                answers += [c.get("/v1/whoami"), c.get("/v1/datasets/d/budget"),
                            c.post("/v1/datasets/d/charges", json={"cost": {"rho": "0.1"}},
                                   headers={"Idempotency-Key": "z"})]
    finally:
        live.app.state.accountant = good
        down.ledger.close()
    for r in answers:
        assert r.status_code == 503, r.text
        assert r.json()["type"] == "urn:privcal:problem:ledger-unavailable"
        assert r.json()["title"] == "Ledger unavailable"
        assert "ledger" in r.json()["detail"]
        low = r.text.lower()
        for leak in ("postgresql", "psycopg", "s3cretpw", "127.0.0.1", "no_such_ledger_db",
                     "refused", "connection failed", "sqlite"):
            assert leak not in low, r.text
    assert "no_such_ledger_db" in caplog.text  # the operator sees the full message


# ------------------------------------------------------------- 3. unknown query parameters
@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_unknown_query_parameter_of_a_writing_route_is_refused(live: Live) -> None:
    """``?dry_run=true`` on a session open opened (and, shuffled, charged) a session: now
    422 naming it, nothing written; declared parameters (a calibration's dry_run) work."""
    head = _head(live)
    ldp = {"method": "ldp-score", "alpha": 0.2, "epsilon": 1.0, "rounds": 2, "group_size": 4}
    with live.client("analyst") as c:
        _refused(c.post("/v1/datasets/d/sessions?dry_run=true", json=ldp), "dry_run",
                 "unknown query parameter")
        _refused(c.post("/v1/datasets/d/charges?dry_run=1", json={"cost": {"rho": "0.1"}},
                        headers={"Idempotency-Key": "q"}), "dry_run")
        assert _head(live) == head
        assert c.get("/v1/datasets/d/budget").json()["charges"] == 0
        dry = c.post("/v1/datasets/d/calibrations?dry_run=true", json={
            "method": "split", "params": {"alpha": 0.1}, "scores": [0.1, 0.5, 0.9]})
        assert dry.status_code == 200, dry.text
        assert c.get("/v1/whoami?x=1").status_code == 200  # reads are unchanged
    with live.client("admin") as c:
        _refused(c.delete("/v1/tokens/0123456789abcdef?force=1"), "force")
    sid = open_ldp(live)
    dev = live.token("device", session=sid, subject="s1")
    with live.client(token=dev) as c:  # the lean report path leaves it to the route
        _refused(c.put(f"/v1/sessions/{sid}/reports/r1?dry_run=true",
                       json={"round": 0, "value": 1}), "dry_run")
        r = c.put(f"/v1/sessions/{sid}/reports/r1", json={"round": 0, "value": 1})
        assert r.status_code == 201, r.text
