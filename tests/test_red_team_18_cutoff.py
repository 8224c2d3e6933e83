"""LDP-CP-S's binomial cut-off in O(log m) tail evaluations at any level (red team 18,
httpsec F3): below a level of ~1e-17 scipy's ``binom.isf`` returns m, and the step-by-step
walk from it took ~m/2 tail evaluations (39 s at m = 4·10⁵) — inside a session's write
transaction at each round close, in ``advise`` and in a session's opening."""

from __future__ import annotations

import math
from typing import Any

import pytest

from privcal.calibrators import tail_bounds
from privcal.calibrators.tail_bounds import binomial_upper_cutoff, binomial_upper_tail


def _smallest(m: int, p: float, a: float) -> int:
    """The definition, by brute force: the smallest k with P(Bin(m, p) ≥ k) ≤ a (m + 1 if
    only k > m)."""
    return next((k for k in range(m + 1) if binomial_upper_tail(m, p, k) <= a), m + 1)


@pytest.mark.parametrize("level", [0.3, 1e-3, 1e-12, 1e-16, 1e-20, 1e-80, 1e-300])
@pytest.mark.parametrize("m,p", [(1, 0.5), (7, 0.01), (60, 0.502), (200, 0.5), (150, 0.97)])
def test_the_cutoff_is_the_definition(m: int, p: float, level: float) -> None:
    assert binomial_upper_cutoff(m, p, level) == _smallest(m, p, level)


@pytest.mark.parametrize("m", [10**4, 4 * 10**5, 10**8])
@pytest.mark.parametrize("level", [1e-3, 1e-20, 1e-300])
def test_a_tiny_level_costs_a_logarithmic_number_of_tails(
        monkeypatch: pytest.MonkeyPatch, m: int, level: float) -> None:
    calls = []
    real = tail_bounds._binomial_tail

    def counted(*args: Any) -> float:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(tail_bounds, "_binomial_tail", counted)
    k = binomial_upper_cutoff(m, 0.502, level)
    assert len(calls) <= 4 * math.log2(m) + 4, len(calls)
    # and it is the cut-off: the tail from k fits, the tail from k − 1 does not
    assert real(m, 0.502 * (1 + 1e-12), k) <= level < real(m, 0.502 * (1 + 1e-12), k - 1) \
        or k == 0
