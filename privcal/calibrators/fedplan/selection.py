"""Algorithm 1's selection of (ℓ*, k*) at a coverage level (Humbert et al. 2023, eq. (6)).

**Selection** (Algorithm 1, eq. (6)): (ℓ*, k*) = argmin{M_{ℓ,k} : M_{ℓ,k} ≥ 1−α}.
M is non-decreasing in ℓ and in k, so ℓ_k = min{ℓ : M_{ℓ,k} ≥ 1−α} is
non-increasing in k; we walk that staircase (galloping/bisection per k), which
costs O(m + n) evaluations of M instead of O(mn).
**Decision** (ties with float error): M_{ℓ,k} ≥ 1−α − 1e−12 counts as reaching
the level: M is a rational number that can equal 1−α exactly (m = 1 gives
ℓ/(n+1)), the quadrature is accurate to ~1e−14, and with this rule m = 1 and
n = 1 reproduce the split-conformal rank ⌈(1−α)(n+1)⌉ exactly.
"""

from __future__ import annotations

import math

import numpy as np

from privcal.calibrators.fedplan.coverage import FEAS_TOL, MTable, coverage_M_max


def _smallest_l(tab: MTable, k: int, tgt: float, lo: int, hi: int, from_top: bool) -> int:
    """min{ℓ in (lo, hi] : M_{ℓ,k} ≥ tgt}, given M_{hi,k} ≥ tgt and (lo = 0 or M_{lo,k} < tgt).

    Gallops from the end where the answer is expected (the staircase moves by
    a step or two), then bisects.
    """
    step = 1
    if from_top:
        while hi - lo > 1:
            probe = max(hi - step, lo + 1)
            if tab(probe, k) >= tgt:
                hi = probe
                step *= 2
            else:
                lo = probe
                break
    else:
        while hi - lo > 1:
            probe = min(lo + step, hi - 1)
            if tab(probe, k) >= tgt:
                hi = probe
                break
            lo = probe
            step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tab(mid, k) >= tgt:
            hi = mid
        else:
            lo = mid
    return hi


def select(
    tab: MTable,
    target: float,
    lower: dict[int, int] | None = None,
    shift: dict[int, int] | None = None,
) -> tuple[int, int, float, dict[int, int]] | None:
    """Algorithm 1's (ℓ*, k*) at level ``target``; None when no (ℓ, k) reaches it.

    Returns (ℓ*, k*, M, {k: ℓ_k}). ``lower`` holds ℓ_k for a smaller target
    (ℓ_k is non-decreasing in the target), which turns a new search into a
    few steps up.
    """
    m, n = tab.m, tab.n
    tgt = target - FEAS_TOL
    feasible = np.nonzero(coverage_M_max(np.arange(1, m + 1), m, n) >= tgt)[0]
    if feasible.size == 0:
        return None
    k0 = int(feasible[0]) + 1
    if lower is not None:
        return _select_warm(tab, tgt, k0, lower, shift or {})
    best: tuple[float, int, int] | None = None
    ls: dict[int, int] = {}
    hi = n  # ℓ_k ≤ ℓ_{k−1}; for k0, M_{n,k0} ≥ tgt by the closed form
    for k in range(k0, m + 1):
        # M_{hi,k} ≥ M_{hi,k−1} ≥ tgt (M is increasing in k), so hi is a valid upper end
        l_k = _smallest_l(tab, k, tgt, 0, hi, from_top=True)
        ls[k] = l_k
        val = tab(l_k, k)
        # the check only matters if float error broke the monotonicity used above
        if val >= tgt and (best is None or val < best[0]):
            best = (val, l_k, k)
        hi = l_k
        if l_k == 1:
            # M_{1,k'} ≥ M_{1,k} for every k' > k: nothing further can be smaller
            break
    if best is None:  # only reachable through float noise at the feasibility boundary
        return None
    return best[1], best[2], best[0], ls


def shift_guess(tab: MTable, k: int, base: int, tgt: float, shift: dict[int, int]) -> int:
    """How far ℓ_k is expected to move up from ``base`` (only a starting guess: the search
    around it is exact). The last move if there was one; else the rise to ``tgt`` at the
    slope M_{base,k} − M_{base−1,k}, when both are already memoised (the previous search
    bracketed ℓ_k = base between them); else 0."""
    if k in shift:
        return shift[k]
    up, below = tab._memo.get((base, k)), tab._memo.get((base - 1, k))
    if up is None or below is None or not up > below:
        return 0
    return max(0, math.ceil((tgt - up) / (up - below)))


def _select_warm(
    tab: MTable, tgt: float, k0: int, lower: dict[int, int], shift: dict[int, int]
) -> tuple[int, int, float, dict[int, int]] | None:
    """:func:`select` after a smaller target: ℓ_k(new) ≥ ℓ_k(old) = ``lower[k]``.

    Every k ≥ k0 searches at once, one vectorised batch of M evaluations per
    round: first at ``lower[k] + shift[k]`` (the last move of ℓ_k; the γ-grid
    raises the level by nearly equal steps), then galloping away from that
    guess and bisecting. The answers are the exact ℓ_k, as the staircase's,
    so the selection is the same.
    """
    m, n = tab.m, tab.n
    ks = np.arange(k0, m + 1)
    base = np.array([lower.get(int(k), 1) for k in ks])
    lo = base - 1  # M(lo) < tgt, or lo = 0
    hi = np.zeros_like(lo)  # 0: no passing ℓ known yet
    guess = np.clip(base + np.array([shift_guess(tab, int(k), int(b), tgt, shift)
                                     for k, b in zip(ks, base, strict=True)]), base, n)
    up = np.ones_like(lo)
    dn = np.ones_like(lo)
    down = np.ones(lo.size, dtype=bool)  # no failure seen yet: gallop down from a pass
    first = True
    while True:
        # ℓ_k ≤ ℓ_{k'} for k' < k (M increases in k): a pass at (ℓ, k') is a pass at (ℓ, k)
        cap = np.minimum.accumulate(np.where(hi > 0, hi, n + 1))
        use = (cap <= n) & (cap > lo) & ((hi == 0) | (cap < hi))
        hi[use] = cap[use]
        open_ = (hi == 0) | (hi - lo > 1)
        if not open_.any():
            break
        if first:
            probe = guess.copy()
        else:
            probe = np.where(
                hi == 0,
                np.minimum(lo + up, n),
                np.where(down, np.maximum(hi - dn, lo + 1), (lo + hi) // 2),
            )
        first = False
        idx = np.nonzero(open_)[0]
        ok = tab.many(probe[idx], ks[idx]) >= tgt
        good, bad = idx[ok], idx[~ok]
        hi[good] = probe[good]
        dn[good] *= 2
        if np.any(probe[bad] >= n):  # M_{n,k} < tgt: only float noise at the boundary
            keep = np.ones(ks.size, dtype=bool)
            keep[bad[probe[bad] >= n]] = False
            ks, lo, hi, up, dn, down = ks[keep], lo[keep], hi[keep], up[keep], dn[keep], down[keep]
            if ks.size == 0:
                return None
            continue
        lo[bad] = probe[bad]
        up[bad] *= 2
        down[bad] = False
    vals = tab.many(hi, ks)
    i = int(np.argmin(vals))  # the first minimum: ties go to the smallest k, as in select
    ls = {int(k): int(h) for k, h in zip(ks, hi, strict=True)}
    return int(hi[i]), int(ks[i]), float(vals[i]), ls
