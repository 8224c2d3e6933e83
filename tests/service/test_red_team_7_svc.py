"""Red team 7, the service's authentication surface (findings E-1, E-2, E-5 and the 405's
``Allow``): each reproduced over HTTP against a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import http.cookies
import json
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from privcal.storage.sessions import SessionReport
from tests.service.conftest import EXPIRED, Live, open_ldp

P = "urn:privcal:problem:"
FAKE = "pcl_0123456789abcdef_" + "A" * 43  # well formed, in no ledger


def _no_unquote(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make http.cookies' unquoting (quadratic in backslashes, CVE-2024-7592; used by
    SimpleCookie.load and by Starlette's ``request.cookies``) fail loudly: the server runs
    in this process, so a request whose Cookie header reached it is a 500."""
    def refused(value: str) -> str:
        raise AssertionError("a Cookie header was unquoted")

    monkeypatch.setattr(http.cookies, "_unquote", refused)


def _login(lv: Live, token: str) -> httpx.Response:
    with lv.client(follow_redirects=False) as c:
        return c.post("/ui/login", data={"token": token})


def _ui(lv: Live, cookie: str) -> httpx.Response:
    with lv.client(follow_redirects=False) as c:
        return c.get("/ui/", headers={"Cookie": cookie})


# ------------------------------------------------------------------ E-1: the Cookie header
def test_a_cookie_of_backslashes_is_answered_without_unquoting_it(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: one GET /ui/ whose Cookie is a quoted value of backslashes; SimpleCookie's
    unquoting is quadratic in them and ran on the event loop (40 000 froze the server
    31 s), and so did FastAPI's ``request.cookies`` on every route. Now the UI's cookie is
    split, never unquoted, and no route sees the header: the login redirect, the public
    and API routes answer, and a real session cookie among such cookies opens the page."""
    _no_unquote(monkeypatch)
    for n in (6_000, 100_000):  # under and over the header cap
        r = _ui(live, 'privcal_ui="' + "\\" * n + '"')
        assert r.status_code == 303 and r.headers["location"] == "/ui/login", r.text[:200]
    bad = {"Cookie": 'x="' + "\\" * 6_000 + '"'}
    with live.client() as c:
        assert c.get("/healthz", headers=bad).status_code == 200
        assert c.get("/ui/login", headers=bad).status_code == 200
    with live.client("admin") as c:
        assert c.get("/v1/datasets", headers=bad).status_code == 200
    cred = _login(live, live.tokens["auditor"]).cookies["privcal_ui"]
    r = _ui(live, 'a="' + "\\" * 3000 + f'"; privcal_ui={cred}; b=c')
    assert r.status_code == 200 and "privcal" in r.text


def test_the_cookie_parser_is_a_split_and_ignores_a_huge_header(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """The UI's cookie reader, as a unit: it never unquotes, takes a well-formed credential
    only, and counts Cookie headers longer than its cap (whatever they hold) as absent."""
    from privcal.service.ui import COOKIE_HEADER_MAX, cookie_credential

    _no_unquote(monkeypatch)
    cred = _login(live, live.tokens["admin"]).cookies["privcal_ui"]
    assert cookie_credential([(b"cookie", f"x=1; privcal_ui={cred}".encode())]) == cred
    assert cookie_credential([(b"cookie", b"x=1"), (b"cookie", f"privcal_ui={cred}".encode())
                              ]) == cred
    assert cookie_credential([(b"cookie", b'privcal_ui="' + b"\\" * 100_000 + b'"')]) is None
    padded = f"privcal_ui={cred}; pad={'x' * COOKIE_HEADER_MAX}".encode()
    assert cookie_credential([(b"cookie", padded)]) is None  # too long: absent
    assert _ui(live, padded.decode()).status_code == 303
    assert cookie_credential([(b"cookie", f"privcal_ui={live.tokens['admin']}".encode())]) \
        is None  # a bearer token is not a UI credential
    assert cookie_credential([(b"cookie", f'privcal_ui="{cred}"'.encode())]) is None
    assert cookie_credential([]) is None


# ------------------------------------------------------------------ E-2: report body limit
def _stored(lv: Live, sid: int) -> int:
    with lv.accountant.ledger.read() as s:
        return int(s.scalar(select(func.count()).select_from(SessionReport)
                            .where(SessionReport.session_id == sid)))


def _spy_json(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every text json.loads parses (in this process: the server's too)."""
    seen: list[int] = []
    real = json.loads

    def spy(s: Any, *a: Any, **kw: Any) -> Any:
        seen.append(len(s))
        return real(s, *a, **kw)

    monkeypatch.setattr(json, "loads", spy)
    return seen


@pytest.mark.parametrize("chunked", [False, True])
def test_a_big_report_body_with_a_made_up_token_is_413_and_never_parsed(
        live: Live, monkeypatch: pytest.MonkeyPatch, chunked: bool) -> None:
    """Attack: PUT a 1 MB JSON array to a report path with a made-up token of the right
    shape: the server read and parsed it (twice) before its 401. Now a report's own body
    limit answers 413 before the body is parsed (or, chunked, read past the limit)."""
    from privcal.service.device_reports import REPORT_BODY_LIMIT

    sid = open_ldp(live, group_size=50, rounds=1)
    dev = live.token("device", session=sid, subject="s-1")
    body = ("[" + ",".join(["{}"] * 350_000) + "]").encode()
    seen = _spy_json(monkeypatch)
    for tok in (FAKE, dev):
        content: Any = iter([body[i:i + 65536] for i in range(0, len(body), 65536)]) \
            if chunked else body
        with live.client(token=tok) as c:
            r = c.put(f"/v1/sessions/{sid}/reports/r1", content=content,
                      headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["type"] == P + "body-too-large", r.text[:300]
        assert f"{REPORT_BODY_LIMIT} bytes" in r.json()["detail"]
    assert not [n for n in seen if n > REPORT_BODY_LIMIT], seen
    assert _stored(live, sid) == 0
    monkeypatch.undo()
    with live.client(token=dev) as c:  # a report, even generously spaced, still goes in
        r = c.put(f"/v1/sessions/{sid}/reports/r1",
                  content=b'{ "round" : 0 ,\n  "value" : 1 }' + b" " * 200,
                  headers={"content-type": "application/json"})
        assert r.status_code == 201, r.text
    assert _stored(live, sid) == 1
    live.accountant.verify()


def test_a_deeply_nested_report_body_is_not_a_500(live: Live) -> None:
    """Attack: a report body of 1 000 ``[`` (within the limit): the lean path's json.loads
    raised RecursionError, a 500. Now the route answers it: 401 for a made-up token, 422
    for the session's device."""
    sid = open_ldp(live, group_size=50, rounds=1)
    dev = live.token("device", session=sid, subject="s-1")
    hdr = {"content-type": "application/json"}
    for tok, want in ((FAKE, 401), (dev, 422)):
        with live.client(token=tok) as c:
            r = c.put(f"/v1/sessions/{sid}/reports/r1", content=b"[" * 1000, headers=hdr)
        assert r.status_code == want, r.text[:300]
    assert _stored(live, sid) == 0


# ------------------------------------------------------------------ E-5: the UI's cookie
def test_the_ui_cookie_is_not_the_token_and_opens_only_the_ui(live: Live) -> None:
    """Attack: the /ui cookie was the raw admin token (cookies are scoped by host, not
    port: any other service on the host received it) and minted admin tokens on /v1. Now
    it is a UI-only credential: no part of the token's secret, 401 on /v1, 200 on /ui,
    and its session ends when the token is revoked."""
    from privcal.storage.tokens import list_tokens

    tokens_before = len(list_tokens(live.accountant.ledger))
    admin = live.tokens["admin"]
    r = _login(live, admin)
    assert r.status_code == 303 and r.headers["location"] == "/ui/"
    set_cookie = r.headers["set-cookie"]
    cred = r.cookies["privcal_ui"]
    secret = admin.split("_", 2)[2]
    assert cred != admin and secret not in set_cookie and admin not in set_cookie
    low = set_cookie.lower()
    assert "httponly" in low and "samesite=strict" in low and "path=/ui" in low
    for method, path, kw in (("GET", "/v1/datasets", {}),
                             ("POST", "/v1/tokens", {"json": {"role": "admin", "name": "x"}})):
        with live.client(token=cred) as c:
            got = c.request(method, path, **kw)
        assert got.status_code == 401, got.text
        with live.client() as c:  # nor as a cookie on /v1
            got = c.request(method, path, headers={"Cookie": f"privcal_ui={cred}"}, **kw)
        assert got.status_code == 401, got.text
    assert len(list_tokens(live.accountant.ledger)) == tokens_before  # nothing minted
    assert _ui(live, f"privcal_ui={cred}").status_code == 200
    tid = admin[4:20]
    with live.client("admin") as c:  # revoked with itself: the UI session ends too
        assert c.delete(f"/v1/tokens/{tid}").status_code == 200
    r = _ui(live, f"privcal_ui={cred}")
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"


def test_a_ui_credential_is_bounded_and_cannot_be_forged(live: Live) -> None:
    """A credential past its 12 hours, one with a forged MAC, one naming a token that
    expired, or the raw token itself (what the old cookie was): each is the login page.
    A credential naming a non-UI role's token is still that role's 403."""
    from privcal.service.ui import UI_SESSION, issue_credential, ui_key

    key = ui_key(live.accountant.ledger)
    auditor = live.tokens["auditor"]
    tid = auditor[4:20]
    assert _ui(live, f"privcal_ui={issue_credential(key, tid)}").status_code == 200
    old = issue_credential(key, tid, int(time.time()) - UI_SESSION - 5)
    forged = issue_credential(b"k" * 32, tid)
    short = live.token("auditor", name="brief", expires_in=EXPIRED * 3)
    short_cred = _login(live, short).cookies["privcal_ui"]
    assert _ui(live, f"privcal_ui={short_cred}").status_code == 200
    time.sleep(3.2)  # the token is now past its expiry
    for cookie in (old, forged, short_cred, auditor):
        r = _ui(live, f"privcal_ui={cookie}")
        assert r.status_code == 303 and r.headers["location"] == "/ui/login", cookie
    analyst = live.tokens["analyst"]
    assert _login(live, analyst).status_code == 403  # the login form gives it no cookie
    r = _ui(live, f"privcal_ui={issue_credential(key, analyst[4:20])}")
    assert r.status_code == 403


# ------------------------------------------------------------------ the 405's Allow header
def test_a_405_allows_every_method_of_the_path(live: Live) -> None:
    """HEAD /v1/datasets answered 405 with ``Allow: POST`` though GET is allowed."""
    with live.client("admin") as c:
        for method in ("HEAD", "DELETE"):
            r = c.request(method, "/v1/datasets")
            assert r.status_code == 405
            assert set(r.headers["allow"].split(", ")) == {"GET", "POST"}, r.headers["allow"]
        r = c.request("PATCH", "/v1/tokens/0123456789abcdef")
        assert r.status_code == 405 and r.headers["allow"] == "DELETE", r.headers["allow"]


def test_a_federated_calibration_plans_no_more_than_a_session_may(live: Any) -> None:
    """``POST /v1/datasets/{name}/calibrations`` with fedcp2-qq planned any number of agents
    in a server thread (a session open refuses more than fed_limits allows): it is refused
    the same way now, before anything is planned or charged."""
    from privcal.service.fed_limits import FED2_MAX_AGENTS

    m = FED2_MAX_AGENTS + 1
    body = {"method": "fedcp2-qq", "params": {"alpha": 0.2, "epsilon": 2.0},
            "scores": [0.5] * (2 * m), "agents": [f"a{j}" for j in range(m)] * 2}
    head = live.accountant.ledger.head()
    with live.client("analyst") as c:
        for q in ("", "?dry_run=true"):
            r = c.post(f"/v1/datasets/d/calibrations{q}", json=body,
                       headers={"Idempotency-Key": f"fed{q}"})
            assert r.status_code == 422, r.text
            assert f"the service plans FedCP²-QQ (an epsilon) for at most {FED2_MAX_AGENTS} " \
                   f"agents, got {m}" in r.json()["detail"]
    assert live.accountant.ledger.head() == head


def test_the_ui_key_is_no_subject_s_pseudonym(live: Any) -> None:
    """The UI credential's MAC key was HMAC(secret, "privcal ui cookie key v1"), which is
    the pseudonym of the subject id "privcal ui cookie key v1": whoever read subject_spend
    could forge a /ui session. Its label ends in NUL now, which no subject id holds."""
    import hmac as hmac_mod

    from privcal.errors import InvalidInput
    from privcal.service import ui
    from privcal.storage.pseudonyms import pseudonym

    led = live.accountant.ledger
    key = ui.ui_key(led)
    for label in (b"privcal ui cookie key v1", ui._KEY_LABEL.rstrip(b"\x00")):
        live.accountant.charge_subjects("d", 1, [label.decode()], purpose="x")
        assert bytes.fromhex(pseudonym(led.subject_key(), label.decode())) != key
    assert ui._KEY_LABEL.endswith(b"\x00") and ui._MAC_LABEL.endswith(b"\x00")
    with pytest.raises(InvalidInput):  # the label itself can never be charged as a subject
        live.accountant.charge_subjects("d", 1, [ui._KEY_LABEL.decode()], purpose="x")
    assert hmac_mod.compare_digest(key, ui.ui_key(led))  # stable: any worker checks it
