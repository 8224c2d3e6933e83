"""The exact coverage M_{ℓ,k} of FedCP-QQ and its quadrature (SPEC §9).

Humbert, Le Bars, Bellet, Arlot, *One-Shot Federated Conformal Prediction*,
ICML 2023 (seed 002).

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
"""

from __future__ import annotations

from functools import cache, lru_cache

import numpy as np

from privcal.calibrators.fedplan.limits import check_int

#: Gauss–Legendre nodes for M_{ℓ,k} (SPEC §9)
GL_NODES = 256
#: probability mass left outside the quadrature window on each side
TAIL = 1e-17
#: M within this of 1−α counts as reaching it (:mod:`privcal.calibrators.fedplan.selection`,
#: "Decision")
FEAS_TOL = 1e-12


@cache
def gauss_legendre(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    from scipy.special import roots_legendre  # here: privcal.client loads no SciPy

    # scipy's Golub–Welsch + Newton is ~5x faster than numpy's leggauss at 256 nodes (0.8 s)
    x, w = roots_legendre(nodes)
    return np.asarray(x), np.asarray(w)


def coverage_M_array(
    ell: np.ndarray | int, k: np.ndarray | int, m: int, n: int, *, nodes: int = GL_NODES
) -> np.ndarray:
    """M_{ℓ,k} for arrays of (ℓ, k) (broadcast), m agents of n scores each (Thm 3.2, eq. (5)).

    Fixed Gauss–Legendre quadrature on the window [Q(1e−17), Q(1−1e−17)] of
    U_(ℓ,k) (module docstring); vectorised over the broadcast shape of ℓ, k.
    No argument checks (see :func:`coverage_M`).
    """
    from scipy.special import betainc, betaincinv  # here: privcal.client loads no SciPy

    x, w = gauss_legendre(nodes)
    lf = np.asarray(ell, dtype=np.float64)[..., None]
    kf = np.asarray(k, dtype=np.float64)[..., None]
    # quantiles of V ~ Beta(k, m−k+1); the upper one as 1 − (lower quantile of the mirror law)
    # because 1 − 1e−17 is 1.0 in floating point
    v_lo = betaincinv(kf, m - kf + 1, TAIL)
    v_hi_c = betaincinv(m - kf + 1, kf, TAIL)
    t_lo = betaincinv(lf, n - lf + 1, v_lo)
    t_hi = 1.0 - betaincinv(n - lf + 1, lf, v_hi_c)
    half = (t_hi - t_lo) / 2
    t = (t_lo + t_hi) / 2 + half * x
    # P(Bin(m, p) ≤ k−1) = I_{1−p}(m−k+1, k) with 1−p = I_{1−t}(n−ℓ+1, ℓ). (scipy's betaincc
    # is 3-8x slower than betainc; 1−t is exact for t ≥ 1/2 and off by ≤ 2^-54 below, which moves
    # M by < 1e-15: the error is weighted by the density of U_(ℓ,k) times the window width.)
    g = betainc(m - kf + 1, kf, betainc(n - lf + 1, lf, 1.0 - t))
    # the weighted sum row by row (numpy's pairwise sum along the last axis), not a BLAS
    # product: a cell's value then does not depend on which other cells share the call, so
    # a plan is the same bits whatever the planner evaluated before (memo, batches)
    return (t_lo + half * np.sum(g * w, axis=-1, keepdims=True))[..., 0]


def coverage_M(ell: int, k: int, m: int, n: int) -> float:
    """The exact coverage M_{ℓ,k} of FedCP-QQ (Humbert et al. 2023, Thm 3.2, eq. (5)).

    = P(U ≤ U_(ℓ,k)) = ∫₀¹ P(Bin(m, I_t(ℓ, n−ℓ+1)) ≤ k−1) dt, with 1 ≤ ℓ ≤ n,
    1 ≤ k ≤ m. Accurate to ~1e−14 (module docstring).
    """
    m = check_int("m (agents)", m, 1)
    n = check_int("n (local size)", n, 1)
    ell = check_int("ℓ", ell, 1, n)
    k = check_int("k", k, 1, m)
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


class MTable:
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
def table(m: int, n: int) -> MTable:
    return MTable(m, n)
