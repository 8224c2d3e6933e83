"""Persistent collection sessions: LDP-CP-S (``ldp-score``), FedCP²-QQ and FedCP-QQ collected
report by report through the ledger (issues 3 and 5; SPEC §7, §9, §10).

Every operation is one call with validated inputs returning a serializable pydantic
record (the HTTP API will be a thin layer, as the CLI is): :func:`open_session`,
:func:`submit_reports`, :func:`session_status`, :func:`close_session`. All state lives
in the ledger (:mod:`privcal.storage.sessions`), so a session survives restarts.

One batch is one transaction: lock the dataset row, then the session row; drop the
rows that cannot be used (each with a reason, counted — subject ids are never echoed
or logged); charge ε to each remaining subject against its per-subject cap with the
accountant's bulk SQL; store the reports; advance the protocol when the round is
full; write the release when it finishes. If no row is accepted nothing is written.

**Decisions**

- Row filters apply in this order: malformed value, wrong round (``closed round`` for
  an earlier round, ``round not open`` for a later one), subject already reported in
  this session, duplicate within the batch (the first valid occurrence is kept),
  subject budget exhausted, then ``round full`` (rows beyond what the round needs,
  in file order). Budget comes before fullness, so a round is never left short
  because an over-cap subject took a slot, and nobody is charged for a row that is
  then dropped.
- A round's bits answer *that* round's query, so surplus rows are rejected, not
  carried over.
- ``--shuffled`` computes the amplified central (ε, δ) at open time (it depends only
  on the public plan) and, on an (ε, δ) dataset, charges it then: the published
  queries are already outputs, so the central charge precedes any data.
- Closing an unfinished session without a release (``abandon``) keeps every charge:
  privacy spent on accepted reports is never refunded.
- ``--allow-missing`` (federated) releases with the plan recomputed for the agents that
  answered: their messages are fixed (FedCP²-QQ: level q; FedCP-QQ: order ℓ) and only
  the server side is re-chosen (``replan_*_subset``). The release's params pin that agent
  side (``level`` / ``agent_order``), from which the calibrator's ``guarantee`` derives
  the same replanned plan, so ``audit verify`` reproduces it. When no valid replan
  exists it refuses, writes nothing and the session stays open (see :func:`_subset_plan`).
"""

from __future__ import annotations

import hmac
import json
import math
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from privcal import checks
from privcal.accountant import privacy as acc
from privcal.accountant.accountant import (
    Accountant,
    Release,
    _cost_json,
    _info,
    _text,
    json_safe,
    normalize_cost,
    record_members,
    request_digest,
)
from privcal.calibrators import registry
from privcal.calibrators.base import DataShape
from privcal.calibrators.federated_agent import aggregate, check_message
from privcal.calibrators.fedplan import (
    Fed2Plan,
    FedPlan,
    plan_fedcp2_qq,
    plan_fedcp_qq,
    replan_fedcp2_qq_subset,
    replan_fedcp_qq_subset,
)
from privcal.calibrators.ldp_score_protocol import LdpScoreProtocol
from privcal.calibrators.validation import id_strings
from privcal.costs import ApproxDP, LocalDP
from privcal.errors import BudgetRefused, InfeasiblePlan, InvalidInput, NotFound, PlanRejected
from privcal.storage.audit import canonical, charge_doc, now, release_doc, threshold_str
from privcal.storage.models import SUBJECT_UNIT, Charge, Dataset, ReleaseRow
from privcal.storage.pseudonyms import key_id, reports_digest, state_digest, subjects_digest
from privcal.storage.records import UTCDateTime
from privcal.storage.sessions import CollectionSession, SessionBatch, SessionReport, session_doc

__all__ = [
    "METHODS",
    "SessionInfo",
    "SubmitResult",
    "close_session",
    "open_session",
    "release_of",
    "session_status",
    "submit_reports",
]

METHODS = ("ldp-score", "fedcp2-qq", "fedcp-qq")
Method = Literal["ldp-score", "fedcp2-qq", "fedcp-qq"]

# rejection reasons (stable strings: clients may match on them)
MALFORMED_BIT = "malformed bit"
MALFORMED_VALUE = "malformed value"
OFF_GRID = "value off the published grid"
MALFORMED_ROUND = "malformed round"
CLOSED_ROUND = "closed round"
FUTURE_ROUND = "round not open"
ALREADY = "subject already reported in this session"
DUPLICATE = "duplicate subject in batch"
OVER_CAP = "subject budget exhausted"
ROUND_FULL = "round full"
EXTRA_AGENT = "all agents have answered (extra agent beyond m)"
LATE = "late: session is {status}"


