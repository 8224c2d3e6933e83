"""FedCP-QQ: one-shot federated conformal calibration by a quantile of quantiles (SPEC §9).

Humbert, Le Bars, Bellet, Arlot, *One-Shot Federated Conformal Prediction*,
ICML 2023 (seed 002), Algorithm 1 and Thm 3.2; App. A.1 for agents of
different sizes. The planning math is in :mod:`privcal.calibrators.fedplan`,
the agent and server steps in :mod:`privcal.calibrators.federated_agent`;
``calibrate`` runs the whole one-round protocol in one process (simulation,
or data held locally).

Review (issue 14.8)
-------------------
- **Privacy claim**: none. Each agent reveals one order statistic of its data
  (recorded as the release's privacy statement); a dataset must allow
  non-private releases.
- **Sensitivity / sampler**: not applicable (deterministic).
- **Coverage claim**: P(Y ∈ C(X)) ≥ 1−α, = M_{ℓ,k} for continuous scores,
  marginal over all agents' calibration data and the test point (Thm 3.2;
  App. A.1 for unequal sizes). Assumptions: (i) i.i.d. scores (the user's
  data); (ii) the plan's sizes are the agents' sizes (checked in
  :func:`~privcal.calibrators.federated_agent.fedcp_qq_message`); (iii) no
  score range (order statistics of the raw scores; +∞ when ℓ_j > n_j); (iv)
  every agent follows the protocol: its message is the specified order
  statistic of its own data; (v) which agents' messages are used is not chosen by
  their data (a session uses the first m to answer). privcal **cannot enforce
  (iv) or (v), so the recorded guarantee states them** (``over`` and
  ``statement``, versions 1.1.0 and 1.4.0): with no
  public score range a session can refuse only NaN and −∞, and with k = 1
  (often the plan's choice) one agent's message alone is the threshold.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import ClassVar

import numpy as np
from pydantic import Field, model_validator

from privcal.calibrators.base import (
    CalibrationInput,
    CalibrationResult,
    CalibratorParams,
    CoverageGuarantee,
    DataShape,
    PrivacyModel,
)
from privcal.calibrators.bound_floats import float_at_least, float_at_most, text_at_most
from privcal.calibrators.federated_agent import (
    HONEST_AGENTS,
    agents_planned_field,
    aggregate,
    answered_clause,
    chosen_clause,
    fedcp_qq_message,
    missing_agents,
    missing_clause,
    planned_agents,
)
from privcal.calibrators.fedplan import (
    FEAS_TOL,
    FedPlan,
    FedPlanUnequal,
    plan_fedcp_qq,
    plan_fedcp_qq_pinned,
    plan_fedcp_qq_unequal,
)
from privcal.calibrators.validation import agent_index, check_scores
from privcal.errors import InvalidInput

__all__ = ["PRIVACY_NONE", "FedCPQQ", "FedCPQQParams", "group_by_agent", "sizes_of"]

PRIVACY_NONE = "none (each agent reveals one order statistic of its data)"


class FedCPQQParams(CalibratorParams):
    """FedCP-QQ takes α; (ℓ, k) follow from α and the agents' sizes, unless ℓ is pinned."""

    agent_order: int | None = Field(
        default=None,
        ge=1,
        description=(
            "normally set by a collection session; pins the agents' answer level: the order ℓ "
            "each agent sent (the server order k is then replanned for the agents in the shape)"
        ),
    )
    agents_planned: int | None = agents_planned_field()

    @model_validator(mode="after")
    def _one_way(self) -> FedCPQQParams:
        if self.agent_order is not None and self.agents_planned is not None:
            raise ValueError("give agent_order (a replan for the agents that answered) or "
                             "agents_planned (the missing agents counted as +inf), not both")
        return self


def sizes_of(shape: DataShape) -> tuple[int, ...]:
    """The per-agent sizes of a federated shape (in sorted-agent order), checked against n."""
    sizes = shape.group_sizes
    if not sizes:
        raise InvalidInput("federated calibration needs the per-agent sizes (group_sizes)")
    if any(s < 1 for s in sizes):
        raise InvalidInput(f"every agent needs at least one score, got sizes {list(sizes)}")
    if sum(sizes) != shape.n:
        raise InvalidInput(f"agent sizes sum to {sum(sizes)}, but n = {shape.n}")
    return tuple(sizes)


def group_by_agent(data: CalibrationInput) -> list[np.ndarray]:
    """The scores of each agent, agents in sorted id order (the order of ``group_sizes``)."""
    if data.scores is None:
        raise InvalidInput("federated calibration needs scores")
    if data.agents is None:
        raise InvalidInput("federated calibration needs the agent of each score (--agent-of)")
    s = check_scores(data.scores, min_rows=1)
    a = np.asarray(data.agents)
    if a.ndim != 1:
        raise InvalidInput(f"agents must be a 1-D array of agent ids, got shape {a.shape}")
    if a.shape[0] != s.shape[0]:
        raise InvalidInput(
            f"length mismatch: scores has {s.shape[0]} rows, agents has {a.shape[0]} rows"
        )
    ids, inverse = agent_index(a)
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=ids.size)
    return np.split(s[order], np.cumsum(counts)[:-1])


