"""SQLAlchemy 2.0 models of the ledger.

The schema is created only by the Alembic migrations in ``privcal/migrations``
(tests may call ``Base.metadata.create_all`` on a scratch database, nothing else
does). The migration ``0001`` must stay in step with these classes.

Exact amounts: :class:`ExactDecimal` is ``NUMERIC(48, 30)`` on PostgreSQL and a
decimal *string* on SQLite (whose NUMERIC affinity would turn ``0.3`` into a
binary float). Per-subject spends are integers in units of 10⁻¹² ε
(:data:`SUBJECT_UNIT`) so that the bulk local-DP update can compare and add in
SQL on both backends.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    Numeric,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator, TypeEngine

from privcal.costs import fixed_context

__all__ = [
    "MAX_SUBJECT_UNITS",
    "SUBJECT_UNIT",
    "AuditEntry",
    "AuditHead",
    "AuditQueue",
    "Base",
    "Charge",
    "ChargeMembers",
    "Dataset",
    "ExactDecimal",
    "LedgerSecret",
    "ReleaseCharge",
    "ReleaseRow",
    "SubjectBaseline",
    "SubjectSpend",
    "cap_units",
    "exact_numeric",
    "exact_text",
    "exact_value",
    "read_ledger_secret",
    "spend_units",
    "units_eps",
]

#: per-subject spends are stored as integer multiples of this ε
SUBJECT_UNIT = Decimal("1e-12")

#: the largest per-subject cap in units (ε = 10⁶): spends are 64-bit integers, and a spend
#: plus a charge, each at most this, must stay below 2⁶³ − 1 on both backends
MAX_SUBJECT_UNITS = 10**18

#: the context of every conversion between ε and units: exact for any amount the ledger stores
#: (NUMERIC(48, 30), 18 integer digits), whatever decimal context the caller has set — under
#: a caller's ``getcontext().prec = 13`` a cap of 10.999999999999 divided in the default
#: context became 11 × 10¹² units, and a subject spent 11 against it
_UNITS = fixed_context(100)  # every field given: nothing from decimal.DefaultContext


def _units(eps: Decimal, rounding: str) -> int:
    """``eps`` in whole units of :data:`SUBJECT_UNIT`, rounded by ``rounding``."""
    return int(_UNITS.divide(Decimal(eps), SUBJECT_UNIT).to_integral_value(rounding=rounding))


def spend_units(eps: Decimal) -> int:
    """A per-subject spend ε0 in whole units of :data:`SUBJECT_UNIT`, rounded up (a spend
    is never under-counted; ε0 has at most 12 decimals when charged, so this is exact)."""
    return _units(eps, ROUND_CEILING)


def cap_units(eps: Decimal) -> int:
    """A per-subject cap in whole units of :data:`SUBJECT_UNIT`, rounded down (a cap is never
    raised), and at most :data:`MAX_SUBJECT_UNITS` (a larger cap, which a dataset can no longer
    be given, is lowered to it: a spend past it could not be stored)."""
    return min(_units(eps, ROUND_FLOOR), MAX_SUBJECT_UNITS)


def units_eps(units: int) -> Decimal:
    """Whole units of :data:`SUBJECT_UNIT` as the exact ε they stand for."""
    return _UNITS.multiply(Decimal(int(units)), SUBJECT_UNIT)


def exact_numeric(value: Any) -> Decimal | None:
    """An exact amount as PostgreSQL's driver is given it: a finite Decimal."""
    if value is None:
        return None
    d = value if isinstance(value, Decimal) else Decimal(str(value))
    if not d.is_finite():
        raise ValueError("exact amounts must be finite")
    return d


def exact_text(value: Any) -> str | None:
    """An exact amount as SQLite stores it: a plain decimal string (``format(d, "f")``)."""
    d = exact_numeric(value)
    return None if d is None else format(d, "f")


