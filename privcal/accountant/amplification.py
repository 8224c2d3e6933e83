"""When a shuffled local-DP release may claim amplification, and for which n (SHUFFLE.md).

Amplification is claimed only where the theorem's assumptions hold (issue 14.6):

- ``ldp-score``: one binary-RR bit per user, and that bit is the user's *whole* input to
  the protocol; each round's group of n' users is its own shuffle, and the protocol's
  central guarantee is the worst round's (parallel composition over disjoint groups).
  This is the setting of the bounds in :mod:`privcal.accountant.privacy.shuffle` (an ε0-LDP
  randomizer applied once to each of n users' data, Feldman, McMillan & Talwar 2021).
- ``fedcp2-qq`` is **refused**. An agent's exponential-mechanism message is ε-DP with
  respect to one *record* of the agent's n records, not an ε0-local randomizer of the
  agent's whole input; the shuffle bound needs the latter. Its record-level guarantee is
  not amplified in the way the bound assumes: with m = 10⁴ agents, n = 2 000, ε = 1 the
  bound would claim (0.053, 10⁻⁶) while an adversary whose other agents hold all-zero
  scores reaches δ ≥ 0.0709 at that ε (issue 14.6).
- ``ldp-label`` is **refused**, with or without ``assume_unlinkable_features``. The report
  is (x, ỹ) with x in the clear; under label-DP, neighbouring datasets differ in the
  victim's *label* only, so they share the victim's features, and the adversary finds the
  victim's report among the shuffled ones by its x. Unlinkability of features to
  identities does not help: the neighbour relation itself links them. Its proven
  guarantee is the unshuffled ε0-label-LDP.

A refused method keeps its local guarantee: run it without shuffling.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from privcal.calibrators.base import CalibratorParams, DataShape
from privcal.costs import ApproxDP
from privcal.errors import BudgetRefused, InvalidInput


def check_shuffle_method(method: str, *, assume_unlinkable_features: bool = False) -> None:
    """Refuse a shuffled run of a method whose amplification is not proven (module docstring);
    needs only the method's name, so it runs before any planning or charging."""
    if method == "fedcp2-qq":
        raise InvalidInput(
            "fedcp2-qq cannot be shuffled: an agent's message is ε-DP for one record, not an "
            "ε0-local randomizer of the agent's whole input, so the shuffle bound does not "
            "apply (issue 14.6); run it without shuffling"
        )
    elif method == "ldp-label":
        raise InvalidInput(
            "ldp-label cannot be shuffled: label-DP neighbours share the victim's features, "
            "which travel in the clear, so the shuffler hides nothing"
            + (" (assuming unlinkable features does not change this)"
               if assume_unlinkable_features else "")
            + "; run it without shuffling"
        )
    elif method != "ldp-score":
        raise InvalidInput(f"{method} has no shuffled variant (only ldp-score)")
    if assume_unlinkable_features:
        raise InvalidInput("assume_unlinkable_features applies to no ldp-score report")


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
    :class:`InvalidInput` for every method but ``ldp-score`` (see the module docstring),
    and for ``assume_unlinkable_features``, which no remaining method uses.
    """
    from privcal.accountant.privacy.shuffle import amplified_cost

    check_shuffle_method(method, assume_unlinkable_features=assume_unlinkable_features)
    from privcal.calibrators.ldp_score import open_protocol

    n_shuffled = open_protocol(params, shape.n).group_size  # type: ignore[arg-type]
    if n_shuffled < 1:
        raise InvalidInput(f"{method}: no reports to shuffle")
    cost, result = amplified_cost(float(params.epsilon), n_shuffled,  # type: ignore[attr-defined]
                                  float(delta), "binary-rr")
    record: dict[str, Any] = {
        "shuffled": True,
        "scope": f"per round (each round's {n_shuffled} users)",
        "n_shuffled": n_shuffled,
        "randomizer": "binary-rr",
        "amplification": result.model_dump(mode="json"),
    }
    return cost, record


def check_shuffled_dataset(ds: Any) -> None:
    """Refuse a shuffled run on a dataset whose cap cannot be charged its amplified cost.

    A shuffled release claims an amplified central (ε, δ) (SHUFFLE.md); privcal records only
    what it charged (issue 14.5), and an (ε, δ) cost can be charged only to an (ε, δ) cap: a
    pure-ε cap cannot hold δ > 0, and an (ε, δ) guarantee implies no ρ-zCDP bound. No Rényi
    or zCDP amplification-by-shuffling bound is implemented, so the run is refused (the same
    run without shuffling is recorded with its proven local guarantee).
    """
    if ds.notion != "approx":
        kind = "pure-ε" if ds.notion == "pure" else "ρ-zCDP"
        raise BudgetRefused(
            f"a shuffled run is charged its amplified (ε, δ) to the dataset, and dataset "
            f"{ds.name!r} has a {kind} cap, which cannot be charged an (ε, δ) cost: use a "
            "dataset with an (ε, δ) cap, or run without shuffling (local guarantee only)",
            scope=f"dataset {ds.name!r}", asked="amplified (ε, δ)", remaining="",
        )
