"""Regression intervals of a released threshold, and their evaluation on held-out data.

A release calibrated on a regression score (``absolute`` or ``cqr``, see
:mod:`privcal.calibrators.scores`) yields, for new predictions, the interval
{y : S(x, y) ≤ t} = [f_lo(x) − t, f_hi(x) + t] (Romano, Patterson, Candès 2019,
eq. (7); f_lo = f_hi = f for ``absolute``, Lei et al. 2018 §2.2). A threshold of
+∞ (the private methods release it when their guarantee cannot be reached) gives
(−∞, +∞): never a clipped finite interval.

The release is read duck-typed (``threshold``, ``diagnostics``, ``id``), so this
module needs neither the ledger nor the accountant.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from privcal.calibrators.prediction_sets import regression_interval
from privcal.calibrators.scores import SCORES
from privcal.calibrators.validation import check_lengths, check_targets
from privcal.errors import InvalidInput

__all__ = [
    "IntervalEvaluation",
    "evaluate_intervals",
    "is_regression_release",
    "release_intervals",
    "release_score_name",
]


def release_score_name(release: Any, score_name: str | None = None) -> str:
    """The score a release was calibrated on: the recorded one, else ``score_name``.

    A release made from precomputed ``--scores`` records none; the caller says which score
    they were. Naming another score than the recorded one is refused (the threshold is a
    quantile of *that* score).
    """
    recorded = ((getattr(release, "diagnostics", None) or {}).get("score") or {})
    name = recorded.get("name") if isinstance(recorded, dict) else recorded
    if name is not None and score_name is not None and score_name != name:
        raise InvalidInput(f"release {release.id} was calibrated on score {name!r}, "
                           f"not {score_name!r}")
    name = name or score_name
    if name is None:
        raise InvalidInput(f"release {release.id} was calibrated on precomputed scores; say "
                           "which score they were (--score absolute|cqr|lac|aps|raps)")
    if name not in SCORES:
        raise InvalidInput(f"unknown score {name!r} (known: {', '.join(SCORES)})")
    return str(name)


def is_regression_release(release: Any, score_name: str | None = None) -> bool:
    """Whether a release's threshold is for a regression score (so it yields intervals)."""
    return SCORES[release_score_name(release, score_name)].kind == "regression"


def release_intervals(
    release: Any,
    *,
    preds: Any = None,
    lower_preds: Any = None,
    upper_preds: Any = None,
    score_name: str | None = None,
) -> np.ndarray:
    """The n×2 array [lower, upper] of a release's intervals for new predictions.

    ``absolute``: ``preds`` (n,); ``cqr``: ``lower_preds`` and ``upper_preds`` (or ``preds``
    of shape (n, 2)). Rows are (−inf, +inf) when the threshold is +inf.
    """
    name = release_score_name(release, score_name)
    if SCORES[name].kind != "regression":
        raise InvalidInput(f"release {release.id} was calibrated on the classification score "
                           f"{name!r}: it gives prediction sets (--probs), not intervals")
    lo, hi = regression_interval(name, preds, release.threshold, lower_preds=lower_preds,
                                 upper_preds=upper_preds)
    return np.column_stack([lo, hi])


class IntervalEvaluation(BaseModel):
    """Held-out coverage and length of regression intervals, against the guaranteed level.

    Infinite intervals (a +∞ threshold) are counted in ``infinite_count``; they make
    ``mean_length`` +∞, and ``mean_finite_length`` averages the others (None when none is
    finite).
    """

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")

    n: int
    coverage: float
    mean_length: float
    median_length: float
    mean_finite_length: float | None
    infinite_count: int
    infinite_fraction: float
    empty_fraction: float
    guaranteed_lower: float
    meets_guarantee: bool
    coverage_upper_95: float
    consistent_with_guarantee: bool
    note: str


def evaluate_intervals(intervals: Any, targets: Any, lower: float) -> IntervalEvaluation:
    """Empirical coverage (lo ≤ y ≤ hi) and interval lengths, against the guaranteed ``lower``.

    ``consistent_with_guarantee``: the one-sided 95% Clopper–Pearson upper bound of the
    empirical coverage reaches ``lower`` (as for prediction sets).
    """
    from scipy.stats import beta as beta_dist

    iv = np.asarray(intervals, dtype=np.float64)
    if iv.ndim != 2 or iv.shape[1] != 2:
        raise InvalidInput(f"intervals must be an n×2 array [lower, upper], got {iv.shape}")
    y = check_targets(targets, min_rows=1)
    check_lengths(intervals=iv, targets=y)
    lo, hi = iv[:, 0], iv[:, 1]
    n = int(y.shape[0])
    covered = int(((lo <= y) & (y <= hi)).sum())
    infinite = ~(np.isfinite(lo) & np.isfinite(hi))
    with np.errstate(invalid="ignore"):
        length = np.where(infinite, math.inf, np.maximum(hi - lo, 0.0))
    n_inf = int(infinite.sum())
    finite = length[~infinite]
    upper = 1.0 if covered == n else float(beta_dist.ppf(0.95, covered + 1, n - covered))
    cov = covered / n
    return IntervalEvaluation(
        n=n,
        coverage=cov,
        mean_length=math.inf if n_inf else float(length.mean()),
        median_length=float(np.median(length)),
        mean_finite_length=float(finite.mean()) if finite.size else None,
        infinite_count=n_inf,
        infinite_fraction=n_inf / n,
        empty_fraction=float((lo > hi).mean()),
        guaranteed_lower=lower,
        meets_guarantee=cov >= lower,
        coverage_upper_95=upper,
        consistent_with_guarantee=upper >= lower or math.isclose(upper, lower),
        note=(
            "empirical coverage on a finite test set fluctuates around the true coverage; "
            "'consistent' means the 95% upper bound reaches the guaranteed level"
            + (f"; {n_inf} of {n} intervals are (−∞, +∞) (the threshold is +∞): they count "
               "as covering and make mean_length +∞, mean_finite_length leaves them out"
               if n_inf else "")
        ),
    )
