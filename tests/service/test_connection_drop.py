"""Every route of the service when PostgreSQL has dropped the connections of the server
(a restart, a failover, an idle kill): the answer is a success (the request ran on a fresh
connection) or a 503 problem document with a one-line detail — never a 500, never a driver
traceback — the next request succeeds, and nothing is recorded twice. Two ways to drop:

- ``idle``: every backend of the server is terminated while its connections sit idle (in
  the pool, kept by the charge path, the report writer's);
- ``checkout``: the backend of the first connection the request checks out of the pool is
  terminated just after the pool handed it out (past any liveness check): the request's
  first statement on it fails — a failover between checkout and use.

The route list is built from ``app.routes`` (a route with no request recipe in the role
matrix, tests/service/test_role_matrix.py, fails there); each route is called with a valid
token of every role it allows. The server's connections are told apart from those of the
other tests sharing the database by an ``application_name`` of their own: every backend of
this server is terminated, nobody else's.
"""

from __future__ import annotations

import hashlib
import json
import select
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute

from tests.service.conftest import Live, serve
from tests.service.test_role_matrix import _recipe, _setup

_PG = pytest.mark.parametrize("ledger_url", [pytest.param("postgresql",
                                                          marks=pytest.mark.postgres)],
                              indirect=True)
#: rows counted per table before and after each request (the audit chain: its head)
_TABLES = ("datasets", "charges", "charge_members", "subject_spend", "releases",
           "collection_sessions", "session_reports", "session_batches", "api_tokens",
           "idempotency_records")


def _tagged(url: str, name: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}application_name={name}"


