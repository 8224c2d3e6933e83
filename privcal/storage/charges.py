"""Charges in the ledger: the locked dataset row, a charge row with its dataset's new totals,
a charge found by idempotency key, and the pseudonyms a local-DP charge charged.

The operations :meth:`ChargeStore.dataset_row`, :meth:`ChargeStore.charge_by_key` and
:meth:`ChargeStore.insert_charge` are the hot path of
:meth:`privcal.accountant.Accountant.charge`, inside
:meth:`~privcal.storage.transactions.LedgerTransactions.write_core`: SQL strings on the
driver connection (:mod:`privcal.storage.statements`);
:meth:`ChargeStore.add_charge` serves writers that hold an ORM session (collection
sessions). No policy here: the caller has checked the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from privcal.errors import NotFound, check_text
from privcal.storage import pseudonyms
from privcal.storage.audit_queue import CHARGE_ID_HEAD
from privcal.storage.charge_entry import charge_prefix
from privcal.storage.models import Charge, ChargeMembers, Dataset
from privcal.storage.statements import HEAD_INFO

__all__ = ["ChargeStore"]

#: a charge entry's prefix up to the end of its id, for charge id 0
_ID_ZERO = f"{CHARGE_ID_HEAD}0,"


class ChargeStore:
    """The charge operations of a :class:`~privcal.storage.ledger.Ledger`."""

    # ``backend``, ``hot_sql`` and ``_sql`` are the Ledger's (storage/statements.py)

    def dataset_row(self, conn: Connection, name: str) -> Any:
        """:meth:`lock_dataset` for :meth:`write_core`: the locked row, every column (a named
        tuple; PostgreSQL ``FOR UPDATE``, SQLite under ``BEGIN IMMEDIATE``, where the same
        statement reads the audit head for the transaction's append)."""
        check_text(name, "dataset name")  # a driver error on PostgreSQL otherwise (NUL)
        q = self.hot_sql
        raw = self._sql(conn, q.lock_dataset, (name,)).fetchone()
        if raw is None:
            raise NotFound(f"unknown dataset {name!r}")
        n = len(q.dataset.names)
        if len(raw) > n:  # SQLite: the audit head came with it, for this transaction's append
            conn.info[HEAD_INFO] = (raw[n], raw[n + 1])
            raw = raw[:n]
        return q.dataset.load(raw)

    def charge_by_key(self, conn: Connection, dataset_id: int, key: str) -> Any | None:
        """The charge of ``dataset_id`` recorded under idempotency ``key``, if any (a named
        tuple of every column)."""
        q = self.hot_sql
        raw = self._sql(conn, q.by_key, (dataset_id, key)).fetchone()
        return None if raw is None else q.charge.load(raw)

    def insert_charge(self, conn: Connection, values: dict[str, Any],
                      spent: dict[str, Any] | None = None,
                      members: bytes | None = None) -> int:
        """Insert a charge row (``values``: every column but ``id``) and count it on its
        dataset, whose row the caller has locked, setting the dataset's running totals to
        ``spent`` (column → value, every column of
        :data:`~privcal.storage.statements.SPENT_COLUMNS`) if given, and storing
        ``members`` (a local-DP charge's sorted pseudonyms, ``charge_members``) if given.
        Returns the charge id. PostgreSQL: one statement (the UPDATE and the members row as
        CTEs); SQLite: two, three with members."""
        q = self.hot_sql
        if spent is not None and members is not None:
            raise ValueError("a charge sets the dataset's totals or has members, not both")
        upd = self._totals(values, spent)
        row = q.dump_charge(values)
        if self.backend == "postgresql":
            if members is not None:
                return int(self._sql(conn, q.insert_charge_count_members,
                                     [*upd, *row, members]).fetchone()[0])
            sql = q.insert_charge_count_spent if spent is not None else q.insert_charge_count
            return int(self._sql(conn, sql, upd + row).fetchone()[0])
        self._sql(conn, q.count_spent if spent is not None else q.count, upd)
        cid = int(self._sql(conn, q.insert_charge_plain, row).lastrowid)
        if members is not None:
            self._sql(conn, q.insert_members, (cid, members))
        return cid

    def _totals(self, values: dict[str, Any], spent: dict[str, Any] | None) -> list[Any]:
        """The parameters of the totals UPDATE (``count_spent``, or ``count`` without
        ``spent``) as the driver is given them."""
        upd = self.hot_sql.dump_spent(spent) if spent is not None else []
        upd.append(values["dataset_id"])
        return upd

    def record_charge(self, conn: Connection, values: dict[str, Any],
                      spent: dict[str, Any], dataset: str) -> int:
        """:meth:`insert_charge` with the totals ``spent``, and the charge's audit entry
        (:func:`~privcal.storage.audit.charge_doc`, ``dataset`` its name) appended — the
        write's *last* step: nothing may be written after it. Returns the charge id.

        PostgreSQL: one statement and one round trip — the audit sequencer's append
        (:func:`~privcal.storage.audit_queue.pg_append_with`) after the totals UPDATE and
        the charge INSERT as CTEs; the entry is canonicalised here with the id left out and
        the server writes the id it drew into it (RFC 8785 puts ``charge_id`` first:
        :data:`~privcal.storage.audit_queue.CHARGE_ID_HEAD`), so the stored payload is the
        one :meth:`append_audit` would write. Entries queued earlier in the write come
        first, so then (and on SQLite) it is the two steps. The statement also returns the
        dataset's new row, kept as the snapshot of the optimistic charge
        (:mod:`privcal.storage.optimistic`).
        """
        if self.backend == "postgresql" and not self.has_pending_audit(conn):  # type: ignore[attr-defined]
            prefix = charge_prefix(0, values, dataset)
            if not prefix.startswith(_ID_ZERO):  # pragma: no cover - RFC 8785 key order
                raise AssertionError("a charge entry does not begin with its charge_id")
            q = self.hot_sql
            rest = prefix[len(_ID_ZERO) - 1:]  # from the "," after the id
            params = self._totals(values, spent) + q.dump_charge(values) + ["charge", rest]
            cid, _, row = self._pg_append_with_row(  # type: ignore[attr-defined]
                conn, q.record_charge_spent, params, "charge", CHARGE_ID_HEAD, rest)
            # the dataset's new row: the next charge's snapshot (storage/optimistic.py)
            self.remember_dataset(q.dataset.load(row), locked=True)  # type: ignore[attr-defined]
            return int(cid)
        cid = self.insert_charge(conn, values, spent)
        self.append_prefix(conn, "charge",  # type: ignore[attr-defined]
                           charge_prefix(cid, values, dataset))
        return cid

    def members_of(self, tx: Session | Connection, charge_id: int) -> np.ndarray:
        """The pseudonyms (hex) a local-DP charge charged, from ``charge_members``."""
        blob = tx.scalar(select(ChargeMembers.members)
                         .where(ChargeMembers.charge_id == charge_id))
        if blob is None:
            return np.zeros(0, dtype="<U64")
        h = bytes(blob).hex()
        w = 2 * pseudonyms.PSEUDONYM_BYTES
        return np.asarray([h[i:i + w] for i in range(0, len(h), w)], dtype="<U64")

    @staticmethod
    def add_charge(s: Session, ds: Dataset, values: dict[str, Any],
                   spent: dict[str, Any] | None = None) -> Charge:
        """:meth:`insert_charge` in an ORM session: the charge row (``values``: every column
        but ``id``), flushed so that it has its id, counted on ``ds`` (locked by the caller),
        whose running totals become ``spent`` (column → value) if given."""
        c = Charge(**values)
        s.add(c)
        for col, value in (spent or {}).items():
            setattr(ds, col, value)
        ds.charge_count += 1
        s.flush()
        return c

    @staticmethod
    def charge_dataset_ids(s: Session, charge_ids: Sequence[int]) -> dict[int, int]:
        """charge id → its dataset id, for those of ``charge_ids`` that exist."""
        if not charge_ids:
            return {}
        return dict(s.execute(select(Charge.id, Charge.dataset_id)
                              .where(Charge.id.in_(list(charge_ids)))).all())

    @staticmethod
    def charges_of(s: Session, dataset_id: int) -> list[Charge]:
        """Every charge of a dataset, oldest first."""
        return list(s.scalars(select(Charge).where(Charge.dataset_id == dataset_id)
                              .order_by(Charge.id)))

