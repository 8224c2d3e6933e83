"""ExponQ (SPEC §5; Angelopoulos et al. 2022 as summarised in seed 003).

Statistical tests run seeded trials on scores with a known law, so the true coverage
of t is F(t) exactly. Checked:

- per trial, the event the proof rests on: with probability ≥ 1 − γα over the
  mechanism, the released grid point has #{s ≤ t} ≥ (n+1)(1−α)/(1−γα) (the
  exponential mechanism's utility bound at level q̃). Violations are asserted to be at
  most the 1 − 1e-4 quantile of Binomial(trials, γα).
- the recorded guarantee, marginal coverage E[F(t)] ≥ 1−α, within z·SE, z = Φ⁻¹(1 − 1e-4),
  SE the sample standard deviation of F(t) over √trials.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats

from privcal.calibrators.base import CalibrationInput, DataShape
from privcal.calibrators.exponq import (
    ExponQ,
    ExponQParams,
    default_bins,
    inflated_level,
    optimal_gamma,
)
from privcal.costs import PureDP

Z = stats.norm.isf(1e-4)
CAL = ExponQ()


@pytest.mark.parametrize(
    ("alpha", "eps", "n"), [(0.1, 1.0, 10_000), (0.05, 0.1, 2000), (0.2, 10.0, 500), (0.1, 3, 50)]
)
def test_gamma_is_the_minimising_root_in_unit_interval(alpha, eps, n):
    gamma = optimal_gamma(alpha, eps, n)
    assert 0 < gamma < 1
    b = alpha * eps * (n + 1) * (1 - alpha) / 2 + 2 * alpha
    assert alpha**2 * gamma**2 - b * gamma + 1 == pytest.approx(0, abs=1e-9)
    m = default_bins(eps, n)
    best = inflated_level(alpha, eps, n, m, gamma)
    grid_g = np.linspace(1e-4, 1 - 1e-4, 20_001)
    others = [inflated_level(alpha, eps, n, m, g) for g in grid_g]
    assert best <= min(others) + 1e-12


def test_gamma_at_least_one_means_trivial_set():
    # ε·n tiny: the smaller root is ≥ 1, and q̃ > 1 for every γ in (0, 1)
    alpha, eps, n = 0.1, 0.01, 20
    gamma = optimal_gamma(alpha, eps, n)
    assert gamma >= 1
    assert all(inflated_level(alpha, eps, n, 100, g) > 1 for g in np.linspace(0.001, 0.999, 999))
    res = CAL.calibrate(
        CalibrationInput(scores=np.linspace(0, 1, n)),
        ExponQParams(alpha=alpha, epsilon=eps),
        random.Random(0),
    )
    assert res.threshold == math.inf


def test_q_tilde_at_least_one_returns_inf_without_randomness():
    class NoRandomness(random.Random):
        def random(self):  # pragma: no cover - must not be called
            raise AssertionError("mechanism ran although q̃ ≥ 1")

    params = ExponQParams(alpha=0.1, epsilon=1.0)
    _, gamma, q = CAL.plan(params, 100)
    assert gamma < 1 and q >= 1
    res = CAL.calibrate(
        CalibrationInput(scores=np.random.default_rng(0).uniform(size=100)), params, NoRandomness()
    )
    assert res.threshold == math.inf
    g = CAL.guarantee(params, DataShape(n=100))
    assert g.lower == 1.0 and "+inf" in g.statement


def test_default_bins_and_params():
    assert default_bins(1.0, 10_000) == 5000
    assert default_bins(0.1, 100) == 100  # floor
    assert default_bins(10.0, 10**7) == 100_000  # cap
    p = ExponQParams(alpha=0.1, epsilon=1.0, bins=50)
    assert CAL.plan(p, 10_000)[0] == 50
    assert CAL.cost(p, DataShape(n=10)) == PureDP(eps=1.0)
    for bad in ({"epsilon": 0}, {"epsilon": 1, "bins": 1}, {"epsilon": 1, "lower": 1.0}):
        with pytest.raises(ValidationError):
            ExponQParams(alpha=0.1, **bad)


def test_threshold_is_a_grid_point_of_the_public_range():
    params = ExponQParams(alpha=0.1, epsilon=2.0, lower=-1.0, upper=3.0, bins=401)
    s = np.random.default_rng(4).uniform(-1, 3, 3000)
    res = CAL.calibrate(CalibrationInput(scores=s), params, random.Random(1))
    j = res.diagnostics["bin"]
    assert res.threshold == pytest.approx(-1.0 + j * 4.0 / 400, abs=1e-12)
    assert set(res.diagnostics) == {"bins", "gamma", "q_tilde", "bin", "top_bin"}


@pytest.mark.statistical
@pytest.mark.parametrize(
    ("law", "lower", "upper", "alpha", "eps", "n"),
    [
        (stats.beta(2, 5), 0.0, 1.0, 0.1, 1.0, 2000),
        (stats.beta(2, 5), 0.0, 1.0, 0.05, 0.1, 5000),
        (stats.uniform(-1, 4), -1.0, 3.0, 0.2, 5.0, 1000),
    ],
)
def test_coverage_statistics(law, lower, upper, alpha, eps, n):
    trials = 1000
    params = ExponQParams(alpha=alpha, epsilon=eps, lower=lower, upper=upper)
    _, gamma, q = CAL.plan(params, n)
    assert q < 1
    g = CAL.guarantee(params, DataShape(n=n))
    assert g.lower == 1 - alpha and g.failure_probability == 0

    data = law.rvs(size=(trials, n), random_state=np.random.default_rng(int(eps * 100) + n))
    t = np.array(
        [
            CAL.calibrate(CalibrationInput(scores=row), params, random.Random(i)).threshold
            for i, row in enumerate(data)
        ]
    )
    counts = (data <= t[:, None]).sum(axis=1)
    need = (n + 1) * (1 - alpha) / (1 - gamma * alpha)
    violations = int((counts < need).sum())
    assert violations <= stats.binom.isf(1e-4, trials, gamma * alpha), violations

    cover = law.cdf(t)
    se = cover.std(ddof=1) / math.sqrt(trials)
    assert cover.mean() >= g.lower - Z * se
