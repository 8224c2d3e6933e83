"""Red team 14 (coverage): a federated session closed with agents missing
(``close_session(allow_missing=True)``) releases with the server side replanned for the m'
agents that answered. That replan is valid only if *which* agents answered does not depend
on their data: with the 16 of 20 agents holding the largest messages missing, every agent
honest, the coverage of such a release averaged 0.836 against a recorded "≥ 0.9". privcal
cannot check why an agent is missing, so the recorded guarantee of a replanned release now
states the assumption (FedCP-QQ 1.2.0, FedCP²-QQ 1.3.0; the replan is ``missing="replan"``
since the default counts each missing message as +∞, tests/test_sessions_missing.py);
releases of the earlier versions still verify as they were worded, and a new one without
the clause does not verify.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from privcal.accountant import sessions as S
from privcal.accountant.releases import record_release
from privcal.calibrators.fedcp2_qq import FedCP2QQ
from privcal.calibrators.fedcp_qq import FedCPQQ
from privcal.calibrators.federated_agent import ANSWERED_AT_RANDOM, aggregate
from privcal.calibrators.fedplan import (
    plan_fedcp2_qq,
    plan_fedcp_qq,
    replan_fedcp_qq_subset,
)
from privcal.client import fedcp2_qq_message, fedcp_qq_message
from privcal.errors import AuditFailed


def _cov(rel: Any) -> dict[str, Any]:
    return rel.coverage.model_dump(mode="json")


def _session(acct: Any, method: str, answered: int) -> Any:
    """A federated session of 5 agents with 200 U(0, 1) scores each where ``answered`` sent
    their message; closed with agents missing if any are, else released by its last batch."""
    kw: dict[str, Any] = {"epsilon": 10} if method == "fedcp2-qq" else {}
    info = S.open_session(acct, method, dataset="h", alpha=0.1, agents=5, local_n=200, **kw)
    plan = (plan_fedcp2_qq(5, 200, 0.1, 10) if method == "fedcp2-qq"
            else plan_fedcp_qq(5, 200, 0.1))
    rng = random.Random(answered)

    def message() -> float:
        s = np.array([rng.random() for _ in range(200)])
        return (fedcp2_qq_message(s, plan, rng) if method == "fedcp2-qq"  # type: ignore[arg-type]
                else fedcp_qq_message(s, plan))  # type: ignore[arg-type]

    msgs = [message() for _ in range(answered)]
    ids = [f"{method}-{answered}-{j}" for j in range(answered)]
    assert S.submit_reports(acct, info.id, ids, msgs).accepted == answered
    closed = (S.close_session(acct, info.id, allow_missing=True, missing="replan")
              if answered < 5
              else S.session_status(acct, info.id))
    assert closed.status == "released" and closed.release_id is not None
    return acct.release(closed.release_id)


@pytest.mark.parametrize(("method", "version", "before"),
                         [("fedcp-qq", "1.4.0", "1.1.0"), ("fedcp2-qq", "1.6.0", "1.2.0")])
def test_a_release_for_the_agents_that_answered_states_they_were_not_chosen_by_their_data(
        accountant: Any, method: str, version: str, before: str) -> None:
    acct = accountant
    acct.create_dataset("h", epsilon=1, subject_epsilon=100, allow_nonprivate=True)
    full, part = _session(acct, method, 5), _session(acct, method, 3)
    assert part.diagnostics["replanned"] == {"m_planned": 5, "m_answered": 3}
    for key in ("over", "statement"):
        assert ANSWERED_AT_RANDOM in _cov(part)[key], key
        assert ANSWERED_AT_RANDOM not in _cov(full)[key], key  # every agent answered
    assert part.calibrator_version == full.calibrator_version == version
    assert acct.verify().guarantees_recomputed == 2

    # a release of the version before, worded as it was (no clause), still verifies: its
    # version's wording is reproduced (guarantee_as), so even its sentences are compared ...
    cov = _cov(part)
    old = {**cov, **{k: cov[k].replace(f"; {ANSWERED_AT_RANDOM}", "") for k in
                     ("over", "statement")}}
    if method == "fedcp2-qq":  # paid by charges of its own, as every local-DP release
        paid = acct.charge_subjects("h", 10, [f"old-{j}" for j in range(3)])
        ids = [paid.charge_id]
    else:
        ids = []

    def again(v: str) -> int:
        return record_release(
            acct.ledger, "h", _as_computed=True, method=method, calibrator_version=v,
            threshold=part.threshold, params=part.params, shape=part.shape, coverage=old,
            privacy=part.privacy, diagnostics=part.diagnostics,
            charge_ids=ids).id

    again(before)
    rep = acct.verify()
    assert (rep.guarantees_recomputed, rep.statements_not_compared) == (3, 0)
    # ... while the installed version's sentences are compared: without the clause it is a
    # false record, and verify names it
    if method == "fedcp2-qq":
        paid = acct.charge_subjects("h", 10, [f"new-{j}" for j in range(3)])
        ids = [paid.charge_id]
    bad = again(version)
    with pytest.raises(AuditFailed, match=f"release {bad} .*coverage.(over|statement)"):
        acct.verify()


def test_the_guarantee_of_a_full_session_is_unchanged() -> None:
    """The clause is only for a pinned answer level (a replanned release): a plan for all
    the agents states what it stated before."""
    from privcal.calibrators.base import DataShape
    from privcal.calibrators.fedcp2_qq import FedCP2QQParams
    from privcal.calibrators.fedcp_qq import FedCPQQParams

    shape = DataShape(n=1000, group_sizes=(200,) * 5)
    for cal, p in ((FedCPQQ(), FedCPQQParams(alpha=0.1)),
                   (FedCP2QQ(), FedCP2QQParams(alpha=0.1, epsilon=10))):
        g = cal.guarantee(p, shape)
        assert ANSWERED_AT_RANDOM not in g.over and ANSWERED_AT_RANDOM not in g.statement


def test_the_replan_needs_the_assumption_it_states() -> None:
    """Why the clause: m = 20 agents with n = 20 U(0, 1) scores, α = 0.1, every agent honest.
    The replan for the 4 agents that answered covers 1−α when the 16 missing ones are chosen
    at random, and falls well short when they are the 16 with the largest messages. For U(0,
    1) scores a threshold t covers with probability t, so the coverage of a release is the
    mean of t over seeded trials (T = 400); each mean is compared with 0.9 at five of its
    standard errors (the sample's: p < 1e-6 each by the normal approximation)."""
    plan = plan_fedcp_qq(20, 20, 0.1)
    sub = replan_fedcp_qq_subset(plan, 4)
    assert (plan.k, sub.k) == (3, 1)
    g = np.random.default_rng(14)
    at_random, by_data = [], []
    for _ in range(400):
        msgs = np.array([fedcp_qq_message(g.uniform(size=20), plan) for _ in range(20)])
        at_random.append(aggregate(g.choice(msgs, size=4, replace=False), sub))
        by_data.append(aggregate(np.sort(msgs)[:4], sub))  # the 16 largest missing
    for ts in (at_random, by_data):
        ts[:] = [np.mean(ts), 5 * np.std(ts, ddof=1) / math.sqrt(len(ts))]
    assert at_random[0] >= 0.9 - at_random[1]  # ≈ M = 0.9026 for the replan
    assert by_data[0] < 0.9 - by_data[1]  # ≈ 0.835: the recorded "≥ 0.9" would be false


def test_the_evaluate_verdict_counts_a_guarantee_given_an_event(accountant: Any) -> None:
    """Red team 14's note: `privcal evaluate`'s verdict for a marginal release below its
    bound used Markov's inequality with the bound alone; P-COQS's holds given an event of
    probability ≥ 1−β, so its releases' mean coverage is only ≥ (1−β)·lower, and the
    verdict's probability is (1 − (1−β)·lower)/(1 − u)."""
    from privcal.calibrators.evaluation import evaluate_sets, is_marginal
    from privcal.cli.render import guarantee_verdict

    accountant.create_dataset("d", rho=1)
    rel = accountant.calibrate("pcoqs", dataset="d", alpha=0.1, rho=0.1,
                               scores=np.random.default_rng(0).random(2000))
    beta = rel.coverage.failure_probability
    assert beta == 0.05 and is_marginal(rel.coverage)
    sets = np.zeros((1000, 2), dtype=bool)
    sets[:700, 0] = True  # 70 % covered against a recorded 0.9
    ev = evaluate_sets(sets, np.zeros(1000, int), rel.coverage.lower, marginal=True)
    # the probability of a result this low (red team 19): Markov on the mean ≥ (1−β)·lower
    # at some v ≥ 0.7, plus a binomial tail — at least (1 − (1−β)·lower)/(1 − 0.7), which is
    # above what the bound alone, (1 − lower)/(1 − 0.7), would give
    low = (1 - (1 - beta) * rel.coverage.lower) / (1 - ev.coverage)
    verdict = guarantee_verdict(ev, beta)
    said = float(verdict.split("probability at most ")[1].split(" under it")[0])
    assert low <= said <= low + 0.1 and said > (1 - rel.coverage.lower) / (1 - ev.coverage)
    assert f"given an event of probability ≥ {1 - beta:.4g}" in verdict
    assert f"(1 − {(1 - beta) * rel.coverage.lower:.4g})/(1 − v)" in verdict


def test_the_samplers_flip_with_at_least_the_exact_probability() -> None:
    """Red team 14 (diffrev): the flip probability computed in doubles fell below the exact
    (k−1)/(e^ε+k−1) for ~4 % of ε, and a sampler flipping iff a 53-bit uniform u < p then
    realised ε up to 8e-16 above ε0. The samplers use it raised by 4 ulps: the realised
    probability ⌈p·2⁵³⌉/2⁵³ is at least the exact one (60-digit reference) on a grid of ε
    and k — so each report's likelihood ratio is at most e^ε exactly."""
    from decimal import Decimal, localcontext
    from fractions import Fraction

    from privcal.calibrators.mechanisms import randomized_response as rr

    short = 0
    with localcontext() as ctx:
        ctx.prec = 60
        for k in (2, 5, 100):
            for i in range(1, 2001):
                eps = i / 100
                exact = Fraction(Decimal(k - 1) / (Decimal(eps).exp() + (k - 1)))
                computed = (rr.binary_rr_flip_probability(eps) if k == 2
                            else rr.krr_flip_probability(k, eps))
                short += Fraction(computed) < exact  # the computed value alone falls short
                p = rr._at_least(computed)
                realised = Fraction(math.ceil(Fraction(p) * 2**53), 2**53)
                assert realised >= exact, (k, eps)
    assert short > 0  # the grid holds the cases the raise is for
