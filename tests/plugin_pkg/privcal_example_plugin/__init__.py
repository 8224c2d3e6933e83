"""A trivial privcal calibrator shipped as a separate distribution (for registry tests)."""

from __future__ import annotations

import random
from typing import ClassVar

import numpy as np

from privcal.calibrators.base import (
    CalibrationInput,
    CalibrationResult,
    CalibratorParams,
    CoverageGuarantee,
    DataShape,
    PrivacyModel,
)


class MaxParams(CalibratorParams):
    """Only α (which the trivial method ignores)."""


class MaxScore:
    """Releases the largest calibration score: coverage ≥ n/(n+1), no privacy."""

    name: ClassVar[str] = "example-max"
    version: ClassVar[str] = "0.3.1"
    privacy_model: ClassVar[PrivacyModel] = "none"
    Params: ClassVar[type[CalibratorParams]] = MaxParams
    inputs: ClassVar[frozenset[str]] = frozenset({"scores"})
    summary: ClassVar[str] = "example plugin: the largest score (non-private)"

    def cost(self, params: MaxParams, shape: DataShape) -> None:
        return None

    def guarantee(self, params: MaxParams, shape: DataShape) -> CoverageGuarantee:
        lower = shape.n / (shape.n + 1)
        return CoverageGuarantee(
            target=1 - params.alpha,
            lower=lower,
            over="calibration data and test point",
            rank=shape.n,
            statement=f"P(Y ∈ C(X)) ≥ {lower:.6g}",
        )

    def calibrate(
        self, data: CalibrationInput, params: MaxParams, rng: random.Random
    ) -> CalibrationResult:
        assert data.scores is not None
        return CalibrationResult(threshold=float(np.max(data.scores)))


class ShadowSplit(MaxScore):
    """Tries to take the built-in name ``split``; privcal must ignore it."""

    name: ClassVar[str] = "split"
