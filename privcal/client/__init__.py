"""What runs on a user's device or a federated agent: randomizers, scores, agent messages.

No database, no ledger: this module imports only numpy/scipy code, so it can ship
inside an app or a hospital's agent. The one-report randomizers (``krr``, ``binary_rr``)
draw from the operating system's CSPRNG unless given an explicit generator (for
reproducible tests); the vectorised ``krr_many``/``binary_rr_many`` from a NumPy generator
seeded with 128 bits of it unless given one.

Local DP (Penso et al., seed 004):

- LDP-CP-L: a user sends ``krr(label, k, eps)``, k-ary randomized response
  keeping the label with probability e^ε/(e^ε+k−1).
- LDP-CP-S: a user in the round's group answers ``binary_rr(score <= q, eps)``
  for the published threshold q, keeping the bit with probability e^ε/(e^ε+1).

HTTP (``privcal serve``): :class:`Reporter` (a device) and :class:`Agent` (a federated agent),
see :mod:`privcal.client.http`; give them ``memo=PATH`` (a file kept with the app's data) so
that no second randomized answer for a session ever leaves the device, and ``max_epsilon=``
so that a server cannot ask for a (nearly) unrandomized one.

Scores: a user or agent with a regressor computes its own scores with
``regression_scores("absolute", y, preds=f)`` (or ``"cqr"`` with ``lower_preds``/``upper_preds``),
and a classifier's with ``label_scores``, with the score (and options) the session names:
``Reporter.score()``/``Agent.score()`` (``params.score`` in its public state, set at
``privcal session open --score``). Its release records that score, and predict uses it and refuses
another; a session opened without one records none, and predict then needs ``--score``.

Federated (Humbert et al., seed 002): an agent sends ``fedcp_qq_message(scores, plan)``
(its ℓ-th smallest score) or ``fedcp2_qq_message(scores, plan)`` (an ε-DP bin from the
public grid on [lower, upper]).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from privcal import lazy_getattr

# names are imported on first use: `import privcal.client` loads neither numpy/SciPy nor
# httpx until a randomizer or the HTTP client is asked for
_EXPORTS = {
    "SCORES": "privcal.calibrators.scores",
    "all_class_scores": "privcal.calibrators.scores",
    "label_scores": "privcal.calibrators.scores",
    "regression_scores": "privcal.calibrators.scores",
    "bin_grid": "privcal.calibrators.federated_agent",
    "fedcp2_qq_message": "privcal.calibrators.federated_agent",
    "fedcp_qq_message": "privcal.calibrators.federated_agent",
    "binary_rr": "privcal.calibrators.mechanisms.randomized_response",
    "binary_rr_many": "privcal.calibrators.mechanisms.randomized_response",
    "krr": "privcal.calibrators.mechanisms.randomized_response",
    "krr_many": "privcal.calibrators.mechanisms.randomized_response",
    "Reporter": "privcal.client.http",
    "Agent": "privcal.client.http",
    "ServiceError": "privcal.client.transport",
    "PlanRejected": "privcal.errors",
    "InvalidInput": "privcal.errors",
}

if TYPE_CHECKING:  # pragma: no cover
    from privcal.calibrators.federated_agent import bin_grid, fedcp2_qq_message, fedcp_qq_message
    from privcal.calibrators.mechanisms.randomized_response import (
        binary_rr,
        binary_rr_many,
        krr,
        krr_many,
    )
    from privcal.calibrators.scores import (
        SCORES,
        all_class_scores,
        label_scores,
        regression_scores,
    )
    from privcal.client.http import Agent, Reporter
    from privcal.client.transport import ServiceError
    from privcal.errors import InvalidInput, PlanRejected


__getattr__ = lazy_getattr(__name__, _EXPORTS)


__all__ = [
    "SCORES",
    "Agent",
    "InvalidInput",
    "PlanRejected",
    "Reporter",
    "ServiceError",
    "all_class_scores",
    "bin_grid",
    "binary_rr",
    "binary_rr_many",
    "fedcp2_qq_message",
    "fedcp_qq_message",
    "krr",
    "krr_many",
    "label_scores",
    "regression_scores",
]
