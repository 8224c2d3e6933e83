"""Red team 25, coverage findings: float32 scores privcal did not compute, compared with the
float64 scores predict computes — calibrated without naming the score (F4), named with one
float64 value among them (F2) or written as text with one such value (F3) — and the
scikit-learn wrapper's α (F1)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

N, M, T = 2000, 20_000, 12


def _tree_model(seed: int, n: int, leaves: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """A discrete two-class model (two leaves, P(y=1) = leaves[0] or leaves[1], weights 0.7 /
    0.3) whose probabilities come out in float32, widened to float64, and labels drawn from
    them."""
    g = np.random.default_rng(seed)
    p1 = np.where(g.random(n) < 0.7, *leaves)
    y = (g.random(n) < p1).astype(np.int64)
    p32 = np.stack([1 - p1, p1], axis=1).astype(np.float32)
    return p32.astype(np.float64), y


def _float32_lac(probs: np.ndarray, y: np.ndarray) -> np.ndarray:
    """lac scores computed in float32 arithmetic (1 − p, rounded to float32), widened."""
    p32 = probs.astype(np.float32)
    return (np.float32(1) - p32[np.arange(y.shape[0]), y]).astype(np.float64)


def _as_text(s: np.ndarray) -> np.ndarray:
    """Float32 values as pandas/polars write a float32 column (its shortest decimal), read."""
    return np.array([float(str(np.float32(v))) for v in s])


def _mean_coverage(accountant: Any, make: Any, leaves: tuple[float, float], alpha: float,
                   **predict: Any) -> tuple[float, float]:
    """The mean test coverage of T seeded releases (M fresh test points each) and its lower
    bound; every label whose float32 score is ≤ t must also be in its set."""
    covs, lower = [], math.nan
    for seed in range(T):
        probs, y = _tree_model(seed, N, leaves)
        scores, score = make(probs, y)
        rel = accountant.calibrate("split", dataset="d", scores=scores, alpha=alpha,
                                   **({"score": score} if score else {}))
        pt, yt = _tree_model(10_000 + seed, M, leaves)
        sets = rel.predict_set(pt, **predict)
        narrow = np.float32(1) - pt.astype(np.float32)
        assert sets[narrow.astype(np.float64) <= rel.threshold].all()
        covs.append(float(sets[np.arange(M), yt].mean()))
        lower = rel.coverage.lower
    return float(np.mean(covs)), lower


def _tolerance(alpha: float) -> float:
    """Three sds of the mean of T release coverages: each is Beta-distributed around 1 − α
    given its calibration (split conformal: variance ≤ α(1−α)/(n+2)), measured on M points
    (binomial variance ≤ 1/(4M))."""
    return 3 * math.sqrt((alpha * (1 - alpha) / (N + 2) + 0.25 / M) / T)


def test_f4_float32_scores_calibrated_unnamed_then_named_at_predict_cover(
        accountant: Any) -> None:
    """F4: float32 lac scores, calibrated without naming the score (which runs, and no rule
    judges the values), then predicted with ``score_name="lac"`` as the release says to:
    predict compared its float64 1 − p with the float32 threshold, 2.2e-8 lower for p = 0.1,
    and every test point tied with it fell out — 0.916 under a recorded ≥ 0.95."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    cov, lower = _mean_coverage(accountant, lambda p, y: (_float32_lac(p, y), None),
                                (0.9, 0.95), 0.05, score_name="lac")
    assert lower == 0.95
    assert cov >= lower - _tolerance(0.05)


def test_f2_named_float32_scores_with_one_float64_value_cover(accountant: Any) -> None:
    """F2: the same float32 scores named ``lac`` are refused (red team 22); one float64 value
    appended let them through, and they covered 0.916 under a recorded ≥ 0.95."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)

    def make(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, str]:
        return np.concatenate([_float32_lac(p, y), [1 / 3]]), "lac"

    cov, lower = _mean_coverage(accountant, make, (0.9, 0.95), 0.05)
    assert lower == 0.95
    assert cov >= lower - _tolerance(0.05)


def test_f3_float32_text_with_one_float64_value_covers(accountant: Any) -> None:
    """F3: float32 lac scores written as text ("0.99" for 1 − 0.01f, below the float64
    0.9900000002…) are refused (red team 23); one float64 value among them let them through:
    0.985 under a recorded ≥ 0.99."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)

    def make(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, str]:
        return np.concatenate([_as_text(_float32_lac(p, y)), [1 / 3]]), "lac"

    cov, lower = _mean_coverage(accountant, make, (0.99, 0.97), 0.01)
    assert lower == 0.99
    assert cov >= lower - _tolerance(0.01)


