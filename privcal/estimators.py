"""Wrap a fitted model, scikit-learn style, for private conformal calibration (issue 12).

The shape follows MAPIE v1's ``SplitConformalClassifier`` / ``SplitConformalRegressor``
(a fitted estimator, ``confidence_level``, ``conformalize(X_conf, y_conf)``, then
``predict_set`` / ``predict_interval``), with the calibration charged to a privcal
dataset through an :class:`~privcal.accountant.Accountant`::

    clf = PrivateConformalClassifier(model, method="pcoqs", confidence_level=0.9,
                                     accountant=acct, dataset="d", rho=0.5)
    clf.conformalize(X_cal, y_cal)
    y_pred, sets = clf.predict_set(X_test)      # sets: n × k × 1 booleans

The estimator is duck-typed: a classifier needs ``predict_proba`` (and ``classes_`` when
its labels are not 0 … k−1; string labels are fine), a regressor ``predict``. For
``score="cqr"`` the regressor is a pair ``(lower_estimator, upper_estimator)`` of
quantile regressors, or one estimator whose ``predict`` returns n × 2 [lower, upper].
scikit-learn is not imported. The estimator must be fitted on data *other* than the
calibration data (split conformal); it is never refitted here (MAPIE's ``prefit=True``).

Each ``conformalize`` is one privcal calibration: it is charged, recorded in the ledger,
and its :class:`~privcal.accountant.Release` is ``release_``. ``release_`` can be saved
(``release_.model_dump_json()``) and a wrapper rebuilt around it without the ledger
(:meth:`PrivateConformalClassifier.from_release`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from privcal.errors import InvalidInput

__all__ = ["PrivateConformalClassifier", "PrivateConformalRegressor"]


def _levels(confidence_level: Any) -> list[float]:
    """The confidence levels (one or several), each in (0, 1)."""
    many = isinstance(confidence_level, Sequence) and not isinstance(confidence_level, str)
    values = list(confidence_level) if many else [confidence_level]
    if not values:
        raise InvalidInput("confidence_level: give at least one level")
    out = []
    for c in values:
        if isinstance(c, bool) or not isinstance(c, int | float) or not 0 < c < 1:
            raise InvalidInput(f"confidence_level must be in (0, 1), got {c!r:.40}")
        out.append(float(c))
    return out


def _alpha(levels: list[float]) -> float | list[float]:
    """α = 1 − confidence level, as the decimal the user meant (0.9 → 0.1, not 0.09999…)."""
    alphas = [_complement(c) for c in levels]
    return alphas[0] if len(alphas) == 1 else alphas


def _complement(c: float) -> float:
    """1 − ``c`` as decimals (``c`` read as its shortest repr, the decimal typed), as the
    float whose shortest repr — what the release records and its rank is computed from
    (:func:`~privcal.calibrators.base.conformal_rank`) — is the largest not above it: never a
    larger α than the level asked for. It was rounded to 12 digits to nearest (red team 25,
    coverage F1: confidence 0.3000000000001 ran and recorded α = 0.7, and at n = 9 covered
    exactly 0.3, less than asked)."""
    import math
    from fractions import Fraction

    exact = 1 - Fraction(repr(float(c)))
    a = float(exact)
    while Fraction(repr(a)) > exact:
        a = math.nextafter(a, 0.0)
    return a


def _check_rng(rng: Any) -> None:
    """``rng``: None (privcal's CSPRNG) or a :class:`random.Random` — ``random.Random(seed)``
    for a reproducible non-private method, only a :class:`random.SystemRandom` for a private
    one (:func:`~privcal.calibrators.base.unpredictable`, at ``fit``); a bare seed (``rng=42``)
    or a NumPy Generator is refused in one line, before anything is charged
    (:func:`~privcal.accountant.calibration_request.check_rng`)."""
    from privcal.accountant.calibration_request import check_rng

    check_rng(rng)


def _call(estimator: Any, method: str, X: Any) -> np.ndarray:
    fn = getattr(estimator, method, None)
    if not callable(fn):
        raise InvalidInput(f"the estimator {type(estimator).__name__} has no {method}(X)")
    return np.asarray(fn(X))


def _pick_levels(rel: Any, probs: Any, alphas: list[Any], rng: random.Random | None
                 ) -> list[np.ndarray]:
    """The sets at each level of ``alphas`` (in that order), all from one draw
    (:meth:`Release.level_sets`); a level the release lacks is the release's one-line error."""
    import math

    if not isinstance((rel.params or {}).get("alpha"), list):  # one level: the release's
        return [rel.predict_set(probs, alpha=a, rng=rng) for a in alphas]  # error names it
    levels = rel.level_sets(probs, rng=rng)
    out = []
    for a in alphas:
        hit = next((sets for b, sets in levels
                    if math.isclose(b, float(a), rel_tol=1e-12, abs_tol=1e-15)), None)
        out.append(hit if hit is not None
                   else rel.predict_set(probs, alpha=a))  # raises: no level α = a
    return out


#: keywords the wrapper gives the calibration itself, refused in ``**params`` (red team 23,
#: coverage F7: a TypeError traceback at conformalize; F8: column groups it cannot predict)
_WRAPPER_SETS = {
    "alpha": "the wrapper's level is confidence_level= (α = 1 − the level)",
    "classes": "the estimator's classes_ name the classes",
    **{k: "conformalize(X, y) gives the data" for k in (
        "probs", "labels", "scores", "preds", "lower_preds", "upper_preds", "targets")},
    "groups": "column groups need each test row's group, which predict_set/predict_interval "
              "do not take: use Accountant.calibrate and Release (mondrian='label' works)",
}


class _Base:
    """What the classifier and the regressor share: the accountant, the method, the release."""

    def __init__(self, estimator: Any, method: str, confidence_level: Any, *,
                 accountant: Any, dataset: str | None, score: str,
                 requester: str | None, rng: random.Random | None,
                 params: dict[str, Any]) -> None:
        _check_rng(rng)  # before conformalize charges anything (red team 5)
        for key in params:
            if key in _WRAPPER_SETS:
                raise InvalidInput(f"{key}: not a parameter of the wrapper ({_WRAPPER_SETS[key]})")
        self.estimator, self.method, self.confidence_level = estimator, method, confidence_level
        self.accountant, self.dataset, self.score = accountant, dataset, score
        self.requester, self.rng, self.params = requester, rng, params
        self.release_: Any = None

    def _calibrate(self, subjects: Any, rows: tuple[Any, Any], **data: Any) -> None:
        from privcal.accountant.row_inputs import same_index

        same_index({"X_conf": rows[0], "y_conf": rows[1], "subjects": subjects})  # api F9
        if subjects is not None:  # each row's subject (local-DP methods need them)
            data["subjects"] = subjects
        if self.accountant is None or self.dataset is None:
            raise InvalidInput("conformalize needs accountant= and dataset= (the budget that "
                               "pays for the calibration)")
        levels = _levels(self.confidence_level)
        # the method's parameters and calibration options (score_range=, …) as keywords
        self.release_ = self.accountant.calibrate(
            self.method, dataset=self.dataset, score=self.score, requester=self.requester,
            rng=self.rng, alpha=_alpha(levels), **self.params, **data)

    def _release(self) -> Any:
        if self.release_ is None:
            raise InvalidInput(f"{type(self).__name__} is not conformalized: call "
                               "conformalize(X_conf, y_conf) first")
        return self.release_

    def _alphas(self, confidence_level: Any) -> list[float | None]:
        """The level(s) to predict at: those asked, else every conformalized one (None: the
        release's only level)."""
        if confidence_level is None:
            levels = _levels(self.confidence_level)
            return [None] if len(levels) == 1 else list(_alpha(levels))  # type: ignore[arg-type]
        alphas = _alpha(_levels(confidence_level))
        return list(alphas) if isinstance(alphas, list) else [alphas]


class PrivateConformalClassifier(_Base):
    """Prediction sets with a privately calibrated threshold (MAPIE v1 shape).

    ``method``: a privcal calibrator that takes scores or probabilities (``split``,
    ``pcoqs``, ``exponq``, ``ldp-label``, …); ``confidence_level``: 1 − α, or a list of levels
    (one release with a threshold per level); ``score``: ``lac``, ``aps`` or ``raps``;
    ``**params``: the method's parameters (``rho=``, ``epsilon=``, …), as in
    :meth:`Accountant.calibrate <privcal.accountant.Accountant.calibrate>`. The class names
    are the estimator's ``classes_`` (public model metadata), else 0 … k−1. With
    ``ldp-label``, :meth:`conformalize` simulates the users' k-RR on the true labels unless
    told they are already randomized.
    """

    def __init__(self, estimator: Any, method: str = "pcoqs", confidence_level: Any = 0.9, *,
                 accountant: Any = None, dataset: str | None = None, score: str = "lac",
                 requester: str | None = None, rng: random.Random | None = None,
                 **params: Any) -> None:
        super().__init__(estimator, method, confidence_level, accountant=accountant,
                         dataset=dataset, score=score, requester=requester, rng=rng,
                         params=params)
        self.classes_: np.ndarray | None = None

    def _probs(self, X: Any) -> np.ndarray:
        return _call(self.estimator, "predict_proba", X)

    def _columns(self, k: int) -> np.ndarray:
        classes = getattr(self.estimator, "classes_", None)
        if classes is None:  # a model without classes_: a saved release's names (red team
            # 23, coverage F6: column indices named class 5 as 2), else 0 … k−1
            return self.classes_ if self.classes_ is not None else np.arange(k)
        classes = np.asarray(classes)
        if classes.shape != (k,):
            raise InvalidInput(f"the estimator has {classes.shape[0]} classes_ but "
                               f"predict_proba gives {k} columns")
        return classes

    def conformalize(self, X_conf: Any, y_conf: Any, *, subjects: Any = None,
                     labels_randomized: bool = False) -> PrivateConformalClassifier:
        """Calibrate on held-out data (charged to ``dataset``); returns self. ``subjects``:
        the subject id of every row, which a local-DP method (``ldp-label``) needs: each
        subject is charged against the dataset's per-subject cap by its id.

        ``ldp-label`` calibrates from labels the users randomized on their devices (k-ary
        randomized response at the run's ε). By default ``y_conf`` are the *true* labels and
        the estimator simulates the devices: it randomizes each label with the library's
        client randomizer (:func:`~privcal.client.krr_many`, the estimator's ``rng``) before
        the calibration sees it — so whoever runs it holds the true labels, and the local-DP
        guarantee is about what leaves the simulated devices, as for ``ldp-score``. Labels
        collected from real devices (each sent ``privcal.client.krr(label, k, ε)``, the
        column index of its class) are given with ``labels_randomized=True``, and used as
        they are."""
        _check_rng(self.rng)  # also draws the simulated devices' k-RR (ldp-label)
        if not isinstance(labels_randomized, bool):
            raise InvalidInput("labels_randomized must be True or False")
        if labels_randomized and self.method != "ldp-label":
            raise InvalidInput(f"labels_randomized applies to method='ldp-label' only (the "
                               f"labels {self.method!r} calibrates on are the true ones)")
        probs = self._probs(X_conf)
        if probs.ndim != 2:
            raise InvalidInput(f"predict_proba must give an n×k matrix, got {probs.shape}")
        classes = self._columns(probs.shape[1])
        index = {c.item() if hasattr(c, "item") else c: j for j, c in enumerate(classes)}
        y = np.asarray(y_conf, dtype=object).ravel()
        labels = np.empty(y.shape[0], dtype=np.int64)
        for i, v in enumerate(y):
            j = index.get(v.item() if hasattr(v, "item") else v)
            if j is None:
                raise InvalidInput(f"y_conf: row {i} is {v!r:.40}, not one of the estimator's "
                                   f"classes ({', '.join(map(str, classes[:10]))})")
            labels[i] = j
        names = [str(c) for c in classes]
        if len(set(names)) != len(names):
            raise InvalidInput("the estimator's classes_ are not distinct as text")
        if self.method == "ldp-label" and not labels_randomized:
            labels = self._devices(labels, probs.shape[1])
        # as names, so that the release reads the model's own labels as names at evaluate
        # (red team 23, coverage F2: label 2 of classes_ [0, 2, 5] was read as column 2)
        self._calibrate(subjects, (X_conf, y_conf), probs=probs, classes=names,
                        labels=np.array(names, dtype=object)[labels])
        self.classes_ = classes
        return self

    def _devices(self, labels: np.ndarray, k: int) -> np.ndarray:
        """What the users' devices send for ``ldp-label``: each label through k-ary randomized
        response at the run's ε, read once, as a float the run takes too (red team 26, api F7:
        a float subclass's ``__float__`` said 50 to the k-RR, its value 0.5 to the release)."""
        from privcal.calibrators.base import numpy_rng, unpredictable
        from privcal.calibrators.mechanisms.randomized_response import krr_many

        if (eps := self.params.get("epsilon")) is None:
            raise InvalidInput("ldp-label needs epsilon= (the ε of the users' k-RR labels)")
        if isinstance(eps, int | float | np.number) and not isinstance(eps, bool):
            self.params = {**self.params, "epsilon": (eps := float(eps))}  # (a str: refused)
        return krr_many(labels, k, eps, numpy_rng(unpredictable(self.rng, "devices' k-RR")))

    @classmethod
    def from_release(cls, estimator: Any, release: Any) -> PrivateConformalClassifier:
        """A conformalized classifier from a saved release (no ledger, nothing charged). An
        estimator with ``classes_`` must list the release's classes in the release's order."""
        from privcal.accountant import Release

        rel = release if isinstance(release, Release) else Release.load(release)
        alphas = [float(a) for a in rel.params["alpha"]] if isinstance(
            rel.params.get("alpha"), list) else [float(rel.params["alpha"])]
        levels = [_complement(a) for a in alphas]
        score = ((rel.diagnostics or {}).get("score") or {}).get("name", "lac")
        out = cls(estimator, rel.method, levels if len(levels) > 1 else levels[0], score=score)
        out.release_ = rel
        names = rel.classes
        k = len(names) if names else None
        own = getattr(estimator, "classes_", None) is not None  # else the release's names
        out.classes_ = (out._columns(k) if own else np.array(names)) if k else None
        if names and getattr(estimator, "classes_", None) is not None \
                and [str(c) for c in out.classes_] != list(names):  # type: ignore[union-attr]
            # the release's thresholds are in its class order (one per class for label
            # groups): another order would test each class against another's threshold
            raise InvalidInput(
                f"the estimator's classes_ ({', '.join(map(str, out.classes_[:10]))}) are "  # type: ignore[index]
                f"not the release's classes in its order ({', '.join(names[:10])})")
        return out

    def predict(self, X: Any) -> np.ndarray:
        """The estimator's point predictions (``predict``, else the most probable class)."""
        if callable(getattr(self.estimator, "predict", None)):
            return np.asarray(self.estimator.predict(X))
        probs = self._probs(X)
        return self._columns(probs.shape[1])[np.argmax(probs, axis=1)]

    def predict_set(self, X: Any, confidence_level: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(y_pred, sets)``: point predictions and boolean sets of shape n × k × L, one slice
        per confidence level (L = 1 for one level), columns in ``classes_`` order.

        Several levels are computed from one draw of the randomized scores (``aps``/``raps``:
        :meth:`Release.level_sets <privcal.accountant.Release.level_sets>`), so the slices
        are nested — the set at a higher confidence level contains the set at a lower one
        (separate draws per level need not nest: red team 5)."""
        rel = self._release()
        probs = self._probs(X)
        alphas = self._alphas(confidence_level)
        if len(alphas) == 1:
            a = alphas[0]
            sets = [rel.predict_set(probs, alpha=a, rng=self.rng) if a is not None
                    else rel.predict_set(probs, rng=self.rng)]
        else:
            sets = _pick_levels(rel, probs, alphas, self.rng)
        return self.predict(X), np.stack(sets, axis=-1)

    def predict_labels(self, X: Any, confidence_level: float | None = None) -> list[list[Any]]:
        """Each row's prediction set as a list of the estimator's class labels (one level)."""
        _, sets = self.predict_set(X, confidence_level)
        if sets.shape[-1] != 1:
            raise InvalidInput("several levels: choose one (confidence_level=…)")
        classes = self._columns(sets.shape[1])
        return [[c.item() if hasattr(c, "item") else c for c in classes[row]]
                for row in sets[:, :, 0]]


class PrivateConformalRegressor(_Base):
    """Prediction intervals with a privately calibrated threshold (MAPIE v1 shape).

    ``score="absolute"``: ``estimator.predict`` gives f(x), intervals [f − t, f + t];
    ``score="cqr"``: ``estimator`` is ``(lower, upper)`` quantile regressors (or one whose
    ``predict`` gives n × 2), intervals [f_lo − t, f_hi + t]. ``score_range=(lo, hi)``: the
    public range of the scores for a method that needs one (recorded; scores outside it are
    not clipped, they can only make intervals wider or infinite).
    """

    def __init__(self, estimator: Any, method: str = "pcoqs", confidence_level: Any = 0.9, *,
                 accountant: Any = None, dataset: str | None = None, score: str = "absolute",
                 requester: str | None = None, rng: random.Random | None = None,
                 **params: Any) -> None:
        if score not in ("absolute", "cqr"):
            raise InvalidInput(f"score must be 'absolute' or 'cqr', got {score!r:.40}")
        super().__init__(estimator, method, confidence_level, accountant=accountant,
                         dataset=dataset, score=score, requester=requester, rng=rng,
                         params=params)

    def _band(self, X: Any) -> dict[str, np.ndarray]:
        est = self.estimator
        if self.score == "absolute":
            return {"preds": _call(est, "predict", X)}
        if isinstance(est, tuple | list):
            if len(est) != 2:
                raise InvalidInput("score 'cqr' takes (lower_estimator, upper_estimator)")
            return {"lower_preds": _call(est[0], "predict", X),
                    "upper_preds": _call(est[1], "predict", X)}
        return {"preds": _call(est, "predict", X)}  # n × 2, checked by the score

    def conformalize(self, X_conf: Any, y_conf: Any, *,
                     subjects: Any = None) -> PrivateConformalRegressor:
        """Calibrate on held-out data (charged to ``dataset``); returns self. ``subjects``:
        the subject id of every row, which a local-DP method (``ldp-score``) needs."""
        self._calibrate(subjects, (X_conf, y_conf), targets=np.asarray(y_conf),
                        **self._band(X_conf))
        return self

    @classmethod
    def from_release(cls, estimator: Any, release: Any) -> PrivateConformalRegressor:
        """A conformalized regressor from a saved release (no ledger, nothing charged)."""
        from privcal.accountant import Release

        rel = release if isinstance(release, Release) else Release.load(release)
        raw = rel.params.get("alpha")
        alphas = [float(a) for a in raw] if isinstance(raw, list) else [float(raw)]
        levels = [_complement(a) for a in alphas]
        score = ((rel.diagnostics or {}).get("score") or {}).get("name", "absolute")
        out = cls(estimator, rel.method, levels if len(levels) > 1 else levels[0], score=score)
        out.release_ = rel
        return out

    def predict(self, X: Any) -> np.ndarray:
        """Point predictions: f(x) (absolute), the band's midpoint (cqr)."""
        band = self._band(X)
        if "lower_preds" in band:
            return (band["lower_preds"] + band["upper_preds"]) / 2
        p = band["preds"]
        return p.mean(axis=1) if p.ndim == 2 else p

    def predict_interval(self, X: Any,
                         confidence_level: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(y_pred, intervals)``: point predictions and intervals of shape n × 2 × L
        ([lower, upper] per row, one slice per level); ±inf when the threshold is +inf."""
        rel = self._release()
        band = self._band(X)
        ivs = [rel.predict_interval(**band, alpha=a) if a is not None
               else rel.predict_interval(**band) for a in self._alphas(confidence_level)]
        y_pred = self.predict(X)
        return y_pred, np.stack(ivs, axis=-1)
