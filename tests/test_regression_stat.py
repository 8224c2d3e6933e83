"""Statistical validity of regression intervals (issue 12): over 200 seeded trials on a
heteroscedastic, heavy-tailed regression distribution, the intervals' coverage meets each
method's recorded guarantee, for the ``absolute`` and ``cqr`` scores.

Distribution: X ~ U(0, 2), Y = 2 sin(2X) + σ(X)·T₅ with σ(x) = 0.2 + x²/2 and T₅ a
Student t with 5 degrees of freedom. The point model is biased (f = 2 sin(2x) + 0.1) and
the quantile band is misspecified (f ± 1.2 σ), so conformal calibration has work to do.

Each trial calibrates on 1000 fresh points and measures coverage on 1000 others; the mean
over trials estimates the marginal coverage P(Y ∈ C(X)) the guarantees speak of. The test
is one-sided at three standard errors of that mean (its standard deviation estimated from
the trials). The calibration goes through the library's own path (``prepare`` → the
calibrator → ``release_intervals``) without a ledger, so that 200 trials stay fast.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from privcal.accountant.prepare import prepare
from privcal.calibrators.intervals import release_intervals

TRIALS = 200
N_CAL, N_TEST = 1000, 1000
ALPHA = 0.1

#: (method, parameters, score range for absolute, for cqr); fedcp methods: 10 agents × 100
METHODS: list[tuple[str, dict[str, Any], Any, Any]] = [
    ("split", {}, None, None),
    ("pcoqs", {"rho": 1.0}, (0, 8), (-3, 8)),
    ("exponq", {"epsilon": 2.0}, (0, 8), (-3, 8)),
    ("fedcp-qq", {}, None, None),
    ("fedcp2-qq", {"epsilon": 5.0}, (0, 8), (-3, 8)),
]


def _draw(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    x = rng.uniform(0, 2, n)
    sigma = 0.2 + x**2 / 2
    f = 2 * np.sin(2 * x) + 0.1
    y = 2 * np.sin(2 * x) + sigma * rng.standard_t(5, n)
    return {"y": y, "f": f, "lo": f - 1.2 * sigma, "hi": f + 1.2 * sigma}


def _preds(d: dict[str, np.ndarray], score: str, rows: slice) -> dict[str, np.ndarray]:
    if score == "absolute":
        return {"preds": d["f"][rows]}
    return {"lower_preds": d["lo"][rows], "upper_preds": d["hi"][rows]}


@pytest.mark.parametrize("score", ["absolute", "cqr"])
@pytest.mark.parametrize(("method", "params", "range_abs", "range_cqr"), METHODS,
                         ids=[m[0] for m in METHODS])
def test_interval_coverage_meets_the_recorded_guarantee(
    method: str, params: dict[str, Any], range_abs: Any, range_cqr: Any, score: str
) -> None:
    score_range = range_abs if score == "absolute" else range_cqr
    agents = ({"agents": np.repeat(np.arange(10), N_CAL // 10)}
              if method.startswith("fedcp") else {})
    cal, test = slice(0, N_CAL), slice(N_CAL, N_CAL + N_TEST)
    cov, lowers, uppers, infinite = [], set(), set(), 0
    for trial in range(TRIALS):
        d = _draw(np.random.default_rng([12, trial]), N_CAL + N_TEST)
        prep = prepare(method, {"alpha": ALPHA, **params}, targets=d["y"][cal], score=score,
                       score_range=score_range, **_preds(d, score, cal), **agents)
        res = prep.calibrator.calibrate(prep.data, prep.params, random.Random(trial))
        g = prep.calibrator.guarantee(prep.params, prep.shape)
        lowers.add(g.lower)
        uppers.add(g.upper)
        infinite += math.isinf(res.threshold)
        release = SimpleNamespace(id=trial, method=method, threshold=res.threshold,
                                  params=prep.params.model_dump(),
                                  diagnostics={"score": prep.score})
        iv = release_intervals(release, **_preds(d, score, test))
        y = d["y"][test]
        cov.append(float(((iv[:, 0] <= y) & (y <= iv[:, 1])).mean()))
    (lower,) = lowers  # the same n every trial: one recorded bound
    mean, se = float(np.mean(cov)), float(np.std(cov, ddof=1)) / math.sqrt(TRIALS)
    assert mean >= lower - 3 * se, (method, score, mean, lower, se)
    # informative intervals, not a trivial pass: almost every threshold is finite
    assert infinite <= TRIALS // 20, (method, score, infinite)
    if method == "split":  # exact: also at most 1 − α + 1/(n+1) (continuous scores)
        (upper,) = uppers
        assert mean <= upper + 3 * se, (mean, upper, se)
