"""Privacy accounting, pure mathematics: conversions, composition filters, reporting.

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

Enforcement (a request's ε or ρ may be chosen after seeing earlier releases,
so each rule is a valid privacy *filter*):

- a pure-ε cap stops when Σε would exceed it (basic composition with adaptive
  parameters, Rogers, Roth, Ullman & Vadhan 2016, "Privacy Odometers and
  Filters", Thm 3.6 with δ = 0); zCDP and (ε, δ) costs are refused;
- a ρ-zCDP cap stops when Σρ would exceed it, pure costs counting ε²/2 (the
  Rényi filter of Feldman & Zrnic 2021, "Individual Privacy Accounting via a
  Rényi Filter", Thm 3.1, holds at every order, hence for zCDP); (ε, δ) costs
  are refused (they have no zCDP equivalent);
- an (ε, δ) cap (E, D) uses basic composition Σε ≤ E, Σδ ≤ D over pure and
  (ε, δ) events, and the zCDP events as *one group* converted once with CKS20
  at δ_z = D/2 (**decision**: the split is fixed at half the cap's δ, so it does
  not depend on the requests; the group then contributes (ε_CKS20(Σρ, D/2), D/2)
  to the two sums from its first charge on).

Reporting: the spent (ε, δ) of a scope is the minimum over the valid bounds we
know, at the dataset's reporting δ, and names the rule that gave it
(:func:`spent_epsilon`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, Context, Decimal, localcontext
from typing import Literal

from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP
from privcal.errors import BudgetRefused, InvalidInput

__all__ = [
    "DELTA_SPLIT",
    "REPORT_DIGITS",
    "Notion",
    "Policy",
    "Spent",
    "SpentEpsilon",
    "check_charge",
    "cks20_epsilon",
    "cks20_order",
    "dstr",
    "remaining",
    "round_up",
    "simple_zcdp_epsilon",
    "spent_epsilon",
]

Notion = Literal["pure", "zcdp", "approx"]

#: significant digits of a reported ε (rounded up)
REPORT_DIGITS = 6
#: the share of an (ε, δ) cap's δ given to the group of zCDP charges (see the module docstring)
DELTA_SPLIT = Decimal("0.5")

#: enough digits that sums of stored amounts (≤ 30 decimals each) stay exact
_EXACT = Context(prec=80)


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


def _check_delta(delta: float) -> None:
    if not (0 < delta < 1):
        raise InvalidInput(f"δ must be in (0, 1), got {delta}")


def _cks20_objective(a: float, rho: float, log_inv_delta: float) -> float:
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
    _check_delta(delta)
    lid = math.log(1.0 / delta)
    # Optimise over t = ln(a − 1): the objective is smooth and unimodal there, and the
    # optimum sits near a ≈ 1 + √(ln(1/δ)/ρ), comfortably inside the bracket.
    guess = math.log(math.sqrt(lid / rho))
    from scipy.optimize import minimize_scalar  # here: pure and zCDP checks need no SciPy

    res = minimize_scalar(
        lambda t: _cks20_objective(1.0 + math.exp(t), rho, lid),
        bounds=(guess - 12.0, guess + 12.0),
        method="bounded",
        options={"xatol": 1e-12, "maxiter": 500},
    )
    return 1.0 + math.exp(float(res.x))


def cks20_epsilon(rho: float, delta: float) -> float:
    """ε(δ) of a ρ-zCDP mechanism by Canonne, Kamath & Steinke 2020 (Prop. 12 / Cor. 13).

    ε(δ) = inf_{a>1} [aρ + (ln(1/δ) + (a−1)ln(1−1/a) − ln a)/(a−1)], minimised over a
    continuous a (SPEC §3). Reproduces the SPEC table, e.g. ρ=0.1, δ=1e−5 → 1.9142.
    """
    a = cks20_order(rho, delta)
    # for large δ the bound can dip below 0; (ε<0, δ)-DP implies (0, δ)-DP
    return max(0.0, _cks20_objective(a, rho, math.log(1.0 / delta)))


def simple_zcdp_epsilon(rho: float, delta: float) -> float:
    """ρ + 2√(ρ ln(1/δ)) (Bun & Steinke 2016, Prop. 1.3); always looser than CKS20."""
    if not (rho > 0 and math.isfinite(rho)):
        raise InvalidInput(f"ρ must be a positive finite number, got {rho}")
    _check_delta(delta)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


@dataclass(frozen=True)
class Policy:
    """A dataset's budget: a cap in one notion (ε for pure, ρ for zCDP, (ε, δ) for approx)."""

    notion: Notion
    epsilon: Decimal | None = None
    rho: Decimal | None = None
    delta: Decimal | None = None  # the (ε, δ) cap's δ; None for pure and zCDP caps

    def describe(self) -> str:
        """A short human form of the cap."""
        if self.notion == "pure":
            return f"ε ≤ {dstr(self.epsilon or Decimal(0))} (pure DP)"
        if self.notion == "zcdp":
            return f"ρ ≤ {dstr(self.rho or Decimal(0))} (zCDP)"
        return f"(ε ≤ {dstr(self.epsilon or Decimal(0))}, δ ≤ {dstr(self.delta or Decimal(0))})"