def plan_for(params: FedCPQQParams, shape: DataShape) -> FedPlan | FedPlanUnequal:
    """The plan for this shape: the optimal (ℓ*, k*) when all agents have n scores (eq. (6)),
    else ℓ_j = ⌈(1−α)(n_j+1)⌉ and the smallest valid k (App. A.1).

    With ``params.agent_order`` set (a collection session closed with agents missing: the
    agents already sent their ℓ-th smallest score), ℓ is kept and k is the smallest server
    order with M_{ℓ,k} ≥ 1−α for the shape's m agents — the same computation as
    :func:`~privcal.calibrators.fedplan.replan_fedcp_qq_subset`. With
    ``params.agents_planned`` set (closed with agents missing, each counted as +∞), the
    plan is the one for that many agents of the shape's n scores: the published one.
    """
    sizes = sizes_of(shape)
    if params.agents_planned is not None:
        return plan_fedcp_qq(planned_agents(params.agents_planned, sizes), sizes[0],
                             params.alpha)
    if params.agent_order is not None:
        if len(set(sizes)) != 1:
            raise InvalidInput(
                f"a pinned agent order needs every agent to hold the same number of scores, "
                f"got sizes {sorted(set(sizes))}"
            )
        return plan_fedcp_qq_pinned(len(sizes), sizes[0], params.alpha, params.agent_order)
    if len(set(sizes)) == 1:
        return plan_fedcp_qq(len(sizes), sizes[0], params.alpha)
    return plan_fedcp_qq_unequal(sizes, params.alpha)


