"""Statistical validity of Mondrian (class-conditional) calibration (issue 12 part B).

Two classes of very different difficulty, with exactly known score distributions (lac
score 1 − p_y): the easy class 0 (70%) has p_0 ~ Beta(8, 1), so its score ~ Beta(1, 8);
the hard class 1 has p_1 ~ U(0, 1), so its score ~ U(0, 1). A threshold t's true
conditional coverage is 1 − (1 − t)^8 for class 0 and t for class 1 — computed exactly,
no test set. Marginal split calibration at α = 0.1 lands near t ≈ 0.667: the hard class
is covered ≈ 67% of the time. Mondrian calibration covers each class at ≥ 1 − α.
Seeded, 300 trials each.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats

from privcal.calibrators import registry
from privcal.calibrators.base import CalibrationInput, DataShape

TRIALS = 300
ALPHA = 0.1


def _draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    y = (rng.random(n) < 0.3).astype(np.int64)
    s = np.where(y == 0, rng.beta(1, 8, n), rng.random(n))
    return s, y


def _coverage(t: float) -> tuple[float, float]:
    t = min(max(t, 0.0), 1.0)
    return 1 - (1 - t) ** 8, t


def _mondrian(method: str, params: dict, s: np.ndarray, y: np.ndarray, seed: int) -> tuple:
    cal = registry.get(f"mondrian:{method}").calibrator
    p = cal.Params.model_validate({**params, "groups": ["0", "1"], "group_by": "label",
                                   "public_groups": True})
    res = cal.calibrate(CalibrationInput(scores=s, groups=y, group_count=2), p,
                        random.Random(seed))
    g = cal.guarantee(p, DataShape(n=s.shape[0], group_sizes=tuple(np.bincount(y, minlength=2))))
    return res, g


@pytest.mark.statistical
def test_marginal_split_under_covers_the_hard_class_mondrian_does_not() -> None:
    rng = np.random.default_rng(20261123)
    split = registry.get("split").calibrator
    marginal, mondrian = [], []
    for trial in range(TRIALS):
        s, y = _draw(rng, 1000)
        t = split.calibrate(CalibrationInput(scores=s), split.Params(alpha=ALPHA),
                            random.Random(trial)).threshold
        marginal.append(_coverage(t))
        res, _ = _mondrian("split", {"alpha": ALPHA}, s, y, trial)
        ts = [g["threshold"] for g in res.diagnostics["groups"]]
        mondrian.append((_coverage(ts[0])[0], _coverage(ts[1])[1]))
    m = np.array(marginal)
    w = np.array(mondrian)
    # marginal: the mixture is covered (≥ 1 − α on average) but the hard class is not
    assert np.mean(0.7 * m[:, 0] + 0.3 * m[:, 1]) >= 1 - ALPHA - 0.005
    assert m[:, 1].mean() < 1 - ALPHA - 0.15
    # Mondrian: each class at ≥ 1 − α on average over calibration sets (split conformal's
    # guarantee is in expectation), to within 3 standard errors
    for c in (0, 1):
        se = w[:, c].std(ddof=1) / math.sqrt(TRIALS)
        assert w[:, c].mean() >= 1 - ALPHA - 3 * se, (c, w[:, c].mean())


@pytest.mark.statistical
def test_private_mondrian_meets_each_class_recorded_bound() -> None:
    """P-COQS per class at two levels. P-COQS's guarantee (coverage ≥ 1 − α over data and
    test point, with probability ≥ 1 − β over the noise) rests on the event that the
    threshold has at least ⌈(n_g+1)(1−α)⌉ of the class's scores below it: that event fails
    in at most β of the trials (binomial tail at 1e-4), for each class and level; and each
    class's mean true coverage is ≥ (1 − β)·lower (3 standard errors), as in
    tests/test_pcoqs.py::test_coverage_statistics."""
    rng = np.random.default_rng(77)
    beta = 0.05
    keys = [(c, a) for c in (0, 1) for a in (0.1, 0.2)]
    bad = dict.fromkeys(keys, 0)
    cover: dict[tuple[int, float], list[float]] = {key: [] for key in keys}
    lowers: dict[tuple[int, float], float] = {}
    for trial in range(TRIALS):
        s, y = _draw(rng, 2000)
        res, g = _mondrian("levels:pcoqs", {"alpha": [0.1, 0.2], "rho": 1.0,
                                            "failure_probability": beta}, s, y, trial)
        for c, grp in enumerate(res.diagnostics["groups"]):
            sc = s[y == c]
            for lev in grp["diagnostics"]["levels"]:
                a = lev["alpha"]
                t = lev["threshold"]
                assert math.isfinite(t)
                bad[(c, a)] += int((sc <= t).sum()) < math.ceil((sc.shape[0] + 1) * (1 - a))
                cover[(c, a)].append(_coverage(t)[c])
                lowers[(c, a)] = float(g.details[f"group {c}: alpha={a:g}: lower"])
    allowed = stats.binom.isf(1e-4, TRIALS, beta)
    for key in keys:
        assert bad[key] <= allowed, (key, bad[key])
        cv = np.array(cover[key])
        se = cv.std(ddof=1) / math.sqrt(TRIALS)
        assert lowers[key] == 1 - key[1]
        assert cv.mean() >= (1 - beta) * lowers[key] - 3 * se, (key, cv.mean())
