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

import math
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

from privcal.accountant.normalize import MAX_JSON_INT, plain_values
from privcal.accountant.row_inputs import same_index
from privcal.accountant.score_values import impossible_scores, refuse_narrow_scores
from privcal.calibrators.base import Calibrator
from privcal.calibrators.bound_floats import count_text
from privcal.errors import InvalidInput, first_error, numeric_edge

__all__ = ["ARRAYS", "INPUTS", "MAX_K_REG", "CalibrationRequest", "as_invalid_input",
           "check_rng", "label_score_options", "method_score_options", "precomputed_score"]

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
    column_names: Any = Field(
        default=None, description="the probability columns' own names (a table's header), "
        "when they are not the classes: recorded so that predict matches a later table's "
        "columns by name, never by position")
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
        """``model_validate(values)`` with the first problem as a one-line InvalidInput; every
        value but the data arrays read once into plain Python values (:func:`~privcal.
        accountant.normalize.plain_values`, red team 26, api F8); two pandas arrays indexed
        differently refused (:func:`~privcal.accountant.row_inputs.same_index`)."""
        same_index({k: values.get(k) for k in ARRAYS})  # by position (red team 26, api F9)
        values = {k: v if k in ARRAYS else plain_values(v) for k, v in values.items()}
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
    where, msg, kind = first_error(exc)
    if kind == "extra_forbidden":
        return InvalidInput(f"unknown calibration input {where!r} (known: "
                            f"{', '.join(('params', *INPUTS))})")
    return InvalidInput(f"{where or 'request'}: {msg}")


#: the largest raps ``k_reg``: its penalty is computed in int64 (any k_reg ≥ k adds none),
#: and a release records it exactly in JSON (2**53 itself was charged, then not recorded:
#: red team 20, service F1)
MAX_K_REG = MAX_JSON_INT


def label_score_options(score: str | None, options: dict[str, Any] | None,
                         pshape: tuple[int, ...]) -> dict[str, Any]:
    """The options of the label score ``score`` as given, checked from public values only
    (the run and the dry run): the score named, the options' names and types, ``k_reg``
    within the int64 arithmetic of the penalty, and λ·(k − k_reg) finite, so that no score
    overflows whatever the data. A number past the float range is a one-line InvalidInput."""
    from privcal.calibrators.scores import SCORES, score_options

    if score is None:
        raise InvalidInput("with probs and labels, name a score: lac, aps or raps (score= in "
                           "Python, --score on the CLI, \"score\" in a service request)")
    if score not in SCORES:
        raise InvalidInput(f"unknown score {score!r} (known: {', '.join(SCORES)})")
    opts = dict(options or {})
    # names checked before they become keywords: an option called rng, probs, labels or
    # name is unknown (InvalidInput), not a second value for that argument
    full = numeric_edge(f"score {score!r}")(score_options)(SCORES[score], opts)
    k_reg, lam = full.get("k_reg"), full.get("lam")
    if k_reg is not None and k_reg > MAX_K_REG:
        raise InvalidInput(f"raps k_reg must be at most 2**53 − 1, got {count_text(k_reg)} "
                           "(any k_reg ≥ the number of classes already adds no penalty)")
    k = pshape[1] if len(pshape) == 2 else None
    if lam is not None and k_reg is not None and k is not None \
            and not math.isfinite(float(lam) * max(0, k - int(k_reg)) + 1.0):
        raise InvalidInput(f"raps λ = {lam!r:.40} makes the scores overflow: λ·(k − k_reg) "
                           "must be a finite number")
    return opts


def precomputed_score(score: str | None, options: dict[str, Any] | None,
                      scores: Any = None, given: bool = False) -> dict[str, Any] | None:
    """The record of the score precomputed ``--scores`` were computed with, when it is named:
    its name and every option, the defaults filled in, as a run on probabilities records it —
    what ``predict``/``evaluate``/``Release.predict_set`` then use (red team 5: raps scores
    with λ = 0 recorded without their options were read back with λ = 0.01, k_reg = 5, and
    covered 0.894 against a recorded ≥ 0.9). None when no score is named (the release records
    none; ``predict --score`` names it); options without the score they belong to are
    refused. Named, ``scores`` (the array given, if at hand) must not be narrower floats
    than float64 (:func:`~privcal.accountant.score_values.refuse_narrow_scores`). ``given``:
    the caller computed them (not privcal, from predictions and targets): a regression
    score's record says so, for predict's slack (red team 25, coverage F5)."""
    if score is None:
        if options:
            raise InvalidInput("score options need the score they belong to: name it "
                               "(--score raps --score-option lam=0; score='raps', "
                               "score_options={...})")
        return None
    from privcal.calibrators.scores import SCORES

    opts = label_score_options(score, options, ())
    if scores is not None:
        arr = refuse_narrow_scores(scores, score)
        if arr is not None:
            impossible_scores(arr, score)
    record = {"name": score, "options": {**SCORES[score].options, **opts}}
    if given and SCORES[score].kind == "regression":  # a classification one has no k
        record["given"] = "scores"
    return record


def method_score_options(cal: Calibrator, params: dict[str, Any],
                          options: dict[str, Any] | None) -> dict[str, Any]:
    """``params`` of a method whose parameters name the score (``ldp-label``), with the score's
    options: passed on if the method takes them (a ``score_options`` parameter); else only the
    score's defaults are accepted, and any other option is refused in one line — the method
    computes its scores with the defaults, and a release recording other options would be
    read back with options it was not calibrated on (red team 5)."""
    from privcal.calibrators.scores import SCORES

    if not options:
        return params
    if "score_options" in cal.Params.model_fields:
        if params.get("score_options", options) != options:
            raise InvalidInput(f"{cal.name}: score options given twice")
        return {**params, "score_options": options}
    name = params.get("score", cal.Params.model_fields["score"].default)
    spec = SCORES.get(name) if isinstance(name, str) else None
    if spec is None:
        return params  # the method's own validation names the unknown score
    full = label_score_options(name, options, ())
    if {**spec.options, **full} != spec.options:
        shown = ", ".join(f"{k}={v!r}" for k, v in spec.options.items()) or "none"
        raise InvalidInput(f"{cal.name} computes the {name!r} scores with their default "
                           f"options ({shown}) and takes no other score options")
    return params


def check_rng(rng: Any) -> None:
    """A caller's random source: ``None`` (privcal's CSPRNG) or a :class:`random.Random`
    (``random.Random(seed)`` for a reproducible non-private run; a private run takes only a
    :class:`random.SystemRandom`: :func:`~privcal.calibrators.base.unpredictable`), else a
    one-line InvalidInput —
    checked before anything is charged (red team 5: ``rng=42`` or a NumPy ``Generator`` was
    charged, then failed inside the calibrator). An integer is not taken as a seed: a seed
    in production code would make the privacy noise predictable."""
    import random

    if rng is not None and not isinstance(rng, random.Random):
        raise InvalidInput(f"rng must be a random.Random or None (privcal's CSPRNG), got "
                           f"{type(rng).__name__}: a bare seed is not accepted, it would make "
                           "the privacy noise predictable (random.Random(seed) serves only "
                           "non-private methods)")


#: the data arrays of a request (one row each)
ARRAYS = ("scores", "probs", "labels", "agents", "subjects", "preds", "lower_preds",
          "upper_preds", "targets", "groups")
#: every input of a request besides ``method`` and ``params``
INPUTS = tuple(f for f in CalibrationRequest.model_fields if f not in ("method", "params"))
