"""Conversions between privacy notions, and how a figure is reported: pure mathematics.

No database here. Amounts that are stored or summed are exact :class:`~decimal.Decimal`;
conversions to (ε, δ) are evaluated in floating point, inflated by a bound on the
evaluation's rounding error (:func:`cks20_error_bound`), and the reported ε is rounded *up*
(:func:`round_up`), so a reported figure is never smaller than the true bound.

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

from privcal.costs import fixed_context
from privcal.errors import InvalidInput

__all__ = [
    "REPORT_DIGITS",
    "check_delta",
    "cks20_epsilon",
    "cks20_error_bound",
    "cks20_objective",
    "cks20_order",
    "dstr",
    "round_up",
    "simple_zcdp_epsilon",
]

#: significant digits of a reported ε (rounded up)
REPORT_DIGITS = 6


#: the context of :func:`round_up` (every field given: nothing from the caller's)
_FIXED = fixed_context(80)

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
    ctx = _FIXED  # not the caller's context: its precision or traps would change the figure
    exp = d.adjusted() - digits + 1
    r = d.quantize(Decimal(1).scaleb(exp, ctx), rounding=ROUND_CEILING, context=ctx)
    if len(r.as_tuple().digits) > digits:  # rounded up to the next power of ten (999999.5 → 1e6)
        r = r.quantize(Decimal(1).scaleb(exp + 1, ctx), rounding=ROUND_CEILING, context=ctx)
    return r.normalize(ctx)


def check_delta(delta: float) -> None:
    """InvalidInput unless 0 < δ < 1."""
    if not (0 < delta < 1):
        raise InvalidInput(f"δ must be in (0, 1), got {delta}")


def cks20_objective(a: float, rho: float, log_inv_delta: float) -> float:
    """The CKS20 bound on ε at one Rényi order a > 1 (any a > 1 gives a valid ε)."""
    # Canonne, Kamath & Steinke 2020, Prop. 12 (as stated in SPEC §3):
    # ε = aρ + (ln(1/δ) + (a−1)·ln(1−1/a) − ln a)/(a−1), any a > 1.
    if not a > 1.0:
        raise InvalidInput(f"a Rényi order must be > 1, got {a}")
    am1 = a - 1.0
    return a * rho + (log_inv_delta + am1 * math.log1p(-1.0 / a) - math.log(a)) / am1


#: relative allowance per term for the float error of :func:`cks20_objective`, whose dozen
#: correctly rounded or faithful operations err by ~1e−15 of its terms' size (as
#: :data:`~privcal.accountant.privacy.filters._FLOAT_SLACK`): generous on purpose
_CKS20_SLACK = 1e-12


def cks20_error_bound(a: float, rho: float, delta: float) -> float:
    """A bound on |float :func:`cks20_objective` − its exact value| at the float order ``a``.

    The exact value is taken at the exact ρ and δ the floats ``rho`` and ``delta`` stand for,
    within half an ulp (a caller's decimal ρ or δ converted by ``float()``). The objective
    is a sum of terms aρ, ln(1/δ)/(a−1), ln(1−1/a) and −ln(a)/(a−1); each operation errs by
    at most an ulp of its result, so the error is a small multiple of 1.1e−16 times the sum
    of the terms' sizes — with two terms that do not scale with them: 1/a rounded moves
    ln(1−1/a) by ~1.1e−16/(a−1) (a near 1, i.e. large ρ), and δ rounded (a subnormal δ keeps
    few bits) moves ln(1/δ) by ≤ ulp(δ)/δ, divided by a−1; ρ rounded likewise moves aρ by
    up to a·ulp(ρ) — both at full weight, not inside the relative slack (red team 16: a
    subnormal ρ's a·ulp(ρ), scaled by the slack, left ε 1.6e-6 relative below the truth).
    Near the bound's zero crossing (ρ ≈ eδ²/2) the terms cancel, so an allowance relative
    to the result alone would not do (red team 6: a value computed ≤ 0 there was reported 0
    for a true ε > 0).
    """
    am1 = a - 1.0
    lid = -math.log(delta)
    size = (a * rho + abs(math.log1p(-1.0 / a))
            + (lid + abs(math.log(a)) + 1.0) / am1)
    return _CKS20_SLACK * size + a * math.ulp(rho) + (math.ulp(delta) / delta) / am1


def cks20_order(rho: float, delta: float) -> float:
    """The order a > 1 that minimises the CKS20 bound (found numerically).

    Any a > 1 gives a *valid* ε, so an imperfect minimiser can only make the
    reported ε larger, never invalid.
    """
    if not (rho > 0 and math.isfinite(rho)):
        raise InvalidInput(f"ρ must be a positive finite number, got {rho}")
    check_delta(delta)
    lid = -math.log(delta)  # ln(1/δ): finite for a subnormal δ too, where 1/δ overflows
    # Minimise over t = ln(a − 1): the objective is smooth and unimodal there, and the
    # optimum sits near a ≈ 1 + √(ln(1/δ)/ρ), comfortably inside the bracket. A golden-section
    # search in pure Python (≈ 70 evaluations to |Δt| ≤ 1e−12) keeps SciPy off the path of
    # `budget show` and of every charge.
    q = lid / rho  # over- or underflows only for a ρ near the ends of the floats
    guess = (math.log(math.sqrt(q)) if 0.0 < q < math.inf
             else 0.5 * (math.log(lid) - math.log(rho)))
    t = _golden_min(lambda x: _objective_at(x, rho, lid), guess - 12.0, guess + 12.0, tol=1e-12)
    a = 1.0 + math.exp(t)
    if not (1.0 < a < math.inf and math.isfinite(_objective_at(t, rho, lid))):
        raise InvalidInput(f"ρ={rho} at δ={delta} is outside the range the CKS20 conversion "
                           "can evaluate in floating point")
    return a


def _objective_at(x: float, rho: float, lid: float) -> float:
    """The objective at a = 1 + eˣ for the search; +∞ where that order is not a float > 1
    (a huge ρ puts the optimum at a − 1 below the floats' resolution near 1, red team 6:
    ρ = 1e30 crashed in log1p(−1)) or the value is not a number, so the search moves away."""
    try:
        a = 1.0 + math.exp(x)
    except OverflowError:
        return math.inf
    if not 1.0 < a < math.inf:
        return math.inf
    v = cks20_objective(a, rho, lid)
    return v if v == v else math.inf


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

    The float returned is an *upper bound* on the exact bound at the order found: the float
    evaluation plus :func:`cks20_error_bound` (≈ 1e−12 of its terms), so that
    :func:`round_up` of it is never below the true figure (red team 6: without it, ρ =
    0.10825636382305727, δ = 1e−5 reported ε = 2 against an exact 2.000000000000000115, and a
    value computed ≤ 0 near the zero crossing was reported 0). A reported ε differs from
    the un-inflated one's only where a 6-digit boundary lies within that allowance. A ρ
    or δ whose evaluation is not finite is an InvalidInput, never a NaN turned into 0.
    """
    a = cks20_order(rho, delta)
    # an upper bound on the exact value at a: the float value plus its error bound
    up = cks20_objective(a, rho, -math.log(delta)) + cks20_error_bound(a, rho, delta)
    if not math.isfinite(up):
        raise InvalidInput(f"ρ={rho} at δ={delta} gives no finite CKS20 ε in floating point")
    # for large δ the bound can dip below 0; (ε<0, δ)-DP implies (0, δ)-DP
    return max(0.0, up)


def simple_zcdp_epsilon(rho: float, delta: float) -> float:
    """ρ + 2√(ρ ln(1/δ)) (Bun & Steinke 2016, Prop. 1.3); always looser than CKS20."""
    if not (rho > 0 and math.isfinite(rho)):
        raise InvalidInput(f"ρ must be a positive finite number, got {rho}")
    check_delta(delta)
    return rho + 2.0 * math.sqrt(rho * -math.log(delta))
