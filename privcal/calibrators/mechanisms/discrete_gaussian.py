"""Exact samplers for the discrete Laplace and discrete Gaussian distributions.

Canonne, Kamath, Steinke, *The Discrete Gaussian for Differential Privacy*
(NeurIPS 2020), §5: Algorithm 1 (Bernoulli(exp(−γ))), Algorithm 2 (discrete
Laplace), Algorithm 3 (discrete Gaussian by rejection from a discrete Laplace).

Every step is exact integer/rational arithmetic: a Bernoulli(num/den) is
``rng.randrange(den) < num``, so the output distribution is exactly the
target one given a perfect uniform source. No floating point is used, which
avoids the attacks on floating-point noise (Mironov 2012). In production
``rng`` is ``secrets.SystemRandom()``; tests pass a seeded ``random.Random``.

Not constant-time: the running time grows with |Z| (the geometric loop of Algorithm 2 and
the rejections of Algorithm 3), and whoever can time a draw learns about the noise, so about
what it hides (Jin, McMurtry, Rubinstein & Ohrimenko 2022, "Are We There Yet? Timing and
Floating-Point Attacks on Differential Privacy Systems"). The DP claims do not cover timing.

Rationals are carried as (numerator, denominator) pairs of Python ints in the
inner loops: ``fractions.Fraction`` normalises with a gcd at every operation
and is several times slower.
"""

from __future__ import annotations

import math
import random
from decimal import Decimal
from fractions import Fraction

from privcal.errors import InvalidInput

__all__ = [
    "bernoulli_exp",
    "discrete_gaussian",
    "discrete_gaussian_pmf",
    "discrete_laplace",
    "to_fraction",
]

Rational = Fraction | Decimal | int | str | float


def to_fraction(x: Rational, what: str = "value") -> Fraction:
    """Exact rational from a Fraction, Decimal, int or decimal string.

    A float is read as the decimal a person typed (its shortest repr), as
    ``privcal.costs`` does, so 0.1 means 1/10 and not its binary expansion.
    """
    if isinstance(x, bool):
        raise InvalidInput(f"{what} must be a number, got {x!r}")
    try:
        if isinstance(x, float):
            if not math.isfinite(x):
                raise InvalidInput(f"{what} must be finite, got {x!r}")
            return Fraction(repr(x))
        if isinstance(x, Decimal) and not x.is_finite():
            raise InvalidInput(f"{what} must be finite, got {x!r}")
        return Fraction(x)
    except (ValueError, TypeError, ZeroDivisionError) as exc:
        raise InvalidInput(f"{what} is not a rational number: {x!r}") from exc


def _bernoulli_exp(num: int, den: int, rng: random.Random) -> bool:
    """Bernoulli(exp(−num/den)) for num ≥ 0, den ≥ 1 (CKS20 Algorithm 1)."""
    if num <= den:
        # Alg. 1, γ ∈ [0, 1]: K is the first index with A_K = 0, where
        # A_K ~ Bernoulli(γ/K); P(K odd) = exp(−γ).
        k = 1
        while rng.randrange(den * k) < num:
            k += 1
        return k % 2 == 1
    # Alg. 1, γ > 1: exp(−γ) = exp(−1)^⌊γ⌋ · exp(−(γ − ⌊γ⌋)).
    for _ in range(num // den):
        if not _bernoulli_exp(1, 1, rng):
            return False
    return _bernoulli_exp(num % den, den, rng)


def bernoulli_exp(gamma: Rational, rng: random.Random) -> bool:
    """One exact draw of Bernoulli(exp(−γ)), γ ≥ 0 rational (CKS20 Algorithm 1)."""
    g = to_fraction(gamma, "γ")
    if g < 0:
        raise InvalidInput(f"γ must be ≥ 0, got {g}")
    return _bernoulli_exp(g.numerator, g.denominator, rng)


def _discrete_laplace(s: int, t: int, rng: random.Random) -> int:
    """Discrete Laplace with P(z) ∝ exp(−|z|·s/t), integers s, t ≥ 1 (CKS20 Algorithm 2)."""
    while True:
        u = rng.randrange(t)
        if not _bernoulli_exp(u, t, rng):
            continue
        v = 0
        while _bernoulli_exp(1, 1, rng):
            v += 1
        # X = U + t·V is geometric with P(X = x) ∝ exp(−x/t)
        y = (u + t * v) // s
        if rng.randrange(2):
            if y == 0:
                continue  # otherwise 0 would be counted twice
            return -y
        return y


def discrete_laplace(scale: Rational, rng: random.Random) -> int:
    """One exact draw from the discrete Laplace with P(z) ∝ exp(−|z|/scale), z ∈ ℤ.

    ``scale`` is a positive rational t/s (CKS20 Algorithm 2 with parameters s, t).
    """
    b = to_fraction(scale, "scale")
    if b <= 0:
        raise InvalidInput(f"discrete Laplace scale must be > 0, got {b}")
    return _discrete_laplace(b.denominator, b.numerator, rng)


def discrete_gaussian(sigma2: Rational, rng: random.Random) -> int:
    """One exact draw from the discrete Gaussian N_ℤ(0, σ²): P(z) ∝ exp(−z²/(2σ²)), z ∈ ℤ.

    CKS20 Algorithm 3: t = ⌊σ⌋ + 1, propose Y ~ discrete Laplace of scale t,
    accept with probability exp(−(|Y| − σ²/t)²/(2σ²)). σ² is exact (Fraction,
    Decimal, int, decimal string); the acceptance test is done in integers:
    with σ² = a/b, (|Y| − σ²/t)²/(2σ²) = (|Y|·b·t − a)² / (2·a·b·t²).
    Expected number of proposals is below 2 for every σ (CKS20 Thm 7 and §5.3).
    """
    s2 = to_fraction(sigma2, "σ²")
    if s2 <= 0:
        raise InvalidInput(f"σ² must be > 0, got {s2}")
    a, b = s2.numerator, s2.denominator
    # ⌊σ⌋ = isqrt(⌊σ²⌋), exact for any non-negative rational σ²
    t = math.isqrt(a // b) + 1
    den = 2 * a * b * t * t
    while True:
        y = _discrete_laplace(1, t, rng)
        num = (abs(y) * b * t - a) ** 2
        if _bernoulli_exp(num, den, rng):
            return y


def discrete_gaussian_pmf(sigma2: Rational, support: range) -> list[float]:
    """P(Z = z) for z in ``support`` under N_ℤ(0, σ²), normalised over ℤ (for tests and docs).

    The normalising constant Σ_z exp(−z²/(2σ²)) is summed to ±(⌈40σ⌉ + 1),
    beyond which the terms are below e^{-800} and vanish in float64.
    """
    s2 = float(to_fraction(sigma2, "σ²"))
    if s2 <= 0:
        raise InvalidInput(f"σ² must be > 0, got {s2}")
    r = math.ceil(40 * math.sqrt(s2)) + 1
    z_norm = math.fsum(math.exp(-(z * z) / (2 * s2)) for z in range(-r, r + 1))
    return [math.exp(-(z * z) / (2 * s2)) / z_norm for z in support]
