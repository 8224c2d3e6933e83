"""Red team 8 (mutation audit m1): guarantee code that no test pinned down.

Each test kills a mutant of the guarantee code that the suite let through, most of them
recording a false guarantee (a coverage bound above its proof, or a failure probability or a
privacy cost below it). The reference numbers are derived here exactly, with
:class:`fractions.Fraction` from the decimal a reader of the JSON gets (``repr``), never copied
from the code under test:

- S4 / P8: split and P-COQS at target rank r = n release the n-th smallest score (finite),
  so the recorded coverage is r/(n+1) < 1, never the "+inf, coverage 1" of r > n;
- S11: split's recorded upper bound is never below r/(n+1) (``float_at_least``);
- B3 / B4: ``float_at_most`` / ``float_at_least`` step off a correctly rounded float that lies
  on the wrong side of the bound;
- F13: a pinned or replanned FedCP²-QQ plan keeps ℓ_γ + ℓ_cor ≤ ⌊n·q⌋ (Lemma C.4);
- W1 / W2: Mondrian's headline is the smallest group bound, with failure probability Σ δ_g;
- W3 / W4: Mondrian charges the largest group's cost (parallel composition);
- R1 / D6: an LDP-CP-S round passes only where its exact binomial tail at the recorded level
  is ≤ δ/T (also for a round of more than n' reports);
- V1: ``levels:`` releases the running maximum of the raw thresholds (nested sets).
"""

from __future__ import annotations

import math
import random
from decimal import Context, Decimal, localcontext
from fractions import Fraction
from typing import ClassVar

import pytest

from privcal.calibrators import registry
from privcal.calibrators.base import (
    CalibrationInput,
    CalibrationResult,
    DataShape,
    PrivacyModel,
)
from privcal.calibrators.bound_floats import float_at_least, float_at_most
from privcal.calibrators.fedplan.plan_qq2 import (
    answer_budget,
    plan_fedcp2_qq,
    plan_fedcp2_qq_pinned,
    replan_fedcp2_qq_subset,
)
from privcal.calibrators.ldp_score_protocol import LdpScoreProtocol
from privcal.calibrators.levels import Levels
from privcal.calibrators.mondrian import Mondrian
from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
from privcal.calibrators.split import SplitConformal, SplitParams
from privcal.costs import ZCDP, PureDP
from privcal.errors import InfeasiblePlan


def _recorded(x: float) -> Fraction:
    """What a recorded float means to a reader of the JSON: its repr as a decimal."""
    return Fraction(repr(x))


def _rank(n: int, alpha: float) -> int:
    """⌈(n+1)(1−α)⌉ in exact arithmetic, α read as the decimal it is recorded as."""
    return math.ceil((n + 1) * (1 - _recorded(alpha)))


# ----------------------------------------------------------------- S4, P8: rank r = n


@pytest.mark.parametrize(("n", "alpha"), [(9, 0.1), (19, 0.05)])
def test_split_at_rank_n_records_the_n_th_score_s_coverage_not_one(n: int, alpha: float) -> None:
    """At r = n the threshold is the n-th smallest score, coverage exactly n/(n+1) without
    ties: lower = 1−α = n/(n+1), upper = min(1, 1−α+1/(n+1)) (here exactly 1), no "+inf"."""
    r = _rank(n, alpha)
    assert r == n  # the boundary itself
    g = SplitConformal().guarantee(SplitParams(alpha=alpha), DataShape(n=n))
    exact = Fraction(r, n + 1)
    assert g.rank == r
    assert g.lower == float(exact)  # 0.9, 0.95: the nearest float, and its repr is exact
    assert _recorded(g.lower) <= exact
    exact_upper = min(Fraction(1), 1 - _recorded(alpha) + Fraction(1, n + 1))
    assert g.upper == float(exact_upper)
    assert _recorded(g.upper) >= exact
    assert "+inf" not in g.statement
    # the release at r = n is finite: the n-th smallest score
    scores = [(i * 7919 % 101) / 101 for i in range(n)]
    t = SplitConformal().calibrate(CalibrationInput(scores=scores), SplitParams(alpha=alpha),
                                   random.Random(0)).threshold
    assert t == max(scores)


@pytest.mark.parametrize(("n", "alpha", "nominal"),
                         [(9, 0.1, True), (19, 0.05, True), (129, 0.1, False)])
