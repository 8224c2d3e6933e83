"""The synthetic regression experiment of Humbert et al. 2023, §5.1 (seed 002), with CQR.

Data (per repetition): X ~ U[1, 5]; Y | X ~ Pois(sin²X + 0.1) + 0.03·X·ε₁ + 25·1{U < 0.01}·ε₂
with ε₁, ε₂ ~ N(0, 1), U ~ U[0, 1] (Romano et al. 2019's design). 1000 training points fit two
quantile regressors (sklearn GradientBoostingRegressor, quantile loss at α/2 and 1−α/2; the
paper uses quantile regression forests — sklearn is a bench-only dependency); the CQR score is
max(f_lo(x) − y, y − f_hi(x)). 1000 calibration points are split into m agents × n scores;
5000 test points measure coverage and interval length (f_lo − t, f_hi + t).

Methods: centralized split conformal on all m·n scores; FedCP-QQ; FedCP-Avg (Lu &
Kalpathy-Cramer 2021: the mean of the agents' ⌈(n+1)(1−α)⌉-th smallest scores, no
guarantee); FedCP²-QQ at ε ∈ {1, 5, 10} (each agent ε-DP).

S_max (public, fixed before any data is seen): 5. The Poisson part has mean ≤ 1.1 and the
Gaussian noise sd ≤ 0.15, so non-outlier scores are far below 5; the 1% outliers with sd 25
exceed it and fall into the top bin (released as +inf only if the aggregate lands there).
Grid: B = 100 points on [0, 5] (negative CQR scores round up to 0).

Run::

    python bench/fed_regression.py                     # m=50 × n=20 and m=5 × n=200, 50 reps
    python bench/fed_regression.py --reps 10           # quicker
"""

from __future__ import annotations

import argparse
import math
import random
import time

import numpy as np

SMAX = 5.0
BINS = 100


def make_data(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.uniform(1, 5, size)
    y = (
        rng.poisson(np.sin(x) ** 2 + 0.1)
        + 0.03 * x * rng.standard_normal(size)
        + 25 * (rng.random(size) < 0.01) * rng.standard_normal(size)
    )
    return x.reshape(-1, 1), y


def run(m: int, n: int, reps: int, alpha: float, seed: int) -> dict[str, list[tuple[float, float]]]:
    from sklearn.ensemble import GradientBoostingRegressor

    from privcal.calibrators.base import conformal_rank
    from privcal.calibrators.federated_agent import aggregate, fedcp2_qq_message, fedcp_qq_message
    from privcal.calibrators.fedplan import plan_fedcp2_qq, plan_fedcp_qq
    from privcal.errors import InfeasiblePlan

    plan = plan_fedcp_qq(m, n, alpha)
    plans2: dict[float, object] = {}
    for eps in (10.0, 5.0, 1.0):
        try:
            plans2[eps] = plan_fedcp2_qq(m, n, alpha, eps, bins=BINS, smax=SMAX)
        except InfeasiblePlan as exc:
            plans2[eps] = exc
    out: dict[str, list[tuple[float, float]]] = {}

    def record(name: str, thr: float, lo: np.ndarray, hi: np.ndarray, s_test: np.ndarray) -> None:
        cov = float(np.mean(s_test <= thr))
        length = float(np.mean(hi - lo + 2 * thr)) if math.isfinite(thr) else math.inf
        out.setdefault(name, []).append((cov, length))

    for rep in range(reps):
        rng = np.random.default_rng(seed + rep)
        prng = random.Random(seed + rep)
        xtr, ytr = make_data(rng, 1000)
        xca, yca = make_data(rng, m * n)
        xte, yte = make_data(rng, 5000)
        models = [
            GradientBoostingRegressor(
                loss="quantile", alpha=a, n_estimators=100, max_depth=3, random_state=rep
            ).fit(xtr, ytr)
            for a in (alpha / 2, 1 - alpha / 2)
        ]
        lo_ca, hi_ca = (md.predict(xca) for md in models)
        lo_te, hi_te = (md.predict(xte) for md in models)
        s_ca = np.maximum(lo_ca - yca, yca - hi_ca)
        s_te = np.maximum(lo_te - yte, yte - hi_te)
        agents = s_ca.reshape(m, n)  # rows arrive in random order: a random split into agents

        r = conformal_rank(m * n, alpha)
        record("centralized split", float(np.sort(s_ca)[r - 1]), lo_te, hi_te, s_te)
        msgs = [fedcp_qq_message(a, plan) for a in agents]
        record(f"FedCP-QQ (ℓ={plan.l}, k={plan.k})", aggregate(msgs, plan), lo_te, hi_te, s_te)
        r_loc = conformal_rank(n, alpha)
        avg = float(np.mean([np.sort(a)[r_loc - 1] if r_loc <= n else math.inf for a in agents]))
        record("FedCP-Avg", avg, lo_te, hi_te, s_te)
        for eps, p2 in plans2.items():
            if isinstance(p2, Exception):
                continue
            msgs2 = [fedcp2_qq_message(a, p2, prng) for a in agents]  # type: ignore[arg-type]
            record(f"FedCP²-QQ ε={eps:g}", aggregate(msgs2, p2), lo_te, hi_te, s_te)  # type: ignore[arg-type]
    for eps, p2 in plans2.items():
        if isinstance(p2, Exception):
            out[f"FedCP²-QQ ε={eps:g}"] = []
            print(f"  FedCP²-QQ ε={eps:g}: refused: {p2}")
        else:
            print(
                f"  FedCP²-QQ ε={eps:g}: γ={p2.gamma} ℓγ={p2.l_gamma} ℓcor={p2.l_cor} "  # type: ignore[attr-defined]
                f"kγ={p2.k_gamma} q={p2.q:.4g}"  # type: ignore[attr-defined]
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=20230)
    args = ap.parse_args()
    for m, n in [(50, 20), (5, 200)]:
        t = time.perf_counter()
        print(f"\n### m = {m} agents × n = {n} scores, α = {args.alpha}, {args.reps} repetitions")
        res = run(m, n, args.reps, args.alpha, args.seed)
        print(
            "\n| method | mean coverage | sd coverage | min coverage | mean length "
            "| median length | reps with +inf |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, vals in res.items():
            if not vals:
                print(f"| {name} | refused (no feasible plan) | | | | | |")
                continue
            cov = np.array([v[0] for v in vals])
            ln = np.array([v[1] for v in vals])
            fin = ln[np.isfinite(ln)]
            mean_len = f"{fin.mean():.3f}" if fin.size == ln.size else f"{fin.mean():.3f} (finite)"
            print(
                f"| {name} | {cov.mean():.4f} | {cov.std(ddof=1):.4f} | {cov.min():.4f} | "
                f"{mean_len} | {np.median(ln):.3f} | {int(np.sum(~np.isfinite(ln)))} |"
            )
        print(f"\n({time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
