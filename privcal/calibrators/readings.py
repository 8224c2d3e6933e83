"""Probabilities and predictions read in another representation than at calibration (red
team 26, coverage F1–F3).

A model that outputs float32 (XGBoost's and LightGBM's ``predict_proba``, a float32
network) has two readings of each output: the value widened to float64 (a NumPy array) and
its shortest decimal read back (a CSV or JSON that pandas or polars wrote: 0.7f =
0.699999988… is written ``0.7``). They differ by less than half a float32 spacing. A
release calibrated on one reading and used on the other compares scores that are not
exchangeable with the calibration scores: at a tie with the threshold — a discrete model, a
tree's leaves — every tied test point fell out, 0.761 coverage under a recorded ≥ 0.9 (F1:
calibrated on the widened array, predicted from the CSV); 0.296 under ≥ 0.9 for float32
scores computed outside privcal (F2: the slack ``|t|·2⁻²¹`` of
:func:`~privcal.calibrators.prediction_sets.outside_threshold` is relative to t, the
reading's difference absolute in p); 0.779 for regression intervals (F3).

So a label is in its set when its score is ≤ t in the reading given *or in the other
reading* of the same float32 values (:func:`sets_at`): the entries that are a float32 value
or its shortest decimal are replaced by the value, and by the decimal, and the score is
computed again with the same uniforms u. Whatever
reading the calibration had, the test point's score in that reading is then compared with t:
the lower bound holds as recorded. A reading can only add labels, and only those whose score
in the other reading is ≤ t (entries of neither kind are unchanged, so float64 outputs get the
sets they had — unless a value is itself a float32's shortest decimal, 0.1: readings F5).
Only labels within ``_BAND`` of t can change (half a float32 spacing of
p ≤ 1 is at most 2⁻²⁵; an aps/raps sum of probabilities changes by at most 2⁻²⁴·Σp while the
row's order holds), so only their rows are read again — and every label of a row whose order
another reading can change (:func:`close_rows`: an entry of neither kind between the two
readings of another moved an aps score by a whole probability, 0.545 under ≥ 0.9, red team 26
readings F1). Regression intervals (:func:`reading_gap`) are widened by two
float32 spacings at max(|f|) + |t| on the rows where a prediction is such a reading (and
they differ): the target of the calibration's reading is within t of its prediction, and both
readings of each are within half a spacing.

Not covered: float16 or bfloat16 outputs (float16 probabilities widened are refused by the
row-sum check; their decimals, 0.3 for 0.30005, would make every short decimal a reading),
and targets read another way at evaluation while the predictions are float64 or exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["close_rows", "near", "reading_gap", "readings", "sets_at"]

#: how far above t a score can move between readings of the same float32 values (2⁻²³·Σp
#: with room for p's row-sum tolerance and float64 rounding)
_BAND = 2.0**-20
#: the narrow format, with (a relative gap of two spacings, its subnormal floor)
_FORMATS: tuple[tuple[Any, float, float], ...] = ((np.float32, 2.0**-22, 2.0**-148),)


def _kinds(a: np.ndarray, fmt: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the value in ``fmt``, its shortest decimal read back, which entries of ``a`` are one
    of the two), as float64 arrays of ``a``'s shape. The decimal costs a string conversion,
    so it is made once per distinct value (red team 26, readings F4), and only for the
    values that can be a decimal (:func:`_short`) and the ``fmt`` values; an integer below
    2¹¹ is its own decimal."""
    with np.errstate(over="ignore", invalid="ignore"):
        q = a.astype(fmt)
        wide = q.astype(np.float64)
        text = wide.copy()
        odd = ~((np.modf(wide)[0] == 0) & (np.abs(wide) < 2048.0))
        need = odd & np.isfinite(wide) & ((wide == a) | _short(a))
        if need.any():
            vals, inv = np.unique(q[need], return_inverse=True)
            text[need] = vals.astype(str).astype(np.float64)[inv]  # shortest decimals
        hit = np.isfinite(wide) & ((wide == a) | (text == a))
    return wide, text, hit