# ----------------------------------------------------------------- records
class SessionInfo(BaseModel):
    """A session's public state: what ``session status`` shows and every call returns."""

    model_config = ConfigDict(frozen=True)

    id: int
    dataset: str
    method: str
    status: str
    shuffled: bool
    requester: str | None
    params: dict[str, Any]
    created_at: UTCDateTime
    updated_at: UTCDateTime
    round: int
    rounds: int
    received: int
    needed: int
    total_reports: int
    interval: tuple[float, float] | None = None
    query: float | None = None
    plan: dict[str, Any] | None = None
    grid: dict[str, Any] | None = None
    release_id: int | None = None
    threshold: float | None = None
    central_charge_id: int | None = None
    #: what the stored reports are (FedCP-QQ: raw order statistics — not private)
    reports_are: str = ""


#: what ``session_reports.value`` holds, per method (issue 16 item 6: said in every record)
REPORTS_ARE = {
    "ldp-score": "randomized bits (each ε-local DP for its subject)",
    "fedcp2-qq": "grid points (each ε-DP for its agent's data)",
    "fedcp-qq": "each agent's raw order statistic of its own scores (not private: stored as "
                "received, and revealed by the release)",
}


class SubmitResult(BaseModel):
    """The outcome of one batch: counts per rejection reason, never subject ids."""

    model_config = ConfigDict(frozen=True)

    session_id: int
    batch_round: int
    accepted: int
    rejected: int
    reasons: dict[str, int]
    charge_id: int | None
    epsilon: str | None
    advanced: bool
    session: SessionInfo
    replayed: bool = False


class _NothingAccepted(Exception):  # control flow only: never escapes this module
    """Raised inside the transaction so it rolls back; carries the counts to report."""

    def __init__(self, reasons: dict[str, int]) -> None:
        super().__init__("nothing accepted")
        self.reasons = reasons


# ----------------------------------------------------------------- helpers
def _num(value: Any, what: str, *, integer: bool = False) -> Any:
    if isinstance(value, bool) or value is None:
        raise InvalidInput(f"{what} must be a number, got {value!r}")
    if integer:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int | np.integer):
            raise InvalidInput(f"{what} must be an integer, got {value!r}")
        return int(value)
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} must be a number, got {value!r}") from exc
    if not math.isfinite(v):
        raise InvalidInput(f"{what} must be finite, got {value!r}")
    return v


def _session(s: Session, session_id: Any, *, lock: bool, backend: str) -> CollectionSession:
    if isinstance(session_id, str) and session_id.strip().isdecimal():
        session_id = int(session_id)  # the CLI and the service pass ids as text
    session_id = checks.row_id(session_id, "session")
    stmt = select(CollectionSession).where(CollectionSession.id == int(session_id))
    if lock:
        stmt = stmt.execution_options(populate_existing=True)
        if backend == "postgresql":
            stmt = stmt.with_for_update()
    row = s.scalars(stmt).one_or_none()
    if row is None:
        raise NotFound(f"unknown session {session_id}")
    return row


def _lock(acct: Accountant, s: Session, session_id: Any) -> tuple[CollectionSession, Dataset]:
    """Dataset row first, then the session row: the ledger's lock order (no deadlocks)."""
    row = _session(s, session_id, lock=False, backend=acct.ledger.backend)
    name = s.scalar(select(Dataset.name).where(Dataset.id == row.dataset_id))
    ds = acct.ledger.lock_dataset(s, str(name))
    return _session(s, row.id, lock=True, backend=acct.ledger.backend), ds


def _dump(proto: LdpScoreProtocol) -> dict[str, Any]:
    # model_dump_json writes ±inf as "Infinity" (PostgreSQL's JSON rejects a bare Infinity)
    return dict(json.loads(proto.model_dump_json()))


def _proto(row: CollectionSession) -> LdpScoreProtocol:
    return LdpScoreProtocol.model_validate(row.state["protocol"])


def _fed_plan(row: CollectionSession) -> Fed2Plan | FedPlan:
    p = row.state["plan"]
    return Fed2Plan.model_validate(p) if row.method == "fedcp2-qq" else FedPlan.model_validate(p)


def _info_of(s: Session, row: CollectionSession, ds_name: str) -> SessionInfo:
    st = row.state
    total = int(st.get("total", 0))
    common: dict[str, Any] = dict(
        id=row.id, dataset=ds_name, method=row.method, status=row.status,
        shuffled=bool(row.shuffled), requester=row.requester, params=row.params,
        created_at=row.created_at, updated_at=row.updated_at, total_reports=total,
        release_id=row.release_id, central_charge_id=st.get("central_charge_id"),
        reports_are=REPORTS_ARE.get(row.method, ""),
    )
    if row.release_id is not None:
        thr = s.scalar(select(ReleaseRow.threshold).where(ReleaseRow.id == row.release_id))
        common["threshold"] = float(thr) if thr is not None else None
    if row.method == "ldp-score":
        proto = _proto(row)
        open_ = row.status == "open" and not proto.finished
        return SessionInfo(
            **common, round=proto.round, rounds=proto.rounds,
            received=int(st.get("round_count", 0)),
            needed=proto.group_size if open_ else 0,
            interval=(proto.lo, proto.hi),
            query=proto.current_query() if open_ else None,
        )
    plan = _fed_plan(row)
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


