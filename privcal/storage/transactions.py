"""Write and read transactions of the ledger, idempotency-key locks, and the audit append.

Write transactions go through :meth:`LedgerTransactions.write` (an ORM session) or
:meth:`LedgerTransactions.write_core` (a Core connection, for the hot charge path), which
retry transient lock and serialization failures — and a connection found dead — a bounded
number of times. Within one, the accountant locks the dataset row and queues its audit
entries (:meth:`LedgerTransactions.append_audit`, which canonicalises the entry at once).
The queued entries are appended as the *last* step before COMMIT
(:meth:`LedgerTransactions._append_pending`). SQLite: numbered and chained in the
transaction, which holds the database write lock since ``BEGIN IMMEDIATE``. PostgreSQL: by
the audit sequencer of :mod:`privcal.storage.audit_queue` — chained in the transaction if it
gets the sequencer lock at once, else put in ``audit_queue`` and committed, to be chained by
the next holder of that lock (the next write granted it) or the next reader of the chain; so
charges to different datasets do not wait for each other's WAL flush, and the log stays one
gap-free, fork-free sequence in per-dataset commit order. Locks are always taken dataset
rows first, the sequencer last, so writers cannot deadlock.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session

from privcal.errors import LedgerError
from privcal.storage import audit
from privcal.storage.audit_queue import _no_head
from privcal.storage.engine import BUSY_TIMEOUT_MS
from privcal.storage.statements import HEAD_INFO

__all__ = ["MAX_ATTEMPTS", "LedgerTransactions", "statement_cancelled"]

T = TypeVar("T")

#: attempts of one write transaction before a transient failure is reported
MAX_ATTEMPTS = 12
_PENDING = "privcal_audit_pending"


def _is_transient(exc: BaseException) -> bool:
    """A lock timeout, deadlock or serialization failure: the transaction may simply be retried."""
    if isinstance(exc, OperationalError | DBAPIError):
        orig = getattr(exc, "orig", None)
        msg = str(orig).lower()
        if "database is locked" in msg or "database is busy" in msg:
            return True
        sqlstate = getattr(orig, "sqlstate", None)
        # serialization_failure, deadlock_detected, lock_not_available
        return sqlstate in ("40001", "40P01", "55P03")
    return False


def statement_cancelled(exc: BaseException) -> bool:
    """A statement the server cancelled (SQLSTATE 57014: a ``statement_timeout`` set on the
    server, role, database or URL, or a cancel request): the transaction was rolled back.
    Not retried (the same work would meet the same timeout); a one-line LedgerError
    (:meth:`~privcal.storage.ledger.Ledger._unreachable`), not a traceback (red team 12)."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == "57014"


def _not_readable(exc: BaseException) -> bool:
    """A table a read needs is missing or this role may not read it (PostgreSQL SQLSTATE
    42P01, 42501; SQLite "no such table"): an auditor's role without ``ledger_secret``, a
    ledger restored from a partial dump — a driver traceback before (red team 23, ledger F3)."""
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None) in ("42P01", "42501") or str(orig).startswith(
        "no such table")


def _seq_taken(exc: BaseException) -> bool:
    """An audit entry's seq already in the log: the head row was set back outside privcal
    (red team 23, ledger F2: a driver traceback on every write)."""
    text = str(getattr(exc, "orig", ""))
    return "audit_log.seq" in text or "audit_log_pkey" in text


def _dropped(exc: BaseException) -> bool:
    """Whether ``exc`` says the server dropped the connection (a restart, a failover, an
    idle kill): SQLAlchemy then invalidated it (and the pool's older connections). The one
    test of every retry and refusal below. (A driver error the body of a read raised on the
    driver connection itself is followed by the session's ROLLBACK on the same dead
    connection, which SQLAlchemy raises as such an error.)"""
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


#: SQLite result codes (the low byte of ``sqlite_errorcode``) of a ledger that refuses every
#: write for now, before writing anything: READONLY (a file made read-only), FULL (the disk),
#: CANTOPEN (its journal); and IOERR (a failed write to the file: SQLite rolls the
#: transaction back, but a COMMIT that failed so may or may not have reached the disk)
_SQLITE_REFUSED, _SQLITE_IOERR = (8, 13, 14), 10


