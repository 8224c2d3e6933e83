"""Central DP mechanisms: exact discrete samplers (CKS20) and the exponential-mechanism quantile.

Distribution tests draw many seeded samples and compare with the exact pmf by a
chi-square goodness-of-fit test at significance 1e-4 (cells pooled so every expected
count is ≥ 5). Under a correct sampler each such test fails with probability 1e-4;
the seeds are fixed, so the outcome is reproducible.
"""

from __future__ import annotations

import math
import random
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from privcal.calibrators.mechanisms.discrete_gaussian import (
    bernoulli_exp,
    discrete_gaussian,
    discrete_gaussian_pmf,
    discrete_laplace,
    to_fraction,
)
from privcal.calibrators.mechanisms.exponential import (
    exponential_quantile,
    grid,
    grid_counts,
    round_up_to_grid,
    selection_probabilities,
)
from privcal.errors import InvalidInput

SIGNIFICANCE = 1e-4


def _chi2_pvalue(samples: np.ndarray, support: np.ndarray, pmf: np.ndarray) -> float:
    """Chi-square p-value of integer samples against pmf on ``support`` (rest pooled)."""
    n = samples.size
    counts = np.array([(samples == z).sum() for z in support], dtype=float)
    expected = n * pmf
    keep = expected >= 5
    obs = list(counts[keep])
    exp = list(expected[keep])
    rest_obs = n - sum(obs)
    rest_exp = n - sum(exp)
    if rest_exp >= 5:
        obs.append(rest_obs)
        exp.append(rest_exp)
    else:
        assert rest_obs <= 5 + 10 * rest_exp, "mass outside the tested cells"
    return float(stats.chisquare(obs, np.array(exp) * (sum(obs) / sum(exp))).pvalue)


@pytest.mark.parametrize(
    ("gamma", "seed"), [(0, 1), (Fraction(1, 2), 2), (1, 3), (Fraction(27, 10), 4), ("7/3", 5)]
)
def test_bernoulli_exp_frequency(gamma, seed):
    rng = random.Random(seed)
    n = 40_000
    hits = sum(bernoulli_exp(gamma, rng) for _ in range(n))
    p = math.exp(-float(Fraction(gamma)))
    # two-sided binomial acceptance region at level 1e-4
    lo, hi = stats.binom.ppf(SIGNIFICANCE / 2, n, p), stats.binom.isf(SIGNIFICANCE / 2, n, p)
    assert lo <= hits <= hi, (hits, n * p)


@pytest.mark.parametrize(
    ("sigma2", "seed"),
    [(Fraction(1, 3), 11), (Fraction(5, 2), 12), (Fraction(34) / (2 * Fraction("0.1")), 13)],
)
def test_discrete_gaussian_matches_exact_pmf(sigma2, seed):
    rng = random.Random(seed)
    n = 30_000
    x = np.array([discrete_gaussian(sigma2, rng) for _ in range(n)])
    r = math.ceil(8 * math.sqrt(float(sigma2))) + 1
    support = np.arange(-r, r + 1)
    pmf = np.array(discrete_gaussian_pmf(sigma2, range(-r, r + 1)))
    assert _chi2_pvalue(x, support, pmf) > SIGNIFICANCE
    # mean 0 and the exact variance Σ z² p(z) (slightly below σ² for small σ)
    var = float((support**2 * pmf).sum())
    assert var <= float(sigma2)
    m4 = float((support**4 * pmf).sum())
    z = stats.norm.isf(SIGNIFICANCE / 2)
    assert abs(x.mean()) <= z * math.sqrt(var / n)
    assert abs((x**2).mean() - var) <= z * math.sqrt((m4 - var**2) / n)


def test_discrete_gaussian_is_symmetric_and_integer():
    rng = random.Random(7)
    x = [discrete_gaussian(Decimal("2.0"), rng) for _ in range(2000)]
    assert all(isinstance(v, int) for v in x)
    assert min(x) < 0 < max(x)


def test_discrete_laplace_matches_exact_pmf():
    scale = Fraction(5, 2)
    rng = random.Random(21)
    n = 30_000
    x = np.array([discrete_laplace(scale, rng) for _ in range(n)])
    support = np.arange(-40, 41)
    t = float(scale)
    w = np.exp(-np.abs(support) / t)
    norm = (1 - math.exp(-1 / t)) / (1 + math.exp(-1 / t))  # 1 / Σ_z exp(−|z|/t)
    pmf = w * norm
    assert _chi2_pvalue(x, support, pmf) > SIGNIFICANCE


def test_discrete_laplace_integer_scale_one():
    rng = random.Random(22)
    n = 30_000
    x = np.array([discrete_laplace(1, rng) for _ in range(n)])
    support = np.arange(-15, 16)
    pmf = np.exp(-np.abs(support)) * (1 - math.exp(-1)) / (1 + math.exp(-1))
    assert _chi2_pvalue(x, support, pmf) > SIGNIFICANCE


def test_pmf_sums_to_one():
    for s2 in (Fraction(1, 10), 1, 170, 3400):
        r = math.ceil(40 * math.sqrt(float(s2))) + 1
        assert math.fsum(discrete_gaussian_pmf(s2, range(-r, r + 1))) == pytest.approx(1, abs=1e-12)


def test_rational_inputs():
    assert to_fraction(0.1) == Fraction(1, 10)
    assert to_fraction(Decimal("0.25")) == Fraction(1, 4)
    assert to_fraction("170") == 170
    for bad in (math.nan, math.inf, "x", True, Decimal("NaN")):
        with pytest.raises(InvalidInput):
            to_fraction(bad)
    with pytest.raises(InvalidInput, match="σ²"):
        discrete_gaussian(0, random.Random(0))
    with pytest.raises(InvalidInput, match="scale"):
        discrete_laplace(-1, random.Random(0))
    with pytest.raises(InvalidInput, match="γ"):
        bernoulli_exp(-1, random.Random(0))


