"""Red team 25, the lead's: a dry run refuses what the run refuses for a regression
request's public shape (service F3, left by the service helper in the library)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from privcal.accountant.calibration import dry_run
from privcal.errors import InvalidInput


def test_a_dry_run_refuses_cqr_with_one_dimensional_predictions(accountant: Any) -> None:
    """Service F3: ``dry_run`` answered ``allowed`` (cost ρ = 0.1) for ``cqr`` with
    one-dimensional ``preds``, which the run refuses ("needs --lower-preds and --upper-preds,
    or --preds of shape (n, 2)") — the README says a dry run makes the same checks with the
    same calls. It now runs the run's regression checks on zeros of each input's shape: the
    same one-line error, nothing charged; NaN values (which only the run reads) still pass
    a dry run, and a well-shaped request is allowed."""
    accountant.create_dataset("p", rho=1)
    rng = np.random.default_rng(0)
    y = rng.normal(size=500)
    base = {"alpha": 0.1, "rho": 0.1}
    ranged = {"score_range": (0, 10)}
    with pytest.raises(InvalidInput) as run:
        accountant.calibrate("pcoqs", dataset="p", preds=y + 0.1, targets=y, score="cqr",
                             **base, **ranged)
    with pytest.raises(InvalidInput) as dry:
        dry_run(accountant, "pcoqs", base, dataset="p", preds=y + 0.1, targets=y,
                score="cqr", **ranged)
    assert str(dry.value) == str(run.value)
    assert "shape (n, 2)" in str(dry.value)
    for other in ({"score": "absolute", "lower_preds": y, "upper_preds": y},  # band to abs
                  {"score": None, "preds": y}, {"score": "lac", "preds": y},
                  {"score": "absolute", "preds": y, "scores": y}):
        kw = {"targets": y, **other}
        with pytest.raises(InvalidInput) as run:
            accountant.calibrate("pcoqs", dataset="p", **kw, **base, **ranged)
        with pytest.raises(InvalidInput) as dry:
            dry_run(accountant, "pcoqs", base, dataset="p", **kw, **ranged)
        assert str(dry.value) == str(run.value), other
    nan = np.where(np.arange(500) == 3, np.nan, y)
    assert dry_run(accountant, "pcoqs", base, dataset="p", preds=np.c_[nan, nan + 1],
                   targets=y, score="cqr", **ranged).allowed
    assert dry_run(accountant, "pcoqs", base, dataset="p", lower_preds=y - 1,
                   upper_preds=y + 1, targets=y, score="cqr", **ranged).allowed
    assert accountant.budget("p").charges == 0


@pytest.mark.parametrize("cap", [{"epsilon": 1}, {"rho": 1}])
def test_an_epsilon_zero_delta_cost_is_refused_for_a_true_reason(accountant: Any,
                                                                  cap: dict[str, Any]) -> None:
    """Newcomer F6: ``ApproxDP(ε, 0)`` on a pure-ε cap was refused because "(ε, δ) do not imply
    pure ε-DP" (on a ρ-zCDP cap: "has no zCDP equivalent") — untrue at δ = 0, where it *is*
    pure ε-DP. Still refused (a cost is charged as its kind; an (ε, δ) charge on such a
    dataset is no kind its totals hold), now with a true reason and what to do; δ > 0 keeps
    its reason; nothing charged."""
    from privcal.costs import ApproxDP, PureDP
    from privcal.errors import BudgetRefused

    accountant.create_dataset("d", **cap)
    with pytest.raises(BudgetRefused, match=r"asked .*, an \(ε, δ\) cost is charged only to an "
                       r"\(ε, δ\) budget, even at δ = 0: charge it as pure ε; remaining"):
        accountant.charge("d", ApproxDP(0.1, 0))
    with pytest.raises(BudgetRefused) as pos:
        accountant.charge("d", ApproxDP(0.1, "1e-9"))
    assert "even at δ = 0" not in str(pos.value)
    assert "do not imply" in str(pos.value) or "no zCDP equivalent" in str(pos.value)
    assert accountant.budget("d").charges == 0
    assert accountant.charge("d", PureDP(0.1)).charge_id == 1  # what the message says to do
