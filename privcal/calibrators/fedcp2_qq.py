"""FedCP²-QQ: one-shot federated conformal calibration with agent-level ε-DP (SPEC §10).

Humbert, Le Bars, Bellet, Arlot, *One-Shot Federated Conformal Prediction*,
ICML 2023 (seed 002), §4: Algorithm 2 (each agent's exponential-mechanism
quantile over public bins), Algorithm 3 (orders ℓ_γ + ℓ_cor and k_γ, eq. (10))
and Thm 4.1 (ε-LDP per agent; coverage ≥ 1−α, proof App. C.4). Each agent is
a privacy subject charged ε on its own budget: ``cost`` is ``LocalDP(ε)`` and
the accountant charges it to the agent ids.

Review (issue 14.8)
-------------------
- **Privacy claim**: each agent's message is ε-DP with respect to that agent's
  own n scores (record level), recorded as ``LocalDP(ε)`` charged to each
  agent. Neighbouring relation: substitution of one score in one agent's data,
  n and m public (``privacy["neighbouring"]``). It is *not* ε-LDP for the
  agent's whole input.
- **Sensitivity**: Δ_q = max(1/q, 1/(1−q)) for the weights of the exponential
  mechanism (each count moves by ≤ 1 under a substitution).
- **Sampler**: exact exponential mechanism
  (:func:`~privcal.calibrators.mechanisms.exponential.sample_index`), uniform
  bits from the OS CSPRNG unless a generator is given.
- **Coverage claim**: P(Y ∈ C(X)) ≥ 1−α, marginal over all agents' data,
  their mechanisms' randomness and the test point (Thm 4.1, App. C.4).
  Assumptions, each enforced: (i) i.i.d. scores across agents (the user's
  data); (ii) every agent holds exactly n scores (checked: ``plan_for`` and
  :func:`~privcal.calibrators.federated_agent.fedcp2_qq_message`); (iii)
  n·q ≥ ℓ_γ + ℓ_cor (the plan); (iv) **no score range is assumed**: scores
  above ``upper`` are rounded into the top grid point and an aggregate there
  is released as +∞; scores below ``lower`` only make the threshold conservative.
  One assumption privcal **cannot enforce, so the recorded guarantee states it**
  (``over`` and ``statement``, version 1.1.0): (v) every agent follows the
  protocol — its message is its own mechanism's output on its own scores. A
  session refuses messages off the public grid, but any grid point may be sent,
  and the server's k_γ-th smallest follows k_γ such agents.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import ClassVar

from pydantic import AliasChoices, Field, model_validator

from privcal.calibrators.base import (
    CalibrationInput,
    CalibrationResult,
    CalibratorParams,
    CoverageGuarantee,
    DataShape,
    PrivacyModel,
)
from privcal.calibrators.bound_floats import float_at_most, text_at_most
from privcal.calibrators.fedcp_qq import group_by_agent, sizes_of
from privcal.calibrators.federated_agent import (
    HONEST_AGENTS,
    agents_planned_field,
    aggregate,
    answered_clause,
    bin_grid,
    chosen_clause,
    epsilon_text,
    fedcp2_qq_message,
    missing_agents,
    missing_clause,
    planned_agents,
)
from privcal.calibrators.fedplan import (
    FEAS_TOL,
    MAX_BINS,
    Fed2Plan,
    plan_fedcp2_qq,
    plan_fedcp2_qq_pinned,
)
from privcal.calibrators.score_range import check_range_arithmetic
from privcal.costs import LocalDP
from privcal.errors import InvalidInput

__all__ = ["FedCP2QQ", "FedCP2QQParams"]


class FedCP2QQParams(CalibratorParams):
    """α, the per-agent ε, and the public grid: ``bins`` points on [``lower``, ``upper``]."""

    epsilon: float = Field(gt=0, allow_inf_nan=False, description="ε of each agent's message")
    bins: int = Field(
        default=100,
        ge=2,
        le=MAX_BINS,
        description=f"number B of public grid points (2 … {MAX_BINS:,})",
    )
    lower: float = Field(
        default=0.0, allow_inf_nan=False, description="public score range: lower end of the grid"
    )
    upper: float = Field(
        default=1.0,
        allow_inf_nan=False,
        validation_alias=AliasChoices("upper", "smax"),
        description="public score range: upper end S_max of the grid (never the data's "
        "maximum; an aggregate on it is released as +inf); formerly 'smax'",
    )

    @model_validator(mode="after")
    def _range(self) -> FedCP2QQParams:
        check_range_arithmetic(self.lower, self.upper)
        return self
    level: float | None = Field(
        default=None,
        ge=0.5,
        lt=1,
        allow_inf_nan=False,
        description=(
            "normally set by a collection session; pins the agents' answer level q (the "
            "server side is then replanned for the agents in the shape, with ℓ_γ+ℓ_cor ≤ ⌊n·q⌋)"
        ),
    )
    agents_planned: int | None = agents_planned_field()

    @model_validator(mode="after")
    def _one_way(self) -> FedCP2QQParams:
        if self.level is not None and self.agents_planned is not None:
            raise ValueError("give level (a replan for the agents that answered) or "
                             "agents_planned (the missing agents counted as +inf), not both")
        return self


def plan_for(params: FedCP2QQParams, shape: DataShape) -> Fed2Plan:
    """Algorithm 3's plan for this shape; all agents must hold the same number of scores.

    With ``params.level`` set (a collection session closed with agents missing: the
    agents answered at that level q before it was known how many would), the plan
    keeps q and re-chooses γ, ℓ_γ, k_γ, ℓ_cor for the shape's m agents — the same
    computation as :func:`~privcal.calibrators.fedplan.replan_fedcp2_qq_subset`,
    so the recorded guarantee can be recomputed from the stored parameters. With
    ``params.agents_planned`` set (closed with agents missing, each counted as +∞), the
    plan is the one for that many agents: the published one.
    """
    sizes = sizes_of(shape)
    m = planned_agents(params.agents_planned, sizes)
    if len(set(sizes)) != 1:
        raise InvalidInput(
            f"fedcp2-qq needs every agent to hold the same number of scores, got sizes "
            f"{sorted(set(sizes))}"
        )
    if params.level is not None:
        plan = plan_fedcp2_qq_pinned(
            len(sizes),
            sizes[0],
            params.alpha,
            params.epsilon,
            params.level,
            bins=params.bins,
            smax=params.upper,
            lower=params.lower,
        )
    else:
        plan = plan_fedcp2_qq(
            m,
            sizes[0],
            params.alpha,
            params.epsilon,
            bins=params.bins,
            smax=params.upper,
            lower=params.lower,
        )
    # the grid every agent's mechanism uses, checked with the plan: before the charge, not
    # in calibrate after every agent paid ε (red team 7: a width that overflows a float, a
    # step below the floats' resolution)
    bin_grid(plan)
    return plan


class FedCP2QQ:
    """FedCP²-QQ: agents answer an ε-DP quantile on public bins, the server keeps the k_γ-th."""

    name: ClassVar[str] = "fedcp2-qq"
    #: 1.6.0: the recorded guarantee states that which agents' messages are used is not
    #: chosen by their data (red team 25, fedlocal F4; same formula);
    #: 1.5.0: the sentences state an agent's ε exactly, as charged (they said it in six
    #: significant digits, to nearest: "10.2345" for 10.2345449; red team 16; same formula);
    #: 1.4.0: a release for the agents that answered can instead count each missing agent's
    #: message as +∞ under the published plan (``agents_planned``: no assumption on the
    #: dropout; same formula otherwise); 1.3.0: a release for the agents that answered
    #: (``level`` pinned) states that they
    #: were not chosen by their data (red team 14; same formula); 1.2.0: an agent's ε is
    #: worded as what it is, record-level DP of its message, not "local DP at agent level"
    #: (red team 7; same formula); 1.1.0: the recorded guarantee states that every agent
    #: follows the protocol (red team 6; same formula as 1.0.0)
    version: ClassVar[str] = "1.6.0"
    #: older versions ``privcal audit verify`` recomputes by this formula (their older
    #: sentences are counted, not compared)
    legacy_params: ClassVar[dict[str, dict[str, object]]] = {
        "1.0.0": {}, "1.1.0": {}, "1.2.0": {}, "1.3.0": {}, "1.4.0": {}, "1.5.0": {}}
    privacy_model: ClassVar[PrivacyModel] = "federated"
    #: the neighbouring relation of the privacy claim (recorded as ``privacy["neighbouring"]``)
    neighbouring: ClassVar[str] = (
        "substitution of one score in one agent's n scores (record-level ε-DP of each "
        "agent's message w.r.t. its own data; n and m are public)"
    )
    #: what its ε protects, in the release's privacy statement (red team 7: an agent's
    #: message is ε-DP per record of its data, not a local randomizer of its whole input)
    local_statement: ClassVar[str] = (
        "each agent's message is {eps}-DP with respect to any one of its own scores "
        "(record-level DP at each agent; not local DP of the agent's whole data)")
    Params: ClassVar[type[CalibratorParams]] = FedCP2QQParams
    inputs: ClassVar[frozenset[str]] = frozenset({"scores", "agents"})
    summary: ClassVar[str] = (
        "one-shot federated quantile of DP quantiles: each agent ε-DP, coverage ≥ 1−α"
    )

    def cost(self, params: FedCP2QQParams, shape: DataShape) -> LocalDP:
        """ε charged to each agent (one exponential-mechanism answer per agent, Thm 4.1)."""
        return LocalDP(eps0=params.epsilon)

    def plan(self, params: FedCP2QQParams, shape: DataShape) -> Fed2Plan:
        """The public plan (γ, ℓ_γ, k_γ, ℓ_cor, q); q = ``params.level`` when pinned."""
        return plan_for(params, shape)

    def guarantee(self, params: FedCP2QQParams, shape: DataShape) -> CoverageGuarantee:
        """Coverage ≥ 1−α, marginally (Humbert et al. 2023, Thm 4.1; proof App. C.4)."""
        return self.guarantee_as(self.version, params, shape)

    def guarantee_as(self, version: str, params: FedCP2QQParams,
                     shape: DataShape) -> CoverageGuarantee:
        """:meth:`guarantee` as calibrator ``version`` recorded it. The planner accepts a plan
        whose computed proof bound M_γ·(1−γα) is within
        :data:`~privcal.calibrators.fedplan.FEAS_TOL` below 1−α (a quadrature): since 1.1.0
        the recorded lower bound is then that bound minus FEAS_TOL, never above the proof
        (red team 6: m = 1, n = 99, ε = 50, α = 0.1009081735615545 recorded
        0.8990918264384455 against a proof bound of 0.899091826437946); 1.0.0 recorded 1−α."""
        missing = missing_agents(params.agents_planned, shape.group_sizes, version, "1.4.0",
                                 self.name)
        p = plan_for(params, shape)
        alpha = params.alpha
        old = version in ("1.0.0", "1.1.0")  # worded an agent's ε "local DP" (red team 7)
        eps = epsilon_text(p.epsilon, version, "1.5.0")  # exact from 1.5.0 (red team 16)
        answered = answered_clause(params.level is not None, version, "1.3.0")
        if missing:
            answered = missing_clause(len(shape.group_sizes or ()), p.m)
        answered = chosen_clause(params.level is not None, version, "1.6.0") + answered
        lower, said = 1 - alpha, f"{1 - alpha:.6g}"
        if version != "1.0.0":
            proven = Fraction(p.proof_bound) - Fraction(FEAS_TOL)
            lower = float_at_most(1 - alpha, proven)
            said = text_at_most(lower, proven)
        return CoverageGuarantee(
            target=1 - alpha,
            lower=lower,
            upper=None,
            failure_probability=0.0,
            over=(
                "calibration scores of all agents, the agents' mechanism randomness and the "
                f"test point (marginal; i.i.d. scores), {HONEST_AGENTS}{answered}"
            ),
            rank=p.k_gamma,
            statement=(
                f"P(Y ∈ C(X)) ≥ {said} over all agents' data, their DP noise and the "
                f"test point, {HONEST_AGENTS}{answered}; each agent's message is "
                f"{eps}-DP w.r.t. "
                + ("its own scores" if old else "any one of its own scores (record-level)")
            ),
            details={
                "alpha": alpha,
                "m": p.m,
                "n": p.n,
                "epsilon": p.epsilon,
                "bins": p.bins,
                "smax": p.smax,
                # (old releases have lower = 0 and no key: the record stays recomputable)
                **({"lower": p.lower} if p.lower != 0 else {}),
                "gamma": p.gamma,
                "l_gamma": p.l_gamma,
                "k_gamma": p.k_gamma,
                "l_cor": p.l_cor,
                "q": p.q,
                "M": p.M,
                "M_gamma": p.M_gamma,
                "proof_bound": p.proof_bound,
                "privacy": (
                    f"each agent {eps}-DP w.r.t. its own scores (local DP at agent level)"
                    if old else f"each agent's message {eps}-DP w.r.t. any one of its "
                    "own scores (record-level DP; not local DP of its whole data)"
                ),
                "top_bin": "an aggregate on the top grid point S_max is released as +inf",
                **(
                    {
                        "pinned": (
                            f"agents answered at level q={p.q:g}; γ, ℓ_γ, k_γ, ℓ_cor replanned "
                            f"for m={p.m} agents with ℓ_γ+ℓ_cor ≤ ⌊n·q⌋"
                        )
                    }
                    if params.level is not None
                    else {}
                ),
                **(
                    {"answered": len(shape.group_sizes or ()),
                     "missing": "each missing agent's message counted as +inf"}
                    if missing
                    else {}
                ),
            },
        )

    def check_inputs(self, params: FedCP2QQParams, data: CalibrationInput) -> None:
        """What :meth:`calibrate` refuses (:func:`group_by_agent`: the scores and agent ids),
        refused before every agent is charged ε."""
        group_by_agent(data)

    def calibrate(
        self, data: CalibrationInput, params: FedCP2QQParams, rng: random.Random
    ) -> CalibrationResult:
        """Run Algorithm 3 in one process: every agent's DP message, then the k_γ-th smallest."""
        groups = group_by_agent(data)
        shape = DataShape(n=sum(g.size for g in groups), group_sizes=tuple(g.size for g in groups))
        plan = plan_for(params, shape)
        messages = [fedcp2_qq_message(g, plan, rng) for g in groups]
        threshold = aggregate(messages, plan, missing_as_inf=params.agents_planned is not None)
        return CalibrationResult(
            threshold=threshold,
            diagnostics={
                "m": plan.m,
                "n": plan.n,
                "gamma": plan.gamma,
                "l_gamma": plan.l_gamma,
                "k_gamma": plan.k_gamma,
                "l_cor": plan.l_cor,
                "q": plan.q,
                # each message is its agent's ε-DP output: releasing them costs nothing more
                "messages": sorted(messages),
            },
        )
