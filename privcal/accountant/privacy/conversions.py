"""Conversions between privacy notions, and how a figure is reported: pure mathematics.

No database here. Amounts that are stored or summed are exact :class:`~decimal.Decimal`;
conversions to (ε, δ) are evaluated in floating point and the reported ε is
rounded *up* (:func:`round_up`), so a reported figure is never smaller than the
true bound.

Notions (SPEC.md §3):

- pure → zCDP: ε-DP ⇒ (ε²/2)-zCDP (Bun & Steinke 2016, "Concentrated
  Differential Privacy: Simplifications, Extensions, and Lower Bounds",
  Prop. 1.4).
- zCDP → (ε, δ): Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for
  Differential Privacy", Prop. 12 / Cor. 13 (:func:`cks20_epsilon`), and the
  simpler, looser ρ + 2√(ρ ln 1/δ) (Bun & Steinke 2016, Prop. 1.3,
  :func:`simple_zcdp_epsilon`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import ROUND_CEILING, Decimal

from privcal.errors import InvalidInput

__all__ = [
    "REPORT_DIGITS",
    "check_delta",
    "cks20_epsilon",
    "cks20_objective",
    "cks20_order",
    "dstr",
    "round_up",
    "simple_zcdp_epsilon",
]

#: significant digits of a reported ε (rounded up)
REPORT_DIGITS = 6


def dstr(d: Decimal) -> str:
    """A decimal as a plain string without exponent or trailing zeros ("0.9", not "0.900E0")."""
    if d == 0:
        return "0"
    s = format(d, "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s


def round_up(x: float, digits: int = REPORT_DIGITS) -> Decimal:
    """``x`` rounded *up* to ``digits`` significant digits, as an exact Decimal.

    The float is first taken exactly (its full binary expansion), so the result is
    never below ``x``.
    """
    if not math.isfinite(x):
        raise InvalidInput(f"cannot report a non-finite ε ({x})")
    d = Decimal(x)  # exact binary value
    if d == 0:
        return Decimal(0)
    exp = d.adjusted() - digits + 1
    r = d.quantize(Decimal(1).scaleb(exp), rounding=ROUND_CEILING)
    if len(r.as_tuple().digits) > digits:  # rounded up to the next power of ten (999999.5 → 1e6)
        r = r.quantize(Decimal(1).scaleb(exp + 1), rounding=ROUND_CEILING)
    return r.normalize()


def check_delta(delta: float) -> None:
    """InvalidInput unless 0 < δ < 1."""
    if not (0 < delta < 1):
        raise InvalidInput(f"δ must be in (0, 1), got {delta}")


def cks20_objective(a: float, rho: float, log_inv_delta: float) -> float:
    """The CKS20 bound on ε at one Rényi order a > 1 (any a > 1 gives a valid ε)."""
    # Canonne, Kamath & Steinke 2020, Prop. 12 (as stated in SPEC §3):
    # ε = aρ + (ln(1/δ) + (a−1)·ln(1−1/a) − ln a)/(a−1), any a > 1.
    am1 = a - 1.0
    return a * rho + (log_inv_delta + am1 * math.log1p(-1.0 / a) - math.log(a)) / am1


def cks20_order(rho: float, delta: float) -> float:
    """The order a > 1 that minimises the CKS20 bound (found numerically).

    Any a > 1 gives a *valid* ε, so an imperfect minimiser can only make the
    reported ε larger, never invalid.
    """
    if not (rho > 0 and math.isfinite(rho)):
        raise InvalidInput(f"ρ must be a positive finite number, got {rho}")
    check_delta(delta)
    lid = math.log(1.0 / delta)
    # Minimise over t = ln(a − 1): the objective is smooth and unimodal there, and the
    # optimum sits near a ≈ 1 + √(ln(1/δ)/ρ), comfortably inside the bracket. A golden-section
    # search in pure Python (≈ 70 evaluations to |Δt| ≤ 1e−12) keeps SciPy off the path of
    # `budget show` and of every charge.
    guess = math.log(math.sqrt(lid / rho))
    t = _golden_min(lambda x: cks20_objective(1.0 + math.exp(x), rho, lid),
                    guess - 12.0, guess + 12.0, tol=1e-12)
    return 1.0 + math.exp(t)


_INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def _golden_min(f: Callable[[float], float], lo: float, hi: float, *, tol: float) -> float:
    """The argmin of a unimodal ``f`` on [lo, hi] by golden-section search (Kiefer 1953)."""
    c = hi - _INV_PHI * (hi - lo)
    d = lo + _INV_PHI * (hi - lo)
    fc, fd = f(c), f(d)
    while hi - lo > tol:
        if fc <= fd:
            hi, d, fd = d, c, fc
            c = hi - _INV_PHI * (hi - lo)
            fc = f(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + _INV_PHI * (hi - lo)
            fd = f(d)
    return c if fc <= fd else d


def cks20_epsilon(rho: float, delta: float) -> float:
    """ε(δ) of a ρ-zCDP mechanism by Canonne, Kamath & Steinke 2020 (Prop. 12 / Cor. 13).

    ε(δ) = inf_{a>1} [aρ + (ln(1/δ) + (a−1)ln(1−1/a) − ln a)/(a−1)], minimised over a
    continuous a (SPEC §3). Reproduces the SPEC table, e.g. ρ=0.1, δ=1e−5 → 1.9142.
    """
    a = cks20_order(rho, delta)
    # for large δ the bound can dip below 0; (ε<0, δ)-DP implies (0, δ)-DP
    return max(0.0, cks20_objective(a, rho, math.log(1.0 / delta)))


def simple_zcdp_epsilon(rho: float, delta: float) -> float:
    """ρ + 2√(ρ ln(1/δ)) (Bun & Steinke 2016, Prop. 1.3); always looser than CKS20."""
    if not (rho > 0 and math.isfinite(rho)):
        raise InvalidInput(f"ρ must be a positive finite number, got {rho}")
    check_delta(delta)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
