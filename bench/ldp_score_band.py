"""LDP-CP-S's stop band: the paper's w = Δ_S (calibrator versions ≤ 3) against w = 0 (version
4's default with simulated users), next to LDP-CP-L, on the same calibration draws.

A round whose estimate Z lies in [target, target + w] stops the search and releases its
query; with w = 0 every round runs and the last query an estimate backed is released. On
the same draws (the same groups, the same randomized bits up to the band's stop) the w = 0
release is never larger: where the band stopped at q, w = 0 sets hi = q and goes on, and hi
only falls. Both release a query a passing round backed, so the guarantee (seed 004,
Theorem 4, with the exact per-round cut-off) is the same. A collection session keeps
w = Δ_S: its groups not yet asked are never asked, so an early stop spares their charge.

Data: the synthetic *calibrated* model of ``bench/guaranteed_sizes.py`` (p̂ = softmax of
N(0, s²) logits, y ~ p̂), score lac (1 − p̂_y), α = 0.1, δ = 0.001, 2 000 test points; the
first rows are Penso et al.'s Table 1 size (n = 10 832, ε = 4) around the k where the
proven slacks cross (``privcal advise``), then k = 10 over n and ε.

Run:  python bench/ldp_score_band.py [--trials 20]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import time

import numpy as np
from guaranteed_sizes import _cov, _size, synthetic  # bench/guaranteed_sizes.py

from privcal.calibrators.base import CalibrationInput
from privcal.calibrators.ldp_label import LDPLabel, LDPLabelParams
from privcal.calibrators.ldp_score import LDPScoreParams, simulate
from privcal.calibrators.mechanisms.randomized_response import krr_many

ALPHA = 0.1
#: (k, logit scale, n, ε): Table 1's size across the crossover, then k = 10 over n and ε
SETTINGS = ([(k, 3.0, 10_832, 4.0) for k in (10, 18, 24, 32, 48)]
            + [(10, 2.0, n, e) for n in (1_000, 5_000, 20_000) for e in (1.0, 2.0, 4.0)])


def _threshold(t: float | None) -> float:
    return math.inf if t is None else float(t)


def row(k: int, scale: float, n: int, eps: float, trials: int) -> str:
    """One table row: mean set size (and coverage) of each method over ``trials`` draws."""
    test_p, test_y = synthetic(k, 2000, 99, scale)
    test_scores = 1 - test_p
    test_true = test_scores[np.arange(len(test_y)), test_y]
    sizes: dict[str, list[float]] = {"band": [], "zero": [], "label": []}
    covs: dict[str, list[float]] = {m: [] for m in sizes}
    smaller = 0
    for i in range(trials):
        probs, y = synthetic(k, n, 10 * i + 1, scale)
        cal = 1 - probs[np.arange(n), y]
        t_band = _threshold(simulate(cal, LDPScoreParams(alpha=ALPHA, epsilon=eps, band=None),
                                     random.Random(i)).threshold)
        t_zero = _threshold(simulate(cal, LDPScoreParams(alpha=ALPHA, epsilon=eps),
                                     random.Random(i)).threshold)
        assert t_zero <= t_band, (k, n, eps, i)  # pathwise: w = 0 never releases more
        smaller += t_zero < t_band
        noisy = krr_many(y, k, eps, np.random.default_rng(i))
        t_label = float(LDPLabel().calibrate(CalibrationInput(probs=probs, labels=noisy),
                                             LDPLabelParams(alpha=ALPHA, epsilon=eps, k=k),
                                             random.Random(i)).threshold)
        for m, t in (("band", t_band), ("zero", t_zero), ("label", t_label)):
            sizes[m].append(_size(test_scores, t))
            covs[m].append(_cov(test_true, t))
    s = {m: float(np.mean(v)) for m, v in sizes.items()}
    c = {m: float(np.mean(v)) for m, v in covs.items()}
    return (f"| {k} | {n:,} | {eps:g} | {s['band']:.2f} ({c['band']:.3f}) | "
            f"{s['zero']:.2f} ({c['zero']:.3f}) | {100 * (1 - s['zero'] / s['band']):.1f} % | "
            f"{smaller}/{trials} | {s['label']:.2f} ({c['label']:.3f}) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    a = ap.parse_args()
    t0 = time.perf_counter()
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} cpus (shared); {a.trials} calibration draws per row; α = {ALPHA}, "
          "δ = 0.001; mean set size (mean coverage)")
    print("| k | n | ε | LDP-CP-S, w = Δ_S | LDP-CP-S, w = 0 | smaller by | draws smaller | "
          "LDP-CP-L |")
    print("|---" * 8 + "|")
    for k, scale, n, eps in SETTINGS:
        print(row(k, scale, n, eps, a.trials), flush=True)
    print(f"(wall time {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
