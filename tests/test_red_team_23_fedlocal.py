"""Red team 23, federated and local-DP flows (fedlocal).

F2: ``fed plan`` (CLI, library) dropped the FedCP²-QQ grid options (``--bins``, ``--lower``,
``--upper``) given without ``--epsilon`` and answered FedCP-QQ's plan, exit 0 — a plan for a
question not asked. They are refused in one line now (the HTTP route: in
``tests/service/test_red_team_23_fedlocal.py``).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from privcal.calibrators.fedplan_choice import plan_federated
from privcal.cli import main
from privcal.errors import InvalidInput


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
