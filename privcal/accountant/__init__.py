"""The accountant: privacy notions, conversions, composition filters, and the gate of every run.

``Accountant(ledger)`` charges costs atomically against dataset and per-subject
budgets and records releases (:mod:`privcal.accountant.accountant` lists the module of
each concern; the results it returns are :mod:`privcal.accountant.results`);
:mod:`privcal.accountant.privacy` is the pure mathematics (conversions and CKS20, the
composition filters, guarantees, shuffle bounds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from privcal import lazy_getattr

# Lazy (PEP 562): ``privcal.accountant.privacy`` (``privacy.shuffle`` is used by
# ``privcal amplify``) must not drag the ledger (SQLAlchemy, the storage layer) in with it.
_EXPORTS = {
    "Accountant": "privcal.accountant.accountant",
    **dict.fromkeys(
        ("BudgetReport", "ChargeReceipt", "DatasetInfo", "DryRun", "GuaranteeReport", "Release",
         "SpentReport", "SubjectChargeResult", "SubjectSummary"),
        "privcal.accountant.results"),
    "cks20_epsilon": "privcal.accountant.privacy.conversions",
    "simple_zcdp_epsilon": "privcal.accountant.privacy.conversions",
}

if TYPE_CHECKING:  # pragma: no cover
    from privcal.accountant.accountant import Accountant
    from privcal.accountant.privacy.conversions import cks20_epsilon, simple_zcdp_epsilon
    from privcal.accountant.results import (
        BudgetReport,
        ChargeReceipt,
        DatasetInfo,
        DryRun,
        GuaranteeReport,
        Release,
        SpentReport,
        SubjectChargeResult,
        SubjectSummary,
    )


__getattr__ = lazy_getattr(__name__, _EXPORTS)


__all__ = [
    "Accountant",
    "BudgetReport",
    "ChargeReceipt",
    "DatasetInfo",
    "DryRun",
    "GuaranteeReport",
    "Release",
    "SpentReport",
    "SubjectChargeResult",
    "SubjectSummary",
    "cks20_epsilon",
    "simple_zcdp_epsilon",
]