def _release_in_tx(
    acct: Accountant, s: Session, ds: Dataset, row: CollectionSession, *, threshold: float,
    params: dict[str, Any], shape: DataShape, privacy_extra: dict[str, Any] | None,
    diagnostics: dict[str, Any], charge_ids: list[int],
) -> ReleaseRow:
    """Append the release (``record_release`` semantics) inside the batch's transaction."""
    reg = registry.get(row.method)
    cal = reg.calibrator
    p = cal.Params.model_validate(params)
    coverage = cal.guarantee(p, shape)
    cost = cal.cost(p, shape)
    privacy = acct._privacy(cost, _info(ds), privacy_extra, cal)
    central = row.state.get("central_cost")
    if central is not None:
        privacy["central_cost"] = central
    if math.isnan(threshold):
        raise InvalidInput("threshold is NaN")
    rel = ReleaseRow(
        dataset_id=ds.id, method=cal.name, calibrator_version=cal.version,
        distribution=reg.distribution, distribution_version=reg.distribution_version,
        params=json_safe(p.model_dump(mode="python")),
        shape=json_safe(shape.model_dump(mode="python")),
        threshold=threshold_str(float(threshold)), coverage=json_safe(coverage),
        privacy=json_safe(privacy),
        diagnostics=json_safe({**diagnostics, "session_id": row.id}),
        requester=row.requester, created_at=now(),
        charge_id=charge_ids[0] if charge_ids else None, charge_ids=charge_ids,
    )
    s.add(rel)
    s.flush()
    acct.ledger.append_audit(s, "release", release_doc(rel, ds.name))
    row.release_id = rel.id
    row.status = "released"
    acct.ledger.append_audit(s, "session_close", {
        "session_id": row.id, "status": "released", "release_id": rel.id,
        "reports": int(row.state.get("total", 0)), "state_digest": state_digest(row.state)})
    return rel


def _charge_ids(row: CollectionSession) -> list[int]:
    ids = [int(i) for i in row.state.get("charge_ids", [])]
    if row.state.get("central_charge_id") is not None:
        ids.append(int(row.state["central_charge_id"]))
    return ids


