"""Closing a session: abandon it (no release, charges kept), or release a federated one with
agents missing (the server side replanned for those that answered)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from privcal.accountant.accountant import Accountant
from privcal.accountant.decimal_context import in_library_context
from privcal.accountant.normalize import optional_text
from privcal.accountant.sessions.records import SessionInfo
from privcal.accountant.sessions.release import (
    fed_release_args,
    release_in_tx,
    subset_extra,
    subset_plan,
)
from privcal.accountant.sessions.state import fed_plan_of, info_of, protocol_of, session_key
from privcal.errors import InvalidInput, PlanRejected
from privcal.storage.audit import now
from privcal.storage.pseudonyms import keyed_state_digest

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["close_session"]


@in_library_context  # its own decimal context (red team 6)
def close_session(accountant: Accountant, session_id: int, *, allow_missing: bool = False,
                  abandon: bool = False, requester: str | None = None) -> SessionInfo:
    """Close a session.

    Federated: with every agent answered it is already released; with agents missing it
    refuses, unless ``allow_missing`` (release with the server side recomputed for the
    agents that answered and the agent side pinned in the params; :class:`InfeasiblePlan`,
    nothing written, if no valid plan exists) or ``abandon`` (close without a release). An
    unfinished ldp-score session can only be abandoned. Charges are never refunded.

    ``requester`` is who closes (it may be another analyst than the opener): the
    ``session_close`` entry records it as ``closed_by``, and a release made by the close
    (``allow_missing``) records it as its requester, the opener as ``opened_by`` in its
    diagnostics (see :func:`~privcal.accountant.sessions.release.release_in_tx`).
    """
    if allow_missing and abandon:
        raise InvalidInput("give either allow_missing or abandon, not both")
    requester = optional_text(requester, "requester")
    ledger = accountant.ledger

    def tx(s: Session) -> SessionInfo:
        row, ds = ledger.lock_session(s, session_key(session_id))
        if row.status != "open":
            raise PlanRejected(f"session {row.id} is already {row.status}")
        total = int(row.state.get("total", 0))
        if abandon:
            ledger.update_session(s, row, status="closed", updated_at=now())
            ledger.append_audit(s, "session_close", {
                "session_id": row.id, "status": "closed", "release_id": None, "reports": total,
                # keyed: an abandoned round's count of ones was never released (red team 7)
                "state_digest": keyed_state_digest(skey, row.state), "closed_by": requester})
            return info_of(ledger, s, row, ds.name)
        if row.method == "ldp-score":
            proto = protocol_of(row)
            raise PlanRejected(
                f"session {row.id} is in round {proto.round} of {proto.rounds}: an ldp-score "
                "session releases when its last round is full; use abandon (--abandon) to close "
                "it without a release")
        plan = fed_plan_of(row)
        missing = plan.m - total
        if not allow_missing:
            raise PlanRejected(f"session {row.id}: {missing} of {plan.m} agents have not "
                               "answered; pass --allow-missing to release with a plan recomputed "
                               "for those that did, or --abandon")
        if total == 0:
            raise PlanRejected(f"session {row.id}: no agent has answered; nothing to release")
        sub, params = subset_plan(row, plan, total)
        args = fed_release_args(accountant, s, row, sub, replanned=True, params=params)
        ledger.update_session(s, row, updated_at=now())
        release_in_tx(accountant, s, ds, row, state_key=skey,
                      privacy_extra=subset_extra(row, sub, ds, params), at_close=True,
                      closed_by=requester, **args)
        return info_of(ledger, s, row, ds.name)

    skey = ledger.subject_key()  # before the write transaction (its first read may write)
    return ledger.write(tx)
