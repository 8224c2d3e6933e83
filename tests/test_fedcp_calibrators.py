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
from privcal.calibrators.fedplan import plan_fedcp2_qq, plan_fedcp_qq, plan_fedcp_qq_unequal
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
    assert g.rank == plan.k and g.upper == plan.M


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
