"""Every route × {no token, expired, revoked, each role}: 2xx for the roles a route
declares, 401 without a valid token, 403 for any other role (UI pages: a redirect to the
login form instead of 401). The matrix is built from ``app.routes``: a route that declares
no roles, or that this file has no request recipe for, fails the test."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from fastapi.routing import APIRoute

from tests.service.conftest import Live, open_fed, open_ldp

ROLES = ("admin", "analyst", "auditor", "device", "agent", "ingestor")
BAD = ("none", "expired", "revoked")
#: non-API routes FastAPI adds itself; public on purpose
PUBLIC_BUILTIN = {("GET", "/openapi.json"), ("HEAD", "/openapi.json")}


def _key() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def _setup(lv: Live) -> dict[str, Any]:
    from privcal.accountant.sessions import open_session
    from privcal.storage.tokens import ApiToken

    sid = open_ldp(lv, group_size=50)
    fid = open_fed(lv)
    with lv.client("analyst") as c:
        r = c.post("/v1/datasets/d/calibrations", headers=_key(), json={
            "method": "split", "params": {"alpha": 0.2},
            "scores": np.linspace(0, 1, 50).tolist()})
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
    toks = dict(lv.tokens)
    toks["device"] = lv.token("device", session=sid, subject="dev-1")
    toks["agent"] = lv.token("agent", session=fid, agent="ag-1")
    toks["ingestor"] = lv.token("ingestor", session=sid)
    toks["expired"] = lv.token("auditor", expires_in=timedelta(days=1))
    toks["revoked"] = lv.token("admin")
    led = lv.accountant.ledger
    exp_id = toks["expired"].split("_")[1]

    def age(s: Any) -> None:
        row = s.get(ApiToken, exp_id)
        row.expires_at = row.created_at - timedelta(seconds=1)

    led.write(age)
    with lv.client("admin") as c:
        assert c.delete(f"/v1/tokens/{toks['revoked'].split('_')[1]}").status_code == 200

    def fresh_session() -> int:
        return open_session(lv.accountant, "ldp-score", dataset="d", alpha=0.2, epsilon=1.0,
                            rounds=2, group_size=5, requester="analyst:ann").id

    return {"sid": sid, "fid": fid, "rid": rid, "toks": toks, "fresh_session": fresh_session}


def _recipe(lv: Live, ctx: dict[str, Any], method: str, path: str,
            role: str) -> tuple[str, dict[str, Any]]:
    """(url, httpx request kwargs) of a valid request to this route for ``role``."""
    sid = ctx["fid"] if role == "agent" else ctx["sid"]
    k = _key()
    table: dict[tuple[str, str], Any] = {
        ("GET", "/healthz"): lambda: ("/healthz", {}),
        ("GET", "/readyz"): lambda: ("/readyz", {}),
        ("GET", "/v1/whoami"): lambda: ("/v1/whoami", {}),
        ("GET", "/v1/methods"): lambda: ("/v1/methods", {}),
        ("POST", "/v1/tokens"): lambda: ("/v1/tokens", {"json": {"role": "auditor"}}),
        ("GET", "/v1/tokens"): lambda: ("/v1/tokens", {}),
        ("DELETE", "/v1/tokens/{token_id}"): lambda: (
            f"/v1/tokens/{lv.token('auditor').split('_')[1]}", {}),
        ("POST", "/v1/datasets"): lambda: ("/v1/datasets", {
            "json": {"name": f"n-{uuid.uuid4().hex[:8]}", "epsilon": "1"}}),
        ("GET", "/v1/datasets"): lambda: ("/v1/datasets", {}),
        ("GET", "/v1/datasets/{name}"): lambda: ("/v1/datasets/d", {}),
        ("GET", "/v1/datasets/{name}/budget"): lambda: ("/v1/datasets/d/budget", {}),
        ("GET", "/v1/datasets/{name}/subjects"): lambda: ("/v1/datasets/d/subjects", {}),
        ("GET", "/v1/datasets/{name}/spend-history"): lambda: (
            "/v1/datasets/d/spend-history", {}),
        ("POST", "/v1/datasets/{name}/charges"): lambda: ("/v1/datasets/d/charges", {
            "headers": k, "json": {"cost": {"rho": "0.001"}, "purpose": "matrix"}}),
        ("POST", "/v1/datasets/{name}/calibrations"): lambda: (
            "/v1/datasets/d/calibrations", {"headers": k, "json": {
                "method": "split", "params": {"alpha": 0.2},
                "scores": np.linspace(0, 1, 20).tolist()}}),
        ("POST", "/v1/datasets/{name}/sessions"): lambda: ("/v1/datasets/d/sessions", {
            "json": {"method": "ldp-score", "alpha": 0.2, "epsilon": 1.0, "rounds": 2,
                     "group_size": 5}}),
        ("GET", "/v1/sessions/{sid}"): lambda: (f"/v1/sessions/{sid}", {}),
        ("PUT", "/v1/sessions/{sid}/reports/{report_id}"): lambda: (
            f"/v1/sessions/{sid}/reports/r-1", {"json": {"round": 0, "value": 1}}),
        ("PUT", "/v1/sessions/{sid}/messages"): lambda: (
            f"/v1/sessions/{sid}/messages", {"json": {"value": 0.0}}),
        ("POST", "/v1/sessions/{sid}/batches"): lambda: (
            f"/v1/sessions/{sid}/batches", {"headers": k, "json": {"reports": [
                {"subject": f"ing-{uuid.uuid4().hex[:6]}", "value": 1, "round": 0}]}}),
        ("POST", "/v1/sessions/{sid}/close"): lambda: (
            f"/v1/sessions/{ctx['fresh_session']()}/close",
            {"headers": k, "json": {"abandon": True}}),
        ("POST", "/v1/advise"): lambda: ("/v1/advise", {"json": {
            "n": 1000, "k": 5, "epsilon": 1.0, "alpha": 0.1}}),
        ("POST", "/v1/amplify"): lambda: ("/v1/amplify", {"json": {
            "epsilon0": 1.0, "n": 1000, "delta": 1e-6}}),
        ("POST", "/v1/fed/plan"): lambda: ("/v1/fed/plan", {"json": {
            "agents": 5, "local_n": 50, "alpha": 0.2}}),
        ("GET", "/v1/releases"): lambda: ("/v1/releases", {}),
        ("GET", "/v1/releases/{release_id}"): lambda: (f"/v1/releases/{ctx['rid']}", {}),
        ("GET", "/v1/audit/head"): lambda: ("/v1/audit/head", {}),
        ("GET", "/v1/audit/entries"): lambda: ("/v1/audit/entries?after=0&limit=5", {}),
        ("POST", "/v1/audit/verify"): lambda: ("/v1/audit/verify", {"json": {}}),
        ("GET", "/ui/login"): lambda: ("/ui/login", {}),
        ("POST", "/ui/login"): lambda: ("/ui/login", {"data": {"token": ctx["tok"] or "x"}}),
        ("POST", "/ui/logout"): lambda: ("/ui/logout", {}),
        ("GET", "/ui/"): lambda: ("/ui/", {}),
        ("POST", "/ui/verify"): lambda: ("/ui/verify", {}),
        ("GET", "/ui/static/app.css"): lambda: ("/ui/static/app.css", {}),
        ("GET", "/ui/static/favicon.svg"): lambda: ("/ui/static/favicon.svg", {}),
    }
    fn = table.get((method, path))
    if fn is None:
        pytest.fail(f"no request recipe for {method} {path}: add it to the role matrix")
    return fn()


def _expected(roles: list[str], who: str, path: str, method: str) -> set[int]:
    if "public" in roles:
        if (method, path) == ("POST", "/ui/login"):  # the login form judges the token
            return {303} if who in ("admin", "auditor") else {401} if who in BAD else {403}
        return {200, 303}
    if path.startswith("/ui"):
        return {303} if who in BAD else {200} if who in roles else {403}
    if who in BAD:
        return {401}
    if who not in roles:
        return {403}
    return {200, 201}


def _ui_cookie(lv: Live, tok: str) -> str:
    """The UI credential the login form would set for ``tok`` (minted here for every role,
    so that the UI's own role check is tried too)."""
    from privcal.service.ui import issue_credential, ui_key

    return issue_credential(ui_key(lv.accountant.ledger), tok.split("_")[1])


def test_every_route_every_principal(live: Live) -> None:  # SQLite and PostgreSQL
    ctx = _setup(live)
    toks = ctx["toks"]
    seen = worded = 0
    for route in live.app.routes:
        if not isinstance(route, APIRoute):
            for m in getattr(route, "methods", set()) or set():
                assert (m, route.path) in PUBLIC_BUILTIN, \
                    f"{m} {route.path} is not an API route with declared roles"
            continue
        roles = (route.openapi_extra or {}).get("x-privcal-roles")
        assert roles, f"{route.path} declares no roles (use privcal.service.auth.allow)"
        assert set(roles) <= {*ROLES, "public"}, roles
        for method in route.methods:
            for who in (*BAD, *ROLES):
                tok = None if who == "none" else toks[who]
                ctx["tok"] = tok
                url, kw = _recipe(live, ctx, method, route.path, who)
                headers = dict(kw.pop("headers", {}))
                if tok and route.path.startswith("/ui") and "data" not in kw:
                    headers["Cookie"] = f"privcal_ui={_ui_cookie(live, tok)}"
                elif tok and not route.path.startswith("/ui"):
                    headers["Authorization"] = f"Bearer {tok}"
                with live.client(follow_redirects=False) as c:
                    r = c.request(method, url, headers=headers, **kw)
                want = _expected(roles, who, route.path, method)
                assert r.status_code in want, (method, route.path, who, r.status_code, r.text)
                if r.status_code == 401 and not route.path.startswith("/ui"):
                    assert r.headers["www-authenticate"].startswith("Bearer")
                    assert r.headers["content-type"] == "application/problem+json"
                if r.status_code == 403 and not route.path.startswith("/ui"):
                    detail = r.json()["detail"]  # "an auditor token", "a device token"
                    if "may not call this route" in detail:
                        assert detail.startswith(("an admin", "an agent", "an analyst",
                                                  "an auditor", "an ingestor", "a device")), \
                            detail
                        worded += 1
                seen += 1
    assert seen > 200 and worded > 50
