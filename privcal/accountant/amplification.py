"""When a shuffled local-DP release may claim amplification, and for which n (SHUFFLE.md).

- ``ldp-score``: one binary-RR bit per user; each round's group of n' users is
  its own shuffle, and the protocol's central guarantee is the worst round's
  (parallel composition over disjoint groups).
- ``fedcp2-qq``: one exponential-mechanism bin per agent, shuffled over the m
  agents (a generic ε0-LDP randomizer).
- ``ldp-label``: the report is (x, ỹ) with x in the clear. Only when the caller
  asserts that features are not linkable to identities is k-RR amplification
  claimed, and the assumption is recorded.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from privcal.calibrators.base import CalibratorParams, DataShape
from privcal.costs import ApproxDP
from privcal.errors import InvalidInput


def shuffled_guarantee(
    method: str,
    params: CalibratorParams,
    shape: DataShape,
    delta: Decimal | float,
    *,
    assume_unlinkable_features: bool = False,
) -> tuple[ApproxDP | None, dict[str, Any]]:
    """The amplified central (ε, δ) of a shuffled local release, and what to record about it.

    Returns ``(None, record)`` when no bound improves on ε0. Raises
    :class:`InvalidInput` when the method cannot be shuffled, or when ``ldp-label``
    lacks the explicit unlinkable-features assumption.
    """
    from privcal.accountant.shuffle import amplified_cost

    eps0 = float(params.epsilon)  # type: ignore[attr-defined]
    d = float(delta)
    assumption = None
    if method == "ldp-score":
        from privcal.calibrators.ldp_score import open_protocol

        n_shuffled = open_protocol(params, shape.n).group_size  # type: ignore[arg-type]
        randomizer, k, unit = "binary-rr", None, f"per round (each round's {n_shuffled} users)"
    elif method == "fedcp2-qq":
        n_shuffled = len(shape.group_sizes or ()) or shape.n
        randomizer, k, unit = "generic", None, f"over the {n_shuffled} agents"
    elif method == "ldp-label":
        if not assume_unlinkable_features:
            raise InvalidInput(
                "ldp-label sends features in the clear: a shuffler hides nothing if they identify "
                "users; pass --assume-unlinkable-features to assert they do not (it is recorded)"
            )
        n_shuffled = shape.n
        randomizer, k, unit = "krr", shape.k, f"over the {n_shuffled} users"
        assumption = "features are not linkable to identities (asserted by the requester)"
    else:
        raise InvalidInput(
            f"{method} has no shuffled variant (only ldp-score, ldp-label, fedcp2-qq)"
        )
    if n_shuffled < 1:
        raise InvalidInput(f"{method}: no reports to shuffle")
    cost, result = amplified_cost(eps0, n_shuffled, d, randomizer, k=k)
    record: dict[str, Any] = {
        "shuffled": True,
        "scope": unit,
        "n_shuffled": n_shuffled,
        "randomizer": randomizer,
        "amplification": result.model_dump(mode="json"),
    }
    if assumption:
        record["assumption"] = assumption
    return cost, record
