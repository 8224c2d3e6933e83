"""How a session ends in a release: the calibrator's inputs from a finished protocol, the
federated replan for the agents that answered, and the release written in the transaction
of the batch (or close) that finishes the session.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from privcal.accountant.accountant import Accountant
from privcal.accountant.normalize import cost_json, json_safe, normalize_cost
from privcal.accountant.policy import dataset_info
from privcal.accountant.release_privacy import privacy_record
from privcal.accountant.sessions.score import calibrator_params, score_of
from privcal.accountant.sessions.state import charge_ids, fed_plan_of, protocol_of
from privcal.calibrators import registry
from privcal.calibrators.base import DataShape
from privcal.calibrators.federated_agent import aggregate
from privcal.calibrators.fedplan import (
    Fed2Plan,
    FedPlan,
    replan_fedcp2_qq_subset,
    replan_fedcp_qq_subset,
)
from privcal.calibrators.ldp_score_protocol import LdpScoreProtocol
from privcal.errors import InfeasiblePlan, InvalidInput, PlanRejected, PrivcalError
from privcal.storage.audit import release_doc, threshold_str
from privcal.storage.pseudonyms import keyed_state_digest

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from privcal.storage.models import Dataset, ReleaseRow
    from privcal.storage.sessions import CollectionSession

__all__ = ["MISSING", "Missing", "check_shuffle_record", "fed_release_args", "ldp_release_args",
           "release_in_tx", "subset_extra", "subset_plan"]

#: how a federated session closed with agents missing releases (:func:`subset_plan`)
Missing = Literal["infinite", "replan"]
MISSING: tuple[Missing, ...] = ("infinite", "replan")


def release_in_tx(
    acct: Accountant, s: Session, ds: Dataset, row: CollectionSession, *, state_key: bytes,
    threshold: float, params: dict[str, Any], shape: DataShape,
    privacy_extra: dict[str, Any] | None, diagnostics: dict[str, Any],
    at_close: bool = False, closed_by: str | None = None,
    close_entry: dict[str, Any] | None = None,
) -> ReleaseRow:
    """Append the release (``record_release`` semantics) inside the batch's (or close's)
    transaction, tied to every charge of the session, and close the session as released;
    ``state_key`` (the ledger secret) keys the ``session_close`` entry's state digest.

    Who is recorded (red team 7, E-3): a session its last batch finishes ran as it was opened,
    so the release's requester is the opener. A release made by a close (``at_close``:
    ``close_session(allow_missing=True)``, a plan recomputed for the agents that answered)
    is the closer's decision: its requester is the closer ``closed_by`` (None if the caller
    did not say who), its diagnostics state the opener as ``opened_by``, and the
    ``session_close`` entry names ``closed_by``. (Entries and releases written before
    carry neither key; nothing checks their absence.) ``close_entry``: more keys of that
    entry (a keyed close's idempotency key and request digest).
    """
    current = check_shuffle_record(row, ds)  # never a claim the installed code does not make
    if current is not None and privacy_extra == (row.state or {}).get("privacy_extra"):
        privacy_extra = current  # the open's claim, in the installed code's words (red team 26)
    reg = registry.get(row.method)
    cal = reg.calibrator
    p = cal.Params.model_validate(params)
    coverage = cal.guarantee(p, shape)
    cost = cal.cost(p, shape)
    privacy = privacy_record(cost, dataset_info(ds), privacy_extra, cal)
    central = row.state.get("central_cost")
    if central is not None:
        privacy["central_cost"] = central
    if math.isnan(threshold):
        raise InvalidInput("threshold is NaN")
    rel = acct.ledger.insert_release(s, ds.id, {
        "method": cal.name, "calibrator_version": cal.version,
        "distribution": reg.distribution, "distribution_version": reg.distribution_version,
        "params": json_safe(p.model_dump(mode="python")),
        "shape": json_safe(shape.model_dump(mode="python")),
        "threshold": threshold_str(float(threshold)), "coverage": json_safe(coverage),
        "privacy": json_safe(privacy),
        "diagnostics": json_safe({**diagnostics, "session_id": row.id,
                                  **({"opened_by": row.requester} if at_close else {}),
                                  # the score the session's devices computed (F9): what
                                  # predict and evaluate use; sessions without one, none
                                  **({"score": sc} if (sc := score_of(row.params)) else {})}),
        "requester": closed_by if at_close else row.requester,
    }, charge_ids(row))
    acct.ledger.append_audit(s, "release", release_doc(rel, ds.name))
    acct.ledger.update_session(s, row, release_id=rel.id, status="released")
    acct.ledger.append_audit(s, "session_close", {
        "session_id": row.id, "status": "released", "release_id": rel.id,
        "reports": int(row.state.get("total", 0)),
        "state_digest": keyed_state_digest(state_key, row.state),
        **({"closed_by": closed_by} if at_close else {}), **(close_entry or {})})
    return rel


def ldp_release_args(proto: LdpScoreProtocol) -> dict[str, Any]:
    """The release of a finished ldp-score protocol: its threshold, params, shape, history.
    The shape's n is the plan's T·n′ (the guarantee is the T-round protocol's, early stop
    included); ``reports_used`` says how many reports the rounds it ran took (red team 21,
    flows L1: a session that stopped after 5 of 6 rounds read "data n=1200" beside 1 000
    reports stored and charged)."""
    thr = proto.threshold if proto.threshold is not None else math.inf
    return {
        "threshold": thr, "params": proto.to_params().model_dump(mode="python"),
        "shape": DataShape(n=proto.rounds * proto.group_size),
        "diagnostics": {
            "rounds": proto.rounds, "rounds_used": proto.round, "group_size": proto.group_size,
            "reports_used": sum(r.count for r in proto.history),
            "delta_S": proto.slack, "calibration_target": proto.target, "band": proto.band,
            "trivial": math.isinf(thr),
            "history": [r.model_dump(mode="json") for r in proto.history],
        },
    }


def fed_release_args(acct: Accountant, s: Session, row: CollectionSession,
                     plan: Fed2Plan | FedPlan, missing: Missing | None = None,
                     params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The release of a federated session: the agents' stored messages aggregated by
    ``plan`` — the published one (every agent answered, or ``missing="infinite"``: each
    missing agent's message counted as +∞), or the replan for the agents that answered
    (``missing="replan"``)."""
    msgs = [float(v) for v in acct.ledger.report_values(s, row.id)]
    padded = missing == "infinite"
    thr = aggregate(msgs, plan, missing_as_inf=padded)
    answered = len(msgs) if padded else plan.m
    diag: dict[str, Any] = {"m": plan.m, "n": plan.n, "k": plan.k,
                            "messages": sorted(msgs) if isinstance(plan, Fed2Plan) else None}
    if isinstance(plan, Fed2Plan):
        # each message is its agent's ε-DP output: publishing them costs nothing more
        diag.update(gamma=plan.gamma, l_gamma=plan.l_gamma, l_cor=plan.l_cor, q=plan.q)
    else:
        diag.pop("messages")
        diag.update(l=plan.l)
    if missing == "replan":
        diag["replanned"] = {"m_planned": int(row.state["plan"]["m"]), "m_answered": plan.m}
    elif padded:
        diag["missing"] = {"m_planned": plan.m, "m_answered": answered, "counted_as": "+inf"}
    return {"threshold": thr,
            "params": calibrator_params(row.params) if params is None else params,
            "shape": DataShape(n=answered * plan.n, group_sizes=(plan.n,) * answered),
            "diagnostics": diag}


def subset_plan(row: CollectionSession, plan: Fed2Plan | FedPlan, m2: int,
                missing: Missing = "infinite") -> tuple[Fed2Plan | FedPlan, dict[str, Any]]:
    """The plan that releases for the ``m2`` agents that answered, and the release params
    that pin it.

    ``missing="infinite"`` (the default): the published plan, each missing agent's message
    counted as +∞ (``agents_planned`` = m in the params): the k-th smallest can only rise,
    so the published guarantee holds whatever the reason an agent is missing.
    ``"replan"``: the agents' answers are fixed (level q, or order ℓ), so only the server
    side is re-chosen (``replan_*_subset``) for the m2 agents — valid only if which agents
    answered does not depend on their data, which the recorded guarantee then states. The
    params get ``level`` = q (fedcp2-qq) or ``agent_order`` = ℓ (fedcp-qq). Either way the
    calibrator's ``plan``/``guarantee`` derive this same plan from (params, shape), which
    is what ``audit verify`` recomputes. Raises :class:`InfeasiblePlan` when no server side
    reaches 1−α for these agents (a replan only).
    """
    try:
        if missing == "infinite":
            sub: Fed2Plan | FedPlan = plan
            params = {**calibrator_params(row.params), "agents_planned": plan.m}
        elif isinstance(plan, Fed2Plan):
            sub = replan_fedcp2_qq_subset(plan, m2)
            params = {**calibrator_params(row.params), "level": plan.q}
        else:
            sub = replan_fedcp_qq_subset(plan, m2)
            params = {**calibrator_params(row.params), "agent_order": plan.l}
    except InfeasiblePlan as exc:
        raise InfeasiblePlan(
            f"session {row.id}: {exc}; nothing released and the session stays open (wait for "
            "more agents, or close it with --abandon)") from None
    cal = registry.get(row.method).calibrator
    p = cal.Params.model_validate(params)
    shape = DataShape(n=m2 * plan.n, group_sizes=(plan.n,) * m2)
    pinned = cal.plan(p, shape)  # type: ignore[attr-defined]
    if pinned != sub:  # the installed calibrator must recompute exactly what is released
        raise PlanRejected(
            f"session {row.id}: {row.method}'s calibrator derives {pinned!r} from the pinned "
            f"params, not the replanned {sub!r}: refusing a release `audit verify` could not "
            "reproduce")
    return sub, json_safe(p.model_dump(mode="python"))


def subset_extra(row: CollectionSession, m2: int, n: int, ds: Dataset,
                 params: dict[str, Any]) -> dict[str, Any] | None:
    """The shuffled record for the ``m2`` agents that answered, of ``n`` scores each (the
    shuffle hid m2 senders, not m)."""
    if not row.shuffled:
        return None
    if row.state.get("central_cost") is not None:
        # the central charge was made for m agents; fewer senders amplify less
        raise PlanRejected("a shuffled session on an (ε, δ) dataset was charged the amplified "
                           "cost for all m agents; it cannot be released with agents missing")
    from privcal.accountant.amplification import shuffled_guarantee

    cal = registry.get(row.method).calibrator
    p = cal.Params.model_validate(params)
    shape = DataShape(n=m2 * n, group_sizes=(n,) * m2)
    return json_safe(shuffled_guarantee(row.method, p, shape, ds.reporting_delta)[1])


def check_shuffle_record(row: CollectionSession, ds: Any) -> dict[str, Any] | None:
    """Refuse (:class:`PlanRejected`, nothing written) a batch or a release of a shuffled
    session whose amplified claim — recorded in its state (``privacy_extra``, and
    ``central_cost`` as charged) when it opened — is not what the installed privcal computes
    for its published plan at the dataset's reporting δ (red team 26, shuffle F1). The
    claim is its numbers (:func:`_claim`), not its wording.

    The claim is computed once, at the open, and a session may outlive the privcal that
    opened it: a shuffled fedcp2-qq session opened before issue 14.6 finished after an
    upgrade and its release said "(0.0530054, 1e-06)-DP over the 10000 agents", a bound
    that does not hold for that method. Such a session can only be abandoned (its charges
    are kept, as always). Returns the record in the installed code's words (None when the
    session records no shuffled claim)."""
    st = row.state or {}
    if not row.shuffled or (st.get("privacy_extra") is None and st.get("central_cost") is None):
        return None
    from privcal.accountant.amplification import shuffled_guarantee

    try:
        if row.method == "ldp-score":
            proto = protocol_of(row)
            p: Any = proto.to_params()
            shape = DataShape(n=proto.rounds * proto.group_size)
        else:
            plan = fed_plan_of(row)
            p = registry.get(row.method).calibrator.Params.model_validate(
                calibrator_params(row.params))
            shape = DataShape(n=plan.m * plan.n, group_sizes=(plan.n,) * plan.m)
        cost, extra = shuffled_guarantee(row.method, p, shape, ds.reporting_delta)
        extra = json_safe(extra)
        same = (_claim(extra) == _claim(st.get("privacy_extra"))
                and st.get("central_cost") == (
                    None if cost is None else cost_json(normalize_cost(cost))))
        why = "" if same else "the installed privcal computes another amplified (ε, δ)"
    except PrivcalError as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if why:
        raise PlanRejected(
            f"session {row.id} was opened with a shuffled (amplified) privacy claim that the "
            f"installed privcal does not make ({why}): nothing accepted or released; close it "
            "with --abandon (its charges are kept)")
    return extra  # type: ignore[no-any-return]


def _claim(extra: Any) -> tuple[Any, ...]:
    """What a shuffled record claims: whether and how many reports are shuffled, with which
    randomizer, and the amplified (ε, δ) with its bound."""
    extra = extra if isinstance(extra, dict) else {}
    amp = extra.get("amplification") if isinstance(extra.get("amplification"), dict) else {}
    return (extra.get("shuffled"), extra.get("n_shuffled"), extra.get("randomizer"),
            extra.get("scope"), *(amp.get(k) for k in ("amplified", "eps", "delta", "bound")))
