"""Split conformal calibration, the non-private baseline (SPEC §2).

Vovk, Gammerman, Shafer, *Algorithmic Learning in a Random World* (2005);
Lei, G'Sell, Rinaldo, Tibshirani, Wasserman, *Distribution-Free Predictive
Inference for Regression* (JASA 2018), Thm 2.2 (the 1−α+1/(n+1) upper bound);
as summarised in Romanus & Molinari (seed 003), §2, eq. for Ĉ(X_test).

Review (issue 14.8): **privacy** none (allowed only on a dataset whose policy
permits non-private releases); no sensitivity or sampler. **Coverage**:
P(Y ∈ C(X)) ≥ 1−α marginally over the calibration data and the test point,
≤ 1−α+1/(n+1) without ties; assumptions: (i) exchangeable scores (the user's
data), (ii) none on their range (the r-th smallest raw score, +∞ when r > n).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import ClassVar

import numpy as np

from privcal.calibrators.base import (
    CalibrationInput,
    CalibrationResult,
    CalibratorParams,
    CoverageGuarantee,
    DataShape,
    PrivacyModel,
    conformal_rank,
)
from privcal.calibrators.bound_floats import (
    float_at_least,
    float_at_most,
    text_at_least,
    text_at_most,
)
from privcal.calibrators.validation import check_scores
from privcal.errors import InvalidInput

__all__ = ["SplitConformal", "SplitParams", "kth_smallest"]


class SplitParams(CalibratorParams):
    """Split conformal takes only α."""


def kth_smallest(scores: np.ndarray, r: int) -> float:
    """The r-th smallest value (1-based) in O(n) with ``np.partition``; +inf when r > n."""
    n = scores.shape[0]
    if r < 1:
        raise InvalidInput(f"rank must be ≥ 1, got {r}")
    if r > n:
        return math.inf
    return float(np.partition(scores, r - 1)[r - 1])


def _scores(data: CalibrationInput) -> np.ndarray:
    if data.scores is None:
        raise InvalidInput(
            "this calibrator needs scores (pass --scores, or probs, labels and a score)"
        )
    return check_scores(data.scores)


class SplitConformal:
    """Split conformal prediction: the ⌈(n+1)(1−α)⌉-th smallest score, no privacy."""

    name: ClassVar[str] = "split"
    version: ClassVar[str] = "1.0.0"
    privacy_model: ClassVar[PrivacyModel] = "none"
    #: its scores: at least two, finite (``_scores``), checked before the charge
    min_scores: ClassVar[int] = 2
    Params: ClassVar[type[CalibratorParams]] = SplitParams
    inputs: ClassVar[frozenset[str]] = frozenset({"scores"})
    summary: ClassVar[str] = (
        "split conformal (non-private): the ⌈(n+1)(1−α)⌉-th smallest calibration score"
    )

    def cost(self, params: SplitParams, shape: DataShape) -> None:
        """Non-private: no privacy cost (the accountant refuses it unless the dataset allows it)."""
        return None

    def guarantee(self, params: SplitParams, shape: DataShape) -> CoverageGuarantee:
        """Marginal coverage ≥ 1−α; ≤ 1−α+1/(n+1) when scores have no ties (Lei et al. 2018).

        Both are r/(n+1) in the proof; a float past it is recorded as the nearest float on the
        proof's side (:mod:`~privcal.calibrators.bound_floats`): a release recorded before
        that check with such a figure (e.g. α = 0.7, n = 9: 0.30000000000000004) stated more
        than the proof gives, and ``privcal audit verify`` now reports it."""
        n, alpha = shape.n, params.alpha
        r = conformal_rank(n, alpha)
        if r > n:
            return CoverageGuarantee(
                target=1 - alpha,
                lower=1.0,
                upper=1.0,
                failure_probability=0.0,
                over="calibration data and test point (marginal)",
                rank=r,
                statement=(
                    f"rank {r} exceeds n = {n}: the threshold is +inf and every set "
                    "contains every label (coverage 1)"
                ),
                details={"n": n, "alpha": alpha, "rank": r},
            )
        # the proof: P(Y ∈ C(X)) ≥ r/(n+1), = r/(n+1) without ties (r exact). The floats
        # 1−α and 1−α+1/(n+1) are recorded as they always were unless one is past it (α = 0.7,
        # n = 9 gave 0.30000000000000004 > 3/10): bound_floats, which also says why
        exact = Fraction(r, n + 1)
        lower = float_at_most(1 - alpha, exact)
        upper = float_at_least(min(1.0, 1 - alpha + 1 / (n + 1)), exact)
        return CoverageGuarantee(
            target=1 - alpha,
            lower=lower,
            upper=upper,
            failure_probability=0.0,
            over="calibration data and test point (marginal)",
            rank=r,
            statement=(
                f"P(Y ∈ C(X)) ≥ {text_at_most(1 - alpha, exact)} over calibration data and "
                f"test point; ≤ {text_at_least(upper, exact)} when the scores have no ties"
            ),
            details={"n": n, "alpha": alpha, "rank": r, "upper_requires": "no ties"},
        )

    def calibrate(
        self, data: CalibrationInput, params: SplitParams, rng: random.Random
    ) -> CalibrationResult:
        """Threshold = r-th smallest score, r = ⌈(n+1)(1−α)⌉ exactly; +inf if r > n (SPEC §2).

        The guarantee's upper bound holds only for scores without ties (red team 7: scores in
        {0, 0.5, 1} at n = 20, α = 0.1 cover 0.988 against a stated ≤ 0.948). This method is
        not private and sees the scores, so it says when they tie at the threshold, where a
        tie moves coverage above the bound (by the probability of the tied value):
        ``tied_at_threshold`` in the diagnostics, the other calibration scores equal to the
        threshold (one O(n) pass; ``release show`` and ``calibrate`` print it)."""
        s = _scores(data)
        n = s.shape[0]
        r = conformal_rank(n, params.alpha)
        t = kth_smallest(s, r)
        tied = int(np.count_nonzero(s == t)) - 1 if math.isfinite(t) else 0
        return CalibrationResult(threshold=t,
                                 diagnostics={"n": n, "rank": r, "tied_at_threshold": tied})
