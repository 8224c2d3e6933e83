"""privcal — privacy-accountable conformal calibration.

The public API:

- :class:`Ledger` — the SQL ledger (SQLite by default, PostgreSQL with a URL);
- :class:`Accountant` — budgets per dataset and per subject, atomic charges,
  ``calibrate`` (charge, compute, record) and the release log;
- cost values :class:`PureDP`, :class:`ZCDP`, :class:`ApproxDP`, :class:`LocalDP`;
- :mod:`privcal.client` — what runs on a user's device or a federated agent;
- :class:`PrivateConformalClassifier`, :class:`PrivateConformalRegressor` — a fitted model
  wrapped scikit-learn style (:mod:`privcal.estimators`).

Names are imported on first use, so that ``privcal --help`` and the client
module do not pay for SQLAlchemy and SciPy.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"


def lazy_getattr(module: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that imports ``exports[name]`` on first use and
    caches it; used here, by :mod:`privcal.accountant` and by :mod:`privcal.client`, so that
    ``privcal --help``, the device client and ``amplify`` do not pay for SQLAlchemy, SciPy or
    httpx they never touch."""

    def __getattr__(name: str) -> Any:
        source = exports.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(sys.modules[module], name, value)
        return value

    return __getattr__

_EXPORTS = {
    "Accountant": "privcal.accountant",
    "BudgetReport": "privcal.accountant",
    "Release": "privcal.accountant",
    "Ledger": "privcal.storage",
    "ZCDP": "privcal.costs",
    "ApproxDP": "privcal.costs",
    "LocalDP": "privcal.costs",
    "PureDP": "privcal.costs",
    "AuditFailed": "privcal.errors",
    "BudgetRefused": "privcal.errors",
    "InvalidInput": "privcal.errors",
    "NotFound": "privcal.errors",
    "PrivcalError": "privcal.errors",
    "SchemaOutOfDate": "privcal.errors",
    "PrivateConformalClassifier": "privcal.estimators",
    "PrivateConformalRegressor": "privcal.estimators",
}

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
    "PrivateConformalClassifier",
    "PrivateConformalRegressor",
    "PrivcalError",
    "PureDP",
    "Release",
    "SchemaOutOfDate",
    "__version__",
]

if TYPE_CHECKING:  # pragma: no cover
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
    from privcal.estimators import PrivateConformalClassifier, PrivateConformalRegressor
    from privcal.storage import Ledger


__getattr__ = lazy_getattr(__name__, _EXPORTS)
