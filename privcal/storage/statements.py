"""The hot path's SQL (a charge, a collection session's batch, the audit append), run on the
DB-API connection.

One charge is a handful of primary-key statements around one COMMIT; through SQLAlchemy's
Core each costs ~50 µs of Python (compiled-cache lookup, parameter processing, result
objects, events) against ~3 µs on the driver, and the whole charge was 7× one raw committed
insert (issue 11). So these statements are SQL strings written once per ledger and
backend (:class:`HotSQL`), executed with the driver's ``execute`` on the connection a
:class:`~sqlalchemy.engine.Connection` checked out of the pool
(``conn.connection.driver_connection``), inside the transaction of
:meth:`~privcal.storage.transactions.LedgerTransactions.write_core`, which begins and
commits on that connection too (:meth:`HotStatements._begin`, :meth:`HotStatements._commit`).

Values cross the driver exactly as SQLAlchemy would write and read them: every column's
bind and result processors are taken from its SQLAlchemy type once (:class:`Codec`), so
an amount is a decimal string on SQLite and ``NUMERIC`` on PostgreSQL, a timestamp has the
SQLite dialect's text format, and so on; rows come back as named tuples with every column.
A driver error is raised as SQLAlchemy's (:meth:`HotStatements._sql`), with a connection
the server closed invalidated, so :meth:`~privcal.storage.transactions.LedgerTransactions._retry`
handles both paths alike.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Column, Numeric, Table
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.types import TypeEngine

from privcal.storage.audit_queue import pg_append_with, pg_charge_entry
from privcal.storage.engine import BEGIN_WITH_NEXT, begin_pending, connection_lost
from privcal.storage.models import Charge, Dataset
from privcal.storage.sessions import CollectionSession, SessionBatch
from privcal.storage.sqlite_uri import check_same_file

__all__ = ["HEAD_INFO", "SPENT_COLUMNS", "Codec", "HotSQL", "HotStatements"]

#: ``Connection.info`` key of the audit head (seq, entry_hash) a SQLite write transaction read
#: with its dataset row (:meth:`privcal.storage.Ledger.dataset_row`); used and dropped by the
#: append of that transaction (storage/transactions.py)
HEAD_INFO = "privcal_audit_head"

#: the dataset columns holding its running totals, in :class:`privcal.accountant` order
SPENT_COLUMNS = ("spent_pure_eps", "spent_pure_rho", "spent_zcdp_rho", "spent_approx_eps",
                 "spent_approx_delta")


#: psycopg's ``TransactionStatus.IDLE``: no transaction open on the connection
_PG_IDLE = 0
#: ``Connection.info`` keys of the hot path's cursors on that driver connection (the info
#: dict lives as long as the driver connection: SQLAlchemy clears it on invalidation)
_CURSOR, _BEGIN_CURSOR = "privcal_cursor", "privcal_begin_cursor"

#: PostgreSQL's type OID of NUMERIC (psycopg's numeric result processor asks for it)
_PG_NUMERIC_OID = 1700


def _coltype(dialect: Dialect, t: TypeEngine[Any]) -> int | None:
    """The driver's type code of a column of type ``t``, where a result processor needs it."""
    if dialect.name == "postgresql" and isinstance(getattr(t, "impl_instance", t), Numeric):
        return _PG_NUMERIC_OID
    return None


def _processors(t: TypeEngine[Any], dialect: Dialect
                ) -> tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None]:
    """(bind, result) processors of a column of (dialect-level) type ``t`` — SQLAlchemy's,
    except that a type offering ``plain_processors`` (:class:`~privcal.storage.models.ExactDecimal`)
    gives its own one-argument functions wherever its impl type adds no processing (what
    SQLAlchemy's :class:`~sqlalchemy.types.TypeDecorator` wrappers would call, two calls
    fewer per value; tests/test_hot_path.py checks they agree)."""
    coltype = _coltype(dialect, t)
    bind, result = t.bind_processor(dialect), t.result_processor(dialect, coltype)
    plain = getattr(t, "plain_processors", None)
    if plain is not None:
        impl = t.impl_instance  # type: ignore[attr-defined]
        plain_bind, plain_result = plain(dialect)
        if impl.bind_processor(dialect) is None:
            bind = plain_bind
        if impl.result_processor(dialect, coltype) is None:
            result = plain_result
    return bind, result


