"""Privacy costs as immutable values.

A mechanism's cost is a value (as in Google's dp_accounting ``DpEvent``): the
calibrators declare one from their parameters alone, the accountant charges it.
This module is the shared vocabulary of both, so it sits at the top of the
package and imports nothing from it but ``errors``.

Amounts are exact decimals: ``PureDP(eps=0.1)`` holds ``Decimal("0.1")`` (the
float's shortest repr), so that sums in the ledger are exact.

Ergonomics (issue 15): the amount may be given positionally (``PureDP(1.0)``,
``ZCDP(0.1)``, ``ApproxDP(1, 1e-6)``, ``LocalDP(2)``) and ε as ``epsilon=`` too;
costs of the same kind add (``ZCDP(0.1) + ZCDP(0.2) == ZCDP(0.3)``, exactly), and
convert (``.to_zcdp()``, ``.to_approx(delta)``). The stored JSON form is unchanged
(``{"kind": "pure", "eps": "1"}``).
"""

from __future__ import annotations

from decimal import (
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    DivisionByZero,
    InvalidOperation,
    Overflow,
    localcontext,
)
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from privcal.errors import InvalidInput, first_error, plain_number_text

__all__ = ["ZCDP", "ApproxDP", "Cost", "LocalDP", "PureDP", "fixed_context", "parse_cost"]


def _np_float(value: object) -> bool:
    """Whether ``value`` is a numpy floating scalar (without importing numpy here)."""
    return type(value).__module__ == "numpy" and hasattr(value, "is_integer") \
        and not isinstance(value, int) and type(value).__name__.startswith("float")


def _exact(value: object) -> Decimal:
    """A float as the decimal a person typed (its shortest repr), never its binary expansion.
    A numpy float is the float it holds (NumPy 2's repr is ``np.float64(0.1)``, and a
    float32's str, ``0.1``, is less than the 0.10000000149… it holds: red team 7)."""
    if isinstance(value, float) or _np_float(value):
        value = repr(float(value))  # type: ignore[arg-type]
    elif isinstance(value, str | Decimal):  # a subclass's characters or value, never its own
        value = str.__str__(value) if isinstance(value, str) else Decimal(value)  # __str__
    if isinstance(value, bool) or (isinstance(value, str) and not plain_number_text(value)):
        # Decimal("1_0") is 10, Decimal("１") (a fullwidth digit) 1 and True is 1: none is an
        # amount anyone meant (red team 10: errors.check_number_text, one rule)
        raise ValueError(f"not a number: {value!r}")
    try:
        d = Decimal(str(value)) if not isinstance(value, Decimal) else value
    except Exception as exc:  # decimal.InvalidOperation and friends
        raise ValueError(f"not a number: {value!r}") from exc
    if not d.is_finite():
        raise ValueError(f"must be finite, got {value!r}")
    if d != 0 and abs(d.adjusted()) > 1000:  # 1e999999999 would print a billion digits
        raise ValueError(f"is too large or too small (an exponent past ±1000), got {value!r}")
    return d


def _delta(value: object, *, allow_zero: bool) -> Decimal:
    try:
        d = _exact(value)
    except ValueError as exc:
        raise InvalidInput(f"δ: {exc}") from exc
    if not ((0 <= d if allow_zero else 0 < d) and d < 1):
        raise InvalidInput(f"δ must be in {'[0' if allow_zero else '(0'}, 1), got {value}")
    return d


def fixed_context(prec: int, rounding: str = ROUND_HALF_EVEN) -> Context:
    """A decimal context that depends on nothing global: every field is given, since Python
    fills the ones a ``Context(...)`` call omits (exponent range, traps, rounding) from
    ``decimal.DefaultContext``, which any program may change (red team 8: an embedding
    program's ``DefaultContext.Emin = -99`` made the exact sampler's exp(−300) bounds 0)."""
    return Context(prec=prec, rounding=rounding, Emin=-999_999, Emax=999_999, capitals=1,
                   clamp=0, flags=[], traps=[InvalidOperation, DivisionByZero, Overflow])


_EXACT = fixed_context(80)


def plain(d: Decimal) -> str:
    """A decimal as people write it: ``10`` not ``1E+1``, ``0.000001`` not ``1E-6`` (in a
    context of its own: a caller's low precision would round it)."""
    return format(d.normalize(_EXACT), "f")
