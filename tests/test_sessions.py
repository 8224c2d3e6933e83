"""Collection sessions through the library API, on SQLite and PostgreSQL: per-subject caps at
ingestion, rejections that change nothing, shuffled amplification, FedCP-QQ, bad input."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.calibrators.fedplan import plan_fedcp_qq
from privcal.client import fedcp_qq_message
from privcal.errors import (
    AuditFailed,
    BudgetRefused,
    InfeasiblePlan,
    InvalidInput,
    NotFound,
    PlanRejected,
)
from privcal.storage.models import Charge, SubjectSpend
from privcal.storage.sessions import CollectionSession, SessionReport


def _snapshot(acct: Accountant) -> tuple[Any, ...]:
    """Everything a rejected call must leave untouched."""
    with acct.ledger.read() as s:
        counts = tuple(s.scalar(select(func.count()).select_from(t)) for t in
                       (Charge, SubjectSpend, SessionReport, CollectionSession))
        spends = tuple(s.execute(select(SubjectSpend.subject, SubjectSpend.spent_units)
                                 .order_by(SubjectSpend.subject)).all())
        states = tuple((c.id, c.status, repr(c.state)) for c in
                       s.scalars(select(CollectionSession).order_by(CollectionSession.id)))
    return acct.ledger.head(), counts, spends, states


def _ldp(acct: Accountant, ds: str = "d", **kw: Any) -> S.SessionInfo:
    args: dict[str, Any] = dict(dataset=ds, alpha=0.1, epsilon=1.5, rounds=3, group_size=3)
    args.update(kw)
    return S.open_session(acct, "ldp-score", **args)


def test_subjects_past_their_cap_are_rejected_at_ingestion(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=2)
    a = _ldp(acct)
    r = S.submit_reports(acct, a.id, ["old1", "old2", "x"], [1, 0, 1], [0, 0, 0])
    assert r.accepted == 3 and r.advanced and r.session.round == 1
    b = _ldp(acct)
    # 2 over-cap subjects must not take slots: 3 of the 4 new ones fill the round
    r = S.submit_reports(acct, b.id, ["old1", "new1", "old2", "new2", "new3", "new4"],
                         [1, 1, 1, 0, 1, 1], [0] * 6)
    assert r.accepted == 3
    assert r.reasons == {"subject budget exhausted": 2, "round full": 1}
    assert acct.subject_spend("d", "old1") == Decimal("1.5")  # not charged a second time
    # the surplus row is a random one of the four new ones (red team 6), never charged
    spends = [acct.subject_spend("d", f"new{i}") for i in range(1, 5)]
    assert sorted(spends) == [0, Decimal("1.5"), Decimal("1.5"), Decimal("1.5")]
    # a batch smaller than the round: the over-cap row is found by the charging SQL itself
    r = S.submit_reports(acct, b.id, ["x", "new5"], [1, 1], [1, 1])
    assert r.accepted == 1 and r.reasons == {"subject budget exhausted": 1}
    assert acct.subject_spend("d", "x") == Decimal("1.5")
    acct.verify()


def test_entirely_rejected_batch_changes_nothing(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=5)
    info = _ldp(acct)
    assert S.submit_reports(acct, info.id, ["a", "b", "c"], [1, 1, 0],
                            [0, 0, 0]).session.round == 1
    before = _snapshot(acct)
    r = S.submit_reports(acct, info.id, ["a", "d", "e", "f", "g"], [1, 1, "yes", 2, 0],
                         rounds=[1, 0, 1, 1, 5])
    assert r.accepted == 0 and r.rejected == 5 and r.charge_id is None
    assert r.reasons == {"subject already reported in this session": 1, "closed round": 1,
                         "malformed bit": 2, "malformed round": 1}  # 5 is no round of 3
    assert _snapshot(acct) == before
    # the same subjects with good rows are then accepted: nothing was reserved by the rejection
    r = S.submit_reports(acct, info.id, ["d", "e", "f"], [1, 0, 1], rounds=[1, 1, 1])
    assert r.accepted == 3 and r.session.round == 2
    acct.verify()


def test_released_and_abandoned_sessions_take_no_reports(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=5)
    info = _ldp(acct, rounds=1, group_size=2)
    r = S.submit_reports(acct, info.id, ["a", "b"], [1, 1], [0, 0])
    assert r.session.status == "released" and r.session.release_id is not None
    before = _snapshot(acct)
    r = S.submit_reports(acct, info.id, ["c"], [1], [0])
    assert r.reasons == {"late: session is released": 1}
    assert _snapshot(acct) == before
    other = _ldp(acct)
    S.submit_reports(acct, other.id, ["c"], [1], [0])
    with pytest.raises(PlanRejected, match="abandon"):
        S.close_session(acct, other.id)
    closed = S.close_session(acct, other.id, abandon=True)
    assert closed.status == "closed" and closed.release_id is None
    assert acct.subject_spend("d", "c") == Decimal("1.5")  # never refunded
    assert S.submit_reports(acct, other.id, ["z"], [1], [0]).reasons == \
        {"late: session is closed": 1}
    with pytest.raises(PlanRejected, match="already closed"):
        S.close_session(acct, other.id, abandon=True)
    acct.verify()


def test_bad_open_writes_nothing(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=1)
    acct.create_dataset("nocap", epsilon=1)
    before = _snapshot(acct)
    with pytest.raises(NotFound):
        _ldp(acct, ds="missing")
    with pytest.raises(InvalidInput, match="alpha"):
        _ldp(acct, alpha=1.5)
    with pytest.raises(InvalidInput, match="group"):
        S.open_session(acct, "ldp-score", dataset="d", alpha=0.1, epsilon=1, rounds=2)
    with pytest.raises(BudgetRefused, match="per-subject cap"):
        _ldp(acct, epsilon=2)  # ε above the cap: every report would be refused
    with pytest.raises(BudgetRefused, match="not set"):
        _ldp(acct, ds="nocap", epsilon=1)
    with pytest.raises(InvalidInput, match="unknown session method"):
        S.open_session(acct, "split", dataset="d", alpha=0.1)
    with pytest.raises(InvalidInput, match="ε"):
        S.open_session(acct, "fedcp2-qq", dataset="d", alpha=0.1, agents=5, local_n=10,
                       epsilon=0.01)  # infeasible plan
    with pytest.raises(BudgetRefused, match="non-private"):
        S.open_session(acct, "fedcp-qq", dataset="d", alpha=0.1, agents=5, local_n=10)
    with pytest.raises(NotFound):
        S.submit_reports(acct, 42, ["a"], [1])
    info = _ldp(acct, epsilon=1)
    before = _snapshot(acct)
    with pytest.raises(InvalidInput, match="2 subject ids but 1 values"):
        S.submit_reports(acct, info.id, ["a", "b"], [1])
    with pytest.raises(InvalidInput, match="floats"):
        S.submit_reports(acct, info.id, np.array([1.0, 2.0]), [1, 1])
    assert _snapshot(acct) == before


def test_shuffled_ldp_score_records_per_round_amplification(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("pure", epsilon=1, subject_epsilon=4)
    acct.create_dataset("z", rho=1, subject_epsilon=4)
    acct.create_dataset("ad", approx_epsilon=5, approx_delta=1e-6, subject_epsilon=4)
    before = _snapshot(acct)
    for ds in ("pure", "z"):  # issue 14.5: the amplified (ε, δ) cannot be charged there
        with pytest.raises(BudgetRefused, match=r"cannot be charged an \(ε, δ\) cost"):
            _ldp(acct, ds=ds, epsilon=4, rounds=1, group_size=2000, shuffled=True)
    with pytest.raises(InvalidInput, match="fedcp2-qq cannot be shuffled"):  # issue 14.6
        S.open_session(acct, "fedcp2-qq", dataset="ad", alpha=0.1, agents=100, local_n=50,
                       epsilon=2, shuffled=True)
    assert _snapshot(acct) == before
    info = _ldp(acct, ds="ad", epsilon=4, rounds=1, group_size=2000, shuffled=True)
    rng = np.random.default_rng(3)
    r = S.submit_reports(acct, info.id, [f"u{i}" for i in range(2000)],
                         rng.integers(0, 2, 2000).tolist(), [0] * 2000)
    rel = acct.release(r.session.release_id)
    extra = rel.privacy["extra"]
    assert extra["shuffled"] is True and extra["n_shuffled"] == 2000
    assert "per round" in extra["scope"]
    amp_eps = float(extra["amplification"]["eps"])
    assert 0 < amp_eps < 4  # amplified below ε0 for 2000 binary-RR reports per round
    assert rel.privacy["epsilon"] == "4"  # the local guarantee is still recorded
    assert acct.verify().guarantees_recomputed == 1


def test_shuffled_on_approx_dataset_charges_amplified_cost_at_open(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("ad", approx_epsilon=5, approx_delta=1e-5, subject_epsilon=4)
    before = acct.budget("ad").spent
    info = _ldp(acct, ds="ad", epsilon=4, rounds=1, group_size=2000, shuffled=True)
    assert info.central_charge_id is not None
    spent = acct.budget("ad").spent
    assert spent != before and spent["epsilon"] > 0
    r = S.submit_reports(acct, info.id, [f"u{i}" for i in range(2000)], [1] * 2000,
                         [0] * 2000)
    rel = acct.release(r.session.release_id)
    assert info.central_charge_id in rel.charge_ids
    assert rel.privacy["central_cost"]["kind"] == "approx"
    assert Decimal(rel.privacy["central_cost"]["eps"]) == spent["epsilon"]
    assert acct.verify().guarantees_recomputed == 1  # central_cost recomputed too


def test_fedcp_qq_session_is_not_charged(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("np", epsilon=1, allow_nonprivate=True)
    info = S.open_session(acct, "fedcp-qq", dataset="np", alpha=0.1, agents=5, local_n=10)
    plan = plan_fedcp_qq(5, 10, 0.1)
    assert info.plan is not None and info.plan["l"] == plan.l
    # the session says what it stores: raw order statistics, not DP outputs (issue 16.6)
    assert "raw order statistic" in info.reports_are and "not private" in info.reports_are
    rng = random.Random(1)
    msgs = [fedcp_qq_message(np.array([rng.random() for _ in range(10)]), plan)
            for _ in range(5)]
    r = S.submit_reports(acct, info.id, [f"a{j}" for j in range(5)], [*msgs[:4], "nan"])
    assert r.accepted == 4 and r.reasons == {"malformed value": 1} and r.charge_id is None
    r = S.submit_reports(acct, info.id, ["a4"], [msgs[4]])
    rel = acct.release(r.session.release_id)
    assert rel.threshold == sorted(msgs)[plan.k - 1] and rel.charge_ids == []
    assert rel.privacy["model"] == "none"
    assert acct.budget("np").charges == 0
    assert acct.verify().guarantees_recomputed == 1


def test_allow_missing_refuses_when_no_replan_is_feasible(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("h", epsilon=1, subject_epsilon=10)
    info = S.open_session(acct, "fedcp2-qq", dataset="h", alpha=0.1, agents=5, local_n=200,
                          epsilon=10)
    top = info.plan["smax"]  # type: ignore[index]
    S.submit_reports(acct, info.id, ["a"], [top])
    before = _snapshot(acct)
    # 1 of 5 at q=0.91: no γ keeps ℓ_γ + ℓ_cor ≤ ⌊200·0.91⌋ for a single agent
    with pytest.raises(InfeasiblePlan, match="stays open"):
        S.close_session(acct, info.id, allow_missing=True, missing="replan")
    with pytest.raises(PlanRejected, match="--allow-missing"):
        S.close_session(acct, info.id)
    assert _snapshot(acct) == before
    assert S.session_status(acct, info.id).status == "open"


def test_tampered_session_rows_fail_verification(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=5)
    info = _ldp(acct)
    S.submit_reports(acct, info.id, ["a", "b"], [1, 1], [0, 0])
    acct.ledger.verify()

    def drop_report(s: Any) -> None:
        s.execute(SessionReport.__table__.delete().where(
            SessionReport.subject == acct.ledger.pseudonyms(["a"])[0]))

    acct.ledger.write(drop_report)
    # the batch's entry commits to its reports (issue 16.3): the entry is named
    with pytest.raises(AuditFailed, match=r"audit entry \d+: session \d+'s reports of batch 1"):
        acct.ledger.verify()


def test_awkward_subject_ids_round_trip(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=5)
    info = _ldp(acct, group_size=5)
    # (a tab, a line feed or a CR in an id is refused since red team 6: tests/test_hot_path.py)
    odd = ["a|b", r"\N", "back\\slash", "com,ma", "ünï,\"q\""]
    assert S.submit_reports(acct, info.id, odd, [1, 0, 1, 0, 1], [0] * 5).accepted == 5
    with acct.ledger.read() as s:
        stored = sorted(s.scalars(select(SessionReport.subject)))
    # stored as keyed pseudonyms (issue 16.6), one per id, never the id itself
    assert stored == sorted(acct.ledger.pseudonyms(odd).tolist())
    assert not set(stored) & set(odd)
    again = S.submit_reports(acct, info.id, odd, [1, 0, 1, 0, 1], [1] * 5)  # round 1
    assert again.reasons == {"subject already reported in this session": 5}
    assert all(acct.subject_spend("d", x) == Decimal("1.5") for x in odd)
    acct.verify()
