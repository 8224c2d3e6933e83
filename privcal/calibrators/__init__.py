"""Conformal calibrators: scores, privacy mechanisms, one module per method, and the registry.

Nothing here touches the ledger; see :mod:`privcal.calibrators.base` for the contract.
"""

from privcal.calibrators.base import (
    CalibrationInput,
    CalibrationResult,
    Calibrator,
    CalibratorParams,
    CoverageGuarantee,
    DataShape,
    conformal_rank,
)
from privcal.calibrators.registry import get, names

__all__ = [
    "CalibrationInput",
    "CalibrationResult",
    "Calibrator",
    "CalibratorParams",
    "CoverageGuarantee",
    "DataShape",
    "conformal_rank",
    "get",
    "names",
]
