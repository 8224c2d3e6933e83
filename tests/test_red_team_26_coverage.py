"""Red team 26, coverage findings: a model's float32 outputs read one way at
calibration — the widened array — and the other way at predict — their shortest decimals, as
a CSV or JSON written by pandas holds them — or the reverse (F1: sets; F2: sets of a release
made from scores computed outside privcal; F3: regression intervals).

Each statistical test averages the coverage of T seeded releases (N calibration points, M
fresh test points each) and allows three standard deviations of that mean below the
recorded lower bound: each release's coverage is Beta-distributed around its level given
its calibration (split conformal: variance ≤ α(1−α)/(N+2)), measured on M points (binomial
variance ≤ 1/(4M)), so the tolerance is 3·√((α(1−α)/(N+2) + 1/(4M))/T) ≈ 0.0066 at α = 0.1.
Before the fixes the same runs covered 0.761, 0.296 and 0.779.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cli_env import CliEnv

N, M, T = 2000, 20_000, 12


def _tolerance(alpha: float) -> float:
    """Three standard deviations of the mean of T release coverages (module docstring)."""
    return 3 * math.sqrt((alpha * (1 - alpha) / (N + 2) + 0.25 / M) / T)


def _model(seed: int, n: int, leaves: tuple[float, float],
           dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """A discrete two-class model (two leaves, P(y=1) = leaves[0] or leaves[1], weights
    0.7 / 0.3) whose probabilities come out in ``dtype``, and labels drawn from them."""
    g = np.random.default_rng(seed)
    p1 = np.where(g.random(n) < 0.7, *leaves)
    y = (g.random(n) < p1).astype(np.int64)
    return np.stack([1 - p1, p1], axis=1).astype(dtype), y


def _text(a: np.ndarray) -> np.ndarray:
    """Narrow floats as pandas writes them (each value's shortest decimal), read back."""
    return np.array([float(str(v)) for v in np.ravel(a)]).reshape(np.shape(a))


def _coverage(accountant: Any, calibrate: Any, predict: Any, leaves: tuple[float, float],
              dtype: Any = np.float32) -> tuple[float, float]:
    covs, lower = [], math.nan
    for seed in range(T):
        p, y = _model(seed, N, leaves, dtype)
        rel = calibrate(p, y)
        pt, yt = _model(10_000 + seed, M, leaves, dtype)
        covs.append(float(predict(rel, pt)[np.arange(M), yt].mean()))
        lower = rel.coverage.lower
    return float(np.mean(covs)), lower


@pytest.mark.parametrize(("calibrate_on", "predict_on", "alpha", "dtype"), [
    ("wide", "text", 0.1, np.float32),   # 0.761 before
    ("text", "wide", 0.3, np.float32),   # t = 1 − 0.7 < 1 − 0.7f: the other direction
])
def test_f1_probabilities_read_another_way_at_predict_cover(
        accountant: Any, calibrate_on: str, predict_on: str, alpha: float,
        dtype: Any) -> None:
    """F1: ``calibrate(probs=…)`` on one reading of float32 probabilities and
    ``predict_set`` on the other left out every test point tied with the threshold: 0.761
    under a recorded ≥ 0.9 for the widened array then its CSV."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)

    def read(p: np.ndarray, how: str) -> np.ndarray:
        return p.astype(np.float64) if how == "wide" else _text(p)

    cov, lower = _coverage(
        accountant,
        lambda p, y: accountant.calibrate("split", dataset="d", probs=read(p, calibrate_on),
                                          labels=y, score="lac", alpha=alpha),
        lambda rel, p: rel.predict_set(read(p, predict_on)), (0.7, 0.9), dtype)
    assert lower == 1 - alpha
    assert cov >= lower - _tolerance(alpha)


def test_f1_aps_without_randomization_covers_read_as_text(accountant: Any) -> None:
    """F1 for aps (u = 1): a sum of probabilities ties as 1 − p does — at α = 0.6 the
    threshold is the top label's 0.7f of the 0.7 leaf, which its text 0.7 exceeds."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    cov, lower = _coverage(
        accountant,
        lambda p, y: accountant.calibrate("split", dataset="d", probs=p.astype(np.float64),
                                          labels=y, score="aps", alpha=0.6,
                                          score_options={"randomized": False}),
        lambda rel, p: rel.predict_set(_text(p)), (0.7, 0.9))
    assert lower == 0.4
    assert cov >= lower - _tolerance(0.6)


