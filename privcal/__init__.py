"""privcal — privacy-accountable conformal calibration.

The public API:

- :class:`Ledger` — the SQL ledger (SQLite by default, PostgreSQL with a URL);
- :class:`Accountant` — budgets per dataset and per subject, atomic charges,
  ``calibrate`` (charge, compute, record) and the release log;
- cost values :class:`PureDP`, :class:`ZCDP`, :class:`ApproxDP`, :class:`LocalDP`;
- :mod:`privcal.client` — what runs on a user's device or a federated agent.
"""

__version__ = "0.1.0"

from privcal.accountant import Accountant, BudgetReport, Release
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP
from privcal.errors import (
    AuditFailed,
    BudgetRefused,
    InvalidInput,
    NotFound,
    PrivcalError,
    SchemaOutOfDate,
)
from privcal.storage import Ledger

__all__ = [
    "ZCDP",
    "Accountant",
    "ApproxDP",
    "AuditFailed",
    "BudgetRefused",
    "BudgetReport",
    "InvalidInput",
    "Ledger",
    "LocalDP",
    "NotFound",
    "PrivcalError",
    "PureDP",
    "Release",
    "SchemaOutOfDate",
    "__version__",
]
