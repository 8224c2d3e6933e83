"""Speed of federated planning: FedCP-QQ (ℓ*, k*), FedCP²-QQ (γ, ℓ_γ, ℓ_cor, k_γ), unequal sizes.

Targets (issue 5): (m, n) = (100, 1000) planned in < 1 s, (1000, 10 000) in < 10 s.

Each plan is timed cold: the memo of M values and the plan caches are cleared
before every run, so the time is the full search. One-time process costs
(importing scipy, computing the 256 Gauss–Legendre nodes) are measured
separately and reported in the first line. Also printed: the number of
M_{ℓ,k} evaluations, and for FedCP-QQ the difference between the selected
plan's M and the same M with 1024 quadrature nodes (accuracy check).

Run::

    python bench/fed_plan_speed.py
    python bench/fed_plan_speed.py --repeats 3
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _clear() -> None:
    from privcal.calibrators.fedplan import coverage, plan_qq, plan_qq2, unequal

    coverage.table.cache_clear()
    plan_qq._plan_cached.cache_clear()
    plan_qq2._plan2_cached.cache_clear()
    plan_qq2._plan2_pinned_cached.cache_clear()
    unequal._plan_unequal_cached.cache_clear()


def _evals(m: int, n: int) -> int:
    from privcal.calibrators.fedplan import coverage

    return len(coverage.table(m, n)._memo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="best of this many cold runs")
    ap.add_argument("--alpha", type=float, default=0.1)
    args = ap.parse_args()

    t0 = time.perf_counter()
    from privcal.calibrators import fedplan

    t1 = time.perf_counter()
    fedplan.coverage_M(1, 1, 1, 1)
    t2 = time.perf_counter()
    print(f"one-time: import {t1 - t0:.2f} s, first M (GL nodes) {t2 - t1:.2f} s\n")

    def best_of(fn):  # type: ignore[no-untyped-def]
        times, out = [], None
        for _ in range(args.repeats):
            _clear()
            s = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - s)
        return min(times), out

    rows = []
    for m, n in [(5, 10), (50, 20), (100, 1000), (1000, 1000), (100, 10000), (1000, 10000)]:
        t, p = best_of(lambda m=m, n=n: fedplan.plan_fedcp_qq(m, n, args.alpha))
        acc = abs(p.M - float(fedplan.coverage_M_array(p.l, p.k, m, n, nodes=1024)))
        rows.append(
            ("fedcp-qq", f"({m}, {n})", f"ℓ={p.l} k={p.k} M={p.M:.10f}", _evals(m, n), t, acc)
        )
    for m, n, eps in [(5, 200, 10.0), (100, 1000, 10.0), (100, 1000, 1.0), (1000, 10000, 1.0)]:
        t, p = best_of(lambda m=m, n=n, eps=eps: fedplan.plan_fedcp2_qq(m, n, args.alpha, eps))
        desc = f"ε={eps:g}: γ={p.gamma} ℓγ={p.l_gamma} ℓcor={p.l_cor} kγ={p.k_gamma} M={p.M:.4f}"
        rows.append(("fedcp2-qq", f"({m}, {n})", desc, _evals(m, n), t, float("nan")))
    for m in (100, 300):
        sizes = list(np.random.default_rng(m).integers(10, 1000, size=m))
        t, p = best_of(lambda sizes=sizes: fedplan.plan_fedcp_qq_unequal(sizes, args.alpha))
        rows.append(
            ("unequal", f"m={m}, n_j∈[10,1000)", f"k={p.k} M={p.M:.10f}", 0, t, float("nan"))
        )

    print("| method | (m, n) | plan | M evaluations | time (s) | |M − M_1024| |")
    print("|---|---|---|---|---|---|")
    for meth, mn, desc, ev, t, acc in rows:
        a = "" if np.isnan(acc) else f"{acc:.1e}"
        print(f"| {meth} | {mn} | {desc} | {ev or ''} | {t:.3f} | {a} |")


if __name__ == "__main__":
    main()