#: raw driver values whose equality means the very same value (not float: 0.0 == -0.0; not
#: Decimal: 0.1 == 0.10): a column whose raw value is equal to the last row's is not parsed again
_EXACT_RAW = frozenset((str, int, bytes, type(None)))
#: parsed values that can be shared between rows (a JSON list is not: a caller may change it)
_IMMUTABLE = frozenset((str, int, bool, bytes, Decimal, datetime, type(None)))


class Codec:
    """One table's columns as the driver sees them: a named-tuple row type and the
    SQLAlchemy bind/result processors of each column (None where the value passes as is).

    On SQLite :meth:`load` parses only what changed since the last row it loaded: a column
    whose raw value equals the last one's (same type, exact equality) gets the same parsed
    value (immutable ones only) — on the charge's hot path the dataset row differs from its
    last load in its totals alone, and parsing the rest (a timestamp, the caps as decimals)
    was most of its cost (issue 11). A row changed by anyone else is parsed anew: the
    comparison is on the raw values just read, never on a key."""

    def __init__(self, table: Table, dialect: Dialect, columns: Sequence[Column[Any]]) -> None:
        self.names = tuple(c.name for c in columns)
        self.row = namedtuple(f"{table.name}_row", self.names)  # type: ignore[misc]
        procs = [_processors(c.type.dialect_impl(dialect), dialect) for c in columns]
        self._out = tuple((i, r) for i, (_, r) in enumerate(procs) if r is not None)
        self.bind: dict[str, Callable[[Any], Any]] = {
            c.name: b for c, (b, _) in zip(columns, procs, strict=True) if b is not None}
        #: SQLite only: its driver returns text that the processors parse (decimals, times,
        #: JSON); psycopg's values are already Decimals and datetimes, which cost more to
        #: compare than to pass through ``exact_value``
        self._reuse = dialect.name == "sqlite"
        #: the last (raw, row) loaded (one tuple: threads read a consistent pair)
        self._last: tuple[tuple[Any, ...], Any] | None = None

    def load(self, raw: Sequence[Any]) -> Any:
        """A driver row as the named tuple of Python values SQLAlchemy would return."""
        vals = list(raw)
        last = self._last
        if last is None:
            for i, p in self._out:
                vals[i] = p(vals[i])
        else:
            last_raw, last_row = last
            for i, p in self._out:
                v, was = vals[i], last_raw[i]
                if (type(v) is type(was) and type(v) in _EXACT_RAW and v == was
                        and type(last_row[i]) in _IMMUTABLE):
                    vals[i] = last_row[i]
                else:
                    vals[i] = p(v)
        row = self.row._make(vals)
        if self._reuse:
            self._last = (tuple(raw), row)
        return row

    def dump(self, values: dict[str, Any], names: Sequence[str]) -> list[Any]:
        """``values[name]`` for each of ``names``, as the driver is given it."""
        return self.dumper(names)(values)

    def dumper(self, names: Sequence[str]) -> Callable[[dict[str, Any]], list[Any]]:
        """:meth:`dump` for a fixed ``names``, its processors looked up once (a hot
        statement's parameters)."""
        plan = tuple((n, self.bind.get(n)) for n in names)

        def dump(values: dict[str, Any]) -> list[Any]:
            return [values[n] if b is None else b(values[n]) for n, b in plan]

        return dump


