"""Recorded guarantee sentences never overstate their numbers (red team 6).

The sentences rounded a probability or a bound to nearest at 6 significant digits, so
1 − β = 0.9999999 was recorded as "P(E) ≥ 1", and P-COQS's upper bound 2718/2992 =
0.908088235… (n = 2991) as "≤ 0.908088", below the bound. Every number is now written on
the safe side: a lower bound or a success probability never above the exact value, an
upper bound never below. P-COQS (2.3.0) and the levels wrapper (1.1.0) were released with
the old wording: their older releases still verify, in their own wording.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from privcal.accountant.releases import record_release
from privcal.calibrators.base import DataShape
from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
from privcal.calibrators.registry import get
from privcal.costs import parse_cost
from tests.seeded import Seeded

NUM = r"([0-9][0-9.e+-]*)"


def _num(pattern: str, text: str) -> Fraction:
    """The number the sentence states where ``pattern`` (with one NUM group) matches."""
    m = re.search(pattern, text)
    assert m is not None, (pattern, text)
    return Fraction(m.group(1).rstrip("."))


def _nums(pattern: str, text: str) -> list[Fraction]:
    return [Fraction(x.rstrip(".")) for x in re.findall(pattern, text)]


# ----------------------------------------------------------------------------- P-COQS
@pytest.mark.parametrize("nominal", [False, True])
def test_pcoqs_statement_never_overstates(nominal: bool) -> None:
    """P(E) ≥ the exact 1 − β, the stated upper bound ≥ its proof (the reviewer's n = 2991
    among them), the lower bound ≤ its proof, τ ≥ the τ used."""
    cal = PCOQS()
    beta = 1e-7
    for n in range(2985, 3005):
        p = PCOQSParams(alpha=0.1, rho=1.0, failure_probability=beta, nominal=nominal)
        g = cal.guarantee(p, DataShape(n=n))
        r, tau = g.rank, g.details["tau"]
        assert isinstance(r, int) and isinstance(tau, int)
        if nominal:
            upper = min(Fraction(1), 1 - Fraction("0.1") + Fraction(tau + 1, n + 1))
        else:
            upper = min(Fraction(1), Fraction(math.ceil(r + tau), n + 1))
        lower = Fraction(max(0, math.ceil(r - tau)), n + 1)
        s = g.statement
        assert _num(r"has P\(E\) ≥ " + NUM, s) <= 1 - Fraction("1e-7")
        assert _num(r"\| E\) ≤ " + NUM, s) >= upper, (n, s)
        assert _num(r"^" + NUM + " ≤ P", s) <= lower
        assert _num(r"τ = " + NUM, s) >= tau
    assert "P(E) ≥ 0.999999 " in s


def test_pcoqs_large_tau_is_written_in_full() -> None:
    """ρ tiny: τ > 10⁴, which ``.4g`` rounded (down, for some τ) into an exponent."""
    g = PCOQS().guarantee(PCOQSParams(alpha=0.1, rho=1e-7), DataShape(n=10**9))
    tau = g.details["tau"]
    assert isinstance(tau, int) and tau > 10**4
    assert f"τ = {tau} " in g.statement


def test_pcoqs_subgaussian_tau_never_below() -> None:
    cal = PCOQS()
    for rho in (0.3, 0.7, 1.3, 2.9, 5.1):
        g = cal.guarantee(PCOQSParams(alpha=0.1, rho=rho, bound="subgaussian"),
                          DataShape(n=5000))
        assert _num(r"τ = " + NUM, g.statement) >= Fraction(g.details["tau"])


# ----------------------------------------------------------------------------- LDP
@pytest.mark.parametrize("nominal", [False, True])
@pytest.mark.parametrize("method", ["ldp-score", "ldp-label"])
def test_ldp_statements_never_overstate(method: str, nominal: bool) -> None:
    cal = get(method).calibrator
    delta = "delta" if method == "ldp-score" else "failure_probability"
    for alpha in (0.7, 0.1, 1 / 3):
        p = cal.Params.model_validate({"alpha": alpha, "epsilon": 2.0, delta: 1e-7,
                                       "nominal": nominal})
        g = cal.guarantee(p, DataShape(n=20000, k=3))
        s = g.statement
        assert _num(r"^With probability ≥ " + NUM, s) <= 1 - Fraction("1e-7")
        stated = _num(r"calibration\) ≥ " + NUM, s)
        assert stated <= Fraction(repr(g.lower))
        assert Fraction(repr(g.lower)) <= 1 - Fraction(repr(alpha))


# ----------------------------------------------------------------------------- wrappers
def test_mondrian_statement_never_overstates() -> None:
    cal = get("mondrian:pcoqs").calibrator
    p = cal.Params.model_validate({"alpha": 0.1, "rho": 1.0, "failure_probability": 1e-7,
                                   "groups": ["a", "b", "c"], "group_by": "label",
                                   "public_groups": True})
    g = cal.guarantee(p, DataShape(n=9000, k=3, group_sizes=(2991, 3000, 3009)))
    s = g.statement
    assert _num(r"all groups at once with probability ≥ " + NUM, s) <= 1 - 3 * Fraction("1e-7")
    assert Fraction(repr(g.failure_probability)) >= 3 * Fraction("1e-7")
    for x in _nums(r"(?:smallest: |coverage ≥ )" + NUM, s):
        assert x <= Fraction(repr(g.lower))


def test_mondrian_levels_statement_never_overstates() -> None:
    cal = get("mondrian:levels:split").calibrator
    p = cal.Params.model_validate({"alpha": [0.1, 0.3333333], "groups": ["a", "b"],
                                   "group_by": "label", "public_groups": True})
    g = cal.guarantee(p, DataShape(n=4000, k=2, group_sizes=(2000, 2000)))
    second = g.statement.split("at α=0.333333: ")[1]
    for x in _nums(r"(?:smallest: |coverage ≥ )" + NUM, second):
        assert x <= 1 - Fraction("0.3333333")


def test_levels_statement_never_overstates() -> None:
    """Each other level's bound and 1 − β: rounded down (split: 1 − α = 0.6666667 was
    "0.666667"; P-COQS: 1 − 1e-7 was "w.p. ≥ 1")."""
    split = get("levels:split").calibrator
    g = split.guarantee(split.Params.model_validate({"alpha": [0.1, 0.3333333]}),
                        DataShape(n=1000))
    assert _num(r"at α=0.333333: coverage ≥ " + NUM, g.statement) <= 1 - Fraction("0.3333333")
    pc = get("levels:pcoqs").calibrator
    g = pc.guarantee(pc.Params.model_validate({"alpha": [0.1, 0.2], "rho": 1.0,
                                               "failure_probability": 1e-7}),
                     DataShape(n=3000))
    assert _num(r"at α=0.2: coverage ≥ [0-9.]+ w\.p\. ≥ " + NUM,
                g.statement) <= 1 - Fraction("1e-7")
    assert "P(E) ≥ 1 " not in g.statement


# ----------------------------------------------------------------------------- verify
#: what P-COQS 2.2.0 wrote for these parameters (its statement rounded to nearest)
OLD_PCOQS = ("0.9 ≤ P(Y ∈ C(X) | E) ≤ 0.916028, where the probability is over the calibration "
             "data and the test point (marginal, not per release) and E, the event that all "
             "N = 34 noisy counts are at most τ = 24 above the true counts, depends on the "
             "noise alone and has P(E) ≥ 1 (the upper bound")


def _rerecord(acct: Any, rel: Any, version: str, statement: str | None = None) -> int:
    """``rel`` re-recorded as calibrator ``version`` wrote it (past the public API, which
    refuses another version's sentence)."""
    cal = get(rel.method).calibrator
    cov = cal.guarantee_as(version, cal.Params.model_validate(rel.params),
                           DataShape(**rel.shape))
    if statement is not None:
        cov = cov.model_copy(update={"statement": statement})
    cost = rel.privacy.get("cost")
    paid = [acct.charge(rel.dataset, parse_cost(cost)).charge_id] if cost else []
    return record_release(
        acct.ledger, rel.dataset, _as_computed=True, method=rel.method,
        calibrator_version=version, threshold=rel.threshold, params=rel.params,
        shape=rel.shape, coverage=cov, privacy=rel.privacy, diagnostics=rel.diagnostics,
        distribution=rel.distribution, distribution_version=rel.distribution_version,
        charge_ids=paid,
    ).id


def test_old_releases_verify_in_their_wording_next_to_new_ones(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("c", rho=100, allow_nonprivate=True)
    s = np.random.default_rng(0).random(3000)
    pc = acct.calibrate("pcoqs", dataset="c", scores=s, alpha=0.1, rho=1,
                        failure_probability=1e-7, rng=Seeded(0))
    assert pc.calibrator_version == "2.3.0"
    assert "has P(E) ≥ 0.999999 " in pc.coverage.statement
    assert pc.coverage.statement.startswith("0.9 ≤ P(Y ∈ C(X) | E) ≤ 0.916028,")
    lv = acct.calibrate("pcoqs", dataset="c", scores=s, alpha=[0.1, 0.2], rho=1,
                        failure_probability=1e-7, rng=Seeded(1))
    assert lv.calibrator_version == "1.2.0/2.3.0"
    assert "w.p. ≥ 0.999999" in lv.coverage.statement
    sp = acct.calibrate("split", dataset="c", scores=s, alpha=[0.1, 0.3333333])
    split_version = get("split").calibrator.version
    assert "at α=0.333333: coverage ≥ 0.666666" in sp.coverage.statement
    # as 2.2.0 / levels 1.0.0 wrote them: the old sentence, reproduced, so compared
    old = PCOQS().guarantee_as("2.2.0", PCOQSParams(**pc.params), DataShape(**pc.shape))
    assert old.statement.startswith(OLD_PCOQS)
    _rerecord(acct, pc, "2.2.0")
    _rerecord(acct, pc, "2.1.0")
    _rerecord(acct, lv, "1.0.0/2.2.0")
    _rerecord(acct, lv, "1.0.0/2.3.0")
    _rerecord(acct, lv, "1.1.0/2.3.0")
    old_sp = _rerecord(acct, sp, f"1.0.0/{split_version}")
    assert "at α=0.333333: coverage ≥ 0.666667" in acct.ledger.release(old_sp).coverage["statement"]
    rep = acct.verify()
    assert (rep.guarantees_recomputed, rep.statements_not_compared) == (9, 0)
    # a sentence that is neither: counted, not compared (an older version's)
    _rerecord(acct, pc, "2.2.0", statement="an older wording of the same bound")
    rep = acct.verify()
    assert (rep.guarantees_recomputed, rep.statements_not_compared) == (10, 1)
