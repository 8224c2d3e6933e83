"""The request head is bounded in size and in time (red team 18, httpsec F1/F2).

One unauthenticated connection sending a 100 MiB header froze every other client for 28 s
(uvicorn's httptools protocol appends each received piece to what it read, on the event
loop), and connections that sent part of a head and then nothing were never closed (~20 000
of them exhausted the file descriptors). privcal's protocol
(:mod:`privcal.service.http_protocol`) answers 431 past 32 KiB of head and closes a
connection whose head is not complete in time (408 if it sent part of one).
"""

from __future__ import annotations

import socket
import time
from typing import Any

import numpy as np
import pytest

from privcal.service.http_protocol import MAX_HEAD_BYTES, BoundedHttpTools
from tests.service.conftest import Live, serve

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)


class _Quick(BoundedHttpTools):
    head_timeout = 0.5


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def _read_all(s: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return out


def _response(s: socket.socket) -> bytes:
    """One whole response read from ``s`` (its head, then Content-Length bytes of body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += s.recv(65536)
    return head + b"\r\n\r\n" + body


def _send_head(url: str, first: bytes, filler: int) -> tuple[bytes, int]:
    """Send ``first`` then ``filler`` bytes of ``a`` (64 KiB at a time) until the server
    closes; (its answer, bytes sent)."""
    s = _connect(url)
    sent = 0
    try:
        s.sendall(first)
        piece = b"a" * 65536
        while sent < filler:
            s.sendall(piece)
            sent += len(piece)
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = _read_all(s)
    s.close()
    return answer, sent


def test_a_huge_header_or_url_is_refused_after_its_limit(live: Live) -> None:
    for first in (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ", b"GET /healthz?q="):
        t0 = time.monotonic()
        answer, sent = _send_head(live.url, first, 64 * 1024 * 1024)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert b"urn:privcal:problem:header-too-large" in answer
        # refused long before the 64 MiB were sent (the socket buffers hold a few MiB)
        assert sent < 16 * 1024 * 1024 and time.monotonic() - t0 < 30
    with live.client() as c:
        assert c.get("/healthz").status_code == 200


def test_a_head_just_under_the_limit_and_large_bodies_are_served(live: Live) -> None:
    with live.client("analyst") as c:
        pad = "x" * (MAX_HEAD_BYTES - 2048)
        assert c.get("/healthz", headers={"X-Pad": pad}).status_code == 200
        scores = np.linspace(0, 1, 20001).tolist()  # a ~400 KB body sent at once
        r = c.post("/v1/datasets/d/calibrations?dry_run=true",
                   json={"method": "split", "params": {"alpha": 0.1}, "scores": scores})
        assert r.status_code == 200, r.text
        # keep-alive: the same connection again, after longer than nothing
        assert c.get("/healthz", headers={"X-Pad": pad}).status_code == 200


@pytest.fixture
def quick(ledger_url: str) -> Any:
    with serve(ledger_url, http=_Quick) as lv:
        yield lv


def test_a_slow_or_silent_connection_is_closed(quick: Live) -> None:
    partial = _connect(quick.url)
    partial.sendall(b"GET /healthz HTTP/1.1\r\nHo")
    silent = _connect(quick.url)
    t0 = time.monotonic()
    answer = _read_all(partial)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert _read_all(silent) == b""  # closed without a word
    assert time.monotonic() - t0 < 5
    partial.close()
    silent.close()


def test_a_kept_alive_connection_outlives_the_head_timeout(quick: Live) -> None:
    s = _connect(quick.url)
    req = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    s.sendall(req)
    assert _response(s).startswith(b"HTTP/1.1 200 ")
    time.sleep(1.0)  # twice the head timeout, less than uvicorn's keep-alive
    s.sendall(req)
    assert _response(s).startswith(b"HTTP/1.1 200 ")
    # a head trickled on that connection is cut off like any other
    s.sendall(b"GET /healthz HTTP/1.1\r\n")
    assert _read_all(s).startswith(b"HTTP/1.1 408 ")
    s.close()


def test_unequal_sizes_are_judged_on_every_size(live: Live) -> None:
    """httpsec F6: 1 000 sizes whose first 101 were equal were planned as equal ones."""
    sizes = [100] * 101 + list(range(1, 900))
    with live.client("analyst") as c:
        r = c.post("/v1/fed/plan", json={"local_n": sizes, "alpha": 0.1})
    assert r.status_code == 422 and "unequal local sizes for at most 100" in r.text, r.text


def test_an_integer_past_the_digit_limit_is_invalid_input(live: Live) -> None:
    """httpsec F8: a 5 000-digit JSON integer was a generic 400."""
    with live.client("analyst") as c:
        r = c.post("/v1/fed/plan", content=b'{"local_n": 1' + b"0" * 5000 + b', "alpha": 0.1}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["type"].endswith("invalid-input"), r.text[:300]


def test_two_authorization_headers_authenticate_nobody(live: Live) -> None:
    """httpsec F8: the last of two headers authenticated; proxies read the first."""
    with live.client() as c:
        r = c.get("/v1/audit/head", headers=[
            ("Authorization", f"Bearer {live.tokens['analyst']}"),
            ("Authorization", f"Bearer {live.tokens['auditor']}")])
        assert r.status_code == 401
        ok = c.get("/v1/audit/head",
                   headers={"Authorization": f"Bearer {live.tokens['auditor']}"})
        assert ok.status_code == 200


def test_the_ui_forms_refuse_another_site(live: Live) -> None:
    """httpsec F5: a page on another port of this host could post /ui/verify (a full
    verification) with a logged-in auditor's cookie: SameSite ignores ports."""
    with live.client(follow_redirects=False) as c:
        assert c.post("/ui/login", data={"token": live.tokens["auditor"]}).status_code == 303
        here = live.url.removeprefix("http://")
        for headers in ({"Sec-Fetch-Site": "same-site"}, {"Sec-Fetch-Site": "cross-site"},
                        {"Origin": "http://127.0.0.1:1"}, {"Origin": "null"}):
            r = c.post("/ui/verify", headers=headers)
            assert r.status_code == 403 and "another site" in r.text, headers
            assert c.post("/ui/logout", headers=headers).status_code == 403
            # red team 22, ui F2: nor a login, which swapped the session for another token's
            r = c.post("/ui/login", data={"token": live.tokens["admin"]}, headers=headers)
            assert r.status_code == 403 and "set-cookie" not in r.headers, headers
        for headers in ({"Sec-Fetch-Site": "same-origin"}, {"Origin": f"http://{here}"}, {}):
            r = c.post("/ui/verify", headers=headers)
            assert r.status_code == 200 and "verify-result" in r.text, headers
