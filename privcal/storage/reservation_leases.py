"""Keeping a running keyed request's reservation its own: the pending record of an
Idempotency-Key whose request still runs is touched (its ``created_at`` moved to now), so
that a retry takes it over only when its request died — no touch for longer than
:data:`~privcal.storage.tokens.PENDING_TTL` — and never while it runs (red team 9: a
non-private calibration running past five minutes was run a second time by its retry, two
releases for one key). :mod:`privcal.service.leases` touches them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, update
from sqlalchemy.orm import Session

from privcal.storage.audit import now
from privcal.storage.tokens import IdempotencyRecord

__all__ = ["touch_pending"]


def touch_pending(ledger: Any, keys: Sequence[tuple[str, str]]) -> None:
    """Move the ``created_at`` of every still-pending record among ``keys`` ((principal,
    key) pairs) to now, in one transaction; finished or forgotten ones are left alone."""
    if not keys:
        return
    # PostgreSQL: the server's clock, as reserve_idempotent reads it — never a comparison of
    # two hosts' wall clocks (red team 11: a retry on a host 6 min ahead took a running
    # request over); SQLite: this host's, the only one
    t = func.now() if ledger.backend == "postgresql" else now()

    def tx(s: Session) -> None:
        for principal, key in keys:
            s.execute(update(IdempotencyRecord)
                      .where(IdempotencyRecord.principal == principal,
                             IdempotencyRecord.key == key,
                             IdempotencyRecord.state == "pending")
                      .values(created_at=t))

    ledger.write(tx)
