"""Amplification by shuffling: reference values, orderings, monotonicity, numerics, validation."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from privcal.accountant.privacy import shuffle_bounds as sb
from privcal.accountant.privacy.shuffle import (
    BOUND_NONE,
    HEURISTIC_LABEL,
    AmplificationResult,
    amplified_cost,
    amplify,
)
from privcal.costs import ApproxDP
from privcal.errors import InvalidInput


def _eps(result: AmplificationResult, name: str) -> float | None:
    (row,) = [r for r in result.bounds if r.name == name]
    return row.eps


# SHUFFLE.md, "Reference values (δ = 1e−6)": ε0, n, heuristic, closed form, clone (any),
# stronger clone (binary RR), blanket (k-RR, k = 10). None: closed form not valid.
REFERENCE = [
    (1, 10**4, 0.0100, 0.233, 0.0530, 0.0432, 0.0233),
    (1, 10**6, 0.0010, 0.0238, 0.00433, 0.00351, 0.00185),
    (2, 10**5, 0.0063, 0.191, 0.0450, 0.0332, 0.0231),
    (4, 10**5, 0.0126, 0.538, 0.170, 0.118, 0.110),
    (4, 10**6, 0.0040, 0.202, 0.0493, 0.0343, 0.0319),
    (8, 10**6, 0.0080, 1.00, 0.444, 0.304, 0.303),
    (4, 10**3, 0.126, None, 3.99, 1.85, 1.53),
]


@pytest.mark.parametrize(("eps0", "n", "heur", "closed", "clone", "stronger", "blanket"),
                         REFERENCE)
def test_reference_table(eps0: float, n: int, heur: float, closed: float | None, clone: float,
                         stronger: float, blanket: float) -> None:
    # The table has 3 significant digits: agreement to 1% (0.5% rounding + slack).
    rel = 0.01
    generic = amplify(eps0, n, 1e-6, "generic")
    assert generic.heuristic_eps0_over_sqrt_n == pytest.approx(heur, rel=rel)
    assert generic.heuristic_label == HEURISTIC_LABEL
    if closed is None:
        assert _eps(generic, "closed-form") is None
    else:
        assert _eps(generic, "closed-form") == pytest.approx(closed, rel=rel)
    assert _eps(generic, "clone") == pytest.approx(clone, rel=rel)
    assert generic.bound == "clone" and generic.eps == _eps(generic, "clone")

    rr = amplify(eps0, n, 1e-6, "binary-rr")
    assert rr.bound == "stronger-clone"
    assert rr.eps == pytest.approx(stronger, rel=rel)

    krr = amplify(eps0, n, 1e-6, "krr", 10)
    assert krr.bound == "blanket"
    assert krr.eps == pytest.approx(blanket, rel=rel)
    for result in (generic, rr, krr):
        assert result.certified and result.delta_at_eps <= 1e-6


ORDER_GRID = [(0.5, 300, 1e-4, 3), (0.5, 50000, 1e-8, 20), (2.0, 5000, 1e-8, 3),
              (2.0, 300, 1e-4, 20), (5.0, 50000, 1e-4, 3), (5.0, 5000, 1e-8, 20),
              (1.0, 2000, 0.01, 4), (3.0, 100000, 1e-10, 50)]


@pytest.mark.parametrize(("eps0", "n", "delta", "k"), ORDER_GRID)
def test_bounds_are_ordered(eps0: float, n: int, delta: float, k: int) -> None:
    res = amplify(eps0, n, delta, "krr", k)
    closed, clone = _eps(res, "closed-form"), _eps(res, "clone")
    stronger, blanket = _eps(res, "stronger-clone"), _eps(res, "blanket")
    assert clone is not None and stronger is not None and blanket is not None
    assert blanket <= stronger <= clone <= eps0 * (1 + 1e-5)
    if closed is not None:
        assert clone <= closed
    # The chosen bound is the smallest certified one, never above ε0.
    assert res.eps == min(min(blanket, stronger, clone), eps0)
    for row in res.bounds:
        if row.eps is not None:
            assert row.certified and row.delta_at_eps is not None and row.delta_at_eps <= delta


def _chosen(eps0: float, n: int, delta: float, randomizer: str, k: int | None) -> float:
    return amplify(eps0, n, delta, randomizer, k).eps  # type: ignore[arg-type]


RANDOMIZER = st.sampled_from([("generic", None), ("binary-rr", None), ("krr", 3), ("krr", 6)])


@settings(max_examples=15, deadline=None, derandomize=True)
@given(eps0=st.floats(0.1, 6.0), n=st.integers(2, 5000), log_delta=st.floats(-10, -1.5),
       rk=RANDOMIZER)
def test_monotone_in_n_eps0_and_delta(eps0: float, n: int, log_delta: float,
                                      rk: tuple[str, int | None]) -> None:
    randomizer, k = rk
    delta = 10.0**log_delta
    base = _chosen(eps0, n, delta, randomizer, k)
    # Non-strict comparisons: when no bound amplifies, both sides are ε0 (or equal
    # after the 6-digit rounding up); otherwise the gaps are far above rounding.
    assert _chosen(eps0, 2 * n, delta, randomizer, k) <= base
    assert _chosen(eps0 * 1.25, n, delta, randomizer, k) >= base
    assert _chosen(eps0, n, delta * 3.0, randomizer, k) <= base


def test_monotone_on_a_grid_with_strict_decrease_in_n() -> None:
    for randomizer, k in [("generic", None), ("binary-rr", None), ("krr", 4)]:
        eps = [_chosen(2.0, n, 1e-6, randomizer, k) for n in (10**3, 10**4, 10**5)]
        assert eps[0] > eps[1] > eps[2]
        by_eps0 = [_chosen(e0, 10**4, 1e-6, randomizer, k) for e0 in (0.5, 1.0, 2.0, 4.0)]
        assert by_eps0 == sorted(by_eps0) and len(set(by_eps0)) == 4
        by_delta = [_chosen(2.0, 10**4, d, randomizer, k) for d in (1e-9, 1e-6, 1e-3)]
        assert by_delta[0] > by_delta[1] > by_delta[2]


def _pair_delta_brute(eps: float, n: int, pa: float, qa: float, r: float) -> float:
    """Pair(ε; n, pa, qa, r) from its definition: the full law of (a, b), no shortcut."""
    m = n - 1
    w = 1.0 - pa - qa
    big_e = math.exp(eps)
    p_law = np.zeros((n + 1, n + 1))
    q_law = np.zeros((n + 1, n + 1))
    for c in range(m + 1):
        a = np.arange(c + 1)
        b = c - a
        base = binom.pmf(c, m, 2 * r) * binom.pmf(a, c, 0.5)
        p_law[a + 1, b] += pa * base
        p_law[a, b + 1] += qa * base
        p_law[a, b] += w * base
        q_law[a + 1, b] += qa * base
        q_law[a, b + 1] += pa * base
        q_law[a, b] += w * base
    return float(np.maximum(0.0, p_law - big_e * q_law).sum())


@pytest.mark.parametrize(("n", "pa", "qa", "r"), [
    (1, 0.7, 0.3, 0.2),
    (9, 0.73, 0.27, 0.135),     # a clone pair (w = 0)
    (40, 0.5, 0.2, 0.25),       # a blanket-like pair (w > 0)
    (150, 0.6, 0.1, 1 / 3),
    (300, 0.45, 0.05, 0.05),
])
def test_pair_formula_matches_the_definition(n: int, pa: float, qa: float, r: float) -> None:
    # τ tiny: no C is dropped for these n, so the formula must equal the brute force.
    plan = sb.pair_plan(n, pa, qa, r, 1e-300)
    for eps in (0.0, 0.05, 0.3, math.log(pa / qa) * 0.7):
        allowance = sb.FLOAT_SLACK * (1 + math.exp(eps))  # the documented rounding allowance
        assert sb.pair_delta(eps, plan) - allowance == pytest.approx(
            _pair_delta_brute(eps, n, pa, qa, r), rel=1e-9, abs=1e-15)


def test_truncation_keeps_an_upper_bound() -> None:
    for eps in (0.02, 0.05, 0.1):
        full = sb.pair_delta(eps, sb.clone_plan(2.0, 20000, 1e-300, stronger=False))
        # A coarse window drops real mass; adding it back keeps δ above the full sum.
        coarse_plan = sb.clone_plan(2.0, 20000, 0.9, stronger=False)  # ±2.5σ
        assert coarse_plan.missing > 1e-3
        assert full <= sb.pair_delta(eps, coarse_plan)
        # With the spec's τ = 1e−4·δ the result is the full sum to well within 1e−4·δ.
        spec = sb.pair_delta(eps, sb.clone_plan(2.0, 20000, sb.truncation_tau(1e-6),
                                                 stronger=False))
        assert spec == pytest.approx(full, abs=1e-10)


def test_blanket_buckets_keep_an_upper_bound() -> None:
    tau = 1e-12
    exact = sb.blanket_plan(2.0, 3000, 5, tau, eta=0.0, tail_sigmas=math.inf)  # M one by one
    coarse = sb.blanket_plan(2.0, 3000, 5, tau, eta=0.05)
    assert exact.group_weight.shape[0] == np.unique(exact.n_pair).shape[0] > 100
    assert coarse.group_weight.shape[0] < exact.group_weight.shape[0] / 5
    for eps in (0.05, 0.1, 0.2, 0.4):
        d_exact, d_coarse = sb.pair_delta(eps, exact), sb.pair_delta(eps, coarse)
        assert d_exact <= d_coarse


def test_sf_half_recurrence_matches_scipy() -> None:
    rng = np.random.default_rng(7)
    c = np.arange(800_000, 803_000, dtype=np.int64)
    t = np.floor(0.5 * c + 900 + 0.37 * np.arange(c.shape[0])).astype(np.int64)  # Δt ∈ {0, 1}
    s, pmf = sb.sf_half(t, c)
    np.testing.assert_allclose(s, binom.sf(t, c, 0.5), rtol=0, atol=1e-13)
    np.testing.assert_allclose(pmf, binom.pmf(t, c, 0.5), rtol=1e-12, atol=0)
    # Several runs, steps down as well as up.
    c2 = np.concatenate([np.arange(100, 400), np.arange(5000, 5400)]).astype(np.int64)
    t2 = (c2 // 2 + rng.integers(-1, 2, size=c2.shape[0]).cumsum() // 3).astype(np.int64)
    starts = np.zeros(c2.shape[0], dtype=bool)
    starts[300] = True
    s2, _ = sb.sf_half(t2, c2, starts)
    np.testing.assert_allclose(s2, binom.sf(t2, c2, 0.5), rtol=0, atol=1e-13)


def test_closed_form_by_hand_and_validity_condition() -> None:
    # ε0 = 1, n = 10⁴, δ = 1e−6, SHUFFLE.md bound 1 written out.
    e, n, delta = math.e, 10**4, 1e-6
    a = 8 * math.sqrt(e * math.log(4 / delta) / n)
    c = 8 * e / n
    eps_hat = math.log(1 + a + c)
    want = math.log(1 + (1 - 1 / e) / (1 + math.exp(-1 - eps_hat)) * (a + c))
    assert sb.closed_form_eps(1.0, n, delta) == pytest.approx(want, rel=1e-14)
    limit = math.log(n / (16 * math.log(4 / delta)))
    assert sb.closed_form_eps(limit * 0.999, n, delta) is not None
    assert sb.closed_form_eps(limit * 1.001, n, delta) is None


def test_numpy_scalars_are_accepted() -> None:
    got = amplify(np.float64(2.0), np.int64(5000), np.float64(1e-6), "krr", np.int64(5))
    assert got == amplify(2.0, 5000, 1e-6, "krr", 5)


def test_krr_with_two_categories_is_binary_rr() -> None:
    krr = amplify(1.5, 5000, 1e-7, "krr", 2)
    rr = amplify(1.5, 5000, 1e-7, "binary-rr")
    assert [r.eps for r in krr.bounds] == [r.eps for r in rr.bounds]
    assert krr.eps == rr.eps and krr.bound == "stronger-clone"
    (blanket,) = [r for r in krr.bounds if r.name == "blanket"]
    assert blanket.eps is None and "k ≥ 3" in (blanket.reason or "")


def test_no_amplification_returns_eps0() -> None:
    huge = amplify(60.0, 10**6, 1e-6, "generic")
    assert huge.bound == BOUND_NONE and huge.eps == 60.0 and not huge.amplified
    assert all(r.eps is None and r.reason for r in huge.bounds)
    # Two users, tiny δ: the clone bounds give (almost) nothing; reported as ε0.
    tiny = amplify(3.0, 2, 1e-9, "binary-rr")
    assert tiny.eps <= 3.0
    if not tiny.amplified:
        assert tiny.bound == BOUND_NONE and tiny.eps == 3.0
    cost, res = amplified_cost(60.0, 100, 1e-6, "generic")
    assert cost is None and res.bound == BOUND_NONE


def test_amplified_cost_is_the_certified_bound_as_exact_decimals() -> None:
    cost, result = amplified_cost(2.0, 10**5, 1e-6, "krr", k=10)
    assert isinstance(cost, ApproxDP)
    assert cost.eps == Decimal(repr(result.eps)) and cost.delta == Decimal("0.000001")
    # Rounded up to 6 significant digits, and δ re-checked at that value.
    assert len(cost.eps.normalize().as_tuple().digits) <= 6
    plan = sb.blanket_plan(2.0, 10**5, 10, sb.truncation_tau(1e-6))
    assert sb.pair_delta(float(cost.eps), plan) <= 1e-6


@pytest.mark.parametrize(("args", "message"), [
    ((0.0, 100, 1e-6, "generic", None), "ε0"),
    ((-1.0, 100, 1e-6, "generic", None), "ε0"),
    ((math.nan, 100, 1e-6, "generic", None), "ε0"),
    ((1.0, 0, 1e-6, "generic", None), "n"),
    ((1.0, 10.5, 1e-6, "generic", None), "n"),
    ((1.0, True, 1e-6, "generic", None), "n"),
    ((1.0, 10**19, 1e-6, "generic", None), "n"),
    (("1", 100, 1e-6, "generic", None), "ε0"),
    ((1.0, 100, 0.0, "generic", None), "δ"),
    ((1.0, 100, 1.0, "generic", None), "δ"),
    ((1.0, 100, 1e-6, "laplace", None), "randomizer"),
    ((1.0, 100, 1e-6, "krr", None), "k"),
    ((1.0, 100, 1e-6, "krr", 1), "k"),
    ((1.0, 100, 1e-6, "binary-rr", 3), "k"),
    ((1.0, 100, 1e-6, "generic", 5), "k"),
])
def test_bad_input_is_refused(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        amplify(*args)  # type: ignore[arg-type]
