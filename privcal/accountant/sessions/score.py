"""The score a collection session's devices or agents compute (red team 16, F9).

``collection_sessions.params`` is the calibrator's parameters, plus ``score`` when the session
was opened with one (:func:`session_score`: its name and every option, as a calibration on
precomputed scores records it). Its release records it in ``diagnostics["score"]``, which
predict and evaluate use; :func:`calibrator_params` is the params without it (what the
calibrator validates and the release records as its params). Sessions opened before record
none, and predicting with their releases needs ``--score``.
"""

from __future__ import annotations

from typing import Any

from privcal.errors import InvalidInput

__all__ = ["SCORE_KEY", "calibrator_params", "check_agent_scores", "score_of",
           "session_score"]

#: the key of a session's ``params`` that records the score its devices or agents compute
SCORE_KEY = "score"


def session_score(score: Any, options: Any) -> dict[str, Any] | None:
    """The record of the score a session's devices or agents compute: ``{"name", "options"}``
    with every option (the defaults filled in), as a calibration on precomputed scores records
    it; None when no score is named. A one-line InvalidInput for a score that is not one of
    privcal's, options it does not take, or options without a score."""
    from privcal.accountant.calibration_request import precomputed_score
    from privcal.calibrators.scores import SCORES

    if score is not None and (not isinstance(score, str) or score not in SCORES):
        raise InvalidInput(f"unknown score {score!r:.60} (known: {', '.join(SCORES)})")
    if options is not None and not isinstance(options, dict):
        raise InvalidInput(f"score options must be a dict of option names to values, got "
                           f"{type(options).__name__}")
    return precomputed_score(score, options)


def score_of(params: dict[str, Any] | None) -> dict[str, Any] | None:
    """The score a session's ``params`` record (None: opened without one, or before F9)."""
    sc = (params or {}).get(SCORE_KEY)
    return dict(sc) if isinstance(sc, dict) else None


def calibrator_params(params: dict[str, Any]) -> dict[str, Any]:
    """A session's ``params`` without its score: the calibrator's parameters."""
    return {k: v for k, v in params.items() if k != SCORE_KEY}


def check_agent_scores(params: dict[str, Any] | None, scores: Any) -> None:
    """InvalidInput for an agent's ``scores`` that a session whose ``params`` name its score
    could not take as that score: a float32 or half-precision *array* (a torch model's
    ``1 − p``), or values the score never takes — as ``calibrate`` refuses precomputed
    scores (:func:`~privcal.accountant.calibration_request.precomputed_score`). The release
    records the score and ``predict`` computes it in float64: the float32 order statistics of
    ``1 − p`` were the threshold of a FedCP-QQ release recording ``lac``, below the float64
    score, and every tied test point fell out — 0.50 coverage under a recorded ≥ 0.9 (red
    team 24, coverage F3). Float32 *values* in a float64 array are not refused here, as
    ``calibrate`` refuses them: an agent computing in float64 from float32 probabilities —
    privcal's own way — has such values wherever 1 − p is exact, and, unlike a caller of
    ``calibrate``, no probabilities to give instead. Nothing is checked for a session that
    names no score."""
    import numpy as np

    from privcal.accountant.calibration_request import precomputed_score
    from privcal.accountant.score_values import impossible_scores

    named = score_of(params)
    if named is None or not isinstance(named.get("name"), str):
        return
    try:  # a NumPy dtype; a torch dtype is not one (numpy reads the tensor's own)
        dt = np.dtype(scores.dtype)
    except (AttributeError, TypeError):
        dt = np.asarray(scores).dtype
    options = dict(named.get("options") or {})
    if dt.kind == "f" and dt.itemsize < 8:
        precomputed_score(named["name"], options, scores)  # refuses the narrow array
    with np.errstate(all="ignore"):
        impossible_scores(np.asarray(scores, dtype=np.float64).ravel(), named["name"])
