"""``privcal fed plan`` (SPEC §9–10): JSON output, human table, refusals and exit codes."""

from __future__ import annotations

import json

from click.testing import CliRunner

from privcal.cli import main


def _run(*args: str):
    return CliRunner().invoke(main, ["fed", "plan", *args])


def test_fedcp_qq_plan_json() -> None:
    res = _run("--agents", "50", "--local-n", "20", "--alpha", "0.1", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["l"], doc["k"], doc["method"]) == (18, 35, "fedcp-qq")
    assert abs(doc["M"] - 0.9017359165) < 1e-9


def test_fedcp_qq_plan_human() -> None:
    res = _run("--agents", "5", "--local-n", "10", "--alpha", "0.1")
    assert res.exit_code == 0
    # M = 0.92562595457…, printed rounded down (a coverage bound never states more)
    assert "agent order ℓ" in res.stdout and "0.9256259545" in res.stdout


def test_fedcp2_qq_plan_json() -> None:
    res = _run(
        "--agents", "5", "--local-n", "200", "--alpha", "0.1", "--epsilon", "10", "--bins",
        "100", "--smax", "2.5", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["gamma"], doc["l_gamma"], doc["k_gamma"], doc["l_cor"]) == (0.02, 179, 4, 3)
    assert doc["q"] == 0.91 and doc["smax"] == 2.5 and doc["epsilon"] == 10.0


def test_unequal_sizes() -> None:
    res = _run("--local-n", "3,7,12,28", "--alpha", "0.1", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["ls"] == [4, 8, 12, 27] and doc["k"] == 2
    same = json.loads(_run("--local-n", "10,10,10,10,10", "--alpha", "0.1", "--json").stdout)
    assert (same["method"], same["l"], same["k"]) == ("fedcp-qq", 10, 3)
    mismatch = _run("--agents", "3", "--local-n", "3,7,12,28", "--alpha", "0.1")
    assert mismatch.exit_code == 1 and "lists 4 sizes" in mismatch.stderr


def test_refusals_exit_1() -> None:
    small = _run("--agents", "5", "--local-n", "10", "--alpha", "0.1", "--epsilon", "1", "--json")
    assert small.exit_code == 1  # issue 15: --json: one JSON error document on stdout
    assert json.loads(small.stdout)["error"]["type"] == "InfeasiblePlan"
    assert small.stderr.startswith("error: ") and "too small for n" in small.stderr
    tiny = _run("--agents", "2", "--local-n", "2", "--alpha", "0.1")
    assert tiny.exit_code == 1 and "no FedCP-QQ plan" in tiny.stderr
    bad = _run("--agents", "5", "--local-n", "10", "--alpha", "1.5")
    assert bad.exit_code == 1 and "α" in bad.stderr
    private_unequal = _run("--local-n", "3,7", "--alpha", "0.1", "--epsilon", "5")
    assert private_unequal.exit_code == 1 and "equal local sizes" in private_unequal.stderr
    no_agents = _run("--local-n", "10", "--alpha", "0.1")
    assert no_agents.exit_code == 1 and "--agents" in no_agents.stderr
    usage = _run("--agents", "5", "--alpha", "0.1")
    assert usage.exit_code == 2
