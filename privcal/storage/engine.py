"""Engines per backend, and where the embedded ledger lives.

SQLite: WAL journal, a 30 s busy timeout, foreign keys on, and write
transactions opened with ``BEGIN IMMEDIATE`` so that a read-check-write
sequence holds the database write lock from its first read (otherwise two
writers could both read the same remaining budget). pysqlite's own transaction
handling is turned off and SQLAlchemy's ``begin`` event emits ``BEGIN``
itself — the recipe of the SQLAlchemy SQLite dialect docs, "Serializable
isolation / Savepoints / Transactional DDL". A connection marked with the
execution option ``privcal_write=True`` begins ``IMMEDIATE``; others begin a
deferred (read) transaction. The hook runs ``BEGIN`` on the driver connection, and does
nothing when a transaction is already open there (:meth:`privcal.storage.Ledger.write_core`
begins ``IMMEDIATE`` on the driver itself; a Core statement inside it joins that one).

PostgreSQL: psycopg 3 (``postgresql+psycopg://``; a bare ``postgresql://`` is
mapped to it); write transactions lock the rows they read with
``SELECT … FOR UPDATE``; a hot-path write (:meth:`privcal.storage.Ledger.write_core`) sends
its ``BEGIN`` with its first statement, and the ``begin`` hook sends it alone if a Core
statement comes first (:func:`begin_pending`). Liveness without a round trip per
checkout (SQLAlchemy's ``pool_pre_ping`` costs one per transaction): connections are recycled after
:data:`RECYCLE_S`, one idle in the pool for more than :data:`IDLE_PING_S` is pinged
when checked out (and replaced if dead: the pool's ``DisconnectionError`` protocol), and
so is one the server sent something while it sat idle (:func:`spoke_while_idle`: the
goodbye of a terminated backend, seen without a round trip),
and a write that still meets a dead connection is retried by
:meth:`privcal.storage.Ledger.write` on a fresh one (nothing was committed).
"""

from __future__ import annotations

import os
import re
import select
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from privcal.errors import LedgerError
from privcal.storage.sqlite_uri import (
    PYSQLITE_ARGS,
    check_same_file,
    refuse_linked_file,
    sqlite_uri,
)

__all__ = ["BEGIN_WITH_NEXT", "BUSY_TIMEOUT_MS", "begin_pending", "connection_lost",
           "default_sqlite_path", "make_engine", "parse_url", "resolve_url", "sqlite_file_hint"]

BUSY_TIMEOUT_MS = 30_000
#: PostgreSQL connections older than this (seconds) are replaced at checkout
RECYCLE_S = 1800
#: a PostgreSQL connection idle in the pool for longer than this (seconds) is pinged at checkout
IDLE_PING_S = 30.0
DB_FILENAME = "privcal.sqlite"
#: ``Connection.info`` flag of a PostgreSQL write whose ``BEGIN`` goes with its first
#: statement (:meth:`privcal.storage.statements.HotStatements._begin`)
BEGIN_WITH_NEXT = "privcal_begin_with_next"


def begin_pending(conn: Any) -> None:
    """Send the ``BEGIN`` that :meth:`~privcal.storage.statements.HotStatements._begin`
    deferred to a write's first statement, now and on its own, if no statement has carried
    it yet: a write whose first statement is not one of the hot path's (the PostgreSQL
    engine's ``begin`` hook: a Core statement) still runs in its transaction."""
    if conn.info.pop(BEGIN_WITH_NEXT, False):
        conn.connection.driver_connection.execute("BEGIN")


def default_sqlite_path() -> Path:
    """``$PRIVCAL_HOME/privcal.sqlite``, else the platform's user data dir."""
    home = os.environ.get("PRIVCAL_HOME")
    if home:
        return Path(home).expanduser() / DB_FILENAME
    from platformdirs import user_data_dir

    return Path(user_data_dir("privcal")) / DB_FILENAME


def sqlite_file_hint(database: str | None) -> str:
    """What the file system says of a SQLite ledger file that could not be opened or
    written (red team 17: a full disk read "cannot reach the ledger: disk I/O error", and a
    read-only mount "unable to open database file" even for ``budget show``): a
    parenthesised clause to append to the error, or "" if nothing is known. ``database``:
    the URL's database part (a path, or ``file:PATH`` with ``uri=true``)."""
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        return ""
    path = Path(database[5:] if database.startswith("file:") else database).absolute()
    folder = path.parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return ""
    if st.f_flag & os.ST_RDONLY:
        return (f" (the file system holding {folder} is mounted read-only, and SQLite writes "
                f"{path.name}-wal and {path.name}-shm beside the ledger: to read it there, use "
                f"--db-url 'sqlite:///file:{path}?immutable=1&uri=true'; nothing was written)")
    if not os.access(folder, os.W_OK):
        return (f" (this user cannot write the directory {folder}, where SQLite keeps "
                f"{path.name}-wal and {path.name}-shm beside the ledger)")
    if st.f_bavail * st.f_frsize < 1 << 20:
        return f" (the disk holding {folder} is full: {st.f_bavail * st.f_frsize} bytes free)"
    return ""


