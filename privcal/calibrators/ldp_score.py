"""LDP-CP-S: interactive ε-LDP binary search for the conformal quantile of the scores — SPEC §7.

Penso, Mahpud, Goldberger, Sheffet (seed 004), §3.2, Algorithm 3 and Theorem 4, after the
LDP binary search of Gaboardi et al. (2019). Each user computes their own score
S(x, y) and answers *one* query "is S ≤ q⁽ʲ⁾?" through binary randomized response, so the
protocol is ε-LDP for (x, y) jointly.

The aggregator side is :class:`LdpScoreProtocol`, a pure, JSON-serialisable state machine;
:func:`simulate` drives it with simulated clients; :class:`LDPScore` is the calibrator.

Slack (SPEC §7, with the group size made explicit): each debiased report
c·b̃ − 1/(e^ε−1), c = (e^ε+1)/(e^ε−1), is an independent variable with mean F(q) and range
c; Hoeffding on a group of n' reports plus a union bound over the T rounds gives, with
probability ≥ 1 − δ, every round's estimate within

    Δ_S = c·√(ln(2T/δ)/(2n')),  n' = ⌊n/T⌋.

This equals SPEC's c·√(T·ln(2T/δ)/(2n)) when T divides n; otherwise n' < n/T and the n'
form is the one that is valid (the n − T·n' left-over users are never asked).

Review (issue 14.8)
-------------------
- **Privacy claim**: ε-local DP for each participating subject, for (x, y)
  jointly, recorded as ``LocalDP(ε)`` and charged to each subject once.
  Neighbouring relation: any two inputs of one subject (``privacy["neighbouring"]``).
- **Sensitivity**: not applicable (local randomizer): one binary randomized
  response keeps the bit w.p. e^ε/(e^ε+1), a likelihood ratio ≤ e^ε.
- **Sampler**: the client's bit flip is exact (``randrange`` comparison on
  integers, :mod:`~privcal.calibrators.mechanisms.randomized_response`) from the
  OS CSPRNG; the simulated users of :func:`simulate` draw from a seeded
  generator and are a simulation of the clients, not a privacy mechanism.
- **Coverage claim**: with probability ≥ 1−δ over the calibration data and the
  users' responses, P(Y ∈ C(X)) ≥ 1−α (default target 1−α+Δ_S) or ≥ 1−α−Δ_S
  (``nominal``) (seed 004, Thm 4 with Hoeffding per group). Assumptions, each
  enforced: (i) i.i.d. subjects, randomly assigned to disjoint groups
  (:func:`assign_groups`; each subject answers once, enforced by sessions);
  (ii) each round has ≥ n' reports (``advance`` refuses fewer); (iii) **no
  score range is assumed**: the queries are about the raw scores, and when the
  rounds run out without a backing estimate the release is +∞, never the
  public ``upper``; scores below ``lower`` only make the threshold conservative.
"""

from __future__ import annotations

import math
import random
from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from privcal.calibrators.base import (
    CalibrationInput,
    CalibrationResult,
    CalibratorParams,
    CoverageGuarantee,
    DataShape,
    LocalFailureProbability,
    numpy_rng,
)
from privcal.calibrators.mechanisms.randomized_response import binary_rr_many
from privcal.calibrators.validation import check_scores
from privcal.costs import LocalDP
from privcal.errors import InfeasiblePlan, InvalidInput, PlanRejected

__all__ = [
    "MAX_ROUNDS",
    "LDPScore",
    "LDPScoreParams",
    "LdpScoreProtocol",
    "RoundRecord",
    "assign_groups",
    "best_rounds",
    "debias",
    "rr_range",
    "score_slack",
    "simulate",
]

#: the rounds searched by :func:`best_rounds` (2^−40 of the range is far below any Δ_S)
MAX_ROUNDS = 40


