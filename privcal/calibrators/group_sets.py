"""Prediction sets of a stored release (:func:`release_sets`), in particular of a wrapped
release: one threshold per level α and per Mondrian group.

A ``levels:`` / ``mondrian:`` release (:mod:`privcal.calibrators.levels`,
:mod:`privcal.calibrators.mondrian`) stores its thresholds in ``diagnostics`` and each
group's and level's guarantee in ``coverage.details``; :func:`table_of` reads them back
into a :class:`ThresholdTable` (groups × levels). Sets:

- label groups (``group_by="label"``): label y is in the set of x iff S(x, y) ≤ t_y —
  the class-conditional (label-conditional) set; no group column is needed;
- column groups: row i's set is {y : S(x_i, y) ≤ t_{g_i}}, with ``groups`` giving g_i;
  a group the release has no threshold for is an error (it was never calibrated);
- levels: ``alpha`` picks the level (required when there are several).

Randomized scores (aps/raps) draw one u per row, shared by every class of the row, as
:func:`~privcal.calibrators.prediction_sets.prediction_sets` does; ``lac`` compares
probabilities with the exact cut of each threshold (bit-identical to ``1 − p ≤ t``); a label
is also in when its score is ≤ t in the other reading of float32 probabilities
(:mod:`~privcal.calibrators.readings`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from privcal.calibrators.class_labels import column_mismatch, names_are_numbers
from privcal.calibrators.prediction_sets import (
    computed_outside,
    outside_threshold,
    prediction_sets,
    refuse_sets_of_regression,
    release_score,
    sets_for,
    summed_terms,
    threshold_sets,
)
from privcal.calibrators.validation import array_shape, id_strings
from privcal.errors import InvalidInput

__all__ = ["ThresholdTable", "align_columns", "frame_names", "is_wrapped", "level_sets",
           "release_sets", "table_of", "wrapped_sets"]


def is_wrapped(method: str) -> bool:
    """Whether a release's method is a levels/Mondrian wrapper."""
    return method.startswith(("levels:", "mondrian:"))


def _float(v: Any) -> float:
    if isinstance(v, str):  # ±inf are stored as text (json_safe)
        return {"Infinity": math.inf, "-Infinity": -math.inf}.get(v, math.nan)
    return float(v)


@dataclass(frozen=True)
class ThresholdTable:
    """Thresholds and guaranteed lower bounds, ``values[g, l]`` / ``lowers[g, l]`` for group
    g and level l (one row without groups, one column without levels), and the probability
    each bound fails, ``failures[g, l]`` (a P-COQS run's β: red team 24, coverage F2)."""

    levels: tuple[float, ...]
    groups: tuple[str, ...] | None
    group_by: str | None
    values: np.ndarray
    lowers: np.ndarray
    failures: np.ndarray | None = None

    def level(self, alpha: float | None) -> int:
        """The column of level ``alpha`` (None: the only level)."""
        if alpha is None:
            if len(self.levels) == 1:
                return 0
            shown = ", ".join(f"{a:g}" for a in self.levels)
            raise InvalidInput(f"this release has {len(self.levels)} levels α ({shown}): "
                               "choose one (alpha=…, --alpha)")
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) \
                or not 0 < alpha < 1:  # (also an int too big for a float: red team 7)
            raise InvalidInput(f"alpha must be a number in (0, 1), got {alpha!r:.40}")
        for j, a in enumerate(self.levels):
            if math.isclose(a, float(alpha), rel_tol=1e-12, abs_tol=1e-15):
                return j
        shown = ", ".join(f"{a:g}" for a in self.levels)
        raise InvalidInput(f"this release has no level α = {alpha:g} (levels: {shown})")

    def group_rows(self, groups: Any, n: int) -> np.ndarray:
        """Each row's group index, from its group name; unknown groups are an error."""
        assert self.groups is not None
        try:
            ids = id_strings(groups, "groups").astype(str)
        except InvalidInput:  # a release made before a spelling rule keeps its groups' names
            raw = np.asarray(groups, dtype=object).reshape(-1)
            known = set(self.groups)
            if not all(isinstance(g, str) and g in known for g in raw.tolist()):
                raise
            ids = raw.astype(str)
        if ids.shape[0] != n:
            raise InvalidInput(f"groups must give one group per row: {ids.shape[0]} for {n}")
        index = {g: j for j, g in enumerate(self.groups)}
        out = np.empty(n, dtype=np.int64)
        for i, g in enumerate(ids):
            j = index.get(g)
            if j is None:
                raise InvalidInput(f"groups: row {i} is in group {str(g)!r}, which this release "
                                   f"has no threshold for (it was not in the calibration data)")
            out[i] = j
        return out


