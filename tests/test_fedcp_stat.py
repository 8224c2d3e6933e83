"""Coverage of FedCP-QQ and FedCP²-QQ over many seeded trials (Humbert et al. 2023, Thm 3.2, 4.1).

Scores are U[0, 1] (continuous), so the coverage of a threshold t is exactly
min(max(t, 0), 1). Two tolerances, both derived:

- misses: each trial draws one fresh test score; the number of trials in which
  it is not covered is exactly Binomial(T, 1 − coverage) (independent
  trials). For FedCP-QQ, coverage = M_{ℓ,k} exactly (Thm 3.2 is an equality),
  so we test two-sided at the binomial 1e−6 quantiles; for FedCP²-QQ the
  guarantee is ≥ 1−α, so the count must stay below the Binomial(T, α) upper
  1e−6 quantile.
- mean of the exact per-trial coverage, which is in [0, 1]: the empirical
  Bernstein bound of Maurer & Pontil (2009, Thm 4) with failure probability
  δ: |mean − E| ≤ √(2 V ln(2/δ) / T) + 7 ln(2/δ) / (3 (T − 1)), V the sample
  variance.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats

from privcal.calibrators.federated_agent import aggregate, fedcp2_qq_message
from privcal.calibrators.fedplan import plan_fedcp2_qq, plan_fedcp_qq, plan_fedcp_qq_unequal

pytestmark = pytest.mark.statistical

DELTA = 1e-6


def bernstein_tol(x: np.ndarray, delta: float = DELTA) -> float:
    """Empirical Bernstein deviation for the mean of T values in [0, 1] (two-sided, level δ)."""
    t = x.size
    v = float(np.var(x, ddof=1))
    log = math.log(2 / delta)
    return math.sqrt(2 * v * log / t) + 7 * log / (3 * (t - 1))


def binom_two_sided(t: int, p: float) -> tuple[float, float]:
    return stats.binom.ppf(DELTA / 2, t, p), stats.binom.isf(DELTA / 2, t, p)


@pytest.mark.parametrize(("m", "n", "trials"), [(5, 10, 20000), (50, 20, 4000), (3, 40, 20000)])
def test_fedcp_qq_coverage_equals_M(m: int, n: int, trials: int) -> None:
    plan = plan_fedcp_qq(m, n, 0.1)
    rng = np.random.default_rng(1000 + m)
    scores = rng.random((trials, m, n))
    messages = np.sort(scores, axis=2)[:, :, plan.l - 1]  # vectorised fedcp_qq_message
    thr = np.sort(messages, axis=1)[:, plan.k - 1]  # vectorised aggregate
    # the vectorised protocol is the library's, trial by trial
    from privcal.calibrators.federated_agent import fedcp_qq_message

    for i in range(3):
        msgs = [fedcp_qq_message(scores[i, j], plan) for j in range(m)]
        assert aggregate(msgs, plan) == thr[i]

    assert abs(thr.mean() - plan.M) <= bernstein_tol(thr)
    misses = int(np.sum(rng.random(trials) > thr))
    lo, hi = binom_two_sided(trials, 1 - plan.M)
    assert lo <= misses <= hi


def test_fedcp_qq_power_against_wrong_plan() -> None:
    # the same test rejects the neighbouring plan (ℓ−1, k), whose coverage is lower
    plan = plan_fedcp_qq(5, 10, 0.1)
    trials = 20000
    rng = np.random.default_rng(99)
    thr = np.sort(np.sort(rng.random((trials, 5, 10)), axis=2)[:, :, plan.l - 2], axis=1)[
        :, plan.k - 1
    ]
    assert abs(thr.mean() - plan.M) > bernstein_tol(thr)


def test_fedcp_qq_unequal_coverage_equals_M() -> None:
    sizes = [3, 7, 12, 20, 25, 40, 60]
    plan = plan_fedcp_qq_unequal(sizes, 0.1)
    trials = 20000
    rng = np.random.default_rng(5)
    msgs = np.empty((trials, len(sizes)))
    for j, (nj, lj) in enumerate(zip(sizes, plan.ls, strict=True)):
        if lj > nj:
            msgs[:, j] = np.inf
        else:
            msgs[:, j] = np.sort(rng.random((trials, nj)), axis=1)[:, lj - 1]
    thr = np.sort(msgs, axis=1)[:, plan.k - 1]
    cov = np.minimum(thr, 1.0)
    assert abs(cov.mean() - plan.M) <= bernstein_tol(cov)
    misses = int(np.sum(rng.random(trials) > thr))
    lo, hi = binom_two_sided(trials, 1 - plan.M)
    assert lo <= misses <= hi


@pytest.mark.parametrize(
    ("m", "n", "eps", "spread"),
    [
        (5, 200, 10.0, 1.0),  # SPEC §10 reference plan, scores inside [0, S_max]
        (8, 150, 2.0, 1.0),
        (5, 200, 10.0, 1.15),  # 13% of the scores above S_max = 1: top bin released as +inf
    ],
)
def test_fedcp2_qq_coverage_at_least_target(m: int, n: int, eps: float, spread: float) -> None:
    alpha = 0.1
    plan = plan_fedcp2_qq(m, n, alpha, eps, bins=100, smax=1.0)
    trials = 1500
    nrng = np.random.default_rng(int(eps * 100) + m)
    rng = random.Random(2024 + m)
    scores = spread * nrng.random((trials, m, n))
    thr = np.array(
        [aggregate([fedcp2_qq_message(s, plan, rng) for s in trial], plan) for trial in scores]
    )
    cov = np.minimum(thr / spread, 1.0)  # P(spread·U ≤ t)
    # one-sided: E[coverage] ≥ 1−α (Thm 4.1)
    assert cov.mean() >= 1 - alpha - bernstein_tol(cov)
    misses = int(np.sum(spread * nrng.random(trials) > thr))
    assert misses <= stats.binom.isf(DELTA, trials, alpha)
    # and the proof's sharper bound M_{ℓγ,kγ}(1−γα) ≤ E[coverage]
    assert cov.mean() >= plan.proof_bound - bernstein_tol(cov)
