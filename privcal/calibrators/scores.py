"""Non-conformity scores (SPEC §1): lower is better; the prediction set is {y : S(x, y) ≤ t}
(:mod:`privcal.calibrators.prediction_sets` builds the sets and intervals).

Classification scores take the n×k probability matrix ``probs``:

- ``lac``  (a.k.a. HPS / hinge): S = 1 − p_y (Sadinle, Lei, Wasserman 2019);
- ``aps``: S = Σ_{j: p_j > p_y} p_j + u·p_y, u ~ U[0, 1] (Romano, Sesia, Candès 2020);
  ``randomized=False`` uses u = 1. One u per row, shared by every class of that row,
  so that the set {y : S(x, y) ≤ t} is the usual randomized APS set;
- ``raps``: aps + λ·max(0, rank(y) − k_reg) (Angelopoulos, Bates, Malik, Jordan 2021),
  rank(y) = 1 + #{j : p_j > p_y}; defaults λ = 0.01, k_reg = 5 (the values used in
  that paper's examples).

Ties: "p_j > p_y" is strict, so tied classes get the same aps/raps mass and rank.

Regression scores take the model's predictions in ``probs`` (the argument keeps
its name so every score has one call shape), or, through :func:`regression_scores`
and :func:`regression_bounds`, as ``preds`` / ``lower_preds`` + ``upper_preds``:

- ``absolute``: S = |y − f(x)|, predictions of shape (n,) (Lei, G'Sell, Rinaldo,
  Tibshirani, Wasserman 2018, §2.2, split conformal with the absolute residual);
- ``cqr``: S = max(f_lo(x) − y, y − f_hi(x)), predictions of shape (n, 2) = [f_lo, f_hi]
  (Romano, Patterson, Candès 2019, eq. (6)); S is negative inside the band.

The interval of a threshold t is {y : S(x, y) ≤ t} = [f_lo(x) − t, f_hi(x) + t]
(f_lo = f_hi = f for ``absolute``; Romano et al. 2019, eq. (7)).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from privcal.calibrators.base import default_rng, numpy_rng
from privcal.calibrators.validation import (
    check_labels,
    check_lengths,
    check_probs,
    check_targets,
)
from privcal.errors import InvalidInput

__all__ = [
    "SCORES",
    "ScoreSpec",
    "all_class_scores",
    "classification_scores",
    "cqr_bounds",
    "label_scores",
    "regression_bounds",
    "regression_scores",
    "score_interval",
    "score_options",
    "score_spec",
    "score_uniforms",
]

Kind = Literal["classification", "regression"]


@dataclass(frozen=True)
class ScoreSpec:
    """A named score: what it needs and which keyword options it accepts (with defaults)."""

    name: str
    kind: Kind
    description: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def needs(self) -> str:
        """``"probs"`` for classification scores, ``"predictions"`` for regression scores."""
        return "probs" if self.kind == "classification" else "predictions"


SCORES: dict[str, ScoreSpec] = {
    "lac": ScoreSpec("lac", "classification", "1 − p_y (LAC / HPS / hinge)"),
    "aps": ScoreSpec(
        "aps",
        "classification",
        "Σ_{p_j > p_y} p_j + u·p_y (adaptive prediction sets)",
        {"randomized": True},
    ),
    "raps": ScoreSpec(
        "raps",
        "classification",
        "aps + λ·max(0, rank(y) − k_reg) (regularized APS)",
        {"randomized": True, "lam": 0.01, "k_reg": 5},
    ),
    "absolute": ScoreSpec("absolute", "regression", "|y − f(x)| (absolute residual)"),
    "cqr": ScoreSpec(
        "cqr", "regression", "max(f_lo(x) − y, y − f_hi(x)) (conformalized quantile regression)"
    ),
}


def score_spec(name: str) -> ScoreSpec:
    """The score named ``name``, or a one-line error listing the known scores."""
    try:
        return SCORES[name]
    except KeyError:
        raise InvalidInput(f"unknown score {name!r} (known: {', '.join(SCORES)})") from None


def score_options(spec: ScoreSpec, opts: dict[str, Any]) -> dict[str, Any]:
    """``opts`` checked against the score's options, completed with their defaults."""
    unknown = set(opts) - set(spec.options)
    if unknown:
        allowed = ", ".join(spec.options) or "none"
        raise InvalidInput(
            f"score {spec.name!r} does not take option(s) {', '.join(sorted(unknown))} "
            f"(allowed: {allowed})"
        )
    out = {**spec.options, **opts}
    if "randomized" in out and not isinstance(out["randomized"], bool | np.bool_):
        raise InvalidInput(f"randomized must be true or false, got {out['randomized']!r}")
    if "lam" in out:
        lam = out["lam"]
        if (
            isinstance(lam, bool)
            or not isinstance(lam, int | float)
            or not (math.isfinite(lam) and lam >= 0)
        ):
            raise InvalidInput(f"raps λ (lam) must be a finite number ≥ 0, got {lam!r}")
        if isinstance(lam, int) and lam > 2**53 - 1:  # red team 20, service F1
            raise InvalidInput(f"raps λ (lam) = {lam:.6g} is a whole number past 2**53 − 1, "
                               "which a release cannot record exactly: give it as a float "
                               "(e.g. 1e40)")
    if "k_reg" in out:
        kr = out["k_reg"]
        if isinstance(kr, bool) or not isinstance(kr, int | np.integer) or kr < 0:
            raise InvalidInput(f"raps k_reg must be an integer ≥ 0, got {kr!r}")
    return out


