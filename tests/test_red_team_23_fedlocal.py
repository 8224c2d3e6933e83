"""Red team 23, federated and local-DP flows (fedlocal).

F1: an ldp-score session whose rounds can never pass their cut-off (n' reports hold at most n'
ones, and the exact cut-off K(n') > n') opened without a word, and each of its T·n' devices
was then charged ε for a release certain to be +∞ (α = 0.01, ε = 2, T = 10, n' = 50: 500
devices at ε = 2). Its record says so now (``SessionInfo.trivial``; the CLI's status row).

F2: ``fed plan`` (CLI, library) dropped the FedCP²-QQ grid options (``--bins``, ``--lower``,
``--upper``) given without ``--epsilon`` and answered FedCP-QQ's plan, exit 0 — a plan for a
question not asked. They are refused in one line now (the HTTP route: in
``tests/service/test_red_team_23_fedlocal.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from privcal.accountant.sessions import open_session, session_status, submit_reports
from privcal.calibrators.fedplan_choice import plan_federated
from privcal.calibrators.ldp_score_bounds import exact_cutoff
from privcal.cli import main
from privcal.errors import InvalidInput
from tests.cli_env import CliEnv


@pytest.mark.parametrize("grid", [{"bins": 50}, {"lower": 3.0}, {"upper": 7.0},
                                  {"bins": 100, "lower": 0.0, "upper": 1.0}])
def test_a_grid_without_epsilon_is_refused_by_the_library(grid: dict[str, float]) -> None:
    with pytest.raises(InvalidInput, match="needs an epsilon") as e:
        plan_federated(5, [200], 0.1, **grid)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)
    with pytest.raises(InvalidInput, match="needs an epsilon"):  # unequal sizes too
        plan_federated(None, [10, 20], 0.1, **grid)  # type: ignore[arg-type]


def test_the_library_still_plans_both_methods() -> None:
    assert plan_federated(5, [200], 0.1).method == "fedcp-qq"
    p2 = plan_federated(5, [200], 0.1, 10.0)
    assert (p2.method, p2.bins, p2.lower, p2.smax) == ("fedcp2-qq", 100, 0.0, 1.0)
    p3 = plan_federated(5, [200], 0.1, 10.0, bins=50, upper=2.0, lower=-1.0)
    assert (p3.bins, p3.lower, p3.smax) == (50, -1.0, 2.0)


@pytest.mark.parametrize("opts", [["--bins", "50"], ["--lower", "3"], ["--upper", "7"],
                                  ["--smax", "7"], ["--bins", "50", "--upper", "7"]])
def test_cli_fed_plan_refuses_a_grid_without_epsilon(opts: list[str]) -> None:
    res = CliRunner().invoke(main, ["fed", "plan", "--agents", "5", "--local-n", "200",
                                    "--alpha", "0.1", *opts, "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert "needs --epsilon" in doc["error"]["message"]
    res = CliRunner().invoke(main, ["fed", "plan", "--agents", "5", "--local-n", "200",
                                    "--alpha", "0.1", *opts])
    assert res.exit_code == 1 and "needs --epsilon" in res.output
    assert "\n" not in res.output.strip()


def test_cli_fed_plan_with_epsilon_keeps_its_defaults() -> None:
    res = CliRunner().invoke(main, ["fed", "plan", "--agents", "5", "--local-n", "200",
                                    "--alpha", "0.1", "--epsilon", "10", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["bins"], doc["lower"], doc["smax"], doc["l_gamma"]) == (100, 0.0, 1.0, 179)


# ----------------------------------------------------------------------------------- F1
def test_a_session_that_can_only_release_infinity_says_so_from_the_open(accountant: Any
                                                                         ) -> None:
    accountant.create_dataset("d", epsilon=1, subject_epsilon=10)
    assert exact_cutoff(3, 2, 0.1, 2.0, 0.001) > 3  # the premise: no round of 3 can pass
    s = open_session(accountant, "ldp-score", dataset="d", alpha=0.1, epsilon=2, rounds=2,
                     group_size=3)
    assert s.trivial is True
    for r in range(2):  # every report a 1: the most a round can hold, and still no pass
        res = submit_reports(accountant, s.id, [f"u{r}{i}" for i in range(3)], [1, 1, 1],
                             [r] * 3)
        assert res.accepted == 3 and res.charge_id is not None
        assert res.session.trivial is True
    done = session_status(accountant, s.id)
    assert done.status == "released" and done.threshold == float("inf")


@pytest.mark.parametrize("kw", [dict(alpha=0.1, epsilon=2, rounds=8, group_size=5000),
                                dict(alpha=0.1, epsilon=2, rounds=2, group_size=40),
                                dict(alpha=0.1, epsilon=2, rounds=2, group_size=20,
                                     nominal=True)])
def test_a_session_whose_rounds_can_pass_is_not_called_trivial(accountant: Any,
                                                               kw: dict[str, Any]) -> None:
    accountant.create_dataset("d", epsilon=1, subject_epsilon=10)
    s = open_session(accountant, "ldp-score", dataset="d", **kw)
    assert s.trivial is False
    fed = open_session(accountant, "fedcp2-qq", dataset="d", alpha=0.1, epsilon=5, agents=3,
                       local_n=200)
    assert fed.trivial is False


def test_cli_session_open_and_status_say_every_release_is_infinite(ledger_url: str,
                                                                   tmp_path: Path) -> None:
    env = CliEnv(ledger_url, tmp_path)
    assert env.run("db", "upgrade").exit_code == 0
    assert env.run("dataset", "create", "--dataset", "d", "--epsilon", "1",
                   "--subject-epsilon", "10").exit_code == 0
    res = env.run("session", "open", "ldp-score", "--dataset", "d", "--alpha", "0.01",
                  "--epsilon", "2", "--rounds", "10", "--group-size", "50")
    assert res.exit_code == 0, res.output
    assert "every release" in res.stdout and "+inf whatever the reports" in res.stdout
    doc = env.json("session", "status", "1")
    assert doc["trivial"] is True
    env.run("session", "open", "ldp-score", "--dataset", "d", "--alpha", "0.1",
            "--epsilon", "2", "--rounds", "8", "--group-size", "5000")
    res = env.run("session", "status", "2")
    assert res.exit_code == 0 and "every release" not in res.stdout


def test_a_shuffled_session_that_can_only_release_infinity_is_refused_before_its_charge(
        accountant: Any) -> None:
    """A shuffled session is charged its amplified central (ε, δ) when it opens: one whose
    rounds can never pass would spend the dataset's budget on a certain +∞ (1.99995, 1e-7
    here), so it is refused, nothing opened or charged."""
    from privcal.errors import InfeasiblePlan

    accountant.create_dataset("s", approx_epsilon=20, approx_delta=1e-5, subject_epsilon=6,
                              delta=1e-7)
    head = accountant.ledger.head()
    with pytest.raises(InfeasiblePlan, match="no round of 50 reports can pass") as e:
        open_session(accountant, "ldp-score", dataset="s", alpha=0.01, epsilon=2, rounds=10,
                     group_size=50, shuffled=True, idempotency_key="k1")
    assert "\n" not in str(e.value)
    assert accountant.ledger.head() == head
    assert accountant.budget("s").spent["epsilon"] == 0
    ok = open_session(accountant, "ldp-score", dataset="s", alpha=0.1, epsilon=2, rounds=8,
                      group_size=5000, shuffled=True, idempotency_key="k2")
    assert ok.trivial is False and ok.central_charge_id is not None


# ----------------------------------------------------------------------------------- F3
def test_advise_min_epsilon_and_min_n_are_for_the_slack_it_shows() -> None:
    """F3 (fixed with privacy F2): the slack column is the exact Δ_S a release records, min
    ε / min n came from Hoeffding's bound; at n = 5000, ε = 4, T = 7 the row said slack
    0.04456 beside 'min ε for Δ ≤ 0.05: —' (unreachable) and min n 14385 > 5000. Both are
    now for the exact slack: at most the ε and n that already reach it, and reaching it."""
    from privcal.calibrators.advisor import advise
    from privcal.calibrators.ldp_score_bounds import exact_slack

    a = advise(5000, 10, 4.0, 0.1, slack=0.05, rounds=7)
    assert a.score.slack == exact_slack(5000 // 7, 7, 0.1, 4.0, 0.001) <= 0.05
    assert a.score.min_epsilon is not None and a.score.min_epsilon <= 4.0
    assert exact_slack(5000 // 7, 7, 0.1, a.score.min_epsilon, 0.001) <= 0.05
    assert a.score.min_n is not None and a.score.min_n <= 5000
    assert exact_slack(a.score.min_n // 7, 7, 0.1, 4.0, 0.001) <= 0.05