def _levels_of(diag: dict[str, Any], params: dict[str, Any]) -> list[tuple[float, float]]:
    return [(float(x["alpha"]), _float(x["threshold"])) for x in diag["levels"]]


def table_of(method: str, params: dict[str, Any], diagnostics: dict[str, Any],
             details: dict[str, Any]) -> ThresholdTable:
    """The thresholds and lower bounds of a wrapped release (see the module docstring)."""
    mondrian = method.startswith("mondrian:")
    levelled = method.startswith(("levels:", "mondrian:levels:"))
    alphas = params.get("alpha")
    levels = tuple(float(a) for a in alphas) if levelled else (float(alphas),)

    def lower(prefix: str, a: float, what: str = "lower") -> float:
        key = f"{prefix}alpha={a:g}: {what}" if levelled else f"{prefix}{what}"
        if key not in details:  # a group too small to run records one bound (its +inf
            key = f"{prefix}{what}"  # threshold covers at every level): NaN was read (r9a)
        return _float(details.get(key, math.nan))

    def failures(prefix: str) -> list[float]:
        return [lower(prefix, a, "failure_probability") for a in levels]

    if not mondrian:
        vals = [t for _, t in _levels_of(diagnostics, params)]
        return ThresholdTable(levels, None, None, np.array([vals]),
                              np.array([[lower("", a) for a in levels]]),
                              np.array([failures("")]))
    names = tuple(str(g) for g in params["groups"])
    rows, lows = [], []
    for name, g in zip(names, diagnostics["groups"], strict=True):
        t = _float(g["threshold"])
        inner = g.get("diagnostics") or {}
        if levelled and "levels" in inner:
            rows.append([v for _, v in _levels_of(inner, params)])
        else:  # one level, or a group too small to run: +inf at every level
            rows.append([t] * len(levels))
        lows.append([lower(f"group {name}: ", a) for a in levels])
    return ThresholdTable(levels, names, params.get("group_by"), np.array(rows),
                          np.array(lows), np.array([failures(f"group {n}: ") for n in names]))


def _sets(name: str, options: dict[str, Any], probs: Any, t: np.ndarray,
          rows: np.ndarray | None, rng: random.Random | None) -> np.ndarray:
    """Sets with a threshold per column (``rows`` None, t of shape (k,)) or per row
    (threshold ``t[rows[i]]`` for row i): :func:`~privcal.calibrators.prediction_sets.
    threshold_sets`."""
    return threshold_sets(name, options, probs, t, rows, rng)


def wrapped_sets(table: ThresholdTable, name: str, options: dict[str, Any], probs: Any, *,
                 alpha: float | None = None, groups: Any = None,
                 rng: random.Random | None = None) -> np.ndarray:
    """Boolean n×k sets of a wrapped release at level ``alpha`` (module docstring)."""
    col = table.level(alpha)
    if table.groups is None:
        if groups is not None:
            raise InvalidInput("this release has no Mondrian groups; give no groups")
        return prediction_sets(name, probs, float(table.values[0, col]), rng=rng, **options)
    t = table.values[:, col]
    if table.group_by == "label":
        if groups is not None:
            raise InvalidInput("this release's groups are the labels: each label is tested "
                               "against its own threshold; give no groups")
        k = np.shape(probs)[1] if np.ndim(probs) == 2 else None
        if k != t.shape[0]:
            raise InvalidInput(f"this release has {t.shape[0]} class thresholds; the "
                               f"probabilities have {k} columns")
        return _sets(name, options, probs, t, None, rng)
    if groups is None:
        raise InvalidInput("this release has one threshold per group: give the group of "
                           "every row (groups=…, --groups FILE[:COLUMN])")
    n = int(np.shape(probs)[0]) if np.ndim(probs) >= 1 else 0
    return _sets(name, options, probs, t, table.group_rows(groups, n), rng)


def evaluate_wrapped(release: Any, sets: np.ndarray, labels: Any, *,
                     alpha: float | None = None, groups: Any = None,
                     classes: list[str] | None = None) -> Any:
    """Marginal coverage against the smallest group lower bound at the level, and, for a
    Mondrian release, coverage per group against each group's own bound."""
    from privcal.calibrators.class_labels import encode_labels, is_text_labels
    from privcal.calibrators.evaluation import evaluate_sets, group_coverage, is_marginal
    from privcal.calibrators.validation import check_labels

    table = table_of(release.method, release.params, release.diagnostics or {},
                     _details(release))
    col = table.level(alpha)
    lowers = table.lowers[:, col]
    marginal = is_marginal(release.coverage)
    ev = evaluate_sets(sets, labels, float(lowers.min()), classes=classes, marginal=marginal)
    if table.groups is None:
        return ev
    if is_text_labels(labels):
        labels, _ = encode_labels(labels, classes, sets.shape[1])
    y = check_labels(labels, sets.shape[1], min_rows=1)
    rows = y if table.group_by == "label" else table.group_rows(groups, y.shape[0])
    names = table.groups
    if table.group_by == "label" and classes is not None:
        names = tuple(classes)
    return ev.model_copy(update={"by_group": group_coverage(sets, y, rows, names, lowers,
                                                            marginal)})