def _eps(epsilon: float) -> float:
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
        raise InvalidInput(f"ε must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


def rr_range(epsilon: float) -> float:
    """c = (e^ε+1)/(e^ε−1) = coth(ε/2): the range of one debiased binary-RR report."""
    return 1.0 / math.tanh(_eps(epsilon) / 2)


def _inv_expm1(epsilon: float) -> float:
    """1/(e^ε − 1), 0 where e^ε overflows."""
    return 0.0 if epsilon > 700 else 1.0 / math.expm1(epsilon)


def debias(ones: int, count: int, epsilon: float) -> float:
    """Z = c·(ones/count) − 1/(e^ε−1): unbiased for the fraction of true 1-bits (seed 004,
    Algorithm 3 line 8, with the mean over the group, not over n)."""
    if count < 1 or not (0 <= ones <= count):
        raise InvalidInput(f"need 0 ≤ ones ≤ count and count ≥ 1, got ones={ones}, count={count}")
    return rr_range(epsilon) * (ones / count) - _inv_expm1(epsilon)


def score_slack(group_size: int, rounds: int, epsilon: float, delta: float) -> float:
    """Δ_S = c·√(ln(2T/δ)/(2n')): with probability ≥ 1−δ all T estimates are within Δ_S."""
    if group_size < 1 or rounds < 1:
        raise InvalidInput(f"group size and rounds must be ≥ 1, got {group_size}, {rounds}")
    if not (0 < delta < 1):
        raise InvalidInput(f"δ must be in (0, 1), got {delta}")
    return rr_range(epsilon) * math.sqrt(math.log(2 * rounds / delta) / (2 * group_size))


def best_rounds(n: int, epsilon: float, delta: float = 0.001, max_rounds: int = MAX_ROUNDS) -> int:
    """The default number of rounds T: the T in 1..min(max_rounds, n) minimising
    Δ_S(T) + 2^−T.

    2^−T is the width of the final bisection interval as a fraction of the public range,
    i.e. the probability mass it can hold when scores have density ≤ 1/(upper − lower)
    (uniform-like scores); Δ_S(T), the statistical slack, grows with T. The sum is a
    documented heuristic for the resolution/noise trade-off; the guarantee holds for any T.
    Ties go to the smaller T (fewer rounds of interaction).
    """
    if n < 1:
        raise InvalidInput(f"n must be ≥ 1, got {n}")
    best_t, best_v = 1, math.inf
    for t in range(1, min(max_rounds, n) + 1):
        v = score_slack(n // t, t, epsilon, delta) + 2.0**-t
        if v < best_v:
            best_t, best_v = t, v
    return best_t


class RoundRecord(BaseModel):
    """One finished round: public query, report counts, the DP estimate and the decision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    round: int
    query: float
    count: int
    ones: int
    estimate: float
    decision: Literal["lower", "raise", "stop"] = Field(
        description="'lower': hi = q (estimate > target + band); 'raise': lo = q "
        "(estimate < target); 'stop': estimate in the band, release q"
    )


class LdpScoreProtocol(BaseModel):
    """The aggregator of LDP-CP-S (seed 004, Algorithm 3; SPEC §7) as a pure state machine.

    Immutable and JSON-serialisable (``model_dump(mode="json")`` / ``model_validate``, or
    ``model_dump_json`` / ``model_validate_json``, round-trip exactly; +inf is written as
    the string "Infinity"). Every transition returns a new value, so a persistent session
    stores one JSON document per state and survives restarts.

    How a collection session drives it::

        proto = LdpScoreProtocol.open(alpha=0.1, epsilon=2, rounds=T, group_size=n_prime)
        while not proto.finished:
            q = proto.current_query()          # publish q before group `proto.round` answers
            # collect exactly one RR bit from each of ≥ group_size *new* subjects
            # (client: binary_rr(score <= q, ε)); charge each subject ε first
            proto = proto.advance(sum_of_bits, count)   # persist proto after each round
        release(proto.threshold, proto.guarantee_lower())

    Rules: groups are disjoint (a subject answers once: ε-LDP for (x, y)); a round's query
    is fixed until that round is advanced; ``advance`` needs ``count ≥ group_size`` reports
    (fewer would void Δ_S; more only tighten it). Decision rule: with Z the debiased mean,
    Z > target + band ⇒ hi = q; Z < target ⇒ lo = q; else stop and release q. When the
    rounds run out the release is ``hi`` if some estimate backed it, else +inf (SPEC §7
    Decision; +inf rather than the public upper end, so the guarantee does not rest on the
    scores lying in the declared range).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    # public parameters
    alpha: float = Field(gt=0, lt=1, allow_inf_nan=False)
    epsilon: float = Field(gt=0, allow_inf_nan=False)
    rounds: int = Field(ge=1, le=1000, description="T")
    group_size: int = Field(ge=1, description="n', reports per round")
    lower: float = Field(default=0.0, allow_inf_nan=False, description="public score range: low")
    upper: float = Field(default=1.0, allow_inf_nan=False, description="public score range: high")
    delta: float = Field(default=0.001, gt=0, lt=1, allow_inf_nan=False)
    nominal: bool = False
    band: float = Field(ge=0, allow_inf_nan=False, description="w: stop if Z ∈ [target, target+w]")
    # state
    round: int = Field(default=0, ge=0, description="index of the current round (0-based)")
    lo: float = Field(allow_inf_nan=False)
    hi: float = Field(allow_inf_nan=False)
    hi_backed: bool = Field(default=False, description="hi was set by an estimate > target + w")
    finished: bool = False
    threshold: float | None = None
    history: tuple[RoundRecord, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> LdpScoreProtocol:
        if not self.lower < self.upper:
            raise ValueError(
                f"score range must have lower < upper, got [{self.lower}, {self.upper}]"
            )
        if not (self.lower <= self.lo <= self.hi <= self.upper):
            raise ValueError(f"state interval [{self.lo}, {self.hi}] is not inside the range")
        if self.round > self.rounds or len(self.history) != self.round:
            raise ValueError("round counter does not match the history")
        if self.finished != (self.threshold is not None):
            raise ValueError("a finished protocol has a threshold, an open one does not")
        if not self.finished and self.round == self.rounds:
            raise ValueError("all rounds are done but the protocol is not finished")
        return self

    @classmethod
    def open(
        cls,
        *,
        alpha: float,
        epsilon: float,
        rounds: int,
        group_size: int,
        lower: float = 0.0,
        upper: float = 1.0,
        delta: float = 0.001,
        nominal: bool = False,
        band: float | None = None,
    ) -> LdpScoreProtocol:
        """A fresh protocol at round 0 with interval [lower, upper]; band defaults to Δ_S."""
        try:
            w = band if band is not None else score_slack(group_size, rounds, epsilon, delta)
            return cls(
                alpha=alpha,
                epsilon=epsilon,
                rounds=rounds,
                group_size=group_size,
                lower=lower,
                upper=upper,
                delta=delta,
                nominal=nominal,
                band=w,
                lo=lower,
                hi=upper,
            )
        except ValueError as exc:  # pydantic.ValidationError is a ValueError
            if isinstance(exc, InvalidInput):
                raise
            raise InvalidInput(f"invalid ldp-score protocol: {_first_error(exc)}") from None

    @property
    def slack(self) -> float:
        """Δ_S for this protocol's (n', T, ε, δ)."""
        return score_slack(self.group_size, self.rounds, self.epsilon, self.delta)

    @property
    def target(self) -> float:
        """1−α+Δ_S (default) or 1−α (nominal)."""
        return 1 - self.alpha + (0.0 if self.nominal else self.slack)

    def guarantee_lower(self) -> float:
        """Coverage lower bound holding with probability ≥ 1−δ: 1−α, or 1−α−Δ_S if nominal."""
        return 1 - self.alpha if not self.nominal else max(0.0, 1 - self.alpha - self.slack)

    def to_params(self) -> LDPScoreParams:
        """The calibrator parameters of this protocol. ``LDPScore().guarantee(p.to_params(),
        DataShape(n=p.rounds * p.group_size))`` is the guarantee a session records."""
        return LDPScoreParams(
            alpha=self.alpha,
            epsilon=self.epsilon,
            rounds=self.rounds,
            failure_probability=self.delta,
            lower=self.lower,
            upper=self.upper,
            nominal=self.nominal,
            band=self.band,
        )

    def current_query(self) -> float:
        """q⁽ʲ⁾ = (lo + hi)/2, the threshold group ``round`` is asked about."""
        if self.finished:
            raise PlanRejected("the ldp-score protocol is finished; no more queries")
        return (self.lo + self.hi) / 2

    def advance(self, sum_of_bits: int, count: int) -> LdpScoreProtocol:
        """Consume the current round's reports (``sum_of_bits`` ones out of ``count``)."""
        for name, v in (("sum_of_bits", sum_of_bits), ("count", count)):
            if isinstance(v, bool) or not isinstance(v, int | np.integer):
                raise InvalidInput(f"{name} must be an integer, got {v!r}")
        ones, cnt = int(sum_of_bits), int(count)
        q = self.current_query()
        if cnt < self.group_size:
            raise PlanRejected(f"round {self.round} needs ≥ {self.group_size} reports, got {cnt}")
        if not 0 <= ones <= cnt:
            raise InvalidInput(f"sum of bits must be in [0, {cnt}], got {ones}")
        z = debias(ones, cnt, self.epsilon)
        target = self.target
        update: dict[str, object] = {"round": self.round + 1}
        if z > target + self.band:
            decision, update["hi"], update["hi_backed"] = "lower", q, True
        elif z < target:
            decision, update["lo"] = "raise", q
        else:
            decision, update["finished"], update["threshold"] = "stop", True, q
        rec = RoundRecord(
            round=self.round, query=q, count=cnt, ones=ones, estimate=z, decision=decision
        )
        update["history"] = (*self.history, rec)
        if decision != "stop" and self.round + 1 == self.rounds:
            hi_backed = bool(update.get("hi_backed", self.hi_backed))
            update["finished"] = True
            update["threshold"] = float(update.get("hi", self.hi)) if hi_backed else math.inf
        return self.model_copy(update=update)


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        e = errors()[0]
        loc = ".".join(str(p) for p in e.get("loc", ())) or "value"
        return f"{loc}: {e.get('msg', '')}"
    return str(exc)


class LDPScoreParams(CalibratorParams):
    """Parameters of ``ldp-score`` (alpha from the base model)."""

    epsilon: float = Field(gt=0, allow_inf_nan=False, description="users' binary-RR ε")
    rounds: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="T; default: best_rounds(n, ε, δ) (minimises Δ_S(T) + 2^−T)",
    )
    failure_probability: LocalFailureProbability = 0.001
    lower: float = Field(
        default=0.0, allow_inf_nan=False, description="public score range: lower end"
    )
    upper: float = Field(
        default=1.0, allow_inf_nan=False, description="public score range: upper end"
    )
    nominal: bool = False
    band: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="w; Δ_S")

    @property
    def delta(self) -> float:
        """The failure probability under the protocol's (and the paper's) name δ."""
        return self.failure_probability

    @model_validator(mode="after")
    def _range(self) -> LDPScoreParams:
        if not self.lower < self.upper:
            raise ValueError(f"score range needs lower < upper, got [{self.lower}, {self.upper}]")
        return self


def _plan(params: LDPScoreParams, n: int) -> tuple[int, int]:
    """(T, n'): the rounds (resolved default) and the group size for n subjects."""
    t = params.rounds if params.rounds is not None else best_rounds(n, params.epsilon, params.delta)
    if n < t:
        raise InfeasiblePlan(f"ldp-score with {t} rounds needs at least {t} subjects, got {n}")
    return t, n // t


def open_protocol(params: LDPScoreParams, n: int) -> LdpScoreProtocol:
    """The protocol for n subjects under ``params`` (round 0)."""
    t, g = _plan(params, n)
    return LdpScoreProtocol.open(
        alpha=params.alpha,
        epsilon=params.epsilon,
        rounds=t,
        group_size=g,
        lower=params.lower,
        upper=params.upper,
        delta=params.delta,
        nominal=params.nominal,
        band=params.band,
    )


def assign_groups(n: int, rounds: int, group_size: int, gen: np.random.Generator) -> np.ndarray:
    """Row j = the indices of group j: T disjoint random groups of n' users (a random
    permutation cut into consecutive blocks; the n − T·n' left-over users are never asked)."""
    if rounds * group_size > n:
        raise InfeasiblePlan(f"{rounds} groups of {group_size} need {rounds * group_size} users")
    return gen.permutation(n)[: rounds * group_size].reshape(rounds, group_size)


def simulate(scores: np.ndarray, params: LDPScoreParams, rng: random.Random) -> LdpScoreProtocol:
    """Run LDP-CP-S with simulated clients: the scores are split into T random disjoint
    groups of n' = ⌊n/T⌋; in round j each member of group j reports
    binary_rr(1{s ≤ q⁽ʲ⁾}, ε). Returns the finished protocol (``.threshold``)."""
    s = check_scores(scores, min_rows=1, allow_inf=True)
    proto = open_protocol(params, s.shape[0])
    gen = numpy_rng(rng)
    groups = assign_groups(s.shape[0], proto.rounds, proto.group_size, gen)
    while not proto.finished:
        q = proto.current_query()
        members = s[groups[proto.round]]
        reports = binary_rr_many(members <= q, params.epsilon, gen)
        proto = proto.advance(int(reports.sum()), proto.group_size)
    return proto


class LDPScore:
    """LDP-CP-S (seed 004 §3.2, Algorithm 3, Theorem 4; SPEC §7): ε-LDP binary search on the
    users' own scores; ``calibrate`` runs it with simulated clients (:func:`simulate`)."""

    name: ClassVar[str] = "ldp-score"
    version: ClassVar[str] = "1"
    privacy_model: ClassVar[str] = "local"
    #: the neighbouring relation of the privacy claim (recorded as ``privacy["neighbouring"]``)
    neighbouring: ClassVar[str] = (
        "any two inputs (x, y) of one subject (local DP: each subject answers one binary "
        "randomized-response query)"
    )
    Params: ClassVar[type[CalibratorParams]] = LDPScoreParams
    inputs: ClassVar[frozenset[str]] = frozenset({"scores"})
    summary: ClassVar[str] = "LDP-CP-S: interactive RR binary search on scores (ε-LDP for x and y)"
    #: round j's query must be published before group j answers: run it as a collection
    #: session, or with simulated users (``privcal calibrate ldp-score --simulate``)
    interactive: ClassVar[bool] = True

    def cost(self, params: LDPScoreParams, shape: DataShape) -> LocalDP:
        """ε0 = ε per participating subject (each answers one binary-RR query)."""
        return LocalDP(eps0=params.epsilon)

    def guarantee(self, params: LDPScoreParams, shape: DataShape) -> CoverageGuarantee:
        """Coverage ≥ 1−α (default) or ≥ 1−α−Δ_S (nominal), with probability ≥ 1−δ."""
        proto = open_protocol(params, shape.n)
        lower = proto.guarantee_lower()
        mode = "nominal target 1−α" if params.nominal else "target 1−α+Δ_S"
        return CoverageGuarantee(
            target=1 - params.alpha,
            lower=lower,
            failure_probability=params.delta,
            over="the calibration data and the users' randomized responses",
            statement=(
                f"With probability ≥ {1 - params.delta:g} over the calibration data and the "
                f"users' randomized responses, P(Y ∈ C(X) | calibration) ≥ {lower:.6g} "
                f"(LDP-CP-S, {mode}, Δ_S = {proto.slack:.6g}, T = {proto.rounds}, "
                f"n' = {proto.group_size}); privacy: ε-LDP for features and label."
            ),
            details={
                "delta_S": proto.slack,
                "rounds": proto.rounds,
                "group_size": proto.group_size,
                "unused_subjects": shape.n - proto.rounds * proto.group_size,
                "rr_range_c": rr_range(params.epsilon),
                "band": proto.band,
                "calibration_target": proto.target,
                "lower_range": params.lower,
                "upper_range": params.upper,
                "delta": params.delta,
                "epsilon": params.epsilon,
                "n": shape.n,
                "nominal": int(params.nominal),
                "privacy": "ε-LDP for (x, y): one binary randomized response per subject",
            },
        )

    def calibrate(
        self, data: CalibrationInput, params: LDPScoreParams, rng: random.Random
    ) -> CalibrationResult:
        """Simulate the protocol on ``data.scores`` (see :func:`simulate`)."""
        if data.scores is None:
            raise InvalidInput("ldp-score needs scores")
        proto = simulate(data.scores, params, rng)
        threshold = proto.threshold if proto.threshold is not None else math.inf
        return CalibrationResult(
            threshold=threshold,
            diagnostics={
                "rounds": proto.rounds,
                "rounds_used": proto.round,
                "group_size": proto.group_size,
                "delta_S": proto.slack,
                "calibration_target": proto.target,
                "band": proto.band,
                "trivial": math.isinf(threshold),
                "history": [r.model_dump(mode="json") for r in proto.history],
            },
        )
