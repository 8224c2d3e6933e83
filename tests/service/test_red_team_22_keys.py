"""Red team 22, service F4: an Idempotency-Key with blanks at its end was another key than
the same key without them — the same charge sent under ``K`` and under ``K␠␠`` (as a proxy
that trims one attempt's value, as RFC 9110 lets it, produces) was recorded twice. A key
with a blank at either end is now refused, 422, nothing charged (a raw socket: httpx will
not send such a value)."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest

from tests.service.conftest import Live

BODY = b'{"cost": {"rho": "0.01"}}'


def _post(live: Live, key: bytes) -> tuple[int, dict[str, object]]:
    u = urlsplit(live.url)
    head = (f"POST /v1/datasets/d/charges HTTP/1.1\r\nHost: {u.hostname}\r\n"
            f"Authorization: Bearer {live.tokens['analyst']}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(BODY)}\r\nConnection: close\r\n"
            ).encode() + b"Idempotency-Key: " + key + b"\r\n\r\n"
    with socket.create_connection((u.hostname, u.port)) as s:
        s.sendall(head + BODY)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    status, _, rest = got.partition(b"\r\n")
    return int(status.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2] or b"{}")


@pytest.mark.parametrize("key", [b"k-1  ", b"k-1\t", b"k-1 \t "])
def test_a_key_with_a_blank_at_its_end_is_refused(live: Live, key: bytes) -> None:
    status, doc = _post(live, key)
    assert status == 422, doc
    assert doc["detail"] == ("Idempotency-Key has a blank at its start or end (a proxy may "
                             "trim it, making a retry another key); nothing was done")
    assert live.accountant.budget("d").charges == 0
    assert [_post(live, b"k-1")[0] for _ in range(2)] == [201, 200]  # the key itself: once
    assert live.accountant.budget("d").charges == 1
