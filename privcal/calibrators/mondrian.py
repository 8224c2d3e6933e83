"""Class-conditional (Mondrian) private calibration: one threshold per class or group.

``mondrian:METHOD`` splits the calibration rows by a public group — the label
(``group_by="label"``: label-conditional sets) or a column the caller supplies
(``group_by="column"``) — and runs METHOD on each group's rows alone, with that group's
n. A test point of group g gets {y : S(x, y) ≤ t_g}; with ``group_by="label"`` the
label y is in the set iff S(x, y) ≤ t_y (Vovk et al. 2005, "Algorithmic Learning in a
Random World", §4.5, Mondrian conformal predictors; Sadinle, Lei & Wasserman 2019, §4.3
for the class-conditional guarantee).

**Coverage.** Within group g the calibration rows and a test point of group g are
exchangeable, so METHOD's guarantee at n_g holds conditionally on the group:
P(Y ∈ C(X) | G = g) ≥ lower_g, with probability ≥ 1 − δ_g over METHOD's noise. All
groups' bounds hold at once with probability ≥ 1 − Σ δ_g (union bound), and then the
marginal coverage, a mixture of the groups', is ≥ min_g lower_g: that is the headline.
A group with no rows, or too few for METHOD to be run at its n_g (METHOD's own guarantee
refuses it), gets threshold +∞ — every label, coverage 1 — never a clipped finite value.
Each group's n, threshold and guarantee are recorded (``coverage.details["group g: …"]``,
recomputed by ``audit verify``; thresholds in ``diagnostics["groups"]``).

**Several levels** (``mondrian:levels:METHOD``). As for ``levels:METHOD``, the release's
single threshold is the smallest α's, and so are the headline ``lower`` and
``failure_probability`` (the smallest α's bound, min over groups, and Σ δ_g); the
statement states every level ("2 levels; at α=0.1: for each of the … groups …; at α=0.2:
…"), each level's bound being min_g lower_g(α) with probability ≥ 1 − Σ_g δ_g(α). Version
1.0.0 of this wrapper stated the smallest α's only, without saying so, and rounded the
bound and 1 − Σ δ_g to nearest (1.1.0 rounds both down); ``audit verify`` recomputes a 1.0.0
release in its own wording (:meth:`Mondrian.guarantee_as`).

**Privacy: parallel composition, on one condition.** If every record's group is public
(or fixed in advance, e.g. a stratified sample), the neighbouring datasets of the claim
differ in one record *within its group*: the group sizes n_g do not change, and only one
group's run sees a different input. Runs on disjoint parts of the data are then charged
once, at the largest per-group cost — the method's cost (McSherry 2009, "Privacy
Integrated Queries", Theorem 4; Dwork & Roth 2014, §2.3; for zCDP the same argument
with Rényi divergences). Charging per group would over-charge.

The condition is not free. If the group (e.g. the label) of a record were private, a
neighbour could move a record from one group to another, changing two groups' inputs
*and* their sizes — and the n_g this release records (each per-group mechanism uses its
n_g, which the claim treats as public like every method's n) would themselves disclose
the group counts. privcal therefore does not decide it: the caller asserts it
(``public_groups=True``, ``--public-groups``), for the label as for a column; the
assertion is stored in the release's parameters, and its privacy record states the
neighbouring relation ("each record's group, hence every n_g, public"). Without the
assertion nothing is charged. A release of a group never seen in calibration does not
exist: predicting for it is an error.
"""

from __future__ import annotations

import dataclasses
import math
import random
from fractions import Fraction
from types import SimpleNamespace
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

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
from privcal.calibrators.bound_floats import float_at_least, text_at_most
from privcal.calibrators.levels import level_bounds
from privcal.calibrators.wrapped import (
    WordedWrapper,
    WrappedParams,
    check_wrappable,
    inner_dump,
    max_cost,
    params_class,
    put_details,
)
from privcal.errors import InvalidInput

__all__ = ["MONDRIAN_VERSION", "NEIGHBOURING", "Mondrian", "MondrianParams"]

#: 1.1.0: a several-level release's statement states every level (1.0.0: the smallest α's),
#: its numbers rounded down (1.0.0: to nearest)
MONDRIAN_VERSION = "1.1.0"
#: the versions before: recomputed by their own wording (:meth:`Mondrian.guarantee_as`)
_OLDER = ("1.0.0",)
#: at most this many groups in one release
MAX_GROUPS = 10_000

NEIGHBOURING = (
    "substitution of one record within its group: every record's group — hence each "
    "group's size n_g — is public or fixed in advance, as the caller asserted "
    "(public_groups=True); each group's rows are one disjoint input (parallel composition)"
)