def test_pcoqs_at_rank_n_records_a_finite_threshold_s_bound(
        n: int, alpha: float, nominal: bool) -> None:
    """P-COQS at target rank r = n releases a finite score (the search is run), so on E its
    coverage is ≥ ⌈r − τ⌉/(n+1) and, without ties, at most n/(n+1) < 1: the recorded lower
    bound is never 1 and the failure probability is β (the mutant recorded the trivial
    release: lower = upper = 1, β = 0)."""
    params = PCOQSParams(alpha=alpha, rho=1.0, nominal=nominal)
    g = PCOQS().guarantee(params, DataShape(n=n))
    tau = Fraction(g.details["tau"])  # τ is the plan's; the bound below is derived here
    r = _rank(n, alpha) if nominal else math.ceil((n + 1) * (1 - _recorded(alpha)) + tau)
    assert r == n == g.rank
    bound = Fraction(max(0, math.ceil(r - tau)), n + 1)
    assert _recorded(g.lower) <= bound < 1
    assert _recorded(g.lower) <= Fraction(n, n + 1)
    if nominal:  # 1 − α − τ/(n+1), at least 0
        assert _recorded(g.lower) <= max(Fraction(0), 1 - _recorded(alpha) - tau / (n + 1))
    else:  # 1 − α, here exactly ⌈r − τ⌉/(n+1)
        assert g.lower == float(1 - _recorded(alpha)) == float(bound)
    assert g.failure_probability == params.failure_probability
    assert "+inf" not in g.statement


# ----------------------------------------------------------------- S11: split upper bound


@pytest.mark.parametrize(("n", "alpha"), [(28, 0.2068965517241379),
                                          (1115, 0.8136200716845878)])
def test_split_upper_is_never_below_r_over_n_plus_1(n: int, alpha: float) -> None:
    """The float 1−α+1/(n+1) lands an ulp below r/(n+1) here (α typed so that (n+1)(1−α)
    sits just above r−1): the recorded upper bound is raised to the nearest float above."""
    r = _rank(n, alpha)
    g = SplitConformal().guarantee(SplitParams(alpha=alpha), DataShape(n=n))
    assert g.rank == r
    exact = Fraction(r, n + 1)
    assert _recorded(g.upper) >= exact
    assert _recorded(math.nextafter(g.upper, -math.inf)) < exact  # the nearest such float
    assert _recorded(g.lower) <= exact


# ----------------------------------------------------------------- B3, B4: bound floats


def test_float_at_most_steps_below_a_correctly_rounded_float_above_its_bound() -> None:
    """float(7/12) = 0.5833333333333334 is above 7/12: the largest float at most 7/12 is
    0.5833333333333333."""
    bound = Fraction(7, 12)
    assert _recorded(float(bound)) > bound  # the case the nextafter loop exists for
    y = float_at_most(0.6, bound)
    assert _recorded(y) <= bound < _recorded(math.nextafter(y, math.inf))
    assert y == 0.5833333333333333


def test_float_at_least_steps_above_a_correctly_rounded_float_below_its_bound() -> None:
    """float(1/3) = 0.3333333333333333 is below 1/3: the smallest float at least 1/3 is
    0.33333333333333337; a float already at least the bound is kept."""
    bound = Fraction(1, 3)
    assert float_at_least(0.5, bound) == 0.5
    assert _recorded(float(bound)) < bound
    y = float_at_least(0.1, bound)
    assert _recorded(math.nextafter(y, -math.inf)) < bound <= _recorded(y)
    assert y == 0.33333333333333337


def test_pcoqs_nominal_lower_is_never_above_its_rank_bound() -> None:
    """P-COQS nominal at n = 71, α = 0.25, ρ = 1: r = ⌈72·0.75⌉ = 54 and the proof gives
    ⌈r − τ⌉/72 on E; the float 1−α−τ/72 and float(bound) are both an ulp above it."""
    n, alpha = 71, 0.25
    g = PCOQS().guarantee(PCOQSParams(alpha=alpha, rho=1.0, nominal=True), DataShape(n=n))
    tau = Fraction(g.details["tau"])
    r = _rank(n, alpha)
    assert g.rank == r == 54
    bound = min(Fraction(max(0, math.ceil(r - tau)), n + 1), 1 - Fraction(1, 4) - tau / (n + 1))
    assert _recorded(float(bound)) > bound  # the nearest float is above: float_at_most steps
    assert _recorded(g.lower) <= bound < _recorded(math.nextafter(g.lower, math.inf))


# ----------------------------------------------------------------- F13: FedCP²-QQ budget


def test_answer_budget_is_floor_n_q() -> None:
    """⌊n·q⌋ exactly (n·q an integer or n/2 for the levels the planner picks)."""
    for n, q in [(200, 0.945), (200, 0.5), (10, 0.7), (1000, 0.901), (7, 0.5)]:
        assert answer_budget(n, q) == min(math.floor(n * _recorded(q)), n - 1)
    assert answer_budget(200, 0.945) == 189