# ----------------------------------------------------------------- open
def open_session(
    accountant: Accountant,
    method: str,
    *,
    dataset: str,
    alpha: float,
    epsilon: float | None = None,
    rounds: int | None = None,
    group_size: int | None = None,
    lower: float = 0.0,
    upper: float = 1.0,
    delta: float = 0.001,
    nominal: bool = False,
    agents: int | None = None,
    local_n: int | None = None,
    bins: int = 100,
    smax: float | None = None,
    failure_probability: float | None = None,
    shuffled: bool = False,
    requester: str | None = None,
) -> SessionInfo:
    """Open a collection session and publish round 0's query (ldp-score) or the plan (fed).

    ``ldp-score`` needs ``epsilon``, ``rounds`` (T) and ``group_size`` (n'); the dataset
    needs a per-subject ε cap ≥ ε. ``fedcp2-qq`` needs ``agents`` (m), ``local_n`` (n),
    ``epsilon`` (and ``bins``, ``lower``, ``upper``: the public grid); ``fedcp-qq`` needs m
    and n and a dataset that
    allows non-private releases. ``shuffled`` (ldp-score, fedcp2-qq) records the amplified
    (ε, δ) and charges it to an (ε, δ) dataset now. Writes nothing on bad input.
    """
    from privcal.accountant.amplification import (
        check_shuffle_method,
        check_shuffled_dataset,
        shuffled_guarantee,
    )

    if not isinstance(method, str) or method not in METHODS:
        raise InvalidInput(f"unknown session method {method!r:.60} (one of: {', '.join(METHODS)})")
    if not isinstance(shuffled, bool) or not isinstance(nominal, bool):
        raise InvalidInput("shuffled and nominal must be True or False")
    if shuffled and method != "fedcp-qq":
        check_shuffle_method(method)
    requester = _text(requester, "requester")
    alpha = _num(alpha, "α")
    if failure_probability is not None:  # the one name (issue 15); ``delta`` is the old one
        delta = failure_probability
    if smax is not None:  # deprecated name of ``upper`` for fedcp2-qq
        upper = smax
    info = accountant.dataset(dataset)  # NotFound before any other work
    cal = registry.get(method).calibrator
    state: dict[str, Any] = {"total": 0, "charge_ids": []}
    if method == "ldp-score":
        for name, v in (("epsilon", epsilon), ("rounds", rounds), ("group size", group_size)):
            if v is None:
                raise InvalidInput(f"ldp-score sessions need --{name.replace(' ', '-')}")
        proto = LdpScoreProtocol.open(
            alpha=alpha, epsilon=_num(epsilon, "ε"), rounds=_num(rounds, "rounds", integer=True),
            group_size=_num(group_size, "group size", integer=True), lower=_num(lower, "lower"),
            upper=_num(upper, "upper"), delta=_num(delta, "δ"), nominal=bool(nominal))
        p: Any = proto.to_params()
        shape = DataShape(n=proto.rounds * proto.group_size)
        state.update(protocol=_dump(proto), round_count=0, round_ones=0)
    else:
        if agents is None or local_n is None:
            raise InvalidInput(f"{method} sessions need --agents and --local-n")
        m = _num(agents, "agents", integer=True)
        n = _num(local_n, "local n", integer=True)
        if method == "fedcp2-qq":
            if epsilon is None:
                raise InvalidInput("fedcp2-qq sessions need --epsilon")
            plan: Fed2Plan | FedPlan = plan_fedcp2_qq(
                m, n, alpha, _num(epsilon, "ε"), bins=_num(bins, "bins", integer=True),
                smax=_num(upper, "upper"), lower=_num(lower, "lower"))
            p = cal.Params.model_validate({"alpha": alpha, "epsilon": plan.epsilon,
                                           "bins": plan.bins, "lower": plan.lower,
                                           "upper": plan.smax})
        else:
            if epsilon is not None or shuffled:
                raise InvalidInput("fedcp-qq is not private: it takes no ε and no --shuffled")
            plan = plan_fedcp_qq(m, n, alpha)
            p = cal.Params.model_validate({"alpha": alpha})
        shape = DataShape(n=m * n, group_sizes=(n,) * m)
        state["plan"] = plan.model_dump(mode="json")
    cost = cal.cost(p, shape)
    if cost is None and not info.allow_nonprivate:
        raise BudgetRefused(
            f"non-private release refused: {method} is not differentially private and dataset "
            f"{dataset!r} does not allow non-private releases (create it with "
            "--allow-nonprivate)", scope=f"dataset {dataset!r}", asked="non-private",
            remaining="")
    if isinstance(cost, LocalDP):
        cost = normalize_cost(cost)
        assert isinstance(cost, LocalDP)
        if info.subject_epsilon is None or cost.eps0 > info.subject_epsilon:
            raise BudgetRefused(
                f"budget refused on the subjects of dataset {dataset!r}: each subject is charged "
                f"{cost.describe()} but the per-subject cap is "
                f"{info.subject_epsilon if info.subject_epsilon is not None else 'not set'} "
                "(create the dataset with --subject-epsilon)",
                scope=f"dataset {dataset!r} subjects", asked=cost.describe(), remaining="")
        state["eps0"] = acc.dstr(cost.eps0)
    central: ApproxDP | None = None
    if shuffled:
        if method == "fedcp-qq":
            raise InvalidInput("fedcp-qq has no shuffled variant")
        # only a proven amplification (ldp-score), charged to a cap that can hold it (14.5/6)
        amplified, extra = shuffled_guarantee(method, p, shape, info.reporting_delta)
        check_shuffled_dataset(info)
        state["privacy_extra"] = json_safe(extra)
        if amplified is not None:
            central = normalize_cost(amplified)  # type: ignore[assignment]
            state["central_cost"] = _cost_json(central)  # type: ignore[arg-type]
    params = json_safe(p.model_dump(mode="python"))

    def tx(s: Session) -> SessionInfo:
        ds = accountant.ledger.lock_dataset(s, dataset)
        t = now()
        row = CollectionSession(dataset_id=ds.id, method=method, params=params, state={},
                                status="open", shuffled=bool(shuffled), requester=requester,
                                created_at=t, updated_at=t)
        s.add(row)
        s.flush()
        st = dict(state)
        if central is not None:
            c = accountant._charge_central(s, ds, central, f"session {row.id}: {method} "
                                           "(shuffled, amplified central cost)", requester, None)
            st["central_charge_id"] = c.id
        row.state = st
        s.flush()
        accountant.ledger.append_audit(s, "session_open", {
            **session_doc(row, ds.name), "status": row.status, "state_digest": state_digest(st)})
        return _info_of(s, row, ds.name)

    return accountant.ledger.write(tx)


# ----------------------------------------------------------------- submit
def _parse_values(method: str, values: np.ndarray, plan: Any) -> tuple[np.ndarray, list[str],
                                                                       str]:
    """(ok mask, stored value strings, reason for bad rows)."""
    n = values.shape[0]
    ok = np.zeros(n, dtype=bool)
    out = [""] * n
    if method == "ldp-score":
        for i, v in enumerate(values.tolist()):
            if isinstance(v, bool):
                b: int | None = int(v)
            elif isinstance(v, int | float) and v in (0, 1):
                b = int(v)
            elif isinstance(v, str) and v.strip() in ("0", "1"):
                b = int(v.strip())
            else:
                b = None
            if b is not None:
                ok[i], out[i] = True, str(b)
        return ok, out, MALFORMED_BIT
    for i, v in enumerate(values.tolist()):
        try:
            x = check_message(v, plan)
        except (PlanRejected, InvalidInput):
            continue
        ok[i], out[i] = True, threshold_str(x)
    return ok, out, OFF_GRID if method == "fedcp2-qq" else MALFORMED_VALUE


