"""Per-subject local-DP spends: the set-based bulk charge of a batch of pseudonyms, and reads.

Spends are integers in units of :data:`~privcal.storage.models.SUBJECT_UNIT` ε, keyed by
(dataset, pseudonym), so that a batch is charged in SQL on both backends. The bulk charge
is one of the two places with a statement per backend (the other is the audit append):

- PostgreSQL: the batch is COPYed into a temporary table, then ``UPDATE … FROM`` and
  ``INSERT … NOT EXISTS`` (set-based; ~3× faster there than ``INSERT … ON CONFLICT``,
  which pays a speculative insertion per row);
- SQLite: the batch is one JSON array parsed by ``json_each`` (~4× faster than
  ``executemany``) and one ``INSERT … ON CONFLICT DO UPDATE … WHERE`` under the cap.

A collection session's batch has already read its subjects' spends (its one probe, under the
dataset lock), so :meth:`SubjectSpendStore.charge_probed` needs no staging table: it writes
the new rows straight into ``subject_spend`` and raises the existing ones under the cap.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import func, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from privcal.errors import LedgerError
from privcal.storage.models import SubjectSpend
from privcal.storage.pg_copy import copy_in
from privcal.storage.pseudonyms import BATCH_IDS_PG, fixed_lines, hex_matrix

__all__ = ["SubjectSpendStore"]

# SubjectSpendStore.charge_probed: raise rows with room (ids: newline-joined hex on PostgreSQL,
# a BLOB of fixed-width hex cut by substr on SQLite); insert new rows (SQLite; COPY on PG)
# (PostgreSQL: run by the driver with prepare=False, planned with the ids' values. The rows
# are found by one primary-key probe per id, as in the probe in session_store.py — a plain
# `dataset_id = :d AND subject = ANY(ids)` read every spend row of the dataset on a table
# never ANALYZEd — and updated by their row address (a TID scan: no other condition, or the
# planner may prefer it; the addresses are of this statement's snapshot); the dataset row is
# locked, and a row not raised is counted short and refused by the caller.)
_RAISE_PG = ("UPDATE subject_spend SET spent_units = spent_units + %(e)s WHERE ctid = ANY(ARRAY("
             f"SELECT p.ctid FROM {BATCH_IDS_PG} CROSS JOIN LATERAL (SELECT ctid FROM "
             "subject_spend WHERE dataset_id = %(d)s AND subject = b.subject LIMIT 1) p)) "
             "AND spent_units <= %(cap)s - %(e)s")
_SQLITE_IDS = ("WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c "
               "WHERE i + 1 < :n) ")
# (the CTE inside the IN: Python's sqlite3 reports no rowcount for a statement led by WITH)
_RAISE_SQLITE = (
    "UPDATE subject_spend SET spent_units = spent_units + :e "
    "WHERE dataset_id = :d AND spent_units <= :cap - :e AND subject IN ("
    + _SQLITE_IDS + "SELECT CAST(substr(:ids, i * 64 + 1, 64) AS TEXT) FROM c)")
_INSERT_NEW_SQLITE = (
    _SQLITE_IDS + "INSERT INTO subject_spend (dataset_id, subject, spent_units) "
    "SELECT :d, CAST(substr(:ids, i * 64 + 1, 64) AS TEXT), :e FROM c")


def _copy_text(conn: Connection, copy_sql: str, values: list[str]) -> None:
    """COPY one text column from ``values`` (PostgreSQL) as one block of lines.

    COPY's text format gives ``\\``, tab, newline and carriage return a meaning; when no
    value holds one the block is the values joined by newlines (one C-level join instead
    of a Python call per row), else every row is escaped by psycopg's ``write_row``.
    """
    block = "\n".join(values)
    plain = (block.count("\n") == len(values) - 1
             and not any(c in block for c in ("\t", "\r", "\\")))
    if plain:
        copy_in(conn, copy_sql, block + "\n")
    else:
        copy_in(conn, copy_sql, rows=((v,) for v in values))


class SubjectSpendStore:
    """The per-subject spend operations of a :class:`~privcal.storage.ledger.Ledger`."""

    # ``backend``, ``_sql`` and ``_driver`` (storage/statements.py) are the Ledger's
    if TYPE_CHECKING:
        backend: str

        def _sql(self, conn: Connection, sql: str, params: Any = ()) -> Any: ...

        @staticmethod
        def _driver(conn: Connection) -> Any: ...

    def bulk_charge_subjects(self, tx: Session | Connection, dataset_id: int, uniq: np.ndarray,
                             e_units: int, cap_units: int) -> list[str]:
        """Charge ``e_units`` to each (distinct) subject that has room under ``cap_units``;
        return those that had not (charged nothing).

        ``uniq`` holds *pseudonyms* (:meth:`privcal.storage.Ledger.pseudonyms`), already
        distinct, so the staging table needs no index: the join probes subject_spend's
        primary key. The caller has locked the dataset row in this transaction.
        """
        conn = tx.connection() if isinstance(tx, Session) else tx
        pg = self.backend == "postgresql"
        if pg:
            conn.exec_driver_sql(
                "CREATE TEMP TABLE privcal_batch (sid text) ON COMMIT DROP")
            _copy_text(conn, "COPY privcal_batch (sid) FROM STDIN", uniq.tolist())
        else:
            conn.exec_driver_sql(
                "CREATE TEMP TABLE IF NOT EXISTS privcal_batch (sid TEXT)")
            conn.exec_driver_sql("DELETE FROM privcal_batch")
            # one JSON array parsed in C by json_each is ~4× faster than executemany
            conn.exec_driver_sql("INSERT INTO privcal_batch (sid) SELECT value FROM json_each(?)",
                                 (json.dumps(uniq.tolist()),))
        params = {"d": dataset_id, "e": e_units, "cap": cap_units}
        over = [r[0] for r in conn.execute(text(
            "SELECT b.sid FROM privcal_batch b JOIN subject_spend s "
            "ON s.dataset_id = :d AND s.subject = b.sid WHERE s.spent_units > :cap - :e"
        ), params)]
        if pg:
            conn.exec_driver_sql("ANALYZE privcal_batch")
            # UPDATE … FROM then INSERT … NOT EXISTS: set-based, and on PostgreSQL ~3× faster
            # than INSERT … ON CONFLICT, which pays a speculative insertion per row
            conn.execute(text(
                "UPDATE subject_spend s SET spent_units = s.spent_units + :e FROM privcal_batch b "
                "WHERE s.dataset_id = :d AND s.subject = b.sid AND s.spent_units <= :cap - :e"
            ), params)
            conn.execute(text(
                "INSERT INTO subject_spend (dataset_id, subject, spent_units) "
                "SELECT :d, b.sid, :e FROM privcal_batch b WHERE NOT EXISTS (SELECT 1 FROM "
                "subject_spend s WHERE s.dataset_id = :d AND s.subject = b.sid)"
            ), params)
        else:
            # the DO UPDATE … WHERE skips exactly the rows selected above (same locked transaction)
            conn.execute(text(
                "INSERT INTO subject_spend (dataset_id, subject, spent_units) "
                "SELECT :d, sid, :e FROM privcal_batch WHERE true "
                "ON CONFLICT (dataset_id, subject) DO UPDATE "
                "SET spent_units = subject_spend.spent_units + excluded.spent_units "
                "WHERE subject_spend.spent_units + excluded.spent_units <= :cap"
            ), params)
            conn.exec_driver_sql("DELETE FROM privcal_batch")
        return over

    def charge_probed(self, tx: Session | Connection, dataset_id: int, new: np.ndarray,
                      existing: np.ndarray, e_units: int, cap_units: int) -> None:
        """Charge ``e_units`` to each subject of a batch whose spend rows were just probed in
        this transaction (:meth:`privcal.storage.Ledger.probe_batch`), with the dataset row
        locked since: ``new`` (raw ``S32`` pseudonyms, distinct, best sorted) have no row and
        get one, ``existing`` have room under ``cap_units`` and are raised.

        The probe is the budget check, so no staging table: new rows are one COPY block
        (PostgreSQL) or one ``INSERT … SELECT`` cutting a BLOB (SQLite) straight into
        ``subject_spend``. The statements still refuse what the probe ruled out: an
        existing row makes the insert fail (primary key) and the update only raises rows
        with room; if it raised fewer than asked, LedgerError — the transaction rolls back,
        nobody is charged.
        """
        conn = tx.connection() if isinstance(tx, Session) else tx
        if (new.shape[0] or existing.shape[0]) and e_units > cap_units:
            raise LedgerError("a subject charge above the per-subject cap was not refused")
        if existing.shape[0]:
            hexes = hex_matrix(existing)
            params = {"d": dataset_id, "e": e_units, "cap": cap_units}
            if self.backend == "postgresql":
                params["ids"] = fixed_lines(existing.shape[0],
                                            [hexes, b"\n"])[:-1].decode("ascii")
                with self._driver(conn).cursor() as cur:
                    done = cur.execute(_RAISE_PG, params, prepare=False).rowcount
            else:
                params.update(ids=hexes.tobytes(), n=int(existing.shape[0]))
                done = self._sql(conn, _RAISE_SQLITE, params).rowcount
            if done != existing.shape[0]:
                raise LedgerError(f"per-subject charge: {existing.shape[0] - done} of "
                                  f"{existing.shape[0]} subjects had no room left; nothing "
                                  "was charged")
        if not new.shape[0]:
            return
        hexes = hex_matrix(new)
        if self.backend == "postgresql":
            block = fixed_lines(new.shape[0], [f"{int(dataset_id)}\t".encode(), hexes,
                                               f"\t{int(e_units)}\n".encode()])
            copy_in(conn, "COPY subject_spend (dataset_id, subject, spent_units) FROM STDIN",
                    block)
            return
        self._sql(conn, _INSERT_NEW_SQLITE, {"d": dataset_id, "e": e_units,
                                             "ids": hexes.tobytes(), "n": int(new.shape[0])})

    @staticmethod
    def subject_units(s: Session, dataset_id: int, pseudonym: str) -> int:
        """The units one subject (by pseudonym) has spent on a dataset (0 if never charged)."""
        units = s.scalar(select(SubjectSpend.spent_units).where(
            SubjectSpend.dataset_id == dataset_id, SubjectSpend.subject == pseudonym))
        return int(units or 0)

    @staticmethod
    def subject_units_all(s: Session, dataset_id: int) -> np.ndarray:
        """The units spent by every subject of a dataset (int64, in no particular order)."""
        return np.fromiter(
            s.scalars(select(SubjectSpend.spent_units)
                      .where(SubjectSpend.dataset_id == dataset_id)),
            dtype=np.int64,
        )

    @staticmethod
    def subject_units_max(s: Session, dataset_id: int) -> int:
        """The most units one subject has spent on a dataset (0 if none): one aggregate,
        not every subject's row (``budget show`` on a dataset of 10⁶ subjects)."""
        return int(s.scalar(select(func.max(SubjectSpend.spent_units))
                            .where(SubjectSpend.dataset_id == dataset_id)) or 0)
