"""Red team 21, service F2, F3 and F7: the lean paths and the request body's time.

- F2: a request with two ``Authorization`` headers is unauthenticated (red team 18), but the
  lean report PUT and session read took the last header: a report with two device tokens
  was stored (201) and charged to the second's subject. They now share the middleware's
  rule (:func:`privcal.service.auth.bearer_token`).
- F3: an unexpected error on a lean path escaped to uvicorn, a bare ``text/plain`` or empty
  500 without the standard headers; it is now the whole app's 500 problem document.
- F7: a body that never came held its connection for ever, by anyone (a made-up token on
  the report PUT, or the public ``/ui/login``): 140 of them made every request 503. A body
  now has :data:`~privcal.service.http_protocol.BODY_TIMEOUT_S` after its head plus a second
  per :data:`~privcal.service.http_protocol.BODY_MIN_RATE` bytes received (shortened here).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from privcal.service.http_protocol import BoundedHttpTools
from privcal.service.problems import server_error_response
from tests.service.conftest import Live, open_ldp, serve


def _two_devices(lv: Live, sid: int) -> list[tuple[str, str]]:
    a = lv.token("device", session=sid, subject="first-dev")
    b = lv.token("device", session=sid, subject="second-dev")
    return [("Authorization", f"Bearer {a}"), ("Authorization", f"Bearer {b}")]


def test_f2_report_put_with_two_authorization_headers_is_unauthenticated(live: Live) -> None:
    sid = open_ldp(live, group_size=50)
    hdrs = [*_two_devices(live, sid), ("Content-Type", "application/json")]
    with httpx.Client(base_url=live.url, timeout=60) as c:
        # exactly a valid report: the lean path's; one with an extra key: the whole app's
        lean = c.put(f"/v1/sessions/{sid}/reports/r1", content=b'{"round":0,"value":1}',
                     headers=hdrs)
        full = c.put(f"/v1/sessions/{sid}/reports/r2",
                     content=b'{"round":0, "value":1, "x":1}', headers=hdrs)
    assert full.status_code == 401, full.text
    assert lean.status_code == 401, (lean.status_code, lean.text)
    assert lean.json()["type"] == full.json()["type"] == "urn:privcal:problem:unauthenticated"
    assert lean.headers["www-authenticate"] == full.headers["www-authenticate"]
    assert live.accountant.subject_summary("d").subjects == 0  # nothing charged
    # each token alone still reports (the rule refuses two headers, not these tokens)
    with httpx.Client(base_url=live.url, timeout=60) as c:
        one = c.put(f"/v1/sessions/{sid}/reports/r1", content=b'{"round":0,"value":1}',
                    headers=[hdrs[0], hdrs[2]])
    assert one.status_code == 201, one.text


def test_f2_session_read_with_two_authorization_headers_is_unauthenticated(
        live: Live) -> None:
    sid = open_ldp(live, group_size=50)
    hdrs = _two_devices(live, sid)
    with httpx.Client(base_url=live.url, timeout=60) as c:
        lean = c.get(f"/v1/sessions/{sid}", headers=hdrs)
        full = c.get(f"/v1/sessions/{sid}?a=1", headers=hdrs)
        one = c.get(f"/v1/sessions/{sid}", headers=hdrs[:1])
    assert full.status_code == 401, full.text
    assert lean.status_code == 401, (lean.status_code, lean.text[:200])
    assert lean.json()["type"] == "urn:privcal:problem:unauthenticated"
    assert one.status_code == 200, one.text


def _assert_app_500(r: httpx.Response) -> None:
    """``r`` is the whole app's 500: server_error_response's body and headers."""
    expected = server_error_response(None, RuntimeError())
    assert r.status_code == 500, (r.status_code, r.text)
    assert r.content == bytes(expected.body)
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_f3_unexpected_error_on_the_lean_paths_is_the_apps_500(
        live: Live, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    sid = open_ldp(live, group_size=50)
    dev = live.token("device", session=sid, subject="s1")

    async def broken_submit(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("the report writer broke")

    def broken_body(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("the session read broke")

    monkeypatch.setattr(live.app.state.batcher, "submit_async", broken_submit)
    monkeypatch.setattr(live.app.state.public_states, "body", broken_body)
    with live.client(token=dev) as c:
        put = c.put(f"/v1/sessions/{sid}/reports/r1", content=b'{"round":0,"value":1}',
                    headers={"Content-Type": "application/json"})
        get = c.get(f"/v1/sessions/{sid}")
        _assert_app_500(put)
        _assert_app_500(get)
        # the connection was not dropped: the next request on it is answered
        assert c.get("/healthz").status_code == 200
    assert "the report writer broke" in caplog.text and "the session read broke" in caplog.text


class _QuickBody(BoundedHttpTools):
    """A body has 1 s after its head, plus a second per 250 bytes received."""

    body_timeout = 1.0
    body_min_rate = 250


@pytest.fixture
def quick(ledger_url: str) -> Iterator[Live]:
    with serve(ledger_url, http=_QuickBody) as lv:
        yield lv


def _connect(lv: Live) -> socket.socket:
    host, port = lv.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _answer_or_close(s: socket.socket) -> bytes:
    """All the server sends until it closes (TimeoutError after 30 s of silence)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


