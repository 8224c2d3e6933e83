"""Privacy costs as immutable values.

A mechanism's cost is a value (as in Google's dp_accounting ``DpEvent``): the
calibrators declare one from their parameters alone, the accountant charges it.
This module is the shared vocabulary of both, so it sits at the top of the
package and imports nothing from it but ``errors``.

Amounts are exact decimals: ``PureDP(eps=0.1)`` holds ``Decimal("0.1")`` (the
float's shortest repr), so that sums in the ledger are exact.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ZCDP", "ApproxDP", "Cost", "LocalDP", "PureDP", "parse_cost"]


def _exact(value: object) -> Decimal:
    """A float as the decimal a person typed (its shortest repr), never its binary expansion."""
    if isinstance(value, float):
        value = repr(value)
    if isinstance(value, bool) or (isinstance(value, str) and "_" in value):
        # Decimal("1_0") is 10 and True is 1: neither is an amount anyone meant
        raise ValueError(f"not a number: {value!r}")
    try:
        d = Decimal(str(value)) if not isinstance(value, Decimal) else value
    except Exception as exc:  # decimal.InvalidOperation and friends
        raise ValueError(f"not a number: {value!r}") from exc
    if not d.is_finite():
        raise ValueError(f"must be finite, got {value!r}")
    return d


def plain(d: Decimal) -> str:
    """A decimal as people write it: ``10`` not ``1E+1``, ``0.000001`` not ``1E-6``."""
    return format(d.normalize(), "f")


class _Cost(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PureDP(_Cost):
    """ε-differential privacy (central)."""

    kind: Literal["pure"] = "pure"
    eps: Decimal

    @field_validator("eps", mode="before")
    @classmethod
    def _eps(cls, v: object) -> Decimal:
        d = _exact(v)
        if d <= 0:
            raise ValueError(f"ε must be > 0, got {v}")
        return d

    def to_zcdp(self) -> ZCDP:
        """ε-DP ⇒ (ε²/2)-zCDP (Bun & Steinke 2016, Prop. 1.4); exact in decimals."""
        return ZCDP(rho=self.eps * self.eps / 2)

    def describe(self) -> str:
        return f"ε={plain(self.eps)} (pure DP)"


class ZCDP(_Cost):
    """ρ-zero-concentrated differential privacy (central)."""

    kind: Literal["zcdp"] = "zcdp"
    rho: Decimal

    @field_validator("rho", mode="before")
    @classmethod
    def _rho(cls, v: object) -> Decimal:
        d = _exact(v)
        if d <= 0:
            raise ValueError(f"ρ must be > 0, got {v}")
        return d

    def describe(self) -> str:
        return f"ρ={plain(self.rho)} (zCDP)"


class ApproxDP(_Cost):
    """(ε, δ)-differential privacy (central), e.g. the amplified guarantee of a shuffle."""

    kind: Literal["approx"] = "approx"
    eps: Decimal
    delta: Decimal

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
    eps0: Decimal

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