def test_fedcp2_plans_keep_l_gamma_plus_l_cor_within_n_q() -> None:
    """Lemma C.4 needs n·q ≥ ℓ_γ + ℓ_cor for answers at level q: every replanned subset
    (m = 5, n = 200, ε = 2, α = 0.1; 5 … 1 agents answering) and every pinned plan keeps
    it, or refuses (InfeasiblePlan). With ⌊n·q⌋+1 as the budget, 3 of 5 agents got a plan
    with ℓ_γ + ℓ_cor = 190 > 189 = ⌊200·0.945⌋."""
    n = 200
    plan = plan_fedcp2_qq(5, n, 0.1, 2.0)
    budget = math.floor(n * _recorded(plan.q))
    assert plan.l_gamma + plan.l_cor <= n * _recorded(plan.q)
    results = []
    for m2 in range(5, 0, -1):
        try:
            results.append(replan_fedcp2_qq_subset(plan, m2))
        except InfeasiblePlan:
            continue
    for m2 in (3, 4, 5):
        for q in (plan.q, 0.95):
            try:
                results.append(plan_fedcp2_qq_pinned(m2, n, 0.1, 2.0, q))
            except InfeasiblePlan:
                continue
    assert results
    for p in results:
        assert p.l_gamma + p.l_cor <= math.floor(n * _recorded(p.q)), p
    assert budget == 189


# ----------------------------------------------------------------- W1, W2: Mondrian headline


def _mondrian(name: str, values: dict[str, object]) -> tuple[Mondrian, object]:
    cal = registry.get(name).calibrator
    assert isinstance(cal, Mondrian)
    return cal, cal.Params.model_validate({"group_by": "column", "public_groups": True, **values})


def test_mondrian_headline_lower_is_the_smallest_group_s() -> None:
    """Split per group, α = 0.2, groups of 1 and 99 rows: the 1-row group is trivial
    (coverage 1), the 99-row group's bound is ⌈100·0.8⌉/100 = 4/5; the marginal coverage, a
    mixture of the two, is only guaranteed ≥ 4/5 (the mutant's max claimed 1)."""
    cal, params = _mondrian("mondrian:split", {"alpha": 0.2, "groups": ["a", "b"]})
    g = cal.guarantee(params, DataShape(n=100, group_sizes=(1, 99)))
    exact = Fraction(_rank(99, 0.2), 100)
    assert exact == Fraction(4, 5)
    assert g.lower == float(exact) == 0.8
    assert _recorded(g.lower) <= exact


def test_mondrian_failure_probability_is_the_sum_over_groups() -> None:
    """P-COQS in 3 groups of 1 000, β = 0.05 each: all three bounds hold at once with
    probability ≥ 1 − Σ δ_g (union bound), so the recorded failure probability is at least
    3/20 — as a float the nearest one at least 3/20 (the mutant's max recorded 0.05)."""
    cal, params = _mondrian("mondrian:pcoqs", {"alpha": 0.1, "rho": 0.5, "beta": 0.05,
                                               "groups": ["a", "b", "c"]})
    g = cal.guarantee(params, DataShape(n=3000, group_sizes=(1000, 1000, 1000)))
    exact = 3 * _recorded(0.05)
    assert _recorded(g.failure_probability) >= exact
    assert abs(Fraction(g.failure_probability) - exact) < Fraction(1, 10**15)


# ----------------------------------------------------------------- W3, W4: Mondrian cost


class _GrowingCost(SplitConformal):
    """A stub central method whose cost grows with n: n/1000 (ρ or ε)."""

    name: ClassVar[str] = "growing"
    privacy_model: ClassVar[PrivacyModel] = "central-zcdp"

    def cost(self, params: SplitParams, shape: DataShape) -> ZCDP | PureDP | None:  # type: ignore[override]
        """n/1000, as the notion of ``privacy_model``."""
        amount = Decimal(shape.n) / 1000
        return ZCDP(amount) if self.privacy_model == "central-zcdp" else PureDP(amount)


class _GrowingPure(_GrowingCost):
    """The same stub under ε-DP."""

    name: ClassVar[str] = "growing-pure"
    privacy_model: ClassVar[PrivacyModel] = "central-pure"


@pytest.mark.parametrize("stub", [_GrowingCost, _GrowingPure])
def test_mondrian_charges_the_largest_group_s_cost(stub: type[_GrowingCost]) -> None:
    """Groups of 10, 300 and 40 rows: parallel composition charges max_g cost(n_g) =
    cost(300) = 0.3 (the mutants' min charged cost(10) = 0.01, under-charging)."""
    mo = Mondrian(stub())
    params = mo.Params.model_validate({"alpha": 0.1, "groups": ["a", "b", "c"],
                                       "group_by": "column", "public_groups": True})
    cost = mo.cost(params, DataShape(n=350, group_sizes=(10, 300, 40)))
    expected = Decimal(300) / 1000
    if stub is _GrowingPure:
        assert isinstance(cost, PureDP) and cost.eps == expected
    else:
        assert isinstance(cost, ZCDP) and cost.rho == expected


