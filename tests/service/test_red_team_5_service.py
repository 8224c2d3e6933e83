"""Red team, session 5 (the service's part): over HTTP against a real server, on SQLite and
PostgreSQL. Each test reproduces one finding and passes when the attack fails: the bad input
is refused with its documented status and one-line problem, and nothing is written.

F1 a device/agent token whose id the library refuses (not NFC, a NUL, …) poisoned the shared
   report writer's window; F2 dataset names the Location header could not carry; F3 inputs
   that answered 500 (a NUL on PostgreSQL, an audit ``after`` past the column); F4 duplicate
   JSON keys (the last one won); F5 a charging session open without idempotency; F6 the role
   table, non-finite agent messages and the status of a non-JSON body."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.service.conftest import Live, open_fed, open_ldp
from tests.service.test_report_path import Gate

pytest.importorskip("fastapi", reason="the server extra is part of the test extra")

P = "urn:privcal:problem:"
JSON = {"content-type": "application/json"}


def _problem(r: Any, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["type"] == P + slug, body
    assert "\n" not in body.get("detail", ""), body
    return body


def _head(lv: Live) -> str:
    return str(lv.accountant.ledger.head())


def _tokens(lv: Live) -> int:
    from privcal.storage.tokens import list_tokens

    return len(list_tokens(lv.accountant.ledger))


def _stored(lv: Live, sid: int) -> int:
    from privcal.accountant.sessions import session_status

    return int(session_status(lv.accountant, sid).total_reports)


def _legacy_token(lv: Live, role: str, session: int, who: str) -> str:
    """A token row as a ledger may hold it from before ids were checked at creation."""
    from privcal.storage.audit import now
    from privcal.storage.token_secrets import new_secret
    from privcal.storage.tokens import ApiToken

    tid, secret, digest = new_secret()
    lv.accountant.ledger.write(lambda s: s.add(ApiToken(
        id=tid, secret_sha256=digest, role=role, name=f"legacy-{tid}", datasets=[],
        session_id=session, subject=who if role == "device" else None,
        agent=who if role == "agent" else None, created_at=now(), expires_at=None,
        revoked_at=None)))
    return f"pcl_{tid}_{secret}"


# ------------------------------------------------------------------ F1: ids at creation
@pytest.mark.parametrize("field,value", [
    ("subject", "e\u0301"), ("subject", "a\x00b"), ("subject", " s"), ("subject", "\ud800"),
    ("agent", "e\u0301"), ("agent", "a\x00b"),
    ("name", "a\x00b"), ("name", "a\nb"), ("name", "a\x1b[31mb"), ("dataset", "a\x00b"),
])
def test_token_texts_the_library_refuses_are_refused_at_creation(
        live: Live, field: str, value: str) -> None:
    """Attack: an admin creates a token whose subject or agent id no session accepts (not
    NFC, a NUL, a blank at an end, a lone surrogate), or whose name or dataset carries a
    control character: 422 and no token (PostgreSQL answered 500 to a NUL)."""
    sid, fid = open_ldp(live), open_fed(live)
    body: dict[str, Any] = {
        "subject": {"role": "device", "session": sid},
        "agent": {"role": "agent", "session": fid},
        "name": {"role": "auditor"}, "dataset": {"role": "analyst"}}[field]
    body[field] = value
    n = _tokens(live)
    raw = json.dumps(body).encode()  # \ud800 as JSON's escape: a lone surrogate in Python
    with live.client("admin") as c:
        p = _problem(c.post("/v1/tokens", content=raw, headers=JSON), 422, "invalid-input")
    assert field in p["detail"], p
    assert _tokens(live) == n


def test_bulk_device_tokens_refuse_an_id_the_library_refuses(live: Live) -> None:
    from privcal.errors import InvalidInput
    from privcal.service.bound_tokens import create_bound_device_tokens

    sid = open_ldp(live)
    n = _tokens(live)
    with pytest.raises(InvalidInput, match="NFC"):
        create_bound_device_tokens(live.accountant, sid, ["ok-1", "e\u0301"], None)
    assert _tokens(live) == n


# ------------------------------------------------------------------ F1: the write window
def test_a_bad_id_in_the_write_window_fails_only_its_own_report(live: Live) -> None:
    """Attack: a device token whose subject the session refuses (made before ids were
    checked) puts its report in the same write window as four valid devices. Before: the
    whole window failed with 422 and every device's answer named the bad subject. Now: the
    four are stored (201); the bad one alone gets a 422 that names no id."""
    sid = open_ldp(live, group_size=10, rounds=2)
    bad_id = "e\u0301"
    bad = _legacy_token(live, "device", sid, bad_id)
    good = [live.token("device", session=sid, subject=f"w-{i}") for i in range(4)]
    gate = Gate(live.app.state.batcher)

    def put(tok: str) -> Any:
        with live.client(token=tok) as c:
            return c.put(f"/v1/sessions/{sid}/reports/r1", json={"round": 0, "value": 1})

    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(put, good[0])
        assert gate.reached.wait(60)
        rest = [pool.submit(put, t) for t in (bad, *good[1:])]
        gate.queued(len(rest))
        gate.release()
        answers = [first.result()] + [f.result() for f in rest]
    bad_answer, goods = answers[1], [answers[0], *answers[2:]]
    assert [r.status_code for r in goods] == [201] * 4, [r.text for r in goods]
    p = _problem(bad_answer, 422, "invalid-input")
    for r in answers:
        assert bad_id not in r.text and "e\\u0301" not in r.text, r.text
    assert "subject" in p["detail"]
    assert _stored(live, sid) == 4
    live.accountant.verify()


def test_a_bad_agent_id_fails_only_its_own_message(live: Live) -> None:
    fid = open_fed(live, agents=3)
    bad = _legacy_token(live, "agent", fid, "a\u0301")
    good = [live.token("agent", session=fid, agent=f"h{i}") for i in range(2)]
    gate = Gate(live.app.state.batcher)

    def put(tok: str) -> Any:
        with live.client(token=tok) as c:
            return c.put(f"/v1/sessions/{fid}/messages", json={"value": 5 / 19})

    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(put, good[0])
        assert gate.reached.wait(60)
        b, g = pool.submit(put, bad), pool.submit(put, good[1])  # one window: both
        gate.queued(2)
        gate.release()
        assert first.result().status_code == 201, first.result().text
        assert g.result().status_code == 201, g.result().text
        _problem(b.result(), 422, "invalid-input")
        assert "a\u0301" not in b.result().text and "a\\u0301" not in b.result().text
    assert _stored(live, fid) == 2


# ------------------------------------------------------------------ F2: dataset names
def test_a_non_latin_dataset_name_gets_a_percent_encoded_location(live: Live) -> None:
    with live.client("admin") as c:
        r = c.post("/v1/datasets", json={"name": "数据 1", "rho": "1"})
        assert r.status_code == 201, r.text
        assert r.headers["location"] == "/v1/datasets/%E6%95%B0%E6%8D%AE%201"
        got = c.get(r.headers["location"])
        assert got.status_code == 200 and got.json()["name"] == "数据 1"
        r = c.post("/v1/datasets", json={"name": "数据 1", "rho": "1"})
        _problem(r, 409, "already-exists")


@pytest.mark.parametrize("name", ["a/b", "..", ".", "x\r\ny", "t\tab"])
def test_an_unaddressable_dataset_name_is_refused(live: Live, name: str) -> None:
    """A name the service's URLs cannot address (a '/', '.', '..') or a header cannot carry
    (CR/LF, control characters): 422, nothing created (the library's dataset-name check)."""
    h = _head(live)
    with live.client("admin") as c:
        _problem(c.post("/v1/datasets", json={"name": name, "rho": "1"}), 422, "invalid-input")
    assert name not in [d.name for d in live.accountant.datasets()]
    assert _head(live) == h


# ------------------------------------------------------------------ F3: no 500s
@pytest.mark.parametrize("query", [{"after": 2**31}, {"after": 2**63}, {"after": 2**64},
                                   {"after": -1}, {"limit": 0}, {"limit": 1001}])
def test_audit_entries_bounds_are_valid_on_both_backends(live: Live, query: Any) -> None:
    with live.client("auditor") as c:
        _problem(c.get("/v1/audit/entries", params=query), 422, "invalid-input")
        r = c.get("/v1/audit/entries", params={"after": 2**31 - 1, "limit": 1000})
        assert r.status_code == 200 and r.json() == []


def test_a_nul_in_a_token_id_or_text_is_not_a_500(live: Live) -> None:
    n = _tokens(live)
    with live.client("admin") as c:
        _problem(c.delete("/v1/tokens/a%00b"), 404, "not-found")
        _problem(c.delete("/v1/tokens/" + "f" * 64), 404, "not-found")
        _problem(c.post("/v1/tokens", json={"role": "auditor", "name": "a\x00b"}), 422,
                 "invalid-input")
    assert _tokens(live) == n


def test_revoke_token_refuses_what_is_not_a_token_id(live: Live) -> None:
    from privcal.errors import NotFound
    from privcal.storage.tokens import revoke_token

    for tid in ("a\x00b", "", "F" * 16, "0" * 17):
        with pytest.raises(NotFound):
            revoke_token(live.accountant.ledger, tid)


# ------------------------------------------------------------------ F4: duplicate keys
@pytest.mark.parametrize("method,path,role,raw", [
    ("POST", "/v1/datasets/d/charges", "analyst",
     b'{"cost": {"rho": "0.01"}, "cost": {"rho": "0.5"}}'),
    ("POST", "/v1/datasets/d/charges", "analyst", b'{"cost": {"rho": "0.01", "rho": "0.5"}}'),
    ("POST", "/v1/datasets/d/charges", "analyst",
     b'{"cost": {"rho": "0.01"}, "\\u0063ost": {"rho": "0.5"}}'),
    ("POST", "/v1/datasets/d/calibrations", "analyst",
     b'{"method": "split", "params": {"alpha": 0.1, "alpha": 0.5}, "scores": [0.1, 0.2]}'),
    ("POST", "/v1/datasets/d/calibrations", "analyst",
     b'{"method": "split", "params": {"alpha": 0.1}, "\\u0070arams": {"alpha": 0.5},'
     b' "scores": [0.1, 0.2]}'),
    ("POST", "/v1/datasets", "admin", b'{"name": "dup", "rho": "0.1", "rho": "9"}'),
    ("POST", "/v1/tokens", "admin", b'{"role": "auditor", "role": "admin"}'),
    ("POST", "/v1/datasets/d/sessions", "analyst",
     b'{"method": "ldp-score", "alpha": 0.2, "epsilon": 0.1, "epsilon": 5, "rounds": 2,'
     b' "group_size": 5}'),
    ("POST", "/v1/advise", "analyst",
     b'{"n": 5000, "k": 10, "epsilon": 2, "alpha": 0.1, "alpha": 0.2}'),
])
def test_a_key_given_twice_is_refused(live: Live, method: str, path: str, role: str,
                                      raw: bytes) -> None:
    """Attack: a body with a key given twice (at the top, nested, or spelled with an escape)
    was accepted with the last value winning (e.g. the larger charge): now 422, nothing
    written."""
    h = _head(live)
    with live.client(role) as c:
        r = c.request(method, path, content=raw,
                      headers={**JSON, "Idempotency-Key": uuid.uuid4().hex})
    p = _problem(r, 422, "invalid-input")
    assert "duplicate key" in p["detail"], p
    assert _head(live) == h
    assert live.accountant.budget("d").spent == {"rho": 0}


def test_a_key_given_twice_in_a_multipart_request_field_is_refused(live: Live) -> None:
    h = _head(live)
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": "mp"},
                   data={"request": '{"method": "split", "params": {"alpha": 0.1}, '
                                    '"params": {"alpha": 0.5}}'},
                   files={"scores": ("s.csv", b"score\n0.1\n0.2\n", "text/csv")})
    assert "duplicate key" in _problem(r, 422, "invalid-input")["detail"]
    assert _head(live) == h


