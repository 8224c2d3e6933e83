"""FedCP²-QQ plans: γ, (ℓ_γ, k_γ), ℓ_cor and the agents' level q (Humbert et al. 2023, Alg. 3).

SPEC §10. The γ search itself is in :mod:`privcal.calibrators.fedplan.gamma_search`.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from privcal.calibrators.bound_floats import count_text
from privcal.calibrators.fedplan.gamma_search import gamma_search
from privcal.calibrators.fedplan.limits import (
    MAX_AGENTS,
    MAX_BINS,
    MAX_LOCAL_N,
    check_alpha,
    check_int,
)
from privcal.errors import InfeasiblePlan, InvalidInput


class Fed2Plan(BaseModel):
    """A FedCP²-QQ plan (Humbert et al. 2023, Algorithm 3; SPEC §10).

    Each agent answers the ε-DP exponential-mechanism quantile at level ``q``
    over the public grid of ``bins`` points on [``lower``, ``smax``] (``smax`` is the
    public upper end, ``upper`` in the calibrator's parameters); the server takes
    the ``k``-th smallest answer (k = k_γ). ``M`` = M_{ℓ_γ+ℓ_cor, k_γ}, the
    criterion minimised over γ (the coverage of non-private FedCP-QQ at the
    corrected order; it is not the coverage of the private protocol, whose
    guarantee is ≥ 1−α).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["fedcp2-qq"] = "fedcp2-qq"
    gamma: float
    l_gamma: int = Field(ge=1)
    k_gamma: int = Field(ge=1)
    l_cor: int = Field(ge=0)
    q: float = Field(ge=0.5, lt=1)
    M: float = Field(description="M_{ℓ_γ+ℓ_cor, k_γ}, the γ-selection criterion")
    M_gamma: float = Field(description="M_{ℓ_γ, k_γ} ≥ (1−α)/(1−γα)")
    m: int = Field(ge=1)
    n: int = Field(ge=1)
    alpha: float = Field(gt=0, lt=1)
    epsilon: float = Field(gt=0)
    bins: int = Field(ge=2)
    smax: float = Field(allow_inf_nan=False, description="public upper end of the grid")
    lower: float = Field(default=0.0, allow_inf_nan=False, description="public lower end")

    @model_validator(mode="after")
    def _range(self) -> Fed2Plan:
        if not self.lower < self.smax:
            raise ValueError(f"grid needs lower < upper, got [{self.lower}, {self.smax}]")
        return self

    @property
    def k(self) -> int:
        """Server order (= k_γ)."""
        return self.k_gamma

    @property
    def proof_bound(self) -> float:
        """M_{ℓ_γ,k_γ}·(1−γα) ≥ 1−α: the lower bound the proof of Thm 4.1 actually gives."""
        return self.M_gamma * (1 - self.gamma * self.alpha)


def plan_fedcp2_qq(
    m: int,
    n: int,
    alpha: float,
    eps: float,
    bins: int = 100,
    smax: float = 1.0,
    lower: float = 0.0,
) -> Fed2Plan:
    """Choose γ, (ℓ_γ, k_γ), ℓ_cor and the agents' level q (Humbert et al. 2023, Alg. 3, §4).

    For γ on the grid 0.01..0.99: (ℓ_γ, k_γ) is the FedCP-QQ selection at level
    (1−α)/(1−γα), ℓ_cor is eq. (10); γ is kept if ℓ_γ+ℓ_cor < n and the one
    minimising M_{ℓ_γ+ℓ_cor, k_γ} wins (ties: the smallest γ). q =
    max((ℓ_γ+ℓ_cor)/n, 1/2) (Alg. 3).

    **Decision**: feasibility is ℓ_γ+ℓ_cor < n, not ≤ n: at ℓ_γ+ℓ_cor = n the
    level q is 1 and the mechanism's sensitivity max(1/q, 1/(1−q)) is infinite
    (Lemma C.4 needs q ∈ [1/2, 1)).
    Pruning (exact): M_{ℓ_γ+ℓ_cor,k_γ} ≥ M_{ℓ_γ,k_γ} ≥ (1−α)/(1−γα), which grows
    with γ, so the scan stops once that level reaches the best criterion found.
    """
    return _plan2_cached(*_check_fed2(m, n, alpha, eps, bins, smax, lower))


def _check_fed2(
    m: object, n: object, alpha: object, eps: object, bins: object, smax: object,
    lower: object = 0.0,
) -> tuple[int, int, float, float, int, float, float]:
    m = check_int("number of agents", m, 1, MAX_AGENTS)
    n = check_int("local size n", n, 1, MAX_LOCAL_N)
    alpha = check_alpha(alpha)
    if (
        isinstance(eps, bool)
        or not isinstance(eps, int | float)
        or not (math.isfinite(eps) and eps > 0)
    ):
        raise InvalidInput(f"ε must be a finite number > 0, got {eps!r}")
    bins = check_int("number of bins", bins, 2, MAX_BINS)
    for what, v in (("lower", lower), ("upper (S_max)", smax)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise InvalidInput(f"{what} must be a finite number, got {v!r}")
    if not lower < smax:  # type: ignore[operator]
        raise InvalidInput(f"the grid needs lower < upper, got [{lower}, {smax}]")
    return m, n, alpha, float(eps), bins, float(smax), float(lower)  # type: ignore[arg-type]


def _fed2_plan(
    best: tuple[float, float, int, int, int, float],
    q: float, m: int, n: int, alpha: float, eps: float, bins: int, smax: float,
    lower: float = 0.0,
) -> Fed2Plan:
    """The plan record of a γ-search result (crit, γ, ℓ_γ, k_γ, ℓ_cor, M_γ) at agent level q."""
    crit, gamma, l_g, k_g, l_cor, m_g = best
    return Fed2Plan(
        gamma=gamma, l_gamma=l_g, k_gamma=k_g, l_cor=l_cor, q=q, M=crit, M_gamma=m_g,
        m=m, n=n, alpha=alpha, epsilon=eps, bins=bins, smax=smax, lower=lower,
    )  # fmt: skip


@lru_cache(maxsize=128)
def _plan2_cached(
    m: int, n: int, alpha: float, eps: float, bins: int, smax: float, lower: float
) -> Fed2Plan:
    best, min_cor = gamma_search(m, n, alpha, eps, bins, n - 1)
    if best is None:
        detail = f"the privacy correction alone is ℓ_cor ≥ {count_text(min_cor)}" if min_cor else ""
        raise InfeasiblePlan(
            f"no FedCP²-QQ plan: ε={eps:g} is too small for n={n} scores per agent "
            f"(m={m}, α={alpha:g}, B={bins}): for every γ in 0.01..0.99, ℓ_γ + ℓ_cor ≥ n"
            + (f"; {detail}" if detail else "")
        )
    q = max((best[2] + best[4]) / n, 0.5)
    return _fed2_plan(best, q, m, n, alpha, eps, bins, smax, lower)


def answer_budget(n: int, q: float) -> int:
    """⌊n·q⌋: the largest ℓ_γ + ℓ_cor that answers at level q support (Lemma C.4).

    n·q is an integer or n/2 for the levels :func:`plan_fedcp2_qq` chooses; the
    epsilon absorbs the float product. Capped at n−1 (q < 1).
    """
    return min(math.floor(n * q + 1e-9), n - 1)


def plan_fedcp2_qq_pinned(
    m: int,
    n: int,
    alpha: float,
    eps: float,
    q: float,
    bins: int = 100,
    smax: float = 1.0,
    lower: float = 0.0,
) -> Fed2Plan:
    """A FedCP²-QQ plan for m agents that answer (or answered) at the fixed level ``q``.

    What the proof of Thm 4.1 (App. C.4) needs from answers at level q is
    n·q ≥ ℓ_γ + ℓ_cor (Lemma C.4 with δ = 1−(1−γα)^{1/m}). So the γ search of
    :func:`plan_fedcp2_qq` is run for m agents with the budget
    ℓ_γ + ℓ_cor ≤ ⌊n·q⌋, and ``q`` stays the given level. Used for agents
    missing from a collection session (:func:`replan_fedcp2_qq_subset`) and by
    the calibrator when its ``level`` is pinned. Raises :class:`InfeasiblePlan`
    when no γ fits, :class:`InvalidInput` when q is not in [1/2, 1).
    """
    if (
        isinstance(q, bool)
        or not isinstance(q, int | float)
        or not (math.isfinite(q) and 0.5 <= q < 1)
    ):
        raise InvalidInput(f"the agents' level q must be a number in [1/2, 1), got {q!r}")
    m, n, alpha, eps, bins, smax, lower = _check_fed2(m, n, alpha, eps, bins, smax, lower)
    return _plan2_pinned_cached(m, n, alpha, eps, bins, smax, float(q), lower)


@lru_cache(maxsize=128)
def _plan2_pinned_cached(
    m: int, n: int, alpha: float, eps: float, bins: int, smax: float, q: float, lower: float
) -> Fed2Plan:
    budget = answer_budget(n, q)
    best, _ = gamma_search(m, n, alpha, eps, bins, budget)
    if best is None:
        raise InfeasiblePlan(
            f"no FedCP²-QQ plan for m={m} agents answering at level q={q:g}: for every γ in "
            f"0.01..0.99, ℓ_γ + ℓ_cor > ⌊n·q⌋ = {budget} (n={n}, α={alpha:g}, ε={eps:g}, "
            f"B={bins})"
        )
    return _fed2_plan(best, q, m, n, alpha, eps, bins, smax, lower)


def replan_fedcp2_qq_subset(plan: Fed2Plan, m_answered: int) -> Fed2Plan:
    """A FedCP²-QQ plan for the ``m_answered`` agents that did answer at level ``plan.q``.

    The answers are fixed, so this is :func:`plan_fedcp2_qq_pinned` for m'
    agents at the level ``plan.q`` the agents used (the γ search rerun with
    ℓ_γ + ℓ_cor ≤ ⌊n·q⌋). Valid when which agents answer does not depend on
    their scores. Raises :class:`InfeasiblePlan` when no γ fits.
    """
    m2 = check_int("number of answering agents", m_answered, 1, plan.m)
    try:
        return plan_fedcp2_qq_pinned(
            m2, plan.n, plan.alpha, plan.epsilon, plan.q, bins=plan.bins, smax=plan.smax,
            lower=plan.lower,
        )
    except InfeasiblePlan:
        raise InfeasiblePlan(
            f"with {m2} of {plan.m} agents answering at level q={plan.q:g}, no γ keeps "
            f"ℓ_γ + ℓ_cor ≤ n·q = {answer_budget(plan.n, plan.q)}: the guarantee cannot be "
            "recomputed"
        ) from None

