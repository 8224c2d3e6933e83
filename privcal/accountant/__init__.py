"""The accountant: privacy notions, conversions, composition filters, and the gate of every run.

``Accountant(ledger)`` charges costs atomically against dataset and per-subject
budgets and records releases; :mod:`privcal.accountant.accounting` is the pure
mathematics (CKS20, filters, reporting rule).
"""

from privcal.accountant.accountant import (
    Accountant,
    BudgetReport,
    ChargeReceipt,
    DatasetInfo,
    DryRun,
    Release,
    SpentReport,
    SubjectChargeResult,
    SubjectSummary,
)
from privcal.accountant.accounting import cks20_epsilon, simple_zcdp_epsilon

__all__ = [
    "Accountant",
    "BudgetReport",
    "ChargeReceipt",
    "DatasetInfo",
    "DryRun",
    "Release",
    "SpentReport",
    "SubjectChargeResult",
    "SubjectSummary",
    "cks20_epsilon",
    "simple_zcdp_epsilon",
]