def release_groups(release: Any, groups: Any, n: int, *, alpha: float | None = None
                   ) -> tuple[np.ndarray, tuple[str, ...], np.ndarray] | None:
    """A Mondrian release's groups for ``n`` held-out rows: each row's group index (from
    ``groups``), the group names and each group's lower bound at level ``alpha``; None for a
    release without column groups (a plain or levels release)."""
    if not is_wrapped(release.method):
        return None
    table = table_of(release.method, release.params, release.diagnostics or {},
                     _details(release))
    if table.groups is None or table.group_by == "label":
        return None
    return (table.group_rows(groups, n), table.groups,
            table.lowers[:, table.level(alpha)])


def threshold_rows(release: Any) -> list[dict[str, Any]]:
    """Every (group, level) of a release: group, its n, α, threshold, guaranteed lower bound
    and the probability that bound fails (``failure_probability``: a P-COQS run's β, an LDP
    method's δ; 0 for a bound that always holds — red team 24, coverage F2: the rows printed
    a P-COQS level's bound without it). One row for a plain release; group None without
    groups."""

    if not is_wrapped(release.method):
        cov = release.coverage
        lower = cov["lower"] if isinstance(cov, dict) else cov.lower
        fail = (cov.get("failure_probability") if isinstance(cov, dict)
                else cov.failure_probability)
        return [{"group": None, "n": (release.shape or {}).get("n"),
                 "alpha": (release.params or {}).get("alpha"), "threshold": release.threshold,
                 "lower": lower, "failure_probability": fail}]
    table = table_of(release.method, release.params, release.diagnostics or {},
                     _details(release))
    sizes = (release.shape or {}).get("group_sizes") or []
    names = table.groups or (None,)
    fails = table.failures if table.failures is not None else np.full(table.lowers.shape,
                                                                       math.nan)
    return [{"group": g, "n": sizes[i] if table.groups else (release.shape or {}).get("n"),
             "alpha": a, "threshold": float(table.values[i, j]),
             "lower": float(table.lowers[i, j]), "failure_probability": float(fails[i, j])}
            for i, g in enumerate(names) for j, a in enumerate(table.levels)]


def _details(release: Any) -> dict[str, Any]:
    cov = release.coverage
    return dict(cov.get("details", {}) if isinstance(cov, dict) else cov.details)


def frame_names(probs: Any) -> list[str] | None:
    """The column names of a table whose columns are all strings — a pandas DataFrame, a
    pyarrow Table or RecordBatch, a polars DataFrame (red team 16: a pyarrow Table's names
    were dropped, its columns read by position); None for an array or a frame with pandas'
    default 0 … k-1 columns (applied by position). Any other frame (columns partly named,
    or numbered otherwise) is refused: taken by position, a ``dog`` column would be read as
    ``cat``'s. Calibration reads a frame's names by the same rule
    (:func:`~privcal.calibrators.class_labels.column_classes`)."""
    if isinstance(probs, np.ndarray | list | tuple):
        return None
    cols = getattr(probs, "column_names", None)  # pyarrow
    if cols is None:
        cols = getattr(probs, "columns", None)  # pandas, polars
    if cols is None or isinstance(cols, str) or not hasattr(cols, "__iter__"):
        return None
    names = list(cols)
    if all(isinstance(c, str) for c in names):
        return [str(c) for c in names]
    if names == list(range(len(names))):
        return None
    raise InvalidInput(f"probs: its columns {', '.join(map(str, names[:6]))} are neither "
                       "all class names nor pandas' default 0 … k-1: name every column by "
                       "class, or give an array")


