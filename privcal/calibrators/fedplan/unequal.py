"""FedCP-QQ for agents of different sizes: Poisson-binomial coverage.

Humbert et al. 2023, App. A.1 with the proof of Thm 3.2 (App. C.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from privcal.calibrators.base import conformal_rank
from privcal.calibrators.fedplan.coverage import FEAS_TOL, TAIL, gauss_legendre
from privcal.calibrators.fedplan.limits import MAX_AGENTS, MAX_LOCAL_N, check_alpha, check_int
from privcal.errors import InfeasiblePlan, InvalidInput


def _pb_pmf(p: np.ndarray) -> np.ndarray:
    """Poisson-binomial pmf of Σ_j Bernoulli(p_j) along the last axis: (..., m) → (..., m+1).

    A Bernoulli(0) leaves the pmf as it is and a Bernoulli(1) shifts it by one, exactly:
    each row folds in only its agents with 0 < p_j < 1, in order, and is shifted by its
    count of p_j = 1 at the end — the same numbers as folding in every agent, at a cost
    that follows the agents whose message can still fall either side of t (most of a large
    agent's are 0 or 1: :func:`_message_cdf`)."""
    m = p.shape[-1]
    flat = p.reshape(-1, m)
    pmf = np.zeros((flat.shape[0], m + 1))
    pmf[:, 0] = 1.0
    frac = (flat > 0) & (flat < 1)
    top = 0  # every row's pmf is 0 above column top
    for j in range(m):
        rows = np.nonzero(frac[:, j])[0]
        if rows.size == 0:
            continue
        pj = flat[rows, j : j + 1]
        sub = pmf[rows, : top + 2]
        # convex combinations only: stable, every entry stays in [0, 1]
        sub[:, 1:] = sub[:, 1:] * (1 - pj) + sub[:, :-1] * pj
        sub[:, 0] *= 1 - pj[:, 0]
        pmf[rows, : top + 2] = sub
        top += 1
    ones = (flat == 1.0).sum(axis=1)
    if ones.any():
        col = np.arange(m + 1) - ones[:, None]
        pmf = np.where(col >= 0, np.take_along_axis(pmf, np.maximum(col, 0), axis=1), 0.0)
    return pmf.reshape(*p.shape[:-1], m + 1)


def _message_cdf(t: np.ndarray, ls: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """P(message_j ≤ t) = I_t(ℓ_j, n_j−ℓ_j+1); 0 when ℓ_j > n_j (that agent sends +∞).

    Computed once per distinct (ℓ_j, n_j), and only inside its window: below the
    TAIL/m-quantile of the message it is taken as 0, above the (1 − TAIL/m)-quantile as 1
    (W's pmf then moves by at most TAIL: the integral by ≤ 10⁻¹⁷). A large agent's window is
    narrow, so most (t, agent) pairs need no incomplete beta (red team 12's review: the
    piecewise integral of :func:`_integral` evaluates many more t)."""
    from scipy.special import betainc  # here: privcal.client loads no SciPy

    finite = ls <= ns
    p = np.zeros((*t.shape, ls.size))
    if finite.any():
        lf, nf, inv, w_lo, w_hi = _windows(ls, ns, TAIL / ls.size)
        tt = t.reshape(-1, 1)
        q = (tt > w_hi).astype(np.float64)  # (points, distinct agents)
        r, c = np.nonzero((tt >= w_lo) & (tt <= w_hi))
        q[r, c] = betainc(lf[c], nf[c] - lf[c] + 1, tt[r, 0])
        p[..., finite] = q[:, inv].reshape(*t.shape, -1)
    return p


def _windows(ls: np.ndarray, ns: np.ndarray, tail: float
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (ℓ_j, n_j) of the agents that send a finite message (as floats), each such
    agent's index among them, and each one's message window: where its c.d.f. rises from
    ``tail`` to 1 − ``tail`` (the upper end as 1 − the mirror law's lower quantile: 1 − 1e−17
    is 1.0 in floating point)."""
    from scipy.special import betaincinv  # here: privcal.client loads no SciPy

    finite = ls <= ns
    pairs, inv = np.unique(np.stack([ls[finite], ns[finite]], axis=1), axis=0,
                           return_inverse=True)
    lf, nf = pairs[:, 0].astype(np.float64), pairs[:, 1].astype(np.float64)
    return (lf, nf, inv.reshape(-1), betaincinv(lf, nf - lf + 1, tail),
            1.0 - betaincinv(nf - lf + 1, lf, tail))


#: what :func:`_coarse` computes once for a plan: the grid, W's two tails on it (one column
#: per k) and the distinct agents' message windows (lower and upper ends)
Coarse = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _coarse(ls: np.ndarray, ns: np.ndarray) -> Coarse:
    """W's tails on 257 points over every finite message's window (tail 10⁻¹⁷/#finite): where
    each k's window of U_(k) is found (:func:`_window`) and the plan's k guessed
    (:func:`_rough_M`); a plan computes it once for all its k."""
    n_fin = int((ls <= ns).sum())
    _, _, _, w_lo, w_hi = _windows(ls, ns, TAIL / max(n_fin, 1))
    grid = np.linspace(float(np.min(w_lo)), float(np.max(w_hi)), 257)
    below, above = _tails(grid, ls, ns)
    return grid, below, above, w_lo, w_hi


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

    Quadrature: on a window [a, b] of U_(k) (both tails of W ≤ 1e−17 at a grid
    point), Gauss–Legendre pieces cut at every agent's message window and
    halved until each agrees with its halves (:func:`_integral`; the exact
    quantile formula of the equal case has no Poisson-binomial analogue).
    """
    ls_a, ns_a = _check_unequal(ls, sizes)
    m = ns_a.size
    k = check_int("k", k, 1, m)
    return float(_unequal_M(ls_a, ns_a, np.array([k]))[0])


def _check_unequal(ls: Sequence[int], sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    ns = [check_int("local size", s, 1) for s in sizes]
    lv = [check_int("ℓ_j", v, 1) for v in ls]
    if not ns:
        raise InvalidInput("need at least one agent")
    if len(lv) != len(ns):
        raise InvalidInput(f"{len(lv)} orders ℓ_j for {len(ns)} agents")
    for lj, nj in zip(lv, ns, strict=True):
        if lj > nj + 1:
            raise InvalidInput(f"ℓ_j = {lj} > n_j + 1 = {nj + 1}")
    return np.array(lv, dtype=np.int64), np.array(ns, dtype=np.int64)


def _unequal_M(ls: np.ndarray, ns: np.ndarray, ks: np.ndarray,
               coarse: Coarse | None = None) -> np.ndarray:
    """M_k for each k of ``ks`` (``coarse``: :func:`_coarse` of these agents, if known)."""
    out = np.ones(ks.size)
    todo = ks <= int((ls <= ns).sum())  # k > #finite messages: the k-th is +∞, M = 1
    if not todo.any():
        return out
    grid, below_c, above_c, w_lo, w_hi = coarse if coarse is not None else _coarse(ls, ns)
    kk = ks[todo].astype(np.int64)
    spans = np.array([_window(grid, below_c[:, k - 1], above_c[:, k - 1]) for k in kk])
    a, b = float(spans[:, 0].min()), float(spans[:, 1].max())  # every k's window, at once
    # a window wider than [a, b]/8 spans many nodes and the halving finds it; a narrower one
    # could fall between them, so [a, b] is cut at its ends
    narrow = (w_hi - w_lo) < (b - a) / 8
    out[todo] = a + _integral(ls, ns, kk, a, b, np.concatenate([w_lo[narrow], w_hi[narrow]]))
    return out


#: Gauss–Legendre nodes of each piece of :func:`_integral`, its tolerance (absolute, over the
#: whole window) and its most pieces
PIECE_NODES, PIECE_TOL, MAX_PIECES = 64, 1e-14, 4096
#: the integrand's own noise per unit of t: scipy's incomplete beta at (ℓ, n − ℓ + 1) ≈
#: (9.5·10⁷, 5·10⁶) jitters by ~10⁻¹² relatively, which no halving removes (r12rev: a plan
#: for sizes (2, 10⁸) halved past MAX_PIECES and was refused); a piece agreeing with its
#: halves to NOISE × its width is accepted — at most 2·10⁻¹³ over [a, b] ⊂ [0, 1], within
#: FEAS_TOL, which every recorded bound gives away
NOISE = 2e-13


def _integral(ls: np.ndarray, ns: np.ndarray, ks: np.ndarray, a: float, b: float,
              breaks: np.ndarray) -> np.ndarray:
    """∫_a^b P(W(t) ≤ k−1) dt for each k of ``ks``, piecewise and adaptive (red team 12).

    One Gauss–Legendre rule on [a, b] missed the step a large agent's message makes: a
    message of n_j = 10⁷ scores rises from 0 to 1 within ~10⁻³ of t, between the nodes of a
    rule spread over a window that small agents' messages make nearly [0, 1]; M was off by
    up to 10⁻³, either way, and a plan recorded coverage ≥ 1−α it did not have. Here [a, b]
    is cut at the ends of every agent's message window narrower than an eighth of it (inside
    a piece each such p_j is flat or smooth at the piece's scale), and a piece whose rule
    disagrees with the sum over its halves by more than its share of :data:`PIECE_TOL` (or
    than the integrand's own :data:`NOISE`) is halved, until all agree; a window that needs
    more than :data:`MAX_PIECES` pieces is refused (InfeasiblePlan) rather than given a
    coverage no one has checked. Every k is integrated on the same nodes (one pmf gives them
    all), a piece halved until all agree.
    """
    x, w = gauss_legendre(PIECE_NODES)
    edges = np.unique(np.concatenate([[a, b], breaks[(breaks > a) & (breaks < b)]]))
    pieces = np.stack([edges[:-1], edges[1:]], axis=1)
    total = np.zeros(ks.size)
    while pieces.size:
        if pieces.shape[0] > MAX_PIECES:
            raise InfeasiblePlan("the coverage of this FedCP-QQ plan for unequal sizes could "
                                 f"not be computed to {PIECE_TOL:g}: no plan is given")
        mid = pieces.mean(axis=1)
        spans = np.stack([pieces, np.stack([pieces[:, 0], mid], 1),
                          np.stack([mid, pieces[:, 1]], 1)])  # (3, pieces, 2)
        half = (spans[..., 1] - spans[..., 0]) / 2
        t = (spans[..., 0] + half)[..., None] + half[..., None] * x  # (3, pieces, nodes)
        below, _ = _tails(t.ravel(), ls, ns)
        g = below[:, ks - 1].reshape(*t.shape, ks.size)  # (3, pieces, nodes, ks)
        est = half[..., None] * np.einsum("spnk,n->spk", g, w)  # (3, pieces, ks)
        halves = est[1] + est[2]
        width = pieces[:, 1] - pieces[:, 0]
        share = np.maximum(PIECE_TOL / (b - a), NOISE) * width
        ok = (np.abs(est[0] - halves) <= share[:, None]).all(axis=1)
        total += halves[ok].sum(axis=0)
        pieces = np.concatenate([spans[1][~ok], spans[2][~ok]])
    return total


def _window(t: np.ndarray, below: np.ndarray, above: np.ndarray) -> tuple[float, float]:
    """[a, b] ⊂ grid t with P(U_(k) < a) and P(U_(k) > b) ≤ 4·10⁻¹⁷ (up to grid points)."""
    # P(U_(k) ≤ t) = P(W(t) ≥ k) = ``above``; P(U_(k) > t) = ``below``
    # 4·TAIL: the grid's ends are quantiles at TAIL/m, which betainc may round just above
    # (r12rev: then no point qualified and [a, b] fell back to [0, b])
    ok_lo = np.nonzero(above <= 4 * TAIL)[0]
    a = float(t[ok_lo[-1]]) if ok_lo.size else float(t[0])
    ok_hi = np.nonzero(below <= 4 * TAIL)[0]
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
    alpha = check_alpha(alpha)
    if len(sizes) > MAX_AGENTS:
        raise InvalidInput(f"number of agents must be in [1, {MAX_AGENTS}], got {len(sizes)}")
    ns = [check_int("local size", s, 1, MAX_LOCAL_N) for s in sizes]
    if not ns:
        raise InvalidInput("need at least one agent")
    ls = [conformal_rank(nj, alpha) for nj in ns]
    return _plan_unequal_cached(tuple(ns), tuple(ls), alpha)


@lru_cache(maxsize=64)
def _plan_unequal_cached(ns: tuple[int, ...], ls: tuple[int, ...], alpha: float) -> FedPlanUnequal:
    ls_a, ns_a = np.array(ls), np.array(ns)
    m = len(ns)
    tgt = 1.0 - alpha - FEAS_TOL
    coarse = _coarse(ls_a, ns_a) if (ls_a <= ns_a).any() else None  # once, for every k
    cache: dict[int, float] = {}

    def M(*ks: int) -> float:
        """M_k (of the first k), computing every k not yet known in one integral."""
        todo = sorted({k for k in ks if k not in cache})
        if todo:
            cache.update(zip(todo, _unequal_M(ls_a, ns_a, np.array(todo), coarse).tolist(),
                             strict=True))
        return cache[ks[0]]

    # the crossing guessed from a coarse trapezoid (never trusted: M is computed around it)
    guess = int(np.searchsorted(_rough_M(coarse, m), tgt)) + 1
    # the plan's k is the least with M_k ≥ tgt (M grows with k; M_0 = 0 < tgt). Keep M_lo <
    # tgt ≤ M_hi (hi = m until checked); each step computes a pair (g − 1, g) in one
    # integral and moves g along its secant, then (after six steps) bisection finishes
    lo, hi, g = 0, m, min(max(guess, 1), m)
    for _ in range(6):
        if hi - lo <= 1:
            break
        M(g, max(g - 1, 1))
        below = 0.0 if g == 1 else M(g - 1)
        slope = max(M(g) - below, 1e-12)
        if M(g) >= tgt and below < tgt:
            lo, hi = g - 1, g
            break
        if M(g) >= tgt:  # so is M_{g−1}: k ≤ g − 1
            hi = g - 1
            est = g - 1 - (below - tgt) / slope
        else:
            lo = g
            est = g + (tgt - M(g)) / slope
        g = min(max(int(np.ceil(est)), lo + 1), hi)
    if hi == m and M(m) < tgt:
        raise InfeasiblePlan(
            f"no FedCP-QQ plan reaches coverage {1 - alpha:g} with local sizes {list(ns)} "
            f"and ℓ_j = ⌈(1−α)(n_j+1)⌉: even the largest message covers only {M(m):.6g}")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if M(mid) >= tgt:
            hi = mid
        else:
            lo = mid
    return FedPlanUnequal(sizes=ns, ls=ls, k=hi, M=M(hi), alpha=alpha)


def _rough_M(coarse: Coarse | None, m: int) -> np.ndarray:
    """M_k for every k by the trapezoid rule on the coarse grid (:func:`_coarse`): a guess of
    where the plan's k is (it can miss a large agent's step: red team 12), no more."""
    if coarse is None:  # no finite message: every M_k is 1
        return np.ones(m)
    grid, below = coarse[0], coarse[1]
    inner = ((below[1:] + below[:-1]) / 2 * np.diff(grid)[:, None]).sum(axis=0)
    return grid[0] + inner
