"""The exponential mechanism for a DP quantile over a public grid of bins.

Used by ExponQ (Angelopoulos, Bates, Zrnic, Jordan, *Private Prediction Sets*,
HDSR 2022, Algorithm 1 "private quantile"; summarised in Romanus & Molinari,
seed 003, §2) and by each agent of FedCP²-QQ (Humbert et al., ICML 2023, seed
002, §4; SPEC §10). The score function and its sensitivity follow SPEC §5/§10:

    w_j = max(N_<(e_j)/q, N_>(e_j)/(1−q)),   Δ = max(1/q, 1/(1−q)),
    P(j) ∝ exp(−ε·w_j / (2Δ)),

with N_< and N_> the numbers of (rounded) scores strictly below / above e_j.
Substituting one score changes each N_< or N_> by at most 1 and so each w_j
by at most Δ, which makes the mechanism ε-DP (McSherry & Talwar 2007).
(The released code of Angelopoulos et al. normalises by ε·min(α, 1−α), which
is not ε-DP; SPEC §5.)

Neighbouring relation: substitution of one score, n public (the accountant's
``privacy["neighbouring"]``). Replacing one score changes each N_<(e_j) and
N_>(e_j) by at most 1, hence each w_j by at most Δ and each log-probability
ratio by at most ε. (Under add/remove of a score n changes, and so would q̃
and the grid size chosen from n: no add/remove claim is made.)

Sampler (exact, :func:`sample_index`): the selection probabilities are never
rounded. With d_j = ε·w_j/(2Δ) as exact rationals (q as its exact binary
value, ε as the decimal typed), j is drawn by rejection: a proposal
j ∝ 2^(−L_j), where the integers L_j ≤ (d_j − s)·log2(e) are lower bounds
computed with IEEE-exact +, −, ×, ÷ and a margin (s = min d_j, computed exactly
among the few j whose float screening puts them near the minimum), sampled
exactly with ``rng.randrange``; then acceptance with probability
exp(−(d_j − s))·2^(L_j) ≤ 1, decided by comparing a lazily refined uniform
(``rng.getrandbits``) against rigorous decimal bounds of that number
(``Decimal.exp`` is correctly rounded), refining until the comparison
is decided. The accepted j has probability exactly ∝ exp(−d_j): pure ε-DP
holds as stated, with no δ from floating point (the float inverse-CDF sampler
this replaces could not output some bins under one neighbour that had
probability 2^−53 under the other). Same construction as exact samplers with
arbitrary-precision comparisons (e.g. OpenDP's); written here from the
mathematics. With ``secrets.SystemRandom`` (production) the uniforms come
from the OS CSPRNG. :func:`selection_probabilities` (float) is kept for
diagnostics and tests only. Not constant-time: the number of proposals depends on the
weights, so on the data; the DP claim does not cover timing.
"""

from __future__ import annotations

import math
import random
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from fractions import Fraction

import numpy as np

from privcal.calibrators.mechanisms.discrete_gaussian import to_fraction
from privcal.costs import fixed_context
from privcal.errors import InvalidInput

__all__ = [
    "exponential_quantile",
    "grid",
    "grid_counts",
    "round_up_to_grid",
    "sample_index",
    "selection_probabilities",
]


def grid(a: float, b: float, m: int) -> np.ndarray:
    """The uniform public grid e_j = a + j(b−a)/(m−1), j = 0..m−1 (SPEC §5).

    The last point is set to ``b`` exactly (float rounding of a + (m−1)(b−a)/(m−1)
    could otherwise land just below b and push a score equal to b off the grid). A range
    whose width overflows, or whose step is below the floats' resolution (points not
    strictly increasing), is refused here, before anything uses it.
    """
    if not (math.isfinite(a) and math.isfinite(b)):
        raise InvalidInput(f"grid bounds must be finite, got [{a}, {b}]")
    if not a < b:
        raise InvalidInput(f"grid lower bound must be < upper bound, got [{a}, {b}]")
    if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 2:
        raise InvalidInput(f"number of grid points must be an integer ≥ 2, got {m!r}")
    m = int(m)
    if not math.isfinite(b - a):
        raise InvalidInput(f"grid range [{a}, {b}] is too wide: its width overflows a float")
    e = np.empty(m, dtype=np.float64)
    # j ≤ m−2 only: (m−1)·step may round past the largest float at the widest ranges
    # (the review of red team 21: four overflow warnings at [−8.9e307, 8.9e307])
    e[:-1] = a + np.arange(m - 1, dtype=np.float64) * ((b - a) / (m - 1))
    e[-1] = b
    return _check_grid(e)


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
    try:
        if not np.array_equal(e, grid(a, b, m)):
            return None
    except InvalidInput:  # the uniform grid on [a, b] is not increasing: e is not it
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


