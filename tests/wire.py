"""What a ledger operation sends to the database, counted on the driver connection (the pinned
statement and round-trip counts of the hot paths: tests/test_hot_path.py,
tests/test_session_round_trips.py)."""

from __future__ import annotations

from typing import Any

__all__ = ["Wire"]


class Wire:
    """What a ledger operation sends to the database, counted on the driver connection: every
    SQL statement SQLite runs (its trace callback), every round trip to PostgreSQL (each
    ``Sync`` or simple ``Query`` message the client sends, from libpq's protocol trace —
    each is answered by one ``ReadyForQuery``)."""

    def __init__(self, ledger: Any, tmp_path: Any) -> None:
        from sqlalchemy import event

        self.ledger, self.sql, self.trace = ledger, [], tmp_path / "libpq.trace"
        self._fh = open(self.trace, "w")  # closed in count()
        self._traced: list[Any] = []

        def checkout(dbapi_conn: Any, _rec: Any, _proxy: Any) -> None:
            if ledger.backend == "sqlite":
                dbapi_conn.set_trace_callback(self.sql.append)
            else:
                dbapi_conn.pgconn.trace(self._fh.fileno())
                from psycopg import pq

                dbapi_conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            self._traced.append(dbapi_conn)

        self._checkout = checkout
        event.listen(ledger.engine, "checkout", checkout)
        for c in ledger.held_connections():  # kept from the last write: no checkout
            checkout(c.connection.driver_connection, None, None)

    def count(self) -> int:
        """Statements (SQLite) or round trips (PostgreSQL) since this wire was attached."""
        from sqlalchemy import event

        event.remove(self.ledger.engine, "checkout", self._checkout)
        for c in self._traced:
            if self.ledger.backend == "sqlite":
                c.set_trace_callback(None)
            else:
                c.pgconn.untrace()
        self._fh.close()
        if self.ledger.backend == "sqlite":
            return len(self.sql)
        lines = self.trace.read_text().splitlines()
        return sum(1 for ln in lines if ln.split("\t")[:1] == ["F"]
                   and ln.split("\t")[2].split(" ")[0] in ("Sync", "Query"))
