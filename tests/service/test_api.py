"""The service's semantics over real HTTP: problem documents, idempotency, strict bodies,
the body limit, device/agent/ingestor rules, grants, nothing written on bad input."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import pytest

from tests.service.conftest import Live, open_fed, open_ldp

P = "urn:privcal:problem:"


def _k() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def _problem(r: Any, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["type"] == P + slug and body["status"] == status and body["title"]
    return body


def _head(lv: Live) -> str:
    return str(lv.accountant.ledger.head())


def test_charge_idempotency_and_refusal(live: Live) -> None:
    with live.client("analyst") as c:
        body = {"cost": {"rho": "0.4"}, "purpose": "q1"}
        r1 = c.post("/v1/datasets/d/charges", json=body, headers={"Idempotency-Key": "a"})
        assert r1.status_code == 201
        assert r1.json()["requester"] == "analyst:ann" and r1.json()["remaining"] == {"rho": "0.6"}
        head = _head(live)
        r2 = c.post("/v1/datasets/d/charges", json=body, headers={"Idempotency-Key": "a"})
        assert r2.status_code == 200 and r2.headers["idempotent-replayed"] == "true"
        assert r1.json()["replayed"] is False  # the body says what the header says
        assert r2.json() == {**r1.json(), "replayed": True}
        _problem(c.post("/v1/datasets/d/charges", json={"cost": {"rho": "0.1"}},
                        headers={"Idempotency-Key": "a"}), 409, "idempotency-key-reused")
        assert _head(live) == head  # neither the replay nor the reuse wrote anything
        p = _problem(c.post("/v1/datasets/d/charges", json={"cost": {"rho": "0.7"}},
                            headers=_k()), 409, "budget-refused")
        assert p["scope"] == "dataset 'd'" and "0.7" in p["asked"] and "0.6" in p["remaining"]
        # the amounts as a dry run gives them (red team 22, newcomer F4)
        assert (p["cost"], p["remaining_before"]) == ({"kind": "zcdp", "rho": "0.7"},
                                                      {"rho": "0.6"})
        _problem(c.post("/v1/datasets/d/charges", json={"cost": {"rho": "0.1"}}), 422,
                 "idempotency-key-required")
        assert _head(live) == head
    assert live.accountant.budget("d").remaining == {"rho": Decimal("0.6")}


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("body", [
    {"cost": {"rho": 0.1}},  # a float amount: amounts are decimal strings
    {"cost": {"rho": "0.1"}, "requester": "mallory"},  # requester is never a body field
    {"cost": {"rho": "-1"}},
    {"cost": {"rho": "NaN"}},
    {"cost": {"rho": "0.1", "epsilon": "1"}},
    {"cost": {}},
    {"cost": {"rho": "0.1"}, "purpose": 7},
])
def test_bad_charges_are_422_and_change_nothing(live: Live, body: dict[str, Any]) -> None:
    head = _head(live)
    with live.client("analyst") as c:
        p = _problem(c.post("/v1/datasets/d/charges", json=body, headers=_k()), 422,
                     "invalid-input")
    assert "mallory" not in str(p) and "NaN" not in str(p.get("errors", ""))
    assert "\n" not in p["detail"] and "Value error" not in p["detail"]  # one clear line
    if body == {"cost": {"rho": "-1"}}:
        assert p["detail"] == "cost: ZCDP rho: ρ must be > 0, got -1"
    assert _head(live) == head


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_grants_hide_datasets_and_roles_are_enforced(live: Live) -> None:
    with live.client("analyst") as c:
        assert [d["name"] for d in c.get("/v1/datasets").json()] == ["d"]
        _problem(c.get("/v1/datasets/other"), 404, "not-found")
        _problem(c.get("/v1/datasets/nope"), 404, "not-found")
        # an ungranted dataset looks exactly like a missing one
        a = c.get("/v1/datasets/other/budget").json()
        b = c.get("/v1/datasets/nope/budget").json()
        assert {k: v for k, v in a.items() if k != "detail"} == \
            {k: v for k, v in b.items() if k != "detail"}
        _problem(c.post("/v1/datasets/other/charges", json={"cost": {"rho": "0.1"}},
                        headers=_k()), 404, "not-found")
        _problem(c.post("/v1/datasets", json={"name": "x", "rho": "1"}), 403, "forbidden")
        _problem(c.get("/v1/audit/entries"), 403, "forbidden")
    with live.client("auditor") as c:
        _problem(c.post("/v1/datasets/d/charges", json={"cost": {"rho": "0.1"}},
                        headers=_k()), 403, "forbidden")
        assert {d["name"] for d in c.get("/v1/datasets").json()} == {"d", "other"}
    with live.client(token="pcl_0123456789abcdef_" + "A" * 43) as c:
        r = c.get("/v1/whoami")
        _problem(r, 401, "unauthenticated")
        assert r.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_revocation_is_immediate_and_expiry_holds(live: Live) -> None:
    from datetime import timedelta

    from privcal.storage.tokens import ApiToken

    tok = live.token("auditor", expires_in=timedelta(hours=1))
    tid = tok.split("_")[1]
    with live.client(token=tok) as c:
        assert c.get("/v1/audit/head").status_code == 200

        def age(s: Any) -> None:
            row = s.get(ApiToken, tid)
            row.expires_at = row.created_at

        live.accountant.ledger.write(age)
        _problem(c.get("/v1/audit/head"), 401, "unauthenticated")
    tok2 = live.token("auditor")
    with live.client(token=tok2) as c:
        assert c.get("/v1/audit/head").status_code == 200
        with live.client("admin") as admin:
            assert admin.delete(f"/v1/tokens/{tok2.split('_')[1]}").status_code == 200
        _problem(c.get("/v1/audit/head"), 401, "unauthenticated")
    # a right id with a wrong secret is refused too
    forged = tok2[: -1] + ("A" if tok2[-1] != "A" else "B")
    with live.client(token=forged) as c:
        _problem(c.get("/v1/whoami"), 401, "unauthenticated")


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_strict_bodies_and_body_limit(live: Live) -> None:
    from privcal.service.app import create_app
    from tests.service.conftest import start_server

    sid = open_ldp(live)
    dev = live.token("device", session=sid, subject="s-1")
    with live.client(token=dev) as c:
        for bad in ({"round": 0, "value": True}, {"round": 0, "value": "1"},
                    {"round": 0, "value": 2}, {"round": "0", "value": 1},
                    {"round": 0, "value": 1, "subject": "someone-else"}):
            _problem(c.put(f"/v1/sessions/{sid}/reports/r1", json=bad), 422, "invalid-input")
        _problem(c.put(f"/v1/sessions/{sid}/reports/r1", content=b"{not json",
                       headers={"content-type": "application/json"}), 422, "invalid-input")
    assert live.accountant.ledger.head().seq == _seq_after_open(live)
    app = create_app(accountant=live.accountant, body_limit=2048)
    url, server, th = start_server(app)
    try:
        import httpx

        with httpx.Client(base_url=url, headers={
                "Authorization": f"Bearer {live.tokens['analyst']}"}) as c:
            big = {"method": "split", "params": {"alpha": 0.1},
                   "scores": np.linspace(0, 1, 2000).tolist()}
            _problem(c.post("/v1/datasets/d/calibrations", json=big, headers=_k()), 413,
                     "body-too-large")

            def chunks() -> Any:  # no Content-Length: counted while read
                for _ in range(10):
                    yield b" " * 1024

            _problem(c.post("/v1/datasets/d/charges", content=chunks(),
                            headers={**_k(), "content-type": "application/json"}), 413,
                     "body-too-large")
    finally:
        server.should_exit = True
        th.join(timeout=30)


def _seq_after_open(lv: Live) -> int:
    # datasets d and other (2 entries) + session_open (1)
    return 3


def test_device_reports_duplicate_conflict_and_no_other_subject(live: Live) -> None:
    sid = open_ldp(live, group_size=2, rounds=2)
    other = open_ldp(live, group_size=2, rounds=2)
    d1 = live.token("device", session=sid, subject="s-1")
    d2 = live.token("device", session=sid, subject="s-2")
    d3 = live.token("device", session=sid, subject="s-3")
    with live.client(token=d1) as c:
        pub = c.get(f"/v1/sessions/{sid}").json()
        assert pub["round"] == 0 and pub["query"] == 0.5 and "requester" not in pub
        assert "dataset" not in pub and pub["params"]["epsilon"] == 1.0
        _problem(c.get(f"/v1/sessions/{other}"), 404, "not-found")
        _problem(c.put(f"/v1/sessions/{other}/reports/r1", json={"round": 0, "value": 1}),
                 404, "not-found")
        _problem(c.get("/v1/datasets/d/budget"), 403, "forbidden")
        r = c.put(f"/v1/sessions/{sid}/reports/r1", json={"round": 0, "value": 1})
        assert r.status_code == 201, r.text
        r = c.put(f"/v1/sessions/{sid}/reports/r1", json={"round": 0, "value": 1})
        assert r.status_code == 200 and r.json()["status"] == "duplicate"
        p = _problem(c.put(f"/v1/sessions/{sid}/reports/r2", json={"round": 0, "value": 0}),
                     409, "report-rejected")
        assert "already reported" in p["detail"]
    with live.client(token=d2) as c:
        _problem(c.put(f"/v1/sessions/{sid}/reports/x", json={"round": 1, "value": 1}), 409,
                 "report-rejected")
        assert c.put(f"/v1/sessions/{sid}/reports/x", json={"round": 0, "value": 0}
                     ).status_code == 201
        # round 0 is full now: it advanced
        assert c.get(f"/v1/sessions/{sid}").json()["round"] == 1
    with live.client(token=d3) as c:
        p = _problem(c.put(f"/v1/sessions/{sid}/reports/y", json={"round": 0, "value": 0}),
                     409, "report-rejected")
        assert p["reason"] == "closed round"
    st = live.accountant
    from privcal.accountant.sessions import session_status

    assert session_status(st, sid).total_reports == 2
    assert st.subject_spend("d", "s-1") == 1 and st.subject_spend("d", "s-3") == 0
    st.verify()


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_device_token_refused_for_shuffled_and_ingestor_posts(live: Live) -> None:
    from privcal.errors import InvalidInput

    # a shuffled session needs an (ε, δ) cap, charged the amplified cost (issue 14.5)
    live.accountant.create_dataset("ad", approx_epsilon=5, approx_delta=1e-5,
                                   subject_epsilon=10)
    with live.client(token=live.token("analyst", name="ann-ad", datasets=["ad"])) as c:
        r = c.post("/v1/datasets/ad/sessions", json={
            "method": "ldp-score", "alpha": 0.2, "epsilon": 1.0, "rounds": 1,  # 30: a round
            "group_size": 30, "shuffled": True}, headers={"Idempotency-Key": "open-ad"})
        # that can pass (one that cannot is refused before its charge: red team 23)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
    with live.client("analyst") as c:  # on a zCDP cap it is refused, nothing written
        r = c.post("/v1/datasets/d/sessions", json={
            "method": "ldp-score", "alpha": 0.2, "epsilon": 1.0, "rounds": 1,
            "group_size": 3, "shuffled": True}, headers={"Idempotency-Key": "open-d"})
        assert r.status_code == 409 and "cannot be charged an (ε, δ) cost" in r.text
    with pytest.raises(InvalidInput, match="shuffled"):
        live.token("device", session=sid, subject="s")
    ing = live.token("ingestor", session=sid)
    rows = [{"subject": "subj-a", "value": 1, "round": 0},
            {"subject": "subj-b", "value": 0, "round": 0},
            {"subject": "subj-a", "value": 1, "round": 0},
            {"subject": "subj-c", "value": 7, "round": 0}]
    with live.client(token=ing) as c:
        r = c.post(f"/v1/sessions/{sid}/batches", json={"reports": rows}, headers={
            "Idempotency-Key": "b1"})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["accepted"] == 2 and out["rejected"] == 2 and "subj-" not in r.text
        assert out["reasons"] == {"duplicate subject in batch": 1, "malformed bit": 1}
        again = c.post(f"/v1/sessions/{sid}/batches", json={"reports": rows}, headers={
            "Idempotency-Key": "b1"})
        assert again.status_code == 200 and again.json() == {**out, "replayed": True}
        _problem(c.post(f"/v1/sessions/{sid}/batches", json={"reports": rows[:1]},
                        headers={"Idempotency-Key": "b1"}), 409, "idempotency-key-reused")
        _problem(c.post(f"/v1/sessions/{sid + 1}/batches", json={"reports": rows},
                        headers=_k()), 404, "not-found")
    live.accountant.verify()


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_agents_message_and_release(live: Live) -> None:
    fid = open_fed(live, agents=2)
    a1 = live.token("agent", session=fid, agent="h1")
    a2 = live.token("agent", session=fid, agent="h2")
    with live.client(token=a1) as c:
        pub = c.get(f"/v1/sessions/{fid}").json()
        assert pub["grid"]["points"] == 20
        _problem(c.put(f"/v1/sessions/{fid}/messages", json={"value": 0.123456}), 409,
                 "report-rejected")
        assert c.put(f"/v1/sessions/{fid}/messages", json={"value": 5 / 19}).status_code == 201
        assert c.put(f"/v1/sessions/{fid}/messages", json={"value": 5 / 19}).status_code == 200
    with live.client(token=a2) as c:
        assert c.put(f"/v1/sessions/{fid}/messages", json={"value": 1.0}).status_code == 201
    with live.client("auditor") as c:
        s = c.get(f"/v1/sessions/{fid}").json()
        assert s["status"] == "released" and s["release_id"]
        rel = c.get(f"/v1/releases/{s['release_id']}").json()
        assert rel["method"] == "fedcp2-qq"
        v = c.post("/v1/audit/verify", json={"expect_head": _head(live)}).json()
        assert v["ok"] is True and v["report"]["heads_checked"] == 1
        # several kept heads (red team 18): each must be in the log
        seq, h = _head(live).split(":")
        v = c.post("/v1/audit/verify", json={"expect_heads": [f"1:{'0' * 64}",
                                                             f"{seq}:{h}"]}).json()
        assert v["ok"] is False and "audit entry 1: hash differs" in v["error"]
        v = c.post("/v1/audit/verify", json={"expect_head": f"{seq}:{h}",
                                             "expect_heads": [f"{int(seq) + 5}:{h}"]}).json()
        assert v["ok"] is False and f"audit entry {int(seq) + 1}: missing" in v["error"]


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_calibration_release_location_dry_run_and_replay(live: Live) -> None:
    scores = np.linspace(0, 1, 101).tolist()
    with live.client("analyst") as c:
        head = _head(live)
        dry = c.post("/v1/datasets/d/calibrations?dry_run=true", json={
            "method": "split", "params": {"alpha": 0.1}, "scores": scores})
        assert dry.status_code == 200 and dry.json()["allowed"] is True
        assert _head(live) == head
        body = {"method": "split", "params": {"alpha": 0.1}, "scores": scores}
        r = c.post("/v1/datasets/d/calibrations", json=body, headers={"Idempotency-Key": "c"})
        assert r.status_code == 201, r.text
        assert r.headers["location"] == f"/v1/releases/{r.json()['id']}"
        assert r.json()["requester"] == "analyst:ann"
        again = c.post("/v1/datasets/d/calibrations", json=body, headers={"Idempotency-Key": "c"})
        assert again.status_code == 200 and again.json()["id"] == r.json()["id"]
        _problem(c.post("/v1/datasets/d/calibrations", json={**body, "params": {"alpha": 0.2}},
                        headers={"Idempotency-Key": "c"}), 409, "idempotency-key-reused")
        head = _head(live)
        _problem(c.post("/v1/datasets/d/calibrations", json={
            "method": "split", "params": {"alpha": 1.5}, "scores": scores}, headers=_k()),
            422, "invalid-input")
        _problem(c.post("/v1/datasets/d/calibrations", json={
            "method": "nope", "params": {}, "scores": scores}, headers=_k()), 404, "not-found")
        for nominal in (1, "true"):  # a bool parameter takes true/false only (red team)
            p = _problem(c.post("/v1/datasets/d/calibrations", json={
                "method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.5, "nominal": nominal},
                "scores": scores}, headers=_k()), 422, "invalid-input")
            assert "nominal must be true or false" in p["detail"]
        assert _head(live) == head
    with live.client("auditor") as c:
        entries = c.get("/v1/audit/entries", params={"after": 0, "limit": 2}).json()
        assert [e["seq"] for e in entries] == [1, 2]
        from privcal.storage import audit

        prev = audit.GENESIS
        for e in c.get("/v1/audit/entries", params={"limit": 1000}).json():
            assert e["prev_hash"] == prev
            prev = audit.chain_hash(prev, e["payload"])  # recomputed offline
            assert prev == e["entry_hash"]
        hist = c.get("/v1/datasets/d/spend-history").json()
        assert hist["dataset"] == "d"


def test_readyz_and_openapi_security(live: Live) -> None:
    import httpx

    with httpx.Client(base_url=live.url) as c:
        assert c.get("/readyz").json()["status"] == "ready"
        spec = c.get("/openapi.json").json()
    for path, ops in spec["paths"].items():
        for op in ops.values():
            if path in ("/healthz", "/readyz"):
                continue
            assert op.get("security"), f"{path} lists no security requirement"
            assert op.get("x-privcal-roles"), path
            assert "401" in op["responses"] and "403" in op["responses"]


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_access_log_has_no_body_and_no_subject(live: Live,
                                               caplog: pytest.LogCaptureFixture) -> None:
    import logging

    sid = open_ldp(live)
    dev = live.token("device", session=sid, subject="secret-subject-42")
    with caplog.at_level(logging.INFO, logger="privcal.access"):
        with live.client(token=dev) as c:
            assert c.put(f"/v1/sessions/{sid}/reports/report-xyz",
                         json={"round": 0, "value": 1}).status_code == 201
        with live.client("analyst") as c:
            c.post("/v1/datasets/d/charges", json={"cost": {"rho": "0.1"},
                                                   "purpose": "body-text-77"}, headers=_k())
    lines = [r.getMessage() for r in caplog.records if r.name == "privcal.access"]
    assert any(ln.startswith("PUT /v1/sessions/{sid}/reports/{report_id} 201 "
                             + dev.split("_")[1]) for ln in lines), lines
    text = "\n".join(lines)
    for secret in ("secret-subject-42", "report-xyz", "body-text-77", dev.split("_", 2)[2]):
        assert secret not in text


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_an_unreadable_ledger_is_503_not_401(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    # found by bench/service_scale.py: a token read that failed under load answered 401,
    # which a client takes for a bad token (it retries a 503)
    import privcal.storage.tokens as tokens
    from privcal.errors import LedgerError

    def down(*a: Any, **k: Any) -> Any:
        raise LedgerError("database is locked")

    monkeypatch.setattr(tokens, "authenticate", down)
    with live.client("auditor") as c:
        _problem(c.get("/v1/audit/head"), 503, "ledger-unavailable")
