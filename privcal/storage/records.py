"""Serializable results of ledger reads (pydantic), independent of the ORM session."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

__all__ = ["AuditHeadInfo", "ReleaseRecord", "UTCDateTime", "VerifyReport", "parse_threshold"]


def _utc(dt: datetime) -> datetime:
    # SQLite hands back naive datetimes (stored as UTC); PostgreSQL aware ones in the session zone
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


#: a timestamp always in aware UTC, whichever backend it came from
UTCDateTime = Annotated[datetime, AfterValidator(_utc)]


def parse_threshold(s: str) -> float:
    """The stored threshold string back to a float ("Infinity" → inf)."""
    if s == "Infinity":
        return math.inf
    if s == "-Infinity":
        return -math.inf
    return float(s)


class ReleaseRecord(BaseModel):
    """A release as stored; ``coverage`` is the CoverageGuarantee as a plain dict.

    :class:`privcal.accountant.Release` is the same record with ``coverage`` typed
    (storage does not import the calibrators package).
    """

    model_config = ConfigDict(frozen=True)

    id: int
    dataset: str
    method: str
    calibrator_version: str
    distribution: str
    distribution_version: str
    params: dict[str, Any]
    shape: dict[str, Any]
    threshold: float
    coverage: dict[str, Any]
    privacy: dict[str, Any]
    diagnostics: dict[str, Any]
    requester: str | None
    created_at: UTCDateTime
    charge_id: int | None
    charge_ids: list[int]


class AuditHeadInfo(BaseModel):
    """The head of the audit log: ``f"{seq}:{entry_hash}"`` is what to keep outside the database."""

    model_config = ConfigDict(frozen=True)

    seq: int
    entry_hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.entry_hash}"


class VerifyReport(BaseModel):
    """A successful verification: how many entries, and the head they chain to."""

    model_config = ConfigDict(frozen=True)

    entries: int
    head: str
    datasets: int
    charges: int
    releases: int
    #: with a signed head: the last entry it covers, and how many entries follow it
    signed_through: int | None = None
    #: when the newest signed head was signed (its own ``time``, as signed)
    signed_at: str | None = None
    unsigned_entries: int = 0
    #: how many kept heads (expected and signed) the log was checked against; 0: a log whose
    #: newest entries were removed, or rewritten with every hash recomputed, verifies too
    heads_checked: int = 0
    #: entries committed with their rows but not yet chained (PostgreSQL's ``audit_queue``,
    #: left when the sequencer could not run: a read-only connection), checked against
    #: their rows, and when the oldest was committed
    queued: int = 0
    queued_since: UTCDateTime | None = None
    #: with ``expect_head``: the entry it names, and how many entries follow it (chained or
    #: queued), which it does not cover
    expected_through: int | None = None
    after_expected: int = 0
    #: datasets whose (ε, δ) cap was not checked against its Rényi filter (the storage's
    #: ``Ledger.verify`` without ``cap_check``: accountant mathematics); 0 when every cap was
    #: checked — always so for :meth:`privcal.accountant.Accountant.verify`, the CLI and the
    #: service (red team 26, ledger F10: an overspent (ε, δ) ledger verified, silently)
    caps_unchecked: int = 0
    #: pure-cost releases on a ρ-zCDP cap whose pure charges count less than the release's
    #: whole ε²/2: paid for only if the release composes separately charged runs, which the
    #: calibrators say, not the storage — 0 for :meth:`privcal.accountant.Accountant.verify`,
    #: which recomputes them; ``Ledger.sign_head`` refuses a log with any (red team 26,
    #: payrule F1: a 3-DP release paid by three PureDP(1) charges was signed)
    releases_unchecked: int = 0
