"""Issue 14.3/14.7/14.8, 16.2/16.5 and the calibrator half of 15's vocabulary.

- a threshold never rests on an unchecked public score range: regression residuals
  (``absolute``) and penalised ``raps`` scores (> 1) with the default [0, 1], through the
  API and the CLI, keep the recorded coverage bound on fresh data;
- the exponential mechanism is sampled exactly (distribution and reachability tests);
- every privacy record names its neighbouring relation;
- P-COQS does the same work on neighbouring datasets;
- resource parameters are bounded before anything is charged;
- one parameter vocabulary, old names still read.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from privcal import Accountant
from privcal.accountant.prepare import validate_params
from privcal.calibrators import pcoqs as pcoqs_mod
from privcal.calibrators.base import CalibrationInput, DataShape
from privcal.calibrators.exponq import ExponQ, ExponQParams
from privcal.calibrators.fedcp2_qq import FedCP2QQ, FedCP2QQParams
from privcal.calibrators.fedplan import MAX_AGENTS, plan_fedcp2_qq, plan_fedcp_qq
from privcal.calibrators.ldp_label import LDPLabel, LDPLabelParams
from privcal.calibrators.ldp_score import LDPScoreParams
from privcal.calibrators.mechanisms.exponential import (
    exponential_quantile,
    grid,
    sample_index,
    selection_probabilities,
)
from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
from privcal.calibrators.prediction_sets import prediction_sets
from privcal.calibrators.scores import label_scores
from privcal.cli import main
from privcal.errors import InvalidInput
from tests.seeded import Seeded

SIGMA = 0.8  # residual scale: P(|residual| ≤ 1) = 2Φ(1/0.8) − 1 ≈ 0.79 < 0.9


def _residual_coverage(t: float) -> float:
    """True coverage of the interval f ± t when y − f(x) ~ N(0, σ²)."""
    return 1.0 if math.isinf(t) else float(2 * stats.norm.cdf(t / SIGMA) - 1)


def _residuals(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    pred = g.normal(size=n)
    return pred, pred + g.normal(scale=SIGMA, size=n)


METHODS = [("pcoqs", {"rho": 1.0}), ("exponq", {"epsilon": 2.0})]


@pytest.mark.parametrize(("method", "cost"), METHODS)
def test_regression_residuals_outside_the_default_range_keep_the_bound(
    accountant: Accountant, method: str, cost: dict[str, float]
) -> None:
    """``absolute`` residuals with the default [0, 1]: was threshold 1 and coverage 0.79."""
    accountant.create_dataset("d", epsilon=1000) if method == "exponq" else (
        accountant.create_dataset("d", rho=1000, delta=1e-6)
    )
    cov, lower = [], []
    for trial in range(40):
        pred, y = _residuals(trial, 2000)
        rel = accountant.calibrate(method, dataset="d", probs=pred, labels=y, score="absolute",
                                   alpha=0.1, rng=Seeded(trial), **cost)  # fmt: skip
        cov.append(_residual_coverage(rel.threshold))
        lower.append(rel.coverage.lower)
        assert "[lower, upper]" not in rel.coverage.over
    assert np.mean(cov) >= max(lower) - 0.01, (np.mean(cov), max(lower))


@pytest.mark.parametrize(("method", "cost"), METHODS)
def test_with_a_covering_public_range_the_threshold_is_finite_and_valid(
    accountant: Accountant, method: str, cost: dict[str, float]
) -> None:
    accountant.create_dataset("d", epsilon=1000) if method == "exponq" else (
        accountant.create_dataset("d", rho=1000, delta=1e-6)
    )
    cov = []
    for trial in range(30):
        pred, y = _residuals(100 + trial, 4000)
        rel = accountant.calibrate(method, dataset="d", probs=pred, labels=y, score="absolute",
                                   alpha=0.1, upper=5.0, rng=Seeded(trial),
                                   **cost)  # fmt: skip
        assert math.isfinite(rel.threshold)
        cov.append(_residual_coverage(rel.threshold))
    # marginal bound 0.9; the mean of 30 conditional coverages (sd ≈ 0.01 each)
    assert np.mean(cov) >= 0.9 - 0.006


def _classification(seed: int, n: int, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    p = g.dirichlet(np.full(k, 0.3), size=n)
    y = (p.cumsum(axis=1) > g.random(n)[:, None]).argmax(axis=1)  # y ~ p(x): calibrated
    return p, y


RAPS = {"lam": 0.5, "k_reg": 1}


@pytest.mark.parametrize(("method", "cost"), METHODS)
def test_raps_with_a_penalty_keeps_the_bound_on_fresh_data(
    accountant: Accountant, method: str, cost: dict[str, float]
) -> None:
    accountant.create_dataset("d", epsilon=1000) if method == "exponq" else (
        accountant.create_dataset("d", rho=1000, delta=1e-6)
    )
    test_p, test_y = _classification(999, 20_000)
    cov = []
    for trial in range(15):
        p, y = _classification(trial, 2000)
        rel = accountant.calibrate(method, dataset="d", probs=p, labels=y, score="raps",
                                   score_options=RAPS, alpha=0.1, rng=Seeded(trial),
                                   **cost)  # fmt: skip
        sets = prediction_sets("raps", test_p, rel.threshold, rng=Seeded(7), **RAPS)
        cov.append(float(sets[np.arange(test_y.size), test_y].mean()))
        lower = rel.coverage.lower
    assert np.mean(cov) >= lower - 0.01, (np.mean(cov), lower)


@pytest.mark.parametrize("method", ["pcoqs", "exponq"])
def test_cli_residuals_outside_the_default_range_keep_the_bound(
    ledger: object, ledger_url: str, tmp_path: Path, method: str
) -> None:
    run = CliRunner()

    def cli(*args: str) -> Any:
        res = run.invoke(main, ["--db-url", ledger_url, *args, "--json"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    cli("dataset", "create", "d", *(["--epsilon", "1000"] if method == "exponq" else
                                     ["--rho", "1000", "--delta", "1e-6"]))  # fmt: skip
    cov, lower = [], []
    for trial in range(8):
        _, y = _residuals(500 + trial, 3000)
        pred, _ = _residuals(500 + trial, 3000)
        np.save(tmp_path / "s.npy", np.abs(y - pred))
        cost = ["--epsilon", "2"] if method == "exponq" else ["--rho", "1"]
        out = cli("calibrate", method, "--dataset", "d", "--alpha", "0.1", *cost,
                  "--scores", str(tmp_path / "s.npy"))  # fmt: skip
        t = out["release"]["threshold"]
        cov.append(_residual_coverage(float(t)))
        lower.append(out["release"]["coverage"]["lower"])
    assert np.mean(cov) >= max(lower) - 0.01, (cov, lower)


# ----------------------------------------------------------------- P-COQS range and work


def test_pcoqs_threshold_needs_a_backing_count() -> None:
    """All scores above ``upper``: the search never moves ``right``; the release is +inf."""
    s = np.full(500, 3.0)
    res = PCOQS().calibrate(CalibrationInput(scores=s), PCOQSParams(alpha=0.1, rho=100.0),
                            random.Random(0))  # fmt: skip
    assert res.threshold == math.inf and res.diagnostics["backed"] is False


def test_pcoqs_scores_below_lower_only_make_it_conservative() -> None:
    """Below-range scores are counted at every midpoint: the threshold still covers them."""
    s = np.concatenate([np.full(900, -2.0), np.random.default_rng(1).uniform(0, 1, 100)])
    res = PCOQS().calibrate(CalibrationInput(scores=s), PCOQSParams(alpha=0.1, rho=1e6),
                            random.Random(0))  # fmt: skip
    assert res.threshold >= float(np.sort(s)[899])
    assert np.mean(s <= res.threshold) >= 0.9


_REAL_COUNT = pcoqs_mod.count_at_most


def _work(monkeypatch: pytest.MonkeyPatch, s: np.ndarray, seed: int) -> list[int]:
    calls: list[int] = []
    real = _REAL_COUNT

    def counting(scores: np.ndarray, mid: float, buf: np.ndarray) -> int:
        calls.append(int(scores.size))
        return real(scores, mid, buf)

    monkeypatch.setattr(pcoqs_mod, "count_at_most", counting)
    PCOQS().calibrate(CalibrationInput(scores=s), PCOQSParams(alpha=0.1, rho=0.5),
                      random.Random(seed))  # fmt: skip
    return calls


def test_pcoqs_work_is_the_same_on_neighbouring_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16.5: all-0.5 data vs one changed record cost the same N full passes."""
    n = 10_000
    a = np.full(n, 0.5)
    b = a.copy()
    b[17] = 0.999
    steps = PCOQS()._plan(PCOQSParams(alpha=0.1, rho=0.5), n)[0]
    for seed in range(3):
        wa, wb = _work(monkeypatch, a, seed), _work(monkeypatch, b, seed + 10)
        assert wa == wb == [n] * steps


