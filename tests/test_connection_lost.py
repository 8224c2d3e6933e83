"""A PostgreSQL error that says the connection is gone is treated as a lost connection even
before psycopg marks the connection broken (privcal.storage.engine.connection_lost): the
connection is invalidated and a read raises its one-line LedgerError (the service's 503),
never a driver traceback (a 500) — a race seen once in CI, where a ROLLBACK on a connection
the server had just terminated failed with "sending query failed: terminating connection due
to administrator command" while psycopg's ``broken`` was still False."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from privcal.errors import LedgerError
from privcal.storage.engine import connection_lost

psycopg = pytest.importorskip("psycopg")

_pg = pytest.mark.parametrize("ledger_url", [pytest.param("postgresql",
                                                          marks=pytest.mark.postgres)],
                              indirect=True)


@pytest.mark.parametrize(("exc", "lost"), [
    (psycopg.OperationalError("sending query failed: terminating connection due to "
                              "administrator command"), True),  # libpq's own: no SQLSTATE
    (psycopg.OperationalError("consuming input failed: server closed the connection"), True),
    (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),
    (psycopg.errors.CrashShutdown("crash"), True),
    (psycopg.errors.ConnectionFailure("08006"), True),
    (psycopg.errors.QueryCanceled("canceling statement due to user request"), False),
    (psycopg.errors.SerializationFailure("could not serialize access"), False),
    (psycopg.errors.LockNotAvailable("could not obtain lock"), False),
    (psycopg.errors.UniqueViolation("duplicate key"), False),
    (psycopg.ProgrammingError("syntax error"), False),
    (ValueError("not a driver error"), False),
])
def test_which_errors_mean_the_connection_is_gone(exc: BaseException, lost: bool) -> None:
    assert connection_lost(exc) is lost


def _late_broken(monkeypatch: Any, ledger: Any) -> None:
    """psycopg that has not noticed yet: SQLAlchemy's own disconnect test says no."""
    monkeypatch.setattr(type(ledger.engine.dialect), "is_disconnect",
                        lambda self, e, conn, cur: False)


@_pg
def test_a_terminated_session_invalidates_its_connection(ledger: Any, monkeypatch: Any) -> None:
    _late_broken(monkeypatch, ledger)
    with ledger.engine.connect() as conn, pytest.raises(DBAPIError) as err:
        conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
    assert err.value.connection_invalidated
    with ledger.engine.connect() as conn:  # and the pool gives a live one next
        assert conn.execute(text("SELECT 1")).scalar() == 1


@_pg
def test_a_read_whose_session_is_terminated_is_a_one_line_error(ledger: Any,
                                                                monkeypatch: Any) -> None:
    _late_broken(monkeypatch, ledger)
    with pytest.raises(LedgerError, match="was lost during a read"), ledger.read() as s:
        s.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
    with ledger.read() as s:
        assert s.execute(text("SELECT 1")).scalar() == 1
