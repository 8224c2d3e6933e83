"""Agent and server steps of FedCP-QQ / FedCP²-QQ (Humbert et al. 2023, Alg. 1–3)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats

from privcal.calibrators import federated_agent as fa
from privcal.calibrators.federated_agent import (
    aggregate,
    bin_grid,
    check_message,
    fedcp2_qq_message,
    fedcp_qq_message,
)
from privcal.calibrators.fedplan import (
    Fed2Plan,
    plan_fedcp2_qq,
    plan_fedcp_qq,
    plan_fedcp_qq_unequal,
)
from privcal.errors import InvalidInput, PlanRejected


def _plan2(n: int = 50, q: float = 0.7, eps: float = 2.0, bins: int = 12, smax: float = 1.0):
    """A hand-built plan, to drive the mechanism at a chosen level q."""
    return Fed2Plan(
        gamma=0.1, l_gamma=1, k_gamma=2, l_cor=1, q=q, M=0.95, M_gamma=0.95,
        m=3, n=n, alpha=0.1, epsilon=eps, bins=bins, smax=smax,
    )  # fmt: skip


def test_fedcp_message_is_exact_order_statistic() -> None:
    plan = plan_fedcp_qq(5, 10, 0.1)  # ℓ = 10
    s = np.random.default_rng(1).random(10)
    assert fedcp_qq_message(s, plan) == np.sort(s)[plan.l - 1]
    plan2 = plan_fedcp_qq(50, 20, 0.1)  # ℓ = 18
    s2 = np.random.default_rng(2).normal(size=20)
    assert fedcp_qq_message(s2, plan2) == np.sort(s2)[17]
    with pytest.raises(InvalidInput, match="n = 20"):
        fedcp_qq_message(s, plan2)
    with pytest.raises(InvalidInput, match="NaN"):
        fedcp_qq_message(np.r_[s2[:-1], np.nan], plan2)


def test_fedcp_message_unequal_plan() -> None:
    plan = plan_fedcp_qq_unequal([3, 7, 12, 20], 0.1)
    s = np.arange(12, dtype=float)[::-1]
    assert fedcp_qq_message(s, plan) == 11.0  # ℓ = ⌈0.9·13⌉ = 12: the largest of 0..11
    assert fedcp_qq_message(np.arange(3.0), plan) == math.inf  # ℓ = 4 > 3
    with pytest.raises(InvalidInput):
        fedcp_qq_message(np.arange(5.0), plan)


def test_aggregate_is_kth_smallest_and_checks() -> None:
    plan = plan_fedcp_qq(5, 10, 0.1)  # k = 3
    assert aggregate([0.5, 0.1, 0.9, 0.3, 0.7], plan) == 0.5
    with pytest.raises(PlanRejected, match="5 agents"):
        aggregate([0.5, 0.1], plan)
    with pytest.raises(PlanRejected):
        aggregate([0.5, 0.1, math.nan, 0.3, 0.7], plan)
    with pytest.raises(PlanRejected):
        aggregate([0.5, 0.1, -math.inf, 0.3, 0.7], plan)
    assert check_message(math.inf, plan) == math.inf


def test_check_message_on_grid() -> None:
    plan = plan_fedcp2_qq(5, 200, 0.1, 10.0, bins=100, smax=2.0)
    e = bin_grid(plan)
    assert e.size == 100 and e[0] == 0.0 and e[-1] == 2.0
    assert check_message(float(e[37]), plan) == e[37]
    assert check_message(repr(float(e[37])), plan) == e[37]  # text round trip
    assert check_message(float(e[37]) + 1e-13, plan) == e[37]
    for bad in (float(e[37]) + 1e-3, -0.5, 2.5, math.inf, math.nan, "abc"):
        with pytest.raises(PlanRejected):
            check_message(bad, plan)


def test_aggregate_top_bin_is_infinite() -> None:
    plan = plan_fedcp2_qq(5, 200, 0.1, 10.0, bins=100, smax=2.0)  # k_γ = 4
    e = bin_grid(plan)
    assert aggregate([e[3], e[10], e[99], e[99], e[99]], plan) == math.inf
    assert aggregate([e[3], e[10], e[20], e[30], e[99]], plan) == e[30]
    with pytest.raises(PlanRejected):
        aggregate([e[3], e[10], e[20], 0.123456, e[99]], plan)


def _exact_probs(scores: np.ndarray, plan: Fed2Plan) -> np.ndarray:
    """Algorithm 2's output law, computed independently: round up, weights, softmax."""
    e = np.linspace(0.0, plan.smax, plan.bins)
    idx = np.array([min(int(np.ceil(s / (plan.smax / (plan.bins - 1)) - 1e-12)), plan.bins - 1)
                    for s in np.clip(scores, 0, None)])  # fmt: skip
    sbar = e[idx]
    q = plan.q
    w = np.array([max(np.sum(sbar < eb) / q, np.sum(sbar > eb) / (1 - q)) for eb in e], dtype=float)
    delta = max(1 / q, 1 / (1 - q))
    logits = -plan.epsilon * w / (2 * delta)
    p = np.exp(logits - logits.max())
    return p / p.sum()


@pytest.mark.statistical
@pytest.mark.parametrize(("q", "eps", "dist"), [(0.7, 2.0, "uniform"), (0.9, 5.0, "wide")])
def test_agent_mechanism_distribution(q: float, eps: float, dist: str) -> None:
    plan = _plan2(n=50, q=q, eps=eps, bins=12, smax=1.0)
    r = np.random.default_rng(7)
    # "wide": 20% of the scores above S_max (clipped into the top bin) and some below 0
    scores = r.random(50) if dist == "uniform" else r.uniform(-0.1, 1.25, 50)
    p = _exact_probs(scores, plan)
    e = bin_grid(plan)
    rng = random.Random(123)
    draws = 6000
    out = np.array([fedcp2_qq_message(scores, plan, rng) for _ in range(draws)])
    idx = np.searchsorted(e, out)
    assert np.all(e[idx] == out)  # every message is a grid point
    counts = np.bincount(idx, minlength=e.size)
    # chi-square goodness of fit, cells with expected count < 5 pooled; under the null
    # P(p-value < 1e−6) = 1e−6, so this fails only if the law differs from Algorithm 2's
    expected = p * draws
    big = expected >= 5
    obs = np.r_[counts[big], counts[~big].sum()]
    exp = np.r_[expected[big], expected[~big].sum()]
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert counts[~big].sum() <= stats.poisson.isf(1e-6, max(expected[~big].sum(), 1e-9))
    assert stats.chisquare(obs, exp).pvalue > 1e-6


def test_agent_defaults_to_csprng(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_default() -> random.Random:
        calls.append(1)
        return random.Random(0)

    monkeypatch.setattr(fa, "default_rng", fake_default)
    plan = _plan2()
    fedcp2_qq_message(np.random.default_rng(0).random(50), plan)
    assert calls == [1]


def test_fedcp2_message_checks() -> None:
    plan = _plan2(n=50)
    with pytest.raises(InvalidInput, match="n = 50"):
        fedcp2_qq_message(np.zeros(49), plan, random.Random(0))
    with pytest.raises(InvalidInput):
        fedcp2_qq_message(np.zeros(50), plan_fedcp_qq(5, 50, 0.1), random.Random(0))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        fedcp_qq_message(np.zeros(50), plan)  # type: ignore[arg-type]