def _uniforms(n: int, randomized: bool, rng: random.Random | None) -> np.ndarray:
    if not randomized:
        return np.ones(n)
    gen = numpy_rng(rng if rng is not None else default_rng())
    return gen.random(n)


def _greater_mass_and_rank(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every (i, y): Σ_{j: p_ij > p_iy} p_ij and #{j : p_ij > p_iy}, both n×k.

    One stable descending sort per row; a tie group takes the exclusive cumulative
    sum at its first member, so tied classes get identical values (bit for bit).
    """
    n, k = probs.shape
    order = np.argsort(-probs, axis=1, kind="stable")
    desc = np.take_along_axis(probs, order, axis=1)
    # shifted cumsum (not cumsum − value): the top class gets exactly 0, values are monotone
    excl = np.concatenate([np.zeros((n, 1)), np.cumsum(desc, axis=1)[:, :-1]], axis=1)
    starts = np.ones((n, k), dtype=bool)
    starts[:, 1:] = desc[:, 1:] != desc[:, :-1]
    pos = np.where(starts, np.arange(k), 0)
    group_start = np.maximum.accumulate(pos, axis=1)
    mass_sorted = np.take_along_axis(excl, group_start, axis=1)
    rank_sorted = group_start  # number of classes strictly more probable
    mass = np.empty_like(mass_sorted)
    rank = np.empty_like(rank_sorted)
    np.put_along_axis(mass, order, mass_sorted, axis=1)
    np.put_along_axis(rank, order, rank_sorted, axis=1)
    return mass, rank


def _classification_all(
    name: str, probs: np.ndarray, opts: dict[str, Any], rng: random.Random | None
) -> np.ndarray:
    if name == "lac":
        return 1.0 - probs
    return classification_scores(name, probs, opts,
                                 _uniforms(probs.shape[0], opts["randomized"], rng))


def score_uniforms(name: str, n: int, opts: dict[str, Any],
                   rng: random.Random | None) -> np.ndarray | None:
    """The uniforms u of ``n`` rows that :func:`all_class_scores` draws from ``rng`` (the
    same draw), None for ``lac``; ``opts`` checked (:func:`score_options`)."""
    return None if name == "lac" else _uniforms(n, opts["randomized"], rng)


def classification_scores(name: str, probs: np.ndarray, opts: dict[str, Any],
                          u: np.ndarray | None) -> np.ndarray:
    """The n×k scores of checked float64 ``probs`` for the uniforms ``u`` (aps/raps; None
    for ``lac``): :func:`all_class_scores` with its u given."""
    if name == "lac":
        return 1.0 - probs
    if u is None:
        raise InvalidInput(f"score {name!r} needs its uniforms u")
    mass, greater = _greater_mass_and_rank(probs)
    s = mass + u[:, None] * probs
    if name == "raps":
        # rank(y) = 1 + #{j : p_j > p_y}; penalty λ·(rank − k_reg)^+
        # λ as a float: an integer λ times the int64 ranks could wrap around
        s = s + float(opts["lam"]) * np.maximum(0, greater + 1 - opts["k_reg"])
    return s


def all_class_scores(
    name: str, probs: np.ndarray, *, rng: random.Random | None = None, **opts: Any
) -> np.ndarray:
    """The n×k matrix of scores S(x_i, y) for every class y (classification scores only).

    For randomized ``aps``/``raps`` one u_i ~ U[0, 1] is drawn per row from ``rng``
    (a CSPRNG when ``None``) and used for all k classes of that row.
    """
    spec = score_spec(name)
    if spec.kind != "classification":
        raise InvalidInput(f"score {name!r} is a regression score; it has no per-class scores")
    o = score_options(spec, opts)
    p = check_probs(probs, min_rows=1)
    return _classification_all(name, p, o, rng)


def label_scores(
    name: str,
    probs: np.ndarray,
    labels: np.ndarray,
    *,
    rng: random.Random | None = None,
    **opts: Any,
) -> np.ndarray:
    """The score of the given label for each row: S(x_i, y_i), shape (n,).

    Classification: ``probs`` n×k, ``labels`` integers in [0, k); the value equals
    ``all_class_scores(...)[i, y_i]`` for the same u (it is computed that way, so
    calibration and prediction sets agree to the bit). Regression: ``probs`` holds
    the predictions ((n,) for ``absolute``, (n, 2) for ``cqr``) and ``labels`` the
    real-valued targets.
    """
    spec = score_spec(name)
    o = score_options(spec, opts)
    if spec.kind == "classification":
        p = check_probs(probs, min_rows=1)
        y = check_labels(labels, p.shape[1], min_rows=1)
        check_lengths(probs=p, labels=y)
        if name == "lac":  # the same float operation as 1.0 - probs, on the n labels only
            n, k = p.shape
            return 1.0 - np.take(p.ravel(), np.arange(0, n * k, k) + y)
        s = _classification_all(name, p, o, rng)
        return np.ascontiguousarray(np.take_along_axis(s, y[:, None], axis=1)[:, 0])
    y_true = check_targets(labels, min_rows=1)
    if name == "absolute":
        f = check_targets(probs, min_rows=1)
        check_lengths(predictions=f, targets=y_true)
        return np.abs(y_true - f)
    lo, hi = cqr_bounds(probs)
    check_lengths(predictions=lo, targets=y_true)
    return np.maximum(lo - y_true, y_true - hi)


def cqr_bounds(preds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (lower, upper) quantile predictions of an (n, 2) cqr prediction array, checked."""
    a = np.asarray(preds, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != 2:
        raise InvalidInput(
            f"cqr predictions must have shape (n, 2) = [lower, upper], got {a.shape}"
        )
    lo, hi = check_targets(a[:, 0], min_rows=1), check_targets(a[:, 1], min_rows=1)
    return lo, hi


def regression_bounds(
    name: str,
    *,
    preds: Any = None,
    lower_preds: Any = None,
    upper_preds: Any = None,
    min_rows: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """The band (f_lo, f_hi) a regression score is built around, as two float64 arrays.

    ``absolute`` takes ``preds`` (n,) and gives (f, f); ``cqr`` takes ``lower_preds`` and
    ``upper_preds`` (n,) each, or ``preds`` of shape (n, 2) = [f_lo, f_hi]. Anything else is
    a one-line :class:`~privcal.errors.InvalidInput` naming what is missing or extra.
    """
    spec = score_spec(name)
    if spec.kind != "regression":
        raise InvalidInput(f"score {name!r} is a classification score; it takes probabilities")
    band = lower_preds is not None or upper_preds is not None
    if name == "absolute":
        if band:
            raise InvalidInput("score 'absolute' takes one prediction per row (--preds), "
                               "not --lower-preds/--upper-preds (those are for --score cqr)")
        if preds is None:
            raise InvalidInput("score 'absolute' needs the predictions (--preds)")
        f = check_targets(preds, min_rows=min_rows, what="predictions")
        return f, f
    if band:
        if preds is not None:
            raise InvalidInput("score 'cqr': give --lower-preds and --upper-preds, or --preds "
                               "of shape (n, 2), not both")
        if lower_preds is None or upper_preds is None:
            raise InvalidInput("score 'cqr' needs both --lower-preds and --upper-preds")
        lo = check_targets(lower_preds, min_rows=min_rows, what="lower predictions")
        hi = check_targets(upper_preds, min_rows=min_rows, what="upper predictions")
        check_lengths(lower_predictions=lo, upper_predictions=hi)
        return lo, hi
    if preds is None:
        raise InvalidInput("score 'cqr' needs --lower-preds and --upper-preds (the quantile "
                           "regressors' lower and upper predictions)")
    if np.ndim(preds) != 2:
        raise InvalidInput("score 'cqr' needs --lower-preds and --upper-preds, or --preds of "
                           f"shape (n, 2); got predictions of shape {np.shape(preds)}")
    return cqr_bounds(preds)


def regression_scores(
    name: str,
    targets: Any,
    *,
    preds: Any = None,
    lower_preds: Any = None,
    upper_preds: Any = None,
) -> np.ndarray:
    """S(x_i, y_i) for a regression score from predictions and targets, shape (n,).

    ``absolute``: |y − f| (one prediction per row, ``preds``); ``cqr``: max(f_lo − y,
    y − f_hi) (``lower_preds`` and ``upper_preds``, or ``preds`` of shape (n, 2)).
    Same values as :func:`label_scores` on the same arrays.
    """
    lo, hi = regression_bounds(name, preds=preds, lower_preds=lower_preds,
                               upper_preds=upper_preds)
    y = check_targets(targets, min_rows=1)
    check_lengths(predictions=lo, targets=y)
    if name == "absolute":
        return np.abs(y - lo)
    return np.maximum(lo - y, y - hi)


def score_interval(lo: np.ndarray, hi: np.ndarray, t: Any) -> tuple[np.ndarray, np.ndarray]:
    """[L, U] holding every y whose regression score, as :func:`regression_scores` computes
    it in floating point, is ≤ ``t`` (finite): ``absolute`` (lo = hi = f) and ``cqr``.

    ``lo − t`` and ``hi + t`` round to nearest and could cut off a target whose score is the
    threshold itself (red team 12: f = 6.1, y = 0.9, t = |y − f| = 5.199999999999999, and
    f − t = 0.9000000000000004 > y; with tied scores at the threshold the whole tie fell
    out, coverage 0.50 under a recorded ≥ 0.9). Each end moves outward by 8s, s the unit in
    the last place of max(|its prediction|, |t|): fl(lo − t) is within s of lo − t and the
    subtraction of 8s rounds by at most 2s more, so L ≤ lo − t − 5s ≤ lo − t − ulp(t), and
    any y below L has lo − y > t + ulp(t), which rounds above t (likewise U). A superset of
    the score-level set, longer by ~10⁻¹⁵ relatively.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        # an infinite t (−∞: the empty interval) has no unit in the last place: no move
        u_lo = np.nan_to_num(8 * np.spacing(np.maximum(np.abs(lo), np.abs(t))), nan=0.0)
        u_hi = np.nan_to_num(8 * np.spacing(np.maximum(np.abs(hi), np.abs(t))), nan=0.0)
        return (lo - t) - u_lo, (hi + t) + u_hi
