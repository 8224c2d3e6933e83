"""Collection sessions in the ledger: the named operations the session protocol composes.

The protocol — which rows are accepted, who is charged, when a round advances, what is
released — is the accountant's (:mod:`privcal.accountant.sessions`); here is only how its
rows are read and written: a session row (locked in the ledger's order, dataset first), the
reports already stored, the subjects over their cap, the bulk insert of a batch's reports,
the batch records. Where SQLite and PostgreSQL differ there is one implementation per
backend, side by side (keyed probes: an array bound to ``= ANY`` on PostgreSQL, a JSON array
expanded by ``json_each`` on SQLite; the bulk insert: ``COPY`` vs one ``json_each``
``INSERT … SELECT``). A batch of pseudonyms (raw 32-byte values, 64 hex characters stored)
is passed as one fixed-width text — split by the server on PostgreSQL, cut by ``substr``
from a BLOB on SQLite — so that neither side builds a Python object per row: its probe
(:meth:`SessionStore.probe_batch`: reports and spends in one statement) and its reports
(:meth:`SessionStore.insert_batch_reports`). A batch's statements run on the DB-API
connection (:mod:`privcal.storage.statements`: SQL strings written once per ledger, values
through SQLAlchemy's own type processors), inside
:meth:`~privcal.storage.Ledger.write_core`: the session and dataset rows locked with the
last batch number (:meth:`SessionStore.lock_batch_session`), the new state and the batch row
(:meth:`SessionStore.record_batch`). The tables are in :mod:`privcal.storage.sessions`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from privcal.errors import NotFound
from privcal.storage.audit import now
from privcal.storage.models import Dataset, ReleaseRow
from privcal.storage.pg_copy import copy_in
from privcal.storage.pseudonyms import BATCH_IDS_PG, fixed_lines, hex_matrix, hex_of
from privcal.storage.sessions import CollectionSession, SessionReport

if TYPE_CHECKING:
    from privcal.storage.statements import HotSQL

__all__ = ["SessionStore"]

# Keyed probes: (PostgreSQL, SQLite). On SQLite the CROSS JOIN pins json_each as the outer
# loop: SQLite would otherwise scan the table and probe the unindexed JSON array (quadratic).
# On PostgreSQL :ids is an array, or (the usual case, see SessionStore._probe) the ids joined
# by newlines, split by the server: ANY(…) probes the primary key either way.
_REPORTED = (
    "SELECT subject FROM session_reports WHERE session_id = %(sid)s AND subject = ANY(%(ids)s)",
    "SELECT j.value FROM json_each(:ids) j CROSS JOIN session_reports r "
    "WHERE r.session_id = :sid AND r.subject = j.value",
)
_OVER = (
    "SELECT subject FROM subject_spend WHERE dataset_id = %(d)s AND subject = ANY(%(ids)s) "
    "AND spent_units > %(lim)s",
    "SELECT j.value FROM json_each(:ids) j CROSS JOIN subject_spend p "
    "WHERE p.dataset_id = :d AND p.subject = j.value AND p.spent_units > :lim",
)
_COPY_REPORTS = ("COPY session_reports (session_id, subject, round, value, received_at, batch) "
                 "FROM STDIN")
_INSERT_REPORTS_SQLITE = (
    "INSERT INTO session_reports (session_id, subject, round, value, received_at, batch) "
    "SELECT :sid, json_extract(value, '$[0]'), :r, json_extract(value, '$[1]'), :t, :b "
    "FROM json_each(:rows)")

# One batch's probe (SessionStore.probe_batch): (0, pseudonym, 0) for each already reported in
# the session, (1, pseudonym, units) for each with a spend row on the dataset. The pseudonyms
# are one text of fixed-width hex: split by the server on PostgreSQL, cut by substr from a
# BLOB on SQLite (byte offsets; a recursive CTE counts the rows, json_each is not needed).
# On PostgreSQL each pseudonym is looked up by the whole primary key, one index probe per id
# (a LATERAL subquery with LIMIT 1, which the planner can neither flatten into a hash join
# nor run as anything but a nested loop over the ids): the batch's cost does not depend on
# the table's size or statistics. The plain form `session_id = :sid AND subject = ANY(ids)`
# did: on a table never ANALYZEd (new, or autovacuum off) the planner believes the session
# has a handful of rows, so it scans all of the session's rows by `session_id` and filters
# them by the ANY — per batch, a read of every report stored so far (27 ms per batch of 100
# at 20 000 reports, 0.9 ms now: bench/RESULTS.md, "Device reports at a session's size").
# With a generic plan (psycopg prepares after 5 executions) the ANY was also searched
# linearly per row; the probe still goes through the driver with prepare=False
# (psycopg placeholders), planned with the ids' values.
_PROBE_REPORTED_PG = (f"SELECT 0, r.subject, 0 FROM {BATCH_IDS_PG} CROSS JOIN LATERAL ("
                      "SELECT subject FROM session_reports WHERE session_id = %(sid)s "
                      "AND subject = b.subject LIMIT 1) r")
_PROBE_SPENT_PG = (f" UNION ALL SELECT 1, p.subject, p.spent_units FROM {BATCH_IDS_PG} "
                   "CROSS JOIN LATERAL (SELECT subject, spent_units FROM subject_spend "
                   "WHERE dataset_id = %(d)s AND subject = b.subject LIMIT 1) p")
#: the keyed probes above (SessionStore._probe) with the ids as one newline-joined text
_SPLIT_IDS = "ANY(string_to_array(%(ids)s, chr(10)))"
_SQLITE_IDS = (
    "WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i + 1 < :n), "
    "b(sid) AS (SELECT CAST(substr(:ids, i * 64 + 1, 64) AS TEXT) FROM c) ")
_PROBE_REPORTED_SQLITE = (
    _SQLITE_IDS + "SELECT 0, r.subject, 0 FROM b CROSS JOIN session_reports r "
    "WHERE r.session_id = :sid AND r.subject = b.sid")
_PROBE_SPENT_SQLITE = (
    " UNION ALL SELECT 1, p.subject, p.spent_units FROM b CROSS JOIN subject_spend p "
    "WHERE p.dataset_id = :d AND p.subject = b.sid")
_INSERT_BITS_SQLITE = (
    "WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i + 1 < :n) "
    "INSERT INTO session_reports (session_id, subject, round, value, received_at, batch) "
    "SELECT :sid, CAST(substr(:ids, i * 64 + 1, 64) AS TEXT), :r, "
    "CAST(substr(:vals, i * :w + 1, :w) AS TEXT), :t, :b FROM c")

#: COPY text format escapes (backslash first, then the separators it must not confuse)
_COPY_ESCAPE = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
#: a character that COPY text format must escape
_COPY_SPECIAL = re.compile(r"[\\\t\n\r]")


def _plain_matrix(values: np.ndarray) -> np.ndarray | None:
    """``values`` (dtype ``S``) as an ``(n, w)`` ``uint8`` matrix if every entry is exactly
    ``w`` ASCII bytes, none of which COPY text format must escape; else None."""
    if values.dtype.kind != "S" or values.dtype.itemsize == 0 or values.ndim != 1:
        return None
    m = np.frombuffer(np.ascontiguousarray(values).tobytes(),
                      dtype=np.uint8).reshape(values.shape[0], values.dtype.itemsize)
    if m.size and (int(m.min()) < 0x20 or int(m.max()) > 0x7E or bool((m == 0x5C).any())):
        return None  # NUL padding (a shorter entry), a control character, non-ASCII, "\\"
    return m


def _conn(tx: Session | Connection) -> Connection:
    """The connection under ``tx`` (an ORM session's begins its transaction)."""
    return tx.connection() if isinstance(tx, Session) else tx


def _sqlite_time(t: Any) -> str:
    """An aware UTC time as SQLAlchemy stores a ``DateTime`` on SQLite: naive, microseconds
    (red team 11: ``isoformat`` added "+00:00", a second format in one column)."""
    return t.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


class SessionStore:
    """The collection-session operations of a :class:`~privcal.storage.ledger.Ledger`.

    Every operation runs in the caller's ORM session ``s`` (one ledger transaction).
    """

    # ``backend``, ``lock_dataset``, ``hot_sql``, ``_sql`` and ``_driver`` are the Ledger's
    # (the last three: storage/statements.py); a driver error raised by a statement run on
    # ``_driver``'s cursor is translated by the write or read around it (transactions.py)
    backend: str

    if TYPE_CHECKING:
        hot_sql: HotSQL

        def lock_dataset(self, session: Session, name: str) -> Dataset: ...

        def _sql(self, conn: Connection, sql: str, params: Any = ()) -> Any: ...

        @staticmethod
        def _driver(conn: Connection) -> Any: ...

    # ------------------------------------------------------------ session rows
    def session_row(self, s: Session, session_id: int, *, lock: bool = False
                    ) -> CollectionSession:
        """The session row (re-read from the database and, on PostgreSQL, locked, if
        ``lock``); NotFound if there is none."""
        stmt = select(CollectionSession).where(CollectionSession.id == session_id)
        if lock:
            stmt = stmt.execution_options(populate_existing=True)
            if self.backend == "postgresql":
                stmt = stmt.with_for_update()
        row = s.scalars(stmt).one_or_none()
        if row is None:
            raise NotFound(f"unknown session {session_id}")
        return row

    def lock_session(self, s: Session, session_id: int
                     ) -> tuple[CollectionSession, Dataset]:
        """The session row and its dataset's, both locked: the dataset row first, then the
        session row — the ledger's lock order (no deadlocks)."""
        row = self.session_row(s, session_id)
        ds = self.lock_dataset(s, self.dataset_name(s, row.dataset_id))
        return self.session_row(s, row.id, lock=True), ds

    @staticmethod
    def session_by_open_key(s: Session, dataset_id: int, key: str) -> CollectionSession | None:
        """The session of ``dataset_id`` whose state says it was opened under idempotency
        ``key`` (``open_idempotency_key``: an open that made no charge to bind it), if any."""
        return s.scalars(select(CollectionSession).where(
            CollectionSession.dataset_id == dataset_id,
            CollectionSession.state["open_idempotency_key"].as_string() == key)
            .order_by(CollectionSession.id)).first()

    @staticmethod
    def dataset_name(s: Session, dataset_id: int) -> str:
        """The name of dataset ``dataset_id``."""
        return str(s.scalar(select(Dataset.name).where(Dataset.id == dataset_id)))

    @staticmethod
    def insert_session(s: Session, values: dict[str, Any]) -> CollectionSession:
        """A new session row (``values``: every column but ``id``), flushed so that it has
        its id."""
        row = CollectionSession(**values)
        s.add(row)
        s.flush()
        return row

    @staticmethod
    def update_session(s: Session, row: CollectionSession, **values: Any) -> None:
        """Set columns of a session row (``state``, ``status``, ``release_id``,
        ``updated_at``) and flush."""
        for column, value in values.items():
            setattr(row, column, value)
        s.flush()

    @staticmethod
    def release_threshold(s: Session, release_id: int) -> str | None:
        """The stored threshold (text) of release ``release_id``."""
        return s.scalar(select(ReleaseRow.threshold).where(ReleaseRow.id == release_id))

    # ------------------------------------------------------------ reports
    def _probe(self, tx: Session | Connection, sql: tuple[str, str], ids: Sequence[str],
               params: dict[str, Any]) -> set[str]:
        """Which of ``ids`` a keyed lookup finds: one statement on the driver, an array on
        PostgreSQL (run with ``prepare=False``, so planned with its values: see
        :meth:`probe_batch`), a JSON array expanded by ``json_each`` on SQLite (both probe
        the primary key)."""
        if not ids:
            return set()
        conn = _conn(tx)
        if self.backend == "postgresql":
            ids = list(ids)
            joined = "\n".join(ids)
            if joined.count("\n") == len(ids) - 1 and "" not in ids:  # one text value
                # (no id holds a newline or is empty, which string_to_array would drop; psycopg
                # dumps a list element by element, ~10 µs each: 0.25 s for 20 000 ids)
                return self._pg_rows(conn, sql[0].replace("ANY(%(ids)s)", _SPLIT_IDS),
                                     {**params, "ids": joined}, 0)
            return self._pg_rows(conn, sql[0], {**params, "ids": ids}, 0)
        return {r[0] for r in self._sql(conn, sql[1], {**params, "ids": json.dumps(list(ids))})}

    def _pg_rows(self, conn: Connection, sql: str, params: dict[str, Any],
                 column: int | None = None) -> Any:
        """PostgreSQL: the rows of ``sql`` run by the driver with ``prepare=False`` — planned
        with the parameters' values every time (see :meth:`probe_batch`); the set of one
        ``column`` of them if given."""
        with self._driver(conn).cursor() as cur:
            rows = cur.execute(sql, params, prepare=False).fetchall()
        return rows if column is None else {r[column] for r in rows}

    def reported_subjects(self, s: Session | Connection, session_id: int, subjects: Sequence[str]
                          ) -> set[str]:
        """Those of ``subjects`` (pseudonyms) that already have a report in the session."""
        return self._probe(s, _REPORTED, subjects, {"sid": session_id})

    def subjects_over(self, s: Session | Connection, dataset_id: int, subjects: Sequence[str],
                      limit_units: int) -> set[str]:
        """Those of ``subjects`` (pseudonyms) whose spend on the dataset exceeds
        ``limit_units`` (units of :data:`~privcal.storage.models.SUBJECT_UNIT`)."""
        return self._probe(s, _OVER, subjects, {"d": dataset_id, "lim": limit_units})

    def insert_reports(self, tx: Session | Connection, session_id: int, round_: int,
                       subjects: Sequence[str], values: Sequence[str], batch: int) -> None:
        """Store one batch's accepted reports (``subjects`` are pseudonyms) under ``batch``:
        ``COPY`` on PostgreSQL, one ``json_each`` statement on SQLite (on the driver)."""
        t = now()
        conn = _conn(tx)
        if self.backend == "postgresql":
            # one pre-formatted COPY text block: ~10× faster than write_row per report; the
            # fields are escaped one by one only if some field needs it (pseudonyms are hex)
            head, tail = f"{session_id}\t", f"\t{round_}\t"
            ts = "\t" + t.isoformat() + f"\t{batch}\n"
            subjects, values = list(subjects), list(values)
            if _COPY_SPECIAL.search("".join(subjects)) or _COPY_SPECIAL.search("".join(values)):
                subjects = [x.translate(_COPY_ESCAPE) for x in subjects]
                values = [x.translate(_COPY_ESCAPE) for x in values]
            block = "".join([head + subj + tail + val + ts
                             for subj, val in zip(subjects, values, strict=True)])
            copy_in(conn, _COPY_REPORTS, block)
            return
        self._sql(conn, _INSERT_REPORTS_SQLITE, {
            "sid": session_id, "r": round_, "t": _sqlite_time(t), "b": batch,
            "rows": json.dumps([[a, b] for a, b in zip(subjects, values, strict=True)])})

    def probe_batch(self, tx: Session | Connection, session_id: int, raw: np.ndarray,
                    dataset_id: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One statement for a batch's distinct pseudonyms ``raw`` (``S32``): those already
        reported in the session, and — if ``dataset_id`` is given — those with a spend row
        on that dataset and their units. Returns (reported, spent, units): ``S32`` arrays
        sorted ascending and the ``int64`` units of ``spent``, in its order. Both lookups
        probe a primary key."""
        empty = np.zeros(0, dtype="S32")
        if raw.shape[0] == 0:
            return empty, empty, np.zeros(0, dtype=np.int64)
        hexes = hex_matrix(raw)
        params: dict[str, Any] = {"sid": session_id, "d": dataset_id}
        rows: list[Any]
        conn = _conn(tx)
        if self.backend == "postgresql":
            sql = _PROBE_REPORTED_PG + (_PROBE_SPENT_PG if dataset_id is not None else "")
            params["ids"] = fixed_lines(raw.shape[0], [hexes, b"\n"])[:-1].decode("ascii")
            rows = self._pg_rows(conn, sql, params)
        else:
            sql = _PROBE_REPORTED_SQLITE + (
                _PROBE_SPENT_SQLITE if dataset_id is not None else "")
            params.update(ids=hexes.tobytes(), n=int(raw.shape[0]))
            rows = self._sql(conn, sql, params).fetchall()
        found = [[bytes.fromhex(r[1]) for r in rows if r[0] == k] for k in (0, 1)]
        reported = np.sort(np.asarray(found[0], dtype="S32")) if found[0] else empty
        if not found[1]:
            return reported, empty, np.zeros(0, dtype=np.int64)
        spent = np.asarray(found[1], dtype="S32")
        units = np.asarray([int(r[2]) for r in rows if r[0] == 1], dtype=np.int64)
        order = np.argsort(spent)
        return reported, spent[order], units[order]

    def insert_batch_reports(self, tx: Session | Connection, session_id: int, round_: int,
                             raw: np.ndarray, values: np.ndarray | Sequence[str],
                             batch: int) -> None:
        """:meth:`insert_reports` of pseudonyms given raw (``S32``; stored as their hex).
        Values that are an ``S`` array of equal-width ASCII text without a tab, newline,
        carriage return or backslash (ldp-score's ``0``/``1``) are written without a Python
        object per row: one fixed-width COPY block on PostgreSQL, one ``INSERT … SELECT``
        cutting a BLOB on SQLite; other values go through :meth:`insert_reports`."""
        n = int(raw.shape[0])
        vals = _plain_matrix(values) if isinstance(values, np.ndarray) else None
        if vals is None or n == 0:
            hexes = hex_of(raw).tolist()
            text_values = (values.astype("U").tolist() if isinstance(values, np.ndarray)
                           else list(values))
            self.insert_reports(tx, session_id, round_, hexes, text_values, batch)
            return
        t = now()
        conn = _conn(tx)
        if self.backend == "postgresql":
            block = fixed_lines(n, [f"{session_id}\t".encode(), hex_matrix(raw),
                                    f"\t{round_}\t".encode(), vals,
                                    f"\t{t.isoformat()}\t{batch}\n".encode()])
            copy_in(conn, _COPY_REPORTS, block)
            return
        self._sql(conn, _INSERT_BITS_SQLITE, {
            "n": n, "sid": session_id, "r": round_, "t": _sqlite_time(t), "b": batch,
            "ids": hex_matrix(raw).tobytes(), "vals": vals.tobytes(), "w": vals.shape[1]})

    @staticmethod
    def report_values(s: Session, session_id: int) -> list[str]:
        """Every stored report value of the session (the messages of a federated one)."""
        return list(s.scalars(select(SessionReport.value)
                              .where(SessionReport.session_id == session_id)))

    # ------------------------------------------------------------ batches
    def lock_batch_session(self, conn: Connection, session_id: int) -> tuple[Any, Any, int]:
        """For a batch in :meth:`~privcal.storage.Ledger.write_core`: the session row and its
        dataset's (named tuples of every column), both locked in the ledger's order —
        dataset first — and the session's last batch number (0 before the first); NotFound
        if there is no such session. SQLite: one statement (``BEGIN IMMEDIATE`` holds the
        write lock); PostgreSQL: two (the dataset row ``FOR UPDATE``, then the session's)."""
        q = self.hot_sql
        if self.backend == "postgresql":
            got = self._sql(conn, q.lock_session_dataset, (session_id,)).fetchone()
            ds = None if got is None else q.dataset.load(got)
            got = None if got is None else self._sql(conn, q.lock_session,
                                                     (session_id,)).fetchone()
        else:
            got = self._sql(conn, q.lock_session, (session_id,)).fetchone()
            k = len(q.dataset.names)
            ds = None if got is None else q.dataset.load(got[:k])
            got = None if got is None else got[k:]
        if got is None:
            raise NotFound(f"unknown session {session_id}")
        return q.session.load(got[:-1]), ds, int(got[-1])

    def batch_by_key(self, conn: Connection, session_id: int, key: str) -> Any | None:
        """The batch of the session recorded under idempotency ``key``, if any (a named tuple
        of every ``session_batches`` column)."""
        q = self.hot_sql
        got = self._sql(conn, q.batch_by_key, (session_id, key)).fetchone()
        return None if got is None else q.batch.load(got)

    def record_batch(self, conn: Connection, session_id: int, state: dict[str, Any],
                     updated_at: datetime, batch: int, key: str | None, digest: str | None,
                     result: dict[str, Any]) -> None:
        """Record an accepted batch: the session's new ``state`` (and ``updated_at``), and the
        batch's row — its number, idempotency key, request digest, result. PostgreSQL: one
        statement (the UPDATE as a CTE); SQLite: two."""
        q = self.hot_sql
        upd = q.session.dump({"state": state, "updated_at": updated_at, "id": session_id},
                             ("state", "updated_at", "id"))
        row = q.batch.dump({"session_id": session_id, "batch": batch, "idempotency_key": key,
                            "request_digest": digest, "result": result,
                            "created_at": now()}, q.batch_cols)
        if self.backend == "postgresql":
            self._sql(conn, q.update_state_insert_batch, upd + row)
            return
        self._sql(conn, q.update_state, upd)
        self._sql(conn, q.insert_batch, row)
