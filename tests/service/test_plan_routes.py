"""The analyst's planning routes (advise, amplify, fed plan): the CLI's ``--json`` document
over HTTP, strict bodies, one-line 422 problems, nothing written on the ledger."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.service.conftest import Live

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
P = "urn:privcal:problem:"


def _cli_json(lv: Live, *args: str) -> Any:
    from click.testing import CliRunner

    from privcal.cli import main

    res = CliRunner().invoke(main, ["--db-url", lv.ledger_url, *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _same(http: Any, cli: Any) -> None:
    """The HTTP document is the CLI's --json document (numbers compared as numbers)."""
    if isinstance(cli, dict):
        assert set(http) == set(cli)
        for k in cli:
            _same(http[k], cli[k])
    elif isinstance(cli, list):
        assert len(http) == len(cli)
        for a, b in zip(http, cli, strict=True):
            _same(a, b)
    elif isinstance(cli, float) or (isinstance(http, str) and http in ("Infinity", "-Infinity")):
        assert float(http) == pytest.approx(float(cli), rel=1e-12)
    else:
        assert http == cli


def test_plans_match_the_cli(live: Live) -> None:
    head = live.accountant.ledger.head()
    with live.client("analyst") as c:
        r = c.post("/v1/advise", json={"n": 5000, "k": 10, "epsilon": 2.0, "alpha": 0.1,
                                       "slack": 0.05})
        assert r.status_code == 200, r.text
        _same(r.json(), _cli_json(live, "advise", "--n", "5000", "--k", "10", "--epsilon",
                                  "2", "--alpha", "0.1", "--slack", "0.05"))
        r = c.post("/v1/amplify", json={"epsilon0": 1.0, "n": 10000, "delta": 1e-6,
                                        "randomizer": "binary-rr"})
        assert r.status_code == 200, r.text
        assert r.json()["amplified"] is True
        _same(r.json(), _cli_json(live, "amplify", "--epsilon0", "1", "--n", "10000",
                                  "--delta", "1e-6", "--randomizer", "binary-rr"))
        r = c.post("/v1/fed/plan", json={"agents": 10, "local_n": 100, "alpha": 0.1})
        assert r.status_code == 200, r.text
        _same(r.json(), _cli_json(live, "fed", "plan", "--agents", "10", "--local-n", "100",
                                  "--alpha", "0.1"))
        r = c.post("/v1/fed/plan", json={"local_n": [50, 80, 120], "alpha": 0.2})
        assert r.status_code == 200, r.text
        _same(r.json(), _cli_json(live, "fed", "plan", "--local-n", "50,80,120",
                                  "--alpha", "0.2"))
        r = c.post("/v1/fed/plan", json={"agents": 20, "local_n": 200, "alpha": 0.1,
                                         "epsilon": 2.0, "bins": 50, "upper": 2.0})
        assert r.status_code == 200, r.text
        _same(r.json(), _cli_json(live, "fed", "plan", "--agents", "20", "--local-n", "200",
                                  "--alpha", "0.1", "--epsilon", "2", "--bins", "50",
                                  "--upper", "2"))
    assert live.accountant.ledger.head() == head  # planning writes nothing