_EPS = Field(validation_alias=AliasChoices("eps", "epsilon"))


def _one_line(model: str, exc: ValidationError) -> InvalidInput:
    """The first problem of a cost's validation as a one-line InvalidInput (a ValueError, as
    pydantic's ValidationError is): ``ZCDP rho: ρ must be > 0, got -1``."""
    where, msg, _ = first_error(exc)
    return InvalidInput(f"{model} {where}: {msg}" if where else f"{model}: {msg}")


class _Cost(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    #: the fields an amount given positionally fills, in order
    __positional__: tuple[str, ...] = ()

    def __init__(self, /, *args: Any, **data: Any) -> None:
        names = type(self).__positional__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} positional "
                            f"amount(s) ({', '.join(names)}), got {len(args)}")
        for name, value in zip(names, args, strict=False):
            if name in data or (name == "eps" and "epsilon" in data):
                raise TypeError(f"{type(self).__name__}: {name} given twice")
            data[name] = value
        for field in type(self).model_fields.values():  # eps=1, epsilon=2: not "extra"
            alias = field.validation_alias
            given = [n for n in (alias.choices if isinstance(alias, AliasChoices) else ())
                     if isinstance(n, str) and n in data]
            if len(given) > 1:
                raise InvalidInput(f"{type(self).__name__}: {' and '.join(given)} name the "
                                   "same amount; give one")
        try:
            super().__init__(**data)
        except ValidationError as exc:  # pydantic's text spans four lines: the first problem
            raise _one_line(type(self).__name__, exc) from None

    def _same_kind(self, other: object) -> bool:
        if not isinstance(other, _Cost):
            return False
        if type(other) is not type(self):
            raise InvalidInput(
                f"cannot add {other.describe()} to {self.describe()}: different notions "
                "(convert first: .to_zcdp(), .to_approx(delta))")
        return True

    def __radd__(self, other: object) -> Any:  # sum([...]) starts from 0
        if isinstance(other, int) and other == 0:
            return self
        return NotImplemented


class PureDP(_Cost):
    """ε-differential privacy (central)."""

    kind: Literal["pure"] = "pure"
    eps: Decimal = _EPS
    __positional__ = ("eps",)

    @field_validator("eps", mode="before")
    @classmethod
    def _eps(cls, v: object) -> Decimal:
        d = _exact(v)
        if d <= 0:
            raise ValueError(f"ε must be > 0, got {v}")
        return d

    def __add__(self, other: object) -> PureDP:
        """Basic composition: ε₁-DP then ε₂-DP is (ε₁ + ε₂)-DP (exact)."""
        if not self._same_kind(other):
            return NotImplemented
        with localcontext(_EXACT):
            return PureDP(self.eps + other.eps)  # type: ignore[attr-defined]

    def to_zcdp(self) -> ZCDP:
        """ε-DP ⇒ (ε²/2)-zCDP (Bun & Steinke 2016, Prop. 1.4); exact in decimals."""
        with localcontext(_EXACT):
            return ZCDP(rho=self.eps * self.eps / 2)

    def to_approx(self, delta: object = 0) -> ApproxDP:
        """(ε, 0)-DP, which is (ε, δ)-DP for every ``delta`` in [0, 1) (accepted for a uniform
        interface). Going through ε²/2-zCDP and CKS20 never gives a smaller ε for one
        mechanism (its ε exceeds ε√(2 ln 1/δ) > ε for δ < e^-1/2)."""
        _delta(delta, allow_zero=True)
        return ApproxDP(self.eps, 0)

    def describe(self) -> str:
        return f"ε={plain(self.eps)} (pure DP)"


