"""``privcal fed plan``: the public plan of a one-shot federated calibration (SPEC §9–10).

A thin skin over :mod:`privcal.calibrators.fedplan`: FedCP-QQ without
``--epsilon`` (equal sizes, or a comma list of local sizes), FedCP²-QQ with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from privcal.calibrators.bound_floats import float_text
from privcal.cli import progress
from privcal.cli.app import emit, json_option, main, table
from privcal.cli.number_types import Integer, IntList, Number
from privcal.cli.output import at_least
from privcal.errors import InvalidInput

if TYPE_CHECKING:  # the planning module pulls in SciPy: imported when a plan is made
    from privcal.calibrators.fedplan import Fed2Plan, FedPlan, FedPlanUnequal


@main.group("fed")
def fed() -> None:
    """One-shot federated calibration (FedCP-QQ, FedCP²-QQ): plans."""


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise InvalidInput(
            f"--local-n must be an integer or a comma list of integers: {text!r}"
        ) from exc
    if not sizes:
        raise InvalidInput("--local-n is empty")
    return sizes


def plan_from_options(
    agents: int | None,
    local_n: str,
    alpha: float,
    epsilon: float | None,
    bins: int | None,
    upper: float | None,
    lower: float | None = None,
) -> FedPlan | FedPlanUnequal | Fed2Plan:
    """The plan the options describe (:func:`privcal.calibrators.fedplan_choice.plan_federated`,
    the library call behind ``privcal fed plan``), with the options' own one-line errors."""
    from privcal.calibrators.fedplan import MAX_AGENTS
    from privcal.calibrators.fedplan_choice import plan_federated

    sizes = _sizes(local_n)
    if agents is not None and not 1 <= agents <= MAX_AGENTS:
        raise InvalidInput(f"--agents must be in [1, {MAX_AGENTS}], got {agents}")
    if len(sizes) == 1 and agents is None:
        raise InvalidInput("--agents is required with a single --local-n")
    if len(sizes) > 1 and agents is not None and agents != len(sizes):
        raise InvalidInput(f"--agents {agents} but --local-n lists {len(sizes)} sizes")
    if epsilon is not None and len(set(sizes)) > 1:
        raise InvalidInput("FedCP²-QQ (--epsilon) needs equal local sizes")
    grid = [f"--{name}" for name, v in (("bins", bins), ("lower", lower), ("upper", upper))
            if v is not None]
    if epsilon is None and grid:  # red team 23, fedlocal F2: dropped without a word
        raise InvalidInput(f"{'/'.join(grid)} set the FedCP²-QQ grid, which needs --epsilon; "
                           "without it the plan is FedCP-QQ's, which has no grid (give "
                           "--epsilon, or leave them out)")
    return plan_federated(agents, sizes, alpha, epsilon, bins, upper, lower)


def _human(plan: FedPlan | FedPlanUnequal | Fed2Plan) -> str:
    from privcal.calibrators.fedplan import FedPlan, FedPlanUnequal

    if isinstance(plan, FedPlan):
        rows = [
            {"quantity": "agents m", "value": plan.m},
            {"quantity": "local size n", "value": plan.n},
            {"quantity": "agent order ℓ", "value": plan.l},
            {"quantity": "server order k", "value": plan.k},
            {"quantity": "coverage M_{ℓ,k}", "value": at_least(plan.M, ".10f")},
        ]
        note = (
            f"FedCP-QQ: each agent sends its ℓ={plan.l}-th smallest score, the server keeps the "
            f"k={plan.k}-th smallest; coverage ≥ {at_least(1 - plan.alpha, 'g')} (= M for "
            "continuous scores)."
        )
    elif isinstance(plan, FedPlanUnequal):
        rows = [
            {"quantity": "agents m", "value": plan.m},
            {"quantity": "local sizes n_j", "value": ",".join(map(str, plan.sizes))},
            {"quantity": "agent orders ℓ_j", "value": ",".join(map(str, plan.ls))},
            {"quantity": "server order k", "value": plan.k},
            {"quantity": "coverage M", "value": at_least(plan.M, ".10f")},
        ]
        note = (
            "FedCP-QQ, unequal sizes: agent j sends its ℓ_j-th smallest score (+inf if ℓ_j > n_j); "
            f"coverage ≥ {at_least(1 - plan.alpha, 'g')} (= M for continuous scores)."
        )
    else:
        rows = [
            {"quantity": "agents m", "value": plan.m},
            {"quantity": "local size n", "value": plan.n},
            {"quantity": "γ", "value": plan.gamma},
            {"quantity": "ℓ_γ", "value": plan.l_gamma},
            {"quantity": "ℓ_cor", "value": plan.l_cor},
            {"quantity": "k_γ (server order)", "value": plan.k_gamma},
            {"quantity": "agent level q", "value": float_text(plan.q)},
            {"quantity": "M_{ℓ_γ+ℓ_cor,k_γ}", "value": at_least(plan.M, ".10f")},
            {"quantity": "grid",
             "value": f"{plan.bins} points on [{float_text(plan.lower)}, {float_text(plan.smax)}]"},
        ]
        note = (
            f"FedCP²-QQ: guarantee coverage ≥ {at_least(1 - plan.alpha, 'g')} (Thm 4.1); "
            "each agent "
            f"{plan.epsilon!r}-DP w.r.t. its own scores."  # exact, never rounded down
        )
    return table(rows) + "\n" + note


@fed.command("plan")
@click.option("--agents", "agents", type=Integer(), default=None, help="Number of agents m.")
@click.option(
    "--local-n",
    "local_n",
    type=IntList(),
    required=True,
    help="Scores per agent n, or a comma list n_1,…,n_m of unequal sizes (FedCP-QQ only).",
)
@click.option("--alpha", type=Number(), required=True, help="Miscoverage level α in (0, 1).")
@click.option("--epsilon", type=Number(), default=None, help="Per-agent ε: plan FedCP²-QQ.")
@click.option("--bins", type=Integer(), default=None,
              help="FedCP²-QQ grid points B (with --epsilon only)  [default: 100]")
@click.option(
    "--lower", type=Number(), default=None,
    help="FedCP²-QQ public score range: lower end of the grid (with --epsilon only)  "
    "[default: 0]",
)
@click.option(
    "--upper", type=Number(), default=None,
    help="FedCP²-QQ public score range: upper end S_max of the grid (an aggregate on it is "
    "released as +inf; with --epsilon only)  [default: 1]",
)
@click.option("--smax", type=Number(), default=None, hidden=True, help="Deprecated: --upper.")
@json_option
def plan_cmd(
    agents: int | None,
    local_n: str,
    alpha: float,
    epsilon: float | None,
    bins: int | None,
    lower: float | None,
    upper: float | None,
    smax: float | None,
    as_json: bool,
) -> None:
    """Print the agent order ℓ, server order k and coverage M (FedCP-QQ), or the FedCP²-QQ plan."""
    if smax is not None:
        if upper is not None:
            raise InvalidInput("give --upper or its deprecated spelling --smax, not both")
        upper = smax
    sizes = _sizes(local_n)
    work = sum(sizes) if len(sizes) > 1 else sizes[0] * (agents or 1)
    with progress.task("planning", None, size=work):
        plan = plan_from_options(agents, local_n, alpha, epsilon, bins, upper, lower)
    emit(plan, as_json=as_json, human=_human(plan))
