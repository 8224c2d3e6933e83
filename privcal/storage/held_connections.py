"""Connections the charge hot path keeps checked out between writes (issue 11).

A pool checkout and return, with the :class:`~sqlalchemy.engine.Connection` built around
it, cost ≈ 25 µs of CPU per write — a large share of a charge whose own SQL costs ≈ 100 µs.
:meth:`HeldConnections.connection` instead hands out a Connection kept from an earlier
write and takes it back afterwards, under these rules:

- **Only a clean one is kept.** A connection goes back to the free list only if the write
  committed and nothing is left open on it (no SQLAlchemy transaction, no driver
  transaction, not invalidated). Anything else — an exception, a refused charge, a dead
  connection — closes it, which returns it to the pool (whose reset rolls back); the next
  write checks out a fresh one.
- **Not for a single-connection pool.** An in-memory SQLite ledger's one connection is lent
  to one thread at a time (:mod:`privcal.storage.engine`): it is never kept.
- **Bounded.** At most :data:`MAX_HELD` are kept (the rest are closed as usual), so a
  server with many threads never holds more than that out of the pool.
- **Liveness as the pool's.** One idle for longer than the engine's idle-ping time
  (:data:`privcal.storage.engine.IDLE_PING_S`) is closed and replaced by a pool checkout,
  which pings or recycles it as it would any pooled connection; one the server spoke on
  while it was kept (:func:`privcal.storage.engine.spoke_while_idle`: the goodbye of a
  backend ended by ``idle_session_timeout``, a restart, an administrator) is discarded
  before use, as the pool's checkout discards it — else the optimistic charge was sent on
  the dead socket and, its outcome unknown, an unkeyed charge failed with "may or may not
  have been recorded" (red team 25, ledger F1).
- **Per process.** The free list belongs to the process that made it: a forked child
  starts with an empty one, and never touches (not even to close or garbage-collect) the
  parent's connections, which stay referenced in :data:`_INHERITED`.
- **Closed with the ledger.** :meth:`HeldConnections.close_held` closes every kept one
  (:meth:`privcal.storage.Ledger.close`).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.pool import StaticPool

from privcal.storage import engine as engine_mod

__all__ = ["MAX_HELD", "HeldConnections"]

#: connections kept checked out at most per ledger and process
MAX_HELD = 4
#: free lists a forked child inherited: kept referenced, never used or closed
_INHERITED: list[Any] = []


class HeldConnections:
    """The kept connections of a :class:`~privcal.storage.ledger.Ledger` (module docstring)."""

    # ``_connect`` is the Ledger's; set by Ledger.__init__
    _held: list[tuple[Connection, float]]
    _held_pid: int

    def held_connections(self) -> list[Connection]:
        """The connections kept now (this process), for diagnostics and tests."""
        return [c for c, _ in self._held] if self._held_pid == os.getpid() else []

    @contextmanager
    def _hot_connect(self) -> Iterator[Connection]:
        """A write connection for :meth:`~privcal.storage.Ledger.write_core`: a kept one if
        there is one alive, else a pool checkout; kept afterwards only if it is clean
        (:meth:`_hot_take`, :meth:`_hot_give`)."""
        conn, held = self._hot_take()
        ok = False
        try:
            yield conn
            ok = True
        finally:
            self._hot_give(conn, held, ok)

    def _hot_take(self) -> tuple[Connection, list[tuple[Connection, float]] | None]:
        """The connection of :meth:`_hot_connect` and the free list it may go back to (None:
        never kept), to be handed back with :meth:`_hot_give` (a pair of calls, not a
        generator's context manager, for the charge's own
        :meth:`~privcal.storage.Ledger.write_core`: issue 11)."""
        if self._held_pid != os.getpid():
            _INHERITED.append(self._held)  # the parent's: never touched here
            self._held, self._held_pid = [], os.getpid()
        if isinstance(self.engine.pool, StaticPool):  # type: ignore[attr-defined]
            # in-memory SQLite: its one connection is lent to one thread at a time, from
            # checkout to checkin (engine.py): keeping it would shut out every other thread
            return self._checkout(), None  # type: ignore[attr-defined]
        held = self._held
        while True:
            try:
                c, since = held.pop()  # atomic: threads never share a connection
            except IndexError:
                return self._checkout(), held  # type: ignore[attr-defined]
            if time.monotonic() - since > engine_mod.IDLE_PING_S or c.invalidated:
                c.close()  # back to the pool, which pings or recycles it on checkout
            elif _spoke(c):  # the server ended it while it was kept (red team 25, ledger F1)
                c.invalidate()
                c.close()
            else:
                return c, held

    def _hot_give(self, conn: Connection, held: list[tuple[Connection, float]] | None,
                  ok: bool) -> None:
        """Hand back a connection of :meth:`_hot_take`: kept if the write on it succeeded
        (``ok``) and left it clean, there is room, and ``held`` (the free list it came with)
        is still the ledger's (not closed, not a forked parent's); else closed (back to the
        pool, whose reset rolls back)."""
        kept = False
        try:
            if (ok and held is not None and held is self._held and len(held) < MAX_HELD
                    and _clean(conn)):
                held.append((conn, time.monotonic()))
                kept = True
        finally:
            if not kept:
                conn.close()

    def close_held(self) -> None:
        """Close every kept connection of this process (returns them to the pool)."""
        if self._held_pid != os.getpid():
            return
        held, self._held = self._held, []
        for c, _ in held:
            c.close()


def _spoke(conn: Connection) -> bool:
    """Whether the server sent something on the kept PostgreSQL connection ``conn`` (a
    terminated backend's goodbye): one ``poll``, no round trip; never for SQLite."""
    drv = conn.connection.driver_connection
    return type(drv) is not sqlite3.Connection and engine_mod.spoke_while_idle(drv)


def _clean(conn: Connection) -> bool:
    """Nothing left open on ``conn``: no transaction, driver or SQLAlchemy, not invalidated."""
    if conn.invalidated or conn.in_transaction() or conn.closed:
        return False
    drv = conn.connection.driver_connection
    if type(drv) is sqlite3.Connection:
        return not drv.in_transaction
    status = getattr(getattr(drv, "info", None), "transaction_status", None)
    if status is not None:  # psycopg: IDLE (0) only, out of autocommit as the pool gave it
        return int(status) == 0 and not drv.autocommit
    return not getattr(drv, "in_transaction", True)
