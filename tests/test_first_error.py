"""``privcal.errors.first_error``: the one rule by which every layer turns a pydantic
``ValidationError`` into a one-line message (costs, calibrator parameters, wrapped methods,
data shapes, saved releases, signed heads). Before it, five copies differed: some kept
pydantic's "Value error, " prefix, some named a missing field where an unknown one was the
cause, and one let a multi-line value repr through."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from privcal.costs import ZCDP
from privcal.errors import InvalidInput, first_error


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")

    a: int
    b: float = 0

    @field_validator("b")
    @classmethod
    def _b(cls, v: float) -> float:
        if v < 0:
            raise ValueError(f"b must be ≥ 0,\n  got {v}")
        return v


def _err(**values: object) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        _M(**values)  # type: ignore[arg-type]
    return info.value


def test_an_unknown_field_is_named_before_the_missing_one_it_explains() -> None:
    assert first_error(_err(bogus=1)) == ("bogus", "Extra inputs are not permitted",
                                          "extra_forbidden")
    assert first_error(_err()) == ("a", "Field required", "missing")


def test_a_validators_message_is_one_line_without_pydantics_prefix() -> None:
    where, msg, kind = first_error(_err(a=1, b=-1))
    assert (where, msg, kind) == ("b", "b must be ≥ 0, got -1.0", "value_error")


def test_every_layer_uses_it() -> None:
    with pytest.raises(InvalidInput, match=r"^ZCDP bogus: Extra inputs are not permitted$"):
        ZCDP(rho=-1, bogus=2)  # type: ignore[call-arg]
    with pytest.raises(InvalidInput) as info:
        ZCDP(rho=np.ones((3, 3)))  # type: ignore[arg-type]
    assert "\n" not in str(info.value) and "Value error" not in str(info.value)

    from privcal.accountant.prepare import validate_params
    from privcal.calibrators import registry

    cal = registry.get("pcoqs").calibrator
    with pytest.raises(InvalidInput, match=r"^pcoqs takes no parameter 'epsilon'$"):
        validate_params(cal, {"alpha": 0.1, "epsilon": 1})