def test_f4_float32_residuals_named_at_predict_keep_their_targets(accountant: Any) -> None:
    """F4 for intervals: float32 absolute residuals calibrated unnamed, then
    ``predict_interval(score_name="absolute")``: every target whose float32 residual is ≤ t
    lies in its interval (t itself was such a residual, so at least the r-th calibration
    point is covered)."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(5)
    f = np.full(N, 0.1, dtype=np.float32)  # float32 0.1 + 0.7, 0.9, 1.3, less 0.1: each
    y = (0.1 + g.choice([0.7, 0.9, 1.3], size=N)).astype(np.float32)  # 2.2e-8 low
    res = np.abs(y - f).astype(np.float64)  # float32 arithmetic, widened
    rel = accountant.calibrate("split", dataset="d", scores=res, alpha=0.1)
    iv = rel.predict_interval(f.astype(np.float64), score_name="absolute")
    inside = (iv[:, 0] <= y.astype(np.float64)) & (y.astype(np.float64) <= iv[:, 1])
    assert inside[res <= rel.threshold].all()


def test_f4_a_release_privcal_computed_the_scores_of_is_bit_for_bit(accountant: Any) -> None:
    """The slack applies only to scores privcal did not compute: a run on probabilities
    (which records k) gives {y : 1 − p ≤ t} exactly, as before."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    probs, y = _tree_model(0, N, (0.9, 0.95))
    rel = accountant.calibrate("split", dataset="d", probs=probs, labels=y, alpha=0.05,
                               score="lac")
    pt, _ = _tree_model(1, M, (0.9, 0.95))
    assert np.array_equal(rel.predict_set(pt), 1.0 - pt <= rel.threshold)


class _Model:
    """A fitted classifier stub: ``predict_proba`` returns the rows it is given."""

    classes_ = np.array([0, 1])

    def predict_proba(self, X: Any) -> np.ndarray:
        return np.asarray(X, dtype=np.float64)


@pytest.mark.parametrize("level", [0.3000000000001, 0.123456789012345])
def test_f1_the_wrapper_never_records_a_larger_alpha_than_asked(accountant: Any,
                                                                level: float) -> None:
    """F1: α = 1 − confidence_level was rounded to 12 digits to nearest: 0.3000000000001 ran
    (and recorded) α = 0.7, which at n = 9 has rank 3 and covers exactly 0.3 < the level
    asked; now α is the decimal 1 − level, and the rank's coverage is at least the level."""
    from privcal.estimators import PrivateConformalClassifier

    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(0)
    p1 = g.random(9)
    X = np.stack([1 - p1, p1], axis=1)
    clf = PrivateConformalClassifier(_Model(), method="split", confidence_level=level,
                                     accountant=accountant, dataset="d")
    clf.conformalize(X, (g.random(9) < p1).astype(int))
    rel = clf.release_
    assert Fraction(repr(rel.params["alpha"])) <= 1 - Fraction(repr(level))
    # split conformal covers r/(n+1) exactly (continuous scores): at least the level asked
    assert Fraction(rel.coverage.rank, 10) >= Fraction(repr(level))
    _, sets = clf.predict_set(X, confidence_level=level)  # the level asked still predicts
    assert sets.shape == (9, 2, 1)


