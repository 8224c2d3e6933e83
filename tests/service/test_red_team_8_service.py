"""Red team 8, the service's URLs: each finding refused now, in one line, nothing written
(every table of the ledger compared before and after: ``ledger_snapshot``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from privcal.errors import NotFound
from tests.service.conftest import Live, ledger_snapshot, open_ldp

P = "urn:privcal:problem:"
SCORES = np.linspace(0, 1, 101).tolist()
PCOQS = {"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.1}, "scores": SCORES}


def _problem(r: Any, status: int, slug: str) -> str:
    """The one-line detail of a problem document answered ``status``."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["type"] == P + slug and body["status"] == status
    assert "\n" not in body["detail"] and len(body["detail"]) < 300, body["detail"]
    return str(body["detail"])


def test_a_query_parameter_given_twice_is_refused(live: Live) -> None:
    """``?dry_run=true&dry_run=false`` was a real calibration (FastAPI took the last value)
    while a reader of the first saw a dry run: 422 now, before anything runs, on every
    route; nothing charged, no release, the audit head where it was."""
    before = ledger_snapshot(live)
    head = str(live.accountant.ledger.head())
    with live.client("analyst") as c:
        for query in ("dry_run=true&dry_run=false", "dry_run=false&dry_run=true",
                      "dry_run=true&dry_run=true"):
            r = c.post(f"/v1/datasets/d/calibrations?{query}", json=PCOQS,
                       headers={"Idempotency-Key": "rt8-dup"})
            assert _problem(r, 422, "invalid-input") == (
                "query parameter dry_run given twice; nothing was done")
        r = c.post("/v1/datasets/d/calibrations?dry_run=true&dry_run=false&dry_run=true",
                   json=PCOQS, headers={"Idempotency-Key": "rt8-dup"})
        assert "dry_run given 3 times" in _problem(r, 422, "invalid-input")
        # a read too: the same guard, and as ambiguous to a log reader
        r = c.get("/v1/releases?limit=1&limit=1000")
        assert "limit given twice" in _problem(r, 422, "invalid-input")
    assert ledger_snapshot(live) == before
    assert str(live.accountant.ledger.head()) == head
    assert live.accountant.releases() == []
    with live.client("analyst") as c:  # the one spelling is still a dry run
        r = c.post("/v1/datasets/d/calibrations?dry_run=true", json=PCOQS)
        assert r.status_code == 200 and r.json()["allowed"] is True, r.text
    assert ledger_snapshot(live) == before


BIG_IDS = (2**31, 2**40, 2**63 - 1)


def test_ids_past_int32_are_not_found_in_the_library(live: Live) -> None:
    """The id columns are 32-bit on PostgreSQL, which answered a larger id with an error
    (a 500 through the service): NotFound on every backend now, before any query."""
    from privcal.accountant.sessions import release_of, session_status

    open_ldp(live)
    for big in BIG_IDS:
        with pytest.raises(NotFound, match=f"^unknown release {big}$"):
            live.accountant.release(big)
        with pytest.raises(NotFound, match=f"^unknown session {big}$"):
            session_status(live.accountant, big)
        with pytest.raises(NotFound, match=f"^unknown session {big}$"):
            release_of(live.accountant, str(big))
        assert live.accountant.ledger.session_reports(big) == {}


@pytest.mark.parametrize("role", ["admin", "analyst", "auditor"])
def test_ids_past_int32_are_404_on_the_routes(live: Live, role: str) -> None:
    with live.client(role) as c:
        for big in BIG_IDS:
            assert _problem(c.get(f"/v1/releases/{big}"), 404, "not-found") == (
                f"unknown release {big}")
            assert _problem(c.get(f"/v1/sessions/{big}"), 404, "not-found") == (
                f"unknown session {big}")


SPELLINGS = ("1.0", "+1", "%201", "1%20", "01", "1e0", "0x1", "١")


