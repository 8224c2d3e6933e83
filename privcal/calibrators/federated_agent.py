"""The two ends of one-shot federated calibration: what an agent sends, what the server does.

Humbert, Le Bars, Bellet, Arlot, *One-Shot Federated Conformal Prediction*,
ICML 2023 (seed 002): Algorithm 1 (FedCP-QQ), Algorithms 2–3 (FedCP²-QQ);
SPEC §9–10. The agent functions need only numpy (and the exponential
mechanism); nothing here touches a database, so an agent can run them on its
own machine with nothing but the published plan.

**Decision (the top bin means "S_max or more")**. Algorithm 2 assumes every
score is ≤ S_max; the exponential mechanism clips larger scores into the top
bin e_{B−1} = S_max. The server therefore reads an aggregate that lands on the
top bin as +∞. This keeps Thm 4.1 valid whatever the scores: the mechanism's
utility lemma (Lemma C.4) holds for the clipped scores S' = min(S, S_max),
so P(S' ≤ Q̂) ≥ 1−α; if Q̂ < S_max then S' ≤ Q̂ ⇔ S ≤ Q̂, and if Q̂ is the top
bin the released +∞ covers everything. A too-small public S_max costs
efficiency (a trivial +∞ threshold), never validity, and the data's maximum is
never used.

**Assumption (honest agents; stated, not enforced)**. Both coverage theorems
assume every agent computes its message from its own data as specified. The
server cannot check that: a FedCP-QQ message may be any number (the method has
no public score range to refuse values outside of), a FedCP²-QQ message any grid
point, and the server's k-th smallest follows any k messages — with k = 1, which
the plan often picks, one agent alone sets the threshold. The recorded guarantees
therefore state the assumption (:data:`HONEST_AGENTS`).

**Agents missing (no assumption)**. A session closed with agents missing counts each missing
message as +∞ under the published plan (``aggregate(..., missing_as_inf=True)``): replacing
a message by +∞ can only raise the k-th smallest, so on every draw the threshold is ≥ the
one all m agents would have given, and Thm 3.2 / Thm 4.1 hold whatever the dropout
(:func:`missing_clause`). The replan for the agents that answered needs the dropout to be
independent of the data, and states so (:data:`ANSWERED_AT_RANDOM`).
"""

from __future__ import annotations

import math
import random
from decimal import Decimal
from typing import Any

import numpy as np
from pydantic import Field

from privcal.calibrators.base import default_rng
from privcal.calibrators.fedplan import Fed2Plan, FedPlan, FedPlanUnequal
from privcal.calibrators.mechanisms.exponential import exponential_quantile, grid
from privcal.calibrators.validation import number_text
from privcal.calibrators.versions import at_least, clause_since
from privcal.errors import InvalidInput, PlanRejected

__all__ = [
    "ANSWERED_AT_RANDOM",
    "HONEST_AGENTS",
    "agents_planned_field",
    "aggregate",
    "answered_clause",
    "bin_grid",
    "check_message",
    "chosen_clause",
    "epsilon_text",
    "fedcp2_qq_message",
    "fedcp_qq_message",
    "missing_agents",
    "missing_clause",
    "planned_agents",
]

AnyPlan = FedPlan | FedPlanUnequal | Fed2Plan

#: the assumption of the federated coverage guarantees privcal cannot enforce (module
#: docstring), stated in the recorded guarantees (red team 6)
HONEST_AGENTS = ("every agent following the protocol (its message computed from its own "
                 "data as specified)")

#: what a release for only the agents that answered (a session closed with agents missing:
#: the answer level pinned, the server side replanned for the shape's m agents) also assumes,
#: stated in its recorded guarantee (red team 14: the 16 of 20 agents with the largest
#: messages missing, every agent honest, gave 0.836 coverage against a recorded 0.9)
ANSWERED_AT_RANDOM = ("the agents that answered not chosen by their data (which agents answer, "
                      "or drop out, does not depend on their scores; a dropout that does can "
                      "lower the coverage)")


