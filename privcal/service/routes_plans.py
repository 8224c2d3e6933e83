"""Planning routes for analysts: ``advise``, ``amplify`` and ``fed plan`` over HTTP.

Each route is the CLI command's library call (:func:`privcal.calibrators.advisor.advise`,
:func:`privcal.accountant.privacy.shuffle.amplify`,
:func:`privcal.calibrators.fedplan_choice.plan_federated`) with a strict request model;
the answer is the command's ``--json`` document. They read and write nothing on the
ledger (no dataset, no charge), so they need no Idempotency-Key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from privcal.errors import InvalidInput
from privcal.service.auth import allow
from privcal.service.common import doc

router = APIRouter(prefix="/v1")

#: size bounds of the planning inputs (the library checks the rest, one-line 422s)
MAX_N = 10**12


def _computed(fn: Callable[[], Any]) -> Any:
    """``fn()``'s document. The library turns a numeric failure at the edge of the float
    range (e.g. ε = 5e-324, found by schemathesis) into a one-line InvalidInput — a 422 here
    (:func:`privcal.errors.numeric_edge`)."""
    return doc(fn())


class AdviseBody(BaseModel):
    """``POST /v1/advise``: as ``privcal advise``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    n: int = Field(ge=1, le=MAX_N, description="number of calibration subjects")
    k: int = Field(ge=2, le=1_000_000, description="number of classes")
    epsilon: float = Field(gt=0, description="local ε each subject spends")
    alpha: float = Field(gt=0, lt=1, description="miscoverage level α")
    failure_probability: float = Field(
        default=0.001, gt=0, lt=1,
        description="failure probability δ of the coverage bound (not a DP δ)")
    slack: float | None = Field(default=None, gt=0,
                                description="a slack Δ to reach: the smallest ε and n per method")
    rounds: int | None = Field(default=None, ge=1, le=10_000, description="LDP-CP-S rounds T")


class AmplifyBody(BaseModel):
    """``POST /v1/amplify``: as ``privcal amplify``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    epsilon0: float = Field(gt=0, description="local ε0 of each report's randomizer")
    n: int = Field(ge=1, le=MAX_N, description="number of shuffled reports")
    delta: float = Field(gt=0, lt=1, description="target δ of the central guarantee")
    randomizer: Literal["binary-rr", "krr", "generic"] = "generic"
    k: int | None = Field(default=None, ge=2, le=1_000_000,
                          description="number of categories of k-RR")


class FedPlanBody(BaseModel):
    """``POST /v1/fed/plan``: as ``privcal fed plan`` (``local_n``: one size, or one per
    agent for FedCP-QQ with unequal sizes; ``epsilon``: plan FedCP²-QQ)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    agents: int | None = Field(default=None, ge=1, le=10_000)
    local_n: int | list[int] = Field(description="scores per agent, or one size per agent")
    alpha: float = Field(gt=0, lt=1)
    epsilon: float | None = Field(default=None, gt=0)
    bins: int = Field(default=100, ge=2, le=1_000_000)
    lower: float = 0.0
    upper: float = 1.0


@router.post("/advise", **allow("analyst"))
def advise(body: AdviseBody) -> dict[str, Any]:
    """LDP-CP-L vs LDP-CP-S slack for (n, k, ε, α) — the ``privcal advise --json`` document."""
    from privcal.calibrators.advisor import advise as run

    return _computed(lambda: run(body.n, body.k, body.epsilon, body.alpha,
                                 body.failure_probability, slack=body.slack,
                                 rounds=body.rounds))


@router.post("/amplify", **allow("analyst"))
def amplify(body: AmplifyBody) -> dict[str, Any]:
    """The proven central (ε, δ) of n shuffled ε0-LDP reports — ``privcal amplify --json``."""
    from privcal.accountant.privacy.shuffle import amplify as run

    return _computed(lambda: run(body.epsilon0, body.n, body.delta, body.randomizer, body.k))


@router.post("/fed/plan", **allow("analyst"))
def fed_plan(body: FedPlanBody) -> dict[str, Any]:
    """The public plan of a one-shot federated calibration — ``privcal fed plan --json``."""
    from privcal.calibrators.fedplan_choice import plan_federated

    sizes = [body.local_n] if isinstance(body.local_n, int) else body.local_n
    if any(s < 1 for s in sizes):
        raise InvalidInput("local_n: every local size must be ≥ 1")
    return _computed(lambda: plan_federated(body.agents, sizes, body.alpha, body.epsilon,
                                            body.bins, body.upper, body.lower))