def _unwritable(exc: BaseException) -> str | None:
    """If ``exc`` says the ledger cannot be written at all now (not a lock: retrying will
    not help) — a SQLite file made read-only, a full disk or a disk I/O error, a
    PostgreSQL server in read-only mode (a hot standby, after a failover to it) — what
    is known of the write; else None."""
    orig = getattr(exc, "orig", None)
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == _SQLITE_IOERR:
        return ("the write may or may not have been recorded: check the ledger (audit "
                "verify, budget show) before retrying")
    if (code is not None and code & 0xFF in _SQLITE_REFUSED) or \
            getattr(orig, "sqlstate", None) == "25006":  # read_only_sql_transaction
        return "nothing was written"
    return None


def _commit_once(commit: Callable[..., None], *args: Any) -> None:
    """Run ``commit``; a connection that dies during it raises a LedgerError, never retried.

    The server may have committed before the connection died, so the outcome is unknown,
    and running the write again could record it twice: one ``charge`` call on PostgreSQL
    was two charges (ρ charged twice) when the connection was lost as COMMIT returned.
    """
    try:
        commit(*args)
    except DBAPIError as exc:
        if _dropped(exc):
            raise LedgerError(
                "the connection to the ledger was lost during COMMIT: the write may or may "
                "not have been recorded, so it was not retried (it could be recorded twice); "
                "check the ledger (privcal budget show, audit head) or retry with the same "
                "idempotency key") from exc
        raise


def _run_with_pending(run: Callable[[Connection], T], conn: Connection) -> T:
    """``run(conn)`` with the write's audit queue (:meth:`LedgerTransactions.append_audit`)
    in ``conn.info``, dropped afterwards with the audit head its dataset row brought."""
    info = conn.info
    info[_PENDING] = []
    try:
        return run(conn)
    finally:
        info.pop(_PENDING, None)
        info.pop(HEAD_INFO, None)


