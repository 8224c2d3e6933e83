"""The composition filters that enforce a dataset's cap (pure ε, ρ-zCDP, (ε, δ)): pure mathematics.

No database here. Running totals are exact :class:`~decimal.Decimal` sums; the one
float evaluation (:func:`renyi_filter_term`) is rounded *up*. Conversions are in
:mod:`privcal.accountant.privacy.conversions`, what a cap guarantees and what has been
spent in :mod:`privcal.accountant.privacy.guarantees`.

Enforcement. A request's ε, ρ or δ may be chosen after seeing every earlier
release (full adaptivity), so each cap is enforced by a rule proven to be a
privacy *filter*: whatever the analyst's strategy and whenever it stops, the
whole transcript satisfies the cap's guarantee
(:func:`~privcal.accountant.privacy.guarantees.filter_guarantee`).

- **pure-ε cap E**: accept while Σε ≤ E. Each step's privacy loss is bounded by
  its ε surely, so the transcript's loss is ≤ Σε ≤ E on every path: basic
  composition with adaptively chosen ε is a valid filter (Rogers, Roth, Ullman
  & Vadhan 2016, "Privacy Odometers and Filters", Thm 3.6 with δ = 0;
  Whitehouse, Ramdas, Rogers & Wu 2023, "Fully-Adaptive Composition in
  Differential Privacy", §3). zCDP and (ε, δ) costs are refused.
- **ρ-zCDP cap P**: accept while Σρ ≤ P, pure costs counting ε²/2. For every
  order a > 1, exp((a−1)(L_t − a·R_t)) (L the loss, R = Σρ so far, ρ_i
  predictable) is a nonnegative supermartingale, so at any stopping time the
  transcript has Rényi divergence ≤ a·P at every a: it is P-zCDP (the Rényi
  filter of Feldman & Zrnic 2021, "Individual Privacy Accounting via a Rényi
  Filter", Thm 3.1, at every order). Its (ε, δ) guarantee is CKS20 of the *cap* P.
  (ε, δ) costs are refused (they have no zCDP equivalent).
- **(ε, δ) cap (E, D)**, with a grid A of Rényi orders fixed when the dataset is
  created (stored on its row and in its audit entry; default
  :data:`DEFAULT_RENYI_ORDERS`). With ε_p = Σε of pure and (ε, δ) costs,
  Δ = Σδ of (ε, δ) costs, R = Σρ of zCDP costs and δ' = D/(2|A|), accept while

      ε_p + g(R) ≤ E   and   Δ + [R > 0]·D/2 ≤ D,
      g(0) = 0,  g(R) = min_{a∈A} f_a(R) for R > 0,
      f_a(R) = a·R + (ln(1/δ') + ln c_a)/(a − 1),  c_a = (1/a)(1 − 1/a)^(a−1)

  (:func:`renyi_filter_epsilon`). The old rule (CKS20 of the *realized* Σρ at
  D/2) was not a filter: the analyst could stop the zCDP group after an output
  that favoured one neighbour and spend the rest as pure ε (issue 14).

  *Proof sketch* (fix neighbours x, x'; P, Q the laws of the transcript; L its
  privacy loss; T the stopping time; the hockey-stick δ(E) = E_P[(1 − e^(E−L))+]).
  (i) Each (ε_i, δ_i) step, chosen predictably, is a mixture: with probability
  1 − δ_i (the same under P and Q) an ε_i-indistinguishable pair, otherwise
  arbitrary (Kairouz, Oh & Viswanath 2015, Thm 3.4 / Murtagh & Vadhan 2016,
  Lemma 3.2). Flip these coins explicitly; the bad event B has
  P(B) ≤ E[Σδ_i] ≤ E[D/2 + [R_T = 0]·D/2], since on every path where a zCDP
  cost was accepted the rule kept Δ ≤ D/2. (ii) Off B, pure and (ε, δ) steps
  add at most ε_p to L, and the final state passed the check, so
  E − L ≥ g(R_T) − L_z (L_z the zCDP steps' loss). On {R_T = 0} L_z = 0 and the
  integrand vanishes. (iii) For one order a, (1 − e^(f−x))+ ≤ c_a·e^((a−1)(x−f))
  for all x (maximise (1 − z)z^(a−1) at z = 1 − 1/a: the CKS20 step, Canonne,
  Kamath & Steinke 2020, Prop. 12), so with a* the minimising order on the path,
  (1 − e^(g(R_T)−L_z))+ ≤ Σ_{a∈A} c_a e^((a−1)(L_z − f_a(R_T))) = δ'·Σ_{a∈A} W_a(T),
  W_a = exp((a−1)(L_z − a·R)). (iv) At a *fixed* a, W_a is a nonnegative
  supermartingale under P with W_a(0) = 1, because a ρ_i-zCDP step chosen from
  the past has E[exp((a−1)L_i) | past] ≤ exp((a−1)a·ρ_i) (Feldman & Zrnic
  2021; Whitehouse et al. 2023, §4). By optional stopping (Fatou), E[W_a(T)] ≤ 1;
  as W_a(T) = 1 on {R_T = 0}, E[W_a(T)·[R_T > 0]] ≤ P(R_T > 0). (Ville's
  inequality gives the same bound in tail form, P(sup W_a ≥ 1/δ'') ≤ δ''.) The
  union over the *finite, pre-fixed* grid is what makes the min over orders
  legal at a random time: a min over a continuum chosen after the fact is not.
  Summing: δ(E) ≤ D/2 + D/2·P(R_T = 0) + |A|·δ'·P(R_T > 0) = D. ∎
  Concurrent composition of interactive mechanisms (Vadhan & Wang 2021; Lyu
  2022) is not needed: the requests here are sequential. A split of the cap
  fixed at creation is the |A| = 1 case. Reserving D/2 only once a zCDP cost is
  accepted (rather than from creation) is covered by (i)–(iv): it lets an
  (ε, δ) charge with δ up to D (e.g. a shuffled release) land on a dataset
  that has no zCDP group.

  *What the grid costs.* With the default 13 orders, the largest Σρ a fresh
  cap accepts, as a fraction of what the old (invalid) rule accepted: 0.83 at
  (0.1, 1e−10), 0.77 at (0.1, 1e−6), 0.85 at (0.5, 1e−8), 0.80 at (1, 1e−6),
  0.72 at (1, 1e−5), 0.82 at (3, 1e−5), 0.75 at (8, 1e−3), 0.86 at (10, 1e−6),
  0.85 at (20, 1e−9), 0.92 at (50, 1e−6) (measured by bisection, see
  ``tests/test_adaptive_filter.py::test_default_grid_keeps_most_of_the_old_rho``).
  The new term is never below the old one (δ' ≤ D/2 and a min over A ⊂ (1, ∞)),
  so a dataset migrated from the old rule never accepts what the old rule refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation, localcontext
from typing import Literal

from privcal.accountant.privacy.conversions import check_delta, cks20_objective, dstr, round_up
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP, fixed_context
from privcal.errors import BudgetRefused, InvalidInput, LedgerError, plain_number_text

__all__ = [
    "DEFAULT_RENYI_ORDERS",
    "DELTA_SPLIT",
    "MAX_RENYI_ORDERS",
    "MIGRATED_RENYI_ORDERS",
    "Notion",
    "Policy",
    "Spent",
    "approx_usage",
    "check_charge",
    "remaining",
    "renyi_filter_epsilon",
    "renyi_filter_term",
    "renyi_orders",
    "used",
]

Notion = Literal["pure", "zcdp", "approx"]

#: the share of an (ε, δ) cap's δ given to the group of zCDP charges (see the module docstring)
DELTA_SPLIT = Decimal("0.5")
#: default Rényi orders of an (ε, δ) cap: a − 1 = 2^k for k = −2 … 10, i.e. 1.25, 1.5, 2, 3, 5,
#: 9, …, 1025 (13 orders; what they keep of the old maximum ρ is in the module docstring)
DEFAULT_RENYI_ORDERS: tuple[Decimal, ...] = tuple(
    Decimal(1) + Decimal(2) ** k for k in range(-2, 11)
)
#: the grid of an (ε, δ) dataset created before the grid existed (its row stores NULL; migration
#: 0004). Frozen: it must never change, even if the default does, because `audit verify` and
#: every later charge re-derive the rule from it.
MIGRATED_RENYI_ORDERS: tuple[Decimal, ...] = tuple(
    Decimal(s) for s in ("1.25", "1.5", "2", "3", "5", "9", "17", "33", "65", "129", "257",
                         "513", "1025")
)
#: at most this many orders in a grid (each costs ln|A| in the conversion)
MAX_RENYI_ORDERS = 64
#: the largest order accepted in a grid
_MAX_ORDER = Decimal(10) ** 6

#: enough digits that sums of stored amounts (≤ 30 decimals each) stay exact
_EXACT = fixed_context(80)  # every field given: nothing from decimal.DefaultContext


def renyi_orders(values: object) -> tuple[Decimal, ...]:
    """A grid of Rényi orders, validated and normalised (sorted, exact decimals), or InvalidInput.

    Accepts a sequence of numbers or decimal strings, or one comma-separated string
    ("1.5,2,4,8"). Each order must be a finite number with 1 < a ≤ 10⁶; at most
    :data:`MAX_RENYI_ORDERS` distinct orders.
    """
    if isinstance(values, str):
        items: list[object] = [v for v in values.split(",") if v.strip()]
    elif isinstance(values, list | tuple):
        items = list(values)
    else:
        raise InvalidInput("Rényi orders must be a list of numbers, e.g. 1.5,2,4,8")
    out: set[Decimal] = set()
    for v in items:
        if isinstance(v, bool) or (isinstance(v, str) and not plain_number_text(v)):
            # Decimal("2_0") is 20, "１.5" 1.5: a grid fixed for good is the one typed (red team 23)
            raise InvalidInput(f"a Rényi order must be a number (plain, no '_'), got {v!r}")
        try:
            a = Decimal(repr(v)) if isinstance(v, float) else Decimal(str(v).strip())
        except ArithmeticError as exc:
            raise InvalidInput(f"a Rényi order must be a number, got {v!r}") from exc
        if not a.is_finite() or not (1 < a <= _MAX_ORDER):
            raise InvalidInput(f"a Rényi order must be in (1, 1e6], got {v}")
        if a != round(a, 12):
            raise InvalidInput(f"a Rényi order has more than 12 decimal places ({v})")
        out.add(a.normalize() if a != a.to_integral_value() else a.quantize(Decimal(1)))
    if not out:
        raise InvalidInput("give at least one Rényi order")
    if len(out) > MAX_RENYI_ORDERS:
        raise InvalidInput(f"at most {MAX_RENYI_ORDERS} Rényi orders, got {len(out)}")
    return tuple(sorted(out))


def renyi_filter_term(rho: float, delta_each: float, orders: tuple[Decimal, ...]) -> float:
    """min_{a∈A} f_a(ρ, δ') in floating point (closed form, no optimiser): see the module docstring.

    ``delta_each`` is δ' = D/(2|A|). The caller rounds the result up (:func:`renyi_filter_epsilon`).

    Each order is used at its float value, so the grid the filter runs on is float(A): fixed,
    finite and the same for every charge and for ``audit verify``, which is all the proof
    (module docstring) asks of it. It differs from the recorded decimal grid only below the
    last bit, i.e. by ~1e−16/(a − 1) relative — visible (above the rounding allowance) only
    for an order within ~1e−4 of 1, where f_a exceeds 10⁴ (red team 16, acct I-1).
    """
    if not (rho > 0 and math.isfinite(rho)):
        raise InvalidInput(f"ρ must be a positive finite number, got {rho}")
    check_delta(delta_each)
    lid = math.log(1.0 / delta_each)
    # f_a(R, δ') = aR + (ln(1/δ') + ln c_a)/(a − 1) with ln c_a = −ln a + (a − 1)·ln(1 − 1/a):
    # the CKS20 objective (Prop. 12), here only at the grid's fixed orders
    return min(cks20_objective(float(a), rho, lid) for a in orders)


#: allowance (relative, and absolute in ε) for the float error of :func:`renyi_filter_term`,
#: whose few operations err by a few ulps (~1e−15 relative); generous on purpose
_FLOAT_SLACK = 1e-12
#: refusals of an (ε, 0) cost (pure-ε or ρ-zCDP cap), of others (pure-ε cap): red team 25 F6
_DELTA_0 = "an (ε, δ) cost is charged only to an (ε, δ) budget, even at δ = 0: charge it as pure ε"
_NOT_PURE = "a pure-ε budget accepts only pure ε-DP costs (zCDP and (ε, δ) do not imply pure ε-DP)"


def renyi_filter_epsilon(rho: Decimal, cap_delta: Decimal, orders: tuple[Decimal, ...]) -> Decimal:
    """g(R): the ε an (ε, δ) cap charges for a zCDP group of total ρ = R (0 when R = 0).

    g(R) = min_{a∈A} f_a(R, D/(2|A|)) (module docstring, with the proof). Evaluated in
    floating point and rounded *up* with a relative allowance for float error, so the
    Decimal returned is ≥ the exact value. Never negative: a negative g would only
    loosen the check, and (ε < 0, δ)-DP means nothing more than (0, δ)-DP.
    """
    if rho <= 0:
        return Decimal(0)
    with localcontext(_EXACT):
        delta_each = cap_delta * DELTA_SPLIT / len(orders)
    t = renyi_filter_term(float(rho), float(delta_each), orders)
    t_up = t + abs(t) * _FLOAT_SLACK + _FLOAT_SLACK  # ≥ the exact value (a few ulps of error)
    return round_up(t_up) if t_up > 0 else Decimal(0)


@dataclass(frozen=True)
class Policy:
    """A dataset's budget: a cap in one notion (ε for pure, ρ for zCDP, (ε, δ) for approx)."""

    notion: Notion
    epsilon: Decimal | None = None
    rho: Decimal | None = None
    delta: Decimal | None = None  # the (ε, δ) cap's δ; None for pure and zCDP caps
    #: the (ε, δ) cap's Rényi grid A, fixed at creation; None means :data:`DEFAULT_RENYI_ORDERS`
    #: (the accountant passes :data:`MIGRATED_RENYI_ORDERS` for a dataset whose row has none)
    orders: tuple[Decimal, ...] | None = None

    @property
    def renyi_orders(self) -> tuple[Decimal, ...]:
        """The grid A of an (ε, δ) cap."""
        return self.orders if self.orders is not None else DEFAULT_RENYI_ORDERS

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


def approx_usage(policy: Policy, spent: Spent) -> tuple[Decimal, Decimal]:
    """(ε, δ) used under an (ε, δ) cap (E, D): (ε_p + g(R), Δ + [R > 0]·D/2).

    ε_p and Δ are exact sums; g(R) (:func:`renyi_filter_epsilon`) is rounded up, and the
    sum stays an exact Decimal, so the comparison with the cap is conservative. This is
    the filter proven in the module docstring; it is *not* a guarantee at the realized
    values (see :func:`~privcal.accountant.privacy.guarantees.filter_guarantee`).
    """
    assert policy.delta is not None
    with localcontext(_EXACT):
        eps = spent.pure_eps + spent.approx_eps
        delta = spent.approx_delta
        if spent.zcdp_rho > 0:
            eps += renyi_filter_epsilon(spent.zcdp_rho, policy.delta, policy.renyi_orders)
            delta += policy.delta * DELTA_SPLIT
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
        eps, delta = approx_usage(policy, spent)
        return {"epsilon": max(zero, policy.epsilon - eps),
                "delta": max(zero, policy.delta - delta)}


def used(policy: Policy, spent: Spent) -> dict[str, Decimal]:
    """What has been used of the cap, in the cap's notion."""
    with localcontext(_EXACT):
        if policy.notion == "pure":
            return {"epsilon": spent.pure_eps}
        if policy.notion == "zcdp":
            return {"rho": spent.pure_rho + spent.zcdp_rho}
        eps, delta = approx_usage(policy, spent)
        return {"epsilon": eps, "delta": delta}


def within_cap(policy: Policy, spent: Spent) -> bool:
    """Whether the totals ``spent`` pass the filter's check of ``policy`` — the condition its
    guarantee rests on (step (ii) of the module docstring's proof: the *final* totals passed
    the check; totals only grow, so every earlier state passed it too). Every charge
    :func:`check_charge` accepts keeps it true; charges accepted before migration 0004 under
    the old (ε, δ) rule (red team 6) or kinds a cap refuses may not."""
    with localcontext(_EXACT):
        if policy.notion == "pure":
            assert policy.epsilon is not None
            return (spent.pure_eps <= policy.epsilon
                    and (spent.zcdp_rho, spent.approx_eps, spent.approx_delta) == (0, 0, 0))
        if policy.notion == "zcdp":
            assert policy.rho is not None
            return (spent.pure_rho + spent.zcdp_rho <= policy.rho
                    and (spent.approx_eps, spent.approx_delta) == (0, 0))
        assert policy.epsilon is not None and policy.delta is not None
        eps, delta = approx_usage(policy, spent)
        return eps <= policy.epsilon and delta <= policy.delta


def check_charge(
    policy: Policy, spent: Spent, cost: PureDP | ZCDP | ApproxDP, *, scope: str
) -> Spent:
    """Apply the filter of ``policy`` to one more ``cost``: the new totals, or BudgetRefused.

    The refusal names the scope, what was asked and what is left. Totals that are not
    numbers (a row set to NaN outside privcal) are a one-line LedgerError, not decimal's
    InvalidOperation as a traceback (red team 22, ledger F5).
    """
    try:
        return _check_charge(policy, spent, cost, scope=scope)
    except InvalidOperation:
        raise LedgerError(f"{scope}: its running totals are not numbers (a row edited outside "
                          "privcal?): nothing was charged; run `privcal audit verify`"
                          ) from None


def _check_charge(
    policy: Policy, spent: Spent, cost: PureDP | ZCDP | ApproxDP, *, scope: str
) -> Spent:
    if isinstance(cost, LocalDP):
        raise InvalidInput("a local-DP cost is charged per subject (charge_subjects), not here")

    def refuse(why: str) -> BudgetRefused:
        # what is left before this cost, computed only for the refusal (the hot path of an
        # accepted charge does not need it: issue 11)
        left = remaining(policy, spent)
        left_s = ", ".join(f"{k}={dstr(v)}" for k, v in left.items())
        err = BudgetRefused(
            f"budget refused on {scope}: asked {cost.describe()}, {why}; remaining {left_s}",
            scope=scope, asked=cost.describe(), remaining=left_s,
        )
        # the amounts as a dry run's document gives them, beside the display strings (red
        # team 22, newcomer F4: a script had to parse "rho=0.63…" out of the refusal)
        err.details = {  # type: ignore[attr-defined]
            "cost": {k: dstr(v) if isinstance(v, Decimal) else v for k, v in vars(cost).items()},
            "remaining_before": {k: dstr(v) for k, v in left.items()}}
        return err

    after = spent.add(cost)
    if policy.notion == "pure":
        if not isinstance(cost, PureDP):
            raise refuse(_DELTA_0 if isinstance(cost, ApproxDP) and not cost.delta else _NOT_PURE)
        assert policy.epsilon is not None
        if after.pure_eps > policy.epsilon:
            raise refuse("it would exceed the cap")
        return after
    if policy.notion == "zcdp":
        if isinstance(cost, ApproxDP):
            raise refuse(_DELTA_0 if not cost.delta else "an (ε, δ) cost has no zCDP "
                         "equivalent and cannot be charged to a ρ-zCDP budget")
        assert policy.rho is not None
        with localcontext(_EXACT):
            if after.pure_rho + after.zcdp_rho > policy.rho:
                raise refuse("it would exceed the cap")
        return after
    assert policy.epsilon is not None and policy.delta is not None
    eps, delta = approx_usage(policy, after)
    if delta > policy.delta or eps > policy.epsilon:
        raise refuse("it would exceed the cap")
    return after