class FedCPQQ:
    """FedCP-QQ: each agent sends its ℓ-th smallest score, the server keeps the k-th smallest."""

    name: ClassVar[str] = "fedcp-qq"
    #: 1.4.0: the recorded guarantee states that which agents' messages are used is not
    #: chosen by their data (red team 25, fedlocal F4; same formula);
    #: 1.3.0: a release for the agents that answered can instead count each missing agent's
    #: message as +∞ under the published plan (``agents_planned``: no assumption on the
    #: dropout; same formula otherwise); 1.2.0: a release for the agents that answered
    #: (``agent_order`` pinned) states that they were not chosen by their data (red team
    #: 14; same formula); 1.1.0: the recorded
    #: guarantee states that every agent follows the protocol (red team 6; same formula)
    version: ClassVar[str] = "1.4.0"
    #: older versions ``privcal audit verify`` recomputes by this formula (their older
    #: sentences are counted, not compared)
    legacy_params: ClassVar[dict[str, dict[str, object]]] = {"1.0.0": {}, "1.1.0": {},
                                                              "1.2.0": {}, "1.3.0": {}}
    privacy_model: ClassVar[PrivacyModel] = "federated"
    Params: ClassVar[type[CalibratorParams]] = FedCPQQParams
    inputs: ClassVar[frozenset[str]] = frozenset({"scores", "agents"})
    summary: ClassVar[str] = (
        "one-shot federated quantile of quantiles (non-private): exact coverage M_{ℓ,k} ≥ 1−α"
    )
    #: what the release reveals, recorded as its privacy statement
    privacy_statement: ClassVar[str] = PRIVACY_NONE

    def cost(self, params: FedCPQQParams, shape: DataShape) -> None:
        """Non-private: each agent reveals one order statistic of its data."""
        return None

    def plan(self, params: FedCPQQParams, shape: DataShape) -> FedPlan | FedPlanUnequal:
        """The public plan (see :func:`plan_for`)."""
        return plan_for(params, shape)

    def guarantee(self, params: FedCPQQParams, shape: DataShape) -> CoverageGuarantee:
        """Coverage ≥ 1−α, = M_{ℓ,k} for continuous scores (Thm 3.2; App. A.1 for unequal sizes)."""
        return self.guarantee_as(self.version, params, shape)

    def guarantee_as(self, version: str, params: FedCPQQParams,
                     shape: DataShape) -> CoverageGuarantee:
        """:meth:`guarantee` as calibrator ``version`` recorded it. The planner accepts a plan
        whose computed M is within :data:`~privcal.calibrators.fedplan.coverage.FEAS_TOL` below
        1−α (M is a quadrature, off by ~1e-14): since 1.1.0 the recorded lower bound is then
        M − FEAS_TOL, never 1−α above the plan's exact coverage, and the upper bound
        M + FEAS_TOL (red team 6: m = 1, n = 9, α = 0.6999999999995 recorded 0.3000000000005
        for an exact coverage of 3/10); 1.0.0 recorded 1−α and M."""
        missing = missing_agents(params.agents_planned, shape.group_sizes, version, "1.3.0",
                                 self.name)
        plan = plan_for(params, shape)
        alpha = params.alpha
        lower, upper, said = 1 - alpha, plan.M, f"{1 - alpha:.6g}"
        if version != "1.0.0":
            proven = Fraction(plan.M) - Fraction(FEAS_TOL)  # the exact M is at least this
            lower = float_at_most(1 - alpha, proven)
            upper = min(1.0, float_at_least(plan.M, Fraction(plan.M) + Fraction(FEAS_TOL)))
            said = text_at_most(lower, proven)
        details: dict[str, float | int | str | None] = {
            "alpha": alpha,
            "m": plan.m,
            "k": plan.k,
            "M": plan.M,
            "privacy": PRIVACY_NONE,
            "upper_requires": "continuous scores (Thm 3.2 is then an equality)",
        }
        exactly = f"; exactly M = {plan.M:.10f} when the scores are continuous"
        if missing:  # a missing message counted as +∞ only raises the threshold: no equality
            upper, exactly = None, ""
            del details["upper_requires"]
        if isinstance(plan, FedPlan) and params.agent_order is not None:
            details.update(
                n=plan.n,
                l=plan.l,
                plan="agent order ℓ pinned (sent by the agents); smallest k with M_{ℓ,k} ≥ 1−α",
            )
        elif isinstance(plan, FedPlan):
            details.update(n=plan.n, l=plan.l, plan="optimal (ℓ*, k*), Alg. 1 eq. (6)")
            if missing:
                details.update(answered=len(shape.group_sizes or ()),
                               missing="each missing agent's message counted as +inf")
        else:
            details.update(
                sizes=",".join(map(str, plan.sizes)),
                ls=",".join(map(str, plan.ls)),
                plan="ℓ_j = ⌈(1−α)(n_j+1)⌉, smallest k (App. A.1)",
            )
        answered = answered_clause(params.agent_order is not None, version, "1.2.0")
        if missing:
            answered = missing_clause(len(shape.group_sizes or ()), plan.m)
        answered = chosen_clause(params.agent_order is not None, version, "1.4.0") + answered
        return CoverageGuarantee(
            target=1 - alpha,
            lower=lower,
            upper=upper,
            failure_probability=0.0,
            over=(
                "calibration scores of all agents and the test point (marginal; i.i.d. "
                f"scores), {HONEST_AGENTS}{answered}"
            ),
            rank=plan.k,
            statement=(
                f"P(Y ∈ C(X)) ≥ {said} over all agents' calibration data and the test "
                f"point, {HONEST_AGENTS}{answered}{exactly}"
            ),
            details=details,
        )

    def check_inputs(self, params: FedCPQQParams, data: CalibrationInput) -> None:
        """What :meth:`calibrate` refuses (:func:`group_by_agent`: the scores and agent ids),
        refused before the run goes on (the same check as FedCP²-QQ's, charged per agent)."""
        group_by_agent(data)

    def only_infinite(self, params: FedCPQQParams, shape: DataShape) -> bool:
        """Whether fewer than k messages can be finite — an agent of n_j scores sends +∞
        when ℓ_j > n_j (App. A.1 plans may have such agents), a missing agent counts as +∞
        —, so the server's k-th smallest is +∞ whatever the data (red team 20, coverage F2:
        sizes (1, 1, 1, 5) at α = 0.1)."""
        plan = plan_for(params, shape)
        if isinstance(plan, FedPlan):
            finite = len(sizes_of(shape)) if plan.l <= plan.n else 0
        else:
            finite = sum(ell <= n for ell, n in zip(plan.ls, plan.sizes, strict=True))
        return finite < plan.k

    def calibrate(
        self, data: CalibrationInput, params: FedCPQQParams, rng: random.Random
    ) -> CalibrationResult:
        """Run Algorithm 1 in one process: each agent's message, then the server's k-th smallest."""
        groups = group_by_agent(data)
        shape = DataShape(n=sum(g.size for g in groups), group_sizes=tuple(g.size for g in groups))
        plan = plan_for(params, shape)
        messages = [fedcp_qq_message(g, plan) for g in groups]
        threshold = aggregate(messages, plan, missing_as_inf=params.agents_planned is not None)
        diag: dict[str, object] = {"m": plan.m, "k": plan.k, "M": plan.M}
        if isinstance(plan, FedPlan):
            diag.update(n=plan.n, l=plan.l)
        else:
            diag.update(sizes=list(plan.sizes), ls=list(plan.ls))
        return CalibrationResult(threshold=threshold, diagnostics=diag)