def test_f1_one_reading_adds_only_the_tied_labels_of_the_other(accountant: Any) -> None:
    """The sets of float32 probabilities given as calibrated are still exactly {1 − p ≤ t}
    (the other reading adds no label of another value), and float64 probabilities are
    untouched: every set equals ``1 − p ≤ t`` bit for bit."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    p, y = _model(0, N, (0.7, 0.9))
    rel = accountant.calibrate("split", dataset="d", probs=p.astype(np.float64), labels=y,
                               score="lac", alpha=0.1)
    pt = _model(1, M, (0.7, 0.9))[0].astype(np.float64)
    np.testing.assert_array_equal(rel.predict_set(pt), 1.0 - pt <= rel.threshold)
    q = np.random.default_rng(2).dirichlet([1, 1, 1], M)
    r = accountant.calibrate("split", dataset="d", probs=q, score="lac", alpha=0.1,
                             labels=np.random.default_rng(4).integers(0, 3, M))
    q2 = np.random.default_rng(3).dirichlet([1, 1, 1], M)
    np.testing.assert_array_equal(r.predict_set(q2), 1.0 - q2 <= r.threshold)


def test_f2_scores_computed_outside_privcal_cover_with_probabilities_as_text(
        accountant: Any) -> None:
    """F2: float32 lac scores computed by the caller, calibrated unnamed (t = 1 − 0.97f ≈
    0.03), predicted with ``score_name="lac"`` from the probabilities as text: the slack
    t·2⁻²¹ (1.4e-8) is below the 2.9e-8 between 1 − 0.97 and 1 − 0.97f — 0.296 under a
    recorded ≥ 0.9."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)

    def calibrate(p: np.ndarray, y: np.ndarray) -> Any:
        scores = (np.float32(1) - p[np.arange(y.shape[0]), y]).astype(np.float64)
        return accountant.calibrate("split", dataset="d", scores=scores, alpha=0.1)

    cov, lower = _coverage(accountant, calibrate,
                           lambda rel, p: rel.predict_set(_text(p), score_name="lac"),
                           (0.97, 0.99))
    assert lower == 0.9
    assert cov >= lower - _tolerance(0.1)


