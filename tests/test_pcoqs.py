"""P-COQS (SPEC §4; Romanus & Molinari, seed 003, Alg. 1–2, Prop. 1, Thm 2).

Statistical tests run seeded trials on U[0, 1] scores, whose true coverage at t is
F(t) = t exactly. Two kinds of check, both consequences of the recorded guarantee:

- per trial, the rank event the proof rests on: on the event G that all N noise
  draws are within τ (P(G) ≥ 1−β), #{s ≤ t} ≥ ⌈(1−α)(n+1)⌉ (guaranteed variant) or
  ≥ ⌈r − τ⌉ (nominal). The number of trials violating it is asserted to be at most
  the 1 − 1e-4 quantile of Binomial(trials, β): a correct implementation fails this
  with probability ≤ 1e-4.
- the marginal coverage E[F(t)]: the guarantee is marginal over calibration data on G,
  and G is independent of the data, so E[F(t)] ≥ (1 − p_G)·lower where p_G = P(not G)
  is computed exactly from the discrete Gaussian pmf (and checked ≤ β); and
  E[F(t)] ≤ ⌈r+τ⌉/(n+1) + tol + p_G. Tolerance z·SE with z = Φ⁻¹(1 − 1e-4) and SE the
  sample standard deviation of F(t) over √trials.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats

from privcal.calibrators.base import CalibrationInput, DataShape, conformal_rank
from privcal.calibrators.mechanisms.discrete_gaussian import (
    discrete_gaussian,
    discrete_gaussian_pmf,
)
from privcal.calibrators.pcoqs import (
    PCOQS,
    PCOQSParams,
    noise_variance,
    noisy_binary_search,
    num_steps,
    rank_error,
    target_rank,
)
from privcal.costs import ZCDP
from privcal.errors import InvalidInput

Z = stats.norm.isf(1e-4)
CAL = PCOQS()


def _run(scores, rng=None, **kw):
    params = PCOQSParams(**{"alpha": 0.1, **kw})
    return CAL.calibrate(
        CalibrationInput(scores=np.asarray(scores)), params, rng or random.Random(0)
    )


def _p_bad(n_steps: int, rho: float, tau: float, one_sided: bool = False) -> float:
    """P(some |Z_i| > τ) (or, ``one_sided``, some Z_i > τ) for N i.i.d. discrete Gaussians
    of variance N/(2ρ), exactly."""
    s2 = noise_variance(n_steps, rho)
    r = math.ceil(40 * math.sqrt(float(s2))) + 1
    low = -r if one_sided else -math.floor(tau)
    inside = math.fsum(discrete_gaussian_pmf(s2, range(low, math.floor(tau) + 1)))
    assert r > tau
    return 1 - inside**n_steps


def test_spec_numbers():
    n_steps = num_steps(0.0, 1.0, 1e-10)
    assert n_steps == 34
    tau = rank_error(n_steps, 0.1, 0.01)
    assert round(tau / 3001, 5) == 0.01825
    assert round((tau + 1) / 3001, 5) == 0.01859
    g = CAL.guarantee(
        PCOQSParams(alpha=0.1, rho=0.1, beta=0.01, nominal=True, bound="subgaussian"),
        DataShape(n=3000),
    )
    assert g.lower == pytest.approx(0.9 - 0.0182525, abs=1e-6)
    assert g.upper == pytest.approx(0.9 + 0.0185857, abs=1e-6)
    assert g.failure_probability == 0.01
    assert g.details["N"] == 34 and g.details["tau"] == pytest.approx(tau)
    assert g.rank == conformal_rank(3000, 0.1)


def test_num_steps_exact():
    assert num_steps(0, 1, 2**-10) == 10  # power of two: exactly 10, not 11
    assert num_steps(0, 1, 0.25) == 2
    assert num_steps(0, 8, 0.125) == 6
    assert num_steps(0, 1, 0.3) == 2  # 1/0.3 = 3.33 → ⌈1.74⌉
    assert num_steps(-1, 1, 1e-10) == 35
    assert num_steps(0, 1, 0.1) == 4
    with pytest.raises(InvalidInput):
        num_steps(0, 1, 1)
    with pytest.raises(ValidationError):
        PCOQSParams(alpha=0.1, rho=1, tol=2)
    with pytest.raises(ValidationError):
        PCOQSParams(alpha=0.1, rho=1, lower=1, upper=1)
    with pytest.raises(ValidationError):
        PCOQSParams(alpha=0.1, rho=0)


def test_noise_variance_exact_and_cost():
    assert noise_variance(34, 0.1) == Fraction(170)
    assert CAL.cost(PCOQSParams(alpha=0.1, rho=0.25), DataShape(n=10)) == ZCDP(rho=0.25)


def test_target_rank():
    assert target_rank(3000, 0.1, 0.0, nominal=True) == 2701
    assert target_rank(3000, 0.1, 54.7, nominal=False) == math.ceil(2700.9 + 54.7)
    assert target_rank(9, 0.7, 0.0, nominal=True) == 3  # exact, not float 3.0000000000000004


@pytest.mark.parametrize("nominal", [False, True])
def test_without_noise_it_is_split_conformal_up_to_tol(nominal):
    # ρ = 1e12: σ² = 1.7e-11, P(Z ≠ 0) < 2·exp(−1/(2σ²)) = 0 in float64: no noise at all
    s = np.random.default_rng(3).uniform(0, 1, 1001)
    res = _run(s, rho=1e12, nominal=nominal)
    r = res.diagnostics["target_rank"]
    srt = np.sort(s)
    left, right = res.diagnostics["interval"]
    assert res.threshold == right
    assert right - left <= 1e-10
    assert srt[r - 1] <= right <= srt[r - 1] + 1e-10
    assert left < srt[r - 1]


def test_plus_inf_when_target_rank_exceeds_n_and_data_untouched():
    class NoRandomness(random.Random):
        def random(self):  # pragma: no cover - must not be called
            raise AssertionError("noise drawn although the threshold is data-independent")

        def getrandbits(self, k):  # pragma: no cover
            raise AssertionError("noise drawn although the threshold is data-independent")

        def randrange(self, *a, **k):  # pragma: no cover
            raise AssertionError("noise drawn although the threshold is data-independent")

    s = np.random.default_rng(0).uniform(size=200)
    res = _run(s, rng=NoRandomness(0), rho=0.1)  # τ ≈ 49 ⇒ r' = ⌈180.9 + 49⌉ > 200
    assert res.threshold == math.inf
    g = CAL.guarantee(PCOQSParams(alpha=0.1, rho=0.1), DataShape(n=200))
    assert g.rank > 200 and g.lower == 1.0


def test_out_of_range_scores():
    """Issue 14.3 changes this: scores above ``upper`` give +inf, never the clipped 1.0."""
    below = _run(np.full(50, -3.0), rho=1e12, alpha=0.5)
    assert below.threshold == pytest.approx(0.0, abs=1e-9)  # every score counts as ≤ any mid
    above = _run(np.full(50, 7.0), rho=1e12, alpha=0.5)
    assert above.threshold == math.inf  # never counted: right never moves, nothing backs it
    assert above.diagnostics["backed"] is False


def test_diagnostics_hold_only_public_or_dp_values():
    res = _run(np.random.default_rng(1).uniform(size=3000), rho=0.5)
    assert set(res.diagnostics) == {"N", "tau", "target_rank", "interval", "backed"}


def test_search_matches_naive_counting_for_the_same_noise():
    """The shrinking-candidate counter releases the same counts as a full count."""
    g = np.random.default_rng(8)
    for trial in range(30):
        s = np.concatenate([g.beta(2, 50, 700), g.uniform(-0.2, 1.2, 50), [0.5] * 20])
        sigma2 = Fraction(5)
        got = noisy_binary_search(s, 600, 0.0, 1.0, 30, sigma2, random.Random(trial))[:2]
        # naive: same noise sequence (same seed), count all scores (clipped) each step
        rng = random.Random(trial)
        left, right = 0.0, 1.0
        for _ in range(30):
            mid = (left + right) / 2
            c = int((np.clip(s, 0, 1) <= mid).sum()) + discrete_gaussian(sigma2, rng)
            if c < 600:
                left = mid
            else:
                right = mid
        assert got == (left, right)


@pytest.mark.statistical
@pytest.mark.parametrize("bound", ["subgaussian", "exact"])
@pytest.mark.parametrize(
    ("nominal", "rho", "beta", "n"),
    [(False, 0.1, 0.05, 4000), (False, 2.0, 0.5, 1500), (True, 0.1, 0.05, 3000)],
)
def test_coverage_statistics(nominal, rho, beta, n, bound):
    trials = 1000
    alpha = 0.1
    params = PCOQSParams(alpha=alpha, rho=rho, beta=beta, nominal=nominal, bound=bound)
    g = CAL.guarantee(params, DataShape(n=n))
    n_steps, tau = g.details["N"], g.details["tau"]
    r_alpha = conformal_rank(n, alpha)
    r = g.rank
    assert r <= n
    if bound == "subgaussian":
        p_bad = _p_bad(n_steps, rho, tau)
        assert p_bad <= beta  # τ is valid for the discrete Gaussian too (subgaussian, CKS20)
    else:  # the exact τ bounds the upper tail only; the two-sided event then has ≤ 2β
        assert _p_bad(n_steps, rho, tau, one_sided=True) <= beta
        p_bad = _p_bad(n_steps, rho, tau)
        assert p_bad <= 2 * beta
    need = r_alpha if not nominal else math.ceil(r - tau)

    data = np.random.default_rng(1000 + n).uniform(0, 1, size=(trials, n))
    t = np.array(
        [
            CAL.calibrate(CalibrationInput(scores=row), params, random.Random(i)).threshold
            for i, row in enumerate(data)
        ]
    )
    assert np.isfinite(t).all()
    counts = (data <= t[:, None]).sum(axis=1)
    violations = int((counts < need).sum())
    assert violations <= stats.binom.isf(1e-4, trials, beta), violations

    cover = t  # F(t) = t for U[0, 1]
    se = cover.std(ddof=1) / math.sqrt(trials)
    assert cover.mean() >= (1 - p_bad) * g.lower - Z * se
    k = math.ceil(r + tau)
    assert cover.mean() <= min(1.0, k / (n + 1)) + params.tol + p_bad + Z * se
    if not nominal:
        # the recorded upper is k/(n+1) as a float never below it (red team 6)
        assert g.lower == 1 - alpha and g.upper == pytest.approx(min(1.0, k / (n + 1)), abs=1e-15)
        assert Fraction(repr(g.upper)) >= min(Fraction(1), Fraction(k, n + 1))
