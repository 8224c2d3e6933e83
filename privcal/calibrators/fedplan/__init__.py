"""Planning one-shot federated calibration: FedCP-QQ and FedCP²-QQ (SPEC §9, §10).

Humbert, Le Bars, Bellet, Arlot, *One-Shot Federated Conformal Prediction*,
ICML 2023 (seed 002). m agents each send one local order statistic; the server
takes an order statistic of the m messages. Everything here is public: it
depends on (m, n, α, ε, B) only, never on data.

One concern per module:

- :mod:`~privcal.calibrators.fedplan.coverage` — the exact coverage M_{ℓ,k}
  (Thm 3.2, eq. (5)), its quadrature, the memo of M values;
- :mod:`~privcal.calibrators.fedplan.selection` — Algorithm 1's (ℓ*, k*) at a level;
- :mod:`~privcal.calibrators.fedplan.plan_qq` — FedCP-QQ plans, and the server
  order for fewer answering agents;
- :mod:`~privcal.calibrators.fedplan.unequal` — agents of different sizes (App. A.1);
- :mod:`~privcal.calibrators.fedplan.gamma_search` — FedCP²-QQ's γ search (ℓ_cor,
  warm starts, exact pruning);
- :mod:`~privcal.calibrators.fedplan.plan_qq2` — FedCP²-QQ plans (Algorithm 3);
- :mod:`~privcal.calibrators.fedplan.limits` — resource bounds, argument checks.

This package's namespace is the planning API (the names below); SciPy is
imported only when an M value is computed, so ``privcal.client`` loads none.
"""

from __future__ import annotations

from privcal.calibrators.fedplan.coverage import (
    FEAS_TOL,
    GL_NODES,
    coverage_M,
    coverage_M_array,
    coverage_M_max,
)
from privcal.calibrators.fedplan.gamma_search import GAMMA_GRID, l_correction
from privcal.calibrators.fedplan.limits import MAX_AGENTS, MAX_BINS, MAX_LOCAL_N
from privcal.calibrators.fedplan.plan_qq import (
    FedPlan,
    plan_fedcp_qq,
    plan_fedcp_qq_pinned,
    replan_fedcp_qq_subset,
)
from privcal.calibrators.fedplan.plan_qq2 import (
    Fed2Plan,
    plan_fedcp2_qq,
    plan_fedcp2_qq_pinned,
    replan_fedcp2_qq_subset,
)
from privcal.calibrators.fedplan.unequal import (
    FedPlanUnequal,
    coverage_M_unequal,
    plan_fedcp_qq_unequal,
)

__all__ = [
    "FEAS_TOL",
    "GAMMA_GRID",
    "GL_NODES",
    "MAX_AGENTS",
    "MAX_BINS",
    "MAX_LOCAL_N",
    "Fed2Plan",
    "FedPlan",
    "FedPlanUnequal",
    "coverage_M",
    "coverage_M_array",
    "coverage_M_max",
    "coverage_M_unequal",
    "l_correction",
    "plan_fedcp2_qq",
    "plan_fedcp2_qq_pinned",
    "plan_fedcp_qq",
    "plan_fedcp_qq_pinned",
    "plan_fedcp_qq_unequal",
    "replan_fedcp2_qq_subset",
    "replan_fedcp_qq_subset",
]
