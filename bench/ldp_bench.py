"""Benchmarks for the local-DP calibrators (issue 3).

(a) speed of ``ldp-label`` at n = 10⁶ with k = 10 and k = 100, next to one ``numpy.argsort``
    of the n·k scores, and its peak extra memory (tracemalloc; numpy reports its buffers to
    it) as a multiple of the probability matrix;
(b) coverage and mean set size of LDP-CP-L, LDP-CP-S and non-private split conformal on real
    model outputs: softmax of a scikit-learn LogisticRegression on the bundled ``digits``
    data (no download), ε ∈ {1, 2, 4, 8}, α = 0.1, random calibration/test splits.

Run:  python bench/ldp_bench.py [--part speed|coverage|all] [--trials 100]
"""

from __future__ import annotations

import argparse
import gc
import math
import platform
import random
import time
import tracemalloc

import numpy as np

from privcal.calibrators.base import CalibrationInput, conformal_rank
from privcal.calibrators.ldp_label import LDPLabel, LDPLabelParams, label_slack
from privcal.calibrators.ldp_score import LDPScoreParams, simulate
from privcal.calibrators.ldp_score_bounds import best_rounds, score_slack
from privcal.calibrators.mechanisms.randomized_response import krr_many


def _probs(n: int, k: int, seed: int) -> np.ndarray:
    gen = np.random.default_rng(seed)
    p = gen.random((n, k)) ** 4  # peaked rows, like a trained classifier's
    p /= p.sum(axis=1, keepdims=True)
    return p


def bench_speed(n: int, ks: tuple[int, ...], repeats: int) -> None:
    print(f"## (a) ldp-label speed, n = {n:,}")
    print(
        "| k | n·k | argsort (s) | ldp-label calibrate (s) | ratio | "
        "peak extra mem / probs (calibrate) | peak extra mem / probs (argsort) |"
    )
    print("|---|---|---|---|---|---|---|")
    for k in ks:
        probs = _probs(n, k, k)
        labels = np.random.default_rng(1).integers(0, k, n)
        data = CalibrationInput(probs=probs, labels=labels)
        params = LDPLabelParams(alpha=0.1, epsilon=2.0, k=k)
        cal = LDPLabel()
        t_sort, t_cal = [], []
        for _ in range(repeats):
            scores = (1 - probs).reshape(-1)
            gc.collect()
            t0 = time.perf_counter()
            np.argsort(scores)
            t_sort.append(time.perf_counter() - t0)
            del scores
            gc.collect()
            t0 = time.perf_counter()
            cal.calibrate(data, params, random.Random(0))
            t_cal.append(time.perf_counter() - t0)
        gc.collect()
        tracemalloc.start()
        cal.calibrate(data, params, random.Random(0))
        peak_cal = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        scores = (1 - probs).reshape(-1)
        gc.collect()
        tracemalloc.start()
        np.argsort(scores)
        peak_sort = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        del scores
        ts, tc = min(t_sort), min(t_cal)
        print(
            f"| {k} | {n * k:,} | {ts:.2f} | {tc:.2f} | {tc / ts:.2f} | "
            f"{peak_cal / probs.nbytes:.2f} | {peak_sort / probs.nbytes:.2f} |"
        )
        del probs, data
        gc.collect()
    print(f"(best of {repeats}; the calibrate time includes input checks and the score matrix)")


def _set_size(test_scores: np.ndarray, t: float) -> float:
    if math.isinf(t):
        return float(test_scores.shape[1])
    return float((test_scores <= t).sum(axis=1).mean())


def _coverage(test_true: np.ndarray, t: float) -> float:
    return 1.0 if math.isinf(t) else float((test_true <= t).mean())


