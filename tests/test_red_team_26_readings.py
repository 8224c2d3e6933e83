"""Red team 26, readings findings: holes in :mod:`privcal.calibrators.readings` (float32
outputs read as the widened array at calibration and as their shortest decimals at predict).

F1: an aps row mixing a float32 entry with a float64 entry between the two readings of it —
their order flips between the readings, the score moves by a whole probability, and the
candidate band dropped the label (0.545 under a recorded ≥ 0.9). F2: cqr with float32 lower
and float64 upper predictions — no widening at all (0.8345). F3: one float64 prediction among
the first 256 rows switched the widening off for the whole file (0.779).

Each statistical test averages the coverage of T seeded releases (N calibration points, M
test points each) and allows three standard deviations of that mean below the recorded
bound: split conformal coverage given the calibration is Beta with variance ≤ α(1−α)/(N+2),
measured on M points (binomial variance ≤ 1/(4M)), so the tolerance is
3·√((α(1−α)/(N+2) + 1/(4M))/T) — 0.0066 at α = 0.1, N = 2000, M = 20 000, T = 12.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from tests.test_red_team_26_coverage import (
    M,
    N,
    T,
    _check_interval_coverage,
    _text,
    _tolerance,
)


def _interval_coverage(rel: Any, preds: np.ndarray, truth: np.ndarray) -> float:
    iv = rel.predict_interval(preds)
    return float(((iv[:, 0] <= truth) & (truth <= iv[:, 1])).mean())


def test_f1_aps_row_mixing_float32_and_float64_entries_covers(accountant: Any) -> None:
    """F1: rows (0.3f, b, 1 − 0.3f − b) with b a float64 value strictly between 0.3f
    widened and its decimal 0.3; labels 0/1/2 with probabilities 0.5/0.1/0.4; aps calibrated
    on the widened rows, sets on the rows as text: 0.545 under ≥ 0.9 before."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    a32 = np.float32(0.3)
    wide, text = float(a32), float(str(a32))
    b = (wide + text) / 2
    assert wide > b > text
    row_wide = np.array([wide, b, 1.0 - wide - b])
    row_text = np.array([text, b, 1.0 - wide - b])
    covs, lower = [], math.nan
    for seed in range(T):
        g = np.random.default_rng(seed)
        y = g.choice(3, size=N + M, p=[0.5, 0.1, 0.4])
        rel = accountant.calibrate("split", dataset="d", probs=np.tile(row_wide, (N, 1)),
                                   labels=y[:N], score="aps", alpha=0.1)
        sets = rel.predict_set(np.tile(row_text, (M, 1)))
        covs.append(float(sets[np.arange(M), y[N:]].mean()))
        lower = rel.coverage.lower
    assert lower == 0.9
    assert float(np.mean(covs)) >= lower - _tolerance(0.1)


def _cqr(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 lower predictions 0.1f·{1, 2, 3}, float64 upper ones 5 + π·10⁻⁹ above them,
    float32 targets f_lo − 0.3 or f_lo + 2 (each half the time)."""
    g = np.random.default_rng(seed)
    lo = np.float32(0.1) * g.integers(1, 4, n).astype(np.float32)
    hi = lo.astype(np.float64) + 5.0 + 1e-9 * np.pi
    y = np.where(g.random(n) < 0.5, lo - np.float32(0.3), lo + np.float32(2.0))
    return lo, hi, y.astype(np.float32)


def test_f2_cqr_with_only_the_lower_predictions_in_float32_covers(accountant: Any) -> None:
    """F2: cqr calibrated on the widened float32 lower band (upper band float64), predicted
    with the lower band as text, scored on the targets as text: 0.8345 under ≥ 0.9 before."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    covs, lower = [], math.nan
    for seed in range(T):
        lo, hi, y = _cqr(seed, N)
        rel = accountant.calibrate("split", dataset="d", score="cqr", alpha=0.1,
                                   preds=np.stack([lo.astype(np.float64), hi], axis=1),
                                   targets=y.astype(np.float64))
        lt, ht, yt = _cqr(1000 + seed, M)
        covs.append(_interval_coverage(rel, np.stack([_text(lt), ht], axis=1), _text(yt)))
        lower = rel.coverage.lower
    assert lower == 0.9
    assert float(np.mean(covs)) >= lower - _tolerance(0.1)


def test_f3_one_float64_prediction_first_keeps_the_widening(accountant: Any) -> None:
    """F3: absolute score calibrated on widened float32 predictions; at predict one float64
    prediction (1.0 + π·10⁻⁹) comes first, then the float32 predictions as text: their
    coverage was 0.779 under ≥ 0.9 before."""

    def read(rel: Any, ft: np.ndarray) -> np.ndarray:
        preds = np.concatenate([[1.0 + 1e-9 * np.pi], _text(ft)])
        return rel.predict_interval(preds)[1:]

    _check_interval_coverage(accountant, read)


def test_float64_inputs_keep_their_sets_and_intervals(accountant: Any) -> None:
    """The fixes add nothing for float64 outputs: aps sets of Dirichlet probabilities equal
    {S ≤ t} with the same uniforms, and absolute intervals are ``score_interval``'s."""
    import random

    from privcal.calibrators.prediction_sets import prediction_sets
    from privcal.calibrators.scores import all_class_scores, score_interval

    q = np.random.default_rng(2).dirichlet([1, 1, 1, 1], M)
    t = 0.8
    np.testing.assert_array_equal(
        prediction_sets("aps", q, t, rng=random.Random(5)),
        all_class_scores("aps", q, rng=random.Random(5)) <= t)
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(3)
    f = g.normal(size=N)
    rel = accountant.calibrate("split", dataset="d", preds=f, targets=f + g.normal(size=N),
                               score="absolute", alpha=0.1)
    ft = g.normal(size=M)
    iv = rel.predict_interval(ft)
    np.testing.assert_array_equal(iv, np.column_stack(score_interval(ft, ft, rel.threshold)))


def test_f4_short_decimal_filter_misses_no_float32_decimal() -> None:
    """F4 (cost): the decimals are converted only where :func:`_short` allows; it must pass
    the shortest decimal of every float32 (2·10⁵ random bit patterns, subnormals included)."""
    from privcal.calibrators.readings import _kinds, _short

    bits = np.random.default_rng(1).integers(1, 0x7F800000, 200_000).astype(np.uint32)
    text = bits.view(np.float32).astype(str).astype(np.float64)
    assert _short(text).all()
    assert _kinds(np.concatenate([text, -text]), np.float32)[2].all()


@pytest.mark.parametrize("density", [0.0, 1e-4, 0.01, 0.5, 1.0])
def test_candidate_rows_are_the_rows_with_a_candidate(density: float) -> None:
    """The lead's review: ``sets_at`` reads the rows of a few candidates off their flat
    indices (``cand.any(axis=1)`` cost as much as a whole lac prediction); any density, any
    shape, it must name exactly the rows ``any(axis=1)`` names, in order."""
    from privcal.calibrators.readings import _candidate_rows

    rng = np.random.default_rng(7)
    for n, k in [(1, 1), (1, 5), (9, 1), (1000, 10), (4000, 3)]:
        cand = rng.random((n, k)) < density
        got = _candidate_rows(cand)
        assert got.tolist() == np.flatnonzero(cand.any(axis=1)).tolist(), (n, k, density)
