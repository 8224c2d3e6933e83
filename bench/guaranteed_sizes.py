"""Mean prediction-set size of the guaranteed (default) modes before and after issue 13.

"before" is the bound of calibrator versions 1 (P-COQS: two-sided sub-Gaussian τ; LDP-CP-L:
two-sided DKW–Massart + McDiarmid; LDP-CP-S: Hoeffding Δ_S and its default rounds), still
selectable with ``bound=...``; "after" is the default (exact / one-sided bounds). "LDP-CP-S
after, interpolate" is the opt-in ``search="interpolate"`` query rule with the same bound.
All run in the same process on the same calibration draws (paired), next to non-private
split conformal and the papers' nominal mode (no proven 1−α guarantee). Score: lac
(1 − p̂_y); α = 0.1; failure probability 0.05 (P-COQS β) and 0.001 (LDP-CP-S, LDP-CP-L δ),
the defaults. P-COQS is run at ρ = ε²/2 (the zCDP level implied by ε-DP).

Data: the bundled ``digits`` example (k = 10; random splits of its 1 400 rows into 900
calibration and 500 test rows), and a synthetic *calibrated* model: logits ~ N(0, s²) per
class, p̂ = softmax, y ~ p̂ (so p̂ is exactly calibrated), k ∈ {10, 100},
n ∈ {1 000, 5 000, 20 000}, 2 000 test points.

Run:  python bench/guaranteed_sizes.py [--trials 20]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import time

import numpy as np

from privcal.calibrators.base import CalibrationInput, conformal_rank
from privcal.calibrators.ldp_label import LDPLabel, LDPLabelParams
from privcal.calibrators.ldp_score import LDPScoreParams, simulate
from privcal.calibrators.mechanisms.randomized_response import krr_many
from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
from privcal.data import load_example

ALPHA = 0.1
EPSILONS = (1.0, 2.0, 4.0, 8.0)


def synthetic(k: int, n: int, seed: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """n rows of a calibrated k-class model: p̂ = softmax(N(0, scale²) logits), y ~ p̂."""
    gen = np.random.default_rng(seed)
    z = gen.normal(0, scale, (n, k))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    u = gen.random((n, 1))
    y = np.minimum((p.cumsum(axis=1) < u).sum(axis=1), k - 1)
    return p, y


def _size(test_scores: np.ndarray, t: float) -> float:
    k = test_scores.shape[1]
    return float(k) if math.isinf(t) else float((test_scores <= t).sum(axis=1).mean())


def _cov(test_true: np.ndarray, t: float) -> float:
    return 1.0 if math.isinf(t) else float((test_true <= t).mean())


METHODS = (
    ("split", None),
    ("pcoqs before", {"bound": "subgaussian"}),
    ("pcoqs after", {"bound": "exact"}),
    ("pcoqs nominal", {"nominal": True}),
    ("ldp-score before", {"bound": "hoeffding"}),
    ("ldp-score after", {}),
    ("ldp-score interpolate", {"search": "interpolate"}),
    ("ldp-score nominal", {"nominal": True}),
    ("ldp-label before", {"bound": "two-sided"}),
    ("ldp-label after", {}),
    ("ldp-label nominal", {"nominal": True}),
)


def thresholds(probs: np.ndarray, y: np.ndarray, eps: float, seed: int) -> dict[str, float]:
    n, k = probs.shape
    cal_scores = 1 - probs[np.arange(n), y]
    noisy = krr_many(y, k, eps, np.random.default_rng(seed))  # the users' k-RR labels
    out: dict[str, float] = {}
    for name, kw in METHODS:
        if name == "split":
            r = conformal_rank(n, ALPHA)
            out[name] = math.inf if r > n else float(np.sort(cal_scores)[r - 1])
        elif name.startswith("ldp-label"):
            p = LDPLabelParams(alpha=ALPHA, epsilon=eps, k=k, **kw)
            data = CalibrationInput(probs=probs, labels=noisy)
            out[name] = float(LDPLabel().calibrate(data, p, random.Random(seed)).threshold)
        elif name.startswith("pcoqs"):
            p = PCOQSParams(alpha=ALPHA, rho=eps * eps / 2, **kw)
            res = PCOQS().calibrate(CalibrationInput(scores=cal_scores), p, random.Random(seed))
            out[name] = float(res.threshold)
        else:
            lp = LDPScoreParams(alpha=ALPHA, epsilon=eps, **kw)
            t = simulate(cal_scores, lp, random.Random(seed)).threshold
            out[name] = math.inf if t is None else float(t)
    return out


_ACC: dict[tuple[str, int, float], tuple[dict[str, list[float]], dict[str, list[float]]]] = {}


def run(
    label: str, draws: list, test_probs: np.ndarray, test_y: np.ndarray, quiet: bool = False
) -> None:
    """Accumulate set sizes and coverages of every method over ``draws``; print the rows
    unless ``quiet`` (then :func:`_flush` prints them)."""
    test_scores = 1 - test_probs
    test_true = test_scores[np.arange(len(test_y)), test_y]
    n = draws[0][0].shape[0]
    for eps in EPSILONS:
        sizes, covs = _ACC.setdefault(
            (label, n, eps), ({m: [] for m, _ in METHODS}, {m: [] for m, _ in METHODS})
        )
        for cp, cy in draws:
            ts = thresholds(cp, cy, eps, 1000 + len(sizes["split"]))
            for m, t in ts.items():
                sizes[m].append(_size(test_scores, t))
                covs[m].append(_cov(test_true, t))
    if not quiet:
        _flush(label)


def _flush(label: str) -> None:
    for (lab, n, eps), (sizes, covs) in list(_ACC.items()):
        if lab != label:
            continue
        cells = " | ".join(f"{np.mean(sizes[m]):.2f}" for m, _ in METHODS)
        after = ("pcoqs after", "ldp-score after", "ldp-label after")
        cov_after = " / ".join(f"{np.mean(covs[m]):.3f}" for m in after)
        print(f"| {label} | {n:,} | {eps:g} | {cells} | {cov_after} |", flush=True)
        del _ACC[(lab, n, eps)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    a = ap.parse_args()
    t0 = time.perf_counter()
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
        f"{os.cpu_count()} cpus (shared); {a.trials} calibration draws per row; α = {ALPHA}"
    )
    print(
        "| data | n | ε | split | P-COQS before | P-COQS after | P-COQS nominal | "
        "LDP-CP-S before | LDP-CP-S after | LDP-CP-S after, interpolate | LDP-CP-S nominal | "
        "LDP-CP-L before | LDP-CP-L after | LDP-CP-L nominal | "
        "coverage after (P-COQS / LDP-CP-S / LDP-CP-L) |"
    )
    print("|---" * 15 + "|")
    ex = load_example("digits")
    pool_p = np.concatenate([ex.calib_probs, ex.test_probs])
    pool_y = np.concatenate([ex.calib_labels, ex.test_labels])
    n_cal = ex.calib_labels.shape[0]
    for i in range(a.trials):  # random splits of the 1 400 rows: 900 calibration, 500 test
        perm = np.random.default_rng(i).permutation(pool_y.shape[0])
        c, t = perm[:n_cal], perm[n_cal:]
        run("digits (k=10)", [(pool_p[c], pool_y[c])], pool_p[t], pool_y[t], quiet=True)
    _flush("digits (k=10)")
    for k, scale in ((10, 2.0), (100, 3.0)):
        test_p, test_y = synthetic(k, 2000, 99, scale)
        for n in (1_000, 5_000, 20_000):
            draws = [synthetic(k, n, 10 * i + 1, scale) for i in range(a.trials)]
            run(f"synthetic k={k}", draws, test_p, test_y)
    print(f"(wall time {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