#: proposal weights are 2^(K − L_j): K bounds the work spent on bins of negligible mass
_K = 40
_LOG2E = 1.4426950408889634  # float(log2(e)); the margins below absorb its rounding


def _exp_bounds(t: Fraction, digits: int) -> tuple[Fraction, Fraction]:
    """Rigorous bounds lo ≤ exp(−t) ≤ hi for rational t ≥ 0, to about ``digits`` digits.

    t is rounded down and up with directed rounding; ``Decimal.exp`` is correctly rounded
    (relative error ≤ ½·10^(1−digits)), widened here by 10^(2−digits) each way.
    """
    # contexts of their own, every field given (fixed_context): nothing from the thread's
    # context or decimal.DefaultContext (an Emin of -99 there made exp(-300)'s bounds 0)
    dn = fixed_context(digits, ROUND_FLOOR)
    up = fixed_context(digits, ROUND_CEILING)
    num, den = Decimal(t.numerator), Decimal(t.denominator)
    t_lo, t_hi = dn.divide(num, den), up.divide(num, den)
    near = fixed_context(digits)
    slack = Fraction(1, 10 ** (digits - 2))
    hi = Fraction(near.exp(t_lo.copy_negate())) * (1 + slack)
    lo = Fraction(near.exp(t_hi.copy_negate())) * (1 - slack)
    return lo, hi


#: the largest exponent :func:`_bernoulli_exp_scaled` evaluates in one piece: exp(−t) of a
#: larger t underflows to 0 in the decimal context (its smallest exponent is −999 999, so
#: exp(−t) = 0 from t ≈ 2.3·10⁶), which would give a grid point probability exactly 0 on one
#: dataset and a positive one on its neighbour
_EXP_PIECE = 10**6


def _bernoulli_exp_scaled(t: Fraction, shift: int, rng: random.Random) -> bool:
    """One exact draw of Bernoulli(exp(−t)·2^shift), for rational t with t·log2(e) ≥ shift ≥ 0.

    A large t is split: exp(−t)·2^shift = exp(−P)^k · exp(−t′)·2^shift with P =
    :data:`_EXP_PIECE`, t′ = t − k·P ≥ shift, and the draw is the AND of independent
    exact draws of each factor (the first False ends it), so no factor underflows.
    """
    while t > _EXP_PIECE + shift:
        if not _bernoulli_exp_piece(Fraction(_EXP_PIECE), 0, rng):
            return False
        t -= _EXP_PIECE
    return _bernoulli_exp_piece(t, shift, rng)


def _bernoulli_exp_piece(t: Fraction, shift: int, rng: random.Random) -> bool:
    """:func:`_bernoulli_exp_scaled` for t ≤ :data:`_EXP_PIECE` + shift.

    A uniform V is drawn 64 bits at a time and compared with rigorous bounds of
    p = exp(−t)·2^shift; both are refined until V < p or V ≥ p is certain, so
    P(True) = p exactly (the loop ends with probability 1 since p has a fixed value).
    """
    if t == 0:
        return True  # p = 1 (shift must be 0)
    v, bits, digits = 0, 0, 30
    scale = 1 << shift
    while True:
        v = (v << 64) | rng.getrandbits(64)
        bits += 64
        lo, hi = _exp_bounds(t, digits)
        lo, hi = lo * scale, hi * scale
        denom = 1 << bits  # V ∈ [v/denom, (v+1)/denom)
        if (v + 1) <= lo * denom:
            return True
        if v >= hi * denom:
            return False
        digits += 20


