"""What the two calibrator wrappers (:mod:`~privcal.calibrators.levels`,
:mod:`~privcal.calibrators.mondrian`) share: parameters laid over an inner method's
parameter model, and nested guarantees written into one flat ``details`` dict.

A wrapper is itself a :class:`~privcal.calibrators.base.Calibrator`; its registry name is
``"<wrapper>:<inner name>"`` (``levels:pcoqs``, ``mondrian:levels:pcoqs``), so a release
records which method ran inside it and ``privcal audit verify`` rebuilds the same wrapper
(:func:`privcal.calibrators.registry.get`). Only central methods are wrapped: a local or
federated method charges per subject or per agent, and a subject's rows could fall in
several groups (refused with a one-line error, nothing charged).
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

from pydantic import ConfigDict, ValidationError

from privcal.calibrators.base import Calibrator, CalibratorParams, CoverageGuarantee
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP
from privcal.errors import InvalidInput, first_error

#: the privacy models a wrapper accepts inside it (see the module docstring)
WRAPPABLE = frozenset({"none", "central-zcdp", "central-pure"})

AnyCost = PureDP | ZCDP | ApproxDP | LocalDP


def check_wrappable(inner: Calibrator, wrapper: str) -> None:
    """Refuse an inner method the wrapper's privacy argument does not cover."""
    if inner.privacy_model not in WRAPPABLE and not isinstance(inner, WrappedCalibrator):
        raise InvalidInput(
            f"{wrapper} calibration takes a central method (split, pcoqs, exponq, …); "
            f"{inner.name} is {inner.privacy_model}: its per-subject charge does not compose "
            "over groups or levels this way")
    if getattr(inner, "interactive", False):
        raise InvalidInput(f"{inner.name} is interactive; {wrapper} calibration needs a "
                           "method that runs on the data at once")


def validation_message(exc: ValidationError, model: str) -> str:
    """One line naming the bad parameter of ``model`` (a method's name): an unknown one
    first (:func:`~privcal.errors.first_error`)."""
    where, msg, kind = first_error(exc)
    if kind == "extra_forbidden":
        return f"{model} takes no parameter {where!r}"
    return f"{model}: invalid {where or 'parameters'}: {msg}"


class WrappedParams(CalibratorParams):
    """Parameters of a wrapper: its own fields, and every other field passed to the inner
    method's model (validated there; stored flat, so a release's ``params`` read as the
    inner method's plus the wrapper's)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    #: the inner method's parameter model (set on each generated subclass)
    inner_model: ClassVar[type[CalibratorParams]]

    def inner_values(self) -> dict[str, Any]:
        """The inner method's parameters (everything that is not the wrapper's own)."""
        return dict(self.model_extra or {})


def params_class(base: type[WrappedParams], inner: Calibrator) -> type[WrappedParams]:
    """``base`` bound to ``inner``'s parameter model (one class per inner method)."""
    return type(f"{base.__name__.removesuffix('Params')}{inner.Params.__name__}", (base,),
                {"inner_model": inner.Params, "__module__": base.__module__})


