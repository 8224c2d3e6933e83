"""Prediction sets and calibration from probabilities against the numpy one-liners.

    python bench/predict_bench.py [--n 1000000] [--k 10] [--rounds 7]

- **predict_set**: ``Release.predict_set`` (validation of the n×k matrix, the lac
  score, the sets) against ``1 - probs <= q``;
- **calibrate from probabilities**: ``privcal.accountant.prepare.prepare`` (validation, lac scores
  of the labels) + ``Split.calibrate`` against ``np.partition(1 - probs[arange(n), y],
  r - 1)[r - 1]``.

Rounds alternate reference and privcal; each figure is the best round. The ratio is
privcal / reference (1.0 = numpy's speed).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from privcal.accountant.accountant import Release
from privcal.accountant.prepare import prepare


def _best(fns: list[Callable[[], Any]], rounds: int) -> list[float]:
    best = [math.inf] * len(fns)
    for _ in range(rounds):
        for i, f in enumerate(fns):
            t = time.perf_counter()
            f()
            best[i] = min(best[i], time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    gen = np.random.default_rng(0)
    probs = gen.random((args.n, args.k))
    probs /= probs.sum(axis=1, keepdims=True)
    labels = gen.integers(0, args.k, args.n)
    alpha = 0.1
    r = math.ceil((args.n + 1) * (1 - alpha))
    q = float(np.partition(1 - probs[np.arange(args.n), labels], r - 1)[r - 1])
    rel = Release.model_construct(threshold=q, diagnostics={"score": {"name": "lac"}},
                                  shape={"n": args.n, "k": args.k}, method="split",
                                  params={"alpha": alpha})
    assert (rel.predict_set(probs) == (1 - probs <= q)).all()

    def calibrate() -> float:
        prep = prepare("split", {"alpha": alpha}, probs=probs, labels=labels, score="lac")
        return prep.calibrator.calibrate(prep.data, prep.params, random.Random(0)).threshold

    assert calibrate() == q
    ref_sets, ours_sets, ref_cal, ours_cal = _best([
        lambda: 1 - probs <= q,
        lambda: rel.predict_set(probs),
        lambda: np.partition(1 - probs[np.arange(args.n), labels], r - 1)[r - 1],
        calibrate,
    ], args.rounds)
    print(f"# n = {args.n:,}, k = {args.k}, numpy {np.__version__}, best of {args.rounds} "
          f"alternating rounds; load average {os.getloadavg()[0]:.1f}")
    print("| measurement | numpy | privcal | ratio |")
    print("|---|---|---|---|")
    print(f"| prediction sets (lac) | {1000 * ref_sets:.1f} ms | {1000 * ours_sets:.1f} ms | "
          f"{ours_sets / ref_sets:.2f} |")
    print(f"| split calibration from probabilities (lac) | {1000 * ref_cal:.1f} ms | "
          f"{1000 * ours_cal:.1f} ms | {ours_cal / ref_cal:.2f} |")


if __name__ == "__main__":
    main()
