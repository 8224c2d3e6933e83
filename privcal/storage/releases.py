"""Releases in the ledger: insert one tied to its charges, find them, read them as records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from privcal.errors import NotFound, check_row_id, check_text
from privcal.storage.audit import now
from privcal.storage.models import Dataset, ReleaseRow
from privcal.storage.records import ReleaseRecord, parse_threshold

__all__ = ["ReleaseStore"]


class ReleaseStore:
    """The release operations of a :class:`~privcal.storage.ledger.Ledger`."""

    # ``read`` is the Ledger's

    @staticmethod
    def insert_release(s: Session, dataset_id: int, values: dict[str, Any],
                       charge_ids: Sequence[int]) -> ReleaseRow:
        """Insert a release row of ``dataset_id`` (``values``: its stored fields), tied to
        ``charge_ids`` (the first is its ``charge_id``); flushed so that it has its id."""
        ids = list(charge_ids)
        row = ReleaseRow(dataset_id=dataset_id, created_at=now(),
                         charge_id=ids[0] if ids else None, charge_ids=ids, **values)
        s.add(row)
        s.flush()
        return row

    @staticmethod
    def release_id_for_charge(s: Session, charge_id: int) -> int | None:
        """The release made under ``charge_id`` (its first charge), if any."""
        return s.scalars(select(ReleaseRow.id)
                         .where(ReleaseRow.charge_id == charge_id)).first()

    @staticmethod
    def release_record(row: ReleaseRow, dataset_name: str) -> ReleaseRecord:
        """A release row as the record the library returns."""
        return ReleaseRecord(
            id=row.id, dataset=dataset_name, method=row.method,
            calibrator_version=row.calibrator_version, distribution=row.distribution,
            distribution_version=row.distribution_version, params=row.params, shape=row.shape,
            threshold=parse_threshold(row.threshold), coverage=row.coverage, privacy=row.privacy,
            diagnostics=row.diagnostics, requester=row.requester, created_at=row.created_at,
            charge_id=row.charge_id, charge_ids=list(row.charge_ids or []),
        )

    def releases(self, dataset: str | None = None) -> list[ReleaseRecord]:
        """Every release, oldest first, optionally of one dataset (NotFound if there is none)."""
        if dataset is not None:
            check_text(dataset, "dataset name")
        with self.read() as s:
            stmt = select(ReleaseRow, Dataset.name).join(
                Dataset, Dataset.id == ReleaseRow.dataset_id)
            if dataset is not None:
                if s.scalars(select(Dataset.id).where(Dataset.name == dataset)).first() is None:
                    raise NotFound(f"unknown dataset {dataset!r}")
                stmt = stmt.where(Dataset.name == dataset)
            rows = s.execute(stmt.order_by(ReleaseRow.id)).all()
            return [self.release_record(r, n) for r, n in rows]

    def release(self, release_id: int) -> ReleaseRecord:
        """One release by id (NotFound if there is none)."""
        release_id = check_row_id(release_id, "release")
        with self.read() as s:
            row = s.execute(
                select(ReleaseRow, Dataset.name)
                .join(Dataset, Dataset.id == ReleaseRow.dataset_id)
                .where(ReleaseRow.id == release_id)
            ).first()
            if row is None:
                raise NotFound(f"unknown release {release_id}")
            return self.release_record(row[0], row[1])
