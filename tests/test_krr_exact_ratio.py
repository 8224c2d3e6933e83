"""The k-RR and binary RR samplers are ε-LDP *as drawn* (red team 20, privacy F1): the
former "flip to one of the other k−1 labels" form raised its flip probability by a few ulps,
which bounds P(y|y)/P(y'|y) but widens P(y'|y)/P(y|y); at k = 10⁶, ε = 1e-10 the realised
loss was 3e-10. Here the probabilities each sampler realises — a 53-bit uniform
``u = j/2⁵³`` compared with the computed probability, then an exact ``randrange`` — are
computed in exact rationals and their ratio compared with e^ε at 80 digits.

Red team 21, privacy F1: the comparison was with the float's own value, ``Decimal(eps)``;
the ledger records and charges the decimal typed (ε0 = 4.2281), which lies below its
nearest float about half the time — the samplers drew at up to ~1e-16 more than recorded.
The loss is now compared with the smaller of the two, and with the ε0 the ledger records."""

from __future__ import annotations

import math
import random
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from privcal.accountant.normalize import normalize_cost
from privcal.calibrators.mechanisms import randomized_response as rr
from privcal.costs import LocalDP

_CASES = [(2, 1e-15), (2, 1e-9), (3, 0.5), (10, 1.0), (10**4, 1e-12), (10**6, 1e-10),
          (10**6, 1e-12), (10**9, 1e-7), (10**9, 30.0), (2, 700.0),
          # red team 21: typed decimals below their float (LDP-CP-S's binary RR; k-RR near
          # ε = ln k, where a 1e-16 change of β moves the loss most)
          (2, 4.2281), (2, 4.2346), (2, 4.863), (2, 8.3495), (10**4, 9.3), (10**4, 9.38),
          (200_000, 12.8), (10**7, 16.6), (10**8, 18.161124608501)]


def _typed(eps: float) -> Decimal:
    """The least of the float's own value, the decimal a user types for it (its shortest
    repr) and the ε0 the ledger records for it (``charge_subjects``'s per-subject cost)."""
    return min(Decimal(eps), Decimal(repr(eps)), normalize_cost(LocalDP(eps)).eps0)


def _below(p: float) -> Fraction:
    """P(u < p) for u a 53-bit uniform j/2⁵³ (what ``random.random() < p`` realises)."""
    return Fraction(math.ceil(Fraction(p) * 2**53), 2**53)


def _loss(keep: Fraction, other: Fraction) -> Decimal:
    """max(ln(keep/other), ln(other/keep)) at 80 digits."""
    with localcontext() as ctx:
        ctx.prec = 80
        ratio = max(keep / other, other / keep)
        return (Decimal(ratio.numerator) / Decimal(ratio.denominator)).ln()


class _Scalar(random.Random):
    """``random()`` answers ``u`` first, then 0.25 (a coin's "true"); ``randrange`` answers
    its largest value: a marker of the uniform branch for label 0 / bit False."""

    def __init__(self, u: float) -> None:
        super().__init__(0)
        self.answers = [u, 0.25]

    def random(self) -> float:
        return self.answers.pop(0) if self.answers else 0.25

    def randrange(self, *args: Any, **kw: Any) -> int:
        return int(args[-1]) - 1


class _Vector(np.random.Generator):
    """As :class:`_Scalar`, for the vectorised samplers (one row)."""

    def __init__(self, u: float) -> None:
        super().__init__(np.random.PCG64(0))
        self.answers = [u, 0.25]

    def random(self, size: Any = None, *args: Any, **kw: Any) -> Any:
        return np.full(size, self.answers.pop(0) if self.answers else 0.25)

    def integers(self, low: Any, high: Any = None, size: Any = None, *a: Any, **kw: Any) -> Any:
        return np.full(size, int(high) - 1, dtype=np.int64)


def _mixes(sampler: str, k: int, eps: float, u: float) -> bool:
    """Whether ``sampler``, its uniform draw being ``u``, takes the uniform branch."""
    if sampler == "krr":
        return rr.krr(0, k, eps, rng=_Scalar(u)) == k - 1
    if sampler == "krr_many":
        return int(rr.krr_many(np.zeros(1, dtype=np.int64), k, eps, rng=_Vector(u))[0]) == k - 1
    if sampler == "binary_rr":
        return rr.binary_rr(False, eps, rng=_Scalar(u)) is True
    return bool(rr.binary_rr_many(np.zeros(1, dtype=bool), eps, rng=_Vector(u))[0])


