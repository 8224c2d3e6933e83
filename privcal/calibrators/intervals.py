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
import warnings
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from privcal.calibrators.evaluation import GroupCoverage
from privcal.calibrators.prediction_sets import (
    computed_outside,
    outside_threshold,
    recorded_score,
    score_name_of,
)
from privcal.calibrators.readings import reading_gap
from privcal.calibrators.scores import SCORES, regression_bounds, score_interval
from privcal.calibrators.validation import check_lengths, check_targets
from privcal.errors import InvalidInput

__all__ = [
    "IntervalEvaluation",
    "evaluate_intervals",
    "is_regression_release",
    "release_intervals",
    "release_lower",
    "release_score_name",
    "release_thresholds",
]


def release_score_name(release: Any, score_name: str | None = None) -> str:
    """The score a release was calibrated on: the recorded one, else ``score_name``.

    A release made from precomputed ``--scores`` records none; the caller says which score
    they were. Naming another score than the recorded one is refused (the threshold is a
    quantile of *that* score).
    """
    name = score_name_of(recorded_score(release))
    if name is not None and score_name is not None and score_name != name:
        raise InvalidInput(f"release {release.id} was calibrated on score {name!r}, "
                           f"not {score_name!r}")
    name = name or score_name
    if name is None:
        raise InvalidInput(f"release {release.id} records no score (calibrated on precomputed "
                           "scores, or by a session opened without --score): say which score "
                           "they were (--score absolute|cqr|lac|aps|raps)")
    if name not in SCORES:
        raise InvalidInput(f"unknown score {name!r} (known: {', '.join(SCORES)})")
    return str(name)


def is_regression_release(release: Any, score_name: str | None = None) -> bool:
    """Whether a release's threshold is for a regression score (so it yields intervals)."""
    return SCORES[release_score_name(release, score_name)].kind == "regression"


def release_thresholds(release: Any, n: int, *, alpha: float | None = None,
                       groups: Any = None) -> np.ndarray:
    """Each row's threshold (shape (n,)): the release's threshold; for a release with
    several levels, the one of level ``alpha``; for one with Mondrian groups from a column,
    that of each row's group (``groups``). Label groups do not apply to regression."""
    from privcal.calibrators.group_sets import is_wrapped, table_of

    if not is_wrapped(release.method):
        if groups is not None:
            raise InvalidInput(f"release {release.id} has no Mondrian groups: give no groups")
        own = (release.params or {}).get("alpha")
        if alpha is not None and not (isinstance(alpha, int | float)
                                      and isinstance(own, int | float) and 0 < alpha < 1
                                      and math.isclose(own, alpha, rel_tol=1e-12)):
            raise InvalidInput(f"release {release.id} is at the one level α = {own}, "
                               f"not {alpha}")
        return np.full(n, float(release.threshold))
    cov = release.coverage
    details = dict(cov.get("details", {}) if isinstance(cov, dict) else cov.details)
    table = table_of(release.method, release.params, release.diagnostics or {}, details)
    col = table.level(alpha)
    if table.groups is None:
        if groups is not None:
            raise InvalidInput("this release has no Mondrian groups; give no groups")
        return np.full(n, float(table.values[0, col]))
    if table.group_by == "label":
        raise InvalidInput("this release's groups are class labels: it gives prediction "
                           "sets, not intervals")
    if groups is None:
        raise InvalidInput("this release has one threshold per group: give the group of "
                           "every row (groups=…, --groups FILE[:COLUMN])")
    return np.asarray(table.values[:, col], dtype=np.float64)[table.group_rows(groups, n)]


def release_intervals(
    release: Any,
    *,
    preds: Any = None,
    lower_preds: Any = None,
    upper_preds: Any = None,
    score_name: str | None = None,
    alpha: float | None = None,
    groups: Any = None,
) -> np.ndarray:
    """The n×2 array [lower, upper] of a release's intervals for new predictions.

    ``absolute``: ``preds`` (n,); ``cqr``: ``lower_preds`` and ``upper_preds`` (or ``preds``
    of shape (n, 2)). Rows are (−inf, +inf) where the threshold is +inf. A release with
    several levels takes ``alpha``, one with Mondrian groups each row's ``groups``. Rows
    whose predictions are float32 values or their decimals are two float32 spacings wider
    (:func:`~privcal.calibrators.readings.reading_gap`: either reading at calibration).
    """
    name = release_score_name(release, score_name)
    if SCORES[name].kind != "regression":
        raise InvalidInput(f"release {release.id} was calibrated on the classification score "
                           f"{name!r}: it gives prediction sets (--probs), not intervals")
    lo, hi = regression_bounds(name, preds=preds, lower_preds=lower_preds,
                               upper_preds=upper_preds)
    crossed = float(np.mean(lo > hi)) if name == "cqr" and lo.size else 0.0
    if crossed > 0.5:  # red team 16: swapped bands gave 0.026 coverage, 91 % empty, silently
        warnings.warn(f"release {release.id}: {crossed:.0%} of the rows have a lower "
                      "prediction above the upper one: are the lower and upper predictions "
                      "swapped? (a few crossed quantiles are normal)", UserWarning, stacklevel=3)
    t = release_thresholds(release, int(lo.shape[0]), alpha=alpha, groups=groups)
    if computed_outside(release):
        t = outside_threshold(t)  # the score named only now (red team 25, coverage F4)
    if np.isnan(t).any():
        raise InvalidInput(f"release {release.id} records a NaN threshold")
    infinite = t == math.inf
    gap = reading_gap(lo, hi, t)  # float32/float16 outputs read either way (red team 26, F3)
    low, high = score_interval(lo, hi, t)  # every y whose float score is ≤ t
    out = np.column_stack((low - gap, high + gap))
    out[infinite] = (-math.inf, math.inf)
    return out


