"""Every response of ``privcal serve`` says ``Cache-Control: no-store`` and
``X-Content-Type-Options: nosniff``, and none names the server (red team 18, httpsec: the
API's answers hold budgets, releases, audit entries and, once, a token's secret; a cache
kept them, and ``Server: uvicorn`` told an unauthenticated client what it talked to).

Checked on every kind of answer, since they are sent by different code: a route's JSON, the
middleware's 401 and 413, the app's 404, a device report's lean 201, 200 and 409, a session-bound
token's lean read, the protocol's 431, the web view's 303 — and the web view's stylesheet
keeps its own caching.
"""

from __future__ import annotations

import httpx
import pytest

from privcal.service.device_reports import REPORT_BODY_LIMIT
from privcal.service.http_protocol import MAX_HEAD_BYTES
from tests.service.conftest import Live, open_ldp
from tests.service.test_red_team_18_http import _connect, _read_all

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)


def _standard(r: httpx.Response, status: int) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers.get("cache-control") == "no-store", (r.status_code, r.headers)
    assert r.headers.get("x-content-type-options") == "nosniff", (r.status_code, r.headers)
    assert "server" not in r.headers, r.headers


def test_every_kind_of_answer_carries_the_standard_headers(live: Live) -> None:
    sid = open_ldp(live)
    dev = live.token("device", session=sid, subject="s1")
    with live.client("admin") as c:
        _standard(c.get("/v1/datasets"), 200)
        _standard(c.get("/v1/datasets/nope"), 404)
    with live.client() as c:
        _standard(c.get("/v1/datasets"), 401)
        _standard(c.get("/healthz"), 200)
        _standard(c.get("/ui", follow_redirects=False), 303)
    with live.client(token=dev) as c:
        _standard(c.get(f"/v1/sessions/{sid}"), 200)  # the session-bound token's lean read
        put = c.put(f"/v1/sessions/{sid}/reports/a", json={"round": 0, "value": 1})
        _standard(put, 201)  # the lean report path
        big = c.put(f"/v1/sessions/{sid}/reports/c", content=b" " * (REPORT_BODY_LIMIT + 1),
                    headers={"content-type": "application/json"})
        _standard(big, 413)  # the middleware's answer, before any body is read
        again = c.put(f"/v1/sessions/{sid}/reports/b", json={"round": 0, "value": 1})
        _standard(again, 200)  # this device has reported: duplicate
        assert again.json()["status"] == "duplicate"
    with live.client(token=live.token("device", session=sid, subject="s2")) as c:
        wrong = c.put(f"/v1/sessions/{sid}/reports/a", json={"round": 1, "value": 1})
        _standard(wrong, 409)  # not this device's round: rejected


def test_the_stylesheet_keeps_its_own_caching(live: Live) -> None:
    with live.client() as c:
        r = c.get("/ui/static/app.css")
    assert r.status_code == 200 and r.headers["cache-control"].startswith("max-age")
    assert r.headers["x-content-type-options"] == "nosniff"


def test_the_protocols_own_answer_carries_them(live: Live) -> None:
    with _connect(live.url) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * MAX_HEAD_BYTES))
        head = _read_all(s).split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 431")
    assert b"\r\ncache-control: no-store" in head and b"\r\nx-content-type-options: nosniff" in head


def test_a_server_error_is_a_problem_document_with_them(ledger_url: str) -> None:
    """The review of red team 19: a 500 from an exception no handler took was Starlette's
    plain text, sent from outside the middleware that adds the headers."""
    from privcal.accountant import Accountant
    from privcal.service.app import create_app
    from privcal.storage import Ledger
    from tests.service.conftest import start_server

    led = Ledger(ledger_url)
    led.upgrade()
    app = create_app(accountant=Accountant(led))

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    url, server, th = start_server(app)
    try:
        with httpx.Client(base_url=url) as c:
            r = c.get("/boom")
    finally:
        server.should_exit = True
        th.join(timeout=30)
        led.close()
    _standard(r, 500)
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"] == "urn:privcal:problem:internal-error"
    assert "a bug" not in r.text


def test_a_request_that_is_not_http_gets_them_too(live: Live) -> None:
    """The review of red team 19: uvicorn's own 400 for a request it cannot parse was plain
    text without the headers."""
    with _connect(live.url) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n")
        head, _, body = _read_all(s).partition(b"\r\n\r\n")
    head = head.lower()
    assert head.startswith(b"http/1.1 400")
    assert b"\r\ncache-control: no-store" in head and b"\r\nx-content-type-options: nosniff" in head
    assert b"urn:privcal:problem:bad-request" in body