def _round_reasons(rounds: Any, n: int, current: int) -> list[str | None]:
    """Per row: None if its ``round`` is the current one (or absent), else the reason."""
    if rounds is None:
        return [None] * n
    r = np.asarray(rounds, dtype=object).ravel()
    if r.shape[0] != n:
        raise InvalidInput(f"rounds has {r.shape[0]} rows, the batch has {n}")
    out: list[str | None] = []
    for v in r.tolist():
        try:
            if isinstance(v, bool):
                raise ValueError
            x = float(v)
            if not x.is_integer():
                raise ValueError
        except (TypeError, ValueError):
            out.append(MALFORMED_ROUND)
            continue
        out.append(None if int(x) == current else CLOSED_ROUND if int(x) < current
                   else FUTURE_ROUND)
    return out


def _in_db(acct: Accountant, s: Session, sql_pg: str, sql_lite: str, ids: list[str],
           params: dict[str, Any]) -> set[str]:
    """Which of ``ids`` a keyed lookup finds: one statement, an array on PostgreSQL, a JSON
    array expanded by ``json_each`` on SQLite (both probe the primary key)."""
    if not ids:
        return set()
    if acct.ledger.backend == "postgresql":
        return set(s.execute(text(sql_pg), {**params, "ids": ids}).scalars())
    return set(s.execute(text(sql_lite), {**params, "ids": json.dumps(ids)}).scalars())


#: COPY text format escapes (backslash first, then the separators it must not confuse)
_COPY_ESCAPE = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _insert_reports(acct: Accountant, s: Session, sid: int, rnd: int, subjects: list[str],
                    values: list[str], batch: int) -> None:
    """Bulk insert (``subjects`` are pseudonyms): COPY on PostgreSQL, one ``json_each``
    statement on SQLite."""
    t = now()
    conn = s.connection()
    if acct.ledger.backend == "postgresql":
        raw = conn.connection.driver_connection
        # one pre-formatted COPY text block: ~10× faster than write_row per report
        head, tail = f"{sid}\t", f"\t{rnd}\t"
        ts = "\t" + t.isoformat() + f"\t{batch}\n"
        block = "".join(head + subj.translate(_COPY_ESCAPE) + tail + val.translate(_COPY_ESCAPE)
                        + ts for subj, val in zip(subjects, values, strict=True))
        with raw.cursor() as cur, cur.copy(
                "COPY session_reports (session_id, subject, round, value, received_at, batch) "
                "FROM STDIN") as cp:
            cp.write(block)
        return
    conn.execute(text(
        "INSERT INTO session_reports (session_id, subject, round, value, received_at, batch) "
        "SELECT :sid, json_extract(value, '$[0]'), :r, json_extract(value, '$[1]'), :t, :b "
        "FROM json_each(:rows)"),
        {"sid": sid, "r": rnd, "t": t.isoformat(sep=" "), "b": batch,
         "rows": json.dumps([[a, b] for a, b in zip(subjects, values, strict=True)])})