def resolve_url(url: str | None) -> tuple[str, bool]:
    """(url, is_default): the explicit URL, else $PRIVCAL_DATABASE_URL, else the embedded file.
    An explicit empty URL is malformed, not "none given" (red team 24, newcomer F4: the
    ``--db-url "$LEDGER"`` of a script with LEDGER unset wrote to the embedded ledger)."""
    if url is not None:
        return url, False
    env = os.environ.get("PRIVCAL_DATABASE_URL")
    if env:
        return env, False
    path = default_sqlite_path()
    return f"sqlite:///{path}", True




def parse_url(url: str) -> URL:
    """Parse and normalise a ledger URL; LedgerError if it is malformed or of an unknown backend."""
    try:
        u = make_url(url)
    except (ArgumentError, ValueError) as exc:  # its password never echoed (red team 11)
        shown = re.sub(r"^([^:/]*://).*@", r"\1***@", url)  # all before the last "@"
        raise LedgerError(f"malformed ledger URL {shown!r}: expected e.g. "
                          "sqlite:///path/ledger.sqlite "
                          "or postgresql+psycopg://user@host/db") from exc
    backend = u.get_backend_name()
    if backend == "postgresql":
        if u.drivername in ("postgresql", "postgres"):
            u = u.set(drivername="postgresql+psycopg")
        elif u.drivername != "postgresql+psycopg":
            raise LedgerError(f"unsupported PostgreSQL driver {u.drivername!r}: use postgresql+psycopg://")
    elif backend == "sqlite":
        if u.drivername != "sqlite" and u.drivername != "sqlite+pysqlite":
            raise LedgerError(f"unsupported SQLite driver {u.drivername!r}: use sqlite:///path")
        uri_args = sorted(set(u.query) - PYSQLITE_ARGS)
        if uri_args and str(u.query.get("uri", "")).lower() not in ("true", "1", "yes", "on"):
            raise LedgerError(  # red team 19, newcomer F3: ?mode=ro opened it read-write
                f"the ledger URL's {', '.join(uri_args)}: SQLite URI arguments, which SQLite "
                "reads only with uri=true: add &uri=true (e.g. sqlite:///file:/path/ledger."
                "sqlite?mode=ro&uri=true); without it the driver ignores them and opens the "
                "file read-write")
        _refuse_sqlite_uri(u)
    else:
        raise LedgerError(
            f"unsupported ledger backend {backend!r} in URL (use sqlite or postgresql)")
    return u


def _refuse_sqlite_uri(u: URL) -> None:
    """LedgerError for a SQLite URI (``file:…``, ``uri=true``) whose database privcal cannot
    keep a budget in (red team 25, ledger F4/F5/F8):

    - in memory (``mode=memory``, ``file::memory:``, the ``memdb`` VFS) or a temporary file
      (``file:`` with no path): privcal knows only ``sqlite://`` as in memory — refused in a
      forked child (a copy of the parent's budget) and after ``close()`` — so a forked child
      spent the parent's budget again on its copy (ρ = 1.8 on a cap of 1, each copy verifying),
      and a closed one came back empty;
    - no file locking (``nolock=1``, ``vfs=unix-none``): ``BEGIN IMMEDIATE`` excluded no other
      process — 61 charges of ε 0.1 accepted on a cap of 5, 36 of them lost (F8);
    - shared cache (``cache=shared``): table locks instead of SQLite's file locks, on which
      ``BEGIN IMMEDIATE`` and the busy timeout do not wait — concurrent writes failed with
      "database table is locked" tracebacks."""
    uri = sqlite_uri(u)  # as SQLite decodes it (red team 26, ledger F1: n%256flock=1)
    if uri is None:
        return
    shown = unquote(u.render_as_string())  # no password on SQLite; "file:" unescaped
    vfs = uri.values("vfs")
    if "memory" in uri.values("mode") or "memdb" in vfs or uri.path in ("", ":memory:"):
        raise LedgerError(f"the ledger URL {shown!r} names a SQLite database in memory or a "
                          "temporary one: privcal keeps an in-memory ledger only as sqlite:// "
                          "(one per process, refused in a forked child, whose copy would spend "
                          "the budget again); use sqlite:// or a file")
    if uri.flag("nolock") or "unix-none" in vfs:
        raise LedgerError(f"the ledger URL {shown!r} turns SQLite's file locking off (nolock, "
                          "the unix-none VFS): BEGIN IMMEDIATE would exclude no other writer and "
                          "budgets would be overspent; remove it")
    if "shared" in uri.values("cache"):
        raise LedgerError(f"the ledger URL {shown!r} opens SQLite in shared-cache mode, whose "
                          "table locks privcal's write transactions (BEGIN IMMEDIATE with a "
                          "busy timeout) do not wait on: remove cache=shared")


