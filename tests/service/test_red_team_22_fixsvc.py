"""Red team 22, service F1, F2 and F3: the HTTP/1.1 connection, its response side and its
chunked bodies.

- F1: a client that stopped reading its responses held its connection (and its ASGI task)
  for ever — 64 of them made every request 503 on a worker limited to 128 descriptors. A
  connection whose writing stays paused
  :data:`~privcal.service.http_protocol.SEND_TIMEOUT_S` is now cut (shortened here), and a
  connection queues at most :data:`~privcal.service.http_protocol.MAX_PIPELINED` pipelined
  requests.
  Its review, R1: the clock was the pause's length, which for an answer written at once
  lasts until nearly all of it is sent — a client steadily reading a large answer was cut;
  the client must now take
  :data:`~privcal.service.http_protocol.SEND_MIN_RATE` bytes a second of what waits.
- F2: a chunked body that never ended (the client went away, or the body timer cut it) was
  run as if complete: a charge written for a request its client was told was not complete.
- F3: trailer fields of a chunked request were appended to its headers (a request whose head
  had no token was authenticated by its trailer), and ``Transfer-Encoding: gzip, chunked``
  was read as if the body were not gzip-coded; trailers are now ignored and any transfer
  coding but ``chunked`` alone is answered 501.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import httpx
import pytest

from privcal.service.http_protocol import MAX_PIPELINED, BoundedHttpTools
from tests.service.conftest import Live, ledger_snapshot, serve, start_server
from tests.service.test_red_team_21_fixsvc import (
    _answer_or_close,
    _connect,
    _lifespan,
    _QuickBody,
)

_SQLITE = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)

_CHARGE = b'{"cost":{"rho":"0.001"},"purpose":"cut"}'


def _charge_head(key: bytes, token: bytes | None = None,
                 coding: bytes = b"chunked") -> bytes:
    auth = b"" if token is None else b"Authorization: Bearer " + token + b"\r\n"
    key_line = b"" if not key else b"Idempotency-Key: " + key + b"\r\n"
    return (b"POST /v1/datasets/d/charges HTTP/1.1\r\nHost: x\r\n" + auth +
            b"Content-Type: application/json\r\nConnection: close\r\n" + key_line +
            b"Transfer-Encoding: " + coding + b"\r\n\r\n")


def _wait_logged(caplog: pytest.LogCaptureFixture, needle: str) -> str:
    """The access-log line containing ``needle``, once the server wrote it (within 30 s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for rec in caplog.records:
            if rec.name == "privcal.access" and needle in rec.getMessage():
                return rec.getMessage()
        time.sleep(0.02)
    raise AssertionError(f"no access-log line with {needle!r}")


@pytest.fixture
def quick(ledger_url: str) -> Iterator[Live]:
    """A server whose request body has 1 s after its head (red team 21's ``_QuickBody``)."""
    with serve(ledger_url, http=_QuickBody) as lv:
        yield lv


@_SQLITE
def test_f2_a_chunked_body_cut_before_its_last_chunk_is_not_run(
        quick: Live, caplog: pytest.LogCaptureFixture) -> None:
    """The whole JSON in one chunk, the terminating ``0`` chunk never sent: the body timer
    cuts the request (408, "not complete in time") — and nothing is charged (before: the
    charge was written after the 408, the access log saying 201)."""
    caplog.set_level(logging.INFO, logger="privcal.access")
    before = ledger_snapshot(quick)
    s = _connect(quick)
    s.sendall(_charge_head(b"f2-cut", quick.tokens["analyst"].encode())
              + b"%x\r\n" % len(_CHARGE) + _CHARGE + b"\r\n")
    answer = _answer_or_close(s)
    s.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
    line = _wait_logged(caplog, "POST ")  # the middleware is done with the request
    assert " 201 " not in line, line
    assert ledger_snapshot(quick) == before
    # the same request, complete, is charged: the cut was what stopped it
    with quick.client("analyst") as c:
        r = c.post("/v1/datasets/d/charges", content=_CHARGE,
                   headers={"Idempotency-Key": "f2-cut", "Content-Type": "application/json"})
    assert r.status_code == 201, r.text


def _raw(lv: Live, data: bytes) -> tuple[bytes, dict[str, object] | None]:
    """Send ``data`` on a new connection; the status line and the JSON body of the answer
    (the server closes after it: ``Connection: close``)."""
    s = _connect(lv)
    s.sendall(data)
    answer = _answer_or_close(s)
    s.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], json.loads(body) if body.startswith(b"{") else None


