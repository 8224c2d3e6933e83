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
from privcal.service.fed_limits import check_fed_work
from privcal.service.json_body import JsonRoute

router = APIRouter(prefix="/v1", route_class=JsonRoute)

#: size bounds of the planning inputs (the library checks the rest, one-line 422s)
MAX_N = 10**12
#: the most shuffled reports ``POST /v1/amplify`` computes a bound for: the largest group of
#: a shuffled session (``group_size``), ≤ 2.2 s of CPU on a loaded 2-core machine over the
#: randomizers, ε0 and δ (red team 23, service F1: n = 10⁹, the library's bound, took 12–15 s
#: alone, 40 s three at once); ``privcal amplify`` and the library evaluate up to 10⁹ (a
#: larger n gets the bound at 10⁹, which holds for it)
AMPLIFY_MAX_N = 10**8


def _computed(fn: Callable[[], Any]) -> Any:
    """``fn()``'s document. The library turns a numeric failure at the edge of the float
    range (e.g. ε = 5e-324, found by schemathesis) into a one-line InvalidInput — a 422 here
    (:func:`privcal.errors.numeric_edge`)."""
    return doc(fn())


class AdviseBody(BaseModel):
    """``POST /v1/advise``: as ``privcal advise`` — ``method`` ``local`` (the default: LDP-CP-L
    vs LDP-CP-S for ``n``, ``k``, ``epsilon``), or ``pcoqs`` (``rho``) / ``exponq``
    (``epsilon``): the smallest n with a finite threshold (and, with ``n``, whether it is
    reached). A field that does not apply to the method is refused, not ignored."""

    model_config = ConfigDict(strict=True, extra="forbid")

    method: Literal["local", "pcoqs", "exponq"] = Field(
        default="local", description="local: LDP-CP-L vs LDP-CP-S; pcoqs or exponq: the "
        "smallest n at which that central method can return a finite threshold")
    n: int | None = Field(default=None, ge=1, le=MAX_N,
                          description="number of calibration subjects (required for local)")
    k: int | None = Field(default=None, ge=2, le=1_000_000,
                          description="number of classes (local; required there)")
    epsilon: float | None = Field(default=None, gt=0,
                                  description="ε: local ε each subject spends, or ExponQ's ε")
    rho: float | None = Field(default=None, gt=0, description="pcoqs: ρ (zCDP)")
    alpha: float = Field(gt=0, lt=1, description="miscoverage level α")
    nominal: bool = Field(default=False, description="pcoqs: the paper's nominal rank")
    failure_probability: float | None = Field(
        default=None, gt=0, lt=1,
        description="failure probability of the coverage bound (not a DP δ); default 0.001 "
        "for local, 0.05 for pcoqs")
    slack: float | None = Field(default=None, gt=0,
                                description="a slack Δ to reach: the smallest ε and n per method")
    rounds: int | None = Field(default=None, ge=1, le=10_000, description="LDP-CP-S rounds T")
    tol: float | None = Field(default=None, gt=0,
                              description="pcoqs: the search's resolution (default 1e-10)")


#: per ``advise`` method: the fields it needs, and those it takes (the CLI's options)
_ADVISE_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "local": (("n", "k", "epsilon"), ("failure_probability", "slack", "rounds")),
    "pcoqs": (("rho",), ("n", "nominal", "failure_probability", "tol")),
    "exponq": (("epsilon",), ("n",)),
}


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
    #: the FedCP²-QQ grid (with ``epsilon`` only: 422 without it); defaults 100, 0, 1
    bins: int | None = Field(default=None, ge=2, le=1_000_000)
    lower: float | None = None
    upper: float | None = None


@router.post("/advise", **allow("analyst"))
def advise(body: AdviseBody) -> dict[str, Any]:
    """The ``privcal advise --json`` document: LDP-CP-L vs LDP-CP-S slack for (n, k, ε, α),
    or (``method`` pcoqs/exponq) the smallest n for a finite central threshold."""
    needs, takes = _ADVISE_FIELDS[body.method]
    given = {f for f in body.model_fields_set - {"method", "alpha"}
             if getattr(body, f) not in (None, False)}
    for name in needs:
        if getattr(body, name) is None:
            raise InvalidInput(f"advise method {body.method} needs {name}")
    if extra := sorted(given - set(needs) - set(takes)):
        raise InvalidInput(f"advise method {body.method} takes no {extra[0]} (it applies to "
                           + " or ".join(m for m, (nd, tk) in _ADVISE_FIELDS.items()
                                         if extra[0] in nd + tk) + ")")
    fp = body.failure_probability
    if body.method != "local":
        from privcal.calibrators.advisor_central import advise_central

        return _computed(lambda: advise_central(
            body.method, body.alpha, n=body.n, rho=body.rho, epsilon=body.epsilon,
            nominal=body.nominal, failure_probability=fp if fp is not None else 0.05,
            tol=body.tol))
    from privcal.calibrators.advisor import advise as run

    return _computed(lambda: run(body.n, body.k, body.epsilon, body.alpha,
                                 fp if fp is not None else 0.001, slack=body.slack,
                                 rounds=body.rounds))


@router.post("/amplify", **allow("analyst"))
def amplify(body: AmplifyBody) -> dict[str, Any]:
    """The proven central (ε, δ) of n shuffled ε0-LDP reports — ``privcal amplify --json``;
    n ≤ :data:`AMPLIFY_MAX_N` (the bound's work grows with n: 422 past it, one line)."""
    from privcal.accountant.privacy.shuffle import amplify as run

    if body.n > AMPLIFY_MAX_N:
        raise InvalidInput(f"n: at most {AMPLIFY_MAX_N:,} shuffled reports per request here "
                           f"(got {body.n:,}); `privcal amplify` and the library take up to "
                           "1,000,000,000")
    return _computed(lambda: run(body.epsilon0, body.n, body.delta, body.randomizer, body.k))


@router.post("/fed/plan", **allow("analyst"))
def fed_plan(body: FedPlanBody) -> dict[str, Any]:
    """The public plan of a one-shot federated calibration — ``privcal fed plan --json``.

    At most the work of :mod:`privcal.service.fed_limits` (fewer agents and smaller local
    sizes than the CLI: a larger request is 422, one line naming the limit)."""
    from privcal.calibrators.fedplan_choice import plan_federated

    sizes = [body.local_n] if isinstance(body.local_n, int) else body.local_n
    if any(s < 1 for s in sizes):
        raise InvalidInput("local_n: every local size must be ≥ 1")
    check_fed_work(body.agents, sizes, body.epsilon is not None)  # a request's work (422)
    return _computed(lambda: plan_federated(body.agents, sizes, body.alpha, body.epsilon,
                                            body.bins, body.upper, body.lower))