def submit_reports(
    accountant: Accountant,
    session_id: int,
    subjects: Sequence[Any] | np.ndarray,
    values: Sequence[Any] | np.ndarray,
    rounds: Sequence[Any] | np.ndarray | None = None,
    *,
    idempotency_key: str | None = None,
) -> SubmitResult:
    """Ingest one batch of reports (subject id + bit, or agent id + message) in one
    transaction; see the module docstring for the filters, charging and advancing.

    Raises on a malformed batch (lengths differ, empty, float or over-long ids) or an
    unknown session; otherwise returns the counts, writing nothing if none is accepted.
    ``idempotency_key`` (unique per session) binds the batch — a keyed digest of its
    subject ids, values and rounds: the same key and batch return the recorded result
    (``replayed=True``), a different batch is an error naming the key.
    """
    # one normalisation of ids for the CLI, the API and sessions (issue 14.4)
    sids = id_strings(subjects, "subject ids")
    try:
        vals = np.asarray(values, dtype=object).ravel()
    except Exception as exc:  # ragged nested sequences
        raise InvalidInput(f"values are not a 1-D sequence: {exc}") from exc
    if sids.size == 0:
        raise InvalidInput("a batch needs a non-empty 1-D list of subject ids")
    if vals.shape[0] != sids.shape[0]:
        raise InvalidInput(f"the batch has {sids.shape[0]} subject ids but {vals.shape[0]} values")
    n = int(sids.shape[0])
    key = _text(idempotency_key, "idempotency key")
    skey = accountant.ledger.subject_key()
    pids = accountant.ledger.pseudonyms(sids.tolist())  # stored and looked up: never the ids
    digest = None
    if key is not None:
        rnd = None if rounds is None else np.asarray(rounds, dtype=object).ravel().tolist()
        body = canonical(json_safe([[str(v) for v in vals.tolist()], rnd]))
        digest = request_digest({
            "kind": "session batch", "session_id": str(session_id),
            "subjects": subjects_digest(skey, sids.tolist()),
            "reports": hmac.new(skey, body.encode("utf-8", "surrogatepass"),
                                "sha256").hexdigest()})

    def tx(s: Session) -> SubmitResult:
        row, ds = _lock(accountant, s, session_id)
        if key is not None:
            done = s.scalars(select(SessionBatch).where(
                SessionBatch.session_id == row.id, SessionBatch.idempotency_key == key)).first()
            if done is not None:
                if done.request_digest != digest:
                    raise InvalidInput(
                        f"idempotency key {key!r} was already used for a different batch of "
                        f"session {row.id} (batch {done.batch}): use a new key")
                return SubmitResult(**done.result, replayed=True,
                                    session=_info_of(s, row, ds.name))
        why: Counter[str] = Counter()
        if row.status != "open":
            raise _NothingAccepted({LATE.format(status=row.status): n})
        fed = row.method != "ldp-score"
        proto = None if fed else _proto(row)
        plan = _fed_plan(row) if fed else None
        current = 0 if fed else proto.round  # type: ignore[union-attr]
        ok, stored, bad = _parse_values(row.method, vals, plan)
        why[bad] += int((~ok).sum())
        valid = ok.copy()
        for i, reason in enumerate(_round_reasons(rounds, n, current)):
            if reason is not None and ok[i]:  # a row is counted once, under its first problem
                valid[i] = False
                why[reason] += 1
        # already in this session (primary-key probes)
        seen = _in_db(
            accountant, s,
            "SELECT subject FROM session_reports WHERE session_id = :sid AND subject = ANY(:ids)",
            # CROSS JOIN pins json_each as the outer loop: SQLite would otherwise scan the
            # reports and probe the unindexed JSON array (quadratic)
            "SELECT j.value FROM json_each(:ids) j CROSS JOIN session_reports r "
            "WHERE r.session_id = :sid AND r.subject = j.value",
            sorted(set(pids[valid].tolist())), {"sid": row.id})
        if seen:
            old = valid & np.isin(pids, np.asarray(sorted(seen), dtype=pids.dtype))
            why[ALREADY] += int(old.sum())
            valid &= ~old
        idx = np.flatnonzero(valid)
        _, first = np.unique(sids[idx], return_index=True)
        keep = np.zeros(n, dtype=bool)
        keep[idx[first]] = True
        why[DUPLICATE] += int((valid & ~keep).sum())
        cand = np.flatnonzero(keep)  # in file order
        if fed:
            need = plan.m - int(row.state.get("total", 0))  # type: ignore[union-attr]
        else:
            need = proto.group_size - int(row.state.get("round_count", 0))  # type: ignore
        eps0 = row.state.get("eps0")
        charged = eps0 is not None
        if charged:
            e_units = int(Decimal(eps0) / SUBJECT_UNIT)
            cap_units = int((ds.subject_epsilon or Decimal(0)) / SUBJECT_UNIT)
            over: set[str] = set()
            if cand.size > need:  # find the over-cap first, so they do not take a slot
                over = _in_db(
                    accountant, s,
                    "SELECT subject FROM subject_spend WHERE dataset_id = :d AND "
                    "subject = ANY(:ids) AND spent_units > :lim",
                    "SELECT j.value FROM json_each(:ids) j CROSS JOIN subject_spend p "
                    "WHERE p.dataset_id = :d AND p.subject = j.value AND p.spent_units > :lim",
                    pids[cand].tolist(), {"d": ds.id, "lim": cap_units - e_units})
                if over:
                    is_over = np.isin(pids[cand], np.asarray(sorted(over), dtype=pids.dtype))
                    why[OVER_CAP] += int(is_over.sum())
                    cand = cand[~is_over]
        chosen = cand[:need]
        why[EXTRA_AGENT if fed else ROUND_FULL] += int(cand.size - chosen.size)
        charge: Charge | None = None
        if charged and chosen.size:
            late_over = accountant._bulk_subjects(s, ds.id, np.sort(pids[chosen]), e_units,
                                                  cap_units)
            if late_over:
                is_over = np.isin(pids[chosen], np.asarray(late_over, dtype=pids.dtype))
                why[OVER_CAP] += int(is_over.sum())
                chosen = chosen[~is_over]
        reasons = {k: v for k, v in why.items() if v}
        if chosen.size == 0:
            raise _NothingAccepted(reasons)
        n_acc = int(chosen.size)
        n_rej = n - n_acc
        if charged:
            charge = Charge(
                dataset_id=ds.id, scope="subjects", notion="local", eps0=Decimal(eps0),
                subjects_accepted=n_acc, subjects_rejected=n_rej,
                purpose=f"session {row.id}: {row.method} round {current}",
                requester=row.requester, idempotency_key=None, created_at=now(),
            )
            s.add(charge)
            ds.charge_count += 1
            record_members(s, key_id(skey), charge, pids[chosen])
            s.flush()
            accountant.ledger.append_audit(s, "charge", charge_doc(charge, ds.name))
        acc_vals = [stored[i] for i in chosen.tolist()]
        batch = int(s.scalar(select(func.coalesce(func.max(SessionBatch.batch), 0))
                             .where(SessionBatch.session_id == row.id)) or 0) + 1
        acc_subj = pids[chosen].tolist()
        _insert_reports(accountant, s, row.id, current, acc_subj, acc_vals, batch)
        st = dict(row.state)
        st["total"] = int(st.get("total", 0)) + n_acc
        if charge is not None:
            st["charge_ids"] = [*st.get("charge_ids", []), charge.id]
        advanced = False
        finish: dict[str, Any] | None = None
        if proto is not None:
            st["round_count"] = int(st["round_count"]) + n_acc
            st["round_ones"] = int(st["round_ones"]) + sum(v == "1" for v in acc_vals)
            if st["round_count"] >= proto.group_size:
                proto = proto.advance(int(st["round_ones"]), int(st["round_count"]))
                st.update(protocol=_dump(proto), round_count=0, round_ones=0)
                advanced = True
                if proto.finished:
                    finish = _ldp_release_args(proto)
        elif st["total"] >= plan.m:  # type: ignore[union-attr]
            advanced = True
            finish = _fed_release_args(s, row, plan)  # type: ignore[arg-type]
        row.state = st
        row.updated_at = now()
        s.flush()
        result = {"session_id": row.id, "batch_round": current, "accepted": n_acc,
                  "rejected": n_rej, "reasons": dict(sorted(reasons.items())),
                  "charge_id": charge.id if charge is not None else None, "epsilon": eps0,
                  "advanced": advanced}
        s.add(SessionBatch(session_id=row.id, batch=batch, idempotency_key=key,
                           request_digest=digest, result=result, created_at=now()))
        accountant.ledger.append_audit(s, "session_batch", {
            "session_id": row.id, "round": current, "accepted": n_acc, "rejected": n_rej,
            "reasons": dict(sorted(reasons.items())),
            "charge_id": charge.id if charge is not None else None,
            "eps0": eps0, "advanced": advanced, "batch": batch,
            "idempotency_key": key, "request_digest": digest,
            "reports_digest": reports_digest(
                (a, current, v) for a, v in zip(acc_subj, acc_vals, strict=True)),
            "status": row.status, "state_digest": state_digest(st),
        })
        if finish is not None:
            _release_in_tx(accountant, s, ds, row, privacy_extra=st.get("privacy_extra"),
                           charge_ids=_charge_ids(row), **finish)
            s.flush()
        return SubmitResult(**result, session=_info_of(s, row, ds.name))

    try:
        return accountant.ledger.write(tx)
    except _NothingAccepted as nothing:
        info = session_status(accountant, session_id)
        return SubmitResult(
            session_id=info.id, batch_round=info.round, accepted=0, rejected=n,
            reasons=dict(sorted(nothing.reasons.items())), charge_id=None,
            epsilon=None, advanced=False, session=info)


