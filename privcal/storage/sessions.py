"""Collection sessions: interactive (LDP-CP-S) and one-round federated (FedCP-QQ, FedCP²-QQ)
protocols whose whole state lives in the ledger, so a session survives process restarts.

``collection_sessions`` holds the public protocol parameters, the protocol state (a
JSON document rewritten after every accepted batch), the status and the release it
ended in. ``session_reports`` holds each accepted report — one per subject per
session (primary key), which is what makes a session ε-LDP per subject. A report
value is a randomized bit or a grid point: a DP output, never raw data.

Audit: every session write appends an entry (kinds :data:`SESSION_KINDS`) that names
the session and counts, never subject ids. :func:`check_entry` and
:func:`check_sessions` are what :meth:`privcal.storage.Ledger.verify` runs on them.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, Integer, String, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from privcal.errors import AuditFailed
from privcal.storage.audit import jsonable
from privcal.storage.models import Base

__all__ = [
    "SESSION_KINDS",
    "CollectionSession",
    "SessionReport",
    "check_entry",
    "check_sessions",
]

#: audit entry kinds written by collection sessions
SESSION_KINDS = frozenset({"session_open", "session_batch", "session_close"})


class CollectionSession(Base):
    """One collection session: public parameters, protocol state, status, its release."""

    __tablename__ = "collection_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), index=True)
    method: Mapped[str] = mapped_column(String(100))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)  # public protocol parameters
    state: Mapped[dict[str, Any]] = mapped_column(JSON)  # protocol state / published plan
    status: Mapped[str] = mapped_column(String(16))  # open | released | closed
    shuffled: Mapped[bool] = mapped_column(Boolean, default=False)
    requester: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    release_id: Mapped[int | None] = mapped_column(ForeignKey("releases.id"), nullable=True)


class SessionReport(Base):
    """One accepted report; the primary key makes each subject answer once per session."""

    __tablename__ = "session_reports"

    # no FK on session_id: 10⁶ reports would fire 10⁶ FK checks; rows are written only by
    # privcal under the dataset lock, and `audit verify` checks the counts per session
    session_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    subject: Mapped[str] = mapped_column(String(200), primary_key=True)
    round: Mapped[int] = mapped_column(Integer)
    value: Mapped[str] = mapped_column(String(64))
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def session_doc(row: CollectionSession, dataset_name: str) -> dict[str, Any]:
    """What the ``session_open`` entry records (and ``verify`` compares with the row)."""
    return jsonable({
        "session_id": row.id,
        "dataset": dataset_name,
        "method": row.method,
        "params": row.params,
        "shuffled": bool(row.shuffled),
        "requester": row.requester,
    })


def check_entry(
    seq: int, kind: str, data: dict[str, Any], sessions: dict[int, CollectionSession],
    names: dict[int, str], tally: dict[int, int], opened: set[int],
) -> None:
    """Cross-check one session entry against the ``collection_sessions`` rows.

    Accumulates the accepted counts per session in ``tally`` for :func:`check_sessions`.
    """
    sid = data.get("session_id")
    row = sessions.get(sid) if isinstance(sid, int) else None
    if row is None:
        raise AuditFailed(f"audit entry {seq}: session {sid} is missing from the ledger")
    if kind == "session_open":
        if session_doc(row, names.get(row.dataset_id, "?")) != data:
            raise AuditFailed(f"audit entry {seq}: session {sid} differs from what the log "
                              "recorded (row edited)")
        if sid in opened:
            raise AuditFailed(f"audit entry {seq}: session {sid} is opened twice")
        opened.add(sid)
    elif sid not in opened:
        raise AuditFailed(f"audit entry {seq}: session {sid} has a {kind} before it was opened")
    if kind == "session_batch":
        acc = data.get("accepted")
        if not isinstance(acc, int) or acc < 0:
            raise AuditFailed(f"audit entry {seq}: session {sid}: malformed accepted count")
        tally[sid] += acc


def check_sessions(s: Session, sessions: dict[int, CollectionSession], tally: dict[int, int],
                   opened: set[int]) -> None:
    """Every session has an open entry, and its stored reports are exactly the logged ones."""
    missing = sorted(set(sessions) - opened)
    if missing:
        raise AuditFailed(f"session {missing[0]} has no audit entry (row inserted outside "
                          "privcal, or its entry deleted)")
    stored: dict[int, int] = defaultdict(int)
    stored.update(s.execute(select(SessionReport.session_id, func.count())
                            .group_by(SessionReport.session_id)).all())
    for sid in set(stored) | set(tally):
        if stored.get(sid, 0) != tally.get(sid, 0):
            raise AuditFailed(f"session {sid}: {stored.get(sid, 0)} stored reports but the log "
                              f"records {tally.get(sid, 0)} accepted (rows edited)")
