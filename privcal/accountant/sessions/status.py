"""Reading a session: its public state, and the release it ended in."""

from __future__ import annotations

from privcal.accountant.accountant import Accountant
from privcal.accountant.results import Release
from privcal.accountant.sessions.records import SessionInfo
from privcal.accountant.sessions.state import info_of, session_key

__all__ = ["release_of", "session_status"]


def session_status(accountant: Accountant, session_id: int) -> SessionInfo:
    """The session's method, status, round, counts, current interval and query, release.

    NotFound ("unknown session N") if there is none — also for an id outside
    1 … 2³¹−1 (:func:`~privcal.accountant.sessions.state.session_key`), which names no row on any
    backend (PostgreSQL would refuse to compare it with its 32-bit id column: a 500)."""
    ledger = accountant.ledger
    sid = session_key(session_id)
    with ledger.read() as s:
        row = ledger.session_row(s, sid)
        return info_of(ledger, s, row, ledger.dataset_name(s, row.dataset_id))


def release_of(accountant: Accountant, session_id: int) -> Release | None:
    """The session's release, if it has one."""
    info = session_status(accountant, session_id)
    return accountant.release(info.release_id) if info.release_id is not None else None