class _Observer:
    """Reads the ledger on connections of its own (not the server's), and kills the
    server's."""

    def __init__(self, url: str, app_name: str) -> None:
        from privcal.storage import Ledger

        self.ledger = Ledger(url)
        self.url = url
        self.app_name = app_name

    def state(self) -> dict[str, int]:
        from sqlalchemy import text

        self.ledger.sequence_audit(read_only_ok=True)
        with self.ledger.engine.connect() as c:
            out = {t: int(c.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
                   for t in _TABLES}
        out["audit"] = self.ledger.head().seq
        return out

    def kill(self) -> int:
        """Terminate every backend of the server under test; how many there were."""
        from sqlalchemy import text

        with self.ledger.engine.connect() as c:
            n = c.execute(text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND application_name = :a"), {"a": self.app_name}).scalar_one()
            c.commit()
        time.sleep(0.1)  # the backends exit and close their sockets
        return int(n)


class _KillAtCheckout:
    """Counts the checkouts of the server's pool; armed with ``at = k``, terminates the
    backend of the k-th connection handed out from then on (after the engine's own
    checkout hooks: past any liveness check) and waits until its socket says so."""

    def __init__(self, obs: _Observer) -> None:
        import psycopg

        from tests.conftest import _psycopg_dsn

        self.admin = psycopg.connect(_psycopg_dsn(obs.url), autocommit=True)
        self.lock = threading.Lock()
        self.at = 0  # 0: disarmed
        self.seen = self.fired = 0

    def arm(self, at: int) -> None:
        with self.lock:
            self.at, self.seen, self.fired = at, 0, 0

    def __call__(self, dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        with self.lock:
            self.seen += 1
            if self.seen != self.at:
                return
            self.admin.execute("SELECT pg_terminate_backend(%s)",
                               (dbapi_conn.info.backend_pid,))
            self.fired += 1
        poller = select.poll()
        poller.register(dbapi_conn.pgconn.socket, select.POLLIN)
        assert poller.poll(5000), "the terminated backend's socket stayed quiet"


@pytest.fixture
def dropping(ledger_url: str) -> Iterator[tuple[Live, _Observer]]:
    name = f"privcal_drop_{uuid.uuid4().hex[:12]}"
    with serve(_tagged(ledger_url, name)) as lv:
        obs = _Observer(ledger_url, name)
        try:
            yield lv, obs
        finally:
            obs.ledger.close()


def _delta(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b[k] - a[k] for k in a if b[k] != a[k]}


def _cases(lv: Live) -> list[tuple[str, str, str | None]]:
    """(method, path, role) for every route and every role it allows (None: public)."""
    out = []
    for route in lv.app.routes:
        if not isinstance(route, APIRoute):
            continue
        roles = (route.openapi_extra or {}).get("x-privcal-roles")
        assert roles, route.path
        for method in sorted(route.methods):
            for role in sorted(roles):
                out.append((method, route.path, None if role == "public" else role))
    return out


def _request(lv: Live, ctx: dict[str, Any], method: str, path: str,
             role: str | None) -> tuple[str, dict[str, Any]]:
    """A valid request (url, httpx kwargs) for ``role``; every object it needs (a token
    to revoke, a session to close, a device or agent of its own) is made now, before the
    connections are killed."""
    toks = dict(ctx["toks"])
    if (method, path) == ("PUT", "/v1/sessions/{sid}/reports/{report_id}"):
        toks["device"] = lv.token("device", session=ctx["sid"],
                                  subject=f"dev-{uuid.uuid4().hex[:8]}")
    if (method, path) == ("PUT", "/v1/sessions/{sid}/messages"):
        ctx["agents"] += 1
        toks["agent"] = lv.token("agent", session=ctx["fid"], agent=f"ag-{ctx['agents']}")
    tok = toks[role] if role else toks["admin"] if path == "/ui/login" else None
    ctx["tok"] = tok
    url, kw = _recipe(lv, ctx, method, path, role or "admin")
    headers = dict(kw.pop("headers", {}))
    if role and path.startswith("/ui"):
        from privcal.service.ui import issue_credential, ui_key

        cred = issue_credential(ui_key(lv.accountant.ledger), str(tok).split("_")[1])
        headers["Cookie"] = f"privcal_ui={cred}"
    elif role:
        headers["Authorization"] = f"Bearer {tok}"
    return url, {"headers": headers, **kw}


def _call(lv: Live, method: str, url: str, kw: dict[str, Any]) -> Any:
    with lv.client(follow_redirects=False) as c:
        return c.request(method, url, **kw)


def _ok_or_503(r: Any, what: tuple[Any, ...]) -> None:
    """A success, or a 503 problem whose detail is one line (no traceback anywhere)."""
    assert r.status_code in (200, 201, 303) or r.status_code == 503, (*what, r.status_code,
                                                                      r.text[:2000])
    assert "Traceback" not in r.text, (*what, r.text[:2000])
    if r.status_code == 503:
        assert r.headers["content-type"] == "application/problem+json", (*what, r.text)
        doc = json.loads(r.text)
        assert doc["status"] == 503 and "\n" not in doc.get("detail", ""), (*what, doc)


@_PG
@pytest.mark.parametrize("drop", ["idle", "checkout"])
def test_every_route_after_the_server_dropped_its_connections(
        dropping: tuple[Live, _Observer], drop: str) -> None:
    from sqlalchemy import event

    lv, obs = dropping
    at_checkout = _KillAtCheckout(obs)
    event.listen(lv.accountant.ledger.engine, "checkout", at_checkout)
    ctx = _setup(lv)
    with lv.client("analyst") as c:  # agents of their own for the message route
        r = c.post("/v1/datasets/d/sessions", json={
            "method": "fedcp2-qq", "alpha": 0.2, "epsilon": 2.0, "agents": 40,
            "local_n": 200, "bins": 20, "smax": 1.0})
        assert r.status_code == 201, r.text
        ctx["fid"], ctx["agents"] = int(r.json()["id"]), 0
    ctx["toks"]["agent"] = lv.token("agent", session=ctx["fid"], agent="ag-0")
    cases = _cases(lv)
    assert len(cases) > 50
    failures: list[str] = []
    drops = ran_after_drop = killed = 0
    for method, path, role in cases:
        what = (method, path, role)
        # warm: the route's own connections (pooled, kept by the hot path, the report
        # writer's) are open and idle; and what one call of it records
        # (the previous case's kill may have left dead connections this route meets first:
        # a route that reads nothing leaves them all; its answer is judged as below)
        for _ in range(3):
            url, kw = _request(lv, ctx, method, path, role)
            before = obs.state()
            at_checkout.arm(0)
            r = _call(lv, method, url, kw)
            checkouts = at_checkout.seen
            if r.status_code in (200, 201, 303):
                break
            if r.status_code == 500 or "Traceback" in r.text:
                failures.append(f"{method} {path} as {role} (warm-up): {r.status_code} "
                                f"{r.text[:200]!r}")
            else:
                _ok_or_503(r, (*what, "warm-up"))
            assert _delta(before, obs.state()) == {}, (*what, "warm-up")
        assert r.status_code in (200, 201, 303), (*what, r.status_code, r.text)
        once = _delta(before, obs.state())

        # idle: one drop; checkout: a drop at each checkout the warm-up call made
        for k in range(1, 2 if drop == "idle" else max(2, checkouts + 1)):
            url, kw = _request(lv, ctx, method, path, role)
            before = obs.state()
            if drop == "idle":
                killed += obs.kill()  # none if no route since the last kill opened one
            else:
                at_checkout.arm(k)
            r = _call(lv, method, url, kw)
            drops += 1
            killed += at_checkout.fired
            at_checkout.arm(0)
            got = _delta(before, obs.state())
            where = f"{method} {path} as {role}" + (f", checkout {k}" if k > 1 else "")
            if r.status_code == 500 or "Traceback" in r.text:
                failures.append(f"{where}: {r.status_code} {r.text[:200]!r}")
            else:
                _ok_or_503(r, (*what, k))
            if r.status_code in (200, 201, 303):
                ran_after_drop += 1
                assert got == once, (*what, k, "recorded", got, "one call records", once)
            else:  # refused: recorded nothing, or (a COMMIT whose answer was lost) once
                assert got in ({}, once), (*what, k, "recorded", got, "one call", once)

            url, kw = _request(lv, ctx, method, path, role)  # the next call succeeds
            before = obs.state()
            r = _call(lv, method, url, kw)
            if r.status_code not in (200, 201, 303):
                failures.append(f"{where} (next call): {r.status_code} {r.text[:200]!r}")
            else:
                assert _delta(before, obs.state()) == once, (*what, k, "next call")
    assert not failures, "\n".join(failures)
    assert killed > len(cases) / 2  # (idle: a route after one that reads nothing finds none)
    head = obs.state()["audit"]
    assert lv.accountant.verify().entries == head  # `audit verify`: raises if it fails
    at_checkout.admin.close()
    print(f"{drop}: {len(cases)} cases, {drops} drops, {ran_after_drop} answered 2xx (the "
          "others 503)")


@_PG
def test_a_read_whose_driver_statement_meets_a_dropped_connection_is_a_ledger_error(
        ledger: Any, ledger_url: str) -> None:
    """Attack: a read that runs a statement on the driver connection itself (the report
    writer's stored-report probe, storage/tokens.py) after the server dropped it: a
    one-line LedgerError (the service's 503), not the driver's error (a 500); the next read
    runs on a fresh connection."""
    import psycopg
    from sqlalchemy import text

    from privcal.errors import LedgerError
    from tests.conftest import _psycopg_dsn

    with pytest.raises(LedgerError, match="lost during a read") as err:
        with ledger.read() as s:
            drv = s.connection().connection.driver_connection
            with psycopg.connect(_psycopg_dsn(ledger_url), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (drv.info.backend_pid,))
            time.sleep(0.2)
            with drv.cursor() as cur:
                cur.execute("SELECT 1")
    assert "\n" not in str(err.value)
    with ledger.read() as s:
        assert s.execute(text("SELECT 1")).scalar_one() == 1


@_PG
def test_an_idempotency_key_lock_on_a_dropped_connection_is_taken_on_a_fresh_one(
        ledger: Any, ledger_url: str) -> None:
    """Attack: the server drops the pooled connection the key lock (a PostgreSQL advisory
    lock on a pool of its own, storage/key_locks.py) takes, after the pool handed it out, and
    then the one it
    holds the lock on: the lock is taken on a fresh connection, and the lost one needs no
    unlock (its session, and lock, are gone) — no driver error either way."""
    import psycopg
    from sqlalchemy import event

    from tests.conftest import _psycopg_dsn

    admin = psycopg.connect(_psycopg_dsn(ledger_url), autocommit=True)
    armed = [True]

    def kill(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        if armed[0]:
            armed[0] = False
            admin.execute("SELECT pg_terminate_backend(%s)", (dbapi_conn.info.backend_pid,))
            time.sleep(0.2)

    digest = hashlib.sha256(b"privcal key\x00d\x00k1").digest()
    lock_id = int.from_bytes(digest[:8], "big", signed=True)
    with ledger.read():  # the schema check, unarmed
        pass
    locks = ledger._key_lock_engine()  # the key locks' own pool (red team 6)
    event.listen(locks, "checkout", kill)
    with ledger.key_lock("d", "k1"):
        assert not armed[0]  # the first connection was dropped; the lock is held anyway
        held = admin.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
            "classid = %s AND objid = %s", ((lock_id >> 32) & 0xFFFFFFFF,
                                            lock_id & 0xFFFFFFFF)).fetchall()
        assert len(held) == 1
        admin.execute("SELECT pg_terminate_backend(%s)", (held[0][0],))
        time.sleep(0.2)
    event.remove(locks, "checkout", kill)
    with ledger.key_lock("d", "k1"):  # free again
        pass
    admin.close()


def test_every_route_on_a_read_only_ledger(ledger_url: str) -> None:
    """A ledger that refuses writes — SQLite: a file made read-only (here every connection
    of the server is made ``query_only``, which fails writes with the same SQLITE_READONLY
    as a read-only file); PostgreSQL: a failover to a hot standby (here every session is
    ``default_transaction_read_only``, the same SQLSTATE 25006): every route answers a
    success (reads) or a 503 problem with a one-line detail (writes), never a 500; nothing
    is recorded; once writable again, writes succeed and the log verifies."""
    from sqlalchemy import event

    with serve(ledger_url) as lv:
        obs = _Observer(ledger_url, "")
        ctx = _setup(lv)
        ctx["agents"] = 0
        cases = _cases(lv)
        reqs = [(m, p, r, *_request(lv, ctx, m, p, r)) for m, p, r in cases]
        led = lv.accountant.ledger
        mode = {"read_only": "ON"}

        def set_mode(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
            if led.backend == "sqlite":
                dbapi_conn.execute(f"PRAGMA query_only={mode['read_only']}")
                return
            dbapi_conn.execute(f"SET default_transaction_read_only = {mode['read_only']}")
            dbapi_conn.commit()

        event.listen(led.engine, "checkout", set_mode)
        led.close_held()  # the charge path's kept connections: checked out anew
        before = obs.state()
        failures, refused = [], 0
        for method, path, role, url, kw in reqs:
            r = _call(lv, method, url, kw)
            if r.status_code == 500 or "Traceback" in r.text:
                failures.append(f"{method} {path} as {role}: {r.status_code} {r.text[:200]!r}")
                continue
            _ok_or_503(r, (method, path, role))
            if r.status_code == 503:
                refused += 1
                assert "cannot be written now" in r.json()["detail"], r.text
        assert not failures, "\n".join(failures)
        assert refused >= 10  # every write route
        assert obs.state() == before
        mode["read_only"] = "OFF"
        led.close_held()
        with lv.client("analyst") as c:
            r = c.post("/v1/datasets/d/charges", headers={"Idempotency-Key": "after"},
                       json={"cost": {"rho": "0.001"}, "purpose": "writable again"})
            assert r.status_code == 201, r.text
        assert lv.accountant.verify().entries == obs.state()["audit"]
        obs.ledger.close()
