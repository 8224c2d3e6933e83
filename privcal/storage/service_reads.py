"""The few reads the HTTP service needs that the library has no call for: a page of audit
entries as stored (``GET /v1/audit/entries``), the reports subjects have stored in a
session (the report writer; ``/v1/whoami``, with whether a subject's cap still allows its
session's report). Moved out of :mod:`privcal.storage.tokens`,
which re-exports them, to keep that module within 400 lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import select

from privcal.errors import InvalidInput
from privcal.storage.models import AuditEntry, Dataset, cap_units, spend_units
from privcal.storage.pseudonyms import BATCH_IDS_PG
from privcal.storage.sessions import CollectionSession, SessionReport

__all__ = ["AuditEntryDoc", "audit_entries", "stored_report", "stored_reports", "subject_standing"]


class AuditEntryDoc(BaseModel):
    """One audit entry as stored: the canonical payload and the hashes that chain it."""

    model_config = ConfigDict(frozen=True)

    seq: int
    kind: str
    payload: str
    prev_hash: str
    entry_hash: str


def audit_entries(ledger: Any, *, after: int = 0, limit: int = 100) -> list[AuditEntryDoc]:
    """Entries with ``seq > after``, in order, at most ``limit`` (≤ 1000)."""
    if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after < 2**31:
        raise InvalidInput("after must be an integer in [0, 2³¹−1]")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise InvalidInput("limit must be an integer in [1, 1000]")
    ledger.sequence_audit(read_only_ok=True)  # every committed entry chained first
    with ledger.read() as s:
        rows = s.scalars(select(AuditEntry).where(AuditEntry.seq > after)
                         .order_by(AuditEntry.seq).limit(limit))
        return [AuditEntryDoc(seq=r.seq, kind=r.kind, payload=r.payload, prev_hash=r.prev_hash,
                              entry_hash=r.entry_hash) for r in rows]


def stored_report(ledger: Any, session_id: int, subject: str) -> tuple[int, str] | None:
    """(round, value) of the report ``subject`` has stored in ``session_id``, if any
    (looked up by its pseudonym: reports never store the id)."""
    pseudonym = str(ledger.pseudonyms([str(subject)])[0])
    with ledger.read() as s:
        row = s.get(SessionReport, (int(session_id), pseudonym))
        return (row.round, row.value) if row is not None else None


# The reports a batch's subjects already stored (PostgreSQL; pseudonyms are hex, joined by
# newlines): looked up by the whole primary key, one probe per id, as the session batch's
# probe (storage/session_store.py). `session_id = :sid AND subject IN (…)` was planned, on a
# table never ANALYZEd, as a scan of all the session's reports filtered by the IN: the
# service's report writer runs it twice per batch, 55 ms per call on average over a
# 20 000-report session (bench/RESULTS.md, "Device reports at a session's size").
_STORED_PG = (f"SELECT r.subject, r.round, r.value, r.batch FROM {BATCH_IDS_PG} CROSS JOIN "
              "LATERAL (SELECT subject, round, value, batch FROM session_reports "
              "WHERE session_id = %(sid)s "
              "AND subject = b.subject LIMIT 1) r")


def stored_reports(ledger: Any, session_id: int,
                   subjects: Sequence[str]) -> dict[str, tuple[int, str, int | None]]:
    """(round, value, batch) per subject among ``subjects`` that has a stored report
    (``batch``: the session batch that stored it; None before migration 0005)."""
    out: dict[str, tuple[int, str, int | None]] = {}
    subs = [str(x) for x in subjects]
    of = dict(zip(ledger.pseudonyms(subs).tolist(), subs, strict=True))  # pseudonym → id
    pseud = list(of)
    if not pseud:
        return out
    with ledger.read() as s:
        if ledger.backend == "postgresql":  # one primary-key probe per id: see _STORED_PG
            with s.connection().connection.driver_connection.cursor() as cur:
                rows = cur.execute(_STORED_PG, {"sid": int(session_id), "ids": "\n".join(pseud)},
                                   prepare=False).fetchall()
            return {of[subj]: (rnd, val, batch) for subj, rnd, val, batch in rows}
        for i in range(0, len(pseud), 500):
            chunk = pseud[i:i + 500]
            for r in s.scalars(select(SessionReport).where(
                    SessionReport.session_id == int(session_id),
                    SessionReport.subject.in_(chunk))):
                out[of[r.subject]] = (r.round, r.value, r.batch)
    return out


def subject_standing(ledger: Any, session_id: int, subject: str
                     ) -> tuple[int | None, bool | None]:
    """What ``GET /v1/whoami`` tells a device (subject) or agent token, in one read under
    one pseudonym: the round of the report it has stored in the session (None: none), and
    whether it still has the session's ε0 left under the dataset's per-subject ε cap — the
    test a report of it meets when it arrives (:mod:`privcal.accountant.sessions.ingest`:
    spent + ε0 ≤ cap, in units). A report that fails it is refused *after* it left the
    device, an ε0-LDP output the server saw and the ledger does not count, so a client asks
    first (red team 10). None for the cap: the session charges nothing per report (no ε0),
    or no longer exists."""
    pseudonym = str(ledger.pseudonyms([str(subject)])[0])
    with ledger.read() as s:
        stored = s.get(SessionReport, (int(session_id), pseudonym))
        rnd = stored.round if stored is not None else None
        row = s.get(CollectionSession, int(session_id))
        eps0 = row.state.get("eps0") if row is not None else None
        if row is None or eps0 is None:
            return rnd, None
        ds = s.get(Dataset, row.dataset_id)
        cap_u = cap_units(ds.subject_epsilon or Decimal(0)) if ds is not None else 0
        spent = ledger.subject_units(s, row.dataset_id, pseudonym)
        return rnd, spent <= cap_u - spend_units(Decimal(str(eps0)))
