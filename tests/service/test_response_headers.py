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

import socket

import httpx
import pytest

from privcal.service.device_reports import REPORT_BODY_LIMIT
from privcal.service.http_protocol import MAX_HEAD_BYTES
from tests.service.conftest import Live, open_ldp

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)


def _standard(r: httpx.Response) -> None:
    assert r.headers.get("cache-control") == "no-store", (r.status_code, r.headers)
    assert r.headers.get("x-content-type-options") == "nosniff", (r.status_code, r.headers)
    assert "server" not in r.headers, r.headers


def test_every_kind_of_answer_carries_the_standard_headers(live: Live) -> None:
    sid = open_ldp(live)
    dev = live.token("device", session=sid, subject="s1")
    with live.client("admin") as c:
        ok = c.get("/v1/datasets")
        assert ok.status_code == 200
        _standard(ok)
        missing = c.get("/v1/datasets/nope")
        assert missing.status_code == 404
        _standard(missing)
    with live.client() as c:
        anon = c.get("/v1/datasets")
        assert anon.status_code == 401
        _standard(anon)
        health = c.get("/healthz")
        assert health.status_code == 200
        _standard(health)
        ui = c.get("/ui", follow_redirects=False)
        assert ui.status_code == 303
        _standard(ui)
    with live.client(token=dev) as c:
        read = c.get(f"/v1/sessions/{sid}")  # the session-bound token's lean read
        assert read.status_code == 200
        _standard(read)
        put = c.put(f"/v1/sessions/{sid}/reports/a", json={"round": 0, "value": 1})
        assert put.status_code == 201, put.text  # the lean report path
        _standard(put)
        big = c.put(f"/v1/sessions/{sid}/reports/c", content=b" " * (REPORT_BODY_LIMIT + 1),
                    headers={"content-type": "application/json"})
        assert big.status_code == 413  # the middleware's answer, before any body is read
        _standard(big)
        again = c.put(f"/v1/sessions/{sid}/reports/b", json={"round": 0, "value": 1})
        assert again.json()["status"] == "duplicate"  # this device has reported: 200
        _standard(again)
    with live.client(token=live.token("device", session=sid, subject="s2")) as c:
        wrong = c.put(f"/v1/sessions/{sid}/reports/a", json={"round": 1, "value": 1})
        assert wrong.status_code == 409, wrong.text  # not this device's round: rejected
        _standard(wrong)


def test_the_stylesheet_keeps_its_own_caching(live: Live) -> None:
    with live.client() as c:
        r = c.get("/ui/static/app.css")
    assert r.status_code == 200 and r.headers["cache-control"].startswith("max-age")
    assert r.headers["x-content-type-options"] == "nosniff"


def test_the_protocols_own_answer_carries_them(live: Live) -> None:
    host, port = live.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * MAX_HEAD_BYTES))
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 431")
    assert b"\r\ncache-control: no-store" in head and b"\r\nx-content-type-options: nosniff" in head