class LedgerTransactions:
    """Transactions of a :class:`~privcal.storage.ledger.Ledger` (see the module docstring)."""

    # set by Ledger.__init__; ``backend``, ``url``, ``_connect``, ``_unreachable``, ``hot_sql``,
    # ``_sql``, ``_sql_many``, ``_begin``, ``_commit``, ``_end``, ``_db_error``, ``_hot_take``,
    # ``_hot_give``
    # and ``ensure_schema`` are the Ledger's
    _url: URL

    def write(self, fn: Callable[[Session], T], *, attempts: int = MAX_ATTEMPTS) -> T:
        """Run ``fn(session)`` in one write transaction and commit; retry transient failures.

        SQLite: the transaction begins ``IMMEDIATE`` (the write lock is held from the first
        read). PostgreSQL: ``fn`` locks the rows it reads (``FOR UPDATE``). The audit
        entries ``fn`` queued are appended last (see the module docstring). On a transient
        failure everything is rolled back and ``fn`` runs again, up to ``attempts`` times —
        but not after the connection died *during* COMMIT (:func:`_commit_once`).
        """

        def run(conn: Connection) -> T:
            with Session(bind=conn, expire_on_commit=False) as session:
                session.begin()  # closing the session on an exception rolls it back
                try:
                    result = fn(session)
                    session.flush()
                    self._append_pending(conn)
                except conn.dialect.loaded_dbapi.Error as raw:
                    raise self._driver_error(conn, raw) from raw
                try:
                    _commit_once(session.commit)
                except LedgerError:
                    conn.rollback()  # the dead connection's transaction, so it can close
                    raise
                return result

        return self._retry(run, attempts)

    def write_core(self, fn: Callable[[Connection], T], *,
                   attempts: int = MAX_ATTEMPTS) -> T:
        """:meth:`write` with a Core connection instead of an ORM session (no unit of work,
        no identity map: the hot path of a charge). The transaction is begun and committed
        on the driver connection (:mod:`privcal.storage.statements`; ``BEGIN IMMEDIATE`` on
        SQLite; on PostgreSQL the ``BEGIN`` goes with the first statement), where the hot
        path's statements run; a Core statement ``fn`` executes joins it. Anything ``fn``
        raises rolls it back (:meth:`~privcal.storage.statements.HotStatements._end` on
        PostgreSQL, the pool's reset on return on SQLite)."""
        return self._retry(fn, attempts, core=True)  # one attempt: _run_core

    def _driver_error(self, conn: Connection, raw: BaseException) -> DBAPIError:
        """A driver error raised by a statement a write's or read's body ran on the driver's
        own cursor (a ``COPY``, a ``prepare=False`` query: :mod:`privcal.storage.pg_copy`,
        :mod:`privcal.storage.subject_spend`, :mod:`privcal.storage.session_store`), as
        SQLAlchemy raises its own (:meth:`~privcal.storage.statements.HotStatements._db_error`:
        the connection invalidated if it is gone) — before the write's cleanup touches the
        connection — so a write is retried or refused in one line like any other (red team
        12: a bare ``psycopg`` error, or ``PendingRollbackError`` from the cleanup, escaped)."""
        return self._db_error(conn, raw, "(a statement on the driver)", ())  # type: ignore[attr-defined, no-any-return]

    @contextmanager
    def orm_in_core(self, conn: Connection) -> Iterator[Session]:
        """An ORM session inside a :meth:`write_core` transaction on ``conn``, for a rare step
        of a hot transaction that needs the ORM (a collection session's release): it joins
        the transaction (SQLAlchemy's begin joins the one begun on the driver) and is
        flushed at the end; :meth:`write_core` commits."""
        if not conn.in_transaction():
            conn.begin()
        with Session(bind=conn, expire_on_commit=False,
                     join_transaction_mode="rollback_only") as session:
            yield session
            session.flush()

    def _retry(self, run: Callable[[Connection], T], attempts: int, *,
               core: bool = False) -> T:
        self.ensure_schema()
        delay = 0.01
        # SQLite's busy handler waits up to BUSY_TIMEOUT_MS in each attempt: retries end once
        # that much has passed in all (a writer holding the lock for good made a write wait
        # 12 × 30 s before its error: red team 12); they are for brief contention
        give_up = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        for attempt in range(1, attempts + 1):
            try:
                if core:
                    # write_core begins IMMEDIATE itself, on a connection kept from its last
                    # write if there is a clean one (storage/held_connections.py)
                    return self._run_core(run)
                with self._connect(write=True) as conn:
                    return _run_with_pending(run, conn)
            except (OperationalError, DBAPIError) as exc:
                # a pooled connection the server closed (no pre-ping: see engine.py) is
                # invalidated by SQLAlchemy; nothing was committed, so run again on a fresh one
                dead = _dropped(exc)
                spent = self.backend == "sqlite" and time.monotonic() >= give_up
                if attempt < attempts and ((_is_transient(exc) and not spent) or dead):
                    if not dead:
                        time.sleep(delay * (1 + random.random()))
                        delay = min(delay * 2, 1.0)
                    continue
                if isinstance(exc, IntegrityError) and _seq_taken(exc):
                    raise LedgerError(
                        "the audit_head row does not name the log's last entry (its seq was "
                        "set back outside privcal): nothing can be appended to the log, so "
                        "nothing was written; `privcal audit verify` reports it") from exc
                if isinstance(exc, IntegrityError):
                    raise
                known = _unwritable(exc)
                if known is not None:
                    first = (str(getattr(exc, "orig", "")).strip().splitlines() or [""])[0]
                    raise LedgerError(f"the ledger at {self.url} cannot be written now "
                                      f"({first}){self.file_hint()}; {known}",  # type: ignore[attr-defined]
                                      public=f"the ledger cannot be written now; {known}"
                                      ) from exc
                if _is_transient(exc):
                    raise LedgerError(
                        f"the ledger stayed locked after {attempt} attempt"
                        f"{'s' if attempt > 1 else ''}; try again"
                    ) from exc
                if dead or statement_cancelled(exc) or "connect" in str(exc).lower():
                    raise self._unreachable(exc) from exc
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _run_core(self, fn: Callable[[Connection], T]) -> T:
        """One attempt of :meth:`write_core`, on a connection of the hot path's free list
        (:meth:`~privcal.storage.held_connections.HeldConnections._hot_take`, without its
        generator: issue 11) with the write's audit queue in ``conn.info``
        (:func:`_run_with_pending`'s, in one frame here: the charge's hot path)."""
        conn, held = self._hot_take()
        info = conn.info
        info[_PENDING] = []
        ok = False
        try:
            self._begin(conn)
            try:
                try:
                    result = fn(conn)
                    self._append_pending(conn)
                except conn.dialect.loaded_dbapi.Error as raw:
                    raise self._driver_error(conn, raw) from raw
                _commit_once(self._commit, conn)
            finally:
                self._end(conn)
            ok = True
            return result
        finally:
            info.pop(_PENDING, None)
            info.pop(HEAD_INFO, None)
            self._hot_give(conn, held, ok)

    @contextmanager
    def read(self, *, long: bool = False) -> Iterator[Session]:
        """A read-only session on one consistent snapshot (``long``: one that computes between
        its statements — ``audit verify`` hashes the whole log — exempt from the server's
        ``idle_in_transaction_session_timeout``, which ended it every time: red team 25, F6).

        A read is not retried (its caller's body cannot be run again from here), but a
        connection the server dropped while it sat idle in the pool is replaced before the
        read begins (:func:`privcal.storage.engine.spoke_while_idle`). If the server drops
        it under the read (a restart, a failover, an idle kill), the read raises a one-line
        :class:`~privcal.errors.LedgerError` (the service's 503), never a driver traceback
        (also after a statement the body ran on the driver connection itself: see
        :func:`_dropped`); the pool is then invalidated, so the next read gets a fresh
        connection.
        """
        self.ensure_schema()
        with self._connect(write=False) as conn:
            if self.backend == "postgresql":
                # READ COMMITTED would give each statement its own snapshot, and `verify` could
                # see a charge row committed after it read the log
                conn.execution_options(isolation_level="REPEATABLE READ")
            try:
                try:
                    with Session(bind=conn, expire_on_commit=False) as session:
                        with session.begin():
                            if long and self.backend == "postgresql":
                                session.execute(text("SET LOCAL "
                                                     "idle_in_transaction_session_timeout = 0"))
                            yield session
                except conn.dialect.loaded_dbapi.Error as raw:  # r12rev: a statement_timeout
                    raise self._driver_error(conn, raw) from raw  # there was a 500
            except DBAPIError as exc:
                if statement_cancelled(exc):
                    raise self._unreachable(exc) from exc
                if _not_readable(exc):
                    raise LedgerError(
                        f"the ledger at {self.url} cannot be read: "
                        f"{str(exc.orig).strip().splitlines()[0]} (this role may not read a "
                        "table privcal reads — `audit verify` and per-subject look-ups read "
                        "ledger_secret too — or the table is missing); nothing was written",
                        public="the ledger cannot be read (a table is missing or not "
                               "readable)") from exc
                if not _dropped(exc):
                    raise
                raise LedgerError(
                    f"the connection to the ledger at {self.url} was lost during a read "
                    "(nothing was written; retry)", public="the connection to the ledger was "
                    "lost during a read (nothing was written; retry)") from exc

    @staticmethod
    def has_pending_audit(conn: Connection) -> bool:
        """Whether the write on ``conn`` has audit entries not yet appended."""
        return bool(conn.info.get(_PENDING))

    def append_audit(self, tx: Session | Connection, kind: str, data: dict[str, Any]) -> None:
        """Queue one entry for the chain in ``tx``'s write transaction.

        The entry is canonicalised now (once); it is numbered, hashed and appended as the
        transaction's last step (:meth:`_append_pending`).
        """
        self.append_prefix(tx, kind, audit.entry_prefix(kind, data))

    def append_prefix(self, tx: Session | Connection, kind: str, prefix: str) -> None:
        """:meth:`append_audit` of an entry already canonicalised: its
        :func:`~privcal.storage.audit.entry_prefix` (e.g.
        :func:`~privcal.storage.audit.charge_prefix`)."""
        conn = tx.connection() if isinstance(tx, Session) else tx
        pending = conn.info.get(_PENDING)
        if pending is None:
            raise LedgerError("audit entries are appended only inside Ledger.write")
        pending.append((kind, prefix))

    def _append_pending(self, conn: Connection) -> None:
        """Append the entries :meth:`append_audit` collected, in order (module docstring)."""
        info = conn.info
        pending: list[tuple[str, str]] = info.get(_PENDING) or []
        if not pending:
            return
        if self.backend == "postgresql":
            self._pg_append_pending(conn, pending)  # type: ignore[attr-defined]
        else:
            # SQLite: the BEGIN IMMEDIATE transaction already holds the database write lock
            q = self.hot_sql  # on the driver connection (storage/statements.py)
            head = info.pop(HEAD_INFO, None)  # read with the dataset row, if it was
            if head is None:
                head = self._sql(conn, q.head).fetchone()
            if head is None or head[0] is None:
                raise _no_head()
            seq, prev = old_seq, old_prev = head
            rows = []
            for kind, prefix in pending:
                seq += 1
                payload = audit.payload_at(prefix, seq)
                entry_hash = audit.chain_hash(prev, payload)
                rows.append((seq, kind, payload, prev, entry_hash))
                prev = entry_hash
            if len(rows) == 1:
                self._sql(conn, q.entry, rows[0])
            else:
                self._sql_many(conn, q.entry, rows)
            if self._sql(conn, q.move_head, (seq, prev, old_seq, old_prev)).rowcount != 1:
                # cannot happen under BEGIN IMMEDIATE: refuse rather than fork the chain
                raise LedgerError("the audit head changed during the write (written outside "
                                  "privcal?); nothing was written")
        pending.clear()
