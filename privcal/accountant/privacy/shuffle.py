"""Amplification by shuffling: a proven (ε, δ) for n shuffled ε0-LDP reports (SHUFFLE.md, SPEC §8).

The seed paper (Penso, Mahpud, Goldberger & Sheffet, "Privacy-Preserving
Conformal Prediction Under Local Differential Privacy", §4.2) reports
ε_eff = ε0/√n for a shuffled protocol. That is a heuristic, not a DP guarantee
(it has no δ and understates the loss 1.3–90×). :func:`amplify` computes every
proven bound of ``shared/SHUFFLE.md`` that is valid for the randomizer, keeps the
smallest, and reports ε0/√n only as a labelled reference:

- ``closed-form``: Feldman, McMillan & Talwar 2021 (FMT21), Thm 3.1, any randomizer;
- ``clone``: FMT21's clone reduction with the divergence computed exactly, any randomizer;
- ``stronger-clone``: Feldman, McMillan & Talwar 2023 (SODA), binary RR and k-RR;
- ``blanket``: Balle, Bell, Gascón & Nissim 2019 (CRYPTO), §3, k-RR with k ≥ 3, exact.

Every numerical bound is *certified*: after the search, ε is rounded up to six
significant digits and δ(ε) is evaluated again at (a float not above) that
decimal and checked to be ≤ δ. The closed form is certified the same way, by
evaluating the exact clone divergence it bounds. The numerics are in
:mod:`privcal.accountant.privacy.shuffle_bounds`.
"""

from __future__ import annotations

import functools
import math
import numbers
from decimal import ROUND_CEILING, Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict

from privcal.accountant.privacy import shuffle_bounds as sb
from privcal.costs import ApproxDP, fixed_context
from privcal.errors import InvalidInput, numeric_edge

__all__ = [
    "BOUND_NONE",
    "HEURISTIC_LABEL",
    "AmplificationResult",
    "BoundRow",
    "Randomizer",
    "amplified_cost",
    "amplify",
]

Randomizer = Literal["binary-rr", "krr", "generic"]
RANDOMIZERS: tuple[str, ...] = ("binary-rr", "krr", "generic")

BOUND_NONE = "none (no amplification)"
HEURISTIC_LABEL = "heuristic (paper), not a DP guarantee"

REFERENCES = {
    "closed-form": "Feldman, McMillan & Talwar 2021, Hiding Among the Clones, Thm 3.1",
    "clone": "Feldman, McMillan & Talwar 2021, clone reduction, exact divergence",
    "stronger-clone": "Feldman, McMillan & Talwar 2023, stronger clone p_c = 2/(e^ε0+1)",
    "blanket": "Balle, Bell, Gascón & Nissim 2019, privacy blanket of k-RR, exact",
}

# Above this ε0 the clones are so rare (p_c ≤ e^-50) that no bound can amplify
# for any n we accept, and e^ε0 would overflow long before ε0 = 710.
MAX_EPS0 = 50.0
# The bounds are evaluated for at most MAX_N reports. More reports are accepted (up to
# MAX_REPORTS) and given the bound at MAX_N, which holds for them: the shuffled view of
# n + 1 reports is a post-processing of the view of n (add the one more report, drawn
# independently of the victim's), so δ(ε) does not increase with n (red team 26, shuffle F2:
# a shuffled session with n' > 10⁹ was refused with "n must be between 1 and 1e+09").
MAX_N = 10**9
MAX_REPORTS = 10**18
# Significant digits of a reported ε (rounded up).
DIGITS = 6


class BoundRow(BaseModel):
    """One bound's verdict: its ε (None when it does not apply, with the reason)."""

    model_config = ConfigDict(frozen=True)

    name: str
    reference: str
    eps: float | None
    delta_at_eps: float | None = None
    certified: bool = False
    reason: str | None = None


class AmplificationResult(BaseModel):
    """The amplified central (ε, δ) of n shuffled ε0-LDP reports, with every bound tried.

    ``eps`` is the smallest certified bound (``bound`` names it), or ε0 with
    ``bound == BOUND_NONE`` when none improves on ε0 (ε0-LDP reports are
    ε0-DP after any post-processing, so then δ is not needed at all).
    ``certified`` means δ(ε) was re-evaluated at the returned ε and found ≤ δ
    (``delta_at_eps``). ``heuristic_eps0_over_sqrt_n`` is the seed paper's
    ε0/√n, labelled by ``heuristic_label``: it is *not* a DP guarantee.
    """

    model_config = ConfigDict(frozen=True)

    eps: float
    delta: float
    bound: str
    amplified: bool
    certified: bool
    delta_at_eps: float
    eps0: float
    n: int
    randomizer: Randomizer
    k: int | None
    bounds: list[BoundRow]
    heuristic_eps0_over_sqrt_n: float
    heuristic_label: str = HEURISTIC_LABEL


