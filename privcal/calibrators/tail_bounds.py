"""Exact one-sided tail cut-offs for the noise of the guaranteed modes (issue 13).

The guaranteed (default) modes of P-COQS and LDP-CP-S need, for one step or round, an
integer cut-off whose exceedance probability is at most a given level a. The earlier
releases used sub-Gaussian / Hoeffding bounds, two-sided and with the full range; these
functions return the *smallest* integer cut-off that the exact distribution allows, so the
guarantee is the same statement with a smaller (never larger) margin.

Rigour: every probability is an *upper* bound on the exact one, evaluated in float64 and
then inflated by a relative margin (:data:`MARGIN`) that is many orders of magnitude above
the rounding error of the few hundred thousand float operations involved (each
``math.exp``/``erfc`` and scipy's incomplete-beta tail is accurate to a few ulps; a sum of
R ≤ 2·10⁶ positive terms has relative error ≤ R·2⁻⁵³ < 3·10⁻¹⁰). A cut-off is accepted only
when the inflated bound is ≤ a, so float error can only make a cut-off larger (conservative).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from scipy.stats import binom

from privcal.errors import InvalidInput

__all__ = [
    "MARGIN",
    "MIN_LEVEL",
    "binomial_upper_cutoff",
    "binomial_upper_tail",
    "discrete_gaussian_cutoff",
    "discrete_gaussian_tail",
]

#: relative safety margin on every computed tail probability (see the module docstring)
MARGIN = 1e-8
#: the largest number of discrete-Gaussian pmf terms summed explicitly
_MAX_TERMS = 2_000_000
#: the smallest tail level accepted (see :func:`_level`)
MIN_LEVEL = 1e-300
#: scipy's binomial tail is used only at or above this value; below it scipy can underflow
#: internally (it returns 0 for P(Bin(1077, 1/2) ≥ 1039) ≈ 1.06e-254), so the Chernoff bound
#: is used there (:func:`_chernoff_tail`)
SCIPY_TRUSTED = 1e-100


def _level(a: float) -> float:
    if not (isinstance(a, int | float) and 0 < a < 1):
        raise InvalidInput(f"tail level must be in (0, 1), got {a!r}")
    if a < MIN_LEVEL:
        # below it the tails compared with a are subnormal floats (a few bits, or none)
        raise InvalidInput(f"tail level {a:g} is below {MIN_LEVEL:g}: the failure "
                           "probability is too small to be checked in floating point")
    return float(a)


def _binomial_args(m: int, p: float) -> tuple[int, float]:
    if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 1:
        raise InvalidInput(f"m must be an integer ≥ 1, got {m!r}")
    if not (0 <= p <= 1):
        raise InvalidInput(f"p must be in [0, 1], got {p!r}")
    return int(m), min(1.0, p * (1 + 1e-12) + 1e-300)


def _binomial_tail(m: int, p_hi: float, k: int) -> float:
    if k <= 0:
        return 1.0
    if k > m:
        return 0.0
    sf = float(binom.sf(k - 1, m, p_hi))
    if sf < SCIPY_TRUSTED:
        return min(1.0, max(sf * (1 + MARGIN), _chernoff_tail(m, p_hi, k)))
    return min(1.0, sf * (1 + MARGIN))


def _chernoff_tail(m: int, p: float, k: int) -> float:
    """An upper bound on P(Bin(m, p) ≥ k), 1 ≤ k ≤ m, valid whatever the float range:
    exp(−m·KL(k/m ‖ p)) for k/m > p (Chernoff 1952; Hoeffding 1963, Thm 1, eq. (2.1)),
    else 1. The exponent is made less negative by 10⁻¹²·m·(|A| + |B| + 1), A and B the two
    terms of KL, far above their float error (a few ulps each). It equals p^m at k = m.
    An exponent below −745 gives 0.0: the true tail is then < 5·10⁻³²⁴ ≤ any level
    accepted (:data:`MIN_LEVEL`)."""
    x = k / m
    if x <= p or p <= 0.0:
        return 1.0 if p > 0.0 else 0.0
    a = x * math.log(x / p)
    b = 0.0 if k == m else (1 - x) * (math.log1p(-x) - math.log1p(-p))
    kl = a + b - 1e-12 * (abs(a) + abs(b) + 1)
    return min(1.0, math.exp(-m * kl) * (1 + MARGIN)) if kl > 0 else 1.0


def binomial_upper_tail(m: int, p: float, k: int) -> float:
    """An upper bound on P(Bin(m, p) ≥ k): the exact tail at p·(1 + 10⁻¹²), times 1 + MARGIN."""
    m, p_hi = _binomial_args(m, p)
    return _binomial_tail(m, p_hi, int(k))


def binomial_upper_cutoff(m: int, p: float, a: float) -> int:
    """The smallest integer k with P(Bin(m, p) ≥ k) ≤ a (k = m + 1 when only k > m works).

    Exact binomial upper tail (scipy's regularised incomplete beta), evaluated at p nudged
    up by 10⁻¹² relative (the tail increases with p, so this covers the rounding of p) and
    inflated by 1 + MARGIN (:func:`binomial_upper_tail`). Used by LDP-CP-S: the reports of
    one round are i.i.d. Bernoulli(p(F)) given the public query
    (:mod:`privcal.calibrators.ldp_score_bounds`).
    """
    m, p_hi = _binomial_args(m, p)
    a_eff = _level(a)

    def tail(k: int) -> float:  # an upper bound on P(X ≥ k)
        return _binomial_tail(m, p_hi, k)

    def fits(k: int) -> bool:  # the tail from k is within the level (k > m: nothing left)
        return k > m or tail(k) <= a_eff

    # scipy's quantile starts the search; from there a galloping search brackets the cut-off
    # and bisection finds it: O(log m) tails, whatever the level. (A step-by-step walk took
    # ~m/2 tails where isf fails — it returns m below a level of ~1e-17 —: 39 s at m = 4·10⁵,
    # inside a session's write transaction; red team 18, httpsec F3.)
    guess = binom.isf(a_eff / (1 + MARGIN), m, p_hi)
    k = int(guess) + 1 if math.isfinite(guess) else m + 1
    k = min(max(k, 0), m + 1)
    step = 1
    if fits(k):  # the cut-off is k or below: the largest k that does not fit is below it
        hi, lo = k, -1
        while hi > 0:
            cand = max(hi - step, 0)
            if not fits(cand):
                lo = cand
                break
            hi, step = cand, step * 2
    else:  # the cut-off is above k
        lo = k
        while True:
            cand = min(lo + step, m + 1)
            if fits(cand):
                hi = cand
                break
            lo, step = cand, step * 2
    while hi - lo > 1:  # fits(hi), not fits(lo) (lo = -1: every k from 0 fits)
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _sigma2(sigma2: Fraction | float) -> float:
    s2 = float(sigma2)
    if not (math.isfinite(s2) and s2 > 0):
        raise InvalidInput(f"σ² must be a finite number > 0, got {sigma2!r}")
    return s2


def _closed_form_tail(s2: float, k: int) -> float:
    """Upper bound on P(Z ≥ k), k ≥ 1, for Z ~ N_ℤ(0, σ²), in closed form:
    [f(k) + ∫_k^∞ f] / (√(2π)σ), f(x) = exp(−x²/(2σ²))."""
    s = math.sqrt(s2)
    integral = s * math.sqrt(math.pi / 2) * math.erfc(k / (s * math.sqrt(2)))
    num = math.exp(-k * k / (2 * s2)) + integral
    return num / (math.sqrt(2 * math.pi) * s) * (1 + MARGIN)


def discrete_gaussian_tail(sigma2: Fraction | float, k: int) -> float:
    """An upper bound on P(Z ≥ k) for Z ~ N_ℤ(0, σ²), k ≥ 1 (tight to ~1e-8 relative).

    Proof sketch. Write f(x) = exp(−x²/(2σ²)) and P(Z = z) = f(z)/D, D = Σ_{z∈ℤ} f(z).
    (i) D ≥ Σ_{|z|≤R} f(z) (positive terms) and D ≥ √(2π)·σ (Poisson summation:
    D = √(2π)σ·Σ_j exp(−2π²σ²j²) ≥ √(2π)σ; Canonne, Kamath, Steinke 2020, §2 / Fact 19).
    (ii) f decreases on [0, ∞), so Σ_{z ≥ R+1} f(z) ≤ ∫_R^∞ f = σ√(π/2)·erfc(R/(σ√2)) and
    Σ_{z ≥ k} f(z) ≤ Σ_{z=k}^{R} f(z) + ∫_R^∞ f for k ≤ R (for k > R: f(k) + ∫_k^∞ f).
    The ratio of the numerator bound to the larger denominator bound, inflated by MARGIN,
    bounds P(Z ≥ k) from above.
    """
    s2 = _sigma2(sigma2)
    if k < 1:
        raise InvalidInput(f"k must be ≥ 1, got {k}")
    table = _dg_table(s2)
    if k > table.r:
        return min(1.0, _closed_form_tail(s2, k))
    return min(1.0, table.tail(k))


class _DGTable:
    """Suffix sums of f(z) = exp(−z²/(2σ²)) for z = 0..R, plus the analytic remainder."""

    def __init__(self, s2: float) -> None:
        s = math.sqrt(s2)
        self.r = r = min(math.ceil(14 * s) + 2, _MAX_TERMS)
        z = np.arange(r + 1, dtype=np.float64)
        f = np.exp(-(z * z) / (2 * s2))
        remainder = s * math.sqrt(math.pi / 2) * math.erfc(r / (s * math.sqrt(2)))
        # suffix[i] = Σ_{z=i}^{R} f(z) + ∫_R^∞ f  ≥ Σ_{z≥i} f(z)
        self.suffix = np.cumsum(f[::-1])[::-1] + remainder
        partial = float(f[0] + 2 * math.fsum(f[1:].tolist()))
        self.denominator = max(partial, math.sqrt(2 * math.pi) * s) * (1 - MARGIN)

    def tail(self, k: int) -> float:
        return float(self.suffix[k]) / self.denominator * (1 + MARGIN)


_TABLES: dict[float, _DGTable] = {}


def _dg_table(s2: float) -> _DGTable:
    t = _TABLES.get(s2)
    if t is None:
        if len(_TABLES) > 64:
            _TABLES.clear()
        t = _TABLES[s2] = _DGTable(s2)
    return t


def discrete_gaussian_cutoff(sigma2: Fraction | float, a: float) -> int:
    """The smallest integer t ≥ 0 with P(Z > t) = P(Z ≥ t+1) ≤ a, Z ~ N_ℤ(0, σ²)
    (by :func:`discrete_gaussian_tail`'s upper bound, so P(Z > t) ≤ a is proven)."""
    s2 = _sigma2(sigma2)
    a = _level(a)
    table = _dg_table(s2)
    # suffix is non-increasing: the first index i ≥ 1 with tail(i) ≤ a, then t = i − 1
    ok = np.nonzero(table.suffix[1:] / table.denominator * (1 + MARGIN) <= a)[0]
    if ok.size:
        i = int(ok[0]) + 1
        # recheck with the scalar path (the same arithmetic) and step if needed
        while table.tail(i) > a:
            i += 1
        return i - 1
    # past the table: the smallest i > r with closed-form tail(i) ≤ a, which decreases in i —
    # doubling steps to a bracket (lo fails, hi holds), then bisection: O(log i) evaluations
    # (a walk back one integer at a time never ended for σ² ≈ 10³⁰⁰, red team 5)
    lo, hi = table.r, table.r + 1
    while _closed_form_tail(s2, hi) > a:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _closed_form_tail(s2, mid) <= a:
            hi = mid
        else:
            lo = mid
    return hi - 1