def _realised(sampler: str, k: int, eps: float) -> Fraction:
    """The probability ``sampler`` takes the uniform branch, read off the sampler itself: the
    number of 53-bit uniforms j/2⁵³ for which it does (a prefix: found by bisection)."""
    lo, hi = 0, 2**53  # mixes at every j < lo; not at hi (or hi = 2⁵³)
    while lo < hi:
        mid = (lo + hi) // 2
        if _mixes(sampler, k, eps, mid / 2**53):
            lo = mid + 1
        else:
            hi = mid
    return Fraction(lo, 2**53)


@pytest.mark.parametrize("sampler", ["krr", "krr_many", "binary_rr", "binary_rr_many"])
@pytest.mark.parametrize(("k", "eps"), _CASES)
def test_each_sampler_is_eps_ldp_as_drawn(sampler: str, k: int, eps: float) -> None:
    """The probability each sampler realises — read from the sampler, its 53-bit uniform
    chosen — against e^ε, exactly; and it is within a few ulps of the channel's β (the
    review of red team 20: a check of the formula alone passed a sampler that dropped the
    raise, 1e-3-LDP at k = 10⁶, ε = 1e-10)."""
    if sampler.startswith("binary"):
        k = 2
    mix = _realised(sampler, k, eps)
    keep, other = 1 - mix + mix / k, mix / k  # P(y | y), P(y' | y)
    assert _loss(keep, other) <= _typed(eps)
    beta = rr.krr_beta(k, math.nextafter(eps, 0.0))  # the ε drawn at: one ulp below
    assert abs(float(mix) - beta) <= 16 * math.ulp(beta) + 2**-53


@pytest.mark.parametrize(("k", "eps"), [(10**6, 1e-10), (10**4, 1e-12), (2, 1e-16)])
def test_the_former_flip_form_was_not(k: int, eps: float) -> None:
    """The check above fails the sampler it replaced (so it can fail)."""
    flip = _below(rr._at_least(rr.krr_flip_probability(k, eps)))
    keep, other = 1 - flip, flip / (k - 1)
    assert _loss(keep, other) > _typed(eps)


@pytest.mark.parametrize(("k", "eps"), [(2, 4.2281), (10**4, 9.3), (10**7, 16.6)])
def test_beta_at_the_given_float_was_not(k: int, eps: float) -> None:
    """Red team 21: the mixture form with β computed at the float given (not one ulp below)
    exceeds the typed ε0 — the check above can fail a sampler that draws at the float."""
    mix = _below(rr._at_least(rr.krr_beta(k, eps)))
    keep, other = 1 - mix + mix / k, mix / k
    assert _loss(keep, other) > _typed(eps)


def test_the_samplers_draw_k_rr() -> None:
    """The mixture form is k-RR: P(y|y) = e^ε/(e^ε+k−1), each other label 1/(e^ε+k−1),
    for the scalar and the vectorised samplers (a binomial 5-σ band over 2·10⁵ draws)."""
    k, eps, n = 4, 1.0, 200_000
    keep = math.exp(eps) / (math.exp(eps) + k - 1)
    gen, r = np.random.default_rng(3), random.Random(3)
    many = rr.krr_many(np.zeros(n, dtype=np.int64), k, eps, rng=gen)
    one = np.array([rr.krr(0, k, eps, rng=r) for _ in range(n)])
    for got in (many, one):
        counts = np.bincount(got, minlength=k) / n
        band = 5 * math.sqrt(keep * (1 - keep) / n)
        assert abs(counts[0] - keep) < band
        assert np.all(np.abs(counts[1:] - (1 - keep) / (k - 1)) < band)
    p = 1 / (1 + math.exp(eps))
    bits = rr.binary_rr_many(np.ones(n, dtype=bool), eps, rng=gen)
    scalar = [rr.binary_rr(True, eps, rng=r) for _ in range(n)]
    for got_bits in (bits, np.array(scalar)):
        assert abs((~got_bits).mean() - p) < 5 * math.sqrt(p * (1 - p) / n)