@dataclass(frozen=True)
class Spent:
    """Exact running totals of the central charges to one dataset, per kind of event."""

    pure_eps: Decimal = Decimal(0)  # Σε over pure events
    pure_rho: Decimal = Decimal(0)  # Σε²/2 over pure events (their zCDP equivalent)
    zcdp_rho: Decimal = Decimal(0)  # Σρ over zCDP events
    approx_eps: Decimal = Decimal(0)  # Σε over (ε, δ) events
    approx_delta: Decimal = Decimal(0)  # Σδ over (ε, δ) events

    def add(self, cost: PureDP | ZCDP | ApproxDP) -> Spent:
        """The totals after one more event (exact)."""
        with localcontext(_EXACT):
            if isinstance(cost, PureDP):
                return Spent(
                    self.pure_eps + cost.eps,
                    self.pure_rho + cost.eps * cost.eps / 2,
                    self.zcdp_rho,
                    self.approx_eps,
                    self.approx_delta,
                )
            if isinstance(cost, ZCDP):
                return Spent(
                    self.pure_eps, self.pure_rho, self.zcdp_rho + cost.rho,
                    self.approx_eps, self.approx_delta,
                )
            return Spent(
                self.pure_eps, self.pure_rho, self.zcdp_rho,
                self.approx_eps + cost.eps, self.approx_delta + cost.delta,
            )

    @property
    def empty(self) -> bool:
        """True when nothing has been charged."""
        return (self.pure_eps, self.zcdp_rho, self.approx_eps, self.approx_delta) == (0, 0, 0, 0)


def _approx_usage(policy: Policy, spent: Spent) -> tuple[Decimal, Decimal]:
    """(ε, δ) used under an (ε, δ) cap: basic composition + the zCDP group at δ_z = D/2.

    Exact when there is no zCDP group; otherwise the CKS20 term is a float and the
    sum is rounded up (:func:`round_up`), so the comparison with the cap stays conservative.
    """
    assert policy.delta is not None
    with localcontext(_EXACT):
        eps = spent.pure_eps + spent.approx_eps
        delta = spent.approx_delta
        if spent.zcdp_rho > 0:
            dz = policy.delta * DELTA_SPLIT
            e = float(eps) + cks20_epsilon(float(spent.zcdp_rho), float(dz))
            # float(Decimal) rounds to nearest: step one ulp up before rounding up
            eps = round_up(math.nextafter(e, math.inf))
            delta += dz
    return eps, delta


def remaining(policy: Policy, spent: Spent) -> dict[str, Decimal]:
    """What is left of the cap, in the cap's notion (never negative)."""
    zero = Decimal(0)
    with localcontext(_EXACT):
        if policy.notion == "pure":
            assert policy.epsilon is not None
            return {"epsilon": max(zero, policy.epsilon - spent.pure_eps)}
        if policy.notion == "zcdp":
            assert policy.rho is not None
            return {"rho": max(zero, policy.rho - spent.pure_rho - spent.zcdp_rho)}
        assert policy.epsilon is not None and policy.delta is not None
        eps, delta = _approx_usage(policy, spent)
        return {"epsilon": max(zero, policy.epsilon - eps),
                "delta": max(zero, policy.delta - delta)}


def used(policy: Policy, spent: Spent) -> dict[str, Decimal]:
    """What has been used of the cap, in the cap's notion."""
    with localcontext(_EXACT):
        if policy.notion == "pure":
            return {"epsilon": spent.pure_eps}
        if policy.notion == "zcdp":
            return {"rho": spent.pure_rho + spent.zcdp_rho}
        eps, delta = _approx_usage(policy, spent)
        return {"epsilon": eps, "delta": delta}


