"""Red team 22 (left then): a request beyond a worker's ``limit_concurrency`` was answered
with uvicorn's own plain-text 503 ``Service Unavailable`` — the one answer of the service
that was not a problem document, and without its standard headers. It is now the
``server-busy`` problem (``Retry-After: 1``, the connection closed)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import privcal.service.server_options as server_options
from tests.service.conftest import Live, serve


@pytest.fixture
def two_connections(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Live]:
    """The service on SQLite, a worker that takes two connections at once."""
    monkeypatch.setattr(server_options, "connection_limit", lambda: 2)
    with serve(f"sqlite:///{tmp_path}/ledger.sqlite") as lv:
        yield lv


def test_beyond_the_connection_limit_the_answer_is_a_problem_document(
        two_connections: Live) -> None:
    lv = two_connections
    assert httpx.get(f"{lv.url}/healthz", timeout=10).status_code == 200  # one: served
    host, port = lv.url.removeprefix("http://").split(":")
    idle = socket.create_connection((host, int(port)), timeout=10)  # holds one of the two
    try:
        got = httpx.get(f"{lv.url}/healthz", timeout=10)
    finally:
        idle.close()
    assert got.status_code == 503
    assert got.headers["content-type"] == "application/problem+json"
    assert got.headers["retry-after"] == "1"
    assert got.headers["connection"] == "close"
    assert "x-content-type-options" in got.headers  # the service's standard headers
    body = json.loads(got.content)
    assert body["type"] == "urn:privcal:problem:server-busy"
    assert body["status"] == 503 and "retry later" in body["detail"]