def _ldp_release_args(proto: LdpScoreProtocol) -> dict[str, Any]:
    thr = proto.threshold if proto.threshold is not None else math.inf
    return {
        "threshold": thr, "params": proto.to_params().model_dump(mode="python"),
        "shape": DataShape(n=proto.rounds * proto.group_size),
        "diagnostics": {
            "rounds": proto.rounds, "rounds_used": proto.round, "group_size": proto.group_size,
            "delta_S": proto.slack, "calibration_target": proto.target, "band": proto.band,
            "trivial": math.isinf(thr),
            "history": [r.model_dump(mode="json") for r in proto.history],
        },
    }


def _fed_messages(s: Session, row: CollectionSession) -> list[float]:
    return [float(v) for v in s.scalars(select(SessionReport.value)
                                        .where(SessionReport.session_id == row.id))]


def _fed_release_args(s: Session, row: CollectionSession, plan: Fed2Plan | FedPlan,
                      replanned: bool = False,
                      params: dict[str, Any] | None = None) -> dict[str, Any]:
    msgs = _fed_messages(s, row)
    thr = aggregate(msgs, plan)
    diag: dict[str, Any] = {"m": plan.m, "n": plan.n, "k": plan.k,
                            "messages": sorted(msgs) if isinstance(plan, Fed2Plan) else None}
    if isinstance(plan, Fed2Plan):
        # each message is its agent's ε-DP output: publishing them costs nothing more
        diag.update(gamma=plan.gamma, l_gamma=plan.l_gamma, l_cor=plan.l_cor, q=plan.q)
    else:
        diag.pop("messages")
        diag.update(l=plan.l)
    if replanned:
        diag["replanned"] = {"m_planned": int(row.state["plan"]["m"]), "m_answered": plan.m}
    return {"threshold": thr, "params": row.params if params is None else params,
            "shape": DataShape(n=plan.m * plan.n, group_sizes=(plan.n,) * plan.m),
            "diagnostics": diag}