class _SerialStaticPool(StaticPool):
    """The one connection of an in-memory SQLite ledger, used by one thread at a time.

    Every checkout of :class:`~sqlalchemy.pool.StaticPool` hands out the same connection, so
    two threads writing at once shared one transaction: the second ``BEGIN IMMEDIATE``
    failed, or its statements ran inside the first's and were committed or rolled back
    with it — 8 threads charging ρ = 0.01 to a cap of 1 had 178 charges accepted, totals of
    0.74 and a log that no longer verified. A thread now holds the connection from checkout
    to checkin (re-entrant: a nested checkout in the same thread gets it again, as before).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_use = threading.RLock()

    def _do_get(self) -> Any:
        self._in_use.acquire()
        try:
            return super()._do_get()
        except BaseException:
            self._in_use.release()
            raise

    def _do_return_conn(self, record: Any) -> None:
        try:
            super()._do_return_conn(record)
        finally:
            self._in_use.release()


def _sqlite_engine(u: URL) -> Engine:
    memory = u.database in (None, "", ":memory:")
    kwargs: dict[str, Any] = {"connect_args": {"timeout": BUSY_TIMEOUT_MS / 1000}}
    if memory:
        # one shared connection, else every checkout would see a new empty database
        kwargs.update(poolclass=_SerialStaticPool)
        kwargs["connect_args"]["check_same_thread"] = False
    # hidden parameters: no statement's values (the ledger secret's INSERT, pseudonyms, ids)
    # in SQLAlchemy's log or its errors, whatever logging the application turns on
    engine = create_engine(u, hide_parameters=True, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        # hand transaction control to the "begin" hook below
        dbapi_conn.isolation_level = None
        if not memory:  # before anything is written (red team 26, ledger F2)
            refuse_linked_file(dbapi_conn, record.info)
        cur = dbapi_conn.cursor()
        if not memory:
            cur.execute("PRAGMA journal_mode=WAL")
            # a commit is on disk when it returns (a charge shown, then lost to a power cut,
            # would be a release nobody paid for): FULL, not the build's WAL default, which
            # some SQLite builds set to NORMAL (durable only up to the last checkpoint)
            cur.execute("PRAGMA synchronous=FULL")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        # bulk local-DP charges stage ids in a temp table: keep it off the disk
        cur.execute("PRAGMA temp_store=MEMORY")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        dbapi_conn = conn.connection.driver_connection
        if dbapi_conn.in_transaction:  # begun on the driver (Ledger.write_core): join it
            return
        sql = "BEGIN"
        if conn.get_execution_options().get("privcal_write"):
            sql = "BEGIN IMMEDIATE"
            check_same_file(conn.connection.info)  # not moved since (red team 26, ledger F8)
        try:  # on the driver: exec_driver_sql costs ~50 µs of every write (issue 11)
            dbapi_conn.execute(sql)
        except sqlite3.Error as exc:  # raised as SQLAlchemy would (a busy ledger is retried)
            raise DBAPIError.instance(sql, (), exc, sqlite3.Error, dialect=conn.dialect) from exc

    return engine


#: the session settings privcal's SQL and psycopg rely on, set on every new PostgreSQL
#: connection whatever the server, database or role sets by default (red team 24, ledger F1:
#: ``standard_conforming_strings=off`` made the audit hash's ``'\x00'::bytea`` a NUL, a
#: non-ISO DateStyle a timestamptz psycopg cannot load, a LATIN1 ``client_encoding`` a
#: sentence it cannot send — every write or read a driver traceback); and a COMMIT that returns
#: only once it is on disk, as SQLite's ``synchronous=FULL`` (red team 26, ledger F5:
#: ``synchronous_commit = off`` returned before the flush, so a server crash could lose a charge
#: and its release after the caller had the release) — raised to ``on`` from ``off`` only,
#: (``local``, ``remote_write``, ``remote_apply`` flush the local WAL first: kept)
PG_SESSION_SETTINGS = ("SET standard_conforming_strings = on; SET DateStyle = 'ISO'; "
                       "SET client_encoding = 'UTF8'; "
                       "SELECT set_config('synchronous_commit', 'on', false) "
                       "WHERE current_setting('synchronous_commit') = 'off'")


def _pg_session(dbapi_conn: Any, _record: Any) -> None:
    """Set :data:`PG_SESSION_SETTINGS` on a new connection (before SQLAlchemy's own first
    look at the server, which reads ``standard_conforming_strings``), outside a transaction."""
    auto = dbapi_conn.autocommit
    dbapi_conn.autocommit = True
    try:
        dbapi_conn.execute(PG_SESSION_SETTINGS)
    finally:
        dbapi_conn.autocommit = auto


def _pg_engine(u: URL, **pool: Any) -> Engine:
    engine = create_engine(u, pool_recycle=RECYCLE_S, hide_parameters=True, **pool)
    event.listen(engine, "connect", _pg_session, insert=True)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        try:
            begin_pending(conn)
        except conn.dialect.loaded_dbapi.Error as exc:  # raised as SQLAlchemy would
            raise DBAPIError.instance("BEGIN", (), exc, conn.dialect.loaded_dbapi.Error,
                                      dialect=conn.dialect) from exc

    @event.listens_for(engine, "handle_error")
    def _on_error(ctx: Any) -> None:
        if not ctx.is_disconnect and connection_lost(ctx.original_exception):
            ctx.is_disconnect = True  # invalidated, raised with connection_invalidated

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["privcal_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("privcal_idle_since")
        if since is None:
            return
        if time.monotonic() - since <= IDLE_PING_S and not spoke_while_idle(dbapi_conn):
            return
        try:
            with dbapi_conn.cursor() as cur:
                cur.execute("SELECT 1")
            dbapi_conn.rollback()
        except Exception as exc:  # the pool discards this connection and connects anew
            raise DisconnectionError(f"idle connection is dead: {exc}") from exc

    return engine


#: SQLSTATEs of a server that ended the session: admin_shutdown (pg_terminate_backend, a
#: fast shutdown), crash_shutdown, cannot_connect_now
_SESSION_ENDED = ("57P01", "57P02", "57P03")


def connection_lost(exc: BaseException) -> bool:
    """Whether the psycopg error ``exc`` says the connection is gone, whatever psycopg knew
    of it yet: an OperationalError of libpq's own (no SQLSTATE: "sending query failed",
    "consuming input failed", "connection socket closed" …), of class 08 (connection
    exception), or a session the server ended (:data:`_SESSION_ENDED`).

    SQLAlchemy's psycopg dialect asks only psycopg's ``closed``/``broken``, which lag the
    error by a race: a ROLLBACK sent on a connection the server had just terminated failed
    with "sending query failed: terminating connection due to administrator command" while
    ``broken`` was still False — raised as a plain driver error, a service read answered 500
    instead of 503 (tests/service/test_connection_drop.py, the ``checkout`` case, seen once in
    CI). The engine's ``handle_error`` hook and the hot path
    (:meth:`~privcal.storage.statements.HotStatements._db_error`) both ask this too."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the postgres extra is not installed
        return False
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith("08") or state in _SESSION_ENDED