def test_a_key_given_twice_in_a_report_or_message_is_refused(live: Live) -> None:
    sid, fid = open_ldp(live), open_fed(live)
    dev = live.token("device", session=sid, subject="dup-1")
    agt = live.token("agent", session=fid, agent="dup-a")
    with live.client(token=dev) as c:  # the lean path leaves it to the route: 422
        for raw in (b'{"round": 0, "value": 1, "value": 0}',
                    b'{"round": 0, "value": 0, "\\u0076alue": 1}'):
            _problem(c.put(f"/v1/sessions/{sid}/reports/r1", content=raw, headers=JSON), 422,
                     "invalid-input")
    with live.client(token=agt) as c:
        _problem(c.put(f"/v1/sessions/{fid}/messages", content=b'{"value": 0.1, "value": 0.2}',
                       headers=JSON), 422, "invalid-input")
    assert _stored(live, sid) == 0 and _stored(live, fid) == 0


def test_duplicate_key_checks() -> None:
    from privcal.errors import InvalidInput
    from privcal.service.json_body import DuplicateKey, check_unique_keys, loads_strict

    assert loads_strict(b'{"a": {"b": 1}, "c": {"b": 2}, "d": [{"b": 1}, {"b": 2}]}')
    for raw in (b'{"a": 1, "a": 2}', b'[{"x": {"a": 1, "a": 1}}]', b'{"a": 1, "\\u0061": 2}'):
        with pytest.raises(DuplicateKey):
            loads_strict(raw)
        with pytest.raises(InvalidInput, match="duplicate key"):
            check_unique_keys(raw)
    # the fast path: keys unique everywhere, or repeated only in different objects
    check_unique_keys(b'{"a": {"b": 1}, "c": {"b": 2}, "s": ["a\\"b:", "x"]}')
    check_unique_keys(b'{"k": "v\\":", "v": 1}')
    check_unique_keys(b"not json")
    with pytest.raises(InvalidInput):
        check_unique_keys(b'{"s": ["a\\"", "b"], "k": 1, "k": 2}')