# ----------------------------------------------------------------- exact sampler


def test_exact_sampler_matches_the_exponential_mechanism() -> None:
    """Chi-square against the exact probabilities, with a seeded generator."""
    s = np.array([0.1, 0.2, 0.35, 0.5, 0.52, 0.9, 0.91, 0.3])
    e = grid(0.0, 1.0, 7)
    q, eps = 0.7, 2.0
    p = selection_probabilities(s, e, q, eps)
    rng = random.Random(2024)
    draws = 40_000
    c = Counter(exponential_quantile(s, e, q, eps, rng)[0] for _ in range(draws))
    obs = np.array([c[j] for j in range(e.size)])
    assert obs.sum() == draws
    assert stats.chisquare(obs, p * draws).pvalue > 1e-4


def test_exact_sampler_on_neighbouring_datasets_respects_e_to_the_epsilon() -> None:
    """Empirical frequencies of two neighbours; every ratio of exact probabilities ≤ e^ε."""
    e = grid(0.0, 1.0, 5)
    a = np.array([0.1, 0.3, 0.5, 0.7, 0.9, 0.2])
    b = a.copy()
    b[0] = 0.95  # substitution of one score
    eps, q = 1.0, 0.6
    pa, pb = selection_probabilities(a, e, q, eps), selection_probabilities(b, e, q, eps)
    assert np.all(pa / pb <= math.exp(eps) * (1 + 1e-12))
    rng = random.Random(5)
    draws = 30_000
    ca = Counter(exponential_quantile(b, e, q, eps, rng)[0] for _ in range(draws))
    obs = np.array([ca[j] for j in range(e.size)])
    assert stats.chisquare(obs, pb * draws).pvalue > 1e-4