def bench_coverage(trials: int, n_cal: int) -> None:
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    alpha = 0.1
    x, y = load_digits(return_X_y=True)
    gen = np.random.default_rng(2024)
    perm = gen.permutation(len(y))
    train, rest = perm[:500], perm[500:]
    model = LogisticRegression(max_iter=5000).fit(x[train] / 16, y[train])
    probs_all = model.predict_proba(x[rest] / 16)
    y_all = y[rest]
    k = probs_all.shape[1]
    n_test = len(y_all) - n_cal
    print(
        f"## (b) coverage / set size on sklearn digits (k = {k}), α = {alpha}, "
        f"n_cal = {n_cal}, n_test = {n_test}, {trials} random splits"
    )
    print(
        f"model: LogisticRegression on 500 training images; test accuracy "
        f"{(probs_all.argmax(1) == y_all).mean():.3f}; score: lac"
    )
    print(
        "| method | ε | slack Δ | mean coverage | min coverage | P(cov < 1−α) | "
        "mean set size | trivial sets |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def row(
        name: str, eps: str, slack: str, cov: list[float], size: list[float], triv: list[bool]
    ) -> None:
        c = np.array(cov)
        print(
            f"| {name} | {eps} | {slack} | {c.mean():.4f} | {c.min():.4f} | "
            f"{(c < 1 - alpha).mean():.2f} | {np.mean(size):.3f} | {np.mean(triv):.2f} |"
        )

    splits = [gen.permutation(len(y_all)) for _ in range(trials)]

    def run(method: str, eps: float | None, nominal: bool) -> tuple[list, list, list]:
        cov, size, triv = [], [], []
        for trial, sp in enumerate(splits):
            cal_i, te_i = sp[:n_cal], sp[n_cal:]
            pc, yc = probs_all[cal_i], y_all[cal_i]
            test_scores = 1 - probs_all[te_i]
            test_true = test_scores[np.arange(len(te_i)), y_all[te_i]]
            tgen = np.random.default_rng(10_000 * trial + 7)
            if method == "split":
                s = np.sort(1 - pc[np.arange(n_cal), yc])
                r = conformal_rank(n_cal, alpha)
                t = math.inf if r > n_cal else float(s[r - 1])
            elif method == "ldp-label":
                noisy = krr_many(yc, k, eps, tgen)
                p = LDPLabelParams(alpha=alpha, epsilon=eps, k=k, nominal=nominal)
                t = (
                    LDPLabel()
                    .calibrate(CalibrationInput(probs=pc, labels=noisy), p, random.Random(trial))
                    .threshold
                )
            else:
                p = LDPScoreParams(alpha=alpha, epsilon=eps, nominal=nominal)
                t = simulate(1 - pc[np.arange(n_cal), yc], p, random.Random(trial)).threshold
            t = float(t) if t is not None else math.inf
            cov.append(_coverage(test_true, t))
            size.append(_set_size(test_scores, t))
            triv.append(math.isinf(t) or t >= 1.0)
        return cov, size, triv

    row("split (non-private)", "—", "—", *run("split", None, False))
    for eps in (1.0, 2.0, 4.0, 8.0):
        sl = label_slack(n_cal, k, eps, 0.001)
        t_s = best_rounds(n_cal, eps, 0.001)
        d_s = score_slack(n_cal // t_s, t_s, eps, 0.001)
        for nominal in (False, True):
            tag = " nominal" if nominal else ""
            row(f"ldp-label{tag}", f"{eps:g}", f"{sl.delta_L:.3f}", *run("ldp-label", eps, nominal))
            row(
                f"ldp-score{tag} (T={t_s})",
                f"{eps:g}",
                f"{d_s:.3f}",
                *run("ldp-score", eps, nominal),
            )
    print(
        "(trivial: threshold +inf or ≥ 1, i.e. every label; default mode targets 1−α+Δ "
        "and guarantees coverage ≥ 1−α w.p. ≥ 0.999; nominal targets 1−α, "
        "guarantees ≥ 1−α−Δ)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=["speed", "coverage", "all"], default="all")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--n-cal", type=int, default=800)
    a = ap.parse_args()
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"{platform.machine()}, {__import__('os').cpu_count()} cpus"
    )
    if a.part in ("speed", "all"):
        bench_speed(a.n, (10, 100), a.repeats)
    if a.part in ("coverage", "all"):
        bench_coverage(a.trials, a.n_cal)


if __name__ == "__main__":
    main()
