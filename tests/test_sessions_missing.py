"""A federated session closed with agents missing, each missing agent's message counted as +∞
under the published plan (``close_session(allow_missing=True)``, the default
``missing="infinite"``), on SQLite and PostgreSQL.

Red team 14 found that the replan for the m' agents that answered is valid only if which
agents answered does not depend on their data (0.836 coverage against a recorded 0.9), and
stated that assumption in the recorded guarantee. The quality bar asks for an assumption to be
enforced or removed: counting a missing message as +∞ removes it. The server's k-th smallest
of the m messages can only rise when a message is replaced by +∞, so on every draw of the data
(and of the agents' noise) the released threshold is ≥ the one all m agents would have given,
and the published plan's guarantee (Humbert et al. 2023, Thm 3.2 / Thm 4.1) holds for any
dropout, however chosen. The replan stays available as ``missing="replan"``
(tests/test_sessions_replan.py, tests/test_red_team_14_coverage.py).
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from privcal import Release
from privcal.accountant import sessions as S
from privcal.accountant.releases import record_release
from privcal.calibrators.base import DataShape
from privcal.calibrators.fedcp2_qq import FedCP2QQ, FedCP2QQParams
from privcal.calibrators.fedcp_qq import FedCPQQ, FedCPQQParams
from privcal.calibrators.federated_agent import ANSWERED_AT_RANDOM, aggregate, missing_clause
from privcal.calibrators.fedplan import plan_fedcp2_qq, plan_fedcp_qq, replan_fedcp_qq_subset
from privcal.calibrators.participation import UNSELECTED_AGENTS
from privcal.cli import main
from privcal.client import fedcp2_qq_message, fedcp_qq_message
from privcal.errors import AuditFailed, InvalidInput


def _plan(method: str, m: int, n: int) -> Any:
    return plan_fedcp2_qq(m, n, 0.1, 10) if method == "fedcp2-qq" else plan_fedcp_qq(m, n, 0.1)


def _message(method: str, plan: Any, rng: random.Random, n: int) -> float:
    s = np.array([rng.random() for _ in range(n)])
    return (fedcp2_qq_message(s, plan, rng) if method == "fedcp2-qq"
            else fedcp_qq_message(s, plan))


def _answered(acct: Any, method: str, m: int, n: int, answered: int,
              seed: int = 0) -> tuple[int, Any, list[float]]:
    """A session of ``m`` agents of ``n`` U(0, 1) scores where ``answered`` sent their
    message: (session id, published plan, messages)."""
    kw: dict[str, Any] = {"epsilon": 10} if method == "fedcp2-qq" else {}
    info = S.open_session(acct, method, dataset="h", alpha=0.1, agents=m, local_n=n, **kw)
    plan = _plan(method, m, n)
    rng = random.Random(seed)
    msgs = [_message(method, plan, rng, n) for _ in range(answered)]
    ids = [f"{method}-{seed}-{j}" for j in range(answered)]
    assert S.submit_reports(acct, info.id, ids, msgs).accepted == answered
    return info.id, plan, msgs


@pytest.mark.parametrize("method", ["fedcp-qq", "fedcp2-qq"])
def test_a_release_with_agents_missing_keeps_the_published_plan(accountant: Any,
                                                                method: str) -> None:
    acct = accountant
    acct.create_dataset("h", epsilon=1, subject_epsilon=100, allow_nonprivate=True)
    sid, plan, msgs = _answered(acct, method, 5, 200, 3)
    closed = S.close_session(acct, sid, allow_missing=True)
    assert closed.status == "released" and closed.release_id is not None
    rel = acct.release(closed.release_id)

    # the published plan, for the 5 agents: its k, its coverage bound
    assert rel.params["agents_planned"] == 5 and rel.shape["group_sizes"] == [200] * 3
    assert "agent_order" not in rel.params or rel.params["agent_order"] is None
    kth = sorted(msgs + [math.inf] * 2)[plan.k - 1]  # (FedCP²-QQ: the top grid point is +∞)
    expected = math.inf if method == "fedcp2-qq" and kth >= plan.smax else kth
    assert rel.threshold == expected == aggregate(msgs, plan, missing_as_inf=True)
    cal, params = ((FedCP2QQ(), FedCP2QQParams(alpha=0.1, epsilon=10)) if method == "fedcp2-qq"
                   else (FedCPQQ(), FedCPQQParams(alpha=0.1)))
    full = cal.guarantee(params, DataShape(n=1000, group_sizes=(200,) * 5))
    assert rel.coverage.lower == full.lower and rel.coverage.rank == full.rank == plan.k
    # ... stated as what it is, with no assumption on why agents are missing
    clause = missing_clause(3, 5)
    for text in (rel.coverage.over, rel.coverage.statement):
        assert clause.lstrip("; ") in text and ANSWERED_AT_RANDOM not in text
    # which agents are used, stated by both (red team 25, fedlocal F4)
    chosen = f"; {UNSELECTED_AGENTS}"
    if method == "fedcp-qq":
        # the plan's "exactly M" and upper bound are for all 5 messages: a missing one counted
        # as +∞ only raises the threshold, so the release records no upper bound (red team 15)
        exactly = f"; exactly M = {plan.M:.10f} when the scores are continuous"
        assert full.upper is not None and full.statement.endswith(exactly)
        assert rel.coverage.upper is None and "upper_requires" not in rel.coverage.details
        assert rel.coverage.statement == full.statement.replace(
            f"as specified){chosen}" + exactly, f"as specified){chosen}{clause}", 1)
    else:
        assert full.upper is rel.coverage.upper is None
        assert rel.coverage.statement == full.statement.replace(
            f"as specified){chosen};", f"as specified){chosen}{clause};", 1)
    assert rel.diagnostics["missing"] == {"m_planned": 5, "m_answered": 3, "counted_as": "+inf"}
    assert "replanned" not in rel.diagnostics

    assert acct.verify().guarantees_recomputed == 1
    assert Release.load(rel.model_dump_json()) == rel
    # the same release with the clause cut from its sentences is a false record
    cov = rel.coverage.model_dump(mode="json")
    cut = {**cov, **{k: cov[k].replace(clause, "") for k in ("over", "statement")}}
    ids = []
    if method == "fedcp2-qq":
        ids = [acct.charge_subjects("h", 10, [f"x-{j}" for j in range(3)]).charge_id]
    bad = record_release(acct.ledger, "h", _as_computed=True, method=method,
                         calibrator_version=rel.calibrator_version, threshold=rel.threshold,
                         params=rel.params, shape=rel.shape, coverage=cut,
                         privacy=rel.privacy, diagnostics=rel.diagnostics, charge_ids=ids).id
    with pytest.raises(AuditFailed, match=f"release {bad} .*coverage.(over|statement)"):
        acct.verify()


def test_fewer_answers_than_the_server_order_release_infinity(accountant: Any) -> None:
    """m = 20, n = 20, α = 0.1: the server takes the 3rd smallest; with 2 agents answered the
    3rd smallest is a missing one, +∞ — a trivial release, never a false one."""
    acct = accountant
    acct.create_dataset("h", epsilon=1, allow_nonprivate=True)
    sid, plan, _ = _answered(acct, "fedcp-qq", 20, 20, 2)
    assert plan.k == 3
    rel = acct.release(S.close_session(acct, sid, allow_missing=True).release_id)
    assert rel.threshold == math.inf and rel.coverage.rank == 3
    assert acct.verify().guarantees_recomputed == 1


@pytest.mark.parametrize("method", ["fedcp-qq", "fedcp2-qq"])
def test_counting_missing_agents_as_infinity_needs_no_assumption_on_the_dropout(
        method: str) -> None:
    """The proof, checked on seeded draws: m = 20 agents of U(0, 1) scores, α = 0.1. For
    dropouts chosen at random, by the data (the 16 largest messages missing: the one that
    broke the replan) and the mirror (the 16 smallest missing), the threshold with missing
    messages as +∞ is ≥ the one all 20 agents give, on every draw; and for U(0, 1) scores a
    threshold t covers with probability min(t, 1), so the mean coverage over T = 300 trials
    is compared with 0.9 at five of its standard errors (p < 1e-6 each)."""
    n = 20 if method == "fedcp-qq" else 200
    plan = _plan(method, 20, n)
    g, rng = np.random.default_rng(15), random.Random(15)
    covered: dict[str, list[float]] = {"random": [], "largest": [], "smallest": []}
    for _ in range(300):
        msgs = np.array([_message(method, plan, rng, n) for _ in range(20)], dtype=float)
        everyone = aggregate(msgs, plan)
        kept = {"random": g.choice(msgs, size=4, replace=False),
                "largest": np.sort(msgs)[:4], "smallest": np.sort(msgs)[16:]}
        for how, answered in kept.items():
            t = aggregate(answered, plan, missing_as_inf=True)
            assert t >= everyone, how
            covered[how].append(min(t, 1.0))
    for how, cs in covered.items():
        se = np.std(cs, ddof=1) / math.sqrt(len(cs))
        assert np.mean(cs) >= 0.9 - 5 * max(se, 1e-12), how
    if method == "fedcp-qq":  # the replan, on the same dropout by the data, falls short
        sub = replan_fedcp_qq_subset(plan, 4)
        assert sub.k < plan.k


def test_the_params_say_one_way_and_a_plan_for_at_least_the_agents_that_answered() -> None:
    shape = DataShape(n=600, group_sizes=(200,) * 3)
    with pytest.raises(InvalidInput, match="fewer than the 3 agents"):
        FedCPQQ().guarantee(FedCPQQParams(alpha=0.1, agents_planned=2), shape)
    with pytest.raises(InvalidInput, match="same number of scores"):
        FedCP2QQ().plan(FedCP2QQParams(alpha=0.1, epsilon=1, agents_planned=5),
                        DataShape(n=500, group_sizes=(200, 300)))
    with pytest.raises(ValueError, match="not both"):
        FedCPQQParams(alpha=0.1, agents_planned=5, agent_order=3)
    with pytest.raises(ValueError, match="not both"):
        FedCP2QQParams(alpha=0.1, epsilon=1, agents_planned=5, level=0.9)


def test_a_simulated_run_for_fewer_agents_than_planned(accountant: Any) -> None:
    """``calibrate`` with ``agents_planned``: the data of the agents that answered, the
    threshold of the published plan with the others as +∞."""
    acct = accountant
    acct.create_dataset("h", epsilon=1, allow_nonprivate=True)
    g = np.random.default_rng(3)
    scores, agents = g.uniform(size=60), np.repeat(["a", "b", "c"], 20)
    rel = acct.calibrate("fedcp-qq", dataset="h", alpha=0.1, agents_planned=20, scores=scores,
                         agents=agents)
    plan = plan_fedcp_qq(20, 20, 0.1)
    msgs = [float(np.sort(scores[agents == a])[plan.l - 1]) for a in "abc"]
    assert plan.k == 3  # the 3rd smallest of 20: the largest of the 3 answered
    assert rel.threshold == aggregate(msgs, plan, missing_as_inf=True) == max(msgs)
    assert acct.verify().guarantees_recomputed == 1


def test_a_keyed_close_replays_and_refuses_the_other_way_under_its_key(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("h", epsilon=1, allow_nonprivate=True)
    sid, _, _ = _answered(acct, "fedcp-qq", 5, 200, 3)
    head = acct.ledger.head()
    with pytest.raises(InvalidInput, match="missing goes with allow_missing"):
        S.close_session(acct, sid, abandon=True, missing="replan")
    with pytest.raises(InvalidInput, match="missing must be one of infinite, replan"):
        S.close_session(acct, sid, allow_missing=True, missing="zero")  # type: ignore[arg-type]
    assert acct.ledger.head() == head and S.session_status(acct, sid).status == "open"
    first = S.close_session(acct, sid, allow_missing=True, idempotency_key="k")
    again = S.close_session(acct, sid, allow_missing=True, idempotency_key="k")
    assert again.release_id == first.release_id
    head = acct.ledger.head()
    with pytest.raises(InvalidInput, match="other options"):
        S.close_session(acct, sid, allow_missing=True, missing="replan", idempotency_key="k")
    assert acct.ledger.head() == head


def test_a_keyed_close_from_before_missing_existed_replays_as_the_replan_it_was(
        accountant: Any) -> None:
    """Before ``missing``, a close with agents missing replanned, and its request digest had
    no ``missing`` key. A retry under its key after the upgrade must not return that
    replanned release for a default (+∞) close (red team 15): a replan's digest is still
    the old form, and the default's is another."""
    from privcal.accountant.normalize import request_digest
    from privcal.accountant.sessions.closing import CLOSE_DIGEST
    from privcal.accountant.sessions.state import session_key

    acct = accountant
    acct.create_dataset("h", epsilon=1, allow_nonprivate=True)
    sid, _, _ = _answered(acct, "fedcp-qq", 5, 200, 3)
    closed = S.close_session(acct, sid, allow_missing=True, missing="replan",
                             idempotency_key="old")
    with acct.ledger.read() as s:
        from privcal.storage.sessions import CollectionSession

        state = s.get(CollectionSession, sid).state
    assert state[CLOSE_DIGEST] == request_digest({  # the digest of a close before `missing`
        "kind": "session_close", "session_id": str(session_key(sid)), "allow_missing": True,
        "abandon": False})
    again = S.close_session(acct, sid, allow_missing=True, missing="replan",
                            idempotency_key="old")
    assert again.release_id == closed.release_id
    with pytest.raises(InvalidInput, match="other options"):
        S.close_session(acct, sid, allow_missing=True, idempotency_key="old")


