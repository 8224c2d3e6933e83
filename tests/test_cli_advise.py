"""`privcal advise`: human table, --json document, errors and exit codes."""

from __future__ import annotations

import json

from click.testing import CliRunner

from privcal.calibrators.advisor import advise
from privcal.cli import main

ARGS = ["advise", "--n", "10000", "--k", "10", "--epsilon", "2", "--alpha", "0.1"]


def test_human_output() -> None:
    r = CliRunner().invoke(main, [*ARGS, "--slack", "0.08"])
    assert r.exit_code == 0, r.output
    assert "ldp-label" in r.stdout and "ldp-score" in r.stdout
    assert "min ε for Δ≤0.08" in r.stdout
    assert f"smaller slack (proven bounds): {advise(10_000, 10, 2.0, 0.1).recommended}" in r.stdout


def test_json_is_one_document() -> None:
    r = CliRunner().invoke(main, [*ARGS, "--delta", "0.01", "--rounds", "10", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    expect = advise(10_000, 10, 2.0, 0.1, 0.01, rounds=10).model_dump(mode="json")
    assert doc == json.loads(json.dumps(expect))
    assert doc["score"]["rounds"] == 10 and r.stderr == ""


def test_bad_input_exit_1_and_usage_exit_2() -> None:
    r = CliRunner().invoke(
        main, ["advise", "--n", "0", "--k", "10", "--epsilon", "2", "--alpha", "0.1"]
    )
    assert r.exit_code == 1
    assert r.stderr.startswith("error: n must be") and r.stdout == ""
    r = CliRunner().invoke(main, ["advise", "--k", "10", "--epsilon", "2", "--alpha", "0.1"])
    assert r.exit_code == 2
    r = CliRunner().invoke(main, [*ARGS[:-1], "1.5", "--json"])
    assert r.exit_code == 1 and "α must be in (0, 1)" in r.stderr
    # issue 15: under --json the failure is also one JSON error document on stdout
    assert json.loads(r.stdout)["error"]["exit_code"] == 1


def test_a_budget_of_the_other_methods_kind_is_a_usage_error() -> None:
    """Red team 22, newcomer F5: ``--method pcoqs --rho 1 --epsilon 1`` answered for ρ alone
    and ``--method exponq --rho 5`` ignored the ρ, without a word."""
    for args, said in ((["--method", "pcoqs", "--rho", "1", "--epsilon", "1"],
                        "advise --method pcoqs takes --rho (zCDP), not --epsilon"),
                       (["--method", "exponq", "--epsilon", "1", "--rho", "5"],
                        "advise --method exponq takes --epsilon, not --rho"),
                       ([*ARGS[1:-2], "--rho", "1"], "advise --method local takes --epsilon")):
        r = CliRunner().invoke(main, ["advise", "--alpha", "0.1", *args])
        assert r.exit_code == 2 and said in r.output, r.output
    assert CliRunner().invoke(main, ["advise", "--alpha", "0.1", "--method", "pcoqs",
                                     "--rho", "1"]).exit_code == 0
