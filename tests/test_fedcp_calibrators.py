"""The FedCP-QQ / FedCP²-QQ calibrators against the contract of privcal.calibrators.base."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from pydantic import ValidationError

from privcal.calibrators import registry
from privcal.calibrators.base import CalibrationInput, Calibrator, DataShape
from privcal.calibrators.fedcp2_qq import FedCP2QQ
from privcal.calibrators.fedcp_qq import PRIVACY_NONE, FedCPQQ
from privcal.calibrators.fedplan import (
    plan_fedcp2_qq,
    plan_fedcp_qq,
    plan_fedcp_qq_unequal,
    replan_fedcp2_qq_subset,
    replan_fedcp_qq_subset,
)
from privcal.costs import LocalDP
from privcal.errors import InfeasiblePlan, InvalidInput


def _data(sizes: list[int], seed: int = 0, ids: list | None = None) -> CalibrationInput:
    r = np.random.default_rng(seed)
    ids = ids if ids is not None else list(range(len(sizes)))
    agents = np.concatenate([[a] * s for a, s in zip(ids, sizes, strict=True)])
    perm = r.permutation(agents.size)  # agents' rows interleaved: grouping must not rely on order
    return CalibrationInput(scores=r.random(agents.size)[perm], agents=agents[perm])


def test_registered_and_protocol() -> None:
    for name, cls in (("fedcp-qq", FedCPQQ), ("fedcp2-qq", FedCP2QQ)):
        cal = registry.get(name).calibrator
        assert isinstance(cal, cls) and isinstance(cal, Calibrator)
        assert cal.name == name and cal.privacy_model == "federated"
        assert cal.inputs == frozenset({"scores", "agents"})


def test_fedcp_qq_cost_guarantee_calibrate() -> None:
    cal = FedCPQQ()
    p = cal.Params(alpha=0.1)
    shape = DataShape(n=50, group_sizes=(10,) * 5)
    assert cal.cost(p, shape) is None
    g = cal.guarantee(p, shape)
    assert g == cal.guarantee(p, shape)  # deterministic, recomputable
    assert g.lower == pytest.approx(0.9) and g.rank == 3
    assert abs(g.upper - 0.9256259546) < 1e-9
    assert g.details["privacy"] == PRIVACY_NONE and g.details["l"] == 10

    data = _data([10] * 5, seed=3)
    res = cal.calibrate(data, p, random.Random(0))
    by_agent = [np.sort(data.scores[data.agents == a]) for a in range(5)]
    expected = np.sort([s[9] for s in by_agent])[2]
    assert res.threshold == expected
    assert res.diagnostics["l"] == 10 and res.diagnostics["k"] == 3


def test_fedcp_qq_unequal_sizes_and_string_ids() -> None:
    cal = FedCPQQ()
    p = cal.Params(alpha=0.1)
    sizes = [12, 30, 9, 20]
    ids = ["hosp-c", "hosp-a", "hosp-d", "hosp-b"]
    data = _data(sizes, seed=4, ids=ids)
    plan = plan_fedcp_qq_unequal([30, 20, 12, 9], 0.1)  # sorted ids: a, b, c, d
    res = cal.calibrate(data, p, random.Random(0))
    msgs = []
    for a, lj in zip(sorted(ids), plan.ls, strict=True):
        s = np.sort(data.scores[data.agents == a])
        msgs.append(s[lj - 1] if lj <= s.size else math.inf)
    assert res.threshold == np.sort(msgs)[plan.k - 1]
    g = cal.guarantee(p, DataShape(n=71, group_sizes=(30, 20, 12, 9)))
    # the recorded upper is M plus the quadrature's allowance (red team 6: a bound, not M)
    assert g.rank == plan.k and plan.M < g.upper <= plan.M + 2e-12


def test_fedcp2_qq_cost_guarantee_calibrate() -> None:
    cal = FedCP2QQ()
    p = cal.Params(alpha=0.1, epsilon=10.0)
    shape = DataShape(n=1000, group_sizes=(200,) * 5)
    assert cal.cost(p, shape) == LocalDP(eps0=10.0)
    g = cal.guarantee(p, shape)
    assert g == cal.guarantee(p, shape)
    plan = plan_fedcp2_qq(5, 200, 0.1, 10.0)
    assert g.lower == pytest.approx(0.9) and g.rank == plan.k_gamma == 4
    assert g.details["l_cor"] == 3 and g.details["gamma"] == 0.02
    res = cal.calibrate(_data([200] * 5, seed=5), p, random.Random(1))
    grid = np.linspace(0, 1, 100)
    assert np.min(np.abs(grid - res.threshold)) < 1e-12
    assert len(res.diagnostics["messages"]) == 5
    # same seed, same output: the rng is the only randomness
    again = cal.calibrate(_data([200] * 5, seed=5), p, random.Random(1))
    assert again.threshold == res.threshold


def test_fedcp2_qq_refusals() -> None:
    cal = FedCP2QQ()
    with pytest.raises(InvalidInput, match="same number"):
        cal.guarantee(cal.Params(alpha=0.1, epsilon=10.0), DataShape(n=30, group_sizes=(10, 20)))
    with pytest.raises(InfeasiblePlan, match="too small"):
        cal.guarantee(cal.Params(alpha=0.1, epsilon=0.5), DataShape(n=50, group_sizes=(10,) * 5))
    with pytest.raises(ValidationError):
        cal.Params(alpha=0.1, epsilon=0.0)
    with pytest.raises(ValidationError):
        cal.Params(alpha=0.1, epsilon=1.0, bins=1)
    with pytest.raises(ValidationError):
        cal.Params(alpha=0.1, epsilon=1.0, extra=3)


def test_bad_data() -> None:
    cal = FedCPQQ()
    p = cal.Params(alpha=0.1)
    with pytest.raises(InvalidInput, match="agent"):
        cal.calibrate(CalibrationInput(scores=np.zeros(10)), p, random.Random(0))
    with pytest.raises(InvalidInput, match="length mismatch"):
        cal.calibrate(
            CalibrationInput(scores=np.zeros(10), agents=np.zeros(9)), p, random.Random(0)
        )
    with pytest.raises(InvalidInput):
        cal.calibrate(
            CalibrationInput(scores=np.r_[np.zeros(9), np.nan], agents=np.zeros(10)),
            p,
            random.Random(0),
        )
    with pytest.raises(InvalidInput, match="sum"):
        cal.guarantee(p, DataShape(n=11, group_sizes=(5, 5)))
    with pytest.raises(InvalidInput, match="group_sizes"):
        cal.guarantee(p, DataShape(n=10))


def test_plan_matches_library() -> None:
    cal = FedCPQQ()
    plan = cal.plan(cal.Params(alpha=0.1), DataShape(n=1000, group_sizes=(20,) * 50))
    assert plan == plan_fedcp_qq(50, 20, 0.1)


# ----------------------------------------------------------------- pinned agent side (sessions)


def test_fedcp2_qq_pinned_level_gives_the_replanned_guarantee() -> None:
    cal = FedCP2QQ()
    plan = plan_fedcp2_qq(5, 200, 0.1, 10.0)
    sub = replan_fedcp2_qq_subset(plan, 3)
    shape = DataShape(n=600, group_sizes=(200,) * 3)
    p = cal.Params(alpha=0.1, epsilon=10.0, level=plan.q)
    assert cal.plan(p, shape) == sub
    g = cal.guarantee(p, shape)
    assert g.rank == sub.k_gamma == 3 and g.lower == pytest.approx(0.9)
    for key in ("gamma", "l_gamma", "k_gamma", "l_cor", "q", "M", "M_gamma", "proof_bound"):
        assert g.details[key] == getattr(sub, key), key
    assert "0.91" in g.details["pinned"]
    # unpinned, the same shape gives the fresh plan for 3 agents (and no "pinned" detail, so
    # releases recorded before the parameter existed still recompute)
    fresh = cal.guarantee(cal.Params(alpha=0.1, epsilon=10.0), shape)
    assert fresh.rank == plan_fedcp2_qq(3, 200, 0.1, 10.0).k_gamma == 2
    assert "pinned" not in fresh.details
    # pinned at the level the full plan chose, for all 5 agents: the same plan
    assert cal.plan(p, DataShape(n=1000, group_sizes=(200,) * 5)) == plan
    # calibrate: the agents answer at the pinned level, the server keeps the k_γ-th answer
    res = cal.calibrate(_data([200] * 3, seed=6), p, random.Random(2))
    assert res.diagnostics["q"] == 0.91 and res.diagnostics["k_gamma"] == 3
    msgs = res.diagnostics["messages"]
    assert res.threshold == (msgs[2] if msgs[2] < 1 else math.inf)


def test_fedcp2_qq_pinned_level_refusals() -> None:
    cal = FedCP2QQ()
    p = cal.Params(alpha=0.1, epsilon=10.0, level=0.91)
    with pytest.raises(InfeasiblePlan, match=r"q=0\.91"):  # one agent cannot reach 0.9 at q=0.91
        cal.guarantee(p, DataShape(n=200, group_sizes=(200,)))
    for bad in (0.4, 1.0, float("nan")):
        with pytest.raises(ValidationError):
            cal.Params(alpha=0.1, epsilon=10.0, level=bad)


def test_fedcp_qq_pinned_agent_order_gives_the_replanned_guarantee() -> None:
    cal = FedCPQQ()
    plan = plan_fedcp_qq(5, 200, 0.1)
    sub = replan_fedcp_qq_subset(plan, 3)
    shape = DataShape(n=600, group_sizes=(200,) * 3)
    p = cal.Params(alpha=0.1, agent_order=plan.l)
    assert cal.plan(p, shape) == sub
    g = cal.guarantee(p, shape)
    assert (g.rank, g.details["l"]) == (sub.k, 183) and sub.M < g.upper <= sub.M + 2e-12
    assert g.details["plan"].startswith("agent order ℓ pinned")
    assert cal.guarantee(cal.Params(alpha=0.1), shape).details["l"] == 181  # the fresh ℓ*
    data = _data([200] * 3, seed=7)
    res = cal.calibrate(data, p, random.Random(0))
    tops = sorted(np.sort(data.scores[data.agents == a])[182] for a in range(3))
    assert res.threshold == tops[sub.k - 1] and res.diagnostics["l"] == 183


def test_fedcp_qq_pinned_agent_order_refusals() -> None:
    cal = FedCPQQ()
    with pytest.raises(InfeasiblePlan, match="not an order statistic"):
        cal.guarantee(
            cal.Params(alpha=0.1, agent_order=21), DataShape(n=100, group_sizes=(20,) * 5)
        )
    with pytest.raises(InfeasiblePlan, match="best M"):  # 1 agent, 18th of 20: 18/21 < 0.9
        cal.guarantee(cal.Params(alpha=0.1, agent_order=18), DataShape(n=20, group_sizes=(20,)))
    with pytest.raises(InvalidInput, match="same number"):
        cal.guarantee(cal.Params(alpha=0.1, agent_order=5), DataShape(n=30, group_sizes=(10, 20)))
    with pytest.raises(ValidationError):
        cal.Params(alpha=0.1, agent_order=0)
