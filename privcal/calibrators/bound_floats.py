"""A proven coverage bound as the float (and the text) a release records, never past the proof.

A coverage lower bound is proven as an exact rational (e.g. split conformal's r/(n+1)); the
calibrators compute it in floating point (``1 - alpha``), which can land an ulp above it
(red team 6: α = 0.7, n = 9 recorded 0.30000000000000004 against an exact 3/10). A release is
recorded as JSON, so the figure a reader gets is the float's shortest ``repr`` read as a
decimal; :func:`float_at_most` compares that decimal with the proven bound. It returns the
float unchanged whenever it was already valid, so the releases recorded before this check
still recompute to the same numbers in ``privcal audit verify``; only a release whose
recorded figure was *above* its proof (which verify now flags, correctly) changes. Likewise
:func:`text_at_most` for the 6-significant-digit number of a statement (``f"{x:.6g}"``
rounds to nearest, which can round a bound up past its proof), and :func:`float_at_least`
for an upper bound.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from fractions import Fraction

from privcal.costs import fixed_context

__all__ = ["count_text", "float_at_least", "float_at_most", "float_text", "rank_bound",
           "text_at_least", "text_at_most"]


def _recorded(x: float) -> Fraction:
    """The number a recorded float means: its shortest repr, read as a decimal."""
    return Fraction(repr(x))


def rank_bound(rank: int, slack: float, n: int) -> Fraction:
    """⌈rank − slack⌉/(n+1) exactly (at least 0): the coverage of a threshold at least the
    ⌈rank − slack⌉-th smallest of n exchangeable scores (``slack`` as its exact binary value)."""
    return Fraction(max(0, math.ceil(rank - Fraction(slack))), n + 1)


def float_at_most(x: float, bound: Fraction) -> float:
    """``x`` if its recorded value is ≤ ``bound``, else the largest float whose is."""
    if _recorded(x) <= bound:
        return x
    y = float(bound)  # correctly rounded: at most an ulp or two above the answer
    while _recorded(y) > bound:
        y = math.nextafter(y, -math.inf)
    return y


def float_at_least(x: float, bound: Fraction) -> float:
    """``x`` if its recorded value is ≥ ``bound``, else the smallest float whose is."""
    if _recorded(x) >= bound:
        return x
    y = float(bound)
    while _recorded(y) < bound:
        y = math.nextafter(y, math.inf)
    return y


def _text(x: float, bound: Fraction, digits: int, *, up: bool) -> str:
    s = f"{x:.{digits}g}"
    if (Fraction(s) >= bound) if up else (Fraction(s) <= bound):
        return s
    ctx = fixed_context(digits, ROUND_CEILING if up else ROUND_FLOOR)
    d = ctx.divide(Decimal(bound.numerator), Decimal(bound.denominator))
    return format(d.normalize(ctx), "g")


def text_at_most(x: float, bound: Fraction, digits: int = 6) -> str:
    """``f"{x:.6g}"`` if that number is ≤ ``bound``, else ``bound`` rounded *down* to
    ``digits`` significant digits (the statement of a lower bound never states more)."""
    return _text(x, bound, digits, up=False)


def text_at_least(x: float, bound: Fraction, digits: int = 6) -> str:
    """``f"{x:.6g}"`` if that number is ≥ ``bound``, else ``bound`` rounded *up* to
    ``digits`` significant digits (the statement of an upper bound never states less)."""
    return _text(x, bound, digits, up=True)


def float_text(x: float) -> str:
    """A number a user may act on — a threshold, an interval's end — exactly: its shortest
    round-trip spelling (``0.30000000000000004``), ``+inf``/``-inf`` (red team 22, ui F6 and
    F7: a threshold printed ``0.3`` in 10 digits, rounded to nearest, made sets covering
    0.50 under a recorded ≥ 0.9 when copied; intervals of Unix times printed in 6 digits
    were ``[1.70005e+09, 1.70005e+09]``). The CLI's tables and the auditor's page both
    spell thresholds with it, and the CLI every number devices or agents take as protocol
    input (an LDP-CP-S round's query, a FedCP²-QQ level or grid end: a query printed 0.225
    for 0.22499999999999998 gave coverage 0.80 under a recorded ≥ 0.9; red team 24,
    fedlocal F2)."""
    x = float(x)
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return repr(x)


def count_text(v: int) -> str:
    """A count as an error message states it: its digits up to 15 of them, else 3 significant
    digits (``1.00e+300``): α = 1e-300 put a 301-digit "need m·n ≥" on the one error line
    (red team 26, fedlocal F4; raps k_reg = 10⁴⁰⁰ raised an OverflowError
    formatting itself: F6). Decimal, not float: the count may be past the float range."""
    return str(v) if abs(v) < 10**15 else format(Decimal(v), ".2e")