def epsilon_text(eps: float, version: str, since: str) -> str:
    """An agent's ε as a release's sentences state it: exactly (its shortest decimal, as the
    privacy record and the charge have it) from calibrator ``version`` ``since`` on; before,
    as recorded then (six significant digits, to nearest — 10.2345449 said "10.2345", below
    what was charged: red team 16)."""
    if not at_least(version, since):
        return f"{eps:g}"
    text = format(Decimal(repr(float(eps))), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def answered_clause(pinned: bool, version: str, since: str) -> str:
    """``"; " + ANSWERED_AT_RANDOM`` for a release whose answer level is ``pinned``, from
    calibrator version ``since`` on (older releases recorded no such clause), else ``""``."""
    return clause_since(ANSWERED_AT_RANDOM, version, since) if pinned else ""


def chosen_clause(pinned: bool, version: str, since: str) -> str:
    """``"; " + UNSELECTED_AGENTS`` for a release of calibrator ``version`` ≥ ``since`` whose
    answer level is not ``pinned`` (a pinned one states :data:`ANSWERED_AT_RANDOM`, which
    implies it), else ``""`` (red team 25, fedlocal F4)."""
    from privcal.calibrators.participation import UNSELECTED_AGENTS

    return "" if pinned else clause_since(UNSELECTED_AGENTS, version, since)


def missing_agents(planned: int | None, sizes: tuple[int, ...] | None, version: str,
                   since: str, name: str) -> int:
    """How many of the ``planned`` agents a release of calibrator ``version`` lacks (0 if
    not ``planned``); ``agents_planned`` exists from version ``since`` on: a release of an
    older version that has it is refused (red team 15: a relabelled copy loaded)."""
    if planned is None:
        return 0
    if not at_least(version, since):
        raise InvalidInput(f"{name} {version} has no parameter agents_planned (it exists from "
                           f"{since} on)")
    return planned - len(sizes or ())


def missing_clause(answered: int, planned: int) -> str:
    """What a release for only the ``answered`` of ``planned`` agents states when each
    missing agent's message is counted as +∞ under the published plan: the k-th smallest
    can then only rise, so the plan's guarantee holds whatever the reason an agent is
    missing — no assumption on the dropout (red team 14's replan needed one). Nothing when
    none is missing."""
    if answered >= planned:
        return ""
    return (f"; {answered} of the {planned} planned agents answered, each missing agent's "
            "message counted as +∞ (valid whatever the reason an agent is missing)")


def agents_planned_field() -> Any:
    """The ``agents_planned`` parameter of FedCP-QQ and FedCP²-QQ."""
    return Field(default=None, ge=1, description=(
        "normally set by a collection session closed with agents missing: the plan is for "
        "this many agents, the shape holds those that answered, and each missing agent's "
        "message counts as +inf (the published plan's guarantee, whatever the dropout)"))


def planned_agents(planned: int | None, sizes: tuple[int, ...]) -> int:
    """The m to plan for: the shape's agents, or ``planned`` when the shape holds only the
    agents that answered (:func:`missing_clause`); they must then hold the same n."""
    if planned is None:
        return len(sizes)
    if planned < len(sizes):
        raise InvalidInput(f"agents_planned = {planned} is fewer than the {len(sizes)} agents "
                           "that answered")
    if len(set(sizes)) != 1:
        raise InvalidInput(f"agents_planned needs every agent to hold the same number of "
                           f"scores, got sizes {sorted(set(sizes))}")
    return planned


def _local_scores(scores: object) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1:
        raise InvalidInput(f"local scores must be a 1-D array, got shape {s.shape}")
    if s.size == 0:
        raise InvalidInput("an agent needs at least one score")
    if np.isnan(s).any():
        raise InvalidInput(f"local scores: row {int(np.argmax(np.isnan(s)))} is NaN")
    return s


def _order_stat(s: np.ndarray, r: int) -> float:
    """The r-th smallest (1-based); +∞ when r > len(s) (paper eq. (2))."""
    if r > s.size:
        return math.inf
    return float(np.partition(s, r - 1)[r - 1])


def fedcp_qq_message(scores: np.ndarray, plan: FedPlan | FedPlanUnequal) -> float:
    """An agent's FedCP-QQ message: its exact ℓ-th smallest score (Alg. 1; Def. 3.1).

    With an equal-size plan the agent must hold exactly ``plan.n`` scores; with
    an unequal-size plan ℓ_j = ⌈(1−α)(n_j+1)⌉ for its own n_j (App. A.1), and
    the message is +∞ when ℓ_j > n_j. This reveals one order statistic of the
    agent's data: it is not private.
    """
    s = _local_scores(scores)
    if isinstance(plan, FedPlan):
        if s.size != plan.n:
            raise InvalidInput(
                f"the plan is for n = {plan.n} scores per agent, this agent has {s.size}"
            )
        return _order_stat(s, plan.l)
    if isinstance(plan, FedPlanUnequal):
        return _order_stat(s, plan.local_order(int(s.size)))
    raise InvalidInput(f"not a FedCP-QQ plan: {type(plan).__name__}")


def bin_grid(plan: Fed2Plan) -> np.ndarray:
    """The public grid of the plan: ``bins`` points e_b = a + b·(S_max − a)/(B−1) on
    [a, S_max], a = ``plan.lower`` (0 unless set; SPEC §10)."""
    return grid(plan.lower, plan.smax, plan.bins)


def fedcp2_qq_message(
    scores: np.ndarray, plan: Fed2Plan, rng: random.Random | None = None
) -> float:
    """An agent's FedCP²-QQ message: the ε-DP exponential-mechanism quantile at level q (Alg. 2).

    Scores are rounded up to the public grid on [a, S_max] (:func:`bin_grid`; larger ones into
    the top bin, module docstring); the output is a grid point sampled with
    P(e_b) ∝ exp(−ε w_b / (2Δ_q)), w_b = max(N_<(e_b)/q, N_>(e_b)/(1−q)),
    Δ_q = max(1/q, 1/(1−q)). It is ε-DP with respect to this agent's scores
    (Thm 4.1, App. C.4). ``rng`` defaults to the operating system's CSPRNG.
    """
    s = _local_scores(scores)
    if not isinstance(plan, Fed2Plan):
        raise InvalidInput(f"not a FedCP²-QQ plan: {type(plan).__name__}")
    if s.size != plan.n:
        # Lemma C.4 is applied with n·q ≥ ℓ_γ + ℓ_cor: a smaller agent would void the guarantee
        raise InvalidInput(
            f"the plan is for n = {plan.n} scores per agent, this agent has {s.size}"
        )
    _, value = exponential_quantile(
        s, bin_grid(plan), plan.q, plan.epsilon, rng if rng is not None else default_rng()
    )
    return value


def check_message(value: float, plan: AnyPlan) -> float:
    """Validate one agent's message for ``plan``; returns the value the server will use.

    FedCP²-QQ: the value must be a point of the published grid (within 1e−9 of the range's
    scale, to survive text round-trips, and within a thousandth of a grid step); the exact
    grid point is returned. FedCP-QQ:
    any number, or +∞ (an agent with fewer than ℓ scores): its plan has no public
    score range to check against. NaN and −∞ are rejected. Raises
    :class:`PlanRejected` with the reason. A well-formed message computed otherwise
    than specified cannot be detected (module docstring, :data:`HONEST_AGENTS`).
    """
    try:
        v = number_text(value) if isinstance(value, str | bytes) else float(value)
    except (TypeError, ValueError, OverflowError) as exc:  # 10**400: too large for a float
        raise PlanRejected(f"message {value!r:.60} is not a number") from exc
    if v is None:  # "1_0", "٣": text float() reads but no file or message spells so
        raise PlanRejected(f"message {value!r:.60} is not a number")
    if math.isnan(v) or v == -math.inf:
        raise PlanRejected(f"message {value!r} is not a valid score")
    if isinstance(plan, Fed2Plan):
        e = bin_grid(plan)
        j = int(np.argmin(np.abs(e - v))) if math.isfinite(v) else -1
        # a text round trip's error, and never more than a thousandth of a grid step: a
        # scale of the range's ends alone let a grid far from 0 ([1e9, 1e9 + 1], step 0.0101)
        # take any value within ±1 — below, between and above its points — as the nearest
        # point (red team 25, fedlocal F2) — nor less than 4 ulps (a grid point computed as
        # lower + b·step elsewhere)
        top = max(abs(plan.lower), abs(plan.smax))
        tol = max(min(1e-9 * max(top, plan.smax - plan.lower),
                      (plan.smax - plan.lower) / (plan.bins - 1) / 1000),
                  4 * math.ulp(top))
        if j < 0 or abs(e[j] - v) > tol:
            raise PlanRejected(
                f"message {v!r} is not on the published grid "
                f"({plan.bins} points on [{plan.lower}, {plan.smax}])"
            )
        return float(e[j])
    if isinstance(plan, FedPlan | FedPlanUnequal):
        return v
    raise InvalidInput(f"not a federated plan: {type(plan).__name__}")


def aggregate(messages: np.ndarray | list[float], plan: AnyPlan, *,
              missing_as_inf: bool = False) -> float:
    """The server's threshold: the k-th smallest of the m messages (Alg. 1 / Alg. 3).

    Every message goes through :func:`check_message` first. For FedCP²-QQ an
    aggregate on the top grid point is released as +∞ (module docstring).
    ``missing_as_inf``: fewer than m messages (at least one) are the agents that answered,
    each missing one counted as +∞ (:func:`missing_clause`).
    """
    msgs = [check_message(v, plan) for v in np.asarray(messages, dtype=object).ravel()]
    m = plan.m
    if missing_as_inf and 1 <= len(msgs) < m:
        msgs += [math.inf] * (m - len(msgs))
    if len(msgs) != m:
        raise PlanRejected(f"the plan is for {m} agents, got {len(msgs)} messages")
    k = plan.k
    q = float(np.partition(np.asarray(msgs, dtype=np.float64), k - 1)[k - 1])
    if isinstance(plan, Fed2Plan) and q >= plan.smax:
        return math.inf
    return q