# ------------------------------------------------------------------ F5: session opens
def test_a_charging_session_open_is_idempotent(live: Live) -> None:
    """Attack: a client retries a shuffled session open whose answer it lost. Before: a
    second session and a second charge of the amplified cost. Now: the key is required
    (422, nothing written, as for a charge), the same key and body answer the original
    session (200, no new charge), another body under the key is 409."""
    acct = live.accountant
    acct.create_dataset("ad", approx_epsilon="8", approx_delta="0.001", delta="0.000001",
                        subject_epsilon="10")
    ana = live.token("analyst", name="ann-ad", datasets=["ad"])
    body = {"method": "ldp-score", "alpha": 0.1, "epsilon": 1.0, "rounds": 2,
            "group_size": 5000, "shuffled": True}
    url = "/v1/datasets/ad/sessions"
    with live.client(token=ana) as c:
        h = _head(live)
        _problem(c.post(url, json=body), 422, "idempotency-key-required")
        assert _head(live) == h and acct.budget("ad").spent["epsilon"] == 0
        r1 = c.post(url, json=body, headers={"Idempotency-Key": "open-1"})
        assert r1.status_code == 201, r1.text
        sid = r1.json()["id"]
        assert r1.headers["location"] == f"/v1/sessions/{sid}"
        spent, h = acct.budget("ad").spent, _head(live)
        assert spent["epsilon"] > 0
        r2 = c.post(url, json=body, headers={"Idempotency-Key": "open-1"})
        assert r2.status_code == 200 and r2.headers["idempotent-replayed"] == "true"
        assert r2.json() == r1.json() and r2.headers["location"] == f"/v1/sessions/{sid}"
        _problem(c.post(url, json={**body, "rounds": 3}, headers={"Idempotency-Key": "open-1"}),
                 409, "idempotency-key-reused")
        assert acct.budget("ad").spent == spent and _head(live) == h


