"""The inputs of one calibration request, listed and checked in one place (issue 12 follow-up).

:class:`CalibrationRequest` is the method, its parameters, the data and the options that
say how to read them (a score, a score range, Mondrian groups, a shuffle claim). Every
entry point builds one: :meth:`Accountant.calibrate
<privcal.accountant.Accountant.calibrate>` from its keywords, the CLI from its options,
the service from its JSON body or form (``privcal.service.uploads.CalibrationBody``
extends this model with JSON types for the arrays); then
:func:`privcal.accountant.prepare.prepare`, :func:`privcal.accountant.calibration.calibrate`
and :func:`~privcal.accountant.calibration.dry_run` take it.

Here are only the checks that need nothing but the request itself (types, flags that go
together); what the inputs mean for a method — which arrays it needs, scores, shapes, the
wrappers — is :mod:`privcal.accountant.prepare` and :mod:`privcal.accountant.wrapping`.
A bad input is a one-line :class:`~privcal.errors.InvalidInput`.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from privcal.calibrators.base import Calibrator
from privcal.errors import InvalidInput

__all__ = ["ARRAYS", "INPUTS", "CalibrationRequest", "as_invalid_input"]

_FLAGS = "shuffled and assume_unlinkable_features must be True or False"
#: the options' types (bools strictly: 1 is not True) and the one-line error otherwise
_OPTION_TYPES: dict[str, tuple[type | tuple[type, ...], str]] = {
    "score": ((str, type(None)), "score must be a score name, got {v!r:.60}"),
    "score_options": ((dict, type(None)), "score_options must be a dict of option names to "
                      "values"),
    "public_groups": (bool, "public_groups must be True or False"),
    "shuffled": (bool, _FLAGS),
    "assume_unlinkable_features": (bool, _FLAGS),
}


class CalibrationRequest(BaseModel):
    """One calibration: the method, its parameters, the data, and how to read them."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    method: Any = Field(description="a registered calibrator's name (or, in Python, a "
                        "Calibrator)")
    params: dict[str, Any] = Field(
        default_factory=dict, description="the method's parameters; `alpha` may be a list "
        "of levels (one threshold each, the costs add up)")
    # the data, one row each (array-likes here; JSON arrays or uploaded files over HTTP)
    scores: Any = Field(default=None, description="precomputed scores")
    probs: Any = Field(default=None, description="n×k probabilities")
    labels: Any = Field(default=None, description="labels: class indices, or class names")
    classes: Any = Field(default=None, description="class names of the probability columns")
    agents: Any = Field(default=None, description="the agent of every score (federated)")
    subjects: Any = Field(default=None, description="the subject of every row (local DP)")
    preds: Any = Field(default=None, description="regression predictions f(x) (score absolute)")
    lower_preds: Any = Field(default=None, description="lower quantile predictions (score cqr)")
    upper_preds: Any = Field(default=None, description="upper quantile predictions (score cqr)")
    targets: Any = Field(default=None, description="true regression targets y")
    groups: Any = Field(default=None, description="the Mondrian group of every row (a public "
                        "column; implies mondrian='column')")
    # how to read them
    score: str | None = Field(default=None, description="score function: lac, aps, raps "
                              "(probabilities) or absolute, cqr (regression)")
    score_options: dict[str, Any] | None = Field(default=None,
                                                 description="options of the score function")
    score_range: Any = Field(default=None, description="public score range (lo, hi) of a "
                             "method that bins or searches the score axis; recorded")
    mondrian: str | None = Field(default=None, description="one threshold per class "
                                 "('label') or per group of `groups` ('column')")
    public_groups: bool = Field(default=False, description="the caller asserts every record's "
                                "group is public or fixed in advance (Mondrian is charged once)")
    shuffled: bool = Field(default=False, description="local-DP reports went through a "
                           "trusted shuffler: charge the amplified (ε, δ)")
    assume_unlinkable_features: bool = Field(
        default=False, description="with shuffled: features do not identify users")

    @field_validator("method", mode="before")
    @classmethod
    def _method(cls, v: Any) -> Any:
        if not isinstance(v, str | Calibrator):
            raise InvalidInput(f"method must be a calibrator name, got {v!r:.60}")
        return v

    @field_validator("params", mode="before")
    @classmethod
    def _params(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise InvalidInput(f"params must be a dict, got {type(v).__name__}")
        return v

    @field_validator("score", "score_options", "public_groups", "shuffled",
                     "assume_unlinkable_features", mode="before")
    @classmethod
    def _typed(cls, v: Any, info: ValidationInfo) -> Any:
        want, message = _OPTION_TYPES[info.field_name or ""]
        if not isinstance(v, want):
            raise InvalidInput(message.format(v=v))
        return v

    @model_validator(mode="after")
    def _together(self) -> CalibrationRequest:
        if self.assume_unlinkable_features and not self.shuffled:
            raise InvalidInput("--assume-unlinkable-features only matters with --shuffled")
        return self

    @classmethod
    def of(cls, method: Any, params: dict[str, Any] | None = None,
           **inputs: Any) -> CalibrationRequest:
        """The request of ``method`` (returned as is if it already is one), ``params`` and
        the keyword inputs — the functions' keyword form. A bad input is a one-line
        :class:`~privcal.errors.InvalidInput`."""
        if isinstance(method, CalibrationRequest):
            if params is not None or inputs:
                raise InvalidInput("give a CalibrationRequest or keyword inputs, not both")
            return method
        return cls.checked({"method": method, "params": params, **inputs})

    @classmethod
    def checked(cls, values: dict[str, Any]) -> CalibrationRequest:
        """``model_validate(values)`` with the first problem as a one-line InvalidInput."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise as_invalid_input(exc) from None

    def inputs(self) -> dict[str, Any]:
        """Every input but the method and its parameters, as keywords."""
        return {k: getattr(self, k) for k in INPUTS}


def as_invalid_input(exc: ValidationError) -> InvalidInput:
    """The first problem of a validation error as the one-line InvalidInput it carries (or
    one naming the field)."""
    err = exc.errors(include_input=False)[0]
    inner = (err.get("ctx") or {}).get("error")
    if isinstance(inner, InvalidInput):
        return inner
    where = ".".join(str(p) for p in err.get("loc", ())) or "request"
    if err["type"] == "extra_forbidden":
        return InvalidInput(f"unknown calibration input {where!r} (known: "
                            f"{', '.join(('params', *INPUTS))})")
    return InvalidInput(f"{where}: {err['msg']}")


#: the data arrays of a request (one row each)
ARRAYS = ("scores", "probs", "labels", "agents", "subjects", "preds", "lower_preds",
          "upper_preds", "targets", "groups")
#: every input of a request besides ``method`` and ``params``
INPUTS = tuple(f for f in CalibrationRequest.model_fields if f not in ("method", "params"))
