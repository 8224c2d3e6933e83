"""``only_infinite``: a run that can only release +∞ whatever the data, said by the
calibrator that knows why (the dry run's ``trivial``; red team 19, newcomer F4)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from privcal.calibrators.base import CalibrationInput, DataShape, only_infinite
from privcal.calibrators.ldp_label import LDPLabel, LDPLabelParams
from privcal.calibrators.ldp_score import LDPScore, LDPScoreParams
from privcal.calibrators.split import SplitConformal, SplitParams


@pytest.mark.parametrize("n", [5, 40, 400, 3000])
def test_ldp_score_says_so_exactly_when_no_data_can_lower_the_threshold(n: int) -> None:
    """Where it says +∞ only, even scores that all answer "yes" (every score −∞, so every
    true report is 1) release +∞ in every seeded trial; where it does not, they release a
    finite threshold at least once (the claim is not "always +∞")."""
    cal, p = LDPScore(), LDPScoreParams(alpha=0.1, epsilon=2, bound="exact")
    shape = DataShape(n=n)
    said = only_infinite(cal, p, shape, cal.guarantee(p, shape))
    best = CalibrationInput(scores=np.full(n, -np.inf))
    got = [cal.calibrate(best, p, random.Random(seed)).threshold for seed in range(20)]
    if said:
        assert all(math.isinf(t) for t in got)
    else:
        assert any(math.isfinite(t) for t in got)
    assert said == (n <= 40)  # the cut-off beyond a round's size only for the small n


@pytest.mark.parametrize(("n", "epsilon", "said"), [(3000, 2, True), (3000, 8, False),
                                                    (50, 8, True), (10**6, 2, False)])
def test_ldp_label_says_so_when_its_target_exceeds_one(n: int, epsilon: float,
                                                        said: bool) -> None:
    """1−α+Δ_L > 1: no corrected coverage reaches it, so even labels the noise left
    untouched, on a model that is always right, release +∞."""
    cal, p = LDPLabel(), LDPLabelParams(alpha=0.1, epsilon=epsilon)
    shape = DataShape(n=n, k=10)
    assert only_infinite(cal, p, shape, cal.guarantee(p, shape)) is said
    if said and n <= 3000:
        probs = np.full((n, 10), 0.01)
        probs[:, 0] = 0.91
        data = CalibrationInput(probs=probs, labels=np.zeros(n, dtype=np.int64))
        assert math.isinf(cal.calibrate(data, p, random.Random(0)).threshold)


def test_a_method_without_its_own_rule_is_trivial_only_at_coverage_one() -> None:
    """Split conformal (no ``only_infinite``): trivial exactly when its rank exceeds n,
    which its guarantee states as coverage 1 (n = 8 at α = 0.1 needs rank 9 + 1 > 8)."""
    cal = SplitConformal()
    assert not hasattr(cal, "only_infinite")
    p = SplitParams(alpha=0.1)
    for n, said in ((8, True), (9, False), (100, False)):
        shape = DataShape(n=n)
        assert only_infinite(cal, p, shape, cal.guarantee(p, shape)) is said, n
