"""Red team 13 (r13 mutsvc, a mutation audit of the service's authorization and the session
protocol): no attack succeeded on the real code, but mutants that dropped or widened an
authorization check passed the whole suite. Each test here fails under such a mutant and
passes on main, on SQLite and PostgreSQL.

- The role matrix (test_role_matrix.py) reads each route's roles from the route itself
  (``x-privcal-roles``), so it proves that a route enforces what it declares, not that it
  declares what SERVICE.md allows: widening an ``allow(…)`` (a device posting ingestor
  batches naming any subject, an auditor closing sessions or minting tokens, an analyst
  reading every dataset's subject summary) passed. The declared roles are pinned here.
- The object-level checks (an analyst's dataset grants on sessions and releases, a bound
  token's session on the agent and ingestor routes, the route's public-part filter for an
  ingestor) were each tested at one call site only.
"""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("fastapi", reason="the server extra is part of the test extra")
from fastapi.routing import APIRoute

from tests.service.conftest import Live, open_fed, open_ldp

A, AN, AU, D, AG, ING = "admin", "analyst", "auditor", "device", "agent", "ingestor"
ALL = {A, AN, AU, D, AG, ING}
ANYONE = {"public"}

#: SERVICE.md "Routes" (+ "admin: read everything an auditor reads")
EXPECTED: dict[tuple[str, str], set[str]] = {
    ("GET", "/healthz"): ANYONE, ("GET", "/readyz"): ANYONE,
    ("GET", "/v1/whoami"): ALL, ("GET", "/v1/methods"): ALL,
    ("POST", "/v1/tokens"): {A}, ("GET", "/v1/tokens"): {A},
    ("DELETE", "/v1/tokens/{token_id}"): {A},
    ("POST", "/v1/datasets"): {A},
    ("GET", "/v1/datasets"): {A, AU, AN}, ("GET", "/v1/datasets/{name}"): {A, AU, AN},
    ("GET", "/v1/datasets/{name}/budget"): {A, AU, AN},
    ("GET", "/v1/datasets/{name}/subjects"): {A, AU},
    ("GET", "/v1/datasets/{name}/spend-history"): {A, AU},
    ("POST", "/v1/datasets/{name}/charges"): {AN},
    ("POST", "/v1/datasets/{name}/calibrations"): {AN},
    ("POST", "/v1/datasets/{name}/sessions"): {AN},
    ("GET", "/v1/sessions/{sid}"): {AN, AU, A, D, AG, ING},
    ("PUT", "/v1/sessions/{sid}/reports/{report_id}"): {D},
    ("PUT", "/v1/sessions/{sid}/messages"): {AG},
    ("POST", "/v1/sessions/{sid}/batches"): {ING},
    ("POST", "/v1/sessions/{sid}/close"): {AN},
    ("POST", "/v1/advise"): {AN}, ("POST", "/v1/amplify"): {AN}, ("POST", "/v1/fed/plan"): {AN},
    ("GET", "/v1/releases"): {A, AU, AN}, ("GET", "/v1/releases/{release_id}"): {A, AU, AN},
    ("GET", "/v1/audit/head"): {A, AU}, ("GET", "/v1/audit/entries"): {A, AU},
    ("POST", "/v1/audit/verify"): {A, AU},
}


def test_declared_roles_are_service_md_roles() -> None:
    from privcal.accountant import Accountant
    from privcal.service.app import create_app
    from privcal.storage import Ledger

    led = Ledger("sqlite://")
    led.upgrade()
    app = create_app(accountant=Accountant(led))
    seen = set()
    for route in app.routes:
        if not isinstance(route, APIRoute) or route.path.startswith("/ui"):
            continue
        roles = set((route.openapi_extra or {}).get("x-privcal-roles", ()))
        for method in route.methods:
            key = (method, route.path)
            assert key in EXPECTED, f"{key}: add it to SERVICE.md and to this table"
            assert roles == EXPECTED[key], (key, sorted(roles), sorted(EXPECTED[key]))
            seen.add(key)
    assert seen == set(EXPECTED)


PUBLIC = {"id", "method", "status", "shuffled", "params", "round", "rounds", "query",
          "interval", "plan", "grid"}