def test_a_key_is_honoured_on_an_uncharged_session_open(live: Live) -> None:
    body = {"method": "ldp-score", "alpha": 0.2, "epsilon": 1.0, "rounds": 2,
            "group_size": 5}
    with live.client("analyst") as c:
        r1 = c.post("/v1/datasets/d/sessions", json=body, headers={"Idempotency-Key": "u1"})
        assert r1.status_code == 201
        h = _head(live)
        r2 = c.post("/v1/datasets/d/sessions", json=body, headers={"Idempotency-Key": "u1"})
        assert r2.status_code == 200 and r2.json()["id"] == r1.json()["id"]
        assert _head(live) == h
        r3 = c.post("/v1/datasets/d/sessions", json=body)  # no key: not required, no replay
        assert r3.status_code == 201 and r3.json()["id"] != r1.json()["id"]


# ------------------------------------------------------------------ F6
def test_admin_reads_the_audit_entries_and_verifies(live: Live) -> None:
    with live.client("admin") as c:
        r = c.get("/v1/audit/entries", params={"limit": 5})
        assert r.status_code == 200 and r.json()[0]["seq"] == 1
        r = c.post("/v1/audit/verify", json={})
        assert r.status_code == 200 and r.json()["ok"] is True


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_a_non_finite_agent_message_is_invalid_input(live: Live, raw: str) -> None:
    fid = open_fed(live, agents=2)
    agt = live.token("agent", session=fid, agent="nf")
    writes = live.app.state.batcher.batches
    with live.client(token=agt) as c:
        url = f"/v1/sessions/{fid}/messages"
        _problem(c.put(url, content=f'{{"value": {raw}}}', headers=JSON), 422, "invalid-input")
        assert live.app.state.batcher.batches == writes  # nothing was queued
        # a finite value off the published grid is still a conflict with the plan (409)
        _problem(c.put(url, json={"value": 0.123456}), 409, "report-rejected")
    assert _stored(live, fid) == 0