# --- exponential mechanism -------------------------------------------------------------


def test_grid_endpoints_and_errors():
    e = grid(0.1, 0.7, 7)
    assert e[0] == 0.1 and e[-1] == 0.7 and e.size == 7
    np.testing.assert_allclose(np.diff(e), 0.1)
    for args in ((1, 0, 5), (0, 1, 1), (0, math.inf, 5), (0, 1, 2.5)):
        with pytest.raises(InvalidInput):
            grid(*args)


@pytest.mark.parametrize(("a", "b", "m"), [(0, 1, 11), (0, 1, 1000), (-0.3, 2.7, 7), (0, 1, 3)])
def test_round_up_matches_binary_search(a, b, m):
    e = grid(a, b, m)
    g = np.random.default_rng(m)
    s = np.concatenate(
        [
            g.uniform(a - 1, b + 1, 5000),
            e,  # exactly on grid points: stay there
            np.nextafter(e, np.inf),  # just above: next point up (top: clipped)
            np.nextafter(e, -np.inf),  # just below: this point
        ]
    )
    want = np.minimum(np.searchsorted(e, s, side="left"), m - 1)
    got = round_up_to_grid(s, e)
    np.testing.assert_array_equal(got, want)
    # rounding up: the grid value is ≥ the score unless the score is above the top
    assert ((e[got] >= s) | (s > b)).all()
    np.testing.assert_array_equal(grid_counts(s, e), np.bincount(want, minlength=m))


def test_round_up_non_uniform_grid():
    e = np.array([0.0, 0.1, 0.5, 0.55, 1.0])
    s = np.array([-1, 0.0, 0.05, 0.1, 0.3, 0.52, 0.9, 1.0, 3.0])
    np.testing.assert_array_equal(round_up_to_grid(s, e), [0, 0, 1, 1, 2, 3, 4, 4, 4])
    with pytest.raises(InvalidInput, match="increasing"):
        round_up_to_grid(s, np.array([0.0, 0.5, 0.5]))


def _naive_probs(scores, e, q, eps):
    """SPEC §5 straight from the definition, with exact-ish float sums."""
    sbar = np.array([e[min(np.searchsorted(e, x), len(e) - 1)] for x in scores])
    delta = max(1 / q, 1 / (1 - q))
    w = [max((sbar < ej).sum() / q, (sbar > ej).sum() / (1 - q)) for ej in e]
    lw = [-eps * wj / (2 * delta) for wj in w]
    mx = max(lw)
    p = np.array([math.exp(v - mx) for v in lw])
    return p / p.sum()


def test_selection_probabilities_match_definition():
    g = np.random.default_rng(0)
    for q, eps in [(0.9, 1.0), (0.3, 0.2), (0.95, 5.0)]:
        s = g.beta(2, 5, 40)
        e = grid(0, 1, 21)
        np.testing.assert_allclose(
            selection_probabilities(s, e, q, eps), _naive_probs(s, e, q, eps), rtol=1e-12
        )


def test_exponential_quantile_sampling_distribution():
    g = np.random.default_rng(1)
    s = g.uniform(0, 1, 30)
    e = grid(0, 1, 9)
    q, eps = 0.8, 2.0
    p = selection_probabilities(s, e, q, eps)
    rng = random.Random(31)
    n = 5_000
    idx = np.array([exponential_quantile(s, e, q, eps, rng)[0] for _ in range(n)])
    assert _chi2_pvalue(idx, np.arange(e.size), p) > SIGNIFICANCE
    j, v = exponential_quantile(s, e, q, eps, random.Random(0))
    assert v == e[j]


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    q=st.floats(0.05, 0.95),
    eps=st.floats(0.05, 10),
)
def test_exponential_mechanism_is_eps_dp_for_add_remove(n, seed, q, eps):
    """Adding one score changes every selection probability by a factor ≤ e^ε."""
    g = np.random.default_rng(seed)
    s = g.uniform(-0.2, 1.2, n)
    extra = g.uniform(-0.2, 1.2)
    e = grid(0, 1, 15)
    p0 = selection_probabilities(s, e, q, eps)
    p1 = selection_probabilities(np.append(s, extra), e, q, eps)
    ratio = np.max(np.abs(np.log(p0) - np.log(p1)))
    assert ratio <= eps * (1 + 1e-9)


def test_exponential_quantile_concentrates_near_the_quantile():
    s = np.random.default_rng(2).uniform(0, 1, 20_000)
    e = grid(0, 1, 201)
    vals = [exponential_quantile(s, e, 0.9, 1.0, random.Random(i))[1] for i in range(30)]
    # rank error of the mechanism is O(log(m)/ε) ≪ n: within a few bins of 0.9
    assert max(abs(v - 0.9) for v in vals) <= 0.02


@pytest.mark.parametrize(
    ("q", "eps", "fragment"),
    [(0, 1, "q must be"), (1, 1, "q must be"), (0.5, 0, "ε"), (0.5, math.inf, "ε")],
)
def test_exponential_quantile_errors(q, eps, fragment):
    with pytest.raises(InvalidInput, match=fragment):
        exponential_quantile(np.zeros(3), grid(0, 1, 5), q, eps, random.Random(0))
    with pytest.raises(InvalidInput, match="NaN"):
        exponential_quantile(np.array([0.1, np.nan]), grid(0, 1, 5), 0.5, 1.0, random.Random(0))
