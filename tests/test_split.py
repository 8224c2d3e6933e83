"""Split conformal (SPEC §2): exact rank, +inf beyond n, and coverage on known distributions.

Statistical tests use scores with a known continuous distribution, so the true
coverage of a released threshold t is F(t), exactly. Split conformal's guarantee
is marginal over the calibration data, so the tests check the *mean* of F(t) over
seeded trials against [1−α, 1−α+1/(n+1)], with a Monte-Carlo tolerance of
z·SE, z = Φ⁻¹(1 − 1e-4) and SE the exact standard error (F(t) = U_(r) ~ Beta(r, n+1−r)).
They also check the whole law of F(t) against that Beta (Kolmogorov–Smirnov, 1e-4).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from privcal.calibrators.base import CalibrationInput, DataShape, conformal_rank
from privcal.calibrators.split import SplitConformal, SplitParams, kth_smallest
from privcal.errors import InvalidInput

Z = stats.norm.isf(1e-4)
CAL = SplitConformal()


def _run(scores: np.ndarray, alpha: float) -> float:
    return CAL.calibrate(
        CalibrationInput(scores=scores), SplitParams(alpha=alpha), random.Random(0)
    ).threshold


@pytest.mark.statistical
@pytest.mark.parametrize(("dist", "n", "alpha"), [("uniform", 1000, 0.1), ("beta", 2000, 0.05)])
def test_marginal_coverage_on_known_distribution(dist, n, alpha):
    trials = 2000
    g = np.random.default_rng(100 + n)
    law = stats.uniform() if dist == "uniform" else stats.beta(2, 5)
    data = law.rvs(size=(trials, n), random_state=g)
    cover = np.array([law.cdf(_run(row, alpha)) for row in data])
    r = conformal_rank(n, alpha)
    beta_r = stats.beta(r, n + 1 - r)  # exact law of F(S_(r)) for continuous scores
    se = beta_r.std() / math.sqrt(trials)
    g_ = CAL.guarantee(SplitParams(alpha=alpha), DataShape(n=n))
    assert g_.lower == 1 - alpha and g_.rank == r
    assert cover.mean() >= g_.lower - Z * se
    assert cover.mean() <= g_.upper + Z * se
    assert stats.kstest(cover, beta_r.cdf).pvalue > 1e-4


def test_threshold_is_exact_rank_and_per_trial_count():
    g = np.random.default_rng(5)
    for n in (2, 3, 10, 99, 1000):
        for alpha in (0.01, 0.1, 0.3, 0.5, 0.9):
            s = g.normal(size=n)
            r = math.ceil((n + 1) * (1 - Fraction(str(alpha))))
            t = _run(s, alpha)
            if r > n:
                assert t == math.inf
            else:
                assert t == np.sort(s)[r - 1]
                assert (s <= t).sum() >= r


def test_plus_inf_when_rank_exceeds_n_never_clipped():
    s = np.linspace(0, 1, 9)  # n = 9, α = 0.05 → r = ⌈9.5⌉ = 10 > 9
    t = _run(s, 0.05)
    assert t == math.inf
    g = CAL.guarantee(SplitParams(alpha=0.05), DataShape(n=9))
    assert g.rank == 10 and g.lower == 1.0


def test_rank_uses_exact_rational_arithmetic():
    # (n+1)(1−α) = 3 exactly; float arithmetic gives 3.0000000000000004 → rank 4
    n, alpha = 9, 0.7
    assert math.ceil((n + 1) * (1 - alpha)) == 4
    res = CAL.calibrate(
        CalibrationInput(scores=np.arange(9.0)), SplitParams(alpha=alpha), random.Random(0)
    )
    assert res.diagnostics == {"n": 9, "rank": 3, "tied_at_threshold": 0}
    assert res.threshold == 2.0


def test_ties_and_guarantee_fields():
    s = np.array([0.5] * 10)
    assert _run(s, 0.2) == 0.5
    g = CAL.guarantee(SplitParams(alpha=0.1), DataShape(n=99))
    assert g.failure_probability == 0 and g.upper == pytest.approx(0.9 + 1 / 100)
    assert "without ties" in g.statement or "no ties" in g.statement
    assert CAL.cost(SplitParams(alpha=0.1), DataShape(n=99)) is None


def test_kth_smallest_and_bad_input():
    s = np.array([3.0, 1.0, 2.0])
    assert [kth_smallest(s, r) for r in (1, 2, 3, 4)] == [1.0, 2.0, 3.0, math.inf]
    with pytest.raises(InvalidInput):
        kth_smallest(s, 0)
    for bad in (np.array([0.1, np.nan]), np.array([0.1]), np.zeros((2, 2))):
        with pytest.raises(InvalidInput):
            _run(bad, 0.1)
    with pytest.raises(InvalidInput, match="needs scores"):
        CAL.calibrate(CalibrationInput(labels=np.zeros(3)), SplitParams(alpha=0.1), random.Random())
    with pytest.raises(ValueError):
        SplitParams(alpha=1.0)