@pytest.mark.parametrize("ctype", ["text/plain", None, "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_is_415_on_every_json_route(live: Live,
                                                             ctype: str | None) -> None:
    sid, fid = open_ldp(live), open_fed(live)
    dev = live.token("device", session=sid, subject="ct-1")
    agt = live.token("agent", session=fid, agent="ct-a")
    ing = live.token("ingestor", session=sid)
    cases: list[tuple[str | None, str, str, dict[str, Any]]] = [
        ("analyst", "POST", "/v1/datasets/d/charges", {"cost": {"rho": "0.1"}}),
        ("analyst", "POST", "/v1/datasets/d/calibrations",
         {"method": "split", "params": {"alpha": 0.2}, "scores": [0.1, 0.2]}),
        ("analyst", "POST", "/v1/datasets/d/sessions",
         {"method": "ldp-score", "alpha": 0.2, "epsilon": 1.0, "rounds": 2, "group_size": 5}),
        ("analyst", "POST", "/v1/advise", {"n": 5000, "k": 10, "epsilon": 2, "alpha": 0.1}),
        ("admin", "POST", "/v1/datasets", {"name": "ct", "rho": "1"}),
        ("admin", "POST", "/v1/tokens", {"role": "auditor"}),
        ("auditor", "POST", "/v1/audit/verify", {}),
        (dev, "PUT", f"/v1/sessions/{sid}/reports/r1", {"round": 0, "value": 1}),
        (agt, "PUT", f"/v1/sessions/{fid}/messages", {"value": 5 / 19}),
        (ing, "POST", f"/v1/sessions/{sid}/batches",
         {"reports": [{"subject": "i-1", "value": 1, "round": 0}]}),
    ]
    h, n = _head(live), _tokens(live)
    for who, method, path, body in cases:
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        if ctype:
            headers["content-type"] = ctype
        role = who if who in live.tokens else None
        with live.client(role, token=None if role else who) as c:
            r = c.request(method, path, content=json.dumps(body).encode(), headers=headers)
        _problem(r, 415, "unsupported-media-type")
    assert _head(live) == h and _tokens(live) == n
    with live.client("auditor") as c:  # the role is checked first: 403, as for any input
        r = c.post("/v1/datasets/d/charges", content=b'{"cost": {"rho": "0.1"}}',
                   headers={"content-type": "text/plain", "Idempotency-Key": "x"})
        _problem(r, 403, "forbidden")


def test_every_api_route_parses_json_strictly(live: Live) -> None:
    from fastapi.routing import APIRoute

    from privcal.service.json_body import JsonRoute

    for route in live.app.routes:
        if isinstance(route, APIRoute) and not route.path.startswith("/ui"):
            assert isinstance(route, JsonRoute), route.path


def test_a_body_that_is_not_utf8_is_invalid_input(live: Live) -> None:
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/charges", content=b'{"cost": {"rho": "0.1\xff"}}',
                   headers={**JSON, "Idempotency-Key": "u8"})
    assert "UTF-8" in _problem(r, 422, "invalid-input")["detail"]
    assert live.accountant.budget("d").spent == {"rho": 0}
