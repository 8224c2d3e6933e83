"""The parameters of LDP-CP-S (``ldp-score``) and its query rule, shared by the calibrator
(:mod:`privcal.calibrators.ldp_score`) and the aggregator's state machine
(:mod:`privcal.calibrators.ldp_score_protocol`), which both depend on this module and not on
each other's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from privcal.calibrators.base import CalibratorParams, LocalFailureProbability
from privcal.calibrators.ldp_score_bounds import Bound
from privcal.calibrators.score_range import check_range_arithmetic

__all__ = ["PAPER_BAND", "LDPScoreParams", "Search"]

#: the query rule of the search (see
#: :meth:`~privcal.calibrators.ldp_score_protocol.LdpScoreProtocol.current_query`)
Search = Literal["interpolate", "bisect"]

#: ``band``'s word for None — Δ_S, Penso et al.'s band — where null cannot be typed
#: (``calibrate ldp-score --band paper``; also accepted in Python and JSON)
PAPER_BAND = "paper"


class LDPScoreParams(CalibratorParams):
    """Parameters of ``ldp-score`` (alpha from the base model)."""

    epsilon: float = Field(gt=0, allow_inf_nan=False, description="users' binary-RR ε")
    rounds: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="T; default: best_rounds(n, ε, δ, α) (minimises Δ_S(T) + 2^−T)",
    )
    failure_probability: LocalFailureProbability = 0.001
    lower: float = Field(
        default=0.0, allow_inf_nan=False, description="public score range: lower end"
    )
    upper: float = Field(
        default=1.0, allow_inf_nan=False, description="public score range: upper end"
    )
    nominal: bool = Field(
        default=False,
        description="target 1−α, for coverage ≥ G ≈ 1−α−Δ_S instead of ≥ 1−α (the default "
        "targets 1−α+Δ_S); either with probability ≥ 1−δ (--failure-probability)")
    band: float | None = Field(
        default=0.0, ge=0, allow_inf_nan=False,
        description="stop band w: a round whose private estimate Z lies in [target, "
        "target + w] stops the search and releases its query. Default 0: every round runs "
        "and the last threshold an estimate backed is released (never larger than with a "
        "band, same guarantee; simulated users are all charged up front, so an early stop "
        "saves nothing); 'paper' (None, JSON null): Δ_S, the paper's band, a collection "
        "session's default (its groups not yet asked are never charged)",
        json_schema_extra={"cli_word": PAPER_BAND})
    bound: Bound = Field(
        default="exact",
        description="pass cut-off: 'exact' binomial tail (default) or 'hoeffding' (the "
        "version-1 bound, kept for old releases and comparison)",
    )
    search: Search = Field(
        default="bisect",
        description="query rule: 'bisect' (midpoints, the paper's rule; default) or "
        "'interpolate' between the rounds' DP estimates (fewer rounds when the scores' "
        "quantile is near an end of the range); the guarantee is the same for both",
    )

    @field_validator("band", mode="before")
    @classmethod
    def _paper_band(cls, v: object) -> object:
        return None if isinstance(v, str) and v == PAPER_BAND else v

    @property
    def delta(self) -> float:
        """The failure probability under the protocol's (and the paper's) name δ."""
        return self.failure_probability

    @model_validator(mode="after")
    def _range(self) -> LDPScoreParams:
        check_range_arithmetic(self.lower, self.upper)
        return self