class _Steer(random.Random):
    """A generator that proposes the last grid point and accepts it (V = 0)."""

    def __init__(self) -> None:
        super().__init__(0)

    def randrange(self, stop: int, *args: Any, **kw: Any) -> int:  # type: ignore[override]
        return stop - 1  # the last integer of the proposal range: the last grid point

    def getrandbits(self, k: int) -> int:
        return 0

    def random(self) -> float:
        return 1.0 - 2.0**-53  # the largest uniform the old inverse-CDF sampler could see


def test_no_output_has_probability_zero() -> None:
    """A grid point with probability ≈ e^−1000 (0 in float64) can still be drawn.

    The float inverse-CDF sampler could never output it under this dataset while a
    neighbour gave it a positive float probability: that is what made it (ε, ~2^−53)-DP.
    """
    s = np.zeros(40_000)  # every score at the bottom: the top point is ≈ e^−2222 likely
    e = grid(0.0, 1.0, 3)
    q, eps = 0.9, 1.0
    p = selection_probabilities(s, e, q, eps)
    assert p[-1] == 0.0  # underflows in float
    below = np.zeros(3, dtype=np.int64)
    below[1:] = 40_000
    above = np.zeros(3, dtype=np.int64)
    # proposal weights are 2^(40 − L_j): the last point owns the last integer of the range
    assert sample_index(below, above, q, eps, _Steer()) == 2
    assert exponential_quantile(s, e, q, eps, _Steer())[0] == 2


def test_exponq_top_grid_point_is_released_as_inf() -> None:
    s = np.full(300, 4.0)  # every score above the default upper = 1
    res = ExponQ().calibrate(CalibrationInput(scores=s), ExponQParams(alpha=0.1, epsilon=50.0),
                             random.Random(0))  # fmt: skip
    assert res.diagnostics["top_bin"] is True and res.threshold == math.inf


