"""Red team 25 (second wave), coverage2 findings: half-precision scores privcal did not
compute, calibrated without naming the score and named only at predict (F1)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

N, M, T = 2000, 20_000, 12


def _model(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A discrete two-class model (P(y=1) = 0.8 or 0.99, weights 0.7 / 0.3; red team 24's)
    with float64 probabilities, and labels drawn from them."""
    g = np.random.default_rng(seed)
    p1 = np.where(g.random(n) < 0.7, 0.8, 0.99)
    y = (g.random(n) < p1).astype(np.int64)
    return np.stack([1 - p1, p1], axis=1), y


def _tolerance(alpha: float) -> float:
    """Three sds of the mean of T release coverages: each is Beta-distributed around 1 − α
    given its calibration (split conformal: variance ≤ α(1−α)/(n+2)), measured on M points
    (binomial variance ≤ 1/(4M))."""
    return 3 * math.sqrt((alpha * (1 - alpha) / (N + 2) + 0.25 / M) / T)


def test_f1_half_precision_scores_calibrated_unnamed_then_named_at_predict_cover(
        accountant: Any) -> None:
    """F1: lac scores rounded to float16 (then widened), calibrated without naming the
    score, predicted with ``score_name="lac"``: the float64 1 − p of a label whose float16
    score is the threshold lies up to half a float16 spacing above it (2⁻¹² relative), far
    beyond the float32 slack (2⁻²¹), and every test point tied with it fell out — 0.857
    under a recorded ≥ 0.9. Every label whose float16 score is ≤ t must be in its set."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    covs, lower = [], math.nan
    for seed in range(T):
        probs, y = _model(seed, N)
        s = (1 - probs[np.arange(N), y]).astype(np.float16).astype(np.float64)
        rel = accountant.calibrate("split", dataset="d", scores=s, alpha=0.1)
        pt, yt = _model(10_000 + seed, M)
        sets = rel.predict_set(pt, score_name="lac")
        half = (1 - pt).astype(np.float16).astype(np.float64)
        assert sets[half <= rel.threshold].all()
        covs.append(float(sets[np.arange(M), yt].mean()))
        lower = rel.coverage.lower
    assert lower == 0.9
    assert float(np.mean(covs)) >= lower - _tolerance(0.1)


def test_f1_the_half_precision_slack_never_reaches_the_next_float16_value() -> None:
    """F1's slack from a float16 threshold t stays below the next float16 value above t (so a
    short dyadic grid k/8, q/2⁸ keeps its sets exactly), and is at least half the spacing."""
    from privcal.calibrators.prediction_sets import outside_threshold

    halves = np.arange(0, 0x7C00, 7, dtype=np.uint16).view(np.float16)  # finite, ≥ 0
    for h in np.concatenate([halves, -halves[1:]]):
        t = float(h)
        up = float(np.nextafter(h, np.float16(np.inf)))
        got = outside_threshold(t)
        assert got >= t + (up - t) / 2 if math.isfinite(up) else got >= t + 16
        assert got < up or not math.isfinite(up)
    for t in (0.375, 0.5, 0.75, 1.0 - 3 / 256):
        grid = np.arange(257) / 256
        assert (grid <= outside_threshold(t)).sum() == (grid <= t).sum()
