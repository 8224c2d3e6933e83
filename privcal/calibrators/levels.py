"""Several miscoverage levels at once: one threshold per α, the cost composed exactly.

``levels:METHOD`` runs METHOD once per level α₁ < … < α_k on the same calibration data,
each run with fresh noise, and releases the k thresholds together.

**Privacy.** k runs of one mechanism on the same data compose by the rule of its notion:
k·ρ for ρ-zCDP (Bun & Steinke 2016, "Concentrated Differential Privacy", Lemma 2.3),
Σε for pure ε-DP (Dwork & Roth 2014, Theorem 3.16), (Σε, Σδ) for (ε, δ)-DP. For the
Gaussian-noise counts of P-COQS the zCDP sum is exact (Rényi divergences of independent
Gaussians add), so no joint mechanism can be charged less under zCDP accounting; no
tighter joint mechanism is claimed here. The cost is ``sum`` of the per-level costs
(:mod:`privcal.costs` adds exactly in decimals) and is what the release records. Pure ε-DP
levels are charged one pure event each (:mod:`privcal.calibrators.cost_parts`): each is
ε²/2-zCDP (Bun & Steinke 2016, Prop. 1.4), so a zCDP cap counts kε²/2 — charged as one
event of ε = kε it counted (kε)²/2, k times too much (red team 25, privacy2 F1).

**Nested sets.** Noise can order two levels' thresholds the wrong way (t(0.05) < t(0.1)).
Each level's released threshold is the largest raw threshold among its level and every
larger α: t'ᵢ = max_{j: αⱼ ≥ αᵢ} tⱼ ≥ tᵢ. A larger threshold only adds labels to every set,
so level i keeps its guarantee (coverage of t'ᵢ ≥ coverage of tᵢ), and the sets are nested
(smaller α, larger set). This is post-processing of the k outputs: no extra privacy cost.
The raw thresholds are recorded too. The release's single ``threshold`` is t'₁ (smallest
α, largest set) with that level's guarantee as the headline; every level's guarantee is in
``coverage.details`` (``"alpha=0.1: lower"``, …), recomputed by ``audit verify``.

**Upper bounds.** Raising a level's threshold to t'ᵢ can raise its coverage above the
upper bound of its own run: coverage grows with the threshold, so cov(t'ᵢ) = max_{j ≥ i}
cov(tⱼ) ≤ max_{j ≥ i} Uⱼ when every run j ≥ i meets its upper bound's conditions (for
P-COQS each run's own noise event E₋ⱼ: together with probability ≥ 1 − Σ_{j ≥ i} βⱼ). Since
version 1.2.0 level i records that maximum as its upper bound, its ``upper_requires`` says
that every larger α's conditions are needed too, and the statement says so (versions 1.0.0
and 1.1.0 recorded each run's own upper bound and conditions: red team 9, r9a).

**Wording.** The statement is the headline level's, then each other level's bound and the
probability it holds with, both rounded down to 6 significant digits (never above the
recorded bound, nor above 1 − δ exactly). Version 1.0.0 of this wrapper rounded them to
nearest (1 − δ = 0.9999999 read "w.p. ≥ 1"); ``audit verify`` recomputes a release of an
older version in its own wording (:meth:`Levels.guarantee_as`).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import Any, ClassVar

from pydantic import model_validator

from privcal.calibrators.base import (
    CalibrationInput,
    CalibrationResult,
    Calibrator,
    CoverageGuarantee,
    DataShape,
)
from privcal.calibrators.base import (
    check_inputs as base_check_inputs,
)
from privcal.calibrators.base import only_infinite as inner_only_infinite
from privcal.calibrators.bound_floats import text_at_most
from privcal.calibrators.wrapped import (
    WordedWrapper,
    WrappedCalibrator,
    WrappedParams,
    check_wrappable,
    inner_dump,
    params_class,
    put_details,
)
from privcal.errors import InvalidInput, check_number_text

__all__ = ["LEVELS_VERSION", "Levels", "LevelsParams", "level_bounds", "parse_alphas"]

#: 1.2.0: a level's upper bound the largest of its own and every larger α's, with their
#: conditions (1.1.0: each run's own); 1.1.0: the other levels' numbers rounded down (1.0.0:
#: to nearest; module docstring)
LEVELS_VERSION = "1.2.0"
#: the versions before: recomputed by their own wording (:meth:`Levels.guarantee_as`)
_OLDER = ("1.0.0", "1.1.0")
#: versions that rounded the other levels' numbers to nearest
_ROUNDED_TO_NEAREST = ("1.0.0",)
#: the condition an upper bound of a raised (nested) threshold adds (module docstring)
NESTED_UPPER = ("and the same at every larger level α (this level's threshold is the "
                "largest of theirs)")
#: at most this many levels in one release
MAX_LEVELS = 20


def parse_alphas(value: Any) -> tuple[float, ...]:
    """Levels from ``0.1``, ``[0.05, 0.1]`` or ``"0.05,0.1,0.2"``: each in (0, 1), distinct,
    returned in increasing order. A one-line :class:`InvalidInput` otherwise."""
    if isinstance(value, str):
        parts = [s.strip() for s in value.split(",")]
        try:
            for s in parts:  # float("0.0_5") is 0.005 (red team 10)
                check_number_text(s, "alpha")
            items: list[Any] = [float(s) for s in parts]
        except ValueError:
            raise InvalidInput(f"alpha must be a number or a comma-separated list of "
                               f"numbers, got {value!r}") from None
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        items = [value]
    out: list[float] = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, int | float) or not 0 < a < 1 \
                or not math.isfinite(a):
            raise InvalidInput(f"every level α must be a number in (0, 1), got {a!r}")
        out.append(float(a))
    if not out:
        raise InvalidInput("give at least one level α")
    if len(set(out)) != len(out):
        raise InvalidInput(f"level α = {next(a for a in out if out.count(a) > 1)} is given twice")
    if len(out) > MAX_LEVELS:
        raise InvalidInput(f"at most {MAX_LEVELS} levels at once, got {len(out)}")
    return tuple(sorted(out))


class LevelsParams(WrappedParams):
    """``alpha``: the levels (increasing); every other field is the inner method's."""

    alpha: tuple[float, ...]  # type: ignore[assignment]

    @model_validator(mode="before")
    @classmethod
    def _levels(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "alpha" not in data:
            return data
        try:
            alphas = parse_alphas(data["alpha"])
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        rest = {k: v for k, v in data.items() if k != "alpha"}
        dumps = [inner_dump(cls.inner_model, {**rest, "alpha": a}) for a in alphas]
        first = {k: v for k, v in dumps[0].items() if k != "alpha"}
        return {**first, "alpha": alphas}

    def per_level(self) -> list[tuple[float, Any]]:
        """(α, the inner method's parameters at α) for every level, in increasing α."""
        rest = self.inner_values()
        return [(a, self.inner_model.model_validate({**rest, "alpha": a})) for a in self.alpha]


def level_key(alpha: float) -> str:
    """How a level is named in ``details`` and diagnostics: ``alpha=0.1``."""
    return f"alpha={alpha:g}"


def level_bounds(g: CoverageGuarantee,
                 alphas: tuple[float, ...]) -> list[tuple[float, float, float]]:
    """(α, lower bound, failure probability) of each level of ``g``, a guarantee
    :meth:`Levels.guarantee` made for levels ``alphas`` (read from its ``details``)."""
    return [(a, float(g.details[f"{level_key(a)}: lower"]),  # type: ignore[arg-type]
             float(g.details[f"{level_key(a)}: failure_probability"]))  # type: ignore[arg-type]
            for a in alphas]


def _nested_uppers(per: list[tuple[float, CoverageGuarantee]]
                   ) -> list[tuple[float, CoverageGuarantee]]:
    """Each level's guarantee with the upper bound of its nested threshold (module
    docstring): the largest of its own and every larger α's (None if one of them has none),
    its ``upper_requires`` extended by :data:`NESTED_UPPER`. The largest α is unchanged."""
    out = [per[-1]]
    top: float | None = per[-1][1].upper
    for a, g in reversed(per[:-1]):
        top = None if top is None or g.upper is None else max(top, g.upper)
        details = dict(g.details)
        if top is not None:
            own = details.get("upper_requires")
            details["upper_requires"] = f"{own}; {NESTED_UPPER}" if own else NESTED_UPPER
        out.append((a, g.model_copy(update={"upper": top, "details": details})))
    return out[::-1]


class Levels(WordedWrapper):
    """METHOD at several levels at once (see the module docstring)."""

    version: str
    Params: type[LevelsParams]  # type: ignore[assignment]
    kind: ClassVar[str] = "levels"

    def __init__(self, inner: Calibrator) -> None:
        check_wrappable(inner, "multi-level")
        if isinstance(inner, WrappedCalibrator):
            raise InvalidInput("levels wrap a method, not another wrapper: write "
                               "mondrian:levels:METHOD")
        self.inner = inner
        self.name = f"levels:{inner.name}"
        self.version = f"{LEVELS_VERSION}/{inner.version}"
        self.privacy_model = inner.privacy_model
        self.Params = params_class(LevelsParams, inner)  # type: ignore[assignment]
        self.inputs = inner.inputs
        self.summary = f"{inner.name} at several levels α at once"
        self.neighbouring = getattr(inner, "neighbouring", None)
        self.privacy_statement = getattr(inner, "privacy_statement", None)
        self.local_statement = getattr(inner, "local_statement", None)

    def cost(self, params: LevelsParams, shape: DataShape) -> Any:
        """The sum of the k runs' costs (module docstring), or None if the method is
        non-private."""
        costs = [self.inner.cost(p, shape) for _, p in params.per_level()]
        if all(c is None for c in costs):
            return None
        if any(c is None for c in costs):
            raise InvalidInput(f"{self.inner.name} is private at some levels only")
        return sum(costs)  # type: ignore[arg-type]

    own_version = LEVELS_VERSION
    older_versions = _OLDER
    _wording = LEVELS_VERSION

    def _level_text(self, g: CoverageGuarantee) -> str:
        """``coverage ≥ L[ w.p. ≥ P]`` of one level, in this wrapper's wording."""
        fail = g.failure_probability
        if self._wording in _ROUNDED_TO_NEAREST:
            return f"coverage ≥ {g.lower:.6g}" + (f" w.p. ≥ {1 - fail:.6g}" if fail else "")
        return (f"coverage ≥ {text_at_most(g.lower, Fraction(repr(g.lower)))}"
                + (f" w.p. ≥ {text_at_most(1 - fail, 1 - Fraction(repr(fail)))}"
                   if fail else ""))

    def guarantee(self, params: LevelsParams, shape: DataShape) -> CoverageGuarantee:
        """The smallest α's guarantee as the headline; every level's numbers in details."""
        per = [(a, self.inner.guarantee(p, shape)) for a, p in params.per_level()]
        nested = self._wording not in _OLDER and any(g.upper is not None for _, g in per[:-1])
        if nested:
            per = _nested_uppers(per)
        head = per[0][1]
        details: dict[str, float | int | str | None] = {
            "levels": ",".join(f"{a:g}" for a, _ in per)}
        for a, g in per:
            put_details(details, level_key(a), g)
        return CoverageGuarantee(
            target=head.target, lower=head.lower, upper=head.upper,
            failure_probability=head.failure_probability, over=head.over, rank=head.rank,
            statement=f"{len(per)} levels; at α={per[0][0]:g}: {head.statement}; "
            + "; ".join(f"at α={a:g}: {self._level_text(g)}" for a, g in per[1:])
            + ("; a level's upper bound is the largest of its own run's and every larger α's, "
               "and holds only under all of their conditions (its threshold is raised to the "
               "largest of theirs)" if nested else ""),
            details=details,
        )

    def only_infinite(self, params: LevelsParams, shape: DataShape) -> bool:
        """Whether every level can only release +∞: the headline is the smallest α's alone,
        and a larger α's level may be finite (red team 20, coverage F1)."""
        return all(inner_only_infinite(self.inner, p, shape, self.inner.guarantee(p, shape))
                   for _, p in params.per_level())

    def check_record(self, params: LevelsParams, shape: DataShape, threshold: float,
                     diagnostics: dict[str, Any]) -> list[str]:
        """What ``audit verify`` checks of a stored release beyond its guarantees: one
        entry per level, nested thresholds the running maximum of the raw ones, the
        release's threshold the first (largest)."""
        from privcal.calibrators.group_sets import _float

        levels = diagnostics.get("levels")
        if not isinstance(levels, list) or [x.get("alpha") for x in levels] != list(params.alpha):
            return ["diagnostics.levels: not one entry per level α"]
        raw = [_float(x.get("threshold_raw")) for x in levels]
        nested = [_float(x.get("threshold")) for x in levels]
        if nested != [max(raw[i:]) for i in range(len(raw))]:
            return ["diagnostics.levels: thresholds are not the nested maxima of the raw ones"]
        if threshold != nested[0]:
            return [f"threshold {threshold} is not the smallest α's ({nested[0]})"]
        return []

    def check_inputs(self, params: LevelsParams, data: CalibrationInput) -> None:
        """The inner method's input rules (:func:`~privcal.calibrators.base.check_inputs`,
        its own ``check_inputs`` if a plugin has one), before anything is charged: every
        level runs on the same data, so the first level's parameters check it."""
        base_check_inputs(self.inner, params.per_level()[0][1], data)

    def calibrate(self, data: CalibrationInput, params: LevelsParams,
                  rng: random.Random) -> CalibrationResult:
        """One run per level (fresh noise each), thresholds made nested (module docstring)."""
        runs = [(a, self.inner.calibrate(data, p, rng)) for a, p in params.per_level()]
        raw = [float(r.threshold) for _, r in runs]
        nested = [max(raw[i:]) for i in range(len(raw))]
        return CalibrationResult(threshold=nested[0], diagnostics={"levels": [
            {"alpha": a, "threshold": t, "threshold_raw": t_raw, "diagnostics": r.diagnostics}
            for (a, r), t, t_raw in zip(runs, nested, raw, strict=True)
        ]})