def _k() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def test_bound_tokens_get_only_the_public_part_through_the_route_too(live: Live) -> None:
    """Mutant RS11 (ingestor added to nothing: the route's public-part filter skipped for an
    ingestor) survived: the lean read answers a bound token's plain GET, so the route's own
    filter is reached only by a GET the lean path declines (a query string)."""
    sid, fid = open_ldp(live), open_fed(live)
    toks = {"device": (live.token("device", session=sid, subject="u1"), sid),
            "ingestor": (live.token("ingestor", session=sid), sid),
            "agent": (live.token("agent", session=fid, agent="a1"), fid)}
    for role, (tok, s) in toks.items():
        with live.client(token=tok) as c:
            for path in (f"/v1/sessions/{s}", f"/v1/sessions/{s}?x=1"):
                r = c.get(path)
                assert r.status_code == 200, (role, path, r.text)
                assert set(r.json()) <= PUBLIC, (role, path, set(r.json()) - PUBLIC)


def test_an_analyst_can_neither_read_nor_close_a_session_of_an_ungranted_dataset(
        live: Live) -> None:
    """Mutant RS2 (``_visible``'s analyst dataset check dropped) survived: no test has an
    analyst of another dataset read or close a session. Under it, the analyst granted only
    ``other`` reads the whole state of a session on ``d`` and abandons it (its charges kept,
    no release)."""
    sid = open_ldp(live)
    stranger = live.token("analyst", name="eve", datasets=["other"])
    with live.client(token=stranger) as c:
        r = c.get(f"/v1/sessions/{sid}")
        assert r.status_code == 404, r.text
        r = c.post(f"/v1/sessions/{sid}/close", json={"abandon": True}, headers=_k())
        assert r.status_code == 404, r.text
    with live.client("analyst") as c:
        assert c.get(f"/v1/sessions/{sid}").json()["status"] == "open"


def test_an_agent_or_ingestor_token_puts_nothing_into_another_session(live: Live) -> None:
    """Mutants RS4 (``message_put``'s ``p.check_session``) and RS5 (``batch_post``'s) survived:
    no test sends an agent message or an ingestor batch to a session its token is not bound
    to. Under RS4 agent a1 of session A answers in federated session B (charged there, counted
    towards B's m); under RS5 the ingestor of one session posts reports, naming any subjects,
    into another — charging those subjects on that session's dataset."""
    fa, fb = open_fed(live), open_fed(live)
    la, lb = open_ldp(live), open_ldp(live)
    agent = live.token("agent", session=fa, agent="a1")
    ingestor = live.token("ingestor", session=la)
    head = live.accountant.ledger.head()
    with live.client(token=agent) as c:
        r = c.put(f"/v1/sessions/{fb}/messages", json={"value": 0.0})
        assert r.status_code == 404, r.text
    with live.client(token=ingestor) as c:
        r = c.post(f"/v1/sessions/{lb}/batches", headers=_k(), json={"reports": [
            {"subject": "victim", "value": 1, "round": 0}]})
        assert r.status_code == 404, r.text
    assert live.accountant.ledger.head() == head  # nothing written, nobody charged
    with live.client("analyst") as c:
        assert c.get(f"/v1/sessions/{fb}").json()["total_reports"] == 0
        assert c.get(f"/v1/sessions/{lb}").json()["total_reports"] == 0


def test_an_analyst_lists_and_reads_only_releases_of_its_datasets(live: Live) -> None:
    """Mutant RA1 (``GET /v1/releases`` not filtered by the analyst's grants) survived: no
    test lists releases as an analyst while another dataset has one. Under it the analyst of
    ``d`` reads every release of ``o2``: thresholds, parameters, requesters."""
    live.accountant.create_dataset("o2", rho="1", allow_nonprivate=True)
    other = live.token("analyst", name="olga", datasets=["o2"])
    with live.client(token=other) as c:
        r = c.post("/v1/datasets/o2/calibrations", headers=_k(), json={
            "method": "split", "params": {"alpha": 0.2},
            "scores": [i / 49 for i in range(50)]})
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
    with live.client("analyst") as c:
        listed = c.get("/v1/releases")
        assert listed.status_code == 200
        assert all(x["dataset"] == "d" for x in listed.json()), listed.json()
        assert c.get(f"/v1/releases/{rid}").status_code == 404
        assert c.get("/v1/releases?dataset=o2").status_code == 404
