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