def inner_dump(model: type[CalibratorParams], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` validated by ``model`` and dumped by field name (defaults filled in)."""
    try:
        return model.model_validate(values).model_dump(mode="python")
    except ValidationError as exc:
        raise ValueError(validation_message(exc, model.__name__.removesuffix("Params")
                                            .lower())) from None


def put_details(details: dict[str, float | int | str | None], prefix: str,
                g: CoverageGuarantee, **extra: float | int | str | None) -> None:
    """Add a nested guarantee's numbers (and ``extra``) to ``details`` as flat
    ``"{prefix}: key"`` entries, so ``audit verify`` compares each of them when it recomputes
    the wrapper's guarantee. A key already there is refused (InvalidInput, before anything
    is charged): a group named ``a: alpha=0.1`` would otherwise overwrite the level 0.1 of
    group ``a``, and the release would record one group's bound as the other's."""
    flat: dict[str, float | int | str | None] = {
        "target": g.target, "lower": g.lower, "upper": g.upper,
        "failure_probability": g.failure_probability, "rank": g.rank, **extra}
    flat.update(g.details)
    for key, value in flat.items():
        full = f"{prefix}: {key}"
        if full in details:
            raise InvalidInput(
                f"two groups or levels are recorded under the same name ({full!r}): rename "
                "the group (a name ending in ': alpha=…' or ': n' collides) or give levels "
                "that differ in their first six significant digits")
        details[full] = value


def max_cost(costs: list[AnyCost]) -> AnyCost:
    """The cost of mechanisms run on disjoint parts of the data, one part each: the largest
    (parallel composition, McSherry 2009 "Privacy Integrated Queries", Theorem 4, for ε-DP;
    for ρ-zCDP and (ε, δ)-DP the same argument: neighbouring datasets differ in one part, so
    only one mechanism's output distribution changes — Dwork & Roth 2014, §2.3)."""
    first = costs[0]
    if any(type(c) is not type(first) for c in costs):
        raise InvalidInput("the groups' costs are of different notions")
    if isinstance(first, ZCDP):
        return ZCDP(max(c.rho for c in costs))  # type: ignore[union-attr]
    if isinstance(first, PureDP):
        return PureDP(max(c.eps for c in costs))  # type: ignore[union-attr]
    if isinstance(first, ApproxDP):
        return ApproxDP(max(c.eps for c in costs),  # type: ignore[union-attr]
                        max(c.delta for c in costs))  # type: ignore[union-attr]
    return LocalDP(max(c.eps0 for c in costs))  # type: ignore[union-attr]


class WrappedCalibrator:
    """Marker base of the wrappers (a wrapper may wrap a wrapper: ``mondrian:levels:…``)."""

    inner: Calibrator
    version: str

    def _prefix(self) -> str:
        """This wrapper's part of ``version``: ``"<own>/"`` before the inner version."""
        return self.version.removesuffix(self.inner.version)

    @property
    def min_scores(self) -> int | None:
        """The inner method's ``min_scores``, if it declares one (calibrators/base.py)."""
        return getattr(self.inner, "min_scores", None)

    @property
    def legacy_params(self) -> dict[str, dict[str, object]]:
        """The inner method's older versions, under this wrapper's version prefix, so that
        ``privcal audit verify`` recomputes an old wrapped release by its own formula."""
        return {self._prefix() + v: p
                for v, p in getattr(self.inner, "legacy_params", {}).items()}

    def guarantee_as(self, version: str, params: Any, shape: Any) -> CoverageGuarantee:
        """The guarantee as wrapped calibrator ``version`` recorded it: the inner method's
        per-group or per-level guarantees by the inner version's own formula."""
        inner_version = version.removeprefix(self._prefix())
        if inner_version == self.inner.version or not hasattr(self.inner, "guarantee_as"):
            return self.guarantee(params, shape)  # type: ignore[attr-defined, no-any-return]
        twin = copy.copy(self)
        twin.inner = _AsVersion(self.inner, inner_version)  # type: ignore[assignment]
        return twin.guarantee(params, shape)  # type: ignore[attr-defined, no-any-return]


class WordedWrapper(WrappedCalibrator):
    """A wrapper whose *wording* has versions (levels, Mondrian): its recorded version is
    ``"<own>/<inner version>"``, ``own`` the installed :attr:`own_version` or one of the
    :attr:`older_versions`, and :meth:`guarantee` writes the wording of :attr:`_wording`."""

    #: the installed version of the wrapper's own wording, and its older ones
    own_version: str
    older_versions: tuple[str, ...] = ()
    #: the wrapper version whose wording :meth:`guarantee` writes (:meth:`guarantee_as`)
    _wording: str

    @property
    def legacy_params(self) -> dict[str, dict[str, object]]:
        """The inner method's older versions under the installed version, and every inner
        version under each older version of the wrapper: ``audit verify`` recomputes a
        release of any of them by its own formula and wording."""
        inner = self.inner
        versions = {inner.version: {}, **getattr(inner, "legacy_params", {})}
        out = {f"{self.own_version}/{v}": p for v, p in versions.items() if v != inner.version}
        for own in self.older_versions:
            out.update({f"{own}/{v}": p for v, p in versions.items()})
        return out

    def guarantee_as(self, version: str, params: Any, shape: Any) -> CoverageGuarantee:
        """The guarantee as wrapper ``version`` recorded it: the inner method's by its
        version's formula, stated in the wrapper's wording of then. A bare inner version
        (as :meth:`WrappedCalibrator.guarantee_as` takes it) is stated in the installed
        wording."""
        twin = copy.copy(self)
        known = {self.inner.version, *getattr(self.inner, "legacy_params", {})}
        for own in (self.own_version, *self.older_versions):
            inner_version = version.removeprefix(f"{own}/")
            if inner_version != version and inner_version in known:
                twin._wording = own
                version = f"{self.own_version}/{inner_version}"
                break
        return WrappedCalibrator.guarantee_as(twin, version, params, shape)


class _AsVersion:
    """An inner calibrator whose ``guarantee`` is the one a given older version recorded."""

    def __init__(self, inner: Calibrator, version: str) -> None:
        self._inner, self._version = inner, version

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def guarantee(self, params: Any, shape: Any) -> CoverageGuarantee:
        return self._inner.guarantee_as(self._version, params, shape)  # type: ignore[attr-defined, no-any-return]
