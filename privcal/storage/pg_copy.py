"""``COPY … FROM STDIN`` on a write's driver connection (PostgreSQL), inside the write's
transaction.

The bulk writes (per-subject charges, a session batch's reports) COPY through psycopg's own
cursor, past SQLAlchemy. A driver error there (the server restarted, the backend
terminated, a ``statement_timeout``) is raised as SQLAlchemy's ``DBAPIError`` by the write
itself (:meth:`~privcal.storage.transactions.LedgerTransactions._driver_error`, for every
statement a write runs on the driver), so the write is retried on a fresh connection or
refused in one line (red team 12).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection

from privcal.storage.engine import begin_pending

__all__ = ["copy_in"]


def copy_in(conn: Connection, sql: str, block: str | bytes | None = None,
            rows: Iterable[tuple[Any, ...]] | None = None) -> None:
    """Run ``sql`` (a ``COPY … FROM STDIN``) on ``conn``'s driver connection, sending
    ``block`` (pre-formatted COPY text) or else ``rows`` (escaped by psycopg, row by row),
    inside the write's transaction: a ``BEGIN`` still deferred is sent first (as
    :meth:`~privcal.storage.statements.HotStatements._driver` does; a COPY first in a
    write would otherwise run in autocommit mode)."""
    begin_pending(conn)
    with conn.connection.driver_connection.cursor() as cur, cur.copy(sql) as cp:  # type: ignore[union-attr]
        if block is not None:
            cp.write(block)
        else:
            for row in rows or ():
                cp.write_row(row)
