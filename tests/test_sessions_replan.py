"""``close_session(..., allow_missing=True)`` for federated sessions, on SQLite and PostgreSQL:
the release pins the agents' side of the plan in its params (``level`` / ``agent_order``), its
recorded guarantee is the replanned one, and ``audit verify`` recomputes it from the row."""

from __future__ import annotations

import math
import random
from decimal import Decimal
from typing import Any

import numpy as np
import pytest

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.accountant.verification import check_release
from privcal.calibrators.base import DataShape
from privcal.calibrators.fedcp2_qq import FedCP2QQ, FedCP2QQParams
from privcal.calibrators.fedcp_qq import FedCPQQ, FedCPQQParams
from privcal.calibrators.fedplan import (
    plan_fedcp2_qq,
    plan_fedcp_qq,
    replan_fedcp2_qq_subset,
    replan_fedcp_qq_subset,
)
from privcal.client import fedcp2_qq_message, fedcp_qq_message
from privcal.errors import InfeasiblePlan, PlanRejected


def _scores(rng: random.Random, n: int) -> np.ndarray:
    return np.array([rng.random() for _ in range(n)])


def test_fedcp2_qq_three_of_five_releases_the_replanned_guarantee(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("h", epsilon=1, subject_epsilon=10)
    info = S.open_session(acct, "fedcp2-qq", dataset="h", alpha=0.1, agents=5, local_n=200,
                          epsilon=10)
    plan = plan_fedcp2_qq(5, 200, 0.1, 10)
    sub = replan_fedcp2_qq_subset(plan, 3)
    fresh = plan_fedcp2_qq(3, 200, 0.1, 10)
    # the case that used to be refused: a fresh plan for 3 agents is not the valid replan
    assert (sub.gamma, sub.k_gamma) == (0.07, 3) and (fresh.gamma, fresh.k_gamma) == (0.01, 2)
    rng = random.Random(5)
    msgs = [fedcp2_qq_message(_scores(rng, 200), plan, rng) for _ in range(3)]
    assert S.submit_reports(acct, info.id, ["a", "b", "c"], msgs).accepted == 3
    with pytest.raises(PlanRejected, match="--allow-missing"):
        S.close_session(acct, info.id)

    closed = S.close_session(acct, info.id, allow_missing=True, missing="replan")
    assert closed.status == "released" and closed.release_id is not None
    rel = acct.release(closed.release_id)
    assert rel.params["level"] == plan.q == 0.91
    assert rel.shape["group_sizes"] == [200] * 3
    shape = DataShape(n=600, group_sizes=(200,) * 3)
    expected = FedCP2QQ().guarantee(
        FedCP2QQParams(alpha=0.1, epsilon=10, level=plan.q), shape)
    assert rel.coverage == expected
    assert rel.coverage.rank == sub.k_gamma == 3
    for key in ("gamma", "l_gamma", "k_gamma", "l_cor", "q", "M", "M_gamma"):
        assert rel.coverage.details[key] == getattr(sub, key), key
    top = sorted(msgs)[sub.k_gamma - 1]
    assert rel.threshold == (top if top < plan.smax else math.inf)
    assert rel.diagnostics["replanned"] == {"m_planned": 5, "m_answered": 3}
    assert rel.diagnostics["k"] == 3 and rel.diagnostics["gamma"] == sub.gamma
    assert all(acct.subject_spend("h", a) == Decimal(10) for a in "abc")
    assert acct.verify().guarantees_recomputed == 1
    # the pinned level is what makes it recompute: without it the fresh plan's k=2 comes back
    bare = {k: v for k, v in rel.params.items() if k != "level"}
    res = check_release(acct, rel.model_copy(update={"params": bare}))
    assert not res.ok and any("rank" in p for p in res.problems)


def test_fedcp2_qq_refused_close_can_be_retried_after_more_agents(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("h", epsilon=1, subject_epsilon=10)
    info = S.open_session(acct, "fedcp2-qq", dataset="h", alpha=0.1, agents=5, local_n=200,
                          epsilon=10)
    plan = plan_fedcp2_qq(5, 200, 0.1, 10)
    rng = random.Random(8)
    msgs = [fedcp2_qq_message(_scores(rng, 200), plan, rng) for _ in range(2)]
    S.submit_reports(acct, info.id, ["a"], msgs[:1])
    with pytest.raises(InfeasiblePlan, match="1 of 5 agents"):
        S.close_session(acct, info.id, allow_missing=True, missing="replan")
    S.submit_reports(acct, info.id, ["b"], msgs[1:])
    closed = S.close_session(acct, info.id, allow_missing=True, missing="replan")
    rel = acct.release(closed.release_id)  # type: ignore[arg-type]
    sub = replan_fedcp2_qq_subset(plan, 2)
    assert rel.coverage.rank == sub.k_gamma and rel.coverage.details["gamma"] == sub.gamma
    assert acct.verify().guarantees_recomputed == 1


def test_fedcp_qq_three_of_five_releases_the_replanned_guarantee(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("np", epsilon=1, allow_nonprivate=True)
    info = S.open_session(acct, "fedcp-qq", dataset="np", alpha=0.1, agents=5, local_n=200)
    plan = plan_fedcp_qq(5, 200, 0.1)
    sub = replan_fedcp_qq_subset(plan, 3)
    # refused before: the agents sent their 183rd smallest, a fresh plan for 3 would use the 181st
    assert (sub.l, sub.k) == (183, 2) and plan_fedcp_qq(3, 200, 0.1).l == 181
    rng = random.Random(2)
    msgs = [fedcp_qq_message(_scores(rng, 200), plan) for _ in range(3)]
    S.submit_reports(acct, info.id, ["x", "y", "z"], msgs)
    closed = S.close_session(acct, info.id, allow_missing=True, missing="replan")
    rel = acct.release(closed.release_id)  # type: ignore[arg-type]
    assert rel.params["agent_order"] == 183
    shape = DataShape(n=600, group_sizes=(200,) * 3)
    assert rel.coverage == FedCPQQ().guarantee(FedCPQQParams(alpha=0.1, agent_order=183), shape)
    # the recorded upper is M plus the quadrature's allowance (red team 6)
    assert rel.coverage.rank == sub.k and sub.M < rel.coverage.upper <= sub.M + 2e-12
    assert rel.coverage.details["l"] == 183 and rel.coverage.details["M"] == sub.M
    assert rel.threshold == sorted(msgs)[sub.k - 1]
    assert rel.charge_ids == [] and rel.privacy["model"] == "none"
    assert acct.verify().guarantees_recomputed == 1
    bare = {k: v for k, v in rel.params.items() if k != "agent_order"}
    assert not check_release(acct, rel.model_copy(update={"params": bare})).ok


def test_fedcp_qq_infeasible_replan_is_refused(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("np", epsilon=1, allow_nonprivate=True)
    info = S.open_session(acct, "fedcp-qq", dataset="np", alpha=0.1, agents=50, local_n=20)
    plan = plan_fedcp_qq(50, 20, 0.1)
    msg = fedcp_qq_message(_scores(random.Random(0), 20), plan)
    S.submit_reports(acct, info.id, ["only"], [msg])
    head = acct.ledger.head()
    # one agent's 18th smallest of 20 covers 18/21 < 0.9
    with pytest.raises(InfeasiblePlan, match=r"1 of 50 agents.*stays open"):
        S.close_session(acct, info.id, allow_missing=True, missing="replan")
    assert acct.ledger.head() == head
    assert S.session_status(acct, info.id).status == "open"