def _validate(eps0: object, n: object, delta: object, randomizer: object,
              k: object) -> tuple[float, int, float, Randomizer, int | None]:
    def real(value: object, name: str) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real | Decimal):
            raise InvalidInput(f"{name} must be a number, got {value!r}")
        x = float(value)
        if not math.isfinite(x):
            raise InvalidInput(f"{name} must be finite, got {value!r}")
        return x

    e0 = real(eps0, "ε0")
    if e0 <= 0:
        raise InvalidInput(f"ε0 must be > 0, got {eps0}")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise InvalidInput(f"n must be an integer, got {n!r}")
    n = int(n)
    if not 1 <= n <= MAX_REPORTS:
        raise InvalidInput(f"n must be between 1 and {MAX_REPORTS:.0e}, got {n}")
    d = real(delta, "δ")
    if not 0 < d < 1:
        raise InvalidInput(f"δ must be in (0, 1), got {delta}")
    if randomizer not in RANDOMIZERS:
        raise InvalidInput(
            f"unknown randomizer {randomizer!r} (choose binary-rr, krr or generic)"
        )
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, numbers.Integral):
            raise InvalidInput(f"k must be an integer, got {k!r}")
        k = int(k)
    if randomizer == "krr":
        if k is None:
            raise InvalidInput("k-RR needs the number of categories k")
        if k < 2:
            raise InvalidInput(f"k-RR needs k ≥ 2, got {k}")
    elif randomizer == "binary-rr":
        if k not in (None, 2):
            raise InvalidInput(f"binary RR has k = 2, got k = {k}")
        k = 2
    elif k is not None:
        raise InvalidInput("k applies only to the krr randomizer")
    return e0, n, d, randomizer, k  # type: ignore[return-value]


def _round_up(x: float) -> Decimal:
    """``x`` rounded up to DIGITS significant digits, from its exact binary value."""
    d = Decimal(x)
    if d == 0:
        return d
    ctx = fixed_context(80)  # not the caller's context: its precision would change the figure
    return d.quantize(Decimal(1).scaleb(d.adjusted() - DIGITS + 1, ctx), rounding=ROUND_CEILING,
                      context=ctx)


def _float_not_above(d: Decimal) -> float:
    """The largest float ≤ d: certifying δ there certifies d (δ(ε) is non-increasing)."""
    f = float(d)
    if Decimal(f) > d:
        f = math.nextafter(f, -math.inf)
    return f


def _certify(name: str, eps: float, eps0: float, delta: float, plan: sb.PairPlan) -> BoundRow:
    rounded = _round_up(eps)
    at = sb.pair_delta(_float_not_above(rounded), plan)
    reason = None
    if at > delta:
        reason = f"not certified: δ({float(rounded):g}) = {at:.3g} > δ"
    elif float(rounded) >= eps0:
        reason = "no amplification (ε ≥ ε0)"
    return BoundRow(name=name, reference=REFERENCES[name], eps=float(rounded),
                    delta_at_eps=at, certified=at <= delta, reason=reason)


def _numerical(name: str, eps0: float, delta: float, plan: sb.PairPlan) -> BoundRow:
    top = min(eps0, sb.certifiable_eps_max(delta))
    found = sb.solve_eps(lambda x: sb.pair_delta(x, plan), top, delta) if top > 0 else None
    if found is None:
        return BoundRow(name=name, reference=REFERENCES[name], eps=None,
                        reason=f"no ε < ε0 can be certified at δ = {delta:g}")
    return _certify(name, found[0], eps0, delta, plan)


def _not_applicable(name: str, reason: str) -> BoundRow:
    return BoundRow(name=name, reference=REFERENCES[name], eps=None, reason=reason)


@numeric_edge("amplify")
def amplify(eps0: float, n: int, delta: float, randomizer: Randomizer = "generic",
            k: int | None = None) -> AmplificationResult:
    """Central (ε, δ) of n ε0-LDP reports through a trusted shuffler (substitution adjacency).

    Computes every bound of SHUFFLE.md valid for ``randomizer`` (``generic``: any
    ε0-LDP randomizer; ``binary-rr``; ``krr`` with ``k`` categories, k = 2 being
    binary RR) and returns the smallest certified one. Bad input raises
    :class:`~privcal.errors.InvalidInput`.
    """
    eps0, n, delta, randomizer, k = _validate(eps0, n, delta, randomizer, k)
    # Audits and repeated releases ask the same questions; the cached value is
    # copied so that a caller mutating its result cannot alter the cache.
    result = _amplify(eps0, min(n, MAX_N), delta, randomizer, k).model_copy(deep=True)
    if n <= MAX_N:
        return result
    note = (f"evaluated at n = {MAX_N:.0e}, which bounds any larger n (one more report, "
            "independent of the others, is post-processing)")
    rows = [row.model_copy(update={"reason": note if row.reason is None
                                   else f"{row.reason}; {note}"}) for row in result.bounds]
    return result.model_copy(update={"n": n, "bounds": rows,
                                     "heuristic_eps0_over_sqrt_n": eps0 / math.sqrt(n)})


