"""Per-subject local-DP spends: the set-based bulk charge of a batch of pseudonyms, and reads.

Spends are integers in units of :data:`~privcal.storage.models.SUBJECT_UNIT` ε, keyed by
(dataset, pseudonym), so that a batch is charged in SQL on both backends. The bulk charge
is one of the two places with a statement per backend (the other is the audit append):

- PostgreSQL: the batch is COPYed into a temporary table, then ``UPDATE … FROM`` and
  ``INSERT … NOT EXISTS`` (set-based; ~3× faster there than ``INSERT … ON CONFLICT``,
  which pays a speculative insertion per row);
- SQLite: the batch is one JSON array parsed by ``json_each`` (~4× faster than
  ``executemany``) and one ``INSERT … ON CONFLICT DO UPDATE … WHERE`` under the cap.
"""

from __future__ import annotations

import json

import numpy as np
from sqlalchemy import select, text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from privcal.storage.models import SubjectSpend

__all__ = ["SubjectSpendStore"]


def _copy_text(conn: Connection, copy_sql: str, values: list[str]) -> None:
    """COPY one text column from ``values`` (PostgreSQL) as one block of lines.

    COPY's text format gives ``\\``, tab, newline and carriage return a meaning; when no
    value holds one the block is the values joined by newlines (one C-level join instead
    of a Python call per row), else every row is escaped by psycopg's ``write_row``.
    """
    raw = conn.connection.driver_connection
    block = "\n".join(values)
    plain = (block.count("\n") == len(values) - 1
             and not any(c in block for c in ("\t", "\r", "\\")))
    with raw.cursor() as cur, cur.copy(copy_sql) as cp:
        if plain:
            cp.write(block + "\n")
        else:
            for v in values:
                cp.write_row((v,))


class SubjectSpendStore:
    """The per-subject spend operations of a :class:`~privcal.storage.ledger.Ledger`."""

    # ``backend`` is the Ledger's

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
