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


def _unequal_M(ls: np.ndarray, ns: np.ndarray, ks: np.ndarray) -> np.ndarray:
    from scipy.special import betaincinv  # here: privcal.client loads no SciPy

    finite = ls <= ns
    out = np.ones(ks.size)
    n_fin = int(finite.sum())
    todo = ks <= n_fin  # with k > #finite messages the k-th smallest is +∞: M = 1
    if not todo.any():
        return out
    pairs = np.unique(np.stack([ls[finite], ns[finite]], axis=1), axis=0).astype(np.float64)
    lf, nf = pairs[:, 0], pairs[:, 1]
    tail = TAIL / max(n_fin, 1)
    # each distinct agent's message window: where its c.d.f. p_j rises from TAIL to 1 − TAIL
    w_lo = betaincinv(lf, nf - lf + 1, tail)
    w_hi = 1.0 - betaincinv(nf - lf + 1, lf, tail)
    lo, hi = float(np.min(w_lo)), float(np.max(w_hi))
    coarse = np.linspace(lo, hi, 257)
    below_c, above_c = _tails(coarse, ls, ns)
    for i in np.nonzero(todo)[0]:
        k = int(ks[i])
        a, b = _window(coarse, below_c[:, k - 1], above_c[:, k - 1])
        # a window wider than [a, b]/8 spans many nodes and the halving finds it; a narrower
        # one could fall between them, so [a, b] is cut at its ends
        narrow = (w_hi - w_lo) < (b - a) / 8
        out[i] = a + _integral(ls, ns, k, a, b, np.concatenate([w_lo[narrow], w_hi[narrow]]))
    return out


#: Gauss–Legendre nodes of each piece of :func:`_integral`, its tolerance (absolute, over the
#: whole window) and its most pieces
PIECE_NODES, PIECE_TOL, MAX_PIECES = 128, 1e-14, 4096


def _integral(ls: np.ndarray, ns: np.ndarray, k: int, a: float, b: float,
              breaks: np.ndarray) -> float:
    """∫_a^b P(W(t) ≤ k−1) dt, piecewise and adaptive (red team 12).

    One Gauss–Legendre rule on [a, b] missed the step a large agent's message makes: a
    message of n_j = 10⁷ scores rises from 0 to 1 within ~10⁻³ of t, between the nodes of a
    rule spread over a window that small agents' messages make nearly [0, 1]; M was off by
    up to 10⁻³, either way, and a plan recorded coverage ≥ 1−α it did not have. Here [a, b]
    is cut at the ends of every agent's message window narrower than an eighth of it (inside
    a piece each such p_j is flat or smooth at the piece's scale), and a piece whose rule
    disagrees with the sum over its halves by more than its share of :data:`PIECE_TOL` is
    halved, until all agree; a window that needs more than :data:`MAX_PIECES` pieces is
    refused (InfeasiblePlan) rather than given a coverage no one has checked.
    """
    x, w = gauss_legendre(PIECE_NODES)
    edges = np.unique(np.concatenate([[a, b], breaks[(breaks > a) & (breaks < b)]]))
    pieces = np.stack([edges[:-1], edges[1:]], axis=1)
    total = 0.0
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
        g = below[:, k - 1].reshape(t.shape)
        est = half * (g @ w)  # (3, pieces)
        halves = est[1] + est[2]
        ok = np.abs(est[0] - halves) <= PIECE_TOL * (pieces[:, 1] - pieces[:, 0]) / (b - a)
        total += float(halves[ok].sum())
        pieces = np.concatenate([spans[1][~ok], spans[2][~ok]])
    return total


def _window(t: np.ndarray, below: np.ndarray, above: np.ndarray) -> tuple[float, float]:
    """[a, b] ⊂ grid t with P(U_(k) < a) ≤ 1e−17 and P(U_(k) > b) ≤ 1e−17 (up to grid points)."""
    # P(U_(k) ≤ t) = P(W(t) ≥ k) = ``above``; P(U_(k) > t) = ``below``
    ok_lo = np.nonzero(above <= TAIL)[0]
    a = float(t[ok_lo[-1]]) if ok_lo.size else float(t[0])
    ok_hi = np.nonzero(below <= TAIL)[0]
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
