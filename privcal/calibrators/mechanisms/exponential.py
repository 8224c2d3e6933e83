"""The exponential mechanism for a DP quantile over a public grid of bins.

Used by ExponQ (Angelopoulos, Bates, Zrnic, Jordan, *Private Prediction Sets*,
HDSR 2022, Algorithm 1 "private quantile"; summarised in Romanus & Molinari,
seed 003, §2) and by each agent of FedCP²-QQ (Humbert et al., ICML 2023, seed
002, §4; SPEC §10). The score function and its sensitivity follow SPEC §5/§10:

    w_j = max(N_<(e_j)/q, N_>(e_j)/(1−q)),   Δ = max(1/q, 1/(1−q)),
    P(j) ∝ exp(−ε·w_j / (2Δ)),

with N_< and N_> the numbers of (rounded) scores strictly below / above e_j.
Adding or removing one score changes each N_< or N_> by at most 1 and so each
w_j by at most Δ, which makes the mechanism ε-DP (McSherry & Talwar 2007).
(The released code of Angelopoulos et al. normalises by ε·min(α, 1−α), which
is not ε-DP; SPEC §5.)

Floating point: the selection probabilities are computed in float64 and a
single uniform from ``rng`` is inverted through their CDF. This is the
standard implementation of the exponential mechanism; the exact-sampling
requirement of DESIGN.md concerns additive noise on counts, which privcal
samples exactly (``discrete_gaussian``).
"""

from __future__ import annotations

import math
import random

import numpy as np

from privcal.errors import InvalidInput

__all__ = [
    "exponential_quantile",
    "grid",
    "grid_counts",
    "round_up_to_grid",
    "selection_probabilities",
]


def grid(a: float, b: float, m: int) -> np.ndarray:
    """The uniform public grid e_j = a + j(b−a)/(m−1), j = 0..m−1 (SPEC §5).

    The last point is set to ``b`` exactly (float rounding of a + (m−1)(b−a)/(m−1)
    could otherwise land just below b and push a score equal to b off the grid).
    """
    if not (math.isfinite(a) and math.isfinite(b)):
        raise InvalidInput(f"grid bounds must be finite, got [{a}, {b}]")
    if not a < b:
        raise InvalidInput(f"grid lower bound must be < upper bound, got [{a}, {b}]")
    if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 2:
        raise InvalidInput(f"number of grid points must be an integer ≥ 2, got {m!r}")
    m = int(m)
    j = np.arange(m, dtype=np.float64)
    e = a + j * ((b - a) / (m - 1))
    e[-1] = b
    return e


def _check_grid(e: np.ndarray) -> np.ndarray:
    e = np.asarray(e, dtype=np.float64)
    if e.ndim != 1 or e.size < 1:
        raise InvalidInput("grid must be a non-empty 1-D array")
    if not np.all(np.isfinite(e)):
        raise InvalidInput("grid values must be finite")
    if e.size > 1 and not np.all(np.diff(e) > 0):
        raise InvalidInput("grid must be strictly increasing")
    return e


#: scores are binned in chunks of this many: temporaries stay in cache and memory stays O(chunk)
_CHUNK = 1 << 16


def _uniform_params(e: np.ndarray) -> tuple[float, float, float] | None:
    """(a, b, step) if ``e`` is exactly ``grid(a, b, m)``, else None (binary search is used)."""
    m = e.size
    if m < 2:
        return None
    a, b = float(e[0]), float(e[-1])
    if not np.array_equal(e, grid(a, b, m)):
        return None
    return a, b, (b - a) / (m - 1)


def _indices(
    s: np.ndarray, e: np.ndarray, uniform: tuple[float, float, float] | None
) -> np.ndarray:
    m = e.size
    if uniform is None:
        idx = np.searchsorted(e, s, side="left")
        np.minimum(idx, m - 1, out=idx)
        return idx
    a, b, step = uniform
    # Arithmetic guess, then exact correction against the grid values recomputed with
    # the same float operations as grid(): float error moves the guess by at most one
    # bin, and the two comparisons fix it, so the result equals the searchsorted one.
    g = np.ceil((s - a) / step)
    np.clip(g, 0, m - 1, out=g)

    def value(k: np.ndarray) -> np.ndarray:
        v = a + k * step
        v[k == m - 1] = b
        return v

    g += (value(g) < s) & (g < m - 1)
    below = np.maximum(g - 1, 0)
    g -= (g > 0) & (value(below) >= s)
    return g.astype(np.intp)


