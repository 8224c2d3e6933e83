"""Releases in the ledger: insert one tied to its charges, find them, read them as records."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from privcal.errors import NotFound, check_row_id, check_text
from privcal.storage.audit import now
from privcal.storage.logged_rows import check_release_logged
from privcal.storage.models import Charge, Dataset, ReleaseCharge, ReleaseKey, ReleaseRow
from privcal.storage.records import ReleaseRecord, parse_threshold
from privcal.storage.sessions import CollectionSession
from privcal.storage.verify_releases import PaidBy, paid_by

#: ids per ``IN (…)`` list (SQLite's default limit on bound parameters is 999 in old builds)
_CHUNK = 500

#: the largest release or session id a ledger holds: their id columns are 32-bit integers on
#: PostgreSQL, which refuses a larger bound value with an error (a 500), not "no such row"
MAX_STORED_ID = 2**31 - 1

__all__ = ["MAX_STORED_ID", "ReleaseStore", "stored_id"]


def stored_id(value: object, what: str) -> int:
    """A release or session id given by a caller, as the row id to look up: an ``int`` (not
    a bool, not a string: :class:`~privcal.errors.InvalidInput`); one outside
    1 … :data:`MAX_STORED_ID` names no row — :class:`~privcal.errors.NotFound` ("unknown
    release N"), on every backend, before any query (red team 8)."""
    value = check_row_id(value, what)
    if value > MAX_STORED_ID:
        raise NotFound(f"unknown {what} {value}")
    return value


class ReleaseStore:
    """The release operations of a :class:`~privcal.storage.ledger.Ledger`."""

    # ``read`` is the Ledger's

    @staticmethod
    def insert_release(s: Session, dataset_id: int, values: dict[str, Any],
                       charge_ids: Sequence[int],
                       key: tuple[str, str] | None = None) -> ReleaseRow:
        """Insert a release row of ``dataset_id`` (``values``: its stored fields), tied to
        ``charge_ids`` (the first is its ``charge_id``); flushed so that it has its id.
        ``key``: (idempotency key, request digest) of a non-private calibration, bound to
        the release in ``release_keys`` (0010; its primary key refuses a second)."""
        ids = list(charge_ids)
        row = ReleaseRow(dataset_id=dataset_id, created_at=now(),
                         charge_id=ids[0] if ids else None, charge_ids=ids, **values)
        s.add(row)
        s.flush()
        # which release each charge paid for: the primary key refuses a second (0009)
        s.add_all([ReleaseCharge(charge_id=i, release_id=row.id) for i in ids])
        if key is not None:
            s.add(ReleaseKey(dataset_id=dataset_id, idempotency_key=key[0],
                             request_digest=key[1], release_id=row.id))
        s.flush()
        return row

    @staticmethod
    def release_by_key(s: Session, dataset_id: int, key: str) -> tuple[str, int] | None:
        """(request digest, release id) of the non-private calibration of ``dataset_id``
        made under idempotency key ``key``, if any (``release_keys``)."""
        row = s.execute(select(ReleaseKey.request_digest, ReleaseKey.release_id).where(
            ReleaseKey.dataset_id == dataset_id, ReleaseKey.idempotency_key == key)).first()
        return (str(row[0]), int(row[1])) if row is not None else None

    @staticmethod
    def release_id_for_charge(s: Session, charge_id: int) -> int | None:
        """The release made under ``charge_id`` (its first charge), if any."""
        return s.scalars(select(ReleaseRow.id)
                         .where(ReleaseRow.charge_id == charge_id)).first()

    @staticmethod
    def charge_owners(s: Session, charge_ids: Sequence[int]) -> dict[int, int]:
        """charge id → the release it paid for, for those of ``charge_ids`` that paid for one
        (``release_charges``, by primary key: a charge pays for one release)."""
        ids = sorted({int(i) for i in charge_ids})
        out: dict[int, int] = {}
        for k in range(0, len(ids), _CHUNK):
            out.update((int(c), int(r)) for c, r in s.execute(
                select(ReleaseCharge.charge_id, ReleaseCharge.release_id)
                .where(ReleaseCharge.charge_id.in_(ids[k:k + _CHUNK]))))
        return out

    @staticmethod
    def release_charge_links(s: Session) -> dict[int, int]:
        """Every row of ``release_charges``: charge id → release id (for verify)."""
        return {int(c): int(r) for c, r in s.execute(
            select(ReleaseCharge.charge_id, ReleaseCharge.release_id))}

    @staticmethod
    def open_session_charges(s: Session, dataset_id: int) -> dict[int, int]:
        """charge id → session id, for every charge an unreleased collection session of
        ``dataset_id`` made — open (its release will name them) or abandoned (they paid for
        the reports it stored): its batches' charges and its central charge."""
        out: dict[int, int] = {}
        rows = s.execute(select(CollectionSession.id, CollectionSession.state).where(
            CollectionSession.dataset_id == dataset_id, CollectionSession.release_id.is_(None)))
        for sid, st in rows:
            st = st or {}
            for cid in [*st.get("charge_ids", []), st.get("central_charge_id")]:
                if cid is not None:
                    out[int(cid)] = int(sid)
        return out

    def session_reports(self, release_id: int | None = None) -> dict[int, int]:
        """release id → the reports its collection session accepted (``state.total``), for
        the releases a session made (or that one: an id that names no release, e.g. one
        past :data:`MAX_STORED_ID`, has none)."""
        if release_id is not None:
            try:
                release_id = stored_id(release_id, "release")
            except NotFound:
                return {}
        with self.read() as s:
            stmt = select(CollectionSession.release_id, CollectionSession.state).where(
                CollectionSession.release_id.is_not(None))
            if release_id is not None:
                stmt = stmt.where(CollectionSession.release_id == release_id)
            return {int(r): int((st or {}).get("total", 0))
                    for r, st in s.execute(stmt)}

    @staticmethod
    def charges_paid(s: Session, charge_ids: Sequence[int]) -> dict[int, PaidBy]:
        """charge id → what it paid (dataset, scope, amounts), for those of ``charge_ids``
        that exist."""
        ids = sorted({int(i) for i in charge_ids})
        out: dict[int, PaidBy] = {}
        for k in range(0, len(ids), _CHUNK):
            for c in s.scalars(select(Charge).where(Charge.id.in_(ids[k:k + _CHUNK]))):
                out[c.id] = paid_by(c)
        return out

    def release_charges(self, charge_ids: Sequence[int]) -> dict[int, PaidBy]:
        """:meth:`charges_paid` in a read transaction of its own."""
        with self.read() as s:
            return self.charges_paid(s, charge_ids)

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

    def releases(self, dataset: str | None = None, *, after: int = 0, limit: int | None = None,
                 among: Sequence[str] | None = None) -> list[ReleaseRecord]:
        """Every release, oldest first, optionally of one dataset (NotFound if there is none):
        those with ``id > after``, at most ``limit``, of the datasets named in ``among`` if
        given — in the query (red team 18: the service read every release of every dataset
        to answer one page of one)."""
        if dataset is not None:
            check_text(dataset, "dataset name")
        with self.read() as s:
            stmt = select(ReleaseRow, Dataset.name).join(
                Dataset, Dataset.id == ReleaseRow.dataset_id)
            if dataset is not None:
                if s.scalars(select(Dataset.id).where(Dataset.name == dataset)).first() is None:
                    raise NotFound(f"unknown dataset {dataset!r}")
                stmt = stmt.where(Dataset.name == dataset)
            if among is not None:
                stmt = stmt.where(Dataset.name.in_(list(among)))
            if after:
                stmt = stmt.where(ReleaseRow.id > after)
            stmt = stmt.order_by(ReleaseRow.id)
            if limit is not None:
                stmt = stmt.limit(limit)
            rows = s.execute(stmt).all()
            return [self.release_record(r, n) for r, n in rows]

    def release(self, release_id: int, *, checked: bool = False,
                visible: Callable[[str], bool] | None = None) -> ReleaseRecord:
        """One release by id (NotFound if there is none, or if the id is outside
        1 … :data:`MAX_STORED_ID`: :func:`stored_id`). ``checked``: the row must be what its
        audit entry recorded (:func:`~privcal.storage.logged_rows.check_release_logged`,
        AuditFailed otherwise): a release about to be used for prediction (red team 16).
        ``visible``: a test of the release's dataset name; a release it rejects is NotFound
        like a missing one, before it is checked (a refusal would say that it exists)."""
        release_id = stored_id(release_id, "release")
        with self.read() as s:
            row = s.execute(
                select(ReleaseRow, Dataset.name)
                .join(Dataset, Dataset.id == ReleaseRow.dataset_id)
                .where(ReleaseRow.id == release_id)
            ).first()
            if row is None or (visible is not None and not visible(row[1])):
                raise NotFound(f"unknown release {release_id}")
            if checked:
                check_release_logged(s, row[0], row[1])
            return self.release_record(row[0], row[1])
