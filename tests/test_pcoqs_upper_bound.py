"""P-COQS's recorded upper coverage bound needs every score in [lower, upper] (red team).

A score below ``lower`` is counted at every step of the search: when more than 1−α of the
score mass lies below the range, every count clears the target rank, ``right`` falls to the
bottom of the range, ``left`` never moves, and the coverage is at least that mass — above
the recorded ``upper``. A score above ``upper`` is never counted and can leave the release
at +∞ (coverage 1). Neither is checkable without spending privacy, so since calibrator
version 2.1.0 ``upper_requires`` names the range; releases of 1.0.0 / 2.0.0 keep verifying by
the text they recorded.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from privcal import Accountant
from privcal.accountant.releases import record_release
from privcal.calibrators.base import CalibrationInput, DataShape
from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
from privcal.calibrators.registry import get
from privcal.costs import parse_cost
from privcal.errors import AuditFailed
from tests.seeded import Seeded

#: the mass of the score distribution below the public range [0, 1]
BELOW = 0.99


def _coverage_given_threshold(t: float) -> float:
    """P(S ≤ t) exactly for S = −1 w.p. BELOW, else U(0, 1) (t ≥ 0 or +∞)."""
    return 1.0 if math.isinf(t) else BELOW + (1 - BELOW) * min(max(t, 0.0), 1.0)


def test_mass_below_lower_exceeds_the_recorded_upper_bound() -> None:
    """Many seeded trials: every release's coverage (exact, the distribution is known) is
    ≥ BELOW, above the recorded upper bound even after granting it the failure probability
    β; the recorded ``upper_requires`` says the bound needs every score in [lower, upper]."""
    cal = PCOQS()
    n, trials = 1000, 200
    params = PCOQSParams(alpha=0.1, rho=1.0, failure_probability=0.001)
    g = cal.guarantee(params, DataShape(n=n))
    assert g.upper is not None and g.upper < 0.95  # the claim is informative here
    rng_data = np.random.default_rng(20261123)
    rng = random.Random(7)
    cov = []
    for _ in range(trials):
        below = rng_data.random(n) < BELOW
        s = np.where(below, -1.0, rng_data.random(n))
        res = cal.calibrate(CalibrationInput(scores=s), params, rng)
        cov.append(_coverage_given_threshold(res.threshold))
    # marginal coverage ≤ (1−β)·upper + β if the claim held on E; each trial's coverage is
    # ≥ BELOW by construction (threshold ≥ lower = 0), so no sampling tolerance is needed
    assert min(cov) >= BELOW > (1 - g.failure_probability) * g.upper + g.failure_probability
    assert float(np.mean(cov)) > g.upper + 0.05
    req = str(g.details["upper_requires"])
    assert "every score in [lower, upper]" in req and "no ties" in req
    assert "every score in [lower, upper]" in g.statement


def test_mass_above_upper_releases_inf_above_the_recorded_upper_bound() -> None:
    """Half the scores above the range: no count reaches the rank, the release is +∞
    (coverage 1) while the recorded upper bound is < 1 — also named in ``upper_requires``."""
    cal = PCOQS()
    params = PCOQSParams(alpha=0.1, rho=1.0)
    s = np.where(np.arange(1000) % 2 == 0, 5.0, np.linspace(0.0, 1.0, 1000))
    g = cal.guarantee(params, DataShape(n=1000))
    assert g.upper is not None and g.upper < 1
    for seed in range(5):
        assert math.isinf(cal.calibrate(CalibrationInput(scores=s), params,
                                        random.Random(seed)).threshold)


def test_versions_before_2_1_recorded_the_short_text() -> None:
    cal = PCOQS()
    p, shape = PCOQSParams(alpha=0.1, rho=1.0), DataShape(n=1000)
    new = cal.guarantee(p, shape)
    assert cal.version == "2.3.0" and cal.guarantee_as("2.3.0", p, shape) == new
    for old in ("1.0.0", "2.0.0"):
        g = cal.guarantee_as(old, p, shape)
        assert g.details["upper_requires"] == (
            "no ties; ignores the score mass inside the final tol interval; holds given E₋ "
            "(no noise below −τ), P(E₋) ≥ 1−β")
        assert (g.lower, g.upper, g.details["tau"]) == (new.lower, new.upper,
                                                         new.details["tau"])


def _rerecord(acct: Accountant, rel: Any, version: str, as_version: str,
              drop: tuple[str, ...] = ("bound",), old: dict[str, Any] | None = None) -> int:
    """Re-record ``rel`` as a release of calibrator ``version`` whose coverage is what
    version ``as_version``'s code wrote."""
    cal = get(rel.method).calibrator
    params = {k: v for k, v in rel.params.items() if k not in drop}
    p = cal.Params.model_validate({**params, **(old or {})})
    cov = cal.guarantee_as(as_version, p, DataShape(**rel.shape))
    paid = acct.charge(rel.dataset, parse_cost(rel.privacy["cost"]))  # a release is paid for
    # as the older code wrote it: past the public API (it refuses another version's text)
    return record_release(
        acct.ledger, rel.dataset, _as_computed=True, method=rel.method,
        calibrator_version=version, threshold=rel.threshold,
        params=params, shape=rel.shape, coverage=cov, privacy=rel.privacy,
        diagnostics=rel.diagnostics, charge_ids=[paid.charge_id],
    ).id  # fmt: skip