class HotSQL:
    """The hot path's statements for one backend (driver paramstyle: ``?`` on SQLite,
    ``%s`` on psycopg), and the codecs of the rows they read and write."""

    def __init__(self, dialect: Dialect) -> None:
        pg = dialect.name == "postgresql"
        p = "%s" if pg else "?"
        dt, ct = Dataset.__table__, Charge.__table__
        self.dataset = Codec(dt, dialect, list(dt.c))
        self.charge = Codec(ct, dialect, list(ct.c))
        #: every charge column but id, in insert order
        self.charge_cols = tuple(c.name for c in ct.c if c.name != "id")
        #: a charge row's parameters (``charge_cols``) and the totals' (SPENT_COLUMNS) as the
        #: driver is given them, from the column → value dicts
        self.dump_charge = self.charge.dumper(self.charge_cols)
        self.dump_spent = self.dataset.dumper(SPENT_COLUMNS)
        ds_cols = ", ".join(self.dataset.names)
        #: the dataset row by name; PostgreSQL locks it (SQLite: BEGIN IMMEDIATE holds the
        #: database write lock already)
        #: SQLite reads the audit head in the same statement (one fewer per charge): the
        #: BEGIN IMMEDIATE transaction holds the write lock, so it is the head the append
        #: extends, and the append moves it only from that very head (:attr:`move_head`)
        self.lock_dataset = (f"SELECT {ds_cols} FROM datasets WHERE name = {p} FOR UPDATE"
                             if pg else
                             f"SELECT {ds_cols}, (SELECT seq FROM audit_head WHERE id = 1), "
                             f"(SELECT entry_hash FROM audit_head WHERE id = 1) "
                             f"FROM datasets WHERE name = {p}")
        self.by_key = (f"SELECT {', '.join(self.charge.names)} FROM charges "
                       f"WHERE dataset_id = {p} AND idempotency_key = {p}")
        self.count = f"UPDATE datasets SET charge_count = charge_count + 1 WHERE id = {p}"
        self.count_spent = (
            "UPDATE datasets SET charge_count = charge_count + 1, "
            + ", ".join(f"{c} = {p}" for c in SPENT_COLUMNS) + f" WHERE id = {p}")
        #: SQLite: no RETURNING, the id is the driver's ``lastrowid`` (an INTEGER PRIMARY KEY;
        #: 5 µs of the statement's 16, and a fetch)
        self.insert_charge_plain = (
            f"INSERT INTO charges ({', '.join(self.charge_cols)}) "
            f"VALUES ({', '.join([p] * len(self.charge_cols))})")
        self.insert_charge = f"{self.insert_charge_plain} RETURNING id"
        #: the pseudonyms a local-DP charge charged
        self.insert_members = (f"INSERT INTO charge_members (charge_id, members) "
                               f"VALUES ({p}, {p})")
        if pg:  # the totals' UPDATE rides in the INSERT: one round trip
            self.insert_charge_count = f"WITH upd AS ({self.count}) {self.insert_charge}"
            self.insert_charge_count_spent = (f"WITH upd AS ({self.count_spent}) "
                                              f"{self.insert_charge}")
            #: the same, and the charge's audit entry appended, in one statement
            #: (:meth:`~privcal.storage.charges.ChargeStore.record_charge`)
            #: — and the dataset's new row (every column, after the charge's own) for the
            #: optimistic charge's snapshot (:mod:`privcal.storage.optimistic`)
            self.record_charge_spent = pg_append_with(
                f"upd AS ({self.count_spent} RETURNING {ds_cols}), "
                f"c AS ({self.insert_charge}), {pg_charge_entry('c')}",
                more="".join(f", upd.{c}" for c in self.dataset.names), more_from=", upd")
            # … and so does a local-DP charge's members row
            self.insert_charge_count_members = (
                f"WITH upd AS ({self.count}), c AS ({self.insert_charge}), "
                f"m AS (INSERT INTO charge_members (charge_id, members) SELECT id, {p} FROM c) "
                "SELECT id FROM c")
        self._session_batch(dialect, p)
        # the SQLite audit append (PostgreSQL's is in the server: storage/transactions.py)
        self.head = "SELECT seq, entry_hash FROM audit_head WHERE id = 1"
        self.entry = (f"INSERT INTO audit_log (seq, kind, payload, prev_hash, entry_hash) "
                      f"VALUES ({p}, {p}, {p}, {p}, {p})")
        self.move_head = (f"UPDATE audit_head SET seq = {p}, entry_hash = {p} "
                          f"WHERE id = 1 AND seq = {p} AND entry_hash = {p}")


    def _session_batch(self, dialect: Dialect, p: str) -> None:
        """A collection session's batch (:func:`privcal.accountant.sessions.submit_reports`):
        the session and dataset rows locked with the session's last batch number, a batch
        by idempotency key, the new state with the batch record."""
        pg = dialect.name == "postgresql"
        st, bt = CollectionSession.__table__, SessionBatch.__table__
        self.session = Codec(st, dialect, list(st.c))
        self.batch = Codec(bt, dialect, list(bt.c))
        s_cols = ", ".join(f"s.{c}" for c in self.session.names)
        last = "(SELECT coalesce(max(batch), 0) FROM session_batches WHERE session_id = s.id)"
        if pg:
            # the ledger's lock order, dataset row first; then the session row, read (with its
            # last batch) in a statement of its own: under READ COMMITTED a statement sees
            # what was committed before it began, so after the dataset lock it sees every
            # batch written under that lock
            self.lock_session_dataset = (
                f"SELECT {', '.join(self.dataset.names)} FROM datasets WHERE id = "
                f"(SELECT dataset_id FROM collection_sessions WHERE id = {p}) FOR UPDATE")
            self.lock_session = (f"SELECT {s_cols}, {last} FROM collection_sessions s "
                                 f"WHERE s.id = {p} FOR UPDATE")
        else:  # one statement: BEGIN IMMEDIATE holds the database write lock already
            d_cols = ", ".join(f"d.{c}" for c in self.dataset.names)
            self.lock_session = (f"SELECT {d_cols}, {s_cols}, {last} FROM collection_sessions s "
                                 f"JOIN datasets d ON d.id = s.dataset_id WHERE s.id = {p}")
        self.batch_by_key = (f"SELECT {', '.join(self.batch.names)} FROM session_batches "
                             f"WHERE session_id = {p} AND idempotency_key = {p}")
        self.batch_cols = self.batch.names
        self.update_state = (f"UPDATE collection_sessions SET state = {p}, updated_at = {p} "
                             f"WHERE id = {p}")
        self.insert_batch = (f"INSERT INTO session_batches ({', '.join(self.batch_cols)}) "
                             f"VALUES ({', '.join([p] * len(self.batch_cols))})")
        if pg:  # the state's UPDATE rides in the batch's INSERT: one round trip
            self.update_state_insert_batch = (f"WITH u AS ({self.update_state}) "
                                              f"{self.insert_batch}")