# ----------------------------------------------------------------- status / close
def session_status(accountant: Accountant, session_id: int) -> SessionInfo:
    """The session's method, status, round, counts, current interval and query, release."""
    with accountant.ledger.read() as s:
        row = _session(s, session_id, lock=False, backend=accountant.ledger.backend)
        name = s.scalar(select(Dataset.name).where(Dataset.id == row.dataset_id))
        return _info_of(s, row, str(name))


def _subset_plan(row: CollectionSession, plan: Fed2Plan | FedPlan,
                 m2: int) -> tuple[Fed2Plan | FedPlan, dict[str, Any]]:
    """The plan for the ``m2`` agents that answered, and the release params that pin it.

    The agents' answers are fixed (level q, or order ℓ), so only the server side is
    re-chosen (``replan_*_subset``). The params get ``level`` = q (fedcp2-qq) or
    ``agent_order`` = ℓ (fedcp-qq); with them the calibrator's ``plan``/``guarantee``
    derive this same plan from (params, shape), which is what ``audit verify`` recomputes.
    Raises :class:`InfeasiblePlan` when no server side reaches 1−α for these agents.
    """
    try:
        if isinstance(plan, Fed2Plan):
            sub: Fed2Plan | FedPlan = replan_fedcp2_qq_subset(plan, m2)
            params = {**row.params, "level": plan.q}
        else:
            sub = replan_fedcp_qq_subset(plan, m2)
            params = {**row.params, "agent_order": plan.l}
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


def close_session(accountant: Accountant, session_id: int, *, allow_missing: bool = False,
                  abandon: bool = False) -> SessionInfo:
    """Close a session.

    Federated: with every agent answered it is already released; with agents missing it
    refuses, unless ``allow_missing`` (release with the server side recomputed for the
    agents that answered and the agent side pinned in the params; :class:`InfeasiblePlan`,
    nothing written, if no valid plan exists) or ``abandon`` (close without a release). An
    unfinished ldp-score session can only be abandoned. Charges are never refunded.
    """
    if allow_missing and abandon:
        raise InvalidInput("give either allow_missing or abandon, not both")

    def tx(s: Session) -> SessionInfo:
        row, ds = _lock(accountant, s, session_id)
        if row.status != "open":
            raise PlanRejected(f"session {row.id} is already {row.status}")
        total = int(row.state.get("total", 0))
        if abandon:
            row.status = "closed"
            row.updated_at = now()
            accountant.ledger.append_audit(s, "session_close", {
                "session_id": row.id, "status": "closed", "release_id": None, "reports": total,
                "state_digest": state_digest(row.state)})
            return _info_of(s, row, ds.name)
        if row.method == "ldp-score":
            proto = _proto(row)
            raise PlanRejected(
                f"session {row.id} is in round {proto.round} of {proto.rounds}: an ldp-score "
                "session releases when its last round is full; use abandon (--abandon) to close "
                "it without a release")
        plan = _fed_plan(row)
        missing = plan.m - total
        if not allow_missing:
            raise PlanRejected(f"session {row.id}: {missing} of {plan.m} agents have not "
                               "answered; pass --allow-missing to release with a plan recomputed "
                               "for those that did, or --abandon")
        if total == 0:
            raise PlanRejected(f"session {row.id}: no agent has answered; nothing to release")
        sub, params = _subset_plan(row, plan, total)
        args = _fed_release_args(s, row, sub, replanned=True, params=params)
        row.updated_at = now()
        _release_in_tx(accountant, s, ds, row,
                       privacy_extra=_subset_extra(row, sub, ds, params),
                       charge_ids=_charge_ids(row), **args)
        s.flush()
        return _info_of(s, row, ds.name)

    return accountant.ledger.write(tx)


def _subset_extra(row: CollectionSession, plan: Fed2Plan | FedPlan, ds: Dataset,
                  params: dict[str, Any]) -> dict[str, Any] | None:
    """The shuffled record for the agents that answered (the shuffle hid m' senders, not m)."""
    if not row.shuffled:
        return None
    if row.state.get("central_cost") is not None:
        # the central charge was made for m agents; fewer senders amplify less
        raise PlanRejected("a shuffled session on an (ε, δ) dataset was charged the amplified "
                           "cost for all m agents; it cannot be released with agents missing")
    from privcal.accountant.amplification import shuffled_guarantee

    cal = registry.get(row.method).calibrator
    p = cal.Params.model_validate(params)
    shape = DataShape(n=plan.m * plan.n, group_sizes=(plan.n,) * plan.m)
    return json_safe(shuffled_guarantee(row.method, p, shape, ds.reporting_delta)[1])


def release_of(accountant: Accountant, session_id: int) -> Release | None:
    """The session's release, if it has one."""
    info = session_status(accountant, session_id)
    return accountant.release(info.release_id) if info.release_id is not None else None
