"""Red team 25, privacy: findings on the privacy guarantees (see each test's docstring)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from privcal.accountant.verification import recompute
from privcal.errors import BudgetRefused


@pytest.mark.parametrize("cap", [{"rho": 1}, {"epsilon": 1}])
def test_record_release_refuses_a_shuffled_release_on_a_cap_without_delta(
        accountant: Any, cap: dict[str, Any]) -> None:
    """F3: a run refuses ``shuffled`` on a pure-ε or ρ-zCDP cap (privcal records only what it
    charged, and an (ε, δ) cost cannot be charged there: issue 14.5), but
    ``Accountant.record_release`` recorded the same shuffled ldp-score release there — its
    statement claiming the amplified "(ε, δ)-DP per round" — paid for by the subjects' ε0 alone,
    and ``audit verify`` said ok. Refused now as the run refuses it, nothing written."""
    n = 8_000
    rng = np.random.default_rng(0)
    subjects = [f"s{i}" for i in range(n)]
    accountant.create_dataset("shuffled", approx_epsilon=5, approx_delta="0.00001",
                              subject_epsilon=5)
    rel = accountant.calibrate("ldp-score", {"alpha": 0.1, "epsilon": 2},
                               scores=rng.random(n) * 0.5, subjects=subjects,
                               dataset="shuffled", shuffled=True)
    assert rel.privacy["extra"]["shuffled"] and "shuffled: (" in rel.privacy["statement"]

    accountant.create_dataset("other", subject_epsilon=5, **cap)
    paid = accountant.charge_subjects("other", 2, subjects)
    assert paid.accepted == n
    # the privacy record the installed code states for it on this dataset (what
    # record_release compares the given one with)
    fake = SimpleNamespace(method=rel.method, dataset="other",
                           calibrator_version=rel.calibrator_version, params=rel.params,
                           shape=rel.shape, coverage=None,
                           privacy={"extra": rel.privacy["extra"]})
    _, coverage, privacy = recompute(fake, accountant.dataset("other"), current=True)
    assert "shuffled: (" in privacy["statement"]
    before = len(accountant.releases("other"))
    with pytest.raises(BudgetRefused, match=r"^a shuffled run is charged its amplified"):
        accountant.record_release(
            "other", method=rel.method, calibrator_version=rel.calibrator_version,
            threshold=rel.threshold, params=rel.params, shape=rel.shape, coverage=coverage,
            privacy=privacy, charge_ids=[paid.charge_id])
    assert len(accountant.releases("other")) == before
    # the same release without the shuffled record is the local release it is: recorded
    _, coverage, privacy = recompute(
        SimpleNamespace(**{**vars(fake), "privacy": {}}), accountant.dataset("other"),
        current=True)
    assert "shuffled" not in privacy["statement"]
    accountant.record_release(
        "other", method=rel.method, calibrator_version=rel.calibrator_version,
        threshold=rel.threshold, params=rel.params, shape=rel.shape, coverage=coverage,
        privacy=privacy, charge_ids=[paid.charge_id])
    assert accountant.verify().guarantees_recomputed == 2


def test_no_doc_claims_the_noisy_search_is_safe_against_timing() -> None:
    """F1: P-COQS's docs said its running time "reveals n, not a record" and "nothing about a
    record leaks through timing except n", because the counts take N·n comparisons whatever
    the data. The CKS20 discrete Gaussian draw is not constant-time, though: it took a median
    of 14.6 µs at |Z| < 10 and 30.1 µs at 30 ≤ |Z| < 40 (σ² = 34/0.2, 60 000 draws). A step's
    decision 1{count + Z ≥ r} together with |Z| says more about the count than the decision
    does alone (with |Z| = z known, count r − z decides 1 half of the time and r − z − 1 never).
    The docs now say that timing is outside the DP claim. The same goes for the samplers'
    modules and for the exponential mechanism's rejection loop, whose number of proposals
    depends on the data."""
    import privcal.calibrators.mechanisms.discrete_gaussian as dg
    import privcal.calibrators.mechanisms.exponential as em
    import privcal.calibrators.pcoqs as pcoqs

    for doc in (pcoqs.__doc__ or "", pcoqs.noisy_binary_search.__doc__ or ""):
        assert "reveals n, not a record" not in doc
        assert "leaks through timing except n" not in doc
        assert "not constant-time" in doc and ("not covered" in doc or "outside the DP" in doc)
    for mod in (dg, em):
        assert "Not constant-time" in (mod.__doc__ or "")
        assert "not cover timing" in (mod.__doc__ or "")
