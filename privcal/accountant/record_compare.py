"""How a release's recorded guarantee is recomputed and compared: the one rule of
``privcal audit verify`` (:mod:`privcal.accountant.verification`) and of a saved release's
load check (:mod:`privcal.accountant.saved_release`).

A leaf of the accountant (it imports neither of them: the results module, which
verification imports, imports the saved-release module).
"""

from __future__ import annotations

import json
import math
from typing import Any

from privcal.accountant.normalize import json_safe

__all__ = ["REL_TOL", "coverage_as_recorded", "plain", "same", "zcdp_parts"]

#: recorded floats went through JSON; anything beyond this is a real difference
REL_TOL = 1e-9


def plain(obj: Any) -> Any:
    """What a JSON column gives back: the form in which recorded values are compared."""
    return json.loads(json.dumps(json_safe(obj), default=str))


def same(a: Any, b: Any) -> bool:
    """Equal, numbers within :data:`REL_TOL` (and 1e-12 absolutely), ±∞ and NaN exactly."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b):
            return a == b or (math.isnan(a) and math.isnan(b))
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def coverage_as_recorded(cal: Any, rel: Any) -> tuple[Any, Any, Any]:
    """(params, shape, coverage guarantee) of release ``rel`` as calibrator ``cal`` states
    it for the recorded parameters and shape, by the formula (and, where it has one,
    ``guarantee_as``, the wording) of the calibrator version that made it: an older version
    is recomputed with its ``legacy_params``. Raises what parameter validation raises."""
    params, shape = _inputs(cal, rel)
    as_version = getattr(cal, "guarantee_as", None)
    coverage = (as_version(rel.calibrator_version, params, shape)
                if as_version is not None and rel.calibrator_version != cal.version
                else cal.guarantee(params, shape))
    return params, shape, coverage


def _inputs(cal: Any, rel: Any) -> tuple[Any, Any]:
    """(params, shape) of release ``rel`` as calibrator ``cal`` validates them (an older
    version's with its ``legacy_params``)."""
    from privcal.accountant.prepare import validate_params
    from privcal.calibrators.base import DataShape

    legacy = getattr(cal, "legacy_params", {}).get(rel.calibrator_version)
    params = validate_params(cal, {**(legacy or {}), **rel.params})
    return params, DataShape.model_validate(rel.shape)


def zcdp_parts(cal: Any, rel: Any, privacy: Any, notion: str) -> list[Any] | None:
    """The ε of the pure ε-DP mechanisms whose composition is the pure cost of ``privacy``
    (release ``rel``'s privacy record, recorded or recomputed) when its dataset's cap is
    ρ-zCDP (``notion``): a wrapper's separately charged runs
    (:func:`~privcal.calibrators.cost_parts.cost_parts`), else the cost itself; None for
    any other cap or cost. What :func:`~privcal.storage.verify_releases.shortfall` checks
    the pure charges' Σε²/2 against (red team 26, privacy F1)."""
    from privcal.calibrators.cost_parts import cost_parts
    from privcal.calibrators.wrapped import WrappedCalibrator
    from privcal.costs import PureDP, parse_cost

    doc = privacy.get("cost") if isinstance(privacy, dict) else None
    if notion != "zcdp" or not isinstance(doc, dict) or doc.get("kind") != "pure":
        return None
    try:
        cost = parse_cost(doc)
    except ValueError:  # shortfall says the cost cannot be read
        return None
    assert isinstance(cost, PureDP)
    if not isinstance(cal, WrappedCalibrator):  # not a wrapper of separate runs: one
        return [cost.eps]
    params, shape = _inputs(cal, rel)
    return [p.eps for p in cost_parts(cal, params, shape, cost) or [cost]]