def test_a_release_of_a_version_before_agents_planned_is_refused(accountant: Any) -> None:
    """A copy relabelled as a version that had no ``agents_planned`` loaded (red team 15)."""
    import json

    acct = accountant
    acct.create_dataset("h", epsilon=1, allow_nonprivate=True)
    sid, _, _ = _answered(acct, "fedcp-qq", 5, 200, 3)
    rel = acct.release(S.close_session(acct, sid, allow_missing=True).release_id)
    doc = json.loads(rel.model_dump_json())
    for old in ("1.2.0", "1.1.0"):
        with pytest.raises(InvalidInput, match=f"fedcp-qq {old} has no parameter agents_pl"):
            Release.load(json.dumps({**doc, "calibrator_version": old}))


def test_the_cli_closes_with_missing_agents_as_infinity(ledger: Any) -> None:
    from privcal.accountant import Accountant

    url = ledger.engine.url.render_as_string(hide_password=False)
    acct = Accountant(ledger)
    acct.create_dataset("h", epsilon=1, allow_nonprivate=True)
    sid, plan, msgs = _answered(acct, "fedcp-qq", 5, 200, 4)
    head = ledger.head()
    res = CliRunner().invoke(main, ["--db-url", url, "session", "close", str(sid),
                                    "--missing", "replan"])
    assert res.exit_code == 2 and "--missing goes with --allow-missing" in res.output
    assert ledger.head() == head and S.session_status(acct, sid).status == "open"
    res = CliRunner().invoke(main, ["--db-url", url, "session", "close", str(sid),
                                    "--allow-missing", "--json"])
    assert res.exit_code == 0, res.output
    rel = acct.release(S.session_status(acct, sid).release_id)
    assert rel.params["agents_planned"] == 5
    assert rel.threshold == aggregate(msgs, plan, missing_as_inf=True)
