"""The public score range a private method is told, made explicit and recorded.

The private methods that search or bin the score axis (pcoqs, exponq, fedcp2-qq,
ldp-score) take a public range [``lower``, ``upper``] as parameters; split conformal
and FedCP-QQ assume none (order statistics of the raw scores). A regression
user's residuals are rarely inside the methods' default [0, 1], so the range is
an assumption the user should state: ``score_range=(lo, hi)`` (``--score-range
lo,hi``) sets both ends; otherwise the method's parameters, or its defaults,
apply, and the release records which (``diagnostics["score_range"]``).

No score is ever clipped into the range by privcal (each method's module
docstring, "no score range is assumed"): a score above ``upper`` can only push
the release to +∞ (the top of the range is never released as a finite
threshold), and a score below ``lower`` only makes the threshold larger. So a
wrong range costs efficiency (wide or infinite intervals), never coverage.
"""

from __future__ import annotations

import math
from typing import Any

from privcal.errors import InvalidInput, check_number_text

__all__ = [
    "OUTSIDE_RANGE",
    "check_range_arithmetic",
    "has_range",
    "parse_score_range",
    "range_record",
    "resolve_score_range",
]

#: what happens to scores outside the range, in words (recorded with the range)
OUTSIDE_RANGE = (
    "scores are not clipped: a score above upper can only make the release +inf, a score "
    "below lower only makes the threshold larger; coverage holds either way"
)


def check_range_arithmetic(lower: float, upper: float) -> None:
    """ValueError (a parameter validator's) for a score range without lower < upper, or
    whose width or midpoint overflows a float — the searches bisect at (lo + hi)/2 and bin
    by the width (red team 21, service F1: an ldp-score session on [1e308, 1.7e308] asked
    its devices about +∞, then failed every report of the round; P-COQS on it released +∞
    under a statement of coverage ≤ 0.909)."""
    try:
        lower, upper = float(lower), float(upper)
    except (TypeError, ValueError, OverflowError):
        return  # not numbers: the parameters' own validation says so
    if not lower < upper:
        raise ValueError(f"score range needs lower < upper, got [{lower}, {upper}]")
    # twice each end finite: then every interval [lo, hi] inside the range has a finite
    # width and sum, as the searches narrow it (the review of red team 21: checking the
    # whole range's alone left [0, 1.348e308], whose later midpoints overflowed)
    if not (math.isfinite(2 * lower) and math.isfinite(2 * upper)):
        raise ValueError(f"score range [{lower}, {upper}] too wide or too far from 0: its "
                         "width or a midpoint overflows a float (|lower|, |upper| ≤ 8.9e307)")


def has_range(params_model: type) -> bool:
    """Whether a calibrator's parameters name a public score range (``lower`` and ``upper``)."""
    fields = getattr(params_model, "model_fields", {})
    return "lower" in fields and "upper" in fields


def parse_score_range(value: Any) -> tuple[float, float]:
    """``(lo, hi)`` from a pair of numbers or the text ``"lo,hi"``; finite, lo < hi."""
    if isinstance(value, str):
        parts = value.split(",")
        if len(parts) != 2:
            raise InvalidInput(f"--score-range takes LO,HI (e.g. 0,5), got {value!r}")
        try:  # float("1_0") is 10 and float("１") 1 (red team 10): plain numbers only
            for p in parts:
                check_number_text(p, "score range")
            pair = (float(parts[0]), float(parts[1]))
        except ValueError:
            raise InvalidInput(f"--score-range takes two plain numbers LO,HI, got "
                               f"{value!r}") from None
    else:
        try:
            lo, hi = value
            for v in (lo, hi):
                if isinstance(v, bytes | bytearray | bool):
                    raise TypeError(v)
                if isinstance(v, str):
                    check_number_text(v, "score range")
            pair = (float(lo), float(hi))
        except (TypeError, ValueError, OverflowError):
            raise InvalidInput(f"score_range must be a pair (lo, hi), got {value!r:.60}") from None
    lo, hi = pair
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise InvalidInput(f"score range must be finite, got [{lo}, {hi}]")
    if not lo < hi:
        raise InvalidInput(f"score range needs lo < hi, got [{lo}, {hi}]")
    return lo, hi


def resolve_score_range(
    name: str, params_model: type, params: dict[str, Any], score_range: Any
) -> tuple[dict[str, Any], str | None]:
    """The parameters with ``score_range`` applied as ``lower``/``upper``, and where the range
    comes from: ``"score_range"``, ``"parameters"`` or ``"method default"`` (None when the
    method assumes no range; then ``score_range`` is refused rather than ignored)."""
    if not has_range(params_model):
        if score_range is not None:
            raise InvalidInput(f"{name} assumes no score range (it uses order statistics of the "
                               "raw scores); --score-range does not apply")
        return params, None
    aliases = _aliases(params_model)
    given = sorted(k for k, v in params.items() if v is not None and aliases.get(k) in
                   ("lower", "upper"))
    if score_range is None:
        return params, "parameters" if given else "method default"
    if given:
        raise InvalidInput("give the score range once: --score-range or "
                           + ", ".join("--" + k.replace("_", "-") for k in given))
    lo, hi = parse_score_range(score_range)
    return {**params, "lower": lo, "upper": hi}, "score_range"


def range_record(params: Any, source: str) -> dict[str, Any]:
    """What a release records about its range: the validated ``lower``/``upper``, the source,
    and what happens to scores outside it (:data:`OUTSIDE_RANGE`)."""
    return {"lower": float(params.lower), "upper": float(params.upper), "source": source,
            "outside": OUTSIDE_RANGE}


def _aliases(params_model: type) -> dict[str, str]:
    """Every accepted spelling of a field (its name and validation aliases) → the field."""
    out: dict[str, str] = {}
    for field_name, field in params_model.model_fields.items():  # type: ignore[attr-defined]
        out[field_name] = field_name
        for choice in getattr(field.validation_alias, "choices", ()) or ():
            if isinstance(choice, str):
                out[choice] = field_name
    return out
