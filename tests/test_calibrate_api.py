"""``Accountant.calibrate`` and ``Release``: the Python API of the calibrators end to end,
and the coverage of released thresholds on a distribution with a known CDF."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from scipy.stats import beta as beta_dist

from privcal import Accountant, BudgetRefused, Release
from privcal.calibrators.base import CoverageGuarantee
from tests.seeded import Seeded

RNG = np.random.default_rng(21)
N = 1000
SCORES = RNG.beta(2, 5, N)


def _probs_with_lac(lac: np.ndarray, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities whose true-label lac score 1 − p_y is exactly ``lac`` (label 0)."""
    py = 1 - lac
    rest = (1 - py)[:, None] * np.full(k - 1, 1 / (k - 1))
    return np.column_stack([py, rest]), np.zeros(lac.shape[0], dtype=int)


def test_calibrate_returns_a_typed_release(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=1, delta=1e-6)
    rel = accountant.calibrate("pcoqs", dataset="d", scores=SCORES, alpha=0.1, rho=0.25,
                               rng=Seeded(1))  # fmt: skip
    assert isinstance(rel, Release)
    assert isinstance(rel.coverage, CoverageGuarantee)
    assert math.isfinite(rel.threshold) and 0 < rel.threshold < 1
    assert rel.coverage.target == pytest.approx(0.9) and rel.coverage.lower == pytest.approx(0.9)
    assert rel.coverage.failure_probability == pytest.approx(0.05)
    assert rel.coverage.details["N"] >= 1 and "tau" in rel.coverage.details
    assert rel.privacy["cost"] == {"kind": "zcdp", "rho": "0.25"}
    assert rel.privacy["delta"] == "0.000001" and Decimal(rel.privacy["epsilon"]) > 0
    assert "zCDP" in rel.privacy["statement"]
    assert rel.params["rho"] == 0.25 and rel.shape["n"] == N
    assert rel.distribution == "privcal" and rel.calibrator_version
    assert accountant.release(rel.id) == rel
    assert [r.id for r in accountant.releases("d")] == [rel.id]
    b = accountant.budget("d")
    assert b.spent == {"rho": Decimal("0.25")} and b.releases == 1 and b.charges == 1


def test_params_as_a_dict_and_as_keywords_agree(accountant: Accountant) -> None:
    accountant.create_dataset("d", epsilon=10)
    a = accountant.calibrate("exponq", {"alpha": 0.1, "epsilon": 1.0}, dataset="d",
                             scores=SCORES, rng=Seeded(3))  # fmt: skip
    b = accountant.calibrate("exponq", dataset="d", scores=SCORES, alpha=0.1, epsilon=1.0,
                             rng=Seeded(3))  # fmt: skip
    assert a.threshold == b.threshold  # same seed, same data: the same release
    assert a.params == b.params and a.coverage == b.coverage
    assert accountant.budget("d").spent == {"epsilon": Decimal(2)}


def test_refusal_writes_nothing(accountant: Accountant) -> None:
    accountant.create_dataset("d", epsilon=1)
    accountant.calibrate("exponq", dataset="d", scores=SCORES, alpha=0.1, epsilon=0.75)
    head = accountant.ledger.head()
    with pytest.raises(BudgetRefused) as info:
        accountant.calibrate("exponq", dataset="d", scores=SCORES, alpha=0.1, epsilon=0.5)
    assert info.value.exit_code == 3
    assert "0.25" in str(info.value) and "d" in info.value.scope
    assert accountant.ledger.head() == head
    assert len(accountant.releases("d")) == 1 and accountant.budget("d").charges == 1


def test_idempotency_key_records_one_release(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=1)
    kw: dict[str, Any] = dict(dataset="d", scores=SCORES, alpha=0.1, rho=0.3,
                              idempotency_key="job-1")  # fmt: skip
    first = accountant.calibrate("pcoqs", **kw)
    again = accountant.calibrate("pcoqs", **kw)
    assert again.id == first.id and again.threshold == first.threshold
    assert accountant.budget("d").spent == {"rho": Decimal("0.3")}
    assert len(accountant.releases()) == 1


