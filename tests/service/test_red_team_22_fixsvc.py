"""Red team 22, service F1, F2 and F3: the HTTP/1.1 connection, its response side and its
chunked bodies.

- F1: a client that stopped reading its responses held its connection (and its ASGI task)
  for ever — 64 of them made every request 503 on a worker limited to 128 descriptors. A
  connection whose writing stays paused
  :data:`~privcal.service.http_protocol.SEND_TIMEOUT_S` is now cut (shortened here), and a
  connection queues at most :data:`~privcal.service.http_protocol.MAX_PIPELINED` pipelined
  requests.
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
import time
from collections.abc import Iterator

import pytest

from tests.service.conftest import Live, ledger_snapshot, serve
from tests.service.test_red_team_21_fixsvc import _answer_or_close, _connect, _QuickBody

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)

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
