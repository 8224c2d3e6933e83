"""The pure privacy mathematics: no database, no SQLAlchemy, no accountant, no calibrator.

- :mod:`~privcal.accountant.privacy.conversions`: pure → zCDP → (ε, δ) (CKS20), and how a
  figure is rounded for reporting;
- :mod:`~privcal.accountant.privacy.filters`: the composition filters that enforce a
  dataset's cap (a charge is accepted or refused here);
- :mod:`~privcal.accountant.privacy.guarantees`: what a cap guarantees, and the realized
  spend (labelled as an odometer reading, not a guarantee);
- :mod:`~privcal.accountant.privacy.shuffle` (with its numerics in
  :mod:`~privcal.accountant.privacy.shuffle_bounds`): amplification by shuffling. Not
  re-exported here, so that the accountant does not load NumPy and SciPy for it.

The names of the first three are re-exported, so ``from privcal.accountant import privacy``
gives the accountant (and a reader) the whole rule book in one namespace. These modules
import only :mod:`privcal.costs` and :mod:`privcal.errors` from privcal
(``tests/test_privacy_imports.py``).
"""

from __future__ import annotations

from privcal.accountant.privacy.conversions import (
    REPORT_DIGITS,
    check_delta,
    cks20_epsilon,
    cks20_objective,
    cks20_order,
    dstr,
    round_up,
    simple_zcdp_epsilon,
)
from privcal.accountant.privacy.filters import (
    DEFAULT_RENYI_ORDERS,
    DELTA_SPLIT,
    MAX_RENYI_ORDERS,
    MIGRATED_RENYI_ORDERS,
    Notion,
    Policy,
    Spent,
    approx_usage,
    check_charge,
    remaining,
    renyi_filter_epsilon,
    renyi_filter_term,
    renyi_orders,
    used,
    within_cap,
)
from privcal.accountant.privacy.guarantees import (
    REALIZED_NOTE,
    Guarantee,
    SpentEpsilon,
    filter_guarantee,
    spent_epsilon,
)

__all__ = [
    "DEFAULT_RENYI_ORDERS",
    "DELTA_SPLIT",
    "MAX_RENYI_ORDERS",
    "MIGRATED_RENYI_ORDERS",
    "REALIZED_NOTE",
    "REPORT_DIGITS",
    "Guarantee",
    "Notion",
    "Policy",
    "Spent",
    "SpentEpsilon",
    "approx_usage",
    "check_charge",
    "check_delta",
    "cks20_epsilon",
    "cks20_objective",
    "cks20_order",
    "dstr",
    "filter_guarantee",
    "remaining",
    "renyi_filter_epsilon",
    "renyi_filter_term",
    "renyi_orders",
    "round_up",
    "simple_zcdp_epsilon",
    "spent_epsilon",
    "used",
    "within_cap",
]
