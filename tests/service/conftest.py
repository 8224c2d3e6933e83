"""A real ``privcal serve`` application on 127.0.0.1 (a free port) per test, on SQLite and
PostgreSQL (the ``ledger_url`` fixture of tests/conftest.py), and tokens for each role."""

from __future__ import annotations

import socket
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra is part of the test extra")
import httpx
import uvicorn


@dataclass
class Live:
    """A running server: its base URL, its app, the accountant and a token per role."""

    url: str
    app: Any
    accountant: Any
    ledger_url: str
    tokens: dict[str, str] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)
    tables: list[Any] | None = None  # the ledger's tables, reflected by ledger_snapshot

    def client(self, role: str | None = None, token: str | None = None,
               **kw: Any) -> httpx.Client:
        tok = token if token is not None else (self.tokens[role] if role else None)
        headers = {"Authorization": f"Bearer {tok}"} if tok else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kw)

    def token(self, role: str, **kw: Any) -> str:
        from privcal.service.bound_tokens import create_bound_token

        new = create_bound_token(self.accountant, role, name=kw.pop("name", None),
                                 datasets=kw.pop("datasets", []), session=kw.pop("session", None),
                                 subject=kw.pop("subject", None), agent=kw.pop("agent", None),
                                 expires_in=kw.pop("expires_in", None))
        assert not kw
        return str(new.token)


def start_server(app: Any, http: Any = None) -> tuple[str, uvicorn.Server, threading.Thread]:
    """``app`` served as ``privcal serve`` serves it: uvicorn with privcal's HTTP/1.1 protocol
    (``http``: that protocol by default), on a free port of 127.0.0.1."""
    from privcal.service.server_options import uvicorn_options

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    options = uvicorn_options()
    if http is not None:
        options["http"] = http
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **options))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not th.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server, th


@contextmanager
def serve(ledger_url: str, http: Any = None) -> Iterator[Live]:
    """A server on a migrated ledger with datasets ``d`` (ρ ≤ 1, subject ε ≤ 10) and
    ``other``, and a token per role admin, auditor and analyst (granted ``d`` only)."""
    from privcal.accountant import Accountant
    from privcal.service.app import create_app
    from privcal.storage import Ledger

    led = Ledger(ledger_url)
    led.upgrade()
    acct = Accountant(led)
    acct.create_dataset("d", rho="1", subject_epsilon="10", allow_nonprivate=True)
    acct.create_dataset("other", rho="1")
    app = create_app(accountant=acct)
    url, server, th = start_server(app, http)
    lv = Live(url=url, app=app, accountant=acct, ledger_url=ledger_url)
    try:
        for role in ("admin", "auditor"):
            lv.tokens[role] = lv.token(role, name=role)
        lv.tokens["analyst"] = lv.token("analyst", name="ann", datasets=["d"])
        yield lv
    finally:
        server.should_exit = True
        th.join(timeout=30)
        led.close()


@pytest.fixture
def live(ledger_url: str) -> Iterator[Live]:
    """The :func:`serve` server, on each backend."""
    with serve(ledger_url) as lv:
        yield lv


def open_ldp(lv: Live, *, group_size: int = 4, rounds: int = 2, epsilon: float = 1.0) -> int:
    """Open an ldp-score session on ``d`` as the analyst; its id."""
    with lv.client("analyst") as c:
        r = c.post("/v1/datasets/d/sessions", json={
            "method": "ldp-score", "alpha": 0.2, "epsilon": epsilon, "rounds": rounds,
            "group_size": group_size})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])


def open_fed(lv: Live, *, agents: int = 3) -> int:
    """Open a fedcp2-qq session on ``d``; its id."""
    with lv.client("analyst") as c:
        r = c.post("/v1/datasets/d/sessions", json={
            "method": "fedcp2-qq", "alpha": 0.2, "epsilon": 2.0, "agents": agents,
            "local_n": 200, "bins": 20, "smax": 1.0})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])


def answer_fed(lv: Live, sid: int, agents: tuple[str, ...] = ("a0", "a1")) -> None:
    """``agents`` of federated session ``sid`` each send the grid's 11th point."""
    with lv.client(token=lv.token("agent", session=sid, agent=agents[0])) as c:
        grid = c.get(f"/v1/sessions/{sid}").json()["grid"]
    for a in agents:
        with lv.client(token=lv.token("agent", session=sid, agent=a)) as c:
            r = c.put(f"/v1/sessions/{sid}/messages",
                      json={"value": grid["lower"] + 10 * grid["step"]})
            assert r.status_code == 201, r.text


EXPIRED = timedelta(seconds=1)


def ledger_snapshot(lv: Live) -> dict[str, list[tuple[str, ...]]]:
    """Every row of every table of ``lv``'s ledger (reflected with SQLAlchemy's
    ``MetaData.reflect``, once per server: ``lv.tables``), each row as the ``repr`` of its
    values, sorted — two snapshots are equal iff no row was added, removed or changed. No
    table is excluded (``alembic_version`` included). Cheap: the test ledgers are small,
    and one read transaction reads them all."""
    from sqlalchemy import MetaData, select
    from sqlalchemy.exc import SAWarning

    engine = lv.accountant.ledger.engine
    if lv.tables is None:
        md = MetaData()
        with warnings.catch_warnings():  # the two expression indexes: not rows, not compared
            warnings.filterwarnings("ignore", "Skipped unsupported reflection", SAWarning)
            md.reflect(bind=engine)
        lv.tables = list(md.sorted_tables)
    with engine.connect() as conn:
        return {t.name: sorted(tuple(repr(v) for v in row) for row in conn.execute(select(t)))
                for t in lv.tables}