def _chunked(body: bytes, trailer: bytes = b"") -> bytes:
    return b"%x\r\n" % len(body) + body + b"\r\n0\r\n" + trailer + b"\r\n"


@_SQLITE
def test_f3_trailer_fields_are_not_headers(live: Live) -> None:
    """A token or an Idempotency-Key sent only in a chunked body's trailer is not the
    request's (before: 201, charged under the trailer's key; the audit head read by an
    auditor token in a trailer)."""
    before = ledger_snapshot(live)
    analyst, auditor = live.tokens["analyst"].encode(), live.tokens["auditor"].encode()
    status, doc = _raw(live, _charge_head(b"") + _chunked(
        _CHARGE, b"Authorization: Bearer " + analyst + b"\r\nIdempotency-Key: f3-t\r\n"))
    assert status.startswith(b"HTTP/1.1 401 "), (status, doc)
    status, doc = _raw(live, _charge_head(b"", analyst) + _chunked(
        _CHARGE, b"Idempotency-Key: f3-t\r\n"))
    assert status.startswith(b"HTTP/1.1 4"), (status, doc)  # no key: refused
    assert doc is not None and "idempotency" in json.dumps(doc).lower(), doc
    status, doc = _raw(live, b"GET /v1/audit/head HTTP/1.1\r\nHost: x\r\n"
                       b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"0\r\nAuthorization: Bearer " + auditor + b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 401 "), (status, doc)
    assert ledger_snapshot(live) == before
    # in the head, the same fields (and a trailer of anything else) are served
    status, doc = _raw(live, _charge_head(b"f3-t", analyst) + _chunked(
        _CHARGE, b"X-Checksum: 1\r\n"))
    assert status.startswith(b"HTTP/1.1 201 "), (status, doc)


@_SQLITE
@pytest.mark.parametrize("coding", [b"gzip, chunked", b"GZIP,chunked",
                                    b"identity\r\nTransfer-Encoding: chunked"])
def test_f3_a_transfer_coding_other_than_chunked_is_not_implemented(
        live: Live, coding: bytes) -> None:
    """``Transfer-Encoding: gzip, chunked``: the body is gzip-coded, which the service does
    not decode — 501 and nothing written (before: the coded bytes read as the JSON body,
    201, charged)."""
    before = ledger_snapshot(live)
    status, doc = _raw(live, _charge_head(b"f3-te", live.tokens["analyst"].encode(), coding)
                       + _chunked(_CHARGE))
    assert status.startswith(b"HTTP/1.1 501 "), (status, doc)
    assert doc is not None and doc["type"] == "urn:privcal:problem:transfer-coding-not-implemented"
    assert ledger_snapshot(live) == before
    status, doc = _raw(live, _charge_head(b"f3-te", live.tokens["analyst"].encode(),
                                          b"Chunked") + _chunked(_CHARGE))
    assert status.startswith(b"HTTP/1.1 201 "), (status, doc)  # chunked alone, any case


class _QuickSend(BoundedHttpTools):
    """Writing may stay paused 1 s; each connection is noted (the test reads its state)."""

    send_timeout = 1.0
    seen: ClassVar[list[BoundedHttpTools]] = []

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.seen.append(self)


class _Noted(BoundedHttpTools):
    """The default timeouts; each connection is noted."""

    seen: ClassVar[list[BoundedHttpTools]] = []

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.seen.append(self)


def _until(cond: Callable[[], bool], what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        time.sleep(0.02)


def _not_reading(url: str) -> socket.socket:
    """A connection whose client reads (almost) nothing: a tiny receive buffer."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.connect((host, int(port)))
    return s


_BIG = 32 * 1024 * 1024  # more than every buffer between the app and the client


def _big_app(finished: list[str]) -> Any:
    """A bare app answering every GET with :data:`_BIG` bytes, 1 MiB a send; ``finished``
    gets each request's path when its app returns."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(_BIG).encode())]})
        piece = b"x" * (1024 * 1024)
        for i in range(_BIG // len(piece)):
            await send({"type": "http.response.body", "body": piece,
                        "more_body": i < _BIG // len(piece) - 1})
        finished.append(scope["path"])

    return app


def test_f1_a_client_that_does_not_read_its_response_is_cut() -> None:
    """A client that stops reading a large response: the connection and the request's task
    were held until the client went away; the connection is now reset once writing has
    stayed paused ``send_timeout`` (1 s here), and the app's ``send`` returns."""
    finished: list[str] = []
    _QuickSend.seen.clear()
    url, server, th = start_server(_big_app(finished), _QuickSend)
    try:
        s = _not_reading(url)
        s.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        _until(lambda: bool(finished), "the app's task ended")  # before: held for ever
        conn = _QuickSend.seen[0]
        _until(lambda: conn.transport.is_closing(), "the connection closed")
        assert not server.server_state.tasks
        _until(lambda: not server.server_state.connections, "the connection was let go")
        got = b""
        try:
            while chunk := s.recv(1 << 20):
                got += chunk
        except ConnectionResetError:
            pass
        assert got.startswith(b"HTTP/1.1 200 ") and len(got) < _BIG  # cut short
        s.close()
        # a reading client is served the whole response
        with httpx.Client(base_url=url, timeout=60) as c:
            assert len(c.get("/b").content) == _BIG
    finally:
        server.should_exit = True
        th.join(timeout=10)


class _QuickSendUnpaused(_QuickSend):
    """Writing never pauses (a buffer above any response), idle connections closed after
    0.5 s: a response's end sits in the transport's buffer when the connection is closed."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=1 << 30)
        self.timeout_keep_alive = 0.5


@pytest.mark.parametrize("connection", [b"close", b"keep-alive"])
def test_f1_a_closed_connection_whose_client_does_not_read_is_let_go(
        connection: bytes) -> None:
    """A connection closed (``Connection: close``, or idle after its response) with bytes
    still buffered waited for the client to read them: for ever, if it never did (below
    the high-water mark, writing was not paused). The send clock now runs until then."""
    finished: list[str] = []
    url, server, th = start_server(_big_app(finished), _QuickSendUnpaused)
    try:
        s = _not_reading(url)
        s.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: " + connection + b"\r\n\r\n")
        _until(lambda: bool(finished), "the response was written")
        _until(lambda: not server.server_state.connections, "the connection was let go")
        s.close()
    finally:
        server.should_exit = True
        th.join(timeout=10)


def test_f1_a_client_gone_during_a_pipelined_response_leaves_no_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    """Three pipelined GETs, the client gone while the first is being written: uvicorn told
    only the last request (queued) of the lost connection; the first, released from its
    wait, wrote on the closed transport — "Exception in ASGI application" in the log."""
    finished: list[str] = []
    _Noted.seen.clear()
    url, server, th = start_server(_big_app(finished), _Noted)
    errors = logging.getLogger("uvicorn.error")  # uvicorn's own: not propagated to the root
    errors.addHandler(caplog.handler)
    try:
        s = _not_reading(url)
        s.sendall(b"".join(b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(3)))
        _until(lambda: bool(_Noted.seen) and _Noted.seen[0].flow.write_paused,
               "the server's writing paused")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # reset: the client is gone
        _until(lambda: not server.server_state.tasks, "the request's task ended")
    finally:
        server.should_exit = True
        th.join(timeout=10)
        errors.removeHandler(caplog.handler)
    assert "Exception in ASGI application" not in caplog.text, caplog.text[-3000:]
    assert finished == ["/0"]  # its sends returned; the queued requests were never run


@_SQLITE
def test_f1_pipelined_requests_past_the_limit_are_not_read(live: Live) -> None:
    """40 pipelined ``GET /healthz`` on one connection: 1 answered + MAX_PIPELINED queued,
    the last with ``Connection: close``; the rest is not read."""
    s = _connect(live)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 40)
    got = _answer_or_close(s)
    s.close()
    assert got.count(b"HTTP/1.1 200 ") == 1 + MAX_PIPELINED, got[-500:]
    last = got.rpartition(b"HTTP/1.1 200 ")[2]
    assert b"connection: close" in last.lower()
    with live.client() as c:  # the service answers
        assert c.get("/healthz").status_code == 200


_ONE = 2 * 1024 * 1024  # one answer, written at once: far more than the kernel buffers


async def _one_write_app(scope: Any, receive: Any, send: Any) -> None:
    """A bare app answering every GET with :data:`_ONE` bytes in one ``send`` (as a
    ``JSONResponse`` does)."""
    if scope["type"] == "lifespan":
        return await _lifespan(receive, send)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(_ONE).encode())]})
    await send({"type": "http.response.body", "body": b"x" * _ONE})


class _QuickSendSmallBuffer(_QuickSend):
    """Writing may wait 0.25 s for 4 KiB/s; the kernel's send buffer is 64 KiB, so nearly
    all of an answer written at once waits in asyncio's buffer, writing paused."""

    send_timeout = 0.25

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)


def _read_steadily(url: str, connection: bytes) -> tuple[bytes, bytes, float]:
    """GET / read 8 KiB at a time, 10 ms apart (at most 800 KiB/s), until the whole
    :data:`_ONE` bytes, the end or a reset: the answer's head, its body and the seconds."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    s.connect((host, int(port)))
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: " + connection + b"\r\n\r\n")
    got, start = b"", time.monotonic()
    try:
        while len(got.partition(b"\r\n\r\n")[2]) < _ONE and (chunk := s.recv(8192)):
            got += chunk
            time.sleep(0.01)  # 2 MiB take 2.6 s or more
    except ConnectionResetError:
        pass
    took = time.monotonic() - start
    s.close()
    head, _, body = got.partition(b"\r\n\r\n")
    return head, body, took


@pytest.mark.parametrize("connection", [b"keep-alive", b"close"])
def test_r1_a_client_reading_a_one_write_answer_steadily_is_not_cut(
        connection: bytes) -> None:
    """The review of red team 22, R1: the send clock was the length of the pause, and one
    write pauses until nearly all of it is sent — a client reading a 2 MiB answer at 39 KiB/s
    was cut after 20 s. A client reading :data:`_ONE` bytes at up to 800 KiB/s (far above
    4 KiB/s), for many times ``send_timeout``, now gets all of it (before: reset at 0.25 s,
    with and without ``Connection: close``)."""
    url, server, th = start_server(_one_write_app, _QuickSendSmallBuffer)
    try:
        head, body, took = _read_steadily(url, connection)
    finally:
        server.should_exit = True
        th.join(timeout=10)
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert len(body) == _ONE, (len(body), took)
    assert took > 4 * _QuickSendSmallBuffer.send_timeout  # the clock ran several times over


class _QuickSendFastRate(_QuickSendSmallBuffer):
    """A minimum rate of 4 MiB/s: 1 MiB to take in each 0.25 s."""

    send_min_rate = 4 * 1024 * 1024


def test_r1_a_client_reading_below_the_minimum_rate_is_cut() -> None:
    """The same reader (at most 800 KiB/s) under a minimum rate of 4 MiB/s is cut: the rule
    is the rate, not whether the client reads at all."""
    url, server, th = start_server(_one_write_app, _QuickSendFastRate)
    try:
        head, body, _ = _read_steadily(url, b"keep-alive")
    finally:
        server.should_exit = True
        th.join(timeout=10)
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert len(body) < _ONE