def test_predict_set_and_evaluate_with_known_scores(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    lac = np.random.default_rng(4).uniform(0, 0.6, 400)  # split threshold ≈ 0.54
    probs, labels = _probs_with_lac(lac)
    rel = accountant.calibrate("split", dataset="d", probs=probs, labels=labels, score="lac",
                               alpha=0.1)  # fmt: skip
    r = math.ceil(401 * 0.9)
    assert rel.threshold == np.sort(lac)[r - 1]
    assert rel.coverage.rank == r and rel.coverage.lower == pytest.approx(0.9)
    # test points p = (0.7, 0.2, 0.1): lac scores (0.3, 0.8, 0.9) → each set is {0}
    test = np.tile([0.7, 0.2, 0.1], (20, 1))
    sets = rel.predict_set(test)
    assert sets.dtype == bool and sets.shape == (20, 3)
    assert sets[:, 0].all() and not sets[:, 1:].any()
    ev = rel.evaluate(test, np.array([0] * 19 + [2]))
    assert ev.coverage == pytest.approx(0.95) and ev.meets_guarantee
    assert ev.mean_set_size == 1.0 and ev.singleton_fraction == 1.0 and ev.empty_fraction == 0.0
    ev = rel.evaluate(test, np.array([0] * 10 + [1] * 10))
    assert ev.coverage == pytest.approx(0.5) and not ev.meets_guarantee
    assert not ev.consistent_with_guarantee  # 10/20 is far below 0.9


def test_scores_release_needs_the_score_to_predict(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    rel = accountant.calibrate("split", dataset="d", scores=SCORES, alpha=0.1)
    from privcal.errors import InvalidInput

    with pytest.raises(InvalidInput, match="which score"):
        rel.predict_set(np.tile([0.7, 0.2, 0.1], (2, 1)))
    sets = rel.predict_set(np.tile([0.7, 0.2, 0.1], (2, 1)), score_name="lac")
    expected = [sc <= rel.threshold for sc in (0.3, 0.8, 0.9)]
    assert sets.tolist() == [expected, expected]


def test_infinite_threshold_when_rank_exceeds_n(accountant: Accountant) -> None:
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    rel = accountant.calibrate("split", dataset="d", scores=SCORES[:5], alpha=0.1)
    assert rel.threshold == math.inf  # ⌈6 · 0.9⌉ = 6 > 5: never clipped to the max score
    assert rel.predict_set(np.tile([0.7, 0.2, 0.1], (3, 1)), score_name="lac").all()


# --------------------------------------------------------------------------- coverage
TRIALS = 50


@pytest.mark.statistical
@pytest.mark.parametrize(
    ("method", "params"),
    [("pcoqs", {"rho": 1.0}), ("exponq", {"epsilon": 1.0})],
)
def test_mean_true_coverage_meets_the_recorded_bound(
    tmp_path: Any, method: str, params: dict[str, float]
) -> None:
    """50 seeded calibrations on fresh Beta(2, 5) scores (n = 1000), each recorded on a SQLite
    ledger. The true coverage of a threshold t is exactly F(t), the Beta(2, 5) CDF.

    Recorded guarantee: with probability ≥ 1 − β over the privacy noise, the coverage
    (marginal over calibration data and test point) is ≥ L (β = 0 for ExponQ). So
    E[F(t)] ≥ (1 − β)·L. Tolerance: the trials are independent, so the mean of F(t_i) has
    standard error s/√m (s the sample standard deviation); we allow 4 standard errors
    (one-sided normal tail ≈ 3·10⁻⁵), i.e. mean ≥ (1 − β)·L − 4·s/√50. For P-COQS the recorded
    upper bound U is checked the same way: mean ≤ (1 − β)·U + β + 4·s/√50.
    """
    acct = Accountant(f"sqlite:///{tmp_path}/cov.sqlite")
    acct.ledger.upgrade()
    acct.create_dataset("big", rho=1000)
    cover, lowers, uppers, fails = [], [], [], []
    for seed in range(TRIALS):
        scores = np.random.default_rng(1000 + seed).beta(2, 5, N)
        rel = acct.calibrate(method, dataset="big", scores=scores, alpha=0.1,
                             rng=Seeded(seed), **params)  # fmt: skip
        t = rel.threshold
        cover.append(1.0 if math.isinf(t) else float(beta_dist.cdf(t, 2, 5)))
        lowers.append(rel.coverage.lower)
        uppers.append(rel.coverage.upper)
        fails.append(rel.coverage.failure_probability)
    assert len(set(lowers)) == 1 and len(set(fails)) == 1  # public: the same for every trial
    lower, beta = lowers[0], fails[0]
    assert lower == pytest.approx(0.9)
    c = np.asarray(cover)
    tol = 4 * c.std(ddof=1) / math.sqrt(TRIALS)
    assert 0 < tol < 0.02  # the thresholds are finite and informative
    assert c.mean() >= (1 - beta) * lower - tol, (c.mean(), lower, beta, tol)
    if method == "pcoqs":
        upper = uppers[0]
        assert upper is not None and upper < 1
        assert c.mean() <= (1 - beta) * upper + beta + tol, (c.mean(), upper, tol)
    assert len(acct.releases("big")) == TRIALS
    assert acct.verify().guarantees_recomputed == TRIALS


def test_fedcp_qq_records_what_each_agent_reveals(accountant: Accountant) -> None:
    """FedCP-QQ is non-private: the release says what leaks, and no agent is charged."""
    accountant.create_dataset("open", rho=1, allow_nonprivate=True)
    agents = np.repeat(np.arange(50), 20)
    rel = accountant.calibrate("fedcp-qq", dataset="open", scores=RNG.random(1000), agents=agents,
                               alpha=0.1)  # fmt: skip
    assert rel.privacy["model"] == "none" and rel.privacy["cost"] is None
    assert "each agent reveals one order statistic of its data" in rel.privacy["statement"]
    assert accountant.budget("open").charges == 0
    assert accountant.verify().guarantees_recomputed == 1
