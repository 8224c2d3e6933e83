"""Red team 6 (numerics): a recorded bound is never on the wrong side of its proof by an ulp.

- a coverage lower bound computed as the float 1 − α could exceed the exact r/(n+1) the proof
  gives (α = 0.7, n = 9 recorded 0.30000000000000004 against 3/10): split, P-COQS;
- the float CKS20 objective could be ~1e−16 below its exact value, and rounding it up to
  6 digits then reported ε = 2 against an exact 2.000000000000000115; near the zero crossing
  a value computed ≤ 0 was reported 0 for a true ε > 0;
- a subnormal δ gave ε = 0 (ln(1/δ) = ln(inf)), a huge ρ crashed (log1p(−1)).

Exact references use fractions and decimal.Decimal at 60 digits (no mpmath).
"""

from __future__ import annotations

import math
from decimal import Context, Decimal, localcontext
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from privcal.accountant import Accountant
from privcal.accountant.privacy.conversions import cks20_epsilon, cks20_order, round_up
from privcal.accountant.privacy.filters import Policy
from privcal.accountant.privacy.guarantees import filter_guarantee
from privcal.calibrators.base import DataShape
from privcal.calibrators.bound_floats import float_at_most, text_at_most
from privcal.calibrators.exponq import ExponQ, ExponQParams
from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
from privcal.calibrators.split import SplitConformal, SplitParams
from privcal.costs import ZCDP
from privcal.errors import InvalidInput


def _recorded(x: float) -> Fraction:
    """What a recorded float means to a reader of the JSON: its repr as a decimal."""
    return Fraction(repr(x))


def _rank_bound(n: int, alpha: float) -> Fraction:
    return Fraction(math.ceil((n + 1) * (1 - Fraction(str(alpha)))), n + 1)


# ----------------------------------------------------------------- coverage lower bounds


@pytest.mark.parametrize(("alpha", "n"), [(0.7, 9), (0.999, 999), (0.94, 49)])
def test_split_lower_is_never_above_the_exact_coverage(alpha: float, n: int) -> None:
    g = SplitConformal().guarantee(SplitParams(alpha=alpha), DataShape(n=n))
    exact = _rank_bound(n, alpha)  # the coverage itself, for continuous scores
    assert _recorded(g.lower) <= exact
    assert g.upper is not None and _recorded(g.upper) >= exact
    assert f"≥ {g.lower:.6g} " in g.statement
    # where the float was already valid it is unchanged: releases recorded before the check
    # recompute to the same figure (audit verify)
    for a, m in [(0.1, 99), (0.9, 9), (0.05, 1000), (0.3, 9)]:
        assert SplitConformal().guarantee(SplitParams(alpha=a), DataShape(n=m)).lower == 1 - a


def test_split_release_through_the_accountant_records_a_valid_lower(tmp_path: Path) -> None:
    acct = Accountant(f"sqlite:///{tmp_path}/l.sqlite")
    acct.ledger.upgrade()
    acct.create_dataset("d", epsilon=10, allow_nonprivate=True)
    rel = acct.calibrate("split", dataset="d", scores=np.random.default_rng(0).random(9),
                         alpha=0.7)
    assert _recorded(rel.coverage.lower) <= Fraction(3, 10)
    assert type(acct.verify()).__name__ == "AuditReport"  # recomputes to the same record


def test_pcoqs_guaranteed_lower_is_never_above_its_proof() -> None:
    # exact τ is an integer, so on E the count is ≥ r' − τ = ⌈0.3·10000⌉: coverage ≥ 3/10
    n = 9999
    g = PCOQS().guarantee(PCOQSParams(alpha=0.7, rho=1.0), DataShape(n=n))
    assert g.rank is not None and g.rank <= n
    assert _recorded(g.lower) <= Fraction(3, 10)
    assert g.statement.startswith(f"{g.lower:.6g} ≤ ")


def test_pcoqs_nominal_lower_is_never_above_its_proof() -> None:
    n = 9999
    p = PCOQSParams(alpha=0.7, rho=1.0, nominal=True)
    g = PCOQS().guarantee(p, DataShape(n=n))
    tau = Fraction(g.details["tau"])
    proven = Fraction(max(0, math.ceil(g.rank - tau)), n + 1)
    assert _recorded(g.lower) <= proven
    # ExponQ's float 1 − α (0.8200000000000001 at α = 0.18, above the decimal 0.82) stays as
    # recorded: its proof's k = ⌈(n+1)(1−α)/(1−γα)⌉ leaves far more than an ulp
    e = ExponQ().guarantee(ExponQParams(alpha=0.18, epsilon=1.0), DataShape(n=1000))
    assert e.lower == 1 - 0.18