def release_lower(release: Any, *, alpha: float | None = None) -> float:
    """The guaranteed coverage to evaluate against: the release's; for several levels, that
    of level ``alpha``; for Mondrian groups, the smallest group bound at that level (each
    group is covered at its own bound, so the mixture at least at the smallest)."""
    from privcal.calibrators.group_sets import is_wrapped, table_of

    cov = release.coverage
    if not is_wrapped(release.method):
        return float(cov.get("lower") if isinstance(cov, dict) else cov.lower)
    details = dict(cov.get("details", {}) if isinstance(cov, dict) else cov.details)
    table = table_of(release.method, release.params, release.diagnostics or {}, details)
    return float(np.min(table.lowers[:, table.level(alpha)]))


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
    #: the guarantee is marginal: a shortfall of one release is no evidence against it
    #: (:func:`~privcal.calibrators.evaluation.is_marginal`)
    marginal: bool = False
    #: marginal and not consistent: a bound on the probability, under the guarantee, of a
    #: test result as low as this one (so few of ``n`` points covered), over the release and
    #: the test points, and how it was derived (:mod:`privcal.calibrators.shortfall`); None
    #: otherwise
    shortfall_probability: float | None = None
    shortfall_bound: str | None = None
    #: per-group coverage and mean length of a Mondrian release, each group against its own
    #: bound (None for others)
    by_group: list[GroupCoverage] | None = None


def evaluate_intervals(intervals: Any, targets: Any, lower: float,
                       marginal: bool = False, *,
                       groups: tuple[np.ndarray, tuple[str, ...], np.ndarray] | None = None
                       ) -> IntervalEvaluation:
    """Empirical coverage (lo ≤ y ≤ hi) and interval lengths, against the guaranteed ``lower``.

    ``consistent_with_guarantee``: the one-sided 95% Clopper–Pearson upper bound of the
    empirical coverage reaches ``lower`` (as for prediction sets). ``groups`` (a Mondrian
    release's: each row's group index, the group names, each group's lower bound) adds
    ``by_group``, each group against its own bound (red team 19: a group covered at 0.42
    against its 0.9 was reported only as the marginal 0.94, "meets").
    """
    from privcal.calibrators.evaluation import (
        coverage_by_group,
        coverage_check,
        evaluation_note,
    )

    iv = np.asarray(intervals, dtype=np.float64)
    if iv.ndim != 2 or iv.shape[1] != 2:
        raise InvalidInput(f"intervals must be an n×2 array [lower, upper], got {iv.shape}")
    y = check_targets(targets, min_rows=1)
    check_lengths(intervals=iv, targets=y)
    lo, hi = iv[:, 0], iv[:, 1]
    n = int(y.shape[0])
    hits = (lo <= y) & (y <= hi)
    covered = int(hits.sum())
    infinite = ~(np.isfinite(lo) & np.isfinite(hi))
    with np.errstate(invalid="ignore"):
        length = np.where(infinite, math.inf, np.maximum(hi - lo, 0.0))
    n_inf = int(infinite.sum())
    finite = length[~infinite]
    by_group = None if groups is None else coverage_by_group(hits, *groups, marginal,
                                                              lengths=length)
    return IntervalEvaluation(
        n=n,
        mean_length=math.inf if n_inf else float(length.mean()),
        median_length=float(np.median(length)),
        mean_finite_length=float(finite.mean()) if finite.size else None,
        infinite_count=n_inf,
        infinite_fraction=n_inf / n,
        empty_fraction=float((lo > hi).mean()),
        **coverage_check(covered, n, lower, marginal),
        note=evaluation_note(marginal)
        + (f"; {n_inf} of {n} intervals are (−∞, +∞) (the threshold is +∞): they count "
           "as covering and make mean_length +∞, mean_finite_length leaves them out"
           if n_inf else ""),
        by_group=by_group,
    )