def check_charge(
    policy: Policy, spent: Spent, cost: PureDP | ZCDP | ApproxDP, *, scope: str
) -> Spent:
    """Apply the filter of ``policy`` to one more ``cost``: the new totals, or BudgetRefused.

    The refusal names the scope, what was asked and what is left.
    """
    if isinstance(cost, LocalDP):
        raise InvalidInput("a local-DP cost is charged per subject (charge_subjects), not here")
    left = remaining(policy, spent)
    left_s = ", ".join(f"{k}={dstr(v)}" for k, v in left.items())

    def refuse(why: str) -> BudgetRefused:
        return BudgetRefused(
            f"budget refused on {scope}: asked {cost.describe()}, {why}; remaining {left_s}",
            scope=scope, asked=cost.describe(), remaining=left_s,
        )

    after = spent.add(cost)
    if policy.notion == "pure":
        if not isinstance(cost, PureDP):
            raise refuse("a pure-ε budget accepts only pure ε-DP costs "
                         "(zCDP and (ε, δ) do not imply pure ε-DP)")
        assert policy.epsilon is not None
        if after.pure_eps > policy.epsilon:
            raise refuse("it would exceed the cap")
        return after
    if policy.notion == "zcdp":
        if isinstance(cost, ApproxDP):
            raise refuse("an (ε, δ) cost has no zCDP equivalent and cannot be charged "
                         "to a ρ-zCDP budget")
        assert policy.rho is not None
        with localcontext(_EXACT):
            if after.pure_rho + after.zcdp_rho > policy.rho:
                raise refuse("it would exceed the cap")
        return after
    assert policy.epsilon is not None and policy.delta is not None
    eps, delta = _approx_usage(policy, after)
    if delta > policy.delta or eps > policy.epsilon:
        raise refuse("it would exceed the cap")
    return after


@dataclass(frozen=True)
class SpentEpsilon:
    """The tightest valid (ε, δ) we can claim for what was spent, and the rule that gave it."""

    epsilon: Decimal  # rounded up
    delta: Decimal
    rule: str
    candidates: dict[str, str]  # rule → ε (rounded up), for transparency


def spent_epsilon(policy: Policy, spent: Spent, reporting_delta: Decimal) -> SpentEpsilon:
    """The spent (ε, δ) at the dataset's reporting δ: the minimum of the valid bounds (SPEC §3).

    Candidates (each is a valid (ε, δ) guarantee for the whole sequence of charges):

    - ``basic composition`` — Σε of pure events, δ = 0 (only when no zCDP or (ε, δ) events);
    - ``CKS20 of total ρ`` — every pure event counted as ε²/2-zCDP, plus zCDP events, converted
      with CKS20 at the reporting δ (only without (ε, δ) events);
    - ``basic composition of pure ε + CKS20 of zCDP ρ`` — the two groups composed basically;
    - for (ε, δ) budgets, ``basic composition + CKS20 of zCDP group at δ/2`` — the enforcement rule.
    """
    if spent.empty:
        return SpentEpsilon(Decimal(0), Decimal(0), "nothing spent", {})
    rd = float(reporting_delta)
    cands: dict[str, tuple[Decimal, Decimal]] = {}
    has_approx = spent.approx_eps > 0 or spent.approx_delta > 0
    if policy.notion == "approx" or has_approx:
        eps, delta = _approx_usage(
            policy if policy.notion == "approx"
            else Policy("approx", Decimal(0), None, reporting_delta),
            spent,
        )
        cands["basic composition + CKS20 of the zCDP group at δ/2"] = (eps, delta)
    else:
        if spent.zcdp_rho == 0:
            cands["basic composition (Σε)"] = (spent.pure_eps, Decimal(0))
        total_rho = float(spent.pure_rho + spent.zcdp_rho)
        cands["CKS20 of total ρ (pure ε counted as ε²/2)"] = (
            round_up(cks20_epsilon(total_rho, rd)), reporting_delta,
        )
        if spent.zcdp_rho > 0 and spent.pure_eps > 0:
            # pure group by basic composition, δ only for the zCDP group
            e = float(spent.pure_eps) + cks20_epsilon(float(spent.zcdp_rho), rd)
            cands["basic composition of pure ε + CKS20 of zCDP ρ"] = (
                round_up(math.nextafter(e, math.inf)), reporting_delta,
            )
    rule, (eps_d, delta_d) = min(cands.items(), key=lambda kv: (kv[1][0], kv[1][1]))
    return SpentEpsilon(eps_d, delta_d, rule, {k: dstr(v[0]) for k, v in cands.items()})
