"""Planning math of FedCP-QQ / FedCP²-QQ (SPEC §9–10; Humbert et al. 2023, seed 002).

The quadrature is checked against exact rational values (polynomial
integration in fractions), the closed forms of SPEC §9, higher-order
quadrature, and brute-force searches over every (ℓ, k) and every γ.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from math import comb

import numpy as np
import pytest

from privcal.calibrators.base import conformal_rank
from privcal.calibrators.fedplan import (
    GAMMA_GRID,
    coverage_M,
    coverage_M_array,
    coverage_M_max,
    coverage_M_unequal,
    l_correction,
    plan_fedcp2_qq,
    plan_fedcp_qq,
    plan_fedcp_qq_unequal,
    replan_fedcp2_qq_subset,
    replan_fedcp_qq_subset,
)
from privcal.errors import InfeasiblePlan, InvalidInput

# ----------------------------------------------------------------- exact rational reference
# Polynomials in t as lists of Fractions (index = power); M = ∫₀¹ P(W(t) ≤ k−1) dt exactly.


def _pmul(a: list[Fraction], b: list[Fraction]) -> list[Fraction]:
    out = [Fraction(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        if x:
            for j, y in enumerate(b):
                out[i + j] += x * y
    return out


def _padd(a: list[Fraction], b: list[Fraction]) -> list[Fraction]:
    n = max(len(a), len(b))
    return [
        (a[i] if i < len(a) else Fraction(0)) + (b[i] if i < len(b) else Fraction(0))
        for i in range(n)
    ]


def _ppow(a: list[Fraction], e: int) -> list[Fraction]:
    out = [Fraction(1)]
    for _ in range(e):
        out = _pmul(out, a)
    return out


def _message_cdf_poly(ell: int, n: int) -> list[Fraction]:
    """P(ℓ-th smallest of n uniforms ≤ t) = Σ_{i≥ℓ} C(n,i) t^i (1−t)^{n−i}; 0 if ℓ > n."""
    t, one_minus_t = [Fraction(0), Fraction(1)], [Fraction(1), Fraction(-1)]
    out = [Fraction(0)]
    for i in range(ell, n + 1):
        out = _padd(out, [c * comb(n, i) for c in _pmul(_ppow(t, i), _ppow(one_minus_t, n - i))])
    return out


def _exact_M(ells: list[int], sizes: list[int], k: int) -> Fraction:
    """∫₀¹ P(Σ_j Bernoulli(p_j(t)) ≤ k−1) dt, all in exact rational arithmetic."""
    ps = [_message_cdf_poly(e, n) for e, n in zip(ells, sizes, strict=True)]
    pmf: list[list[Fraction]] = [[Fraction(1)]]
    for p in ps:
        q = _padd([Fraction(1)], [-c for c in p])
        new = [_pmul(pmf[0], q)]
        for i in range(1, len(pmf)):
            new.append(_padd(_pmul(pmf[i], q), _pmul(pmf[i - 1], p)))
        new.append(_pmul(pmf[-1], p))
        pmf = new
    cdf = [Fraction(0)]
    for i in range(k):
        cdf = _padd(cdf, pmf[i])
    return sum((c / (i + 1) for i, c in enumerate(cdf)), Fraction(0))


# ----------------------------------------------------------------- references (SPEC §9, §10)


@pytest.mark.parametrize(
    ("m", "n", "ell", "k", "M"),
    [
        (5, 10, 10, 3, 0.9256259546),
        (50, 20, 18, 35, 0.9017359165),
        (100, 1000, 901, 49, 0.9000065421),
    ],
)
def test_spec_reference_plans(m: int, n: int, ell: int, k: int, M: float) -> None:
    plan = plan_fedcp_qq(m, n, 0.1)
    assert (plan.l, plan.k) == (ell, k)
    # the references are rounded to 10 digits: |error| ≤ 5e−11 + quadrature error
    assert abs(plan.M - M) <= 1e-9
    assert plan.M >= 0.9


def test_spec_reference_fedcp2() -> None:
    plan = plan_fedcp2_qq(5, 200, 0.1, 10.0, bins=100)
    assert plan.gamma == 0.02
    assert (plan.l_gamma, plan.k_gamma, plan.l_cor) == (179, 4, 3)
    assert abs(plan.M - 0.9162) <= 5e-5  # SPEC gives 4 digits
    assert plan.q == pytest.approx(182 / 200, abs=1e-15)


def test_exact_rational_values_small_grid() -> None:
    m, n = 4, 6
    ells, ks = np.meshgrid(np.arange(1, n + 1), np.arange(1, m + 1), indexing="ij")
    got = coverage_M_array(ells, ks, m, n)
    for i in range(n):
        for j in range(m):
            exact = _exact_M([i + 1] * m, [n] * m, j + 1)
            assert abs(got[i, j] - float(exact)) < 1e-13, (i + 1, j + 1)


def test_reference_plan_exact_value() -> None:
    exact = _exact_M([10] * 5, [10] * 5, 3)
    assert abs(coverage_M(10, 3, 5, 10) - float(exact)) < 1e-13
    assert abs(float(exact) - 0.9256259546) < 5e-11


# ----------------------------------------------------------------- identities (SPEC §9)


@pytest.mark.parametrize("n", [1, 2, 7, 50, 999, 20000])
def test_one_agent_is_split_conformal(n: int) -> None:
    for ell in sorted({1, min(2, n), n // 3 + 1, n // 2 + 1, n}):
        assert abs(coverage_M(ell, 1, 1, n) - ell / (n + 1)) < 1e-13


@pytest.mark.parametrize("m", [1, 2, 9, 100, 3000])
def test_one_score_per_agent(m: int) -> None:
    for k in sorted({1, min(2, m), m // 2 + 1, m}):
        assert abs(coverage_M(1, k, m, 1) - k / (m + 1)) < 1e-13


@pytest.mark.parametrize(("m", "n"), [(1, 1), (5, 10), (50, 20), (100, 1000), (1000, 10000)])
def test_maxima_gamma_formula(m: int, n: int) -> None:
    ks = np.unique(np.linspace(1, m, 7).astype(int))
    # Γ(k+1/n)Γ(m+1)/(Γ(k)Γ(m+1/n+1)) = 1/Π_{j=k}^{m}(1 + 1/(nj)); fsum keeps it exact to 1 ulp
    gamma_form = np.array(
        [math.exp(-math.fsum(math.log1p(1 / (n * j)) for j in range(k, m + 1))) for k in ks]
    )
    if m * n <= 1000:  # where lgamma differences are still accurate, check the Gamma form itself
        direct = [
            math.exp(
                math.lgamma(k + 1 / n)
                + math.lgamma(m + 1)
                - math.lgamma(k)
                - math.lgamma(m + 1 / n + 1)
            )
            for k in ks
        ]
        np.testing.assert_allclose(direct, gamma_form, rtol=1e-13)
    np.testing.assert_allclose(coverage_M_array(n, ks, m, n), gamma_form, rtol=0, atol=1e-14)
    np.testing.assert_allclose(coverage_M_max(ks, m, n), gamma_form, rtol=0, atol=1e-14)


def test_large_m_matches_higher_order_quadrature() -> None:
    # the regime where the window of SPEC §9 (one message's quantiles) loses 1e−6
    m, n = 1000, 10000
    ells = np.array([8900, 8985, 9000, 9100])
    ks = np.array([300, 699, 500, 900])
    a = coverage_M_array(ells, ks, m, n)
    b = coverage_M_array(ells, ks, m, n, nodes=1024)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)


def test_monotone_in_l_and_k() -> None:
    m, n = 20, 30
    ells, ks = np.meshgrid(np.arange(1, n + 1), np.arange(1, m + 1), indexing="ij")
    M = coverage_M_array(ells, ks, m, n)
    assert np.all(np.diff(M, axis=0) > 0)
    assert np.all(np.diff(M, axis=1) > 0)
    assert np.all((M > 0) & (M < 1))


# ----------------------------------------------------------------- selection


@pytest.mark.parametrize(("m", "n"), [(3, 4), (5, 10), (8, 12), (12, 5), (20, 30)])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2, 0.33])
def test_plan_is_brute_force_argmin(m: int, n: int, alpha: float) -> None:
    ells, ks = np.meshgrid(np.arange(1, n + 1), np.arange(1, m + 1), indexing="ij")
    M = coverage_M_array(ells, ks, m, n)
    ok = M >= 1 - alpha - 1e-12
    if not ok.any():
        with pytest.raises(InfeasiblePlan):
            plan_fedcp_qq(m, n, alpha)
        return
    best = M[ok].min()
    plan = plan_fedcp_qq(m, n, alpha)
    assert plan.M >= 1 - alpha - 1e-12
    assert abs(plan.M - best) < 1e-14
    assert abs(M[plan.l - 1, plan.k - 1] - plan.M) < 1e-15


@pytest.mark.parametrize("alpha", [0.1, 0.05, 0.2, 0.3, 0.01])
def test_one_agent_plan_is_conformal_rank(alpha: float) -> None:
    for n in (1, 4, 9, 19, 99, 100, 1000):
        if conformal_rank(n, alpha) > n:
            with pytest.raises(InfeasiblePlan):
                plan_fedcp_qq(1, n, alpha)
        else:
            plan = plan_fedcp_qq(1, n, alpha)
            assert (plan.l, plan.k) == (conformal_rank(n, alpha), 1)


@pytest.mark.parametrize("alpha", [0.1, 0.2, 0.05])
def test_one_score_plan_is_conformal_rank(alpha: float) -> None:
    for m in (9, 10, 19, 39, 100):
        r = conformal_rank(m, alpha)
        if r > m:
            with pytest.raises(InfeasiblePlan):
                plan_fedcp_qq(m, 1, alpha)
        else:
            assert (plan_fedcp_qq(m, 1, alpha).l, plan_fedcp_qq(m, 1, alpha).k) == (1, r)


def test_infeasible_and_boundary() -> None:
    with pytest.raises(InfeasiblePlan, match="m·n ≥ 9"):
        plan_fedcp_qq(2, 2, 0.1)
    plan = plan_fedcp_qq(3, 3, 0.1)  # M_{n,m} = 9/10 exactly
    assert (plan.l, plan.k) == (3, 3)
    assert abs(plan.M - 0.9) < 1e-13


@pytest.mark.parametrize(
    "args",
    [(0, 10, 0.1), (5, 0, 0.1), (5, 10, 0.0), (5, 10, 1.0), (5, 10, math.nan), (5.5, 10, 0.1)],
)
def test_bad_input(args: tuple) -> None:
    with pytest.raises(InvalidInput):
        plan_fedcp_qq(*args)


def test_coverage_M_bad_orders() -> None:
    with pytest.raises(InvalidInput, match="ℓ"):
        coverage_M(11, 1, 5, 10)
    with pytest.raises(InvalidInput, match="k"):
        coverage_M(3, 6, 5, 10)


# ----------------------------------------------------------------- unequal sizes


@pytest.mark.parametrize(("m", "n"), [(5, 10), (20, 50), (7, 30)])
def test_unequal_reduces_to_equal(m: int, n: int) -> None:
    ell = conformal_rank(n, 0.1)
    ks = np.arange(1, m + 1)
    from privcal.calibrators.fedplan.unequal import _unequal_M

    got = _unequal_M(np.full(m, ell), np.full(m, n), ks)
    np.testing.assert_allclose(got, coverage_M_array(ell, ks, m, n), rtol=0, atol=1e-12)
    plan = plan_fedcp_qq_unequal([n] * m, 0.1)
    eq = coverage_M_array(ell, ks, m, n)
    assert plan.k == int(ks[eq >= 0.9 - 1e-12][0])


def test_unequal_reduces_to_optimal_plan_when_rule_coincides() -> None:
    # (5, 10): optimal ℓ* = 10 = ⌈0.9·11⌉, so both searches must give the same (k, M)
    eq = plan_fedcp_qq(5, 10, 0.1)
    un = plan_fedcp_qq_unequal([10] * 5, 0.1)
    assert un.ls == (eq.l,) * 5 and un.k == eq.k
    assert abs(un.M - eq.M) < 1e-12


@pytest.mark.parametrize(
    ("ells", "sizes"),
    [
        ([1, 2, 3], [1, 3, 4]),
        ([2, 4, 1, 3], [2, 5, 2, 3]),
        ([3, 2], [2, 2]),
        ([6, 6, 1], [6, 5, 1]),
    ],
)
def test_unequal_exact(ells: list[int], sizes: list[int]) -> None:
    for k in range(1, len(sizes) + 1):
        exact = _exact_M(ells, sizes, k)
        assert abs(coverage_M_unequal(ells, sizes, k) - float(exact)) < 1e-13, k


def test_unequal_plan_search() -> None:
    sizes = [3, 7, 12, 20, 25, 40, 100]
    plan = plan_fedcp_qq_unequal(sizes, 0.1)
    assert plan.ls == tuple(conformal_rank(s, 0.1) for s in sizes)
    M = [coverage_M_unequal(plan.ls, sizes, k) for k in range(1, len(sizes) + 1)]
    # agents of sizes 3 and 7 have ℓ_j = n_j + 1 and send +inf: for k ≥ 6 the aggregate is +inf
    assert plan.ls[:2] == (4, 8)
    assert M[5:] == [1.0, 1.0]
    assert all(b > a for a, b in itertools.pairwise(M[:6]))
    assert plan.k == next(k for k, v in enumerate(M, 1) if v >= 0.9)
    assert plan.M == pytest.approx(M[plan.k - 1], abs=1e-15)
    assert plan.local_order(12) == 12 and plan.local_order(3) == 4
    with pytest.raises(InvalidInput):
        plan.local_order(13)


def test_unequal_all_agents_too_small_is_trivial() -> None:
    # ℓ_j = ⌈0.9(n_j+1)⌉ > n_j for both: every message is +inf, the plan's threshold is +inf
    # (the split-conformal convention, SPEC §2), coverage 1; never infeasible.
    plan = plan_fedcp_qq_unequal([2, 3], 0.1)
    assert plan.ls == (3, 4) and plan.k == 1 and plan.M == 1.0


def test_unequal_bad_input() -> None:
    with pytest.raises(InvalidInput):
        plan_fedcp_qq_unequal([], 0.1)
    with pytest.raises(InvalidInput):
        plan_fedcp_qq_unequal([3, 0], 0.1)


# ----------------------------------------------------------------- FedCP²-QQ


def test_l_correction_formula() -> None:
    # ℓ_cor = ⌈(2/ε) ln(B / (1 − (1−γα)^{1/m}))⌉, eq. (10)
    for gamma, alpha, m, eps, b in [(0.02, 0.1, 5, 10, 100), (0.5, 0.05, 50, 1, 30)]:
        delta = 1 - (1 - gamma * alpha) ** (1 / m)
        assert l_correction(gamma, alpha, m, eps, b) == math.ceil(2 / eps * math.log(b / delta))


@pytest.mark.parametrize(
    ("m", "n", "eps"), [(5, 200, 10.0), (10, 100, 5.0), (4, 300, 1.0), (10, 500, 2.0)]
)
def test_fedcp2_is_grid_argmin(m: int, n: int, eps: float) -> None:
    alpha, bins = 0.1, 100
    best = None
    for gamma in GAMMA_GRID:
        alpha_g = 1 - (1 - alpha) / (1 - gamma * alpha)
        try:
            base = plan_fedcp_qq(m, n, alpha_g)
        except InfeasiblePlan:
            continue
        l_cor = l_correction(gamma, alpha, m, eps, bins)
        if base.l + l_cor >= n:
            continue
        crit = coverage_M(base.l + l_cor, base.k, m, n)
        if best is None or crit < best[0] - 1e-13:
            best = (crit, gamma, base.l, base.k, l_cor)
    plan = plan_fedcp2_qq(m, n, alpha, eps, bins=bins)
    assert best is not None
    assert (plan.gamma, plan.l_gamma, plan.k_gamma, plan.l_cor) == best[1:]
    assert abs(plan.M - best[0]) < 1e-13
    assert plan.q == max((plan.l_gamma + plan.l_cor) / n, 0.5)
    assert plan.q < 1
    assert plan.M_gamma >= (1 - alpha) / (1 - plan.gamma * alpha) - 1e-12
    assert plan.proof_bound >= 1 - alpha - 1e-12


def test_fedcp2_infeasible_small_eps() -> None:
    with pytest.raises(InfeasiblePlan, match="too small for n"):
        plan_fedcp2_qq(5, 10, 0.1, 1.0)


@pytest.mark.parametrize(
    "kw",
    [
        {"eps": 0.0},
        {"eps": -1.0},
        {"eps": math.inf},
        {"bins": 1},
        {"smax": 0.0},
        {"smax": math.nan},
    ],
)
def test_fedcp2_bad_input(kw: dict) -> None:
    args = {"m": 5, "n": 200, "alpha": 0.1, "eps": 10.0} | kw
    with pytest.raises(InvalidInput):
        plan_fedcp2_qq(**args)


# ----------------------------------------------------------------- missing agents


def test_replan_fedcp_qq_subset() -> None:
    plan = plan_fedcp_qq(50, 20, 0.1)
    assert replan_fedcp_qq_subset(plan, 50) == plan  # k* is the smallest k for ℓ*
    sub = replan_fedcp_qq_subset(plan, 40)
    ks = np.arange(1, 41)
    M = coverage_M_array(plan.l, ks, 40, 20)
    assert sub.l == plan.l and sub.m == 40
    assert sub.k == int(ks[M >= 0.9 - 1e-12][0]) and sub.M == pytest.approx(M[sub.k - 1], abs=0)
    with pytest.raises(InfeasiblePlan):
        # a single agent's 18th smallest of 20 covers 18/21 < 0.9
        replan_fedcp_qq_subset(plan, 1)
    with pytest.raises(InvalidInput):
        replan_fedcp_qq_subset(plan, 51)


def test_replan_fedcp2_qq_subset() -> None:
    plan = plan_fedcp2_qq(5, 200, 0.1, 10.0)
    assert replan_fedcp2_qq_subset(plan, 5) == plan
    sub = replan_fedcp2_qq_subset(plan, 4)
    assert sub.m == 4 and sub.q == plan.q
    # the condition the proof of Thm 4.1 needs from answers given at level q
    assert sub.l_gamma + sub.l_cor <= round(sub.n * sub.q)
    assert sub.l_cor == l_correction(sub.gamma, 0.1, 4, 10.0, 100)
    assert sub.M_gamma >= 0.9 / (1 - sub.gamma * 0.1) - 1e-12
    assert abs(sub.M_gamma - coverage_M(sub.l_gamma, sub.k_gamma, 4, 200)) < 1e-15
    with pytest.raises(InfeasiblePlan, match="cannot be recomputed"):
        replan_fedcp2_qq_subset(plan_fedcp2_qq(100, 1000, 0.1, 5.0), 90)
