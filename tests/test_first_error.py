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


def test_pydantics_own_constraint_messages_name_the_value() -> None:
    # red team 17: "pcoqs: invalid rho: Input should be greater than 0" did not say what
    # was given, where privcal's own validators do ("ε must be > 0, got -1")
    assert first_error(_err(a="x")) == (
        "a", "Input should be a valid integer, unable to parse string as an integer, got 'x'",
        "int_parsing")
    msg = first_error(_err(a="y" * 60))[1]  # a long value: abbreviated (reprlib)
    assert msg.endswith(", got '" + "y" * 18 + "..." + "y" * 19 + "'")
    msg = first_error(_err(a=list(range(10**6))))[1]  # not written out to be cut
    assert msg.endswith(", got [0, 1, 2, 3, 4, 5, 6, 7, ...]")
    msg = first_error(_err(a=np.zeros((2, 2))))[1]  # a repr over two lines: one line
    assert "\n" not in msg and msg.endswith("got array([[0., 0.], [0., 0.]])")


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


def test_the_layers_red_team_15_found_outside_it(accountant: object, tmp_path: object) -> None:
    """Left outside the rule: a recorded coverage with an unknown key (pydantic's multi-line
    error), an ldp-score protocol's range ("Value error, "), a signed head's field (not
    named), a FedCP release with agents_planned and a version that is no dotted number (a
    bare ValueError)."""
    from pathlib import Path

    from privcal.accountant import sessions as S
    from privcal.accountant.releases import record_release
    from privcal.storage.signing import read_signed_head

    acct = accountant
    acct.create_dataset("d", epsilon=1, allow_nonprivate=True)  # type: ignore[attr-defined]
    common = {"method": "split", "calibrator_version": "1", "threshold": 0.5,
              "params": {"alpha": 0.1}, "shape": {"n": 10}, "privacy": {}, "diagnostics": {},
              "charge_ids": []}
    with pytest.raises(InvalidInput) as info:
        record_release(acct.ledger, "d", _as_computed=True,  # type: ignore[attr-defined]
                       coverage={"target": 0.9, "zz": 1}, **common)
    assert "\n" not in str(info.value) and "coverage is not a coverage guarantee: zz" in str(
        info.value)
    with pytest.raises(InvalidInput) as info:
        S.open_session(acct, "ldp-score", dataset="d", alpha=0.1, epsilon=1, rounds=2,
                       group_size=5, lower=1, upper=0)
    assert "Value error" not in str(info.value) and "lower < upper" in str(info.value)
    bad = Path(str(tmp_path)) / "head.json"
    bad.write_text('{"seq": "x", "zz": 1}')
    with pytest.raises(InvalidInput, match=r"is not a privcal signed head: zz: Extra inputs"):
        read_signed_head(str(bad))
    from privcal.calibrators.base import DataShape
    from privcal.calibrators.fedcp_qq import FedCPQQ, FedCPQQParams

    shape = DataShape(n=600, group_sizes=(200, 200, 200))
    cov = FedCPQQ().guarantee(FedCPQQParams(alpha=0.1, agents_planned=5), shape)
    fed = {**common, "method": "fedcp-qq", "calibrator_version": "x.y",
           "params": {"alpha": 0.1, "agents_planned": 5},
           "shape": shape.model_dump(), "coverage": cov.model_dump(mode="json")}
    with pytest.raises(InvalidInput, match=r"fedcp-qq x\.y has no parameter agents_planned"):
        record_release(acct.ledger, "d", **fed)  # type: ignore[attr-defined]