class ZCDP(_Cost):
    """ρ-zero-concentrated differential privacy (central)."""

    kind: Literal["zcdp"] = "zcdp"
    rho: Decimal
    __positional__ = ("rho",)

    @field_validator("rho", mode="before")
    @classmethod
    def _rho(cls, v: object) -> Decimal:
        d = _exact(v)
        if d <= 0:
            raise ValueError(f"ρ must be > 0, got {v}")
        return d

    def __add__(self, other: object) -> ZCDP:
        """ρ₁-zCDP then ρ₂-zCDP is (ρ₁ + ρ₂)-zCDP (Bun & Steinke 2016, Lemma 2.3; exact)."""
        if not self._same_kind(other):
            return NotImplemented
        with localcontext(_EXACT):
            return ZCDP(self.rho + other.rho)  # type: ignore[attr-defined]

    def to_approx(self, delta: object) -> ApproxDP:
        """(ε, δ)-DP at ``delta`` ∈ (0, 1) by Canonne, Kamath & Steinke 2020, Prop. 12 /
        Cor. 13 (:func:`privcal.accountant.privacy.conversions.cks20_epsilon`, an upper bound
        that allows for its float error), ε rounded *up* to 6 significant digits — the
        conversion the accountant reports. A ρ or δ the conversion cannot evaluate in floating
        point (e.g. beyond ~1e308) is an InvalidInput."""
        from privcal.accountant.privacy.conversions import cks20_epsilon, round_up

        d = _delta(delta, allow_zero=False)
        rho = float(self.rho)
        if not rho < float("inf"):
            raise InvalidInput(f"ρ={plain(self.rho)} is too large to convert")
        return ApproxDP(round_up(cks20_epsilon(rho, float(d))), d)

    def describe(self) -> str:
        return f"ρ={plain(self.rho)} (zCDP)"


class ApproxDP(_Cost):
    """(ε, δ)-differential privacy (central), e.g. the amplified guarantee of a shuffle."""

    kind: Literal["approx"] = "approx"
    eps: Decimal = _EPS
    delta: Decimal
    __positional__ = ("eps", "delta")

    def __add__(self, other: object) -> ApproxDP:
        """Basic composition: (ε₁, δ₁) then (ε₂, δ₂) is (ε₁ + ε₂, δ₁ + δ₂)-DP (exact)."""
        if not self._same_kind(other):
            return NotImplemented
        with localcontext(_EXACT):
            return ApproxDP(self.eps + other.eps,  # type: ignore[attr-defined]
                            self.delta + other.delta)  # type: ignore[attr-defined]

    def to_approx(self, delta: object) -> ApproxDP:
        """Itself, if ``delta`` ≥ its δ ((ε, δ')-DP implies (ε, δ)-DP for δ ≥ δ')."""
        d = _delta(delta, allow_zero=True)
        if d < self.delta:
            raise InvalidInput(f"{self.describe()} gives no guarantee at the smaller δ={plain(d)}")
        return self

    @field_validator("eps", mode="before")
    @classmethod
    def _eps(cls, v: object) -> Decimal:
        d = _exact(v)
        if d < 0:
            raise ValueError(f"ε must be ≥ 0, got {v}")
        return d

    @field_validator("delta", mode="before")
    @classmethod
    def _delta(cls, v: object) -> Decimal:
        d = _exact(v)
        if not (0 <= d < 1):
            raise ValueError(f"δ must be in [0, 1), got {v}")
        return d

    def describe(self) -> str:
        return f"(ε={plain(self.eps)}, δ={plain(self.delta)})-DP"


class LocalDP(_Cost):
    """ε0-local differential privacy, charged to each participating subject's own budget."""

    kind: Literal["local"] = "local"
    eps0: Decimal = Field(validation_alias=AliasChoices("eps0", "epsilon"))
    __positional__ = ("eps0",)

    def __add__(self, other: object) -> LocalDP:
        """Two ε0-LDP reports of one subject: (ε0₁ + ε0₂)-LDP (basic composition; exact)."""
        if not self._same_kind(other):
            return NotImplemented
        with localcontext(_EXACT):
            return LocalDP(self.eps0 + other.eps0)  # type: ignore[attr-defined]

    @field_validator("eps0", mode="before")
    @classmethod
    def _eps0(cls, v: object) -> Decimal:
        d = _exact(v)
        if d <= 0:
            raise ValueError(f"ε0 must be > 0, got {v}")
        return d

    def describe(self) -> str:
        return f"ε0={plain(self.eps0)} (local DP, per subject)"


Cost = Annotated[PureDP | ZCDP | ApproxDP | LocalDP, Field(discriminator="kind")]


def parse_cost(data: dict[str, object]) -> PureDP | ZCDP | ApproxDP | LocalDP:
    """Rebuild a cost from its JSON form (``{"kind": "zcdp", "rho": "0.1"}``)."""
    from pydantic import TypeAdapter

    return TypeAdapter(Cost).validate_python(data)