MADE_UP = b"pcl_0000000000000000_" + b"A" * 43


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_f7_a_stalled_body_is_cut_and_the_service_still_answers(quick: Live) -> None:
    report = _connect(quick)
    report.sendall(b"PUT /v1/sessions/1/reports/a HTTP/1.1\r\nHost: x\r\n"
                   b"Authorization: Bearer " + MADE_UP + b"\r\n"
                   b"Content-Type: application/json\r\nContent-Length: 30\r\n\r\n{\"round\"")
    login = _connect(quick)
    login.sendall(b"POST /ui/login HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/x-www-form-urlencoded\r\n"
                  b"Content-Length: 200\r\n\r\ntoken=pcl_")
    t0 = time.monotonic()
    for s in (report, login):
        answer = _answer_or_close(s)  # before the fix: TimeoutError (held for ever)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
        head, _, body = answer.partition(b"\r\n\r\n")
        assert json.loads(body)["type"] == "urn:privcal:problem:body-timeout"
        assert b"cache-control: no-store" in head.lower()
        s.close()
    assert time.monotonic() - t0 < 25  # 1 s + 8 bytes' credit, with a wide margin
    # nothing was stored, and a normal request on a new connection is served
    sid = open_ldp(quick, group_size=50)
    dev = quick.token("device", session=sid, subject="s1")
    with quick.client(token=dev) as c:
        r = c.put(f"/v1/sessions/{sid}/reports/r1", json={"round": 0, "value": 1})
        assert r.status_code == 201, r.text
        assert c.get("/healthz").status_code == 200
    assert quick.accountant.subject_summary("d").subjects == 1


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_f7_a_slow_but_steady_upload_is_served(quick: Live) -> None:
    """An upload that takes 3× the base timeout (its head sent alone first), averaging 8×
    the minimum rate, is not cut."""
    scores = np.linspace(0, 1, 700).round(6).tolist()
    body = json.dumps({"method": "split", "params": {"alpha": 0.1},
                       "scores": scores}).encode()
    assert len(body) >= 6000  # 3 s at 2000 B/s
    s = _connect(quick)
    s.sendall(b"POST /v1/datasets/d/calibrations?dry_run=true HTTP/1.1\r\nHost: x\r\n"
              b"Authorization: Bearer " + quick.tokens["analyst"].encode() + b"\r\n"
              b"Content-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    t0 = time.monotonic()
    for i in range(0, len(body), 500):
        time.sleep(0.25)
        s.sendall(body[i:i + 500])
    assert time.monotonic() - t0 > 1.5 * _QuickBody.body_timeout  # past the base timeout
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    assert data.startswith(b"HTTP/1.1 200 "), data[:300]
    s.close()


class _QuickFastBody(BoundedHttpTools):
    """A body has 1 s after its head, plus a second per MiB received."""

    body_timeout = 1.0
    body_min_rate = 1024 * 1024


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_f7_time_the_server_does_not_read_is_not_the_clients(
        ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 MiB body sent at once to an app that asks for it only 3 s later (its token check
    is slow): uvicorn stops reading past 64 KiB, so the body is late by the clock — but not
    by the client's fault, and it is served."""
    import threading

    import privcal.storage.tokens as tokens

    real = tokens.authenticate

    def slow_authenticate(*a: Any, **k: Any) -> Any:
        time.sleep(3.0)  # three body timeouts, during which the server reads nothing
        return real(*a, **k)

    monkeypatch.setattr(tokens, "authenticate", slow_authenticate)
    body = b'{"x": "' + b"a" * (4 * 1024 * 1024) + b'"}'
    with serve(ledger_url, http=_QuickFastBody) as lv:
        s = _connect(lv)
        head = (b"POST /v1/datasets/d/charges HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + lv.tokens["analyst"].encode() + b"\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        sender = threading.Thread(target=s.sendall, args=(head + body,), daemon=True)
        sender.start()
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, data  # closed without an answer
            data += chunk
        sender.join(timeout=30)
        s.close()
    # the route's own answer to this body (an unknown field), not the body timeout's
    assert data.startswith(b"HTTP/1.1 422 "), data[:300]


async def _lifespan(receive: Any, send: Any) -> None:
    """The lifespan protocol of a bare test app (uvicorn's startup and shutdown)."""
    while True:
        m = await receive()
        if m["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        else:
            await send({"type": "lifespan.shutdown.complete"})
            return


def test_f7_a_client_waiting_for_100_continue_is_timed_from_the_100() -> None:
    """The review of red team 21 (R4): the clock started again only when a deadline found
    the server not reading, not when it began to: an app that asked for the body 1.9 body
    timeouts after the head cut a client that answered its ``100 Continue`` at once. The
    clock now starts at the app's first read; a client still silent after the 100 is cut."""
    import asyncio

    from tests.service.conftest import start_server

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        await asyncio.sleep(1.9)  # busy before it reads the body
        body = b""
        while True:
            m = await receive()
            if m["type"] != "http.request":
                return
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    url, server, th = start_server(app, _QuickBody)
    host, port = url.split("//")[1].split(":")
    try:
        answers = []
        for send_body in (True, False):
            s = socket.create_connection((host, int(port)))
            s.settimeout(10)
            s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                      b"Expect: 100-continue\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")
            if send_body:
                time.sleep(0.15)  # a round trip
                s.sendall(b"hello")
            got = b""
            while not got.endswith(b"hello"):  # the echo, or all before the server closes
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
            answers.append(got)
            s.close()
    finally:
        server.should_exit = True
        th.join(timeout=10)
    assert answers[0].startswith(b"HTTP/1.1 200 ") and answers[0].endswith(b"hello"), answers
    assert answers[1].startswith(b"HTTP/1.1 408 "), answers


class _QuickRateBody(BoundedHttpTools):
    """A body has 1 s after its head, plus a second per 200 000 bytes received."""

    body_timeout = 1.0
    body_min_rate = 200_000


def test_f7_bursts_past_the_buffer_do_not_restart_the_clock() -> None:
    """The review of the review (N1): a client sending 66 KB bursts — past uvicorn's 64 KiB
    buffer, so each one paused the server until the app read it — had the clock restarted at
    every resume and was never cut below the minimum rate. A pause now only stops the
    clock: 66 KB every 0.9 s (73 KB/s, under 200 KB/s) is cut with a 408, 66 KB every 0.08 s
    (825 KB/s: room for a loaded machine) is served."""
    import asyncio

    from tests.service.conftest import start_server

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        n = 0
        while True:  # the app reads its body as it comes
            m = await receive()
            if m["type"] != "http.request":
                return
            n += len(m.get("body", b""))
            if not m.get("more_body"):
                break
        await asyncio.sleep(0)
        body = str(n).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    url, server, th = start_server(app, _QuickRateBody)
    host, port = url.split("//")[1].split(":")
    total, answers = 10 * 66_000, []
    try:
        for period in (0.9, 0.08):
            s = socket.create_connection((host, int(port)))
            s.sendall(f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {total}\r\n\r\n".encode())
            got, sent = b"", 0
            s.settimeout(period)
            try:
                while sent < total and not got:
                    s.sendall(b"x" * 66_000)
                    sent += 66_000
                    try:
                        got = s.recv(1000)  # an answer (the 408) before the body is sent
                    except TimeoutError:
                        pass
                s.settimeout(10)
                while b"\r\n\r\n" not in got:
                    chunk = s.recv(1000)
                    if not chunk:
                        break
                    got += chunk
            except OSError:  # cut while sending: the answer was written first
                pass
            answers.append((sent, got))
            s.close()
    finally:
        server.should_exit = True
        th.join(timeout=10)
    (slow_sent, slow), (fast_sent, fast) = answers
    assert slow.startswith(b"HTTP/1.1 408 ") and slow_sent < total, answers
    assert fast.startswith(b"HTTP/1.1 200 ") and fast_sent == total, answers
