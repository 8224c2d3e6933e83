"""Red team 16 (accounting): no overspend and no false guarantee on the analyst's paths
(calibrate, charge, charge_subjects, budget); four smaller defects, each closed here.

- F1: the public ``Accountant.run`` took ``privacy_extra`` and ``shuffle`` and recorded what
  they returned as the release's guarantee: a made-up "(0.0001, 1e-30)-DP by the
  stronger-clone bound" for ldp-score (nothing charged for it), a blanket-bound amplification
  for ldp-label (which privcal proves none for). They are privcal's own now: a caller's are
  refused before anything is charged.
- F2: FedCP²-QQ's coverage sentences said an agent's ε in six digits, to nearest: ε =
  10.2345449 was "10.2345-DP", below what was charged (version 1.5.0 states it exactly).
- F3: ``privcal amplify`` printed ε0, δ and δ(ε) to six (five) digits, to nearest: "δ(ε) =
  1.2346e-06 ≤ δ = 1.23456e-06" where δ(ε) = 1.2345616e-06.
- F4: for a subnormal ρ, ``ZCDP.to_approx`` came out below the true CKS20 ε (the a·ulp(ρ)
  allowance was scaled by the relative slack).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from privcal.accountant.prepare import prepare
from privcal.calibrators.base import DataShape
from privcal.calibrators.fedcp2_qq import FedCP2QQ
from privcal.cli import main
from privcal.costs import ZCDP
from privcal.errors import InvalidInput


def test_run_refuses_a_callers_privacy_claims_before_charging(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("d", approx_epsilon="5", approx_delta="1e-6", subject_epsilon="10")
    n = 400
    prep = prepare("ldp-score", {"alpha": 0.1, "epsilon": 2},
                   scores=np.random.default_rng(0).uniform(size=n),
                   subjects=[f"s{i}" for i in range(n)])
    fake = {"shuffled": True, "scope": "per round",
            "amplification": {"amplified": True, "eps": "0.0001", "delta": "1e-30",
                              "bound": "stronger-clone", "heuristic_eps0_over_sqrt_n": 0.1}}
    head = acct.ledger.head()
    with pytest.raises(InvalidInput, match="privacy_extra, shuffle and central_cost are"):
        acct.run(prep.calibrator, prep.params, prep.data, dataset="d", privacy_extra=fake,
                 registered=prep.registered)
    with pytest.raises(InvalidInput, match="privacy_extra, shuffle and central_cost are"):
        acct.run(prep.calibrator, prep.params, prep.data, dataset="d",
                 registered=prep.registered,
                 shuffle=lambda shape: (None, {"amplification": {"amplified": True}}))
    assert acct.ledger.head() == head and acct.subject_spend("d", "s0") == 0
    # the library's own shuffled run still works, and is what it charges
    rel = acct.calibrate("ldp-score", dataset="d", alpha=0.1, epsilon=2, shuffled=True,
                         scores=np.random.default_rng(1).uniform(size=4000),
                         subjects=[f"t{i}" for i in range(4000)])
    assert rel.privacy["central_cost"]["kind"] == "approx"
    assert acct.verify().guarantees_recomputed == 1


def test_fedcp2_qq_states_an_agents_epsilon_exactly() -> None:
    cal = FedCP2QQ()
    shape = DataShape(n=1000, group_sizes=(200,) * 5)
    p = cal.Params(alpha=0.1, epsilon=10.2345449)
    g = cal.guarantee(p, shape)
    assert "each agent's message is 10.2345449-DP w.r.t." in g.statement
    assert g.details["privacy"].startswith("each agent's message 10.2345449-DP")
    assert "10.2345-DP" not in g.statement + g.details["privacy"]
    # a release of 1.4.0 is recomputed with the wording it was recorded with
    old = cal.guarantee_as("1.4.0", p, shape)
    assert "10.2345-DP" in old.statement and old.rank == g.rank and old.lower == g.lower
    assert "each agent's message is 10-DP w.r.t." in cal.guarantee(
        cal.Params(alpha=0.1, epsilon=10.0), shape).statement


def test_amplify_prints_privacy_figures_exactly() -> None:
    res = CliRunner().invoke(main, ["amplify", "--epsilon0", "1", "--n", "4988", "--delta",
                                    "0.0000012345649", "--randomizer", "binary-rr"])
    assert res.exit_code == 0, res.output
    assert "δ = 1.2345649e-06)-DP, certified (δ(ε) = 1.2345616" in res.stdout
    assert "1.23456e-06" not in res.stdout and "1.2346e-06" not in res.stdout
    res = CliRunner().invoke(main, ["amplify", "--epsilon0", "1.2345649", "--n", "2",
                                    "--delta", "1e-13", "--randomizer", "binary-rr"])
    assert "ε = ε0 = 1.2345649 (pure, δ = 0)" in res.stdout


@pytest.mark.parametrize(("rho", "delta", "true_eps"), [
    # the true CKS20 ε (inf over a > 1, 60-digit mpmath, of the exact ρ and δ)
    ("3.2689e-319", "7.6251e-311", Decimal("2.1192533875548e-158")),
    ("4.1307e-319", "7.6251e-311", Decimal("2.3826910881693e-158")),
])
def test_a_subnormal_rho_converts_to_no_less_than_the_true_epsilon(
        rho: str, delta: str, true_eps: Decimal) -> None:
    got = ZCDP(rho=rho).to_approx(delta).eps
    assert got >= true_eps  # before: 2.11925e-158 and 2.38269e-158
    assert got <= true_eps * Decimal("1.00001")