def sample_index(
    below: np.ndarray, above: np.ndarray, q: float, eps: float, rng: random.Random
) -> int:
    """Exact exponential mechanism: j with probability exactly ∝ exp(−ε·w_j/(2Δ)).

    w_j = max(below_j/q, above_j/(1−q)), Δ = max(1/q, 1/(1−q)), with q its exact binary
    value and ε the decimal typed (:func:`~privcal.calibrators.mechanisms.discrete_gaussian.
    to_fraction`). See the module docstring for the rejection scheme; expected number of
    proposals ≤ 4 + m·2^−40, each needing O(1) exact arithmetic after one O(m) float pass.
    """
    _check_args(q, eps)
    b = np.asarray(below, dtype=np.int64)
    a = np.asarray(above, dtype=np.int64)
    m = b.size
    if m < 1 or a.shape != b.shape or b.min() < 0 or a.min() < 0:
        raise InvalidInput("below/above counts must be non-negative arrays of one shape")
    if m > (1 << (62 - _K)):
        raise InvalidInput(f"at most {1 << (62 - _K)} grid points, got {m}")
    qq = Fraction(q)
    ee = to_fraction(eps, "ε")
    delta = max(1 / qq, 1 / (1 - qq))
    c = ee / (2 * delta)

    def d(j: int) -> Fraction:  # the exact exponent of grid point j
        return c * max(int(b[j]) / qq, int(a[j]) / (1 - qq))

    # Float screening (only +, −, ×, ÷: each correctly rounded, relative error ≤ 2^−53).
    cf = float(c)
    v = cf * np.maximum(b.astype(np.float64) / q, a.astype(np.float64) / (1.0 - q))
    v_min = float(v.min())
    # s = min_j d_j exactly: each v_j is within 2^−49 (relative) of d_j, so the minimiser
    # is among the j with v_j ≤ v_min·(1 + 2^−44). (A shift of v_min·(1 − 2^−30) left the
    # best grid point an exponent v_min·2^−30: past ε·n ≈ 10^11 every proposal's acceptance
    # was ≪ 1 and the sampler never returned — review R2.)
    near_min = np.flatnonzero(v <= v_min * (1 + 2.0**-44))
    # d_j depends on j only through (below_j, above_j): one exact value per distinct pair
    # (a plateau of grid points with equal counts — an empty stretch of scores — is one)
    keep = np.ones(near_min.size, dtype=bool)
    keep[1:] = (np.diff(b[near_min]) != 0) | (np.diff(a[near_min]) != 0)
    s = min(d(int(j)) for j in near_min[keep])
    if float(v.max()) < 2.0**40:
        x = (v - float(s)) * _LOG2E
        # |x_j − (d_j − s)·log2 e| ≤ 2^−45·(v_j + v_min) < 1 when v < 2^40: floor(x − 1 − …)
        lev = np.floor(x * (1 - 1e-12) - 1e-12 * v - 1.0)
        lev = np.clip(lev, 0, _K).astype(np.int64)
    else:  # huge exponents (ε·n ≳ 10^12): exact, slow path
        lower_log2e = Fraction(1442695040888963, 10**15)
        lev = np.array(
            [min(_K, max(0, math.floor((d(j) - s) * lower_log2e) - 1)) for j in range(m)],
            dtype=np.int64,
        )
    weights = np.left_shift(np.int64(1), _K - lev)
    cum = np.cumsum(weights)
    total = int(cum[-1])
    while True:
        j = int(np.searchsorted(cum, rng.randrange(total), side="right"))
        if _bernoulli_exp_scaled(d(j) - s, int(lev[j]), rng):
            return j


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

    The grid point is drawn exactly (:func:`sample_index`); ``rng`` supplies the
    uniform bits (``secrets.SystemRandom`` in production).
    """
    _check_args(q, eps)
    e = _check_grid(grid)
    s = np.asarray(scores, dtype=np.float64).ravel()
    if np.isnan(s).any():
        raise InvalidInput(f"scores contain NaN (first at row {int(np.argmax(np.isnan(s)))})")
    counts = grid_counts(s, e)
    below = np.cumsum(counts) - counts  # N_<(e_j)
    above = s.size - below - counts  # N_>(e_j)
    j = sample_index(below, above, q, eps, rng)
    return j, float(e[j])