def round_up_to_grid(scores: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Index of the smallest grid point ≥ each score; scores above e[-1] go to the top bin.

    Clipping the top is a public, data-independent post-processing of each
    score (callers fix the grid range beforehand), so it costs no privacy; it
    can only make the released quantile smaller than the true one when
    scores exceed the public range, which is why the range must cover the
    scores for the coverage guarantee to hold. Scores below e[0] round up to e[0].
    """
    e = _check_grid(e)
    s = np.asarray(scores, dtype=np.float64).ravel()
    return _indices(s, e, _uniform_params(e))


def grid_counts(scores: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Number of scores rounded up to each grid point (see :func:`round_up_to_grid`), int64.

    Works in chunks (O(chunk) extra memory); on a uniform grid from :func:`grid`
    the bin is computed arithmetically, several times faster than binary search.
    """
    e = _check_grid(e)
    s = np.asarray(scores, dtype=np.float64).ravel()
    uniform = _uniform_params(e)
    counts = np.zeros(e.size, dtype=np.int64)
    for i in range(0, s.size, _CHUNK):
        counts += np.bincount(_indices(s[i : i + _CHUNK], e, uniform), minlength=e.size)
    return counts


def _check_args(q: float, eps: float) -> None:
    if not (isinstance(q, int | float) and math.isfinite(q) and 0 < q < 1):
        raise InvalidInput(f"quantile level q must be in (0, 1), got {q!r}")
    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps > 0):
        raise InvalidInput(f"ε must be a finite number > 0, got {eps!r}")


def selection_probabilities(
    scores: np.ndarray, grid: np.ndarray, q: float, eps: float
) -> np.ndarray:
    """The exponential mechanism's probability of each grid point (SPEC §5, §10), shape (m,).

    Weights w_j = max(N_<(e_j)/q, N_>(e_j)/(1−q)) on the scores rounded up to
    the grid, sensitivity Δ = max(1/q, 1/(1−q)), P(j) ∝ exp(−ε·w_j/(2Δ))
    (Angelopoulos et al. 2022, Alg. 1; Humbert et al. 2023, §4).
    """
    _check_args(q, eps)
    e = _check_grid(grid)
    s = np.asarray(scores, dtype=np.float64).ravel()
    if np.isnan(s).any():
        raise InvalidInput(f"scores contain NaN (first at row {int(np.argmax(np.isnan(s)))})")
    counts = grid_counts(s, e)
    below_i = np.cumsum(counts) - counts  # N_<(e_j): rounded scores strictly below e_j (exact)
    below = below_i.astype(np.float64)
    above = (s.size - below_i - counts).astype(np.float64)  # N_>(e_j)
    w = np.maximum(below / q, above / (1.0 - q))
    delta = max(1.0 / q, 1.0 / (1.0 - q))
    # Shift by the minimum weight so the largest term is exp(0) = 1: no overflow,
    # and underflow only hits bins whose probability is below ~1e-308 anyway.
    p = np.exp(-(eps / (2.0 * delta)) * (w - w.min()))
    return p / p.sum()


def exponential_quantile(
    scores: np.ndarray, grid: np.ndarray, q: float, eps: float, rng: random.Random
) -> tuple[int, float]:
    """Sample a grid point near the q-quantile of ``scores`` with the ε-DP exponential mechanism.

    Returns ``(j, grid[j])``. Each score is rounded *up* to the grid (scores
    above the top of the grid are clipped to the top bin, see
    :func:`round_up_to_grid`). Weights w_j = max(N_<(e_j)/q, N_>(e_j)/(1−q))
    and sensitivity Δ = max(1/q, 1/(1−q)) as in SPEC §5 and §10
    (Angelopoulos et al. 2022, Alg. 1; Humbert et al. 2023, §4); see
    :func:`selection_probabilities`. Runs in O(n + m) on a uniform grid from
    :func:`grid` (O(n log m) otherwise).

    ``rng`` supplies the single uniform used for inverse-CDF sampling
    (``secrets.SystemRandom`` in production).
    """
    p = selection_probabilities(scores, grid, q, eps)
    cdf = np.cumsum(p)
    u = rng.random() * cdf[-1]
    # side="right": a bin with probability 0 (cdf flat) can never be selected
    j = min(int(np.searchsorted(cdf, u, side="right")), p.size - 1)
    return j, float(np.asarray(grid, dtype=np.float64)[j])