def _short(a: np.ndarray) -> np.ndarray:
    """False where ``a`` is surely not the double nearest a decimal of at most 9
    significant digits (a float32's shortest decimal has at most 9): a·10^(9 − ⌊log₁₀|a|⌋)
    is then not within 10⁻³ of an integer. For such a decimal M·10^j (M < 10⁹) that product
    is M·10, M·100 or M (⌊log₁₀⌋ exact or off by one) < 10¹¹, computed to a relative
    2⁻⁵⁰, so within 10⁻⁴ of its integer: no decimal is missed."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        m = np.abs(a) * 10.0 ** (9.0 - np.floor(np.log10(np.abs(a))))
        return np.abs(m - np.rint(m)) <= 1e-3


def close_rows(p: np.ndarray) -> np.ndarray:
    """Rows with two different entries so close (within 2⁻²²·the larger + 2⁻¹⁴⁸) that
    another reading can change their order or tie them (red team 26, readings F1): an entry
    moves by at most half a float32 spacing, ≤ 2⁻²⁴·|p| (2⁻¹⁴⁹ below the normal range), and
    an entry of neither kind not at all. Their aps/raps mass and rank can then move by a
    whole probability, so every label of such a row is a candidate of :func:`sets_at`."""
    d = np.sort(p, axis=1)
    gap = d[:, 1:] - d[:, :-1]
    return ((gap > 0) & (gap <= d[:, 1:] * 2.0**-22 + 2.0**-148)).any(axis=1)


def readings(p: np.ndarray) -> list[np.ndarray]:
    """The other readings of ``p`` (float64): ``p`` with each entry that is a float32 value
    or its shortest decimal replaced by the value, then by the decimal (module docstring);
    none when no entry is either."""
    out = []
    for fmt, _, _ in _FORMATS:
        wide, text, hit = _kinds(p, fmt)
        if hit.any():
            out += [np.where(hit, wide, p), np.where(hit, text, p)]
    return out


def near(t: Any) -> Any:
    """The score under which a label can be in another reading's set at threshold ``t``
    (``_BAND`` above t, more for raps' large sums: their float64 rounding)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(np.isfinite(t), t + _BAND + np.abs(t) * 2.0**-40, t)


def sets_at(name: str, options: dict[str, Any], p: np.ndarray, thr: np.ndarray,
            u: np.ndarray | None, base: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """``base`` (the n×k sets {y : S(x_i, y) ≤ t} on ``p`` as given) with every label added
    whose score in another reading of ``p`` (:func:`readings`) is ≤ its threshold ``thr`` (a
    scalar, one per column (k,), or one per row (n, 1)); ``cand``: the labels out of ``base``
    whose score is below :func:`near` of their threshold (no other can change); ``u`` the
    uniforms of aps/raps (the same for every reading)."""
    from privcal.calibrators.scores import classification_scores

    which = _candidate_rows(cand)
    if which.size == 0:
        return base
    out = base.copy()
    sub_t = thr[which] if np.ndim(thr) == 2 else thr
    sub_u = u[which] if u is not None else None
    for other in readings(p[which]):
        s = classification_scores(name, other, options, sub_u)
        out[which] |= s <= sub_t
    return out


def _candidate_rows(cand: np.ndarray) -> np.ndarray:
    """The rows of n×k ``cand`` with a label in it, in order. Usually a handful of labels lie
    within the band (10⁶ × 10 random probabilities: about 7), and ``cand.any(axis=1)`` (a
    reduction along rows of ten) cost as much as the whole of a lac prediction: the rows of
    few candidates are read off their flat indices instead (issue 11's prediction target)."""
    count = int(np.count_nonzero(cand))
    if count == 0 or count > cand.shape[0] // 8:
        return np.flatnonzero(cand.any(axis=1)) if count else np.zeros(0, dtype=np.intp)
    rows = np.flatnonzero(cand) // cand.shape[1]
    return rows[np.r_[True, rows[1:] != rows[:-1]]]


def reading_gap(lo: np.ndarray, hi: np.ndarray, t: np.ndarray) -> np.ndarray:
    """How far each regression interval is widened on both sides: on rows where a
    prediction (lower or upper) is a float32 value or its decimal, the two differing, two
    float32 spacings at max(|f_lo|, |f_hi|) + |t| (module docstring); 0 elsewhere. Every
    row is read, whatever the others (red team 26, readings F2/F3: one band of float64
    values, or a float64 row among the first 256, turned it off)."""
    gap = np.zeros(lo.shape, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        size = np.maximum(np.abs(lo), np.abs(hi)) + np.where(np.isfinite(t), np.abs(t), 0.0)
        for fmt, rel, floor in _FORMATS:
            move = np.zeros(lo.shape, dtype=bool)
            for a in (lo, hi) if hi is not lo else (lo,):
                wide, text, hit = _kinds(a, fmt)
                move |= hit & (wide != text)
            gap = np.where(move, np.maximum(gap, size * rel + floor), gap)
    return gap