@pytest.mark.parametrize(("path", "body", "where"), [
    ("/v1/advise", {"n": 100, "k": 3, "epsilon": 1.0, "alpha": 1.5}, "alpha"),
    ("/v1/advise", {"n": 100, "k": 3, "epsilon": 1.0, "alpha": 0.1, "requester": "x"},
     "requester"),
    ("/v1/advise", {"n": True, "k": 3, "epsilon": 1.0, "alpha": 0.1}, "n"),
    ("/v1/advise", {"n": 3, "k": 3, "epsilon": 1.0, "alpha": 0.1, "rounds": 5}, "rounds"),
    ("/v1/amplify", {"epsilon0": 1.0, "n": 100, "delta": 1e-6, "randomizer": "krr"}, "k"),
    ("/v1/amplify", {"epsilon0": "1", "n": 100, "delta": 1e-6}, "epsilon0"),
    ("/v1/fed/plan", {"local_n": 100, "alpha": 0.1}, "agents"),
    ("/v1/fed/plan", {"agents": 2, "local_n": [10, 20, 30], "alpha": 0.1}, "3 local sizes"),
    ("/v1/fed/plan", {"local_n": [10, 20], "alpha": 0.1, "epsilon": 1.0}, "equal local"),
    ("/v1/fed/plan", {"local_n": [10, 0], "alpha": 0.1}, "≥ 1"),
    ("/v1/fed/plan", {"agents": 100000, "local_n": 10, "alpha": 0.1}, "agents"),
])
def test_bad_plan_input_is_a_one_line_422(live: Live, path: str, body: dict[str, Any],
                                          where: str) -> None:
    with live.client("analyst") as c:
        r = c.post(path, json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    p = r.json()
    assert p["type"] in (P + "invalid-input", P + "infeasible-plan")
    assert "\n" not in p["detail"] and where in p["detail"], p["detail"]


def test_plans_are_analyst_only_and_documented(live: Live) -> None:
    for role in ("admin", "auditor"):
        with live.client(role) as c:
            r = c.post("/v1/advise", json={"n": 100, "k": 3, "epsilon": 1.0, "alpha": 0.1})
        assert r.status_code == 403
    with live.client() as c:
        spec = c.get("/openapi.json").json()
    for path in ("/v1/advise", "/v1/amplify", "/v1/fed/plan"):
        op = spec["paths"][path]["post"]
        assert op["x-privcal-roles"] == ["analyst"]
        assert op["security"] == [{"HTTPBearer": []}]
        assert "422" in op["responses"] and "401" in op["responses"]


def test_inputs_at_the_edge_of_the_float_range_are_a_422(live: Live) -> None:
    # found by schemathesis: ε = 5e-324 divided by zero inside the slack bounds (a 500)
    with live.client("analyst") as c:
        r = c.post("/v1/advise", json={"n": 1, "k": 2, "epsilon": 5e-324, "alpha": 5e-324})
    assert r.status_code == 422, r.text
    assert "outside the range" in r.json()["detail"]
    # amplify at that edge answers ε = ε0, as the CLI does (red team 24, privacy F3/F4: it was
    # a 422 naming "ValueError: Pair needs pa > qa")
    with live.client("analyst") as c:
        r = c.post("/v1/amplify", json={"delta": 5e-324, "epsilon0": 5e-324, "n": 1})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["amplified"] is False and doc["eps"] == doc["eps0"] == 5e-324
    assert doc["delta_at_eps"] == 0.0


@pytest.mark.parametrize(("body", "cli"), [
    ({"method": "pcoqs", "alpha": 0.1, "rho": 0.5}, ["--rho", "0.5"]),
    ({"method": "pcoqs", "alpha": 0.1, "rho": 0.1, "n": 228, "nominal": True,
      "failure_probability": 0.01},
     ["--rho", "0.1", "--n", "228", "--nominal", "--failure-probability", "0.01"]),
    ({"method": "pcoqs", "alpha": 0.2, "rho": 0.05, "n": 40}, ["--rho", "0.05", "--n", "40"]),
    ({"method": "exponq", "alpha": 0.1, "epsilon": 1.0}, ["--epsilon", "1"]),
    ({"method": "exponq", "alpha": 0.1, "epsilon": 0.5, "n": 300},
     ["--epsilon", "0.5", "--n", "300"]),
    ({"method": "local", "alpha": 0.1, "n": 2000, "k": 5, "epsilon": 1.0,
      "failure_probability": 0.01, "rounds": 8},
     ["--n", "2000", "--k", "5", "--epsilon", "1", "--failure-probability", "0.01",
      "--rounds", "8"]),
])
def test_advise_methods_match_the_cli(live: Live, body: dict[str, Any], cli: list[str]) -> None:
    """``/v1/advise`` with ``method`` pcoqs/exponq (and local's options) is
    ``privcal advise --method … --json``."""
    head = live.accountant.ledger.head()
    with live.client("analyst") as c:
        r = c.post("/v1/advise", json=body)
    assert r.status_code == 200, r.text
    want = _cli_json(live, "advise", "--method", body["method"], "--alpha",
                     str(body["alpha"]), *cli)
    _same(r.json(), want)
    if body["method"] != "local":
        assert r.json()["min_n"] == want["min_n"] and r.json()["method"] == body["method"]
    assert live.accountant.ledger.head() == head


@pytest.mark.parametrize(("body", "where"), [
    ({"method": "pcoqs", "alpha": 0.1}, "advise method pcoqs needs rho"),
    ({"method": "exponq", "alpha": 0.1, "n": 10}, "advise method exponq needs epsilon"),
    ({"alpha": 0.1, "n": 10, "epsilon": 1.0}, "advise method local needs k"),
    ({"method": "exponq", "alpha": 0.1, "epsilon": 1.0, "k": 3}, "takes no k"),
    ({"method": "pcoqs", "alpha": 0.1, "rho": 0.1, "slack": 0.1}, "takes no slack"),
    ({"alpha": 0.1, "n": 10, "k": 3, "epsilon": 1.0, "nominal": True}, "takes no nominal"),
    ({"method": "ldp", "alpha": 0.1, "epsilon": 1.0}, "method"),
    ({"method": "pcoqs", "alpha": 0.1, "rho": 0.1, "nominal": 1}, "nominal"),
    ({"method": "pcoqs", "alpha": 0.1, "rho": 5e-324}, "outside the range"),
])
def test_bad_advise_method_input_is_a_one_line_422(live: Live, body: dict[str, Any],
                                                   where: str) -> None:
    with live.client("analyst") as c:
        r = c.post("/v1/advise", json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert "\n" not in r.json()["detail"] and where in r.json()["detail"], r.json()["detail"]
