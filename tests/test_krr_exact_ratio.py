"""The k-RR and binary RR samplers are ε-LDP *as drawn* (red team 20, privacy F1): the
former "flip to one of the other k−1 labels" form raised its flip probability by a few ulps,
which bounds P(y|y)/P(y'|y) but widens P(y'|y)/P(y|y); at k = 10⁶, ε = 1e-10 the realised
loss was 3e-10. Here the probabilities each sampler realises — a 53-bit uniform
``u = j/2⁵³`` compared with the computed probability, then an exact ``randrange`` — are
computed in exact rationals and their ratio compared with e^ε at 80 digits."""

from __future__ import annotations

import math
import random
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from privcal.calibrators.mechanisms import randomized_response as rr

_CASES = [(2, 1e-15), (2, 1e-9), (3, 0.5), (10, 1.0), (10**4, 1e-12), (10**6, 1e-10),
          (10**6, 1e-12), (10**9, 1e-7), (10**9, 30.0), (2, 700.0)]


def _below(p: float) -> Fraction:
    """P(u < p) for u a 53-bit uniform j/2⁵³ (what ``random.random() < p`` realises)."""
    return Fraction(math.ceil(Fraction(p) * 2**53), 2**53)


def _loss(keep: Fraction, other: Fraction) -> Decimal:
    """max(ln(keep/other), ln(other/keep)) at 80 digits."""
    with localcontext() as ctx:
        ctx.prec = 80
        ratio = max(keep / other, other / keep)
        return (Decimal(ratio.numerator) / Decimal(ratio.denominator)).ln()


@pytest.mark.parametrize(("k", "eps"), _CASES)
def test_each_report_is_eps_ldp_as_drawn(k: int, eps: float) -> None:
    mix = _below(rr._at_least(rr.krr_beta(k, eps)))
    keep, other = 1 - mix + mix / k, mix / k  # P(y | y), P(y' | y)
    assert _loss(keep, other) <= Decimal(eps)


@pytest.mark.parametrize(("k", "eps"), [(10**6, 1e-10), (10**4, 1e-12), (2, 1e-16)])
def test_the_former_flip_form_was_not(k: int, eps: float) -> None:
    """The check above fails the sampler it replaced (so it can fail)."""
    flip = _below(rr._at_least(rr.krr_flip_probability(k, eps)))
    keep, other = 1 - flip, flip / (k - 1)
    assert _loss(keep, other) > Decimal(eps)


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
