"""Datasets in the ledger: find one (locked or not), list them, insert one, count releases."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from privcal.errors import AlreadyExists, NotFound, check_text
from privcal.storage.models import Dataset, ReleaseRow

__all__ = ["DatasetStore"]


class DatasetStore:
    """The dataset operations of a :class:`~privcal.storage.ledger.Ledger`."""

    # ``backend`` is the Ledger's

    def lock_dataset(self, session: Session, name: str) -> Dataset:
        """The dataset row, locked for the rest of the transaction; NotFound if there is none."""
        check_text(name, "dataset name")
        stmt = select(Dataset).where(Dataset.name == name)
        if self.backend == "postgresql":
            stmt = stmt.with_for_update()
        ds = session.scalars(stmt).one_or_none()
        if ds is None:
            raise NotFound(f"unknown dataset {name!r}")
        return ds

    @staticmethod
    def get_dataset(s: Session, name: str) -> Dataset:
        """The dataset row named ``name``, not locked (reads); NotFound if there is none."""
        check_text(name, "dataset name")
        ds = s.scalars(select(Dataset).where(Dataset.name == name)).one_or_none()
        if ds is None:
            raise NotFound(f"unknown dataset {name!r}")
        return ds

    @staticmethod
    def all_datasets(s: Session) -> list[Dataset]:
        """Every dataset row, by name."""
        return list(s.scalars(select(Dataset).order_by(Dataset.name)))

    @staticmethod
    def insert_dataset(s: Session, values: dict[str, Any]) -> Dataset:
        """Insert a dataset row (every column but ``id``), flushed so that it has its id;
        AlreadyExists if the name is taken — also when a concurrent insert of the same
        name wins the race (the unique index refuses the second)."""
        name = values["name"]
        if s.scalars(select(Dataset.id).where(Dataset.name == name)).first() is not None:
            raise AlreadyExists(f"dataset {name!r} already exists")
        ds = Dataset(**values)
        s.add(ds)
        try:
            s.flush()
        except IntegrityError as exc:
            raise AlreadyExists(f"dataset {name!r} already exists") from exc
        return ds

    @staticmethod
    def release_count(s: Session, dataset_id: int) -> int:
        """How many releases a dataset has."""
        return int(s.scalar(select(func.count()).select_from(ReleaseRow)
                            .where(ReleaseRow.dataset_id == dataset_id)) or 0)
