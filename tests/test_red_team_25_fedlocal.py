"""Red team 25, federated and local-DP flows (fedlocal).

F1: an ldp-score session at a subnormal ε (1e-310: c = coth(ε/2) overflows a float) opened,
charged the subjects of a batch that did not fill the round, and then every batch that filled
it failed with a pydantic traceback (the round's estimate ∞·x − ∞ = NaN, stored as null): the
session could never advance. A direct calibration recorded "Δ_S = nan". Such an ε is now
refused at the open / before the charge, with one line, nothing written.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privcal.accountant.sessions import open_session, session_status
from privcal.calibrators.ldp_score_bounds import rr_range
from privcal.errors import InvalidInput, NotFound, PlanRejected
from tests.cli_env import CliEnv


# ----------------------------------------------------------------------------------- F1
@pytest.mark.parametrize("eps", [1e-310, 1e-308])
def test_a_subnormal_epsilon_session_is_refused_at_the_open(accountant: Any, eps: float) -> None:
    accountant.create_dataset("d", epsilon=1, subject_epsilon=10)
    with pytest.raises(InvalidInput, match="too small"):
        open_session(accountant, "ldp-score", dataset="d", alpha=0.1, epsilon=eps, rounds=2,
                     group_size=3)
    with pytest.raises(NotFound):  # nothing opened
        session_status(accountant, 1)


def test_a_subnormal_epsilon_calibration_is_refused_before_its_charge(accountant: Any) -> None:
    accountant.create_dataset("d", epsilon=1, subject_epsilon=10)
    g = np.random.default_rng(0)
    with pytest.raises(InvalidInput, match="too small"):
        accountant.calibrate("ldp-score", dataset="d", scores=g.random(200), alpha=0.1,
                             epsilon=1e-310, rounds=2, subjects=[f"x{i}" for i in range(200)])
    assert accountant.releases("d") == []
    assert accountant.subject_summary("d").subjects == 0


def test_the_smallest_normal_epsilons_still_work() -> None:
    assert rr_range(1e-300) == pytest.approx(2e300)
    with pytest.raises(InvalidInput, match="too small"):
        rr_range(1e-310)


def test_cli_session_open_at_a_subnormal_epsilon_is_one_line(ledger_url: str,
                                                            tmp_path: Path) -> None:
    env = CliEnv(ledger_url, tmp_path)
    assert env.run("db", "upgrade").exit_code == 0
    assert env.run("dataset", "create", "--dataset", "u", "--epsilon", "1",
                   "--subject-epsilon", "8").exit_code == 0
    res = env.run("session", "open", "ldp-score", "--dataset", "u", "--alpha", "0.1",
                  "--epsilon", "1e-310", "--rounds", "1", "--group-size", "2")
    assert res.exit_code == 1, res.output
    assert "too small" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert env.run("session", "status", "1").exit_code != 0  # nothing opened


# ----------------------------------------------------------------------------------- F2
def _far_plan() -> Any:
    from privcal.calibrators.fedplan import plan_fedcp2_qq

    return plan_fedcp2_qq(5, 200, 0.1, 10, bins=100, smax=1e9 + 1, lower=1e9)


@pytest.mark.parametrize("v", [1e9 - 0.9, 1e9 + 0.004, 1e9 + 0.5049, 1e9 + 1.9])
def test_a_message_off_a_grid_far_from_zero_is_refused(v: float) -> None:
    from privcal.calibrators.federated_agent import check_message

    with pytest.raises(PlanRejected, match="not on the published grid"):
        check_message(v, _far_plan())  # was snapped to the nearest point (±1 was "on" it)


def test_every_point_of_a_grid_far_from_zero_is_still_taken() -> None:
    from privcal.calibrators.federated_agent import bin_grid, check_message

    plan = _far_plan()
    for e in bin_grid(plan).tolist():
        assert check_message(e, plan) == e
        assert check_message(f"{e:.15g}", plan) == e  # a text round trip of 15 digits
        assert check_message(repr(e), plan) == e


def test_a_session_counts_an_off_grid_message_as_off_grid(accountant: Any) -> None:
    from privcal.accountant.sessions import submit_reports

    accountant.create_dataset("d", epsilon=1, subject_epsilon=100)
    s = open_session(accountant, "fedcp2-qq", dataset="d", alpha=0.1, epsilon=10, agents=5,
                     local_n=200, lower=1e9, upper=1e9 + 1)
    res = submit_reports(accountant, s.id, ["a", "b"], [1e9 + 0.004, 1e9])
    assert res.accepted == 1 and sum(res.reasons.values()) == 1, res.reasons


# ----------------------------------------------------------------------------------- F4
def test_the_premise_first_m_agents_by_arrival_can_cover_less_than_recorded() -> None:
    """Ten honest agents with i.i.d. Beta(2,5) scores, m = 5: a session keeps the first five
    to answer. Arriving in the order of their messages, the release covers ≈ 0.865 (seeded;
    the tolerance is 3 standard errors of the mean over the trials, ≈ 0.008); arriving at
    random ≈ M = 0.9256."""
    from scipy.stats import beta

    from privcal.calibrators.federated_agent import aggregate, fedcp_qq_message
    from privcal.calibrators.fedplan import plan_fedcp_qq

    plan = plan_fedcp_qq(5, 10, 0.1)
    g = np.random.default_rng(25)
    by_data, at_random = [], []
    for _ in range(400):
        msgs = np.array([fedcp_qq_message(g.beta(2, 5, 10), plan) for _ in range(10)])
        by_data.append(beta.cdf(aggregate(np.sort(msgs)[:5], plan), 2, 5))
        at_random.append(beta.cdf(aggregate(g.permutation(msgs)[:5], plan), 2, 5))
    def mean_tol(cov: list[float]) -> tuple[float, float]:
        return float(np.mean(cov)), 3 * float(np.std(cov)) / np.sqrt(len(cov))

    mean, tol = mean_tol(by_data)
    assert mean + tol < 0.9, (mean, tol)  # below the recorded 0.9, every agent honest
    mean, tol = mean_tol(at_random)
    assert mean + tol > 0.9, (mean, tol)  # consistent with the plan's M when arrival is random


def _fed_release(acct: Any, method: str, answered: int, missing: str | None = None) -> Any:
    from privcal.accountant.sessions import close_session, submit_reports
    from privcal.calibrators.federated_agent import fedcp2_qq_message, fedcp_qq_message
    from privcal.calibrators.fedplan import Fed2Plan, FedPlan

    kw = {"epsilon": 10} if method == "fedcp2-qq" else {}
    s = open_session(acct, method, dataset="h", alpha=0.1, agents=5, local_n=200, **kw)
    g = np.random.default_rng(answered)
    if method == "fedcp2-qq":
        plan2 = Fed2Plan.model_validate(s.plan)
        msgs = [fedcp2_qq_message(g.beta(2, 5, 200), plan2, random.Random(j))
                for j in range(answered)]
    else:
        plan = FedPlan.model_validate(s.plan)
        msgs = [fedcp_qq_message(g.beta(2, 5, 200), plan) for _ in range(answered)]
    ids = [f"{method}-{missing}-{answered}-{j}" for j in range(answered)]
    assert submit_reports(acct, s.id, ids, msgs).accepted == answered
    if missing is not None:
        close_session(acct, s.id, allow_missing=True, missing=missing)  # type: ignore[arg-type]
    info = session_status(acct, s.id)
    assert info.status == "released"
    return acct.release(info.release_id)


@pytest.mark.parametrize(("method", "version"), [("fedcp-qq", "1.4.0"), ("fedcp2-qq", "1.6.0")])
def test_a_federated_release_states_which_agents_are_used_is_not_chosen_by_their_data(
        accountant: Any, method: str, version: str) -> None:
    from privcal.calibrators.federated_agent import ANSWERED_AT_RANDOM
    from privcal.calibrators.participation import UNSELECTED_AGENTS

    accountant.create_dataset("h", epsilon=1, subject_epsilon=100, allow_nonprivate=True)
    full = _fed_release(accountant, method, 5)
    padded = _fed_release(accountant, method, 3, "infinite")
    replan = _fed_release(accountant, method, 3, "replan")
    for rel in (full, padded, replan):
        assert rel.calibrator_version == version
        cov = rel.coverage.model_dump(mode="json")
        for key in ("over", "statement"):
            if rel is replan:  # its own clause, which implies it
                assert ANSWERED_AT_RANDOM in cov[key] and UNSELECTED_AGENTS not in cov[key]
            else:
                assert UNSELECTED_AGENTS in cov[key], (key, cov[key])
    assert accountant.verify().guarantees_recomputed == 3
