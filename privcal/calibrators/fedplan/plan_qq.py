"""FedCP-QQ plans for agents of one size n: (ℓ*, k*), and the server order for fewer agents.

Humbert et al. 2023, Algorithm 1 and Thm 3.2 (SPEC §9).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from privcal.calibrators.bound_floats import count_text
from privcal.calibrators.fedplan.coverage import FEAS_TOL, table
from privcal.calibrators.fedplan.limits import (
    MAX_AGENTS,
    MAX_LOCAL_N,
    check_alpha,
    check_int,
)
from privcal.calibrators.fedplan.selection import select
from privcal.errors import InfeasiblePlan, InvalidInput


class FedPlan(BaseModel):
    """A FedCP-QQ plan: agents send their ℓ-th smallest score, the server takes the k-th smallest.

    ``M`` is the exact coverage M_{ℓ,k} ≥ 1−α (Thm 3.2).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["fedcp-qq"] = "fedcp-qq"
    l: int = Field(ge=1, description="agent order ℓ (1-based)")  # noqa: E741 (the paper's ℓ)
    k: int = Field(ge=1, description="server order k (1-based)")
    M: float = Field(description="exact coverage M_{ℓ,k} for continuous scores (Thm 3.2)")
    m: int = Field(ge=1, description="number of agents")
    n: int = Field(ge=1, description="scores per agent")
    alpha: float = Field(gt=0, lt=1)


def plan_fedcp_qq(m: int, n: int, alpha: float) -> FedPlan:
    """(ℓ*, k*) = argmin{M_{ℓ,k} : M_{ℓ,k} ≥ 1−α} (Humbert et al. 2023, Alg. 1, eq. (6)).

    Raises :class:`InfeasiblePlan` when even M_{n,m} = mn/(mn+1) < 1−α (every
    agent sends its maximum and the server takes the largest).
    """
    m = check_int("number of agents", m, 1, MAX_AGENTS)
    n = check_int("local size n", n, 1, MAX_LOCAL_N)
    alpha = check_alpha(alpha)
    return _plan_cached(m, n, alpha)


@lru_cache(maxsize=256)
def _plan_cached(m: int, n: int, alpha: float) -> FedPlan:
    sel = select(table(m, n), 1.0 - alpha)
    if sel is None:
        need = math.ceil(Fraction(1) / Fraction(str(alpha))) - 1  # exact: α may be 1e-310
        raise InfeasiblePlan(
            f"no FedCP-QQ plan reaches coverage {1 - alpha:g} with m={m} agents of n={n} scores: "
            f"even the maximum of all m·n = {m * n} scores only covers {m * n}/{m * n + 1}; "
            f"need m·n ≥ {count_text(need)}"
        )
    ell, k, M, _ = sel
    return FedPlan(l=ell, k=k, M=M, m=m, n=n, alpha=alpha)


def plan_fedcp_qq_pinned(m: int, n: int, alpha: float, ell: int) -> FedPlan:
    """The FedCP-QQ plan for m agents that send (or sent) their ``ell``-th smallest score.

    The agent order ℓ is fixed; the server order is the smallest k ≤ m with
    M_{ℓ,k} ≥ 1−α (Thm 3.2), which, M being non-decreasing in k, also has the
    smallest coverage above 1−α for that ℓ. This is what a collection session
    needs when fewer agents answered than planned (:func:`replan_fedcp_qq_subset`)
    and what the calibrator recomputes from a pinned ``agent_order``.
    Raises :class:`InfeasiblePlan` when even k = m falls short.
    """
    m = check_int("number of agents", m, 1, MAX_AGENTS)
    n = check_int("local size n", n, 1, MAX_LOCAL_N)
    alpha = check_alpha(alpha)
    if isinstance(ell, bool) or not isinstance(ell, int | np.integer) or int(ell) < 1:
        raise InvalidInput(f"agent order ℓ must be an integer ≥ 1, got {ell!r}")
    ell = int(ell)
    if ell > n:
        raise InfeasiblePlan(
            f"agent order ℓ={ell} is not an order statistic of n={n} scores per agent"
        )
    tab = table(m, n)
    tgt = 1 - alpha - FEAS_TOL
    if tab(ell, m) < tgt:
        raise InfeasiblePlan(
            f"no server order reaches coverage {1 - alpha:g} with m={m} agents sending their "
            f"ℓ={ell}-th smallest of n={n} scores (best M = {tab(ell, m):.6g})"
        )
    lo, hi = 0, m
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tab(ell, mid) >= tgt:
            hi = mid
        else:
            lo = mid
    return FedPlan(l=ell, k=hi, M=tab(ell, hi), m=m, n=n, alpha=alpha)


def replan_fedcp_qq_subset(plan: FedPlan, m_answered: int) -> FedPlan:
    """The server order for the ``m_answered`` agents that did send their ℓ-th smallest score.

    The agents' messages are fixed (order ℓ); with m' of them, the k-th
    smallest covers M_{ℓ,k} for m' agents (Thm 3.2), so k' = min{k ≤ m' :
    M_{ℓ,k} ≥ 1−α} (:func:`plan_fedcp_qq_pinned`). Valid when which agents
    answer does not depend on their scores. Raises :class:`InfeasiblePlan`
    when even k' = m' falls short.
    """
    m2 = check_int("number of answering agents", m_answered, 1, plan.m)
    try:
        return plan_fedcp_qq_pinned(m2, plan.n, plan.alpha, plan.l)
    except InfeasiblePlan as exc:
        raise InfeasiblePlan(f"with {m2} of {plan.m} agents answering: {exc}") from None
