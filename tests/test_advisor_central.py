"""Issue 13: the smallest n at which P-COQS / ExponQ can return a finite threshold, and
``privcal advise --method pcoqs|exponq``."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from click.testing import CliRunner

from privcal.calibrators.advisor_central import advise_central, min_n_exponq, min_n_pcoqs
from privcal.calibrators.base import CalibrationInput, DataShape
from privcal.calibrators.exponq import ExponQ, ExponQParams
from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
from privcal.cli import main
from privcal.errors import InvalidInput


@pytest.mark.parametrize(
    "kw",
    [
        {"alpha": 0.1, "rho": 0.1},
        {"alpha": 0.1, "rho": 1.0},
        {"alpha": 0.05, "rho": 0.5, "failure_probability": 0.01},
        {"alpha": 0.1, "rho": 0.1, "nominal": True},
        {"alpha": 0.2, "rho": 0.02, "bound": "subgaussian"},
    ],
)
def test_min_n_pcoqs_is_the_first_feasible_n(kw: dict) -> None:
    p = PCOQSParams(**kw)
    n0 = min_n_pcoqs(p)
    rank = lambda n: PCOQS().guarantee(p, DataShape(n=n)).rank  # noqa: E731
    assert rank(n0) <= n0
    assert all(rank(n) > n for n in range(max(1, n0 - 300), n0))
    assert all(rank(n) <= n for n in range(n0, n0 + 300))  # and stays feasible


def test_pcoqs_release_is_inf_below_min_n_and_can_be_finite_at_it() -> None:
    p = PCOQSParams(alpha=0.1, rho=1.0)
    n0 = min_n_pcoqs(p)
    gen = np.random.default_rng(0)
    below = PCOQS().calibrate(CalibrationInput(scores=gen.random(n0 - 1)), p, random.Random(0))
    assert below.threshold == math.inf
    at = [
        PCOQS().calibrate(CalibrationInput(scores=gen.random(n0)), p, random.Random(i)).threshold
        for i in range(5)
    ]
    assert any(math.isfinite(t) for t in at)


@pytest.mark.parametrize("alpha,eps", [(0.1, 1.0), (0.1, 8.0), (0.05, 0.5), (0.2, 2.0)])
def test_min_n_exponq_checks_every_smaller_n(alpha: float, eps: float) -> None:
    p = ExponQParams(alpha=alpha, epsilon=eps)
    n0 = min_n_exponq(p)
    assert ExponQ().plan(p, n0)[2] < 1
    assert all(ExponQ().plan(p, n)[2] >= 1 for n in range(1, n0))
    g = ExponQ().guarantee(p, DataShape(n=n0 - 1))
    assert g.lower == 1.0 and "+inf" in g.statement


def test_advise_central_and_errors() -> None:
    a = advise_central("pcoqs", 0.1, n=228, rho=0.1)
    assert a.min_n == min_n_pcoqs(PCOQSParams(alpha=0.1, rho=0.1)) and a.finite_possible is False
    assert a.details["target_rank"] == PCOQS().guarantee(
        PCOQSParams(alpha=0.1, rho=0.1), DataShape(n=228)
    ).rank
    e = advise_central("exponq", 0.1, n=10_000, epsilon=1.0)
    assert e.finite_possible is True and e.min_n == min_n_exponq(ExponQParams(alpha=0.1, epsilon=1))
    with pytest.raises(InvalidInput, match="needs --rho"):
        advise_central("pcoqs", 0.1)
    with pytest.raises(InvalidInput, match="needs --epsilon"):
        advise_central("exponq", 0.1)
    with pytest.raises(InvalidInput, match="rho"):
        advise_central("pcoqs", 0.1, rho=-1.0)
    with pytest.raises(InvalidInput, match="α ≤ 1/2"):
        advise_central("exponq", 0.7, epsilon=1.0)


def test_cli_advise_central_json_and_human() -> None:
    args = ["advise", "--method", "pcoqs", "--n", "228", "--alpha", "0.1", "--rho", "0.1"]
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    expect = advise_central("pcoqs", 0.1, n=228, rho=0.1).model_dump(mode="json")
    assert doc == json.loads(json.dumps(expect))
    h = CliRunner().invoke(main, args)
    assert h.exit_code == 0 and f"from n = {doc['min_n']}" in h.stdout
    assert "at n = 228: no" in h.stdout
    r = CliRunner().invoke(main, ["advise", "--method", "exponq", "--alpha", "0.1"])
    assert r.exit_code == 2 and "advise --method exponq needs --epsilon" in r.stderr
    r = CliRunner().invoke(main, ["advise", "--alpha", "0.1", "--n", "100", "--epsilon", "1"])
    assert r.exit_code == 2 and "needs --k" in r.stderr


@pytest.mark.parametrize(
    "alpha,eps,bins",
    [(0.1, 1.0, None), (0.05, 0.01, None), (0.2, 3.0, 50), (0.5, 0.1, 2), (0.01, 0.3, None)],
)
def test_exponq_n_floor_is_proven_infeasible(alpha: float, eps: float, bins: int | None) -> None:
    """No n at or below the floor has q̃ < 1 (the calibrator's own computation), and the floor
    is not vacuous: it lies below the first feasible n."""
    from privcal.calibrators.advisor_central import exponq_n_floor

    p = ExponQParams(alpha=alpha, epsilon=eps, bins=bins)
    floor = exponq_n_floor(p)
    top = int(floor)
    probe = sorted({1, 2, 3, top // 3, top // 2, max(1, top - 1), max(1, top)}
                   | set(np.linspace(1, max(1, top), 200).astype(int).tolist()))
    assert all(ExponQ().plan(p, n)[2] >= 1 for n in probe if n >= 1)
    assert 0 < floor < min_n_exponq(p)


@pytest.mark.parametrize(
    "call",
    [
        lambda: advise_central("exponq", 0.1, epsilon=5e-324),
        lambda: advise_central("pcoqs", 0.1, rho=5e-324),
    ],
)
def test_central_advice_at_the_edge_of_the_float_range_is_one_line(call) -> None:
    """ε or ρ = 5e-324 (found by schemathesis over HTTP): a one-line InvalidInput at once,
    not a traceback or a scan of 10⁹ sizes."""
    with pytest.raises(InvalidInput) as err:
        call()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "args",
    [
        ["advise", "--n", "1000", "--k", "10", "--epsilon", "5e-324", "--alpha", "0.1"],
        ["advise", "--method", "pcoqs", "--rho", "5e-324", "--alpha", "0.1"],
        ["advise", "--method", "exponq", "--epsilon", "5e-324", "--alpha", "0.1"],
    ],
)
def test_cli_planning_at_the_edge_of_the_float_range_is_one_line(args: list[str]) -> None:
    res = CliRunner().invoke(main, [*args, "--json"])
    assert isinstance(res.exception, SystemExit), res.exception  # an error document, no crash
    doc = json.loads(res.stdout)
    assert doc["error"]["type"] == "InvalidInput" and res.exit_code == doc["error"]["exit_code"]
    message = doc["error"]["message"]
    assert "\n" not in message
    assert "outside the range" in message or "needs more than" in message


def test_cli_amplify_at_the_edge_of_the_float_range_answers_eps0() -> None:
    """``amplify --epsilon0 5e-324`` was one line naming "ValueError: Pair needs pa > qa"; it
    answers ε = ε0 now (red team 24, privacy F4: e^ε0 rounds to 1, no bound is evaluated,
    and ε0-LDP reports are ε0-DP once shuffled)."""
    res = CliRunner().invoke(main, ["amplify", "--epsilon0", "5e-324", "--n", "1000",
                                    "--delta", "1e-6", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["amplified"] is False and doc["certified"] is True
    assert doc["eps"] == doc["eps0"] == 5e-324 and doc["delta_at_eps"] == 0.0