def test_old_and_new_releases_verify_each_by_its_own_text(accountant: Accountant) -> None:
    """A 2.0.0 release (short text, params with ``bound``), a 1.0.0 and a 2.1.0 one verify
    next to a 2.3.0 one; a 2.0.0 release carrying the 2.1.0 text, or a 2.1.0 one carrying the short
    text, does not. The same for a Mondrian-wrapped P-COQS (version ``M/2.0.0``)."""
    acct = accountant
    acct.create_dataset("z", rho=10)
    s = np.random.default_rng(2).beta(2, 5, 3000)
    pc = acct.calibrate("pcoqs", dataset="z", scores=s, alpha=0.1, rho=0.5,
                        rng=Seeded(0))
    assert pc.calibrator_version == "2.3.0"
    assert "every score in [lower, upper]" in pc.coverage.details["upper_requires"]
    probs = np.random.default_rng(3).dirichlet(np.ones(3), 600)
    y = np.random.default_rng(4).integers(0, 3, 600)
    mo = acct.calibrate("pcoqs", dataset="z", probs=probs, labels=y, score="lac", alpha=0.1,
                        rho=0.5, mondrian="label", public_groups=True, rng=Seeded(1))
    assert mo.method == "mondrian:pcoqs" and mo.calibrator_version.endswith("/2.3.0")
    old_mo = mo.calibrator_version.removesuffix("2.3.0") + "2.0.0"
    _rerecord(acct, pc, "2.0.0", "2.0.0", drop=())
    _rerecord(acct, pc, "1.0.0", "1.0.0", old={"bound": "subgaussian"})
    _rerecord(acct, mo, old_mo, "2.0.0", drop=())
    _rerecord(acct, pc, "2.1.0", "2.1.0", drop=())
    assert acct.verify().guarantees_recomputed == 6
    bad = _rerecord(acct, pc, "2.0.0", "2.1.0", drop=())
    with pytest.raises(AuditFailed, match=f"release {bad} .*upper_requires"):
        acct.verify()


def test_a_new_release_with_the_short_text_does_not_verify(accountant: Accountant) -> None:
    acct = accountant
    acct.create_dataset("z", rho=10)
    s = np.random.default_rng(2).beta(2, 5, 1000)
    pc = acct.calibrate("pcoqs", dataset="z", scores=s, alpha=0.1, rho=0.5,
                        rng=Seeded(0))
    bad = _rerecord(acct, pc, "2.1.0", "2.0.0", drop=())
    with pytest.raises(AuditFailed, match=f"release {bad} .*upper_requires"):
        acct.verify()