def test_bound_floats_pick_the_nearest_float_on_the_proofs_side() -> None:
    assert float_at_most(1 - 0.7, Fraction(3, 10)) == 0.3
    assert float_at_most(0.9, Fraction(9, 10)) == 0.9  # unchanged: "0.9" is 9/10
    y = float_at_most(0.5, Fraction(1, 3))
    assert _recorded(y) <= Fraction(1, 3) < _recorded(math.nextafter(y, 1.0))
    assert text_at_most(0.8765436, Fraction(8765436, 10**7)) == "0.876543"  # not 0.876544
    assert text_at_most(0.9, Fraction(9, 10)) == "0.9"


# ----------------------------------------------------------------- CKS20 rounding


def _exact_objective(a: float, rho: float, delta: float) -> Decimal:
    """aρ + (ln(1/δ) + (a−1)·ln(1−1/a) − ln a)/(a−1) at the exact binary a, ρ, δ (60 digits)."""
    with localcontext(Context(prec=60)):
        A, R, D = Decimal(a), Decimal(rho), Decimal(delta)
        am1 = A - 1
        return A * R + (-D.ln() + am1 * (1 - 1 / A).ln() - A.ln()) / am1


#: ρ where the float CKS20 ε crosses a round target at δ (found by bisection on the float
#: function by red team 6, cks_boundary.py): rounding the float up gave the target exactly,
#: while the exact value at the same order was above it
BOUNDARY = [
    (1e-6, 0.024355970359538372), (1e-6, 0.08815268837994626), (1e-6, 0.18506984065340146),
    (1e-6, 0.05180459945418933), (1e-6, 0.4630649901386301),
    (1e-5, 0.03055659519763956), (1e-5, 0.008505530591181911), (1e-5, 0.10825636382305727),
    (1e-5, 0.002356361467093112), (1e-5, 0.2242491682463453), (1e-5, 0.5509734749393383),
    (1e-9, 0.014973057673588523), (1e-9, 0.056130501796519815), (1e-9, 0.31169326160725636),
]


@pytest.mark.parametrize(("delta", "rho"), BOUNDARY)
def test_reported_cks20_epsilon_is_never_below_the_exact_value(delta: float, rho: float) -> None:
    a = cks20_order(rho, delta)
    assert Decimal(round_up(cks20_epsilon(rho, delta))) >= _exact_objective(a, rho, delta)


def test_the_reviewers_release_reports_more_than_two(tmp_path: Path) -> None:
    # exact CKS20 infimum at ρ = 0.10825636382305727, δ = 1e−5: 2.000000000000000115
    # (red team 6, mpmath at 60 digits); the release, the conversion and a cap all say > 2
    rho = 0.10825636382305727
    assert ZCDP(rho).to_approx("1e-5").eps > 2
    g = filter_guarantee(Policy("zcdp", rho=Decimal(repr(rho))), Decimal("1e-5"))
    assert g.epsilon > 2
    acct = Accountant(f"sqlite:///{tmp_path}/l.sqlite")
    acct.ledger.upgrade()
    acct.create_dataset("z", rho=1, delta="1e-5")
    rel = acct.calibrate("pcoqs", dataset="z", scores=np.random.default_rng(0).random(200),
                         alpha=0.1, rho=rho)
    assert Decimal(rel.privacy["epsilon"]) > 2
    assert type(acct.verify()).__name__ == "AuditReport"


def test_a_positive_epsilon_near_the_zero_crossing_is_not_reported_zero() -> None:
    # ρ ≈ eδ²/2: the exact value at the code's order is positive (~1.3e−21 for the
    # infimum, red team 6), the float evaluation cancels to ≤ 0
    rho, delta = 1.3591409142910983e-10, 1e-5
    exact = _exact_objective(cks20_order(rho, delta), rho, delta)
    assert exact > 0
    assert Decimal(round_up(cks20_epsilon(rho, delta))) >= exact


# ----------------------------------------------------------------- extreme ρ and δ


@pytest.mark.parametrize("delta", [1e-309, 1e-310, 5e-324])
def test_a_subnormal_delta_gives_a_large_epsilon_not_zero(delta: float) -> None:
    # ε grows as δ shrinks: at δ = 1e−308 (normal) 1-zCDP is ≈ 54.1-DP
    assert cks20_epsilon(1.0, delta) > cks20_epsilon(1.0, 1e-308) > 54
    assert ZCDP(1).to_approx(repr(delta)).eps > 54


def test_a_huge_rho_converts_or_is_refused_in_one_line() -> None:
    eps = ZCDP("1e30").to_approx("1e-6").eps
    assert Decimal("1e30") < eps <= Decimal("1.00001e30")
    with pytest.raises(InvalidInput):
        cks20_epsilon(1.7976931348623157e308, 1e-5)
