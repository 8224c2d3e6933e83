"""Issue 15: cost values as the README writes them — positional amounts, ``epsilon=``,
addition of costs of one kind, conversion — with the stored JSON form unchanged."""

from __future__ import annotations

from decimal import Decimal

import pytest

from privcal.accountant.privacy.conversions import cks20_epsilon, round_up
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP, parse_cost
from privcal.errors import InvalidInput


def test_positional_and_epsilon_keyword() -> None:
    assert PureDP(1.0) == PureDP(eps=1.0) == PureDP(epsilon=1.0)
    assert ZCDP(0.1) == ZCDP(rho=0.1)
    assert ApproxDP(1, 1e-6) == ApproxDP(epsilon=1, delta=1e-6) == ApproxDP(eps=1, delta=1e-6)
    assert LocalDP(2) == LocalDP(eps0=2) == LocalDP(epsilon=2)
    with pytest.raises(TypeError, match="given twice"):
        PureDP(1, eps=2)
    with pytest.raises(TypeError, match="at most 1 positional"):
        ZCDP(0.1, 0.2)
    with pytest.raises(ValueError, match="ε must be > 0"):
        PureDP(0)


def test_stored_form_is_unchanged() -> None:
    assert PureDP(epsilon=0.5).model_dump(mode="json") == {"kind": "pure", "eps": "0.5"}
    assert ApproxDP(1, 1e-6).model_dump(mode="json") == {
        "kind": "approx", "eps": "1", "delta": "0.000001"}
    assert LocalDP(epsilon=2).model_dump(mode="json") == {"kind": "local", "eps0": "2"}
    for c in (PureDP(1), ZCDP(0.25), ApproxDP(1, 1e-6), LocalDP(3)):
        assert parse_cost(c.model_dump(mode="json")) == c


def test_costs_of_one_kind_add_exactly() -> None:
    assert ZCDP(0.1) + ZCDP(0.2) == ZCDP(rho=Decimal("0.3"))  # not 0.30000000000000004
    assert PureDP(0.1) + PureDP(0.2) == PureDP(Decimal("0.3"))
    assert ApproxDP(1, 1e-6) + ApproxDP(0.5, 0) == ApproxDP(1.5, 1e-6)
    assert LocalDP(1) + LocalDP(2) == LocalDP(3)
    assert sum([ZCDP(0.1), ZCDP(0.1), ZCDP(0.1)]) == ZCDP(Decimal("0.3"))
    with pytest.raises(InvalidInput, match="different notions"):
        ZCDP(0.1) + PureDP(1)
    with pytest.raises(TypeError):
        ZCDP(0.1) + 0.2  # type: ignore[operator]


def test_conversions() -> None:
    # zCDP → (ε, δ) by CKS20, rounded up as the accountant reports it (SPEC: ρ=0.1, δ=1e-5)
    a = ZCDP(0.1).to_approx(1e-5)
    assert a.delta == Decimal("0.00001")
    assert a.eps == round_up(cks20_epsilon(0.1, 1e-5)) and float(a.eps) == pytest.approx(
        1.9142, abs=1e-4)
    assert PureDP(1).to_zcdp() == ZCDP(0.5)
    assert PureDP(1).to_approx() == ApproxDP(1, 0) == PureDP(1).to_approx(1e-6)
    assert float(PureDP(2).to_zcdp().to_approx(0.3).eps) > 2  # why pure stays (ε, 0)
    assert ApproxDP(1, 1e-6).to_approx(1e-5) == ApproxDP(1, 1e-6)
    with pytest.raises(InvalidInput, match="smaller δ"):
        ApproxDP(1, 1e-6).to_approx(1e-7)
    for bad in (0, 1, -1, "x"):
        with pytest.raises(InvalidInput, match="δ"):
            ZCDP(0.1).to_approx(bad)


@pytest.mark.parametrize(("make", "want"), [
    (lambda: PureDP(eps=None), "PureDP eps: not a number: None"),
    (lambda: ZCDP(rho=-1), "ZCDP rho: ρ must be > 0, got -1"),
    (lambda: ApproxDP(1, 2), "ApproxDP delta: δ must be in [0, 1), got 2"),
    (lambda: ZCDP("abc"), "ZCDP rho: not a number: 'abc'"),
    (lambda: PureDP(), "PureDP eps: Field required"),
    (lambda: ZCDP(rho=1, foo=2), "ZCDP foo: Extra inputs are not permitted"),
    (lambda: LocalDP(float("nan")), "LocalDP eps0: must be finite, got 'nan'"),
    (lambda: ZCDP(rho=__import__("numpy").array([[1, 2], [3, 4]])),  # a repr over two lines
     "ZCDP rho: not a number: array([[1, 2], [3, 4]])"),
])
def test_a_bad_amount_is_one_line_naming_the_cost_and_field(make: object, want: str) -> None:
    """A cost built with a bad amount raises InvalidInput (a ValueError, as pydantic's
    ValidationError is) with one line naming the cost and the field — not pydantic's
    four-line text with its URL (the quality bar: one clear line on the API too)."""
    with pytest.raises(InvalidInput) as err:
        make()  # type: ignore[operator]
    assert str(err.value) == want
    assert isinstance(err.value, ValueError)


def test_an_amount_given_under_both_its_names_is_refused_by_name() -> None:
    """``PureDP(eps=1, epsilon=2)`` said "epsilon: Extra inputs are not permitted" (helper
    126): both names are the cost's, and which one wins must not be guessed."""
    for make, want in ((lambda: PureDP(eps=1, epsilon=2), "PureDP: eps and epsilon"),
                       (lambda: LocalDP(eps0=1, epsilon=2), "LocalDP: eps0 and epsilon"),
                       (lambda: ApproxDP(eps=1, epsilon=1, delta="1e-6"),
                        "ApproxDP: eps and epsilon")):
        with pytest.raises(InvalidInput, match=f"^{want} name the same amount; give one$"):
            make()
    with pytest.raises(ValueError, match="eps and epsilon name the same amount"):
        parse_cost({"kind": "pure", "eps": "1", "epsilon": "1"})
    assert PureDP(epsilon=2) == PureDP(eps=2) == PureDP(2)