# ----------------------------------------------------------------- R1, D6: LDP-CP-S pass rule


def _report_probability(f: Fraction, epsilon: float) -> Fraction:
    """p(F) = F·e^ε/(e^ε+1) + (1−F)/(e^ε+1), e^ε to 60 digits."""
    with localcontext(Context(prec=60)):
        e = Decimal(epsilon).exp()
        keep = Fraction(e / (e + 1))
    return f * keep + (1 - f) * (1 - keep)


def _upper_tail(m: int, p: Fraction, k: int) -> Fraction:
    """P(Bin(m, p) ≥ k), exactly."""
    return sum((math.comb(m, i) * p**i * (1 - p) ** (m - i) for i in range(max(k, 0), m + 1)),
               Fraction(0))


@pytest.mark.parametrize(("nominal", "group_size", "rounds", "alpha", "epsilon", "delta"), [
    (False, 30, 3, 0.2, 1.0, 0.05), (False, 10, 2, 0.1, 2.0, 0.1),
    (True, 10, 2, 0.1, 2.0, 0.1), (True, 30, 3, 0.2, 1.0, 0.05)])
def test_ldp_score_round_passes_only_where_its_exact_tail_is_within_delta_over_t(
        nominal: bool, group_size: int, rounds: int, alpha: float, epsilon: float,
        delta: float) -> None:
    """A round of ``count`` ≥ n' reports at a query whose coverage is below the recorded
    level G (1−α, or the nominal level) passes with probability ≤ δ/T: so every ``ones``
    that passes has P(Bin(count, p(G)) ≥ ones) ≤ δ/T, in exact arithmetic. R1 (``ones ≥
    k−1``) passed one report early; D6 (the nominal rule without its guard) passed a round
    of 11 reports at n' = 10 with 9 ones, a tail of 0.127 against δ/T = 0.05."""
    proto = LdpScoreProtocol.open(alpha=alpha, epsilon=epsilon, rounds=rounds,
                                  group_size=group_size, delta=delta, nominal=nominal)
    level = _recorded(proto.guarantee_lower())
    if not nominal:
        assert level == 1 - _recorded(alpha)
    allowed = _recorded(delta) / rounds
    checked = 0
    for count in range(group_size, group_size + 7):
        p = _report_probability(level, epsilon)
        passing = [ones for ones in range(count + 1) if proto.passes(ones, count)]
        least = passing[0] if passing else count + 1  # count + 1: the round never passes
        assert passing == list(range(least, count + 1))
        checked += bool(passing)
        assert _upper_tail(count, p, least) <= allowed, (count, least)
        if not nominal:  # the exact rule is the smallest valid cut-off
            assert _upper_tail(count, p, least - 1) > allowed, (count, least)
    assert checked or not nominal  # the nominal rule passes at these counts


# ----------------------------------------------------------------- V1: nested levels


class _Reversed(SplitConformal):
    """A stub whose threshold grows with α (as noise can order two levels' thresholds)."""

    name: ClassVar[str] = "reversed"

    def calibrate(self, data: CalibrationInput, params: SplitParams,
                  rng: random.Random) -> CalibrationResult:
        """Threshold α (the wrong order: a larger α gets a larger threshold)."""
        return CalibrationResult(threshold=params.alpha, diagnostics={})


def test_levels_release_nested_thresholds_the_running_maximum() -> None:
    """t'ᵢ = max_{αⱼ ≥ αᵢ} tⱼ: raw thresholds 0.1, 0.2, 0.3 at α = 0.1, 0.2, 0.3 are released
    as 0.3, 0.3, 0.3 (sets nested, each level's coverage at least its raw threshold's), and
    ``audit verify``'s check accepts the record."""
    lv = Levels(_Reversed())
    params = lv.Params.model_validate({"alpha": [0.3, 0.1, 0.2]})
    res = lv.calibrate(CalibrationInput(scores=[0.5, 0.6, 0.7]), params, random.Random(0))
    levels = res.diagnostics["levels"]
    assert [x["threshold_raw"] for x in levels] == [0.1, 0.2, 0.3]
    assert [x["threshold"] for x in levels] == [0.3, 0.3, 0.3]
    assert res.threshold == 0.3
    assert lv.check_record(params, DataShape(n=3), res.threshold, res.diagnostics) == []
