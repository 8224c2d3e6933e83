"""``only_infinite``: a run that can only release +∞ whatever the data, said by the
calibrator that knows why (the dry run's ``trivial``; red team 19, newcomer F4)."""

from __future__ import annotations

import math
import random
from typing import Any

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


def _ledger() -> Any:
    from privcal import Accountant, Ledger

    acct = Accountant(Ledger("sqlite://"))
    acct.create_dataset("d", rho=50, allow_nonprivate=True)
    return acct


@pytest.mark.parametrize(("n", "said"), [(60, False), (5, True)])
def test_several_levels_are_trivial_only_when_every_level_is(n: int, said: bool) -> None:
    """Red team 20, coverage F1: a levels run's headline is its smallest α's, so the dry run
    said "+inf only, whatever the data" of α = 0.01, 0.3 at n = 60 — and the run released
    a finite α = 0.3 threshold. Each outcome is checked against the run itself."""
    from privcal.accountant.calibration import dry_run

    acct = _ledger()
    s = np.random.default_rng(n).random(n)
    d = dry_run(acct, "pcoqs", {"alpha": [0.01, 0.3], "rho": 0.5}, dataset="d", scores=s)
    assert d.trivial is said
    rel = acct.calibrate("pcoqs", dataset="d", alpha=[0.01, 0.3], rho=0.5, scores=s)
    finite = [x["threshold"] for x in rel.diagnostics["levels"]
              if math.isfinite(float(x["threshold"]))]
    assert bool(finite) is not said  # n = 60: the α = 0.3 level is finite here (and in
    # most seeds); n = 5: no level can be


def test_a_mondrian_run_is_trivial_only_when_every_group_is() -> None:
    """One group large enough, one too small: not trivial; both too small: trivial."""
    from privcal.accountant.calibration import dry_run

    acct = _ledger()
    for sizes, said in (((100, 3), False), ((4, 3), True)):
        groups = np.repeat([0, 1], sizes)
        s = np.random.default_rng(1).random(len(groups))
        d = dry_run(acct, "split", {"alpha": 0.1}, dataset="d", scores=s, groups=groups,
                    public_groups=True)
        assert d.trivial is said, sizes


@pytest.mark.parametrize(("sizes", "said"), [((1, 1, 1, 5), True), ((3, 4), True),
                                              ((1, 1, 1, 9, 9, 9, 9, 9, 9, 9, 9), False)])
def test_fedcp_qq_is_trivial_when_fewer_than_k_messages_can_be_finite(
        sizes: tuple[int, ...], said: bool) -> None:
    """Red team 20, coverage F2: with unequal sizes every agent of n_j < ⌈(1−α)(n_j+1)⌉
    sends +∞; (1, 1, 1, 5) at α = 0.1 releases +∞ whatever the data, and the dry run said
    not trivial. The run confirms each verdict."""
    from privcal.accountant.calibration import dry_run

    acct = _ledger()
    agents = np.repeat(np.arange(len(sizes)), sizes)
    s = np.random.default_rng(0).random(len(agents))
    d = dry_run(acct, "fedcp-qq", {"alpha": 0.1}, dataset="d", scores=s, agents=agents)
    assert d.trivial is said
    rel = acct.calibrate("fedcp-qq", dataset="d", scores=s, agents=agents, alpha=0.1)
    assert math.isinf(rel.threshold) is said
