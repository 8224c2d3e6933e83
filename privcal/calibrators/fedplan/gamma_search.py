"""FedCP²-QQ's search over γ: ℓ_cor (eq. (10)), warm-started selections, exact pruning.

Humbert et al. 2023, Algorithm 3 and §4 "Choosing γ" (SPEC §10).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from privcal.calibrators.fedplan.coverage import FEAS_TOL, MTable, coverage_M_max, table
from privcal.calibrators.fedplan.selection import select, shift_guess

#: γ grid of SPEC §10 (paper §4, "Choosing γ"): 0.01, 0.02, …, 0.99
GAMMA_GRID: tuple[float, ...] = tuple(i / 100 for i in range(1, 100))


def l_correction(gamma: float, alpha: float, m: int, eps: float, bins: int) -> int:
    """ℓ_cor = ⌈(2/ε)·ln(B/δ)⌉ with δ = 1−(1−γα)^{1/m} (Humbert et al. 2023, eq. (10); SPEC §10).

    By Lemma C.4 (exponential-mechanism utility), an agent answering at level
    q with nq ≥ ℓ_γ + ℓ_cor returns a value ≥ its ℓ_γ-th (rounded) score with
    probability ≥ 1−δ; for all m agents at once, ≥ (1−δ)^m = 1−γα.
    """
    delta = -math.expm1(math.log1p(-gamma * alpha) / m)
    return math.ceil((2.0 / eps) * math.log(bins / delta))


def gamma_search(
    m: int, n: int, alpha: float, eps: float, bins: int, budget: int
) -> tuple[tuple[float, float, int, int, int, float] | None, int | None]:
    """Best (crit, γ, ℓ_γ, k_γ, ℓ_cor, M_γ) over the γ grid with ℓ_γ + ℓ_cor ≤ ``budget``."""
    tab = table(m, n)
    best: tuple[float, float, int, int, int, float] | None = None
    lower: dict[int, int] | None = None
    shift: dict[int, int] = {}
    min_cor: int | None = None
    for i, gamma in enumerate(GAMMA_GRID):
        target = (1 - alpha) / (1 - gamma * alpha)
        if best is not None and target - FEAS_TOL >= best[0]:
            break
        if best is not None and lower is not None and rest_cannot_win(
                tab, alpha, m, eps, bins, GAMMA_GRID[i:], lower, best[0], best[3]):
            break
        l_cor = l_correction(gamma, alpha, m, eps, bins)
        min_cor = l_cor if min_cor is None else min(min_cor, l_cor)
        if l_cor >= budget:
            continue  # ℓ_γ ≥ 1, so ℓ_γ + ℓ_cor > budget
        sel = select(tab, target, lower, shift)
        if sel is None:
            break  # higher γ means a higher level: infeasible too
        l_g, k_g, m_g, ls = sel
        if lower is not None:
            shift = {k: v - lower.get(k, v) for k, v in ls.items()}
        lower = ls
        if l_g + l_cor > budget:
            continue
        crit = tab(l_g + l_cor, k_g)
        if best is None or crit < best[0]:
            best = (crit, gamma, l_g, k_g, l_cor, m_g)
    return best, min_cor


#: a bound must clear the best criterion by this much to prune (quadrature/float noise)
_PRUNE_MARGIN = 1e-9
#: width (in server orders k) of the blocks the pruning bound starts from
_PRUNE_BLOCK = 16


def rest_cannot_win(
    tab: MTable, alpha: float, m: int, eps: float, bins: int, rest: Sequence[float],
    lower: dict[int, int], best: float, best_k: int,
) -> bool:
    """Whether no γ in ``rest`` can have a criterion below ``best`` (exact pruning).

    Let t be the level of ``rest[0]`` (the lowest remaining one) and c the least ℓ_cor over
    the γ of ``rest`` that the scan would still reach (it stops at the first level ≥
    ``best``). For every γ in ``rest``, ℓ_k(γ) ≥ ℓ_k(t) (ℓ_k is non-decreasing in the level)
    and ℓ_cor(γ) ≥ c. Lower bounds L_k ≤ ℓ_k(t) are certified by one M value each:
    ``lower[k]`` (ℓ_k at the last level searched, or 1) needs none, and a guess L from the
    memoised slope is certified by M_{L−1,k} < t (M is increasing in ℓ, so every ℓ < L
    fails t). M is increasing in ℓ and in k, and ℓ_k is non-increasing in k, so over a
    block k₁ ≤ k ≤ k₂ of server orders

        crit(γ) = M_{ℓ_γ+ℓ_cor(γ), k_γ} ≥ M_{L_{k₂}+c, k₁}   (k_γ in the block).

    Blocks of :data:`_PRUNE_BLOCK` orders start, those whose bound does not clear ``best``
    (by a margin above float noise) are halved, down to single orders; the blocks near
    ``best_k`` go first, so a bound that fails usually fails early. When every block clears
    ``best``, no remaining γ can replace the best plan (ties keep the smaller γ) and the
    remaining selections are skipped. Orders k that cannot reach t even with ℓ = n (the
    closed form of :func:`coverage_M_max`, as in :func:`select`) hold no candidate.
    """
    reach = [g for g in rest if (1 - alpha) / (1 - g * alpha) - FEAS_TOL < best]
    if not reach:
        return True
    c = min(l_correction(g, alpha, m, eps, bins) for g in reach)
    n = tab.n
    tgt = (1 - alpha) / (1 - rest[0] * alpha) - FEAS_TOL
    feasible = np.nonzero(coverage_M_max(np.arange(1, m + 1), m, n) >= tgt)[0]
    if feasible.size == 0:
        return True  # no (ℓ, k) reaches t, nor any higher level: the scan stops there
    ks = np.arange(int(feasible[0]) + 1, m + 1)
    floor: dict[int, int] = {}  # index into ks → certified lower bound of ℓ_k(t)
    blocks = [(i, min(i + _PRUNE_BLOCK, ks.size) - 1) for i in range(0, ks.size, _PRUNE_BLOCK)]
    near = np.searchsorted(ks, best_k) // _PRUNE_BLOCK
    first = [b for j, b in enumerate(blocks) if abs(j - near) <= 1]
    for pending in (first, [b for b in blocks if b not in first]):
        while pending:
            ends = sorted({e for _, e in pending if e not in floor})
            floor.update(zip(ends, certified_floor(tab, ks[ends], lower, tgt), strict=True))
            ells = np.minimum(np.array([floor[e] for _, e in pending]) + c, n)
            vals = tab.many(ells, ks[[s for s, _ in pending]])
            split = []
            for (s, e), v in zip(pending, vals, strict=True):
                if v < best + _PRUNE_MARGIN:
                    if s == e:
                        return False
                    mid = (s + e) // 2
                    split += [(s, mid), (mid + 1, e)]
            pending = split
    return True


def certified_floor(
    tab: MTable, ks: np.ndarray, lower: dict[int, int], tgt: float
) -> list[int]:
    """Lower bounds L_k ≤ ℓ_k(tgt) = min{ℓ : M_{ℓ,k} ≥ tgt} for the orders ``ks``.

    ``lower[k]`` (ℓ_k at a lower level; 1 if absent) is one without evaluation. From it,
    the rise to ``tgt`` at the memoised slope M_{b,k} − M_{b−1,k} (b = ``lower[k]``) gives a
    guess d; b + d and b + ⌊d/2⌋ are tried at once and the largest L with
    M_{L−1,k} < tgt − margin is kept (then every ℓ < L has M < tgt, M being increasing in ℓ).
    """
    base = [lower.get(int(k), 1) for k in ks]
    tries: list[tuple[int, int, int]] = []  # (position, L, k)
    for i, (k, b) in enumerate(zip(ks, base, strict=True)):
        d = shift_guess(tab, int(k), b, tgt, {})
        for L in {b + d, b + d // 2}:
            if b < L <= tab.n:
                tries.append((i, L, int(k)))
    out = list(base)
    if tries:
        vals = tab.many(np.array([t[1] - 1 for t in tries]), np.array([t[2] for t in tries]))
        for (i, L, _), v in zip(tries, vals, strict=True):
            if v < tgt - _PRUNE_MARGIN and L > out[i]:
                out[i] = L
    return out