def align_columns(release: Any, probs: Any, names: list[str] | None = None,
                  where: str = "probs") -> Any:
    """``probs`` with its columns in the order of the release's class names — or of its
    ``columns``, the names its probability columns had when they were not the classes
    (integer labels with a header ``p0,…,p9``: red team 16, read by position before).

    When the release records such names and the probability columns are named — ``names``
    (e.g. a CSV/parquet header), or a table's string columns — the columns are selected by
    name: every recorded name must be a column and every column a recorded name, else
    one-line :class:`InvalidInput`. Otherwise (no recorded names, or columns without names:
    an array, a headerless CSV) the columns are taken by position.
    """
    from privcal.calibrators.prediction_sets import release_classes

    classes = release_classes(release)
    recorded = (release.diagnostics or {}).get("columns") if classes is None else None
    kind = "classes"
    if isinstance(recorded, list) and all(isinstance(c, str) for c in recorded):
        classes, kind = list(recorded), "column names"
    if names is None:
        names = frame_names(probs)  # a frame numbered 2,0,1 is refused, names or none
    if names is not None and classes is None and names_are_numbers(names):
        # a header 2,0,1 (to_csv of a reordered frame): by position a column would be read
        # as another's (red team 16: 0.30 coverage against a recorded 0.9)
        raise InvalidInput(
            f"{where}: its columns are numbered {', '.join(names[:6])}, not 0 … k-1 in order, "
            f"and release {release.id} records no class names to match them to: give the "
            "columns in the order of the calibration, without a header, or as an array")
    if classes is None or names is None:
        return probs
    missing, extra = column_mismatch(names, classes, where)
    if missing or extra:
        if kind == "classes":
            what = (f"has no column for the class {missing[0]!r}" if missing
                    else f"has a column {extra[0]!r} that is not a class")
        else:
            what = (f"has no column {missing[0]!r}" if missing
                    else f"has a column {extra[0]!r} the calibration's table did not have")
        raise InvalidInput(
            f"{where} {what}: release {release.id} records the {kind} "
            f"{', '.join(classes)} and its columns are matched by name "
            f"(got: {', '.join(names)}); name the columns by class, or give them without "
            "names (an array, a CSV without a header) to take them by position")
    if names == classes:
        return probs
    order = [names.index(c) for c in classes]
    if hasattr(probs, "iloc"):
        return probs.iloc[:, order]
    return np.asarray(probs)[:, order]  # a pyarrow Table or polars frame: n×k


def release_sets(
    release: Any, probs: Any, *, score_name: str | None = None, rng: random.Random | None = None,
    alpha: float | None = None, groups: Any = None,
) -> np.ndarray:
    """Prediction sets of a stored release for new probabilities (boolean n×k).

    A release calibrated on probabilities records their number of classes k; probabilities
    with another number of columns are refused (the threshold means nothing for them).
    A pandas DataFrame's named columns are matched to the release's class names
    (:func:`align_columns`); an array is taken by position.
    A release with several levels or Mondrian groups takes the level ``alpha`` and the
    rows' ``groups`` (this module)."""
    refuse_sets_of_regression(release)
    probs = align_columns(release, probs)
    score = (release.diagnostics or {}).get("score")
    shape = release.shape if isinstance(release.shape, dict) else {}
    k = shape.get("k")
    if k is not None and len(got := array_shape(probs)) == 2 and got[1] != k:
        raise InvalidInput(f"release {release.id} was calibrated on {k} classes; these "
                           f"probabilities have {got[1]} columns")
    outside = computed_outside(release) and summed_terms(score, score_name, probs)  # 0: ours
    if is_wrapped(release.method):
        name, options = release_score(score, score_name)
        table = table_of(release.method, release.params, release.diagnostics or {},
                         _details(release))
        if outside:
            table = replace(table, values=outside_threshold(table.values, outside))
        return wrapped_sets(table, str(name), options, probs, alpha=alpha, groups=groups,
                            rng=rng)
    if groups is not None:
        raise InvalidInput(f"release {release.id} has no Mondrian groups: give no groups")
    own = (release.params or {}).get("alpha")
    if alpha is not None and not (isinstance(own, int | float) and isinstance(alpha, int | float)
                                  and 0 < alpha < 1 and math.isclose(own, alpha, rel_tol=1e-12)):
        raise InvalidInput(f"release {release.id} is at the one level α = {own}, not {alpha}")
    t = outside_threshold(release.threshold, outside) if outside else release.threshold
    return sets_for(score, t, probs, rng=rng, score_name=score_name)


def level_sets(release: Any, probs: Any, *, score_name: str | None = None,
               rng: random.Random | None = None, groups: Any = None
               ) -> list[tuple[float, np.ndarray]]:
    """The sets of a several-level release at every level, ``[(α, n×k sets), …]``, nested
    (smaller α, larger set). The thresholds are nested (:mod:`~privcal.calibrators.levels`),
    so the sets are too *for one draw of the randomized scores*: every level is computed
    from the same uniforms u_i (one 128-bit seed drawn from ``rng``, the same stream at each
    level). Separate calls draw separately, and a randomized ``aps``/``raps`` set at one
    level need not then contain another call's set at a larger α (red team 5)."""
    from privcal.calibrators.base import default_rng

    levels = (release.params or {}).get("alpha")
    if not isinstance(levels, list):
        raise InvalidInput(f"release {release.id} has one level α = {levels}: it has no levels "
                           "to list")
    seed = (rng if rng is not None else default_rng()).getrandbits(128)
    return [(float(a), release_sets(release, probs, score_name=score_name, alpha=float(a),
                                    groups=groups, rng=random.Random(seed)))
            for a in levels]