def spoke_while_idle(dbapi_conn: Any) -> bool:
    """Whether the server sent something on this idle PostgreSQL connection (or closed it).

    A server that terminates a backend (a restart, a failover, an idle kill,
    ``pg_terminate_backend``) sends a FATAL message and closes the socket; privcal never
    LISTENs, so an idle connection with input waiting is as good as dead. Asking the
    socket costs one ``poll`` system call (≈ 2 µs), not a round trip: the pool then pings
    such a connection at checkout (and replaces it), so a read after a failover runs on a
    fresh connection instead of failing on the dead one (tests/service/test_connection_drop.py).
    A server that vanished without a word (a cut network) is not seen here: the read
    fails, one line (:meth:`privcal.storage.Ledger.read`), and the pool is invalidated.
    """
    try:
        fd = dbapi_conn.pgconn.socket
    except Exception:  # closed or broken: no socket to ask
        return True
    if hasattr(select, "poll"):  # select.select cannot take a descriptor ≥ FD_SETSIZE
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # pragma: no cover - not POSIX


def make_engine(url: str | URL, **pool: Any) -> Engine:
    """An engine for ``url`` with the per-backend settings of the module docstring;
    ``pool``: the pool's options of a PostgreSQL engine (``pool_size``, …)."""
    u = parse_url(url) if isinstance(url, str) else url
    try:
        if u.get_backend_name() == "sqlite":
            return _sqlite_engine(u)
        return _pg_engine(u, **pool)
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        where = u.render_as_string(hide_password=True)
        hint = ""
        if isinstance(exc, ImportError) and getattr(exc, "name", None) == "psycopg":
            hint = " (install PostgreSQL support: pip install 'privcal[postgres]')"
        raise LedgerError(f"cannot open ledger {where}: {exc}{hint}") from exc