def _float32_residuals(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """f = 0.1 and y = 0.1 + {0.7, 0.9, 1.3} in float32, and |y − f| in float32 arithmetic,
    widened: each 2.2e-8 below the float64 |y − f| of the same float32 numbers."""
    g = np.random.default_rng(seed)
    f = np.full(n, 0.1, dtype=np.float32)
    y = (0.1 + g.choice([0.7, 0.9, 1.3], size=n, p=[0.5, 0.4, 0.1])).astype(np.float32)
    return f.astype(np.float64), y.astype(np.float64), np.abs(y - f).astype(np.float64)


def test_f5_named_float32_residuals_with_one_float64_value_keep_their_targets(
        accountant: Any) -> None:
    """F5: float32 residuals named ``absolute`` with one float64 value among them passed the
    narrow-float rules; a regression release made from them recorded what a run on
    predictions and targets records, and predict left out every target tied with the
    threshold: 0.900 coverage under a recorded ≥ 0.95. The record now says the scores were
    given, and every target whose float32 residual is ≤ t is in its interval."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    for seed in range(3):
        _, _, res = _float32_residuals(seed, N)
        rel = accountant.calibrate("split", dataset="d", scores=np.concatenate([res, [1 / 3]]),
                                   alpha=0.05, score="absolute")
        assert rel.diagnostics["score"] == {"name": "absolute", "options": {},
                                            "given": "scores"}
        ft, yt, rt = _float32_residuals(100 + seed, M)
        iv = rel.predict_interval(ft)
        inside = (iv[:, 0] <= yt) & (yt <= iv[:, 1])
        assert inside[rt <= rel.threshold].all()
        assert inside.mean() >= rel.coverage.lower


def test_f5_a_run_on_predictions_records_no_given_scores(accountant: Any) -> None:
    """A run on predictions and targets (privcal computes the residuals in float64) records
    the score as before, and its intervals are [f − t, f + t] a few ulps outward, exactly —
    and, the predictions being float32 values, two float32 spacings more (red team 26,
    coverage F3: their decimals, as a CSV holds them, are the other reading)."""
    from privcal.calibrators.readings import reading_gap
    from privcal.calibrators.scores import score_interval

    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    f, y, _ = _float32_residuals(0, N)
    rel = accountant.calibrate("split", dataset="d", preds=f, targets=y, alpha=0.05,
                               score="absolute")
    assert rel.diagnostics["score"] == {"name": "absolute", "options": {}}
    lo, hi = score_interval(f[:5], f[:5], rel.threshold)
    gap = reading_gap(f[:5], f[:5], np.full(5, rel.threshold))
    assert (gap > 0).all()
    np.testing.assert_array_equal(rel.predict_interval(f[:5]),
                                  np.column_stack((lo - gap, hi + gap)))


def test_f6_named_half_precision_scores_with_one_float64_value_are_refused(
        accountant: Any) -> None:
    """F6: lac scores rounded to float16 (red team 24's model: P(y=1) = 0.8 or 0.99) are
    refused named; one float64 value among them let them through, and predict's slack (2⁻²¹)
    is far below a half-precision rounding: 0.857 coverage under a recorded ≥ 0.9 over 20
    seeded releases. Refused before the charge; short exact values among float64 ones run."""
    from privcal.errors import InvalidInput

    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(0)
    p1 = np.where(g.random(N) < 0.7, 0.8, 0.99)
    y = (g.random(N) < p1).astype(np.int64)
    s16 = np.where(y == 1, 1 - p1, p1).astype(np.float16).astype(np.float64)
    head = accountant.ledger.head()
    with pytest.raises(InvalidInput, match=r"^scores are values of a format narrower than "
                       r"float32, widened to float64, among float64 ones"):
        accountant.calibrate("split", dataset="d", scores=np.concatenate([s16, [1 / 3]]),
                             alpha=0.1, score="lac")
    assert accountant.ledger.head() == head and accountant.budget("d").charges == 0
    for short in (g.integers(0, 8, N) / 8, g.integers(0, 256, N) / 256):
        accountant.calibrate("split", dataset="d", score="lac", alpha=0.1,
                             scores=np.concatenate([short, g.random(10)]))


def test_f7_a_one_level_release_answers_only_its_own_level(accountant: Any) -> None:
    """F7: a one-level release's ``alpha=`` was matched with ``math.isclose`` (relative 1e-9):
    at α = 0.7, n = 9 (rank 3, exactly 0.3 coverage) ``predict_set(alpha=0.6999999999)`` and
    ``predict_interval(…, alpha=0.6999999999)`` answered with its sets, below the 0.3000000001
    asked. Now within 1e-12, as a several-level release's levels are; 1 − 0.3 in floats still
    names 0.7."""
    from privcal.errors import InvalidInput

    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(0)
    p1 = g.random(9)
    rel = accountant.calibrate("split", dataset="d", probs=np.stack([1 - p1, p1], axis=1),
                               labels=(g.random(9) < p1).astype(int), alpha=0.7, score="lac")
    reg = accountant.calibrate("split", dataset="d", preds=g.random(9), targets=g.random(9),
                               alpha=0.7, score="absolute")
    with pytest.raises(InvalidInput, match=r"one level α = 0\.7"):
        rel.predict_set(np.array([[0.5, 0.5]]), alpha=0.6999999999)
    with pytest.raises(InvalidInput, match=r"one level α = 0\.7"):
        reg.predict_interval(np.zeros(2), alpha=0.6999999999)
    assert rel.predict_set(np.array([[0.5, 0.5]]), alpha=1 - 0.3).shape == (1, 2)
    assert reg.predict_interval(np.zeros(2), alpha=1 - 0.3).shape == (2, 2)
