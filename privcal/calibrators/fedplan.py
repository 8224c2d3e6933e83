"""Planning one-shot federated calibration: FedCP-QQ and FedCP²-QQ (SPEC §9, §10).

Humbert, Le Bars, Bellet, Arlot, *One-Shot Federated Conformal Prediction*,
ICML 2023 (seed 002). m agents each send one local order statistic; the server
takes an order statistic of the m messages. Everything here is public: it
depends on (m, n, α, ε, B) only, never on data.

**Exact coverage** (Thm 3.2, eq. (5); equality for continuous scores). With
U_(ℓ,k) the k-th smallest of m independent copies of the ℓ-th smallest of n
uniforms,

    M_{ℓ,k} = P(U ≤ U_(ℓ,k)) = E[U_(ℓ,k)] = ∫₀¹ P(Bin(m, I_t(ℓ, n−ℓ+1)) ≤ k−1) dt,

because U_(ℓ,k) > t iff fewer than k messages are ≤ t, and each message is ≤ t
with probability I_t(ℓ, n−ℓ+1) (Lemma C.1; proof of Thm 3.2, App. C.1).

**Quadrature** (SPEC §9, with one refinement). Fixed Gauss–Legendre with 256
nodes on a window outside which the integrand is 0 or 1 to 1e−17. SPEC §9
takes the window from the quantiles of Beta(ℓ, n−ℓ+1) (the law of one message);
for many agents the integrand's transition is ~√m times narrower than that
window and 256 nodes are not enough (error 4e−6 at m=1000, n=10 000).
**Decision**: use the quantiles of U_(ℓ,k) itself, which are exact and cheap:
U_(ℓ,k) = Q_ℓ(V) with Q_ℓ the Beta(ℓ, n−ℓ+1) quantile function and
V ~ Beta(k, m−k+1) (the k-th of m uniforms), so its p-quantile is Q_ℓ(Q_V(p)).
This window is inside SPEC's, and M is then accurate to ~1e−14 (checked
against 2048 nodes and against exact rational values in the tests).

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
from collections.abc import Sequence
from fractions import Fraction
from functools import cache, lru_cache
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from privcal.calibrators.base import conformal_rank
from privcal.errors import InfeasiblePlan, InvalidInput

__all__ = [
    "GAMMA_GRID",
    "GL_NODES",
    "Fed2Plan",
    "FedPlan",
    "FedPlanUnequal",
    "coverage_M",
    "coverage_M_array",
    "coverage_M_max",
    "coverage_M_unequal",
    "l_correction",
    "plan_fedcp2_qq",
    "plan_fedcp2_qq_pinned",
    "plan_fedcp_qq",
    "plan_fedcp_qq_pinned",
    "plan_fedcp_qq_unequal",
    "replan_fedcp2_qq_subset",
    "replan_fedcp_qq_subset",
]

#: Gauss–Legendre nodes for M_{ℓ,k} (SPEC §9)
GL_NODES = 256
#: probability mass left outside the quadrature window on each side
_TAIL = 1e-17
#: M within this of 1−α counts as reaching it (module docstring, "Decision")
_FEAS_TOL = 1e-12
#: γ grid of SPEC §10 (paper §4, "Choosing γ"): 0.01, 0.02, …, 0.99
GAMMA_GRID: tuple[float, ...] = tuple(i / 100 for i in range(1, 100))


@cache
def _gauss_legendre(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    from scipy.special import roots_legendre  # here: privcal.client loads no SciPy

    # scipy's Golub–Welsch + Newton is ~5x faster than numpy's leggauss at 256 nodes (0.8 s)
    x, w = roots_legendre(nodes)
    return np.asarray(x), np.asarray(w)


#: Resource bounds (issue 16.2), checked before any plan is computed and so before anything
#: is charged. Planning costs grow with the number of agents m (≈ 10 s for FedCP-QQ and
#: ≈ 30 s for FedCP²-QQ at m = 10 000 on a loaded 2-core machine; m = 10⁷ ran > 300 s and
#: m = 10⁹ exhausted memory): m ≤ MAX_AGENTS. Local sizes and the grid are bounded so that
#: an agent's work arrays stay O(10⁸) elements.
MAX_AGENTS = 10_000
MAX_LOCAL_N = 100_000_000
MAX_BINS = 1_000_000


def _check_int(name: str, v: object, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise InvalidInput(f"{name} must be an integer, got {v!r}")
    v = int(v)
    if v < lo or (hi is not None and v > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f"≥ {lo}"
        raise InvalidInput(f"{name} must be in {rng}, got {v}")
    return v


def _check_alpha(alpha: object) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise InvalidInput(f"α must be a number in (0, 1), got {alpha!r}")
    a = float(alpha)
    if not (math.isfinite(a) and 0 < a < 1):
        raise InvalidInput(f"α must be in (0, 1), got {alpha}")
    return a


# --------------------------------------------------------------------------- M_{ℓ,k}


def coverage_M_array(
    ell: np.ndarray | int, k: np.ndarray | int, m: int, n: int, *, nodes: int = GL_NODES
) -> np.ndarray:
    """M_{ℓ,k} for arrays of (ℓ, k) (broadcast), m agents of n scores each (Thm 3.2, eq. (5)).

    Fixed Gauss–Legendre quadrature on the window [Q(1e−17), Q(1−1e−17)] of
    U_(ℓ,k) (module docstring); vectorised over the broadcast shape of ℓ, k.
    No argument checks (see :func:`coverage_M`).
    """
    from scipy.special import betainc, betaincinv  # here: privcal.client loads no SciPy

    x, w = _gauss_legendre(nodes)
    lf = np.asarray(ell, dtype=np.float64)[..., None]
    kf = np.asarray(k, dtype=np.float64)[..., None]
    # quantiles of V ~ Beta(k, m−k+1); the upper one as 1 − (lower quantile of the mirror law)
    # because 1 − 1e−17 is 1.0 in floating point
    v_lo = betaincinv(kf, m - kf + 1, _TAIL)
    v_hi_c = betaincinv(m - kf + 1, kf, _TAIL)
    t_lo = betaincinv(lf, n - lf + 1, v_lo)
    t_hi = 1.0 - betaincinv(n - lf + 1, lf, v_hi_c)
    half = (t_hi - t_lo) / 2
    t = (t_lo + t_hi) / 2 + half * x
    # P(Bin(m, p) ≤ k−1) = I_{1−p}(m−k+1, k) with 1−p = I_{1−t}(n−ℓ+1, ℓ). (scipy's betaincc
    # is 3-8x slower than betainc; 1−t is exact for t ≥ 1/2 and off by ≤ 2^-54 below, which moves
    # M by < 1e-15: the error is weighted by the density of U_(ℓ,k) times the window width.)
    g = betainc(m - kf + 1, kf, betainc(n - lf + 1, lf, 1.0 - t))
    return (t_lo + half * (g @ w[:, None]))[..., 0]


def coverage_M(ell: int, k: int, m: int, n: int) -> float:
    """The exact coverage M_{ℓ,k} of FedCP-QQ (Humbert et al. 2023, Thm 3.2, eq. (5)).

    = P(U ≤ U_(ℓ,k)) = ∫₀¹ P(Bin(m, I_t(ℓ, n−ℓ+1)) ≤ k−1) dt, with 1 ≤ ℓ ≤ n,
    1 ≤ k ≤ m. Accurate to ~1e−14 (module docstring).
    """
    m = _check_int("m (agents)", m, 1)
    n = _check_int("n (local size)", n, 1)
    ell = _check_int("ℓ", ell, 1, n)
    k = _check_int("k", k, 1, m)
    return float(coverage_M_array(ell, k, m, n))


def coverage_M_max(k: np.ndarray | int, m: int, n: int) -> np.ndarray:
    """M_{n,k} in closed form (Prop. A.1): Γ(k+1/n)Γ(m+1) / (Γ(k)Γ(m+1/n+1)).

    The largest coverage reachable with server order k (agents send their
    maxima). Evaluated as 1/Π_{j=k}^{m}(1 + 1/(nj)) (Γ(x+1) = xΓ(x) turns both
    Gamma ratios into products over integers), a sum of log1p terms accurate to
    ~1e−15; differences of ``gammaln`` lose ~1e−12 at m = 1000.
    """
    kk = np.asarray(k, dtype=np.int64)
    terms = np.log1p(1.0 / (n * np.arange(1, m + 1, dtype=np.float64)))
    tail = np.cumsum(terms[::-1])[::-1]  # tail[j−1] = Σ_{i=j}^{m} log1p(1/(n i))
    return np.exp(-tail[kk - 1])


class _MTable:
    """Memoised M_{ℓ,k} for one (m, n): planning FedCP²-QQ asks for the same cells many times."""

    def __init__(self, m: int, n: int) -> None:
        self.m, self.n = m, n
        self._memo: dict[tuple[int, int], float] = {}

    def __call__(self, ell: int, k: int) -> float:
        key = (ell, k)
        v = self._memo.get(key)
        if v is None:
            v = float(coverage_M_array(ell, k, self.m, self.n))
            self._memo[key] = v
        return v

    def many(self, ells: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """M at many (ℓ, k) pairs; the missing ones in one vectorised quadrature call."""
        out = np.array(
            [self._memo.get((int(a), int(b)), np.nan) for a, b in zip(ells, ks, strict=True)]
        )
        todo = np.isnan(out)
        if todo.any():
            out[todo] = coverage_M_array(ells[todo], ks[todo], self.m, self.n)
            for a, b, v in zip(ells[todo], ks[todo], out[todo], strict=True):
                self._memo[(int(a), int(b))] = float(v)
        return out


@lru_cache(maxsize=64)
def _table(m: int, n: int) -> _MTable:
    return _MTable(m, n)


def _smallest_l(tab: _MTable, k: int, tgt: float, lo: int, hi: int, from_top: bool) -> int:
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


def _select(
    tab: _MTable,
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
    tgt = target - _FEAS_TOL
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


def _shift_guess(tab: _MTable, k: int, base: int, tgt: float, shift: dict[int, int]) -> int:
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
    tab: _MTable, tgt: float, k0: int, lower: dict[int, int], shift: dict[int, int]
) -> tuple[int, int, float, dict[int, int]] | None:
    """:func:`_select` after a smaller target: ℓ_k(new) ≥ ℓ_k(old) = ``lower[k]``.

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
    guess = np.clip(base + np.array([_shift_guess(tab, int(k), int(b), tgt, shift)
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
    i = int(np.argmin(vals))  # the first minimum: ties go to the smallest k, as in _select
    ls = {int(k): int(h) for k, h in zip(ks, hi, strict=True)}
    return int(hi[i]), int(ks[i]), float(vals[i]), ls


# --------------------------------------------------------------------------- FedCP-QQ


class FedPlan(BaseModel):
    """A FedCP-QQ plan: agents send their ℓ-th smallest score, the server takes the k-th smallest.

    ``M`` is the exact coverage M_{ℓ,k} ≥ 1−α (Thm 3.2).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["fedcp-qq"] = "fedcp-qq"
    l: int = Field(ge=1, description="agent order ℓ (1-based)")  # noqa: E741 (the paper's ℓ)
    k: int = Field(ge=1, description="server order k (1-based)")
    M: float = Field(description="exact coverage M_{ℓ,k} for continuous scores (Thm 3.2)")
    m: int = Field(ge=1, description="number of agents")
    n: int = Field(ge=1, description="scores per agent")
    alpha: float = Field(gt=0, lt=1)


def plan_fedcp_qq(m: int, n: int, alpha: float) -> FedPlan:
    """(ℓ*, k*) = argmin{M_{ℓ,k} : M_{ℓ,k} ≥ 1−α} (Humbert et al. 2023, Alg. 1, eq. (6)).

    Raises :class:`InfeasiblePlan` when even M_{n,m} = mn/(mn+1) < 1−α (every
    agent sends its maximum and the server takes the largest).
    """
    m = _check_int("number of agents", m, 1, MAX_AGENTS)
    n = _check_int("local size n", n, 1, MAX_LOCAL_N)
    alpha = _check_alpha(alpha)
    return _plan_cached(m, n, alpha)


@lru_cache(maxsize=256)
def _plan_cached(m: int, n: int, alpha: float) -> FedPlan:
    sel = _select(_table(m, n), 1.0 - alpha)
    if sel is None:
        need = math.ceil(float(Fraction(1) / Fraction(str(alpha)))) - 1
        raise InfeasiblePlan(
            f"no FedCP-QQ plan reaches coverage {1 - alpha:g} with m={m} agents of n={n} scores: "
            f"even the maximum of all m·n = {m * n} scores only covers {m * n}/{m * n + 1}; "
            f"need m·n ≥ {need}"
        )
    ell, k, M, _ = sel
    return FedPlan(l=ell, k=k, M=M, m=m, n=n, alpha=alpha)


# --------------------------------------------------------------------------- unequal sizes


def _pb_pmf(p: np.ndarray) -> np.ndarray:
    """Poisson-binomial pmf of Σ_j Bernoulli(p_j) along the last axis: (..., m) → (..., m+1)."""
    m = p.shape[-1]
    pmf = np.zeros((*p.shape[:-1], m + 1))
    pmf[..., 0] = 1.0
    for j in range(m):
        pj = p[..., j : j + 1]
        # convex combinations only: stable, every entry stays in [0, 1]
        pmf[..., 1 : j + 2] = pmf[..., 1 : j + 2] * (1 - pj) + pmf[..., 0 : j + 1] * pj
        pmf[..., 0:1] *= 1 - pj
    return pmf


def _message_cdf(t: np.ndarray, ls: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """P(message_j ≤ t) = I_t(ℓ_j, n_j−ℓ_j+1); 0 when ℓ_j > n_j (that agent sends +∞)."""
    from scipy.special import betainc  # here: privcal.client loads no SciPy

    finite = ls <= ns
    p = np.zeros((*t.shape, ls.size))
    if finite.any():
        lf, nf = ls[finite].astype(np.float64), ns[finite].astype(np.float64)
        p[..., finite] = betainc(lf, nf - lf + 1, t[..., None])
    return p


def _tails(t: np.ndarray, ls: np.ndarray, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P(W ≤ j−1), P(W ≥ j)) for j = 1..m at each t, both from the pmf (each tail accurate)."""
    pmf = _pb_pmf(_message_cdf(t, ls, ns))
    below = np.cumsum(pmf, axis=-1)[..., :-1]  # P(W ≤ j−1), j = 1..m
    above = np.cumsum(pmf[..., ::-1], axis=-1)[..., ::-1][..., 1:]  # P(W ≥ j), j = 1..m
    return below, above


def coverage_M_unequal(ls: Sequence[int], sizes: Sequence[int], k: int) -> float:
    """Exact coverage of the quantile-of-quantiles with per-agent orders ℓ_j and sizes n_j.

    Derivation (Humbert et al. 2023, App. A.1 with the proof of Thm 3.2,
    App. C.1). Map scores through their continuous c.d.f.: the test point is
    U ~ U[0, 1] and agent j's message is the ℓ_j-th smallest of n_j uniforms,
    with c.d.f. p_j(t) = I_t(ℓ_j, n_j−ℓ_j+1) (Lemma C.1), or +∞ when ℓ_j > n_j
    (p_j ≡ 0, eq. (2)). Messages are independent, so W(t) = #{messages ≤ t}
    is Poisson-binomial(p_1(t), …, p_m(t)); the k-th smallest message exceeds
    t iff W(t) ≤ k−1. Hence

        M_k = P(U ≤ U_(k)) = E[U_(k)] = ∫₀¹ P(W(t) ≤ k−1) dt,

    with equality for continuous scores and ≥ in general (eq. (12)). With all
    n_j = n and ℓ_j = ℓ, W is Bin(m, I_t(ℓ, n−ℓ+1)) and this is eq. (5).

    Quadrature: Gauss–Legendre (256 nodes) on a window of U_(k) found by
    evaluating both tails of W on a grid over the agents' windows, then on a
    finer grid inside the cells where the tails cross 1e−17 (the exact quantile
    formula of the equal case has no Poisson-binomial analogue).
    """
    ls_a, ns_a = _check_unequal(ls, sizes)
    m = ns_a.size
    k = _check_int("k", k, 1, m)
    return float(_unequal_M(ls_a, ns_a, np.array([k]))[0])


def _check_unequal(ls: Sequence[int], sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    ns = [_check_int("local size", s, 1) for s in sizes]
    lv = [_check_int("ℓ_j", v, 1) for v in ls]
    if not ns:
        raise InvalidInput("need at least one agent")
    if len(lv) != len(ns):
        raise InvalidInput(f"{len(lv)} orders ℓ_j for {len(ns)} agents")
    for lj, nj in zip(lv, ns, strict=True):
        if lj > nj + 1:
            raise InvalidInput(f"ℓ_j = {lj} > n_j + 1 = {nj + 1}")
    return np.array(lv, dtype=np.int64), np.array(ns, dtype=np.int64)


def _unequal_M(ls: np.ndarray, ns: np.ndarray, ks: np.ndarray, nodes: int = GL_NODES) -> np.ndarray:
    from scipy.special import betaincinv  # here: privcal.client loads no SciPy

    finite = ls <= ns
    out = np.ones(ks.size)
    n_fin = int(finite.sum())
    todo = ks <= n_fin  # with k > #finite messages the k-th smallest is +∞: M = 1
    if not todo.any():
        return out
    lf, nf = ls[finite].astype(np.float64), ns[finite].astype(np.float64)
    tail = _TAIL / max(n_fin, 1)
    lo = float(np.min(betaincinv(lf, nf - lf + 1, tail)))
    hi = float(np.max(1.0 - betaincinv(nf - lf + 1, lf, tail)))
    x, w = _gauss_legendre(nodes)
    coarse = np.linspace(lo, hi, 257)
    below_c, above_c = _tails(coarse, ls, ns)
    for i in np.nonzero(todo)[0]:
        k = int(ks[i])
        a, b = _window(coarse, below_c[:, k - 1], above_c[:, k - 1])
        fine = np.linspace(a, b, 129)
        below_f, above_f = _tails(fine, ls, ns)
        a, b = _window(fine, below_f[:, k - 1], above_f[:, k - 1])
        t = (a + b) / 2 + (b - a) / 2 * x
        below_t, _ = _tails(t, ls, ns)
        out[i] = a + (b - a) / 2 * float(below_t[:, k - 1] @ w)
    return out


def _window(t: np.ndarray, below: np.ndarray, above: np.ndarray) -> tuple[float, float]:
    """[a, b] ⊂ grid t with P(U_(k) < a) ≤ 1e−17 and P(U_(k) > b) ≤ 1e−17 (up to grid points)."""
    # P(U_(k) ≤ t) = P(W(t) ≥ k) = ``above``; P(U_(k) > t) = ``below``
    ok_lo = np.nonzero(above <= _TAIL)[0]
    a = float(t[ok_lo[-1]]) if ok_lo.size else float(t[0])
    ok_hi = np.nonzero(below <= _TAIL)[0]
    b = float(t[ok_hi[0]]) if ok_hi.size else float(t[-1])
    if ok_lo.size == 0:
        a = 0.0  # the grid did not reach the lower tail: integrate from 0
    if ok_hi.size == 0:
        b = 1.0
    return a, b


class FedPlanUnequal(BaseModel):
    """A FedCP-QQ plan for agents of different sizes: agent j sends its ℓ_j-th smallest score.

    ℓ_j = ⌈(1−α)(n_j+1)⌉ (App. A.1; +∞ is sent when ℓ_j > n_j); the server takes
    the k-th smallest message; ``M`` is the exact coverage (Poisson-binomial
    form, :func:`coverage_M_unequal`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["fedcp-qq-unequal"] = "fedcp-qq-unequal"
    sizes: tuple[int, ...]
    ls: tuple[int, ...]
    k: int = Field(ge=1)
    M: float
    alpha: float = Field(gt=0, lt=1)

    @property
    def m(self) -> int:
        """Number of agents."""
        return len(self.sizes)

    def local_order(self, n_j: int) -> int:
        """ℓ for an agent holding ``n_j`` scores (the public rule ⌈(1−α)(n_j+1)⌉)."""
        if n_j not in self.sizes:
            sizes = sorted(set(self.sizes))
            raise InvalidInput(f"no agent of size {n_j} in this plan (sizes {sizes})")
        return conformal_rank(n_j, self.alpha)


def plan_fedcp_qq_unequal(sizes: Sequence[int], alpha: float) -> FedPlanUnequal:
    """FedCP-QQ for local sizes n_1..n_m (Humbert et al. 2023, App. A.1).

    ℓ_j = ⌈(1−α)(n_j+1)⌉ (exact rational rank), and k = the smallest server
    order whose Poisson-binomial coverage reaches 1−α (M is non-decreasing in
    k, so this is also the smallest such coverage); bisection over k.
    """
    alpha = _check_alpha(alpha)
    if len(sizes) > MAX_AGENTS:
        raise InvalidInput(f"number of agents must be in [1, {MAX_AGENTS}], got {len(sizes)}")
    ns = [_check_int("local size", s, 1, MAX_LOCAL_N) for s in sizes]
    if not ns:
        raise InvalidInput("need at least one agent")
    ls = [conformal_rank(nj, alpha) for nj in ns]
    return _plan_unequal_cached(tuple(ns), tuple(ls), alpha)


@lru_cache(maxsize=64)
def _plan_unequal_cached(ns: tuple[int, ...], ls: tuple[int, ...], alpha: float) -> FedPlanUnequal:
    ls_a, ns_a = np.array(ls), np.array(ns)
    m = len(ns)
    tgt = 1.0 - alpha - _FEAS_TOL
    cache: dict[int, float] = {}

    def M(k: int) -> float:
        if k not in cache:
            cache[k] = float(_unequal_M(ls_a, ns_a, np.array([k]))[0])
        return cache[k]

    if M(m) < tgt:
        raise InfeasiblePlan(
            f"no FedCP-QQ plan reaches coverage {1 - alpha:g} with local sizes {list(ns)} "
            f"and ℓ_j = ⌈(1−α)(n_j+1)⌉: even the largest message covers only {M(m):.6g}"
        )
    lo, hi = 0, m  # M(hi) ≥ tgt; lo = 0 or M(lo) < tgt
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if M(mid) >= tgt:
            hi = mid
        else:
            lo = mid
    return FedPlanUnequal(sizes=ns, ls=ls, k=hi, M=M(hi), alpha=alpha)


# --------------------------------------------------------------------------- FedCP²-QQ


def l_correction(gamma: float, alpha: float, m: int, eps: float, bins: int) -> int:
    """ℓ_cor = ⌈(2/ε)·ln(B/δ)⌉ with δ = 1−(1−γα)^{1/m} (Humbert et al. 2023, eq. (10); SPEC §10).

    By Lemma C.4 (exponential-mechanism utility), an agent answering at level
    q with nq ≥ ℓ_γ + ℓ_cor returns a value ≥ its ℓ_γ-th (rounded) score with
    probability ≥ 1−δ; for all m agents at once, ≥ (1−δ)^m = 1−γα.
    """
    delta = -math.expm1(math.log1p(-gamma * alpha) / m)
    return math.ceil((2.0 / eps) * math.log(bins / delta))


class Fed2Plan(BaseModel):
    """A FedCP²-QQ plan (Humbert et al. 2023, Algorithm 3; SPEC §10).

    Each agent answers the ε-DP exponential-mechanism quantile at level ``q``
    over the public grid of ``bins`` points on [``lower``, ``smax``] (``smax`` is the
    public upper end, ``upper`` in the calibrator's parameters); the server takes
    the ``k``-th smallest answer (k = k_γ). ``M`` = M_{ℓ_γ+ℓ_cor, k_γ}, the
    criterion minimised over γ (the coverage of non-private FedCP-QQ at the
    corrected order; it is not the coverage of the private protocol, whose
    guarantee is ≥ 1−α).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["fedcp2-qq"] = "fedcp2-qq"
    gamma: float
    l_gamma: int = Field(ge=1)
    k_gamma: int = Field(ge=1)
    l_cor: int = Field(ge=0)
    q: float = Field(ge=0.5, lt=1)
    M: float = Field(description="M_{ℓ_γ+ℓ_cor, k_γ}, the γ-selection criterion")
    M_gamma: float = Field(description="M_{ℓ_γ, k_γ} ≥ (1−α)/(1−γα)")
    m: int = Field(ge=1)
    n: int = Field(ge=1)
    alpha: float = Field(gt=0, lt=1)
    epsilon: float = Field(gt=0)
    bins: int = Field(ge=2)
    smax: float = Field(allow_inf_nan=False, description="public upper end of the grid")
    lower: float = Field(default=0.0, allow_inf_nan=False, description="public lower end")

    @model_validator(mode="after")
    def _range(self) -> Fed2Plan:
        if not self.lower < self.smax:
            raise ValueError(f"grid needs lower < upper, got [{self.lower}, {self.smax}]")
        return self

    @property
    def k(self) -> int:
        """Server order (= k_γ)."""
        return self.k_gamma

    @property
    def proof_bound(self) -> float:
        """M_{ℓ_γ,k_γ}·(1−γα) ≥ 1−α: the lower bound the proof of Thm 4.1 actually gives."""
        return self.M_gamma * (1 - self.gamma * self.alpha)


def plan_fedcp2_qq(
    m: int,
    n: int,
    alpha: float,
    eps: float,
    bins: int = 100,
    smax: float = 1.0,
    lower: float = 0.0,
) -> Fed2Plan:
    """Choose γ, (ℓ_γ, k_γ), ℓ_cor and the agents' level q (Humbert et al. 2023, Alg. 3, §4).

    For γ on the grid 0.01..0.99: (ℓ_γ, k_γ) is the FedCP-QQ selection at level
    (1−α)/(1−γα), ℓ_cor is eq. (10); γ is kept if ℓ_γ+ℓ_cor < n and the one
    minimising M_{ℓ_γ+ℓ_cor, k_γ} wins (ties: the smallest γ). q =
    max((ℓ_γ+ℓ_cor)/n, 1/2) (Alg. 3).

    **Decision**: feasibility is ℓ_γ+ℓ_cor < n, not ≤ n: at ℓ_γ+ℓ_cor = n the
    level q is 1 and the mechanism's sensitivity max(1/q, 1/(1−q)) is infinite
    (Lemma C.4 needs q ∈ [1/2, 1)).
    Pruning (exact): M_{ℓ_γ+ℓ_cor,k_γ} ≥ M_{ℓ_γ,k_γ} ≥ (1−α)/(1−γα), which grows
    with γ, so the scan stops once that level reaches the best criterion found.
    """
    return _plan2_cached(*_check_fed2(m, n, alpha, eps, bins, smax, lower))


def _check_fed2(
    m: object, n: object, alpha: object, eps: object, bins: object, smax: object,
    lower: object = 0.0,
) -> tuple[int, int, float, float, int, float, float]:
    m = _check_int("number of agents", m, 1, MAX_AGENTS)
    n = _check_int("local size n", n, 1, MAX_LOCAL_N)
    alpha = _check_alpha(alpha)
    if (
        isinstance(eps, bool)
        or not isinstance(eps, int | float)
        or not (math.isfinite(eps) and eps > 0)
    ):
        raise InvalidInput(f"ε must be a finite number > 0, got {eps!r}")
    bins = _check_int("number of bins", bins, 2, MAX_BINS)
    for what, v in (("lower", lower), ("upper (S_max)", smax)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise InvalidInput(f"{what} must be a finite number, got {v!r}")
    if not lower < smax:  # type: ignore[operator]
        raise InvalidInput(f"the grid needs lower < upper, got [{lower}, {smax}]")
    return m, n, alpha, float(eps), bins, float(smax), float(lower)  # type: ignore[arg-type]


def _gamma_search(
    m: int, n: int, alpha: float, eps: float, bins: int, budget: int
) -> tuple[tuple[float, float, int, int, int, float] | None, int | None]:
    """Best (crit, γ, ℓ_γ, k_γ, ℓ_cor, M_γ) over the γ grid with ℓ_γ + ℓ_cor ≤ ``budget``."""
    tab = _table(m, n)
    best: tuple[float, float, int, int, int, float] | None = None
    lower: dict[int, int] | None = None
    shift: dict[int, int] = {}
    min_cor: int | None = None
    for i, gamma in enumerate(GAMMA_GRID):
        target = (1 - alpha) / (1 - gamma * alpha)
        if best is not None and target - _FEAS_TOL >= best[0]:
            break
        if best is not None and lower is not None and _rest_cannot_win(
                tab, alpha, m, eps, bins, GAMMA_GRID[i:], lower, best[0], best[3]):
            break
        l_cor = l_correction(gamma, alpha, m, eps, bins)
        min_cor = l_cor if min_cor is None else min(min_cor, l_cor)
        if l_cor >= budget:
            continue  # ℓ_γ ≥ 1, so ℓ_γ + ℓ_cor > budget
        sel = _select(tab, target, lower, shift)
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
#: cells per vectorised evaluation of the pruning bound
_PRUNE_CHUNK = 64


def _rest_cannot_win(
    tab: _MTable, alpha: float, m: int, eps: float, bins: int, rest: Sequence[float],
    lower: dict[int, int], best: float, best_k: int,
) -> bool:
    """Whether no γ in ``rest`` can have a criterion below ``best`` (exact pruning).

    For γ in ``rest`` the level is higher than the last one searched, so ℓ_k(γ) ≥
    ``lower[k]`` (ℓ_k is non-decreasing in the level; 1 where ``lower`` has no entry), and
    ℓ_cor(γ) ≥ c, the least ℓ_cor over ``rest`` that the search would still reach (the
    scan stops at the first level ≥ ``best``). M is increasing in ℓ, so
    crit(γ) = M_{ℓ_γ+ℓ_cor(γ), k_γ} ≥ min over k of M_{lower[k]+c, k}, evaluated in
    vectorised chunks from the best k outwards (a failing bound fails early); when it clears
    ``best`` (by a margin above float noise) every remaining warm selection is saved, as
    it could only have found larger criteria. k below the smallest key of ``lower`` is
    infeasible at the last level, hence at every higher one.
    """
    reach = [g for g in rest if (1 - alpha) / (1 - g * alpha) - _FEAS_TOL < best]
    if not reach:
        return True
    c = min(l_correction(g, alpha, m, eps, bins) for g in reach)
    ks = np.arange(min(lower), m + 1)
    ells = np.minimum(np.array([lower.get(int(k), 1) for k in ks]) + c, tab.n)
    # nearest the best k first, in chunks: a bound that fails usually fails there, early
    order = np.argsort(np.abs(ks - best_k), kind="stable")
    for start in range(0, order.size, _PRUNE_CHUNK):
        idx = order[start:start + _PRUNE_CHUNK]
        if np.min(tab.many(ells[idx], ks[idx])) < best + _PRUNE_MARGIN:
            return False
    return True


def _fed2_plan(
    best: tuple[float, float, int, int, int, float],
    q: float, m: int, n: int, alpha: float, eps: float, bins: int, smax: float,
    lower: float = 0.0,
) -> Fed2Plan:
    """The plan record of a γ-search result (crit, γ, ℓ_γ, k_γ, ℓ_cor, M_γ) at agent level q."""
    crit, gamma, l_g, k_g, l_cor, m_g = best
    return Fed2Plan(
        gamma=gamma, l_gamma=l_g, k_gamma=k_g, l_cor=l_cor, q=q, M=crit, M_gamma=m_g,
        m=m, n=n, alpha=alpha, epsilon=eps, bins=bins, smax=smax, lower=lower,
    )  # fmt: skip


@lru_cache(maxsize=128)
def _plan2_cached(
    m: int, n: int, alpha: float, eps: float, bins: int, smax: float, lower: float
) -> Fed2Plan:
    best, min_cor = _gamma_search(m, n, alpha, eps, bins, n - 1)
    if best is None:
        detail = f"the privacy correction alone is ℓ_cor ≥ {min_cor}" if min_cor else ""
        raise InfeasiblePlan(
            f"no FedCP²-QQ plan: ε={eps:g} is too small for n={n} scores per agent "
            f"(m={m}, α={alpha:g}, B={bins}): for every γ in 0.01..0.99, ℓ_γ + ℓ_cor ≥ n"
            + (f"; {detail}" if detail else "")
        )
    q = max((best[2] + best[4]) / n, 0.5)
    return _fed2_plan(best, q, m, n, alpha, eps, bins, smax, lower)


# --------------------------------------------------------------------------- missing agents


def plan_fedcp_qq_pinned(m: int, n: int, alpha: float, ell: int) -> FedPlan:
    """The FedCP-QQ plan for m agents that send (or sent) their ``ell``-th smallest score.

    The agent order ℓ is fixed; the server order is the smallest k ≤ m with
    M_{ℓ,k} ≥ 1−α (Thm 3.2), which, M being non-decreasing in k, also has the
    smallest coverage above 1−α for that ℓ. This is what a collection session
    needs when fewer agents answered than planned (:func:`replan_fedcp_qq_subset`)
    and what the calibrator recomputes from a pinned ``agent_order``.
    Raises :class:`InfeasiblePlan` when even k = m falls short.
    """
    m = _check_int("number of agents", m, 1, MAX_AGENTS)
    n = _check_int("local size n", n, 1, MAX_LOCAL_N)
    alpha = _check_alpha(alpha)
    if isinstance(ell, bool) or not isinstance(ell, int | np.integer) or int(ell) < 1:
        raise InvalidInput(f"agent order ℓ must be an integer ≥ 1, got {ell!r}")
    ell = int(ell)
    if ell > n:
        raise InfeasiblePlan(
            f"agent order ℓ={ell} is not an order statistic of n={n} scores per agent"
        )
    tab = _table(m, n)
    tgt = 1 - alpha - _FEAS_TOL
    if tab(ell, m) < tgt:
        raise InfeasiblePlan(
            f"no server order reaches coverage {1 - alpha:g} with m={m} agents sending their "
            f"ℓ={ell}-th smallest of n={n} scores (best M = {tab(ell, m):.6g})"
        )
    lo, hi = 0, m
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tab(ell, mid) >= tgt:
            hi = mid
        else:
            lo = mid
    return FedPlan(l=ell, k=hi, M=tab(ell, hi), m=m, n=n, alpha=alpha)


def replan_fedcp_qq_subset(plan: FedPlan, m_answered: int) -> FedPlan:
    """The server order for the ``m_answered`` agents that did send their ℓ-th smallest score.

    The agents' messages are fixed (order ℓ); with m' of them, the k-th
    smallest covers M_{ℓ,k} for m' agents (Thm 3.2), so k' = min{k ≤ m' :
    M_{ℓ,k} ≥ 1−α} (:func:`plan_fedcp_qq_pinned`). Valid when which agents
    answer does not depend on their scores. Raises :class:`InfeasiblePlan`
    when even k' = m' falls short.
    """
    m2 = _check_int("number of answering agents", m_answered, 1, plan.m)
    try:
        return plan_fedcp_qq_pinned(m2, plan.n, plan.alpha, plan.l)
    except InfeasiblePlan as exc:
        raise InfeasiblePlan(f"with {m2} of {plan.m} agents answering: {exc}") from None


def _answer_budget(n: int, q: float) -> int:
    """⌊n·q⌋: the largest ℓ_γ + ℓ_cor that answers at level q support (Lemma C.4).

    n·q is an integer or n/2 for the levels :func:`plan_fedcp2_qq` chooses; the
    epsilon absorbs the float product. Capped at n−1 (q < 1).
    """
    return min(math.floor(n * q + 1e-9), n - 1)


def plan_fedcp2_qq_pinned(
    m: int,
    n: int,
    alpha: float,
    eps: float,
    q: float,
    bins: int = 100,
    smax: float = 1.0,
    lower: float = 0.0,
) -> Fed2Plan:
    """A FedCP²-QQ plan for m agents that answer (or answered) at the fixed level ``q``.

    What the proof of Thm 4.1 (App. C.4) needs from answers at level q is
    n·q ≥ ℓ_γ + ℓ_cor (Lemma C.4 with δ = 1−(1−γα)^{1/m}). So the γ search of
    :func:`plan_fedcp2_qq` is run for m agents with the budget
    ℓ_γ + ℓ_cor ≤ ⌊n·q⌋, and ``q`` stays the given level. Used for agents
    missing from a collection session (:func:`replan_fedcp2_qq_subset`) and by
    the calibrator when its ``level`` is pinned. Raises :class:`InfeasiblePlan`
    when no γ fits, :class:`InvalidInput` when q is not in [1/2, 1).
    """
    if (
        isinstance(q, bool)
        or not isinstance(q, int | float)
        or not (math.isfinite(q) and 0.5 <= q < 1)
    ):
        raise InvalidInput(f"the agents' level q must be a number in [1/2, 1), got {q!r}")
    m, n, alpha, eps, bins, smax, lower = _check_fed2(m, n, alpha, eps, bins, smax, lower)
    return _plan2_pinned_cached(m, n, alpha, eps, bins, smax, float(q), lower)


@lru_cache(maxsize=128)
def _plan2_pinned_cached(
    m: int, n: int, alpha: float, eps: float, bins: int, smax: float, q: float, lower: float
) -> Fed2Plan:
    budget = _answer_budget(n, q)
    best, _ = _gamma_search(m, n, alpha, eps, bins, budget)
    if best is None:
        raise InfeasiblePlan(
            f"no FedCP²-QQ plan for m={m} agents answering at level q={q:g}: for every γ in "
            f"0.01..0.99, ℓ_γ + ℓ_cor > ⌊n·q⌋ = {budget} (n={n}, α={alpha:g}, ε={eps:g}, "
            f"B={bins})"
        )
    return _fed2_plan(best, q, m, n, alpha, eps, bins, smax, lower)


def replan_fedcp2_qq_subset(plan: Fed2Plan, m_answered: int) -> Fed2Plan:
    """A FedCP²-QQ plan for the ``m_answered`` agents that did answer at level ``plan.q``.

    The answers are fixed, so this is :func:`plan_fedcp2_qq_pinned` for m'
    agents at the level ``plan.q`` the agents used (the γ search rerun with
    ℓ_γ + ℓ_cor ≤ ⌊n·q⌋). Valid when which agents answer does not depend on
    their scores. Raises :class:`InfeasiblePlan` when no γ fits.
    """
    m2 = _check_int("number of answering agents", m_answered, 1, plan.m)
    try:
        return plan_fedcp2_qq_pinned(
            m2, plan.n, plan.alpha, plan.epsilon, plan.q, bins=plan.bins, smax=plan.smax,
            lower=plan.lower,
        )
    except InfeasiblePlan:
        raise InfeasiblePlan(
            f"with {m2} of {plan.m} agents answering at level q={plan.q:g}, no γ keeps "
            f"ℓ_γ + ℓ_cor ≤ n·q = {_answer_budget(plan.n, plan.q)}: the guarantee cannot be "
            "recomputed"
        ) from None
