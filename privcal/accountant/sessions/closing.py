"""Closing a session: abandon it (no release, charges kept), or release a federated one with
agents missing (each missing agent's message counted as +∞ under the published plan, or the
server side replanned for those that answered). With an idempotency key
the close is recorded under it, and a retry returns the closed session instead of an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from privcal.accountant.accountant import Accountant
from privcal.accountant.decimal_context import in_library_context
from privcal.accountant.normalize import idempotency_key as idempotency_key_text
from privcal.accountant.normalize import optional_text, request_digest
from privcal.accountant.sessions.records import SessionInfo
from privcal.accountant.sessions.release import (
    MISSING,
    Missing,
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

__all__ = ["close_session", "missing_key"]

#: where a keyed close records its key and request digest: the session's state (the
#: ``session_close`` entry's state digest commits to them, and a retry reads them there)
CLOSE_KEY, CLOSE_DIGEST = "close_idempotency_key", "close_request_digest"


@in_library_context  # its own decimal context (red team 6)
def close_session(accountant: Accountant, session_id: int, *, allow_missing: bool = False,
                  missing: Missing = "infinite", abandon: bool = False,
                  requester: str | None = None,
                  idempotency_key: str | None = None) -> SessionInfo:
    """Close a session.

    Federated: with every agent answered it is already released; with agents missing it
    refuses, unless ``allow_missing`` (release for the agents that answered) or
    ``abandon`` (close without a release). How ``allow_missing`` releases is ``missing``:

    - ``"infinite"`` (default): the published plan, each missing agent's message counted as
      +∞. The k-th smallest message can only rise, so the published guarantee holds
      whatever the reason an agent is missing; with fewer than k agents answered the
      release is +∞.
    - ``"replan"``: the server side recomputed for the agents that answered, the agent side
      pinned in the params (:class:`InfeasiblePlan`, nothing written, if no valid plan
      exists). Often a smaller threshold, but valid only if which agents answered does not
      depend on their data (red team 14: 0.836 coverage against 0.9 when the 16 of 20
      agents with the largest messages were missing); the recorded guarantee states it.

    An unfinished ldp-score session can only be abandoned. Charges are never refunded.

    ``requester`` is who closes (it may be another analyst than the opener): the
    ``session_close`` entry records it as ``closed_by``, and a release made by the close
    (``allow_missing``) records it as its requester, the opener as ``opened_by`` in its
    diagnostics (see :func:`~privcal.accountant.sessions.release.release_in_tx`).

    ``idempotency_key`` (unique per session, as a batch's) binds the close to this request
    — the session, ``allow_missing``, ``missing`` and ``abandon``: the session's state
    records the key and the request's digest with the close, so a retry with the same key
    and request returns the closed session (its status, and the release the close made)
    instead of "already closed" — e.g. after a crash before the caller learned the
    answer; another request under the key is an InvalidInput naming it, and any close of
    a session that is no longer open without that key is refused as before (red team 7,
    C-1).
    """
    if allow_missing and abandon:
        raise InvalidInput("give either allow_missing or abandon, not both")
    if missing not in MISSING:
        raise InvalidInput(f"missing must be one of {', '.join(MISSING)}, got {missing!r:.60}")
    if missing != "infinite" and not allow_missing:
        raise InvalidInput("missing goes with allow_missing")
    requester = optional_text(requester, "requester")
    key = idempotency_key_text(idempotency_key)
    digest = None if key is None else request_digest({
        "kind": "session_close", "session_id": str(session_key(session_id)),
        "allow_missing": bool(allow_missing), "abandon": bool(abandon),
        **missing_key(allow_missing, missing)})
    ledger = accountant.ledger

    def tx(s: Session) -> SessionInfo:
        row, ds = ledger.lock_session(s, session_key(session_id))
        if row.status != "open":
            if key is not None and (row.state or {}).get(CLOSE_KEY) == key:
                if row.state.get(CLOSE_DIGEST) != digest:
                    raise InvalidInput(
                        f"idempotency key {key!r} was already used to close session {row.id} "
                        "with other options (allow_missing / missing / abandon): use a new key")
                return info_of(ledger, s, row, ds.name)  # the close this key made, replayed
            raise PlanRejected(f"session {row.id} is already {row.status}")
        total = int(row.state.get("total", 0))
        keyed = _keyed(key, digest)
        if abandon:
            ledger.update_session(s, row, status="closed", updated_at=now(),
                                  **({"state": {**row.state, **keyed}} if keyed else {}))
            ledger.append_audit(s, "session_close", {
                "session_id": row.id, "status": "closed", "release_id": None, "reports": total,
                # keyed: an abandoned round's count of ones was never released (red team 7)
                "state_digest": keyed_state_digest(skey, row.state), "closed_by": requester,
                **_logged(key, digest)})
            return info_of(ledger, s, row, ds.name)
        if row.method == "ldp-score":
            proto = protocol_of(row)
            raise PlanRejected(
                f"session {row.id} is in round {proto.round} of {proto.rounds}: an ldp-score "
                "session releases when its last round is full; use abandon (--abandon) to close "
                "it without a release")
        plan = fed_plan_of(row)
        absent = plan.m - total
        if not allow_missing:
            raise PlanRejected(f"session {row.id}: {absent} of {plan.m} agents have not "
                               "answered; pass --allow-missing to release for those that did "
                               "(each missing message counted as +inf), or --abandon")
        if total == 0:
            raise PlanRejected(f"session {row.id}: no agent has answered; nothing to release")
        sub, params = subset_plan(row, plan, total, missing)
        args = fed_release_args(accountant, s, row, sub, missing=missing, params=params)
        ledger.update_session(s, row, updated_at=now(),
                              **({"state": {**row.state, **keyed}} if keyed else {}))
        release_in_tx(accountant, s, ds, row, state_key=skey,
                      privacy_extra=subset_extra(row, total, plan.n, ds, params), at_close=True,
                      closed_by=requester, close_entry=_logged(key, digest), **args)
        return info_of(ledger, s, row, ds.name)

    skey = ledger.subject_key()  # before the write transaction (its first read may write)
    return ledger.write(tx)


def missing_key(allow_missing: bool, missing: Missing) -> dict[str, str]:
    """What ``missing`` adds to a close's request digest: a key only for the one close that
    did not exist before it (a close before ``missing`` existed digested no such key, and
    with agents missing it replanned: a retry of it under its key is a replan, red team 15)."""
    return {"missing": missing} if allow_missing and missing == "infinite" else {}


def _keyed(key: str | None, digest: str | None) -> dict[str, Any]:
    """What a keyed close adds to the session's state (nothing without a key: an unkeyed
    close stores what it stored before)."""
    return {} if key is None else {CLOSE_KEY: key, CLOSE_DIGEST: digest}


def _logged(key: str | None, digest: str | None) -> dict[str, Any]:
    """What a keyed close adds to its ``session_close`` entry, as a batch's entry names its
    key and request digest (``audit verify`` ignores keys it does not check; the state
    digest of the entry commits to the same values)."""
    return {} if key is None else {"idempotency_key": key, "request_digest": digest}