def test_exponq_refuses_alpha_above_one_half(accountant: Accountant) -> None:
    accountant.create_dataset("d", epsilon=10)
    with pytest.raises(InvalidInput, match="α ≤ 1/2"):
        accountant.calibrate("exponq", dataset="d", scores=np.full(100, 0.5), alpha=0.6,
                             epsilon=1.0)  # fmt: skip
    assert accountant.budget("d").charges == 0
    g = ExponQ().guarantee(ExponQParams(alpha=0.5, epsilon=1.0), DataShape(n=10_000))
    assert g.details["q_tilde"] >= 0.5  # α ≤ 1/2 ⇒ q̃ ≥ 1/2 (the proof's assumption)


# ----------------------------------------------------------------- records and wording


def test_every_private_record_names_its_neighbouring_relation(accountant: Accountant) -> None:
    accountant.create_dataset("z", rho=10, delta=1e-6)
    accountant.create_dataset("p", epsilon=10)
    accountant.create_dataset("l", rho=1, subject_epsilon=10)
    s = np.random.default_rng(0).uniform(size=500)
    r1 = accountant.calibrate("pcoqs", dataset="z", scores=s, alpha=0.1, rho=0.5)
    r2 = accountant.calibrate("exponq", dataset="p", scores=s, alpha=0.1, epsilon=1.0)
    p, y = _classification(3, 500, k=4)
    r3 = accountant.calibrate("ldp-label", dataset="l", probs=p, labels=y, alpha=0.1,
                              epsilon=2.0, subjects=[f"u{i}" for i in range(500)])  # fmt: skip
    for rel in (r1, r2):
        assert rel.privacy["neighbouring"].startswith("substitution of one calibration score")
        assert "n is public" in rel.privacy["neighbouring"]
    assert "label" in r3.privacy["neighbouring"]
    accountant.verify()


def test_pcoqs_statement_is_the_theorem_not_a_per_release_promise() -> None:
    g = PCOQS().guarantee(PCOQSParams(alpha=0.1, rho=0.5), DataShape(n=5000))
    assert "P(Y ∈ C(X) | E)" in g.statement and "not per release" in g.statement
    assert "with probability ≥" not in g.statement.split("(")[0]
    assert "not per release" in g.over


# ----------------------------------------------------------------- resource bounds


def test_exponq_bins_are_bounded_before_the_charge(accountant: Accountant) -> None:
    accountant.create_dataset("d", epsilon=100)
    with pytest.raises(InvalidInput, match="bins"):
        accountant.calibrate("exponq", dataset="d", scores=np.full(100, 0.5), alpha=0.1,
                             epsilon=10.0, bins=2_000_000_000)  # fmt: skip
    assert accountant.budget("d").charges == 0
    with pytest.raises(InvalidInput, match="bins"):
        validate_params(FedCP2QQ(), {"alpha": 0.1, "epsilon": 1.0, "bins": 10**9})


def test_agents_are_bounded_before_any_planning() -> None:
    with pytest.raises(InvalidInput, match="number of agents"):
        plan_fedcp_qq(MAX_AGENTS + 1, 100, 0.1)
    with pytest.raises(InvalidInput, match="number of agents"):
        plan_fedcp2_qq(10**9, 100, 0.1, 1.0)
    res = CliRunner().invoke(main, ["fed", "plan", "--agents", "10000000", "--local-n", "200",
                                    "--alpha", "0.1"])  # fmt: skip
    assert res.exit_code != 0 and "--agents must be in" in res.output


# ----------------------------------------------------------------- one vocabulary


def test_old_parameter_names_are_still_read() -> None:
    old = PCOQSParams.model_validate({"alpha": 0.1, "rho": 1, "beta": 0.2})
    assert old.failure_probability == 0.2
    assert LDPLabelParams.model_validate(
        {"alpha": 0.1, "epsilon": 1, "k": 3, "delta": 0.01}
    ).failure_probability == 0.01
    assert LDPScoreParams.model_validate(
        {"alpha": 0.1, "epsilon": 1, "delta": 0.01}
    ).failure_probability == 0.01
    p = FedCP2QQParams.model_validate({"alpha": 0.1, "epsilon": 1, "smax": 2.5})
    assert p.upper == 2.5 and p.lower == 0.0
    dumped = PCOQSParams(alpha=0.1, rho=1, failure_probability=0.2).model_dump()
    assert "failure_probability" in dumped and "beta" not in dumped