class HotStatements:
    """The hot path's SQL of a :class:`~privcal.storage.ledger.Ledger` and how it runs (see the
    module docstring)."""

    # set by Ledger.__init__; ``backend`` and ``engine`` are the Ledger's
    _hot: HotSQL | None

    @property
    def hot_sql(self) -> HotSQL:
        """The statements for this ledger's backend, written on first use."""
        if self._hot is None:
            self._hot = HotSQL(self.engine.dialect)  # type: ignore[attr-defined]
        return self._hot

    def _sql(self, conn: Connection, sql: str, params: Sequence[Any] | dict[str, Any] = ()
             ) -> Any:
        """Run ``sql`` on the driver connection under ``conn``; the driver's cursor — on
        PostgreSQL this connection's one hot-path cursor (:meth:`_pg_sql`): read its rows
        before the next statement. SQLite: a fresh cursor (sqlite3's cost nothing, and one
        in-memory connection may serve several threads), the statement and nothing else —
        it runs six times a charge (issue 11)."""
        if self._backend == "postgresql":  # type: ignore[attr-defined]
            return self._pg_sql(conn, sql, params)
        try:  # (pysqlite: the DB-API connection is the driver's, an attribute away)
            return conn.connection.dbapi_connection.execute(sql, params)  # type: ignore[union-attr]
        except conn.dialect.loaded_dbapi.Error as exc:
            raise self._db_error(conn, exc, sql, params) from exc

    def _pg_sql(self, conn: Connection, sql: str, params: Sequence[Any] | dict[str, Any]
                ) -> Any:
        """:meth:`_sql` on PostgreSQL: this connection's one hot-path cursor, kept in
        ``conn.info`` (a psycopg cursor costs ≈ 5 µs to make).

        The first statement of a write (:meth:`_begin`) carries the transaction's
        ``BEGIN``: both go in one simple-protocol message (parameters bound by the client,
        psycopg's ``ClientCursor``), one round trip instead of two."""
        info = conn.info
        try:
            if info.pop(BEGIN_WITH_NEXT, False):
                cur = info.get(_BEGIN_CURSOR)
                if cur is None:
                    from psycopg import ClientCursor

                    cur = info[_BEGIN_CURSOR] = ClientCursor(
                        conn.connection.driver_connection)  # type: ignore[arg-type]
                cur.execute(f"BEGIN; {sql}", params)
                cur.nextset()
                return cur
            cur = info.get(_CURSOR)
            if cur is None:
                cur = info[_CURSOR] = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            return cur.execute(sql, params)
        except conn.dialect.loaded_dbapi.Error as exc:
            raise self._db_error(conn, exc, sql, params) from exc

    @staticmethod
    def _driver(conn: Connection) -> Any:
        """The driver connection under ``conn``, for a statement :meth:`_sql` cannot run (a
        COPY, a cursor's ``prepare=False``), inside the write's transaction: a PostgreSQL
        ``BEGIN`` still deferred (:meth:`_begin`) is sent first (:func:`begin_pending`)."""
        begin_pending(conn)
        return conn.connection.driver_connection

    def _sql_many(self, conn: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """``executemany`` of ``sql`` over ``rows`` on the driver connection under ``conn``."""
        try:
            begin_pending(conn)
            conn.connection.driver_connection.cursor().executemany(sql, rows)  # type: ignore[union-attr]
        except conn.dialect.loaded_dbapi.Error as exc:
            raise self._db_error(conn, exc, sql, rows) from exc

    def _begin(self, conn: Connection) -> None:
        """Begin the write transaction on the driver connection.

        SQLite: ``BEGIN IMMEDIATE`` (the write lock from the first read, see
        :mod:`privcal.storage.engine`). PostgreSQL: psycopg would send its own ``BEGIN``, a
        round trip, before the first statement; instead the connection is put in autocommit
        mode (psycopg sends no ``BEGIN``) and the ``BEGIN`` goes with the first statement
        (:meth:`_sql`; a Core statement first sends it alone: the engine's ``begin`` hook,
        :func:`begin_pending`). :meth:`_end` restores the connection before it returns to the
        pool.
        """
        if self.backend == "sqlite":  # type: ignore[attr-defined]
            check_same_file(conn.connection.info)  # not moved since (red team 26, ledger F8)
            self._sql(conn, "BEGIN IMMEDIATE")
            return
        try:
            conn.connection.driver_connection.autocommit = True  # type: ignore[union-attr]
        except conn.dialect.loaded_dbapi.Error as exc:
            raise self._db_error(conn, exc, "BEGIN", ()) from exc
        conn.info[BEGIN_WITH_NEXT] = True

    def _end(self, conn: Connection) -> None:
        """After a write on PostgreSQL, committed or not: roll back what is left of it and
        leave the driver connection as the pool gave it (out of autocommit mode); a
        connection that cannot be is invalidated, never pooled."""
        if self.backend != "postgresql":  # type: ignore[attr-defined]
            return
        if conn.invalidated:  # first: ``info`` of a connection SQLAlchemy holds a transaction
            return  # on raised PendingRollbackError over the retryable error (red team 12);
        conn.info.pop(BEGIN_WITH_NEXT, None)  # an invalidated one's ``info`` is new anyway
        dc = conn.connection.driver_connection
        try:
            if dc.pgconn.transaction_status != _PG_IDLE:  # type: ignore[union-attr]
                dc.rollback()  # type: ignore[union-attr]
            dc.autocommit = False  # type: ignore[union-attr]
        except conn.dialect.loaded_dbapi.Error as exc:
            conn.invalidate(exc)

    def _commit(self, conn: Connection) -> None:
        """COMMIT the transaction of :meth:`_begin` — through SQLAlchemy if something on the
        connection made it begin its own (the same driver transaction), else on the driver."""
        if conn.in_transaction():
            conn.commit()
            return
        try:
            conn.connection.driver_connection.commit()  # type: ignore[union-attr]
        except conn.dialect.loaded_dbapi.Error as exc:
            raise self._db_error(conn, exc, "COMMIT", ()) from exc

    @staticmethod
    def _db_error(conn: Connection, exc: BaseException, sql: str, params: Any) -> DBAPIError:
        """The driver error ``exc`` as SQLAlchemy raises it (its DBAPIError subclass), and
        ``conn`` invalidated if the error says the connection is gone (as SQLAlchemy does)."""
        dialect = conn.dialect
        dead = (dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)  # type: ignore[arg-type]
                or (dialect.name == "postgresql" and connection_lost(exc)))
        if dead:
            conn.invalidate(exc)
        return DBAPIError.instance(sql, params, exc, dialect.loaded_dbapi.Error,  # type: ignore[arg-type]
                                   hide_parameters=True,  # as the engines (red team 12)
                                   connection_invalidated=dead, dialect=dialect)