def exact_value(value: Any) -> Decimal | None:
    """A stored exact amount (a string on SQLite, a Decimal on PostgreSQL) as a Decimal."""
    if value is None:
        return None
    return value if isinstance(value, Decimal) else Decimal(str(value))


class ExactDecimal(TypeDecorator[Decimal]):
    """An exact decimal: NUMERIC(48, 30) on PostgreSQL, a decimal string elsewhere.

    Its conversions are the plain functions :func:`exact_text`, :func:`exact_numeric` and
    :func:`exact_value`, which the hot path's codec calls directly
    (:meth:`plain_processors`; issue 11: SQLAlchemy's wrappers cost two more calls a value).
    """

    impl = String(64)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(Numeric(48, 30, asdecimal=True))
        return dialect.type_descriptor(String(64))

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return exact_numeric(value) if dialect.name == "postgresql" else exact_text(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal | None:
        return exact_value(value)

    @staticmethod
    def plain_processors(dialect: Dialect) -> tuple[Callable[[Any], Any],
                                                    Callable[[Any], Decimal | None]]:
        """(bind, result): :meth:`process_bind_param` and :meth:`process_result_value` on
        ``dialect`` as one-argument functions (before the impl type's own processing, if
        any)."""
        return (exact_numeric if dialect.name == "postgresql" else exact_text), exact_value


class Base(DeclarativeBase):
    """Declarative base of the ledger models."""


class Dataset(Base):
    """A dataset and its budget policy, with exact running totals of central charges."""

    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("name", name="uq_datasets_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    notion: Mapped[str] = mapped_column(String(16))  # pure | zcdp | approx
    cap_epsilon: Mapped[Decimal | None] = mapped_column(ExactDecimal, nullable=True)
    cap_rho: Mapped[Decimal | None] = mapped_column(ExactDecimal, nullable=True)
    cap_delta: Mapped[Decimal | None] = mapped_column(ExactDecimal, nullable=True)
    reporting_delta: Mapped[Decimal] = mapped_column(ExactDecimal)
    subject_epsilon: Mapped[Decimal | None] = mapped_column(ExactDecimal, nullable=True)
    allow_nonprivate: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # the (ε, δ) cap's grid of Rényi orders, decimal strings, fixed at creation (migration 0005);
    # NULL for pure and zCDP caps, and for (ε, δ) datasets created before the grid existed
    # (those use accounting.MIGRATED_RENYI_ORDERS)
    renyi_orders: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # running totals (exact); `privcal audit verify` re-derives them from the charges
    spent_pure_eps: Mapped[Decimal] = mapped_column(ExactDecimal, default=Decimal(0))
    spent_pure_rho: Mapped[Decimal] = mapped_column(ExactDecimal, default=Decimal(0))
    spent_zcdp_rho: Mapped[Decimal] = mapped_column(ExactDecimal, default=Decimal(0))
    spent_approx_eps: Mapped[Decimal] = mapped_column(ExactDecimal, default=Decimal(0))
    spent_approx_delta: Mapped[Decimal] = mapped_column(ExactDecimal, default=Decimal(0))
    charge_count: Mapped[int] = mapped_column(Integer, default=0)


class Charge(Base):
    """One accepted charge: central (scope ``dataset``) or a local-DP batch (scope ``subjects``)."""

    __tablename__ = "charges"
    __table_args__ = (UniqueConstraint("dataset_id", "idempotency_key", name="uq_charge_idem"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # no index of its own: uq_charge_idem (dataset_id, idempotency_key) serves look-ups by
    # dataset, and a second index let a generic plan scan every charge of a dataset for a key
    # (migration 0007)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    scope: Mapped[str] = mapped_column(String(16))  # dataset | subjects
    notion: Mapped[str] = mapped_column(String(16))  # pure | zcdp | approx | local
    epsilon: Mapped[Decimal | None] = mapped_column(ExactDecimal, nullable=True)
    delta: Mapped[Decimal | None] = mapped_column(ExactDecimal, nullable=True)
    rho: Mapped[Decimal | None] = mapped_column(ExactDecimal, nullable=True)
    eps0: Mapped[Decimal | None] = mapped_column(ExactDecimal, nullable=True)
    subjects_accepted: Mapped[int | None] = mapped_column(Integer, nullable=True)
    subjects_rejected: Mapped[int | None] = mapped_column(Integer, nullable=True)
    purpose: Mapped[str | None] = mapped_column(Text, nullable=True)
    requester: Mapped[str | None] = mapped_column(String(200), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # SHA-256 of the canonical request an idempotency key was first used for (issue 16.1)
    request_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # commitment to the pseudonyms a local-DP batch charged (see ChargeMembers)
    members_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)


class ChargeMembers(Base):
    """The sorted pseudonyms (32 raw bytes each) one local-DP charge charged.

    ``audit verify`` recomputes every per-subject spend from these rows (plus the
    migration baseline) and checks each against the ``members_digest`` its charge's
    audit entry committed to (:mod:`privcal.storage.pseudonyms`).
    """

    __tablename__ = "charge_members"

    charge_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    members: Mapped[bytes] = mapped_column(LargeBinary)


class SubjectBaseline(Base):
    """Per-subject spends as they stood when migration 0005 ran (committed in its audit entry)."""

    __tablename__ = "subject_baseline"

    dataset_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    subject: Mapped[str] = mapped_column(String(200), primary_key=True)
    spent_units: Mapped[int] = mapped_column(BigInteger)


class LedgerSecret(Base):
    """The per-ledger HMAC key of subject pseudonyms (one row, id = 1; hex). Never logged:
    read with :func:`read_ledger_secret`, written with the engines' hidden parameters."""

    __tablename__ = "ledger_secret"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    secret: Mapped[str] = mapped_column(String(64))


def read_ledger_secret(conn: Any) -> str | None:
    """The ledger's secret (hex), or None, read on the driver's own cursor of ``conn`` (a
    SQLAlchemy connection or ORM session): SQLAlchemy logs the rows it fetches when an
    application sets ``sqlalchemy.engine`` to DEBUG, and the secret is what lets a reader
    of the ledger test a guessed subject id (red team 11)."""
    raw = (conn.connection() if hasattr(conn, "get_bind") else conn).connection.driver_connection
    cur = raw.cursor()
    try:
        cur.execute("SELECT secret FROM ledger_secret WHERE id = 1")
        row = cur.fetchone()
    finally:
        cur.close()
    return None if row is None else str(row[0])


class SubjectSpend(Base):
    """Local-DP budget spent by one data subject of one dataset, in units of 10⁻¹² ε."""

    __tablename__ = "subject_spend"
    # No foreign key: a 10⁶-subject batch would fire 10⁶ FK triggers on PostgreSQL (~17 s);
    # rows are only written by privcal under the dataset's row lock, and `audit verify`
    # checks their sum. Free space per page lets PostgreSQL update spends in place (HOT).
    __table_args__ = ({"postgresql_with": {"fillfactor": 70}},)

    dataset_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    subject: Mapped[str] = mapped_column(String(200), primary_key=True)  # pseudonym (hex HMAC)
    spent_units: Mapped[int] = mapped_column(BigInteger)


class ReleaseRow(Base):
    """A released threshold with every input its guarantees depend on."""

    __tablename__ = "releases"
    __table_args__ = (UniqueConstraint("charge_id", name="uq_releases_charge_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), index=True)
    method: Mapped[str] = mapped_column(String(100))
    calibrator_version: Mapped[str] = mapped_column(String(50))
    distribution: Mapped[str] = mapped_column(String(200))
    distribution_version: Mapped[str] = mapped_column(String(50))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)
    threshold: Mapped[str] = mapped_column(String(64))  # shortest float repr, or "Infinity"
    coverage: Mapped[dict[str, Any]] = mapped_column(JSON)
    privacy: Mapped[dict[str, Any]] = mapped_column(JSON)
    diagnostics: Mapped[dict[str, Any]] = mapped_column(JSON)
    requester: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    charge_id: Mapped[int | None] = mapped_column(ForeignKey("charges.id"), nullable=True)
    charge_ids: Mapped[list[int]] = mapped_column(JSON)


class ReleaseCharge(Base):
    """Which release a charge paid for (migration 0009): one row per element of a release's
    ``charge_ids``, so that "a charge pays for one release" is the primary key and is looked
    up by index. ``audit verify`` derives the same from the releases' ``charge_ids`` (the
    hash-chained source) and checks this table against it."""

    __tablename__ = "release_charges"

    charge_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    release_id: Mapped[int] = mapped_column(Integer, index=True)


class ReleaseKey(Base):
    """The idempotency key of a non-private calibration (migration 0010), written with its
    release: a key binds a charged request through its charge, and a non-private one, which
    charges nothing, through this row (the request's digest and the release it made)."""

    __tablename__ = "release_keys"

    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), primary_key=True,
                                            autoincrement=False)
    idempotency_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    request_digest: Mapped[str] = mapped_column(String(64))
    release_id: Mapped[int] = mapped_column(Integer)


def release_id_sql(dialect: str, table: str) -> str:
    """The release id that an entry of ``table`` (``audit_log``, ``audit_queue``) records, as
    migration 0011 indexes it (``ix_<table>_release_id``, partial: ``kind = 'release'``) and
    as :mod:`privcal.storage.logged_rows` must spell it for a planner to use the index.
    PostgreSQL: the digits after the text's first ``"release_id":`` (built-in and never
    raising; a queued prefix holds the id too); SQLite: ``json_extract`` under
    ``json_valid`` (a queued prefix completed with seq 0:
    :func:`~privcal.storage.audit.payload_at`)."""
    if dialect == "postgresql":
        col = "payload" if table == "audit_log" else "prefix"
        # PostgreSQL's own spelling (pg_get_indexdef), which autogenerate compares
        return f"(\"substring\"({col}, '\"release_id\":([0-9]{{1,18}})'::text))::bigint"
    col = "payload" if table == "audit_log" else "prefix || '0}'"
    return f"CASE WHEN json_valid({col}) THEN json_extract({col}, '$.data.release_id') END"


def _release_id_index(table: str) -> Index:
    """Migration 0011's index in its PostgreSQL spelling (SQLAlchemy does not reflect
    SQLite's expression indexes, so autogenerate compares PostgreSQL's only)."""
    return Index(f"ix_{table}_release_id", text(release_id_sql("postgresql", table)),
                 postgresql_where=text("kind = 'release'")).ddl_if(dialect="postgresql")


class AuditEntry(Base):
    """One entry of the hash-chained log (see :mod:`privcal.storage.audit`)."""

    __tablename__ = "audit_log"
    __table_args__ = (_release_id_index("audit_log"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[str] = mapped_column(String(64))
    entry_hash: Mapped[str] = mapped_column(String(64))


class AuditHead(Base):
    """A single row (id = 1) holding the head of the log; locked by every append."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(Integer)
    entry_hash: Mapped[str] = mapped_column(String(64))


class AuditQueue(Base):
    """Audit entries committed with their rows but not yet numbered into the chain (PostgreSQL).

    A write transaction that finds the audit sequencer busy queues its entries here, as
    :func:`~privcal.storage.audit.entry_prefix` made them, and commits; a sequencer then
    numbers, hashes and moves them into ``audit_log`` in ``id`` order
    (:mod:`privcal.storage.audit_queue`, migration 0006). SQLite ledgers never queue.
    """

    __tablename__ = "audit_queue"
    __table_args__ = (_release_id_index("audit_queue"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    prefix: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=func.now())