def test_cli_failure_probability_and_hidden_old_flag(
    ledger: object, ledger_url: str, tmp_path: Path
) -> None:
    np.save(tmp_path / "s.npy", np.random.default_rng(0).uniform(size=400))
    run = CliRunner()

    def cli(*args: str) -> Any:
        return run.invoke(main, ["--db-url", ledger_url, *args], catch_exceptions=False)

    assert cli("dataset", "create", "d", "--rho", "10", "--delta", "1e-6").exit_code == 0
    help_text = cli("calibrate", "pcoqs", "--help").output
    assert "--failure-probability" in help_text and "--beta" not in help_text
    base = ["calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1", "--rho", "0.1",
            "--scores", str(tmp_path / "s.npy"), "--json"]  # fmt: skip
    new = json.loads(cli(*base, "--failure-probability", "0.2").stdout)
    old = json.loads(cli(*base, "--beta", "0.2").stdout)
    assert new["release"]["params"]["failure_probability"] == 0.2
    assert old["release"]["params"]["failure_probability"] == 0.2
    both = cli(*base, "--beta", "0.2", "--failure-probability", "0.1")
    assert both.exit_code != 0 and "not both" in both.output


def test_ldp_label_honours_score_as_a_keyword_and_reads_k(accountant: Accountant) -> None:
    accountant.create_dataset("l", rho=1, subject_epsilon=10)
    p, y = _classification(4, 600, k=5)
    users = [f"u{i}" for i in range(600)]
    rel = accountant.calibrate("ldp-label", dataset="l", probs=p, labels=y, alpha=0.1,
                               epsilon=3.0, score="aps", rng=Seeded(1),
                               subjects=users)  # fmt: skip
    assert rel.params["score"] == "aps" and rel.coverage.details["score"] == "aps"
    assert rel.params["k"] is None and rel.coverage.details["k"] == 5
    direct = LDPLabel().calibrate(
        CalibrationInput(probs=p, labels=y),
        LDPLabelParams(alpha=0.1, epsilon=3.0, score="aps"),
        random.Random(1),
    )
    assert rel.threshold == direct.threshold
    with pytest.raises(InvalidInput, match="score given twice"):
        accountant.calibrate("ldp-label", {"score": "lac"}, dataset="l", probs=p, labels=y,
                             alpha=0.1, epsilon=3.0, score="aps", subjects=users)  # fmt: skip
    assert accountant.budget("l").releases == 1
    assert Decimal(0) < Decimal(str(rel.privacy["epsilon"]))


def test_label_scores_of_absolute_exceed_one() -> None:
    """The premise of the range tests: these scores do fall outside [0, 1]."""
    pred, y = _residuals(0, 1000)
    assert (label_scores("absolute", pred, y) > 1).mean() > 0.15
    p, lab = _classification(0, 1000)
    assert (label_scores("raps", p, lab, rng=Seeded(0), **RAPS) > 1).mean() > 0.3


def test_fedcp2_qq_grid_takes_lower_and_upper() -> None:
    """``smax`` became ``upper``, with a ``lower``: the grid is [lower, upper]."""
    from privcal.calibrators.federated_agent import bin_grid, check_message

    g = np.random.default_rng(3)
    s = g.uniform(-1, 1, 20 * 150)
    agents = np.repeat(np.arange(20), 150)
    params = FedCP2QQParams(alpha=0.1, epsilon=10.0, lower=-1.0, upper=1.0)
    shape = DataShape(n=s.size, group_sizes=(150,) * 20)
    res = FedCP2QQ().calibrate(CalibrationInput(scores=s, agents=agents), params,
                               random.Random(0))  # fmt: skip
    plan = FedCP2QQ().plan(params, shape)
    e = bin_grid(plan)
    assert e[0] == -1.0 and e[-1] == 1.0
    assert all(check_message(m, plan) in set(e.tolist()) for m in res.diagnostics["messages"])
    assert -1.0 <= res.threshold < 1.0 or res.threshold == math.inf
    assert FedCP2QQ().guarantee(params, shape).details["lower"] == -1.0
    with pytest.raises(ValueError, match="lower"):
        FedCP2QQParams(alpha=0.1, epsilon=1.0, lower=2.0, upper=1.0)
