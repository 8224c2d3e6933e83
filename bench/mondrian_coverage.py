"""Coverage tables on scikit-learn's bundled data (issue 12): class-conditional (Mondrian)
and marginal calibration, private and not, next to MAPIE and crepes on the same splits.

Needs the ``bench`` extra (scikit-learn, MAPIE 1.6, crepes 0.9.1)::

    pip install -e '.[bench]'
    python bench/mondrian_coverage.py --splits 200            # writes markdown to stdout

Each split: a random train / calibration / test split (40/40/20 % for digits and wine,
50/25/25 % for diabetes), a model fitted on the train part (LogisticRegression; for
diabetes Ridge), then every method calibrated on the same calibration rows and evaluated
on the same test rows, at α = 0.1 (score lac = 1 − p_y; absolute residual for diabetes):

- MAPIE ``SplitConformalClassifier`` / ``SplitConformalRegressor`` (marginal; MAPIE 1.6
  has no class-conditional classifier);
- crepes ``WrapClassifier.calibrate(class_cond=False/True)`` (marginal / Mondrian by class,
  smoothing off), ``ConformalRegressor`` on the residuals with and without Mondrian bins
  (diabetes: the ``sex`` column);
- privcal ``split`` (non-private) marginal and ``--mondrian label`` / ``--groups sex``;
  privcal ``pcoqs`` (ρ-zCDP, guaranteed mode) marginal and Mondrian, through the
  accountant (a charged, recorded release per split).

Columns: mean coverage over splits; the smallest (over classes/groups) of the per-class
mean coverage; mean set size or interval length over the splits whose sets are finite;
the fraction of splits (×groups) whose threshold is +∞ (trivial set: every label, or an
infinite interval) — the price of privacy at these sizes.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from typing import Any

import numpy as np

try:
    from crepes import ConformalRegressor, WrapClassifier
    from mapie.classification import SplitConformalClassifier
    from mapie.regression import SplitConformalRegressor
    from sklearn.datasets import load_diabetes, load_digits, load_wine
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
except ImportError as exc:  # pragma: no cover - a message, not a test
    sys.exit(f"{exc}: this benchmark needs the bench extra: pip install -e '.[bench]' "
             "(scikit-learn, mapie 1.6, crepes 0.9.1)")

from privcal import Accountant

ALPHA = 0.1
PCOQS = {"rho": 1.0, "tol": 1e-4}  # tol 1e-4: N = 14 steps over [0, 1] (default 1e-10: 34)


class Tally:
    """Per-method accumulators over splits."""

    def __init__(self) -> None:
        self.cov: list[float] = []
        self.per_group: dict[Any, list[float]] = defaultdict(list)
        self.size: list[float] = []
        self.infinite = 0
        self.thresholds = 0

    def add(self, covered: np.ndarray, size: np.ndarray, groups: np.ndarray,
            infinite: int = 0, thresholds: int = 1) -> None:
        self.cov.append(float(covered.mean()))
        for g in np.unique(groups):
            self.per_group[g].append(float(covered[groups == g].mean()))
        if np.isfinite(size).all():
            self.size.append(float(size.mean()))
        self.infinite += infinite
        self.thresholds += thresholds

    def row(self) -> tuple[float, float, Any, float]:
        worst = min((np.mean(v), g) for g, v in self.per_group.items())
        size = float(np.mean(self.size)) if self.size else math.inf
        return float(np.mean(self.cov)), worst, size, self.infinite / max(self.thresholds, 1)


def _acct(tmp: str, name: str) -> Accountant:
    acct = Accountant(f"sqlite:///{tmp}/{name}.db")
    acct.create_dataset("d", rho="1000000", allow_nonprivate=True)
    return acct


def _infinite(rel: Any) -> tuple[int, int]:
    rows = rel.thresholds()
    return sum(math.isinf(r["threshold"]) for r in rows), len(rows)


def classification(name: str, loader: Any, splits: int, tmp: str) -> dict[str, Tally]:
    X, y = loader(return_X_y=True)
    k = int(y.max()) + 1
    acct = _acct(tmp, name)
    out: dict[str, Tally] = defaultdict(Tally)
    for seed in range(splits):
        Xtr, Xrest, ytr, yrest = train_test_split(X, y, train_size=0.4, random_state=seed,
                                                  stratify=y)
        Xc, Xt, yc, yt = train_test_split(Xrest, yrest, train_size=2 / 3, random_state=seed,
                                          stratify=yrest)
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
        model.fit(Xtr, ytr)
        pc, pt = model.predict_proba(Xc), model.predict_proba(Xt)

        def add(method: str, sets: np.ndarray, inf: tuple[int, int] = (0, 1),
                yt: np.ndarray = yt) -> None:
            sets = np.asarray(sets, dtype=bool)
            out[method].add(sets[np.arange(yt.shape[0]), yt], sets.sum(axis=1).astype(float),
                            yt, *inf)

        mp = SplitConformalClassifier(model, confidence_level=1 - ALPHA,
                                      conformity_score="lac", prefit=True)
        mp.conformalize(Xc, yc)
        add("MAPIE split (marginal)", mp.predict_set(Xt)[1][:, :, 0])
        for cond in (False, True):
            cr = WrapClassifier(model)
            cr.calibrate(Xc, yc, class_cond=cond)
            label = "crepes class-cond. (Mondrian)" if cond else "crepes (marginal)"
            add(label, _matrix(cr.predict_set(Xt, confidence=1 - ALPHA, smoothing=False), k))
        for method, params, label in (("split", {}, "privcal split"),
                                      ("pcoqs", PCOQS, "privcal pcoqs ρ=1"),
                                      ("pcoqs", {**PCOQS, "rho": 4.0}, "privcal pcoqs ρ=4")):
            for mondrian in (False, True):
                rel = acct.calibrate(method, dataset="d", probs=pc, labels=yc, score="lac",
                                     alpha=ALPHA, rng=random.Random(seed),
                                     **({"mondrian": "label", "public_groups": True}
                                        if mondrian else {}), **params)
                add(f"{label} {'Mondrian' if mondrian else '(marginal)'}",
                    rel.predict_set(pt), _infinite(rel))
    return out


def _matrix(sets: Any, k: int) -> np.ndarray:
    """crepes 0.9.1 returns each set as a list of labels: as an n×k boolean matrix."""
    if isinstance(sets, np.ndarray) and sets.ndim == 2:
        return sets.astype(bool)
    out = np.zeros((len(sets), k), dtype=bool)
    for i, labels in enumerate(sets):
        out[i, np.asarray(labels, dtype=np.int64)] = True
    return out


def regression(splits: int, tmp: str) -> dict[str, Tally]:
    X, y = load_diabetes(return_X_y=True)
    sex = np.where(X[:, 1] > 0, "b", "a")  # the (scaled) sex column: two values
    acct = _acct(tmp, "diabetes")
    out: dict[str, Tally] = defaultdict(Tally)
    idx = np.arange(y.shape[0])
    for seed in range(splits):
        itr, irest = train_test_split(idx, train_size=0.5, random_state=seed)
        ic, it = train_test_split(irest, train_size=0.5, random_state=seed)
        model = Ridge(alpha=1.0).fit(X[itr], y[itr])
        fc, ft = model.predict(X[ic]), model.predict(X[it])
        yt = y[it]

        def add(method: str, iv: np.ndarray, inf: tuple[int, int] = (0, 1),
                yt: np.ndarray = yt, gt: np.ndarray = sex[it]) -> None:
            lo, hi = iv[:, 0], iv[:, 1]
            out[method].add((lo <= yt) & (yt <= hi), hi - lo, gt, *inf)

        mp = SplitConformalRegressor(model, confidence_level=1 - ALPHA, prefit=True)
        mp.conformalize(X[ic], y[ic])
        add("MAPIE split (marginal)", mp.predict_interval(X[it])[1][:, :, 0])
        for bins in (False, True):
            cr = ConformalRegressor()
            cr.fit(y[ic] - fc, bins=sex[ic] if bins else None)
            iv = cr.predict_int(ft, confidence=1 - ALPHA, bins=sex[it] if bins else None)
            add("crepes Mondrian (sex)" if bins else "crepes (marginal)", iv)
        for method, params, label in (
                ("split", {}, "privcal split"),
                ("pcoqs", {"rho": 1.0, "tol": 0.01, "score_range": (0, 350)},
                 "privcal pcoqs ρ=1"),
                ("pcoqs", {"rho": 4.0, "tol": 0.01, "score_range": (0, 350)},
                 "privcal pcoqs ρ=4")):
            for mondrian in (False, True):
                rel = acct.calibrate(method, dataset="d", preds=fc, targets=y[ic],
                                     score="absolute", alpha=ALPHA, rng=random.Random(seed),
                                     **({"groups": sex[ic], "public_groups": True}
                                        if mondrian else {}), **params)
                add(f"{label} {'Mondrian (sex)' if mondrian else '(marginal)'}",
                    rel.predict_interval(ft, groups=sex[it] if mondrian else None),
                    _infinite(rel))
    return out


def table(title: str, res: dict[str, Tally], what: str, group: str) -> str:
    lines = [f"**{title}**", "",
             f"| method | mean coverage | worst {group} (its mean coverage) | mean {what} "
             "(finite splits) | +∞ thresholds |", "|---|---|---|---|---|"]
    for method, t in res.items():
        cov, (worst, g), size, inf = t.row()
        lines.append(f"| {method} | {cov:.3f} | {g}: {worst:.3f} | {size:.3f} | {inf:.0%} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--splits", type=int, default=200)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        parts = [
            table(f"load_digits (k=10, n=1797), {args.splits} splits, α={ALPHA}",
                  classification("digits", load_digits, args.splits, tmp), "set size",
                  "class"),
            table(f"load_wine (k=3, n=178), {args.splits} splits, α={ALPHA}",
                  classification("wine", load_wine, args.splits, tmp), "set size", "class"),
            table(f"load_diabetes (n=442), {args.splits} splits, α={ALPHA}, groups: sex",
                  regression(args.splits, tmp), "interval length", "group"),
        ]
    print("\n\n".join(parts))
    print(f"\n(machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; {time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