def _regression(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 predictions 0.1f·{1, 2, 3} and targets f + {0.7, 0.9, 1.3} in float32."""
    g = np.random.default_rng(seed)
    f = np.float32(0.1) * g.integers(1, 4, n).astype(np.float32)
    y = (f + g.choice(np.array([0.7, 0.9, 1.3], dtype=np.float32), size=n)).astype(np.float32)
    return f, y


def test_f3_intervals_of_float32_predictions_read_as_text_cover(accountant: Any) -> None:
    """F3: ``calibrate(preds=f, targets=y, score="absolute")`` on widened float32 arrays, then
    ``predict_interval`` on the predictions as text, scored on the targets as text: 0.779
    under a recorded ≥ 0.9."""
    _check_interval_coverage(accountant, lambda rel, ft: rel.predict_interval(_text(ft)))


def _check_interval_coverage(accountant: Any, read: Any) -> None:
    """T ``absolute`` split releases at α = 0.1 calibrated on widened float32 predictions and
    targets (:func:`_regression`); each predicts with ``read(release, predictions)`` (the
    intervals of the predictions' rows, in order) and is scored on the targets as text: the
    mean coverage must reach the recorded 0.9 within :func:`_tolerance`."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    covs, lower = [], math.nan
    for seed in range(T):
        f, y = _regression(seed, N)
        rel = accountant.calibrate("split", dataset="d", preds=f.astype(np.float64),
                                   targets=y.astype(np.float64), score="absolute", alpha=0.1)
        ft, yt = _regression(1000 + seed, M)
        iv, truth = read(rel, ft), _text(yt)
        covs.append(float(((iv[:, 0] <= truth) & (truth <= iv[:, 1])).mean()))
        lower = rel.coverage.lower
    assert lower == 0.9
    assert float(np.mean(covs)) >= lower - _tolerance(0.1)


def test_f1_cli_predict_on_a_pandas_csv_covers(ledger_url: str, tmp_path: Path,
                                               accountant: Any) -> None:
    """F1 end to end: calibrated in Python on the model's float32 array, then ``privcal
    predict --probs`` on the CSV pandas wrote of the test probabilities: 0.761 under a
    recorded ≥ 0.9 (one release; its coverage is within 0.02 of its mean with probability
    > 0.999 at N = 2000, M = 20 000)."""
    pd = pytest.importorskip("pandas")
    env = CliEnv(ledger_url, tmp_path)
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    p, y = _model(0, N, (0.7, 0.9))
    rel = accountant.calibrate("split", dataset="d", probs=p.astype(np.float64), labels=y,
                               score="lac", alpha=0.1)
    pt, yt = _model(1, M, (0.7, 0.9))
    pd.DataFrame(pt).to_csv(tmp_path / "t.csv", index=False, header=False)
    res = env.run("predict", "--release", str(rel.id), "--probs", str(tmp_path / "t.csv"),
                  "--out", str(tmp_path / "s.npy"))
    assert res.exit_code == 0, res.stderr
    sets = np.load(tmp_path / "s.npy")
    assert float(sets[np.arange(M), yt].mean()) >= rel.coverage.lower - 0.02


def test_f1_label_groups_read_as_text_cover_each_class(accountant: Any) -> None:
    """F1 through the per-class thresholds of ``mondrian="label"``: class 0's threshold is its
    score 1 − 0.1f of the 0.9 leaf, which the text 0.1 exceeds — its coverage was 0.875 under
    a recorded ≥ 0.9. Tolerance as in the module docstring with class 0's share (≈ 0.24) of
    N and M."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    covs, lower = [], math.nan
    for seed in range(T):
        p, y = _model(seed, N, (0.7, 0.9))
        rel = accountant.calibrate("split", dataset="d", probs=p.astype(np.float64), labels=y,
                                   score="lac", alpha=0.1, mondrian="label",
                                   public_groups=True)
        pt, yt = _model(10_000 + seed, M, (0.7, 0.9))
        sets = rel.predict_set(_text(pt))
        covs.append(float(sets[yt == 0, 0].mean()))
        lower = rel.coverage.details["group 0: lower"]
    n0, m0 = 0.24 * N, 0.24 * M
    tolerance = 3 * math.sqrt((0.09 / (n0 + 2) + 0.25 / m0) / T)
    assert lower == 0.9
    assert float(np.mean(covs)) >= lower - tolerance


def test_rounded_float64_scores_are_refused_for_what_they_may_be(accountant: Any) -> None:
    """Named scores rounded to two decimals (float64 from the start) were refused as "float32
    values written as text" only, which these are not; the refusal (right: predict's
    unrounded scores exceed them) now names rounding too, and nothing is charged."""
    from privcal.errors import InvalidInput

    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    s = np.round(np.random.default_rng(0).random(100), 2)
    with pytest.raises(InvalidInput, match=r"^scores are float32 values written as text "
                                           r".*or scores rounded to a few decimals"):
        accountant.calibrate("split", dataset="d", scores=s, score="absolute", alpha=0.1)
    assert accountant.releases() == []
