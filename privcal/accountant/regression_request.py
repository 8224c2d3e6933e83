"""A regression request's checks — its inputs, its score, its predictions' shapes — and its
calibration scores: one home for the run (:func:`~privcal.accountant.prepare.prepare`) and
the dry run (:func:`~privcal.accountant.prepare.check_score_request`), which runs the same
checks on zeros of each input's shape, never reading a value (red team 25, service F3: a
dry run answered "allowed" for ``cqr`` with one-dimensional predictions, which the run
refuses — the README says a dry run never does)."""

from __future__ import annotations

from typing import Any

import numpy as np

from privcal.accountant.calibration_request import CalibrationRequest
from privcal.calibrators.base import Calibrator
from privcal.calibrators.scores import SCORES, regression_scores
from privcal.calibrators.validation import check_scores
from privcal.errors import InvalidInput

__all__ = ["is_regression", "regression_request_scores"]


def is_regression(req: CalibrationRequest) -> bool:
    """Whether ``req`` gives regression predictions or targets."""
    return any(a is not None for a in (req.preds, req.lower_preds, req.upper_preds,
                                       req.targets))


def _blank(a: Any) -> Any:
    """Zeros of ``a``'s shape (None for None): what a dry run checks in place of a value."""
    return None if a is None else np.zeros(np.shape(a))


def regression_request_scores(cal: Calibrator, req: CalibrationRequest, *, scores: Any,
                              probs: Any, labels: Any, blank: bool = False) -> np.ndarray:
    """The calibration scores of a regression request (``--preds``/``--targets``), after
    its refusals: a classifier's method, other inputs besides (``scores``, ``probs``,
    ``labels`` as the caller holds them), no score or a classification one, score options,
    no targets, predictions of the wrong shape for the score. ``blank``: on zeros of each
    input's shape (a dry run)."""
    if "probs" in cal.inputs:
        raise InvalidInput(f"{cal.name} calibrates classifiers (probabilities and labels); "
                           "it does not take regression predictions")
    if scores is not None or probs is not None or labels is not None:
        raise InvalidInput("give regression predictions with --targets, or --probs with "
                           "--labels, or --scores; not several")
    score = req.score
    if score is None:
        raise InvalidInput("with regression predictions and --targets, name the score: "
                           "--score absolute (with --preds) or --score cqr (with "
                           "--lower-preds/--upper-preds)")
    if score not in SCORES:
        raise InvalidInput(f"unknown score {score!r} (known: {', '.join(SCORES)})")
    if SCORES[score].kind != "regression":
        raise InvalidInput(f"score {score!r} is a classification score; regression "
                           "predictions take --score absolute or --score cqr")
    if req.score_options:
        raise InvalidInput(f"score {score!r} takes no options")
    if req.targets is None:
        raise InvalidInput("regression calibration needs the true targets (--targets)")
    given = _blank if blank else (lambda a: a)
    return check_scores(regression_scores(
        score, given(req.targets), preds=given(req.preds), lower_preds=given(req.lower_preds),
        upper_preds=given(req.upper_preds)))
