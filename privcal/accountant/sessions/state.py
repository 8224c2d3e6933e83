"""A session's protocol state as stored on its row, read back as protocol objects and as the
public :class:`~privcal.accountant.sessions.records.SessionInfo`; and the parsing of the
numbers and ids the session calls take.

``collection_sessions.state`` is a JSON document: ``total`` (reports accepted),
``charge_ids`` (one per-subject charge per batch), ``central_charge_id`` /
``central_cost`` (a shuffled session's amplified central charge), ``eps0`` (what each
subject is charged), ``privacy_extra`` (the shuffled record); for ldp-score the
:class:`~privcal.calibrators.ldp_score_protocol.LdpScoreProtocol` (``protocol``) and the current
round's counts (``round_count``, ``round_ones``); for the federated methods the published
``plan``.

``collection_sessions.params`` is the calibrator's parameters, plus the score the devices
compute when the session was opened with one (:mod:`privcal.accountant.sessions.score`).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from privcal.accountant.sessions.records import REPORTS_ARE, SessionInfo
from privcal.accountant.sessions.score import score_of
from privcal.calibrators.fedplan import Fed2Plan, FedPlan
from privcal.calibrators.ldp_score_protocol import LdpScoreProtocol
from privcal.errors import InvalidInput, check_number_text
from privcal.storage.releases import stored_id

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from privcal.storage import Ledger
    from privcal.storage.sessions import CollectionSession

__all__ = [
    "charge_ids",
    "dump_protocol",
    "fed_plan_of",
    "info_of",
    "number",
    "protocol_of",
    "public_key",
    "session_key",
]

def number(value: Any, what: str, *, integer: bool = False) -> Any:
    """``value`` as a finite float (or an int if ``integer``), or a one-line InvalidInput."""
    if isinstance(value, bool | bytes | bytearray) or value is None:  # float(b"2_0") is 20
        raise InvalidInput(f"{what} must be a number, got {value!r}")
    if isinstance(value, str):  # float("2_0") is 20 (red team 10)
        try:
            check_number_text(value, what)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
    if integer:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int | np.integer):
            raise InvalidInput(f"{what} must be an integer, got {value!r}")
        return int(value)
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError) as exc:  # 10**400: too big for a float
        raise InvalidInput(f"{what} must be a number, got {value!r}") from exc
    if not math.isfinite(v):
        raise InvalidInput(f"{what} must be finite, got {value!r}")
    return v


def session_key(session_id: Any) -> int:
    """A session id as given (the CLI and the service pass it as text) as the row's id;
    NotFound for one outside 1 … 2³¹−1, which names no session on any backend
    (:func:`~privcal.storage.releases.stored_id`: PostgreSQL refused to compare it with its
    32-bit id column, an error rather than "unknown session", red team 8)."""
    if isinstance(session_id, str) and session_id.strip().isdecimal():
        session_id = int(session_id)
    return stored_id(session_id, "session")


def dump_protocol(proto: LdpScoreProtocol) -> dict[str, Any]:
    """The protocol as the JSON stored in the state."""
    # model_dump_json writes ±inf as "Infinity" (PostgreSQL's JSON rejects a bare Infinity)
    return dict(json.loads(proto.model_dump_json()))


def protocol_of(row: CollectionSession) -> LdpScoreProtocol:
    """An ldp-score session's protocol (rounds, interval, current query, history)."""
    return LdpScoreProtocol.model_validate(row.state["protocol"])


def fed_plan_of(row: CollectionSession) -> Fed2Plan | FedPlan:
    """A federated session's published plan."""
    p = row.state["plan"]
    return Fed2Plan.model_validate(p) if row.method == "fedcp2-qq" else FedPlan.model_validate(p)


def public_key(row: CollectionSession) -> tuple[Any, ...]:
    """Everything the public part of :func:`info_of` (what a session-bound token reads: id,
    method, status, shuffled, params, round, rounds, query, interval, plan, grid) is
    computed from: two rows with the same key have the same public state (the service
    caches it under this key; the round's counts, the total and the charges are not in it)."""
    st = row.state or {}
    return (row.id, row.method, row.status, bool(row.shuffled),
            json.dumps(row.params, sort_keys=True, default=str),
            json.dumps(st.get("protocol"), sort_keys=True, default=str),
            json.dumps(st.get("plan"), sort_keys=True, default=str))


def charge_ids(row: CollectionSession) -> list[int]:
    """Every charge the session made: one per accepted batch, then the central one if any."""
    ids = [int(i) for i in row.state.get("charge_ids", [])]
    if row.state.get("central_charge_id") is not None:
        ids.append(int(row.state["central_charge_id"]))
    return ids


def info_of(ledger: Ledger, s: Session, row: CollectionSession, ds_name: str) -> SessionInfo:
    """The session's public state, read in the transaction ``s``."""
    st = row.state
    total = int(st.get("total", 0))
    common: dict[str, Any] = dict(
        id=row.id, dataset=ds_name, method=row.method, status=row.status,
        shuffled=bool(row.shuffled), requester=row.requester, params=row.params,
        created_at=row.created_at, updated_at=row.updated_at, total_reports=total,
        release_id=row.release_id, central_charge_id=st.get("central_charge_id"),
        reports_are=REPORTS_ARE.get(row.method, ""), score=score_of(row.params),
    )
    if row.release_id is not None:
        thr = ledger.release_threshold(s, row.release_id)
        common["threshold"] = float(thr) if thr is not None else None
    if row.method == "ldp-score":
        proto = protocol_of(row)
        open_ = row.status == "open" and not proto.finished
        return SessionInfo(
            **common, round=proto.round, rounds=proto.rounds,
            received=int(st.get("round_count", 0)),
            needed=proto.group_size if open_ else 0,
            interval=(proto.lo, proto.hi),
            query=proto.current_query() if open_ else None,
            trivial=proto.never_passes,
        )
    plan = fed_plan_of(row)
    grid = None
    if isinstance(plan, Fed2Plan):
        grid = {"points": plan.bins, "lower": plan.lower, "upper": plan.smax,
                "step": (plan.smax - plan.lower) / (plan.bins - 1),
                "rule": "e_b = lower + b·(upper − lower)/(B−1), b = 0..B−1; the top point "
                        "means ≥ upper"}
    return SessionInfo(
        **common, round=0, rounds=1, received=total,
        needed=plan.m if row.status == "open" else 0,
        plan=plan.model_dump(mode="json"), grid=grid,
    )
