"""Amplification by shuffling, the numerics: hockey-stick divergences of clone/blanket pairs.

Everything here is pure floating-point mathematics on public parameters
(ε0, n, δ, k); :mod:`privcal.accountant.privacy.shuffle` turns it into a named,
certified, rounded-up result. The bounds and the "Pair" formula are those of
``shared/SHUFFLE.md``:

- :func:`closed_form_eps`: Feldman, McMillan & Talwar 2021, "Hiding Among the
  Clones: A Simple and Nearly Optimal Analysis of Privacy Amplification by
  Shuffling" (FOCS 2021), Thm 3.1, in the form of the authors' reference code.
- :func:`clone_plan` + :func:`pair_delta`: the same paper's reduction (Thm 3.2 /
  Lemma 3.3: the shuffled output is a post-processing of a pair of
  distributions on (A, B)), with the divergence computed exactly instead of
  bounded; with p_c = 2/(e^ε0+1) it is the "stronger clone" of Feldman,
  McMillan & Talwar 2023, "Stronger Privacy Amplification by Shuffling for
  Rényi and Approximate Differential Privacy" (SODA 2023), valid for
  randomizers with R(x) ≥ (R(x0) + R(x1))/(e^ε0 + 1) pointwise (binary RR, k-RR).
- :func:`blanket_plan`: Balle, Bell, Gascón & Nissim 2019, "The Privacy Blanket
  of the Shuffle Model" (CRYPTO 2019), §3: k-RR = γ·Uniform[k] + (1−γ)·identity,
  computed exactly by conditioning on the blanket size M ~ Bin(n−1, γ).

A plan fixes everything that does not depend on ε (the support of the clone
count C, its binomial weights, the truncated mass), so that the bisection over
ε only re-evaluates the tail probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.stats import binom

__all__ = [
    "FLOAT_SLACK",
    "PairPlan",
    "blanket_plan",
    "certifiable_eps_max",
    "clone_plan",
    "closed_form_eps",
    "pair_delta",
    "pair_plan",
    "sf_half",
    "solve_eps",
    "truncation_tau",
]

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

# Exact tail probabilities are re-anchored with scipy's sf every _BLOCK
# consecutive C; in between, the one-step recurrences of Bin(C, 1/2) are summed.
# 64 keeps the rounding error of the partial sums near 1e-14 absolute while
# calling the (slow, ~5 µs at C ~ 1e6) incomplete beta only once per 64 points.
_BLOCK = 64
# Blanket buckets widen geometrically beyond this many σ of M from its mean: at
# 3σ (with a quarter of the excess as width) the ε lost is ~1e−5 relative, for
# 2–5× fewer Pair evaluations at moderate n.
_TAIL_SIGMAS = 3.0
# Floating-point allowance added to every δ(ε), times (1 + e^ε): it bounds what
# rounding can hide. A threshold ⌊a*⌋ off by one near an integer drops or adds a
# point whose |P − e^ε·Q| is at most P·(1+e^ε)·relerr(a*) ≤ P·(1+e^ε)·1e−15 (one
# such point per c, ΣP ≤ 1); the block sums of sf_half are off by ≤ 64u ≈ 7e−15
# in S, which enters multiplied by e^ε − 1; the pairwise sum over C adds
# ≈ 17u·2e^ε. Total < 2e−14·(1 + e^ε): invisible at ε ≲ 3 for δ ≥ 1e−10, but it
# keeps the certificate honest at large ε, where ⌊a*⌋ alone can be wrong by a lot.
FLOAT_SLACK = 2e-14


def truncation_tau(delta: float) -> float:
    """The truncated probability mass allowed per binomial window, τ = 10⁻⁴·δ (SHUFFLE.md)."""
    return 1e-4 * delta


def _window(m: int, p: float, tau: float) -> tuple[IntArray, FloatArray, float]:
    """Support of Bin(m, p) around μ ± (√(2 ln 1/τ) + 2)σ, its pmf, and the mass left out (≤ τ)."""
    if m == 0 or p <= 0.0:
        return np.zeros(1, dtype=np.int64), np.ones(1), 0.0
    if p >= 1.0:
        return np.full(1, m, dtype=np.int64), np.ones(1), 0.0
    mu = m * p
    sigma = math.sqrt(m * p * (1.0 - p))
    half = (math.sqrt(2.0 * math.log(1.0 / tau)) + 2.0) * sigma
    # The Gaussian width of SHUFFLE.md, widened to the exact τ/2 quantiles: when
    # σ ≪ 1 (rare clones, p·m ≈ 0.01) it would leave out far more than τ. Those quantiles
    # are clamped to Bernstein's bound, which holds for every m and p (each tail beyond
    # μ ± b has mass ≤ exp(−b²/(2(σ² + b/3))) = τ/2): below τ/2 ≈ 1e−16 scipy's ppf/isf
    # return the ends of the support, and the window became all of [0, m] (O(m) memory: a
    # process killed at m = 10⁹). The mass left out is computed exactly either way.
    big = math.log(2.0 / tau) / 3.0
    b = big + math.sqrt(big * big + 6.0 * big * sigma * sigma)
    lo = max(0, min(math.floor(mu - half),
                    max(int(binom.ppf(tau / 2.0, m, p)), math.floor(mu - b))))
    hi = min(m, max(math.ceil(mu + half),
                    min(int(binom.isf(tau / 2.0, m, p)), math.ceil(mu + b))))
    support = np.arange(lo, hi + 1, dtype=np.int64)
    weights = binom.pmf(support, m, p)
    missing = 0.0
    if lo > 0:
        missing += float(binom.cdf(lo - 1, m, p))
    if hi < m:
        missing += float(binom.sf(hi, m, p))
    return support, weights, missing


def sf_half(t: IntArray, c: IntArray, run_start: NDArray[np.bool_] | None = None
            ) -> tuple[FloatArray, FloatArray]:
    """S = Pr[Bin(c, ½) > t] and pmf = Pr[Bin(c, ½) = t], elementwise.

    ``c`` must increase by exactly 1 between consecutive elements except where
    ``run_start`` is True (the first element always starts a run). Along a run,
    S follows the exact identities S_{c+1}(t) = S_c(t) + ½·pmf_c(t) and
    S_c(t+1) = S_c(t) − pmf_c(t+1), re-anchored with scipy's exact sf every
    64 elements; a step of |Δt| > 1 (never produced by the bounds here, whose
    thresholds have slope in [½, 1]) falls back to the direct sf.
    """
    size = t.shape[0]
    pmf = binom.pmf(t, c, 0.5)
    if run_start is None:
        run_start = np.zeros(size, dtype=bool)
    run_start = run_start.copy()
    run_start[0] = True
    dt = np.diff(t)
    within = ~run_start[1:]
    steps_ok = bool(np.all(np.abs(dt[within]) <= 1) and np.all(np.diff(c)[within] == 1))
    if size <= _BLOCK or not steps_ok:
        return binom.sf(t, c, 0.5), pmf
    idx = np.arange(size)
    start_of_run = np.maximum.accumulate(np.where(run_start, idx, 0))
    anchor = ((idx - start_of_run) % _BLOCK) == 0
    inc = np.zeros(size)
    step = 0.5 * pmf[:-1]
    up = (dt == 1) & within
    step[up] -= pmf[1:][up]
    down = (dt == -1) & within
    if np.any(down):
        # S_{c+1}(t−1) = S_{c+1}(t) + pmf_{c+1}(t): the pmf at the previous threshold.
        step[down] += binom.pmf(t[:-1][down], c[1:][down], 0.5)
    inc[1:] = step
    inc[anchor] = 0.0
    block = np.cumsum(anchor) - 1
    pos = idx - np.flatnonzero(anchor)[block]
    n_blocks = int(block[-1]) + 1
    grid = np.zeros((n_blocks, _BLOCK))
    grid[block, pos] = inc
    partial = np.cumsum(grid, axis=1)[block, pos]
    s_anchor = binom.sf(t[anchor], c[anchor], 0.5)
    return s_anchor[block] + partial, pmf


@dataclass(frozen=True)
class PairPlan:
    """The ε-independent part of one or more Pair(ε; n, pa, qa, r) divergences (SHUFFLE.md).

    ``c`` is the clone count C of the other users, ``n_pair`` the Pair's n for each
    element (the victim plus the others), ``weight`` the probability of that
    (group, C) and ``missing`` the total truncated probability (added to δ,
    each conditional term being ≤ 1). Several Pairs (the blanket's buckets) are
    concatenated; ``run_start`` marks where a new one begins.
    """

    pa: float
    qa: float
    r: float
    c: IntArray
    n_pair: FloatArray
    weight: FloatArray
    run_start: NDArray[np.bool_]
    group: IntArray
    group_weight: FloatArray
    missing: float

    @property
    def w(self) -> float:
        """Probability that the victim's report is neither of the two distinguished values."""
        return max(0.0, 1.0 - self.pa - self.qa)

    @property
    def size(self) -> int:
        """Number of clone counts evaluated per δ(ε)."""
        return int(self.c.shape[0])


def pair_plan(n: int, pa: float, qa: float, r: float, tau: float) -> PairPlan:
    """Plan of Pair(ε; n, pa, qa, r): others C ~ Bin(n−1, 2r), A | C ~ Bin(C, ½) (SHUFFLE.md)."""
    return _concat_pairs([(n, 1.0)], pa, qa, r, tau, 0.0)


def _concat_pairs(groups: list[tuple[int, float]], pa: float, qa: float, r: float,
                  tau: float, outer_missing: float) -> PairPlan:
    if not pa > qa:
        raise ValueError("Pair needs pa > qa")
    cs: list[IntArray] = []
    ns: list[FloatArray] = []
    ws: list[FloatArray] = []
    starts: list[NDArray[np.bool_]] = []
    gid: list[IntArray] = []
    gweights: list[float] = []
    missing = outer_missing
    for g, (n, mass) in enumerate(groups):
        support, weights, miss = _window(n - 1, 2.0 * r, tau)
        missing += mass * miss
        cs.append(support)
        ns.append(np.full(support.shape[0], float(n)))
        ws.append(weights * mass)
        start = np.zeros(support.shape[0], dtype=bool)
        start[0] = True
        starts.append(start)
        gid.append(np.full(support.shape[0], g, dtype=np.int64))
        gweights.append(mass)
    return PairPlan(
        pa=pa, qa=qa, r=r,
        c=np.concatenate(cs), n_pair=np.concatenate(ns), weight=np.concatenate(ws),
        run_start=np.concatenate(starts), group=np.concatenate(gid),
        group_weight=np.asarray(gweights), missing=missing,
    )


def pair_delta(eps: float, plan: PairPlan) -> float:
    """δ(ε) = D_{e^ε}(P‖Q) of the planned Pair(s), an upper bound (truncated mass added).

    SHUFFLE.md "Pair": with E = e^ε, g(c) = r(n−c)/(1−2r) and
    a*(c) = [(E·pa − qa)·c + (E−1)·w·g(c)] / [(pa − qa)(1+E)],
    δ = Σ_C Bin(n−1, 2r)(C)·[(pa − E·qa)·S_C(⌊a*(C+1)⌋ − 1) + (qa − E·pa)·S_C(⌊a*(C+1)⌋)
    + w(1−E)·S_C(⌊a*(C)⌋)], S_C(t) = Pr[Bin(C, ½) > t]. Using
    S_C(t−1) = S_C(t) + pmf_C(t), the first two terms are
    (1−E)(pa+qa)·S_C(t1) + (pa − E·qa)·pmf_C(t1); and S_C(⌊a*(C)⌋) is
    S_{C−1}(t1(C−1)) + ½·pmf_{C−1}(t1(C−1)), so one tail per C suffices.
    Each Pair's sum is clamped at 0 before the truncated mass and a floating-point
    allowance of 2e−14·(1 + E) (see ``FLOAT_SLACK``) are added.
    """
    big_e = math.exp(eps)
    pa, qa, w, r = plan.pa, plan.qa, plan.w, plan.r
    denom = (pa - qa) * (1.0 + big_e)
    slope = big_e * pa - qa
    c = plan.c

    def a_star(cc: IntArray) -> FloatArray:
        num = slope * cc.astype(np.float64)
        if w > 0.0:
            num = num + (big_e - 1.0) * w * (r * (plan.n_pair - cc) / (1.0 - 2.0 * r))
        return num / denom

    # Clip keeps the integers small; outside [−1, C] the tails are exactly 1 or 0.
    t1 = np.clip(np.floor(a_star(c + 1)), -1, c + 1).astype(np.int64)
    s1, pm1 = sf_half(t1, c, plan.run_start)
    term = (1.0 - big_e) * (pa + qa) * s1 + (pa - big_e * qa) * pm1
    if w > 0.0:
        t0 = np.clip(np.floor(a_star(c)), -1, c + 1).astype(np.int64)
        s0 = np.empty_like(s1)
        s0[1:] = s1[:-1] + 0.5 * pm1[:-1]
        starts = plan.run_start.copy()
        starts[0] = True
        # At a run start there is no previous C; elsewhere t0(C) == t1(C−1) exactly,
        # the same float expression of the same integer.
        s0[starts] = binom.sf(t0[starts], c[starts], 0.5)
        term += w * (1.0 - big_e) * s0
    per_group = np.bincount(plan.group, weights=plan.weight * term,
                            minlength=plan.group_weight.shape[0])
    return float(np.sum(np.maximum(per_group, 0.0))) + plan.missing + FLOAT_SLACK * (1.0 + big_e)


def clone_plan(eps0: float, n: int, tau: float, *, stronger: bool) -> PairPlan:
    """Clone reduction of FMT21 (Thm 3.2): p_c = e^{−ε0}, or FMT23's p_c = 2/(e^ε0 + 1).

    pa = e^ε0/(e^ε0 + 1), qa = 1/(e^ε0 + 1), r = p_c/2; the victim always lands in
    (1, 0) or (0, 1) (w = 0).
    """
    e = math.exp(eps0)
    p_c = 2.0 / (e + 1.0) if stronger else math.exp(-eps0)
    return pair_plan(n, e / (e + 1.0), 1.0 / (e + 1.0), p_c / 2.0, tau)


def blanket_plan(eps0: float, n: int, k: int, tau: float, eta: float = 1e-3,
                 tail_sigmas: float = _TAIL_SIGMAS) -> PairPlan:
    """Exact privacy blanket of k-RR, k ≥ 3 (BBGN19 §3, computed exactly as in SHUFFLE.md).

    δ(ε) = Σ_M Bin(n−1, γ)(M)·Pair(ε; M+1, e/(e+k−1), 1/(e+k−1), 1/k), γ = k/(e+k−1).
    Pair is non-increasing in M (one more blanket user is independent noise,
    identical under P and Q: post-processing), so M is grouped into buckets
    [b, b + w(b) − 1], each evaluated at its left end b: an upper bound for any
    grouping. w(b) = max(1, ⌊η·b⌋, ⌊(|b − μ| − 3σ)/4⌋): relative width η near the
    mean μ of M (an ε loss of about η/2), geometrically wider buckets in the
    tails beyond 3σ, where little mass sits; O(√n) values of M collapse into
    ≈ 6/(η√n) + O(log n) buckets. ``eta=0, tail_sigmas=math.inf`` gives the unbucketed sum.
    """
    if k < 3:
        raise ValueError("the blanket bound needs k ≥ 3")
    e = math.exp(eps0)
    gamma = k / (e + k - 1.0)
    support, weights, outer_missing = _window(n - 1, gamma, tau)
    mu = (n - 1) * gamma
    sigma = math.sqrt((n - 1) * gamma * (1.0 - gamma))
    groups: list[tuple[int, float]] = []
    i = 0
    while i < support.shape[0]:
        left = int(support[i])
        tail = max(0.0, (abs(left - mu) - tail_sigmas * sigma) / 4.0)  # 0 when tails are off
        width = max(1, math.floor(eta * left), math.floor(tail))
        j = min(support.shape[0], i + width)
        groups.append((left + 1, float(np.sum(weights[i:j]))))
        i = j
    return _concat_pairs(groups, e / (e + k - 1.0), 1.0 / (e + k - 1.0), 1.0 / k, tau,
                         outer_missing)


def certifiable_eps_max(delta: float) -> float:
    """Largest ε at which the floating-point allowance 2e−14·(1+e^ε) is ≤ δ/10.

    Searching above it is pointless (the allowance alone would exceed δ) and
    would make δ(ε) increase with ε; below it, the allowance changes δ by < 10%.
    Negative when δ < 4e−13 (nothing can be certified).
    """
    return math.log(max(delta / (10.0 * FLOAT_SLACK) - 1.0, 1e-300))


def closed_form_eps(eps0: float, n: int, delta: float) -> float | None:
    """FMT21 Thm 3.1 (closed form, any ε0-LDP randomizer), or None outside its validity.

    a = 8√(e^ε0·ln(4/δ)/n), c = 8e^ε0/n, ε̂ = ln(1+a+c);
    ε = ln(1 + (1−e^{−ε0})/(1+e^{−ε0−ε̂})·(a+c)), valid only when
    ε0 ≤ ln(n/(16 ln(4/δ))) (SHUFFLE.md bound 1).
    """
    ratio = n / (16.0 * math.log(4.0 / delta))
    if ratio <= 1.0 or eps0 > math.log(ratio):
        return None
    e = math.exp(eps0)
    a = 8.0 * math.sqrt(e * math.log(4.0 / delta) / n)
    c = 8.0 * e / n
    eps_hat = math.log(1.0 + a + c)
    return math.log1p((1.0 - math.exp(-eps0)) / (1.0 + math.exp(-eps0 - eps_hat)) * (a + c))


def solve_eps(delta_fn: Callable[[float], float], eps_max: float, delta: float,
              rtol: float = 1e-6) -> tuple[float, float] | None:
    """Smallest ε in [0, ε_max] with δ(ε) ≤ δ, as the upper end of a bracket, and δ there.

    δ(ε) is non-increasing, so the bracket [lo, hi] keeps δ(lo) > δ ≥ δ(hi). The
    next point is the Illinois (modified regula falsi) step on ln δ(ε) − ln δ,
    replaced by a bisection whenever three steps fail to halve the bracket; it
    stops when hi − lo ≤ rtol·hi and returns hi. None when δ(ε_max) > δ.
    """
    log_target = math.log(delta)

    def f(x: float) -> tuple[float, float]:
        d = delta_fn(x)
        return math.log(max(d, 1e-300)) - log_target, d

    f_hi, d_hi = f(eps_max)
    if f_hi > 0.0:
        return None
    f_lo, d_lo = f(0.0)
    if f_lo <= 0.0:
        return 0.0, d_lo
    lo, hi = 0.0, eps_max
    last_side = 0
    widths = [hi - lo]
    while hi - lo > rtol * hi:
        if len(widths) >= 4 and widths[-1] > 0.5 * widths[-4]:
            x = 0.5 * (lo + hi)
            widths.clear()
        else:
            x = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
            if not lo < x < hi:
                x = 0.5 * (lo + hi)
        fx, dx = f(x)
        if fx <= 0.0:
            hi, f_hi, d_hi = x, fx, dx
            if last_side == 1:
                f_lo *= 0.5
            last_side = 1
        else:
            lo, f_lo = x, fx
            if last_side == -1:
                f_hi *= 0.5
            last_side = -1
        widths.append(hi - lo)
    return hi, d_hi