@functools.lru_cache(maxsize=256)
def _amplify(eps0: float, n: int, delta: float, randomizer: Randomizer,
             k: int | None) -> AmplificationResult:
    tau = sb.truncation_tau(delta)
    rows: list[BoundRow] = []
    if eps0 > MAX_EPS0:
        reason = f"ε0 > {MAX_EPS0:g}: no shuffle bound amplifies, not evaluated"
        rows = [_not_applicable(name, reason) for name in REFERENCES]
    elif math.exp(eps0) == 1.0:
        # ε0 below the floats' resolution at 1 (≲ 1.1e−16): the two outputs' probabilities
        # are the same float and no Pair can be formed ("Pair needs pa > qa", an error); ε0
        # itself is the answer (red team 24, privacy F4)
        reason = f"e^ε0 rounds to 1 in floating point at ε0 = {eps0:g}: not evaluated"
        rows = [_not_applicable(name, reason) for name in REFERENCES]
    elif delta < 2.0 * sb.FLOAT_SLACK:
        # every certified δ(ε) includes the allowance 2e−14·(1 + e^ε) ≥ 4e−14: below it no
        # bound can be certified, so none is evaluated (a subnormal δ made τ = 1e−4·δ zero
        # and the planning raised ZeroDivisionError: red team 24, privacy F3)
        reason = f"no ε < ε0 can be certified at δ = {delta:g}"
        rows = [_not_applicable(name, reason) for name in REFERENCES]
    else:
        clone = sb.clone_plan(eps0, n, tau, stronger=False)
        cf = sb.closed_form_eps(eps0, n, delta)
        if cf is None:
            rows.append(_not_applicable(
                "closed-form", "outside its validity (needs ε0 ≤ ln(n / (16 ln(4/δ))))"))
        else:
            rows.append(_certify("closed-form", cf, eps0, delta, clone))
        rows.append(_numerical("clone", eps0, delta, clone))
        if randomizer == "generic":
            rows.append(_not_applicable(
                "stronger-clone", "needs binary RR or k-RR (R(x) ≥ (R(x0)+R(x1))/(e^ε0+1))"))
            rows.append(_not_applicable("blanket", "needs k-RR with k ≥ 3"))
        else:
            rows.append(_numerical("stronger-clone", eps0, delta,
                                   sb.clone_plan(eps0, n, tau, stronger=True)))
            if k is not None and k >= 3:
                rows.append(_numerical("blanket", eps0, delta,
                                       sb.blanket_plan(eps0, n, k, tau)))
            else:
                rows.append(_not_applicable(
                    "blanket", "needs k ≥ 3 (for k = 2 the blanket is the stronger clone)"))
    best: BoundRow | None = None
    for row in rows:
        if row.eps is not None and row.certified and row.eps < eps0:
            if best is None or row.eps < best.eps:  # type: ignore[operator]
                best = row
    common = dict(delta=delta, eps0=eps0, n=n, randomizer=randomizer, k=k, bounds=rows,
                  heuristic_eps0_over_sqrt_n=eps0 / math.sqrt(n))
    if best is None:
        # ε0-LDP reports are ε0-DP (δ = 0) whatever the shuffler does.
        return AmplificationResult(eps=eps0, bound=BOUND_NONE, amplified=False, certified=True,
                                   delta_at_eps=0.0, **common)  # type: ignore[arg-type]
    return AmplificationResult(eps=best.eps, bound=best.name, amplified=True, certified=True,
                               delta_at_eps=best.delta_at_eps,
                               **common)  # type: ignore[arg-type]


def amplified_cost(eps0: float, n: int, delta: float, randomizer: Randomizer,
                   k: int | None = None) -> tuple[ApproxDP | None, AmplificationResult]:
    """The central cost of a shuffled ε0-LDP release, for the accountant to charge.

    ``(ApproxDP(ε, δ), result)`` when a certified bound improves on ε0, else
    ``(None, result)``. ε is already rounded up (six significant digits), so its
    decimal form is exact.
    """
    result = amplify(eps0, n, delta, randomizer, k)
    if not result.amplified:
        return None, result
    return ApproxDP(eps=result.eps, delta=result.delta), result
