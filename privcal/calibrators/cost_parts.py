"""A release's cost as the composition of its pure ε-DP parts, each charged as its own event.

``levels:exponq`` runs k independent ε-DP mechanisms (one per level α, fresh noise each),
and records their basic composition, ``PureDP(kε)`` — true. Charged as *one* pure event, a
ρ-zCDP cap counted it (kε)²/2: Bun & Steinke 2016, Prop. 1.4, applied to the sum. But each
run is ε-DP, hence ε²/2-zCDP (Prop. 1.4), and zCDP composes additively (their Lemma 2.3):
the k runs are kε²/2-zCDP, k times less (red team 25, privacy2 F1: 3 levels at ε = 1 were
charged ρ = 4.5 for 1.5). So the accountant charges each part as its own pure event, all in
one transaction (:func:`privcal.accountant.charges.charge_parts`): a pure cap counts Σε (as
before), the (ε, δ) filter's pure part Σε (as before), a zCDP cap Σε²/2. The release still
records its whole cost, and its charges add up to it exactly (the "paid for" check,
:func:`privcal.storage.verify_releases.shortfall`, sums them), so nothing recorded changes.

``mondrian:levels:exponq``: the groups' runs at one level are parallel (one charge, the
largest ε over the groups: McSherry 2009, Theorem 4, under the recorded ``public_groups``
condition), and the levels compose: part j is the largest of the groups' level-j costs. The
parts are used only when they add up *exactly* to the cost the release records (Σ_j max_g
= max_g Σ_j, as when every group's ε is the same — ExponQ's ε does not depend on n);
otherwise the cost is charged whole, as before (never less than is recorded).

zCDP parts (``levels:pcoqs``) are not split: Σρ charged once is the same total.
"""

from __future__ import annotations

from decimal import localcontext
from typing import Any

from privcal.calibrators.base import DataShape
from privcal.costs import PureDP, fixed_context

__all__ = ["cost_parts"]

_EXACT = fixed_context(80)


def _parts(calibrator: Any, params: Any, shape: DataShape) -> list[PureDP] | None:
    """The pure parts of a wrapper's cost (module docstring), or None."""
    from privcal.calibrators.levels import Levels
    from privcal.calibrators.mondrian import Mondrian

    if isinstance(calibrator, Levels):
        costs = [calibrator.inner.cost(p, shape) for _, p in params.per_level()]
        return costs if all(isinstance(c, PureDP) for c in costs) else None
    if isinstance(calibrator, Mondrian):
        p = params.inner_params()
        per = [_parts(calibrator.inner, p, DataShape(n=n, k=shape.k))
               for n in calibrator.charged_sizes(params, shape)]
        if not per or any(x is None for x in per) or len({len(x) for x in per}) != 1:  # type: ignore[arg-type]
            return None
        return [PureDP(max(x[j].eps for x in per))  # type: ignore[index]
                for j in range(len(per[0]))]  # type: ignore[arg-type]
    return None


def cost_parts(calibrator: Any, params: Any, shape: DataShape, cost: Any) -> list[PureDP] | None:
    """The ≥ 2 pure ε-DP costs whose composition is ``cost`` (the release's, from
    ``calibrator.cost(params, shape)``), one per independent run, to be charged as separate
    events (module docstring); None when the cost is charged whole."""
    if not isinstance(cost, PureDP):
        return None
    parts = _parts(calibrator, params, shape)
    if parts is None or len(parts) < 2:
        return None
    with localcontext(_EXACT):
        total = sum((c.eps for c in parts), start=parts[0].eps * 0)
    return parts if total == cost.eps else None