class MondrianParams(WrappedParams):
    """The groups (public, in order), what they are, the caller's assertion, and the
    inner method's parameters."""

    alpha: float | tuple[float, ...]  # type: ignore[assignment]
    groups: tuple[str, ...] = Field(min_length=1, max_length=MAX_GROUPS,
                                    description="the group names, in order (public)")
    group_by: Literal["label", "column"] = Field(
        description="'label': the class (label-conditional sets); 'column': a group "
        "column the caller supplied")
    public_groups: bool = Field(
        description="the caller's assertion that every record's group is public or fixed "
        "in advance (the privacy claim rests on it)")

    @model_validator(mode="before")
    @classmethod
    def _inner(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        own = {"groups", "group_by", "public_groups"}
        rest = {k: v for k, v in data.items() if k not in own}
        dumped = inner_dump(cls.inner_model, rest)
        return {**dumped, **{k: data[k] for k in own if k in data}}

    @model_validator(mode="after")
    def _check(self) -> MondrianParams:
        if self.public_groups is not True:
            raise ValueError(
                "Mondrian calibration is charged once only if every record's group is "
                "public or fixed in advance: assert it with public_groups=True "
                "(--public-groups)")
        if any(not isinstance(g, str) or not g for g in self.groups):
            raise ValueError("group names must be non-empty strings")
        if len(set(self.groups)) != len(self.groups):
            raise ValueError("group names must be distinct")
        if self.group_by == "label" and len(self.groups) < 2:
            raise ValueError("label groups are the k ≥ 2 classes")
        return self

    def inner_params(self) -> Any:
        """The inner method's validated parameters."""
        return self.inner_model.model_validate({**self.inner_values(), "alpha": self.alpha})


def _failure(probabilities: list[float]) -> tuple[float, Fraction]:
    """(the float recorded, the exact value) of min(1, Σ δ_g) over the groups' recorded
    δ_g: the float never below the exact sum (``fsum`` rounds to nearest)."""
    exact = min(Fraction(1), sum((Fraction(repr(d)) for d in probabilities), Fraction(0)))
    return float_at_least(min(1.0, math.fsum(probabilities)), exact), exact


def _groups_sentence(group_by: str, bounds: list[tuple[str, float, float]],
                     nearest: bool = False) -> str:
    """The guarantee of every group at once, from each group's (name, lower bound, failure
    probability): the smallest bound, with probability ≥ 1 − Σ δ_g (union bound). Both
    numbers are written rounded down (never above the recorded bound, nor above 1 − Σ δ_g
    exactly: red team 6, δ_g = 1e-7 was stated "with probability ≥ 1"); ``nearest``: both
    rounded to nearest, as wrapper version 1.0.0 wrote them."""
    lower = min(b[1] for b in bounds)
    fail, exact_fail = _failure([b[2] for b in bounds])
    worst = min(bounds, key=lambda b: b[1])
    said = f"{lower:.6g}" if nearest else text_at_most(lower, Fraction(repr(lower)))
    sure = f"{1 - fail:.6g}" if nearest else text_at_most(1 - fail, 1 - exact_fail)
    return (f"for each of the {len(bounds)} {group_by} groups g, P(Y ∈ C(X) | G = g) ≥ "
            f"that group's lower bound (smallest: {said}, group {worst[0]!r}); all "
            f"groups at once with probability ≥ {sure}; "
            f"hence marginal coverage ≥ {said}")


def group_key(name: str) -> str:
    """How a group is named in ``details``: ``group NAME``."""
    return f"group {name}"


def group_release(rel: Any, name: str) -> SimpleNamespace | None:
    """Group ``name`` of the Mondrian release ``rel`` seen as a release of the method that
    ran in it — ``method``, ``shape["n"]``, ``coverage.rank``, ``.failure_probability`` and
    ``.details["tau"]`` — read back from the entries :func:`put_details` wrote under
    :func:`group_key`; None for another release, or a group without a recorded n."""
    method = str(getattr(rel, "method", ""))
    details = dict(getattr(getattr(rel, "coverage", None), "details", None) or {})
    n = details.get(f"{group_key(name)}: n")
    if not method.startswith("mondrian:") or not isinstance(n, int):
        return None

    def of(key: str) -> Any:
        return details.get(f"{group_key(name)}: {key}")

    failure = of("failure_probability")
    return SimpleNamespace(method=method.removeprefix("mondrian:"), shape={"n": n},
                           coverage=SimpleNamespace(
                               rank=of("rank"), details={"tau": of("tau")},
                               failure_probability=float(failure)
                               if isinstance(failure, float | int) else 0.0))


def _rows(data: CalibrationInput, mask: np.ndarray) -> CalibrationInput:
    """One group's rows, without the group column (the inner method sees plain data)."""
    return dataclasses.replace(data, groups=None, group_count=None, **{
        f: np.asarray(getattr(data, f))[mask]
        for f in ("scores", "probs", "labels", "agents", "subjects")
        if getattr(data, f) is not None
    })


class Mondrian(WordedWrapper):
    """METHOD per group, charged once (see the module docstring)."""

    version: str
    Params: type[MondrianParams]  # type: ignore[assignment]
    kind: ClassVar[str] = "mondrian"

    def __init__(self, inner: Calibrator) -> None:
        check_wrappable(inner, "Mondrian")
        if isinstance(inner, Mondrian):
            raise InvalidInput("Mondrian groups cannot be nested: give one group column")
        self.inner = inner
        self.name = f"mondrian:{inner.name}"
        self.version = f"{MONDRIAN_VERSION}/{inner.version}"
        self.privacy_model = inner.privacy_model
        self.Params = params_class(MondrianParams, inner)  # type: ignore[assignment]
        self.inputs = inner.inputs
        self.summary = f"{inner.name} per class or group (Mondrian), charged once"
        self.neighbouring = NEIGHBOURING
        self.privacy_statement = getattr(inner, "privacy_statement", None)
        self.local_statement = getattr(inner, "local_statement", None)

    # ---------------------------------------------------------------- per group
    def _group_guarantee(self, p: Any, n: int, k: int | None) -> CoverageGuarantee | None:
        """The inner method's guarantee at a group's n, or None when it cannot run there
        (no rows, fewer than its ``min_scores``, or the method refuses that n): the group's
        threshold is then +∞."""
        if n < max(1, self.min_scores or 1):
            return None
        try:
            return self.inner.guarantee(p, DataShape(n=n, k=k))
        except InvalidInput:
            return None

    def only_infinite(self, params: MondrianParams, shape: DataShape) -> bool:
        """Whether every group can only release +∞: too few rows for the method, or the
        method's own rule at the group's n."""
        p = params.inner_params()
        for n in self._sizes(params, shape):
            g = self._group_guarantee(p, n, shape.k)
            if g is not None and not inner_only_infinite(self.inner, p,
                                                         DataShape(n=n, k=shape.k), g):
                return False
        return True

    @staticmethod
    def _trivial(p: Any, n: int) -> CoverageGuarantee:
        alpha = min(p.alpha) if isinstance(p.alpha, tuple) else p.alpha
        return CoverageGuarantee(
            target=1 - alpha, lower=1.0, upper=1.0, failure_probability=0.0,
            over="nothing (the set is every label)", rank=None,
            statement=f"{n} point(s): too few for the method; threshold +inf, every set holds "
                      "every label (coverage 1)",
            details={"n": n},
        )

    def _sizes(self, params: MondrianParams, shape: DataShape) -> tuple[int, ...]:
        sizes = shape.group_sizes
        if sizes is None or len(sizes) != len(params.groups):
            raise InvalidInput(f"Mondrian calibration needs the size of each of its "
                               f"{len(params.groups)} groups")
        if sum(sizes) != shape.n:
            raise InvalidInput(f"group sizes add up to {sum(sizes)}, not n = {shape.n}")
        return sizes

    def charged_sizes(self, params: MondrianParams, shape: DataShape) -> list[int]:
        """The n of every group the method runs on (each costs), or the whole n if none."""
        p = params.inner_params()
        return [n for n in self._sizes(params, shape)
                if self._group_guarantee(p, n, shape.k) is not None] or [shape.n]

    # ---------------------------------------------------------------- the protocol
    def cost(self, params: MondrianParams, shape: DataShape) -> Any:
        """The largest per-group cost (parallel composition; module docstring). Groups the
        method cannot run on cost nothing; if none can run, the method's cost at the whole
        n is charged anyway (over-charging is safe, and keeps a release a charged one)."""
        p = params.inner_params()
        costs = [self.inner.cost(p, DataShape(n=n, k=shape.k))
                 for n in self.charged_sizes(params, shape)]
        if all(c is None for c in costs):
            return None
        if any(c is None for c in costs):
            raise InvalidInput(f"{self.inner.name} is private for some groups only")
        return max_cost(costs)

    own_version = MONDRIAN_VERSION
    older_versions = _OLDER
    _wording = MONDRIAN_VERSION

    def guarantee(self, params: MondrianParams, shape: DataShape) -> CoverageGuarantee:
        """Each group's guarantee at its n_g (in details); headline: the smallest lower
        bound, holding with probability ≥ 1 − Σ δ_g (module docstring). Several levels: the
        headline is the smallest α's, and the statement states every level."""
        p = params.inner_params()
        per = []
        for name, n in zip(params.groups, self._sizes(params, shape), strict=True):
            g = self._group_guarantee(p, n, shape.k)
            per.append((name, n, g))
        trivial = {name: self._trivial(p, n) for name, n, g in per if g is None}
        full = [(name, n, g if g is not None else trivial[name]) for name, n, g in per]
        lower = min(g.lower for _, _, g in full)
        fail = _failure([g.failure_probability for _, _, g in full])[0]
        target = full[0][2].target
        details: dict[str, float | int | str | None] = {
            "groups": len(full), "group_by": params.group_by,
            "assumption": "every record's group is public or fixed in advance (asserted)"}
        for name, n, g in full:
            put_details(details, group_key(name), g, n=n)
        statement = _groups_sentence(params.group_by,
                                     [(name, g.lower, g.failure_probability)
                                      for name, _, g in full],
                                     nearest=self._wording in _OLDER)
        if isinstance(params.alpha, tuple) and self._wording not in _OLDER:
            # each level's bound per group: a group the method cannot run on is +∞ at
            # every level (coverage 1, nothing can fail)
            by_group = [[(a, 1.0, 0.0) for a in params.alpha] if g is None
                        else level_bounds(g, params.alpha) for _, _, g in per]
            statement = f"{len(params.alpha)} levels; " + "; ".join(
                f"at α={a:g}: " + _groups_sentence(params.group_by, [
                    (name, b[i][1], b[i][2])
                    for (name, _, _), b in zip(per, by_group, strict=True)])
                for i, a in enumerate(params.alpha))
        return CoverageGuarantee(
            target=target, lower=lower, upper=None, failure_probability=fail,
            over=f"calibration data and test point within each {params.group_by} group "
                 "(exchangeable within the group), and the method's noise",
            rank=None, statement=statement, details=details,
        )

    def check_record(self, params: MondrianParams, shape: DataShape, threshold: float,
                     diagnostics: dict[str, Any]) -> list[str]:
        """What ``audit verify`` checks of a stored release beyond its guarantees: one entry
        per group with the recorded n, +∞ for every group the method cannot run on, each
        group's own record (levels), and the release's threshold the largest."""
        from privcal.calibrators.group_sets import _float

        groups = diagnostics.get("groups")
        sizes = self._sizes(params, shape)
        if not isinstance(groups, list) or [g.get("group") for g in groups] != list(
                params.groups):
            return ["diagnostics.groups: not one entry per group"]
        p = params.inner_params()
        problems = []
        for g, n in zip(groups, sizes, strict=True):
            t = _float(g.get("threshold"))
            if g.get("n") != n:
                problems.append(f"group {g['group']}: n {g.get('n')} ≠ shape's {n}")
            elif self._group_guarantee(p, n, shape.k) is None:
                if t != math.inf:
                    problems.append(f"group {g['group']}: too few points, yet threshold {t}")
            elif hasattr(self.inner, "check_record"):
                problems += [f"group {g['group']}: {m}" for m in self.inner.check_record(
                    p, DataShape(n=n, k=shape.k), t, g.get("diagnostics") or {})]
        top = max(_float(g.get("threshold")) for g in groups)
        if threshold != top:
            problems.append(f"threshold {threshold} is not the largest group's ({top})")
        return problems

    def check_inputs(self, params: MondrianParams, data: CalibrationInput) -> None:
        """The inner method's input rules (:func:`~privcal.calibrators.base.check_inputs`,
        its own ``check_inputs`` if a plugin has one) on all the rows, before anything is
        charged (a group too small for the method is +∞, not an error)."""
        base_check_inputs(self.inner, params.inner_params(), data)

    def calibrate(self, data: CalibrationInput, params: MondrianParams,
                  rng: random.Random) -> CalibrationResult:
        """The inner method on each group's rows; +∞ for a group it cannot run on. The
        release's single threshold is the largest group threshold (a set at it contains
        every group's set, so it is never less conservative)."""
        if data.groups is None or data.group_count != len(params.groups):
            raise InvalidInput("Mondrian calibration needs the group of every row")
        p = params.inner_params()
        k = int(np.shape(data.probs)[1]) if data.probs is not None else None
        groups = np.asarray(data.groups)
        out = []
        for j, name in enumerate(params.groups):
            mask = groups == j
            n = int(mask.sum())
            if self._group_guarantee(p, n, k) is None:
                out.append({"group": name, "n": n, "threshold": math.inf,
                            "diagnostics": {"reason": "too few points for the method"}})
                continue
            res = self.inner.calibrate(_rows(data, mask), p, rng)
            out.append({"group": name, "n": n, "threshold": float(res.threshold),
                        "diagnostics": res.diagnostics})
        return CalibrationResult(threshold=max(g["threshold"] for g in out),
                                 diagnostics={"groups": out})
