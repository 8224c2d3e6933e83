"""``COPY … FROM STDIN`` on a write's driver connection (PostgreSQL), its errors raised as the
hot path's statements raise theirs.

The bulk writes (per-subject charges, a session batch's reports) COPY through psycopg's own
cursor, past SQLAlchemy: a driver error there — the server restarted, the backend
terminated, a ``statement_timeout`` — reached the caller as a bare ``psycopg`` exception,
which the write's retry (:meth:`~privcal.storage.transactions.LedgerTransactions._retry`)
did not know: a connection lost before COMMIT was not retried, and the CLI printed a
traceback (red team 12). Here it becomes SQLAlchemy's ``DBAPIError`` with the connection
invalidated if it is gone (:meth:`~privcal.storage.statements.HotStatements._db_error`), so
the write is retried on a fresh connection or refused in one line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection

from privcal.storage.engine import begin_pending
from privcal.storage.statements import HotStatements

__all__ = ["copy_in"]


def copy_in(conn: Connection, sql: str, block: str | bytes | None = None,
            rows: Iterable[tuple[Any, ...]] | None = None) -> None:
    """Run ``sql`` (a ``COPY … FROM STDIN``) on ``conn``'s driver connection, sending
    ``block`` (pre-formatted COPY text) or else ``rows`` (escaped by psycopg, row by row),
    inside the write's transaction: a ``BEGIN`` still deferred is sent first (as
    :meth:`~privcal.storage.statements.HotStatements._driver` does; a COPY first in a
    write would otherwise run in autocommit mode)."""
    raw = conn.connection.driver_connection
    try:
        begin_pending(conn)
        with raw.cursor() as cur, cur.copy(sql) as cp:  # type: ignore[union-attr]
            if block is not None:
                cp.write(block)
            else:
                for row in rows or ():
                    cp.write_row(row)
    except conn.dialect.loaded_dbapi.Error as exc:
        raise HotStatements._db_error(conn, exc, sql, ()) from exc