def test_path_ids_are_canonical(live: Live) -> None:
    """``/v1/sessions/01`` was session 1 (pydantic's lax int): a device's ``PUT
    /v1/sessions/01/reports/a`` stored and charged. Every spelling but the canonical one
    names nothing: 404 before any token or body work, on reads and writes."""
    sid = open_ldp(live)
    assert sid == 1
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/calibrations", json={
            "method": "split", "params": {"alpha": 0.1}, "scores": SCORES},
            headers={"Idempotency-Key": "rt8-rel"})
        assert r.status_code == 201 and r.json()["id"] == 1, r.text
    dev = live.token("device", session=sid, subject="s1")
    ing = live.token("ingestor", session=sid)
    before = ledger_snapshot(live)
    report = {"round": 0, "value": 1}
    for spelling in SPELLINGS:
        with live.client("analyst") as c:
            for path in (f"/v1/sessions/{spelling}", f"/v1/releases/{spelling}"):
                assert "unknown" in _problem(c.get(path), 404, "not-found")
            _problem(c.post(f"/v1/sessions/{spelling}/close", json={},
                            headers={"Idempotency-Key": "rt8-close"}), 404, "not-found")
        with live.client(token=dev) as c:
            _problem(c.get(f"/v1/sessions/{spelling}"), 404, "not-found")
            _problem(c.put(f"/v1/sessions/{spelling}/reports/a", json=report), 404, "not-found")
        with live.client(token=ing) as c:
            _problem(c.post(f"/v1/sessions/{spelling}/batches",
                            json={"reports": [{"subject": "s9", "value": 1, "round": 0}]},
                            headers={"Idempotency-Key": "rt8-batch"}), 404, "not-found")
    assert ledger_snapshot(live) == before
    # a device's token is still checked first (401 before the 404), as on every route
    with live.client(token=dev[:-4] + "AAAA") as c:
        assert c.put("/v1/sessions/01/reports/a", json=report).status_code == 401
    # the canonical spelling works
    with live.client(token=dev) as c:
        assert c.put(f"/v1/sessions/{sid}/reports/a", json=report).status_code == 201
    with live.client("analyst") as c:
        assert c.get("/v1/releases/1").status_code == 200


@pytest.mark.parametrize("method,suffix,body", [
    ("GET", "", None), ("GET", "/budget", None),
    ("POST", "/charges", {"cost": {"rho": "0.1"}, "purpose": "q"}),
    ("POST", "/sessions", {"method": "ldp-score", "alpha": 0.2, "epsilon": 1.0, "rounds": 2,
                           "group_size": 4}),
    ("POST", "/calibrations", PCOQS),
])
def test_a_long_dataset_name_is_not_echoed(live: Live, method: str, suffix: str,
                                           body: Any) -> None:
    """``GET /v1/datasets/<5000×x>`` answered a 5018-character detail: the name is cut to
    its first 60 characters now, with an ellipsis."""
    before = ledger_snapshot(live)
    with live.client("analyst") as c:
        r = c.request(method, f"/v1/datasets/{'x' * 5000}{suffix}", json=body,
                      headers={"Idempotency-Key": "rt8-long"})
        assert _problem(r, 404, "not-found") == f"unknown dataset '{'x' * 60}…'"
        # a short one is named whole
        r = c.request(method, f"/v1/datasets/other{suffix}", json=body,
                      headers={"Idempotency-Key": "rt8-short"})
        assert _problem(r, 404, "not-found") == "unknown dataset 'other'"
    assert ledger_snapshot(live) == before


def test_a_trailing_slash_is_404_not_a_redirect(live: Live) -> None:
    """``POST /v1/datasets/d/charges/`` answered 307, an empty body and a Location built
    from the Host header: a 404 problem document now; nothing charged."""
    before = ledger_snapshot(live)
    with live.client("analyst") as c:
        for method, path in (("POST", "/v1/datasets/d/charges/"), ("GET", "/v1/datasets/d/"),
                             ("GET", "/v1/releases/"), ("GET", "/v1/whoami/")):
            r = c.request(method, path, json={"cost": {"rho": "0.1"}, "purpose": "q"},
                          headers={"Idempotency-Key": "rt8-slash", "Host": "evil.example"})
            _problem(r, 404, "not-found")
            assert "location" not in r.headers
            # review R (F5): it says why, in one line
            assert r.json()["detail"] == (f"no route {path!r} (paths are not redirected: "
                                          "drop the trailing slash)")
    assert ledger_snapshot(live) == before
    with live.client() as c:  # the web view's documented address still leads to it
        r = c.get("/ui", headers={"Host": "evil.example"})
        assert r.status_code == 303 and r.headers["location"] == "/ui/"
