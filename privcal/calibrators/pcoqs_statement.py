"""The sentence a P-COQS release records (``coverage.statement``), in each version's wording.

``privcal audit verify`` compares the sentence of a release of the installed version with
the one recomputed here, and recomputes an older version's with that version's wording
(:meth:`privcal.calibrators.pcoqs.PCOQS.guarantee_as`). Since version 2.3.0 (red team 6)
every number of the sentence is written on the safe side of the exact value it states
(:mod:`~privcal.calibrators.bound_floats`): the coverage lower bound and P(E) ≥ 1−β never
above it, the upper bound and τ never below it. Before, the upper bound, 1−β and τ were
rounded to nearest (``.6g``, ``.4g``): 1−β = 0.9999999 was stated as "P(E) ≥ 1", and an
upper bound such as 0.908088235… (n = 2991) as "≤ 0.908088".
"""

from __future__ import annotations

from fractions import Fraction

from privcal.calibrators.bound_floats import text_at_least, text_at_most

__all__ = ["ROUNDED_TO_NEAREST", "SHORT_UPPER_STATEMENT", "coverage_statement"]

#: versions whose statement omitted the upper bound's third condition (the final interval)
SHORT_UPPER_STATEMENT = frozenset({"1.0.0", "2.0.0", "2.1.0"})
#: versions whose statement rounded the upper bound, 1−β and τ to nearest (module docstring)
ROUNDED_TO_NEAREST = frozenset({"1.0.0", "2.0.0", "2.1.0", "2.2.0"})


def coverage_statement(
    version: str, *, lower: float, lower_bound: Fraction, upper: float,
    upper_bound: Fraction, beta: float, tau: float, exact: bool, n_steps: int, rank: int,
    n: int, tol: float,
) -> str:
    """The statement of a P-COQS release of ``version`` (the case r' ≤ n): ``lower`` and
    ``upper`` are the recorded bounds, ``lower_bound`` and ``upper_bound`` their exact
    values (the text never states more than these), β as typed (P(E) ≥ 1 − β exactly)."""
    if version in ROUNDED_TO_NEAREST:
        up, sure, t = f"{upper:.6g}", f"{1 - beta:.6g}", f"{tau:.4g}"
    else:
        up = text_at_least(upper, upper_bound)
        sure = text_at_most(1 - beta, 1 - Fraction(repr(beta)))
        # an exact τ is an integer: written in full; a sub-Gaussian one never below
        t = str(tau) if isinstance(tau, int) else text_at_least(tau, Fraction(tau), 4)
    return (
        f"{text_at_most(lower, lower_bound)} ≤ P(Y ∈ C(X) | E) ≤ {up}, where the probability "
        "is over the calibration data and the test point (marginal, not per release) and E, "
        f"the event that all N = {n_steps} noisy counts are {'at most' if exact else 'within'} "
        f"τ = {t} {'above' if exact else 'of'} the true counts, depends on the noise alone and "
        f"has P(E) ≥ {sure}"
        + (" (the upper bound: given E₋, no count more than τ below, P(E₋) ≥ 1−β) "
           if exact else " ")
        + f"(seed 003, Thm 2; target rank {rank} of n = {n}; the upper bound also needs no "
        + ("ties and every score in [lower, upper], the lower bound needs neither)"
           if version in SHORT_UPPER_STATEMENT else
           f"ties, every score in [lower, upper] and no score inside the search's final "
           f"interval (width ≤ tol = {tol:g}): it does not hold otherwise; the "
           "lower bound needs none of these)")
    )
